// The recurrent (v1) kernels of both ops share their token staging and their host side (launch_recurrent,
// forward_recurrent, at the end). Staging: the block copies 32 tokens of q, k, its
// 32-column slice of v, and g / beta into shared memory with cp.async, two stages deep, so the copy of
// the next 32 tokens runs while the warps step through the current ones. Tokens are a sequence's (packed or
// not) and q, k its value head's q/k head (common/sequences.cuh), so every v1 reads both layouts.
#pragma once

#include <string>

#include "device.cuh"
#include "launch.cuh"
#include "sequences.cuh"
#include "../minilin_cuda.h"

namespace minilin {

constexpr int kTileTokens = 32;    // tokens per stage
constexpr int kTileColumns = 32;   // value columns per block (4 warps x 8 columns)
constexpr int kRecurrentWarps = 4;
constexpr int kRecurrentColumnsPerWarp = kTileColumns / kRecurrentWarps;

template <typename T>
struct TokenTiles {
  // One stage: q, k [kTileTokens][K], v [kTileTokens][kTileColumns] (input dtype), g, beta [kTileTokens],
  // laid out back to back; stage 1 follows stage 0. Pointers are computed, not kept in arrays, so that a
  // run-time stage index never sends them to local memory.
  unsigned char* base;
  int K;

  __host__ __device__ static size_t stage_bytes(int K) {
    return (2 * size_t(kTileTokens) * K + size_t(kTileTokens) * kTileColumns) * sizeof(T) + 2 * kTileTokens * sizeof(float);
  }
  __device__ unsigned char* stage_base(int s) const { return base + s * stage_bytes(K); }
  __device__ T* q(int s) const { return reinterpret_cast<T*>(stage_base(s)); }
  __device__ T* k(int s) const { return q(s) + kTileTokens * K; }
  __device__ T* v(int s) const { return k(s) + kTileTokens * K; }
  __device__ float* g(int s) const { return reinterpret_cast<float*>(v(s) + kTileTokens * kTileColumns); }
  __device__ float* beta(int s) const { return g(s) + kTileTokens; }

  // Uses two stages from `raw` (16-byte aligned); returns the first byte after them.
  __device__ unsigned char* carve(unsigned char* raw, int K_) {
    base = raw;
    K = K_;
    return raw + 2 * stage_bytes(K_);
  }

  // Issue the copies of tokens t0 .. t0 + 31 of sequence seq, head h, and value columns v0 .. v0 + 31 into
  // `stage`. Tokens past the sequence's end and columns past V are zero-filled.
  __device__ void load(const Problem& p, int stage, const SequenceRows& seq, int h, int t0, int v0) const {
    const int valid = min(kTileTokens, seq.length - t0);
    const long long first = (seq.first + t0) * p.H + h;  // (token, h) in [B T, H]
    const int qk_heads = qk_heads_of(p);
    const long long first_qk = (seq.first + t0) * qk_heads + qk_head_of(p, h);
    const T* qg = static_cast<const T*>(p.q) + first_qk * p.K;
    const T* kg = static_cast<const T*>(p.k) + first_qk * p.K;
    cp_async_rows(q(stage), p.K, qg, static_cast<long long>(qk_heads) * p.K, kTileTokens, p.K, valid);
    cp_async_rows(k(stage), p.K, kg, static_cast<long long>(qk_heads) * p.K, kTileTokens, p.K, valid);

    constexpr int kPer16 = 16 / sizeof(T);
    constexpr int kPieces = kTileColumns / kPer16;
    const T* vg = static_cast<const T*>(p.v) + first * p.V + v0;
    for (int i = threadIdx.x; i < kTileTokens * kPieces; i += blockDim.x) {
      const int r = i / kPieces, c = (i % kPieces) * kPer16;
      const bool ok = r < valid && v0 + c < p.V;  // V % 8 == 0: a 16-byte piece is all in or all out
      cp_async_16(v(stage) + r * kTileColumns + c, ok ? vg + static_cast<long long>(r) * p.H * p.V + c : vg, ok);
    }
    for (int i = threadIdx.x; i < kTileTokens; i += blockDim.x) {
      const bool ok = i < valid;
      if (p.g) cp_async_4(g(stage) + i, ok ? p.g + first + static_cast<long long>(i) * p.H : p.g, ok);
      if (p.beta) cp_async_4(beta(stage) + i, ok ? p.beta + first + static_cast<long long>(i) * p.H : p.beta, ok);
    }
  }
};

// The recurrent kernels' state: S[r][c] = row (lane + 32 r), column (v_first + c) of head (b, h)'s [K, V]
// state at state_base, read from p.h0 (zeros when it is null) and written to p.ht; outside [K, V] nothing.
template <int ROWS, int kColumns>
__device__ __forceinline__ void load_state_rows(float (&S)[ROWS][kColumns], const Problem& p, long long state_base,
                                                int lane, int v_first) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      const int row = lane + 32 * r, col = v_first + c;
      S[r][c] = (p.h0 && row < p.K && col < p.V) ? p.h0[state_base + static_cast<long long>(row) * p.V + col] : 0.0f;
    }
}

template <int ROWS, int kColumns>
__device__ __forceinline__ void store_state_rows(const float (&S)[ROWS][kColumns], const Problem& p, long long state_base,
                                                 int lane, int v_first) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      const int row = lane + 32 * r, col = v_first + c;
      if (row < p.K && col < p.V) p.ht[state_base + static_cast<long long>(row) * p.V + col] = S[r][c];
    }
}

// The block's outputs for tokens t0 .. t0 + 31 of sequence seq, value columns v0 .. v0 + 31, from the fp32 tile
// o_tile [kTileTokens][kTileColumns] to o [B, T, H, V] in the input dtype; past the sequence and past V nothing.
template <typename T>
__device__ __forceinline__ void write_output_tile(const float* o_tile, const Problem& p, const SequenceRows& seq, int h,
                                                  int t0, int v0) {
  T* o = static_cast<T*>(p.o);
  for (int i = threadIdx.x; i < kTileTokens * kTileColumns; i += blockDim.x) {
    const int r = i / kTileColumns, c = i % kTileColumns, t = t0 + r, col = v0 + c;
    if (t < seq.length && col < p.V) o[((seq.first + t) * p.H + h) * p.V + col] = from_float<T>(o_tile[i]);
  }
}

// ---- the host side both v1 kernels share ----------------------------------------------------------------
// Shared memory of a v1 block: two token stages, the fp32 output tile [kTileTokens][kTileColumns] and one
// float per token (k_t . q_t).
template <typename Elem>
inline size_t recurrent_shared_bytes(int K) {
  return 2 * TokenTiles<Elem>::stage_bytes(K) + (kTileTokens * kTileColumns + kTileTokens) * sizeof(float);
}

// Checks and launch of a v1 kernel on p's stream: one block per (batch, head, 32 value columns), ROWS
// register rows per lane (1, 2, 4 or 8 for K up to 32, 64, 128, 256). Kernels::get<Elem, ROWS>() returns the
// op's kernel.
template <typename Kernels, typename Elem, int ROWS>
void launch_recurrent(const Problem& p, const char* name) {
  launch_checked(p, name, Kernels::template get<Elem, ROWS>(), dim3(ceil_div(p.V, kTileColumns), p.H, p.B),
                 kRecurrentWarps * 32, recurrent_shared_bytes<Elem>(p.K));
}

template <typename Kernels>
void forward_recurrent(const Problem& p, const char* name, bool needs_beta) {
  check_common(p, name, needs_beta);
  require(p.K <= kKeysUpTo256.max_k, [&] {
    return std::string(name) + ": K must be <= 256 (the state rows live in registers), got K=" + std::to_string(p.K);
  });
  const auto launch_rows = [&](auto elem) {
    using Elem = decltype(elem);
    if (p.K <= 32) return launch_recurrent<Kernels, Elem, 1>(p, name);
    if (p.K <= 64) return launch_recurrent<Kernels, Elem, 2>(p, name);
    if (p.K <= 128) return launch_recurrent<Kernels, Elem, 4>(p, name);
    return launch_recurrent<Kernels, Elem, 8>(p, name);
  };
  if (p.dtype == kFloat32) launch_rows(float{});
  else launch_rows(__nv_bfloat16{});
}

}  // namespace minilin
