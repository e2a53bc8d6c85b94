// The token staging and host side of the recurrent kernels with a decay per key channel (gla v1, kda v1): the
// scalar-gate staging of token_tiles.cuh with g widened from one float per token to one row of K floats, so that
// every lane finds exp(g_t[f]) of its own key rows f in shared memory. Two stages of 32 tokens, copied by
// cp.async while the warps step through the other one; one block per (batch, head, 32 value columns).
//
// g here is [B, T, H, K] float32 (the Problem's g pointer, read as per-channel log-decays by the ops "gla" and
// "kda"); beta [B, T, H] float32 (kda only).
#pragma once

#include <string>

#include "device.cuh"
#include "launch.cuh"
#include "token_tiles.cuh"
#include "../minilin_cuda.h"

namespace minilin {

template <typename T>
struct ChannelTiles {
  // One stage: q, k [kTileTokens][K], v [kTileTokens][kTileColumns] (input dtype), g [kTileTokens][K] and
  // beta [kTileTokens] (float32), back to back; stage 1 follows stage 0. Every part starts 16-byte aligned
  // (K % 8 == 0, check_common).
  unsigned char* base;
  int K;

  __host__ __device__ static size_t stage_bytes(int K) {
    return (2 * size_t(kTileTokens) * K + size_t(kTileTokens) * kTileColumns) * sizeof(T) +
           (size_t(kTileTokens) * K + kTileTokens) * sizeof(float);
  }
  __device__ unsigned char* stage_base(int s) const { return base + s * stage_bytes(K); }
  __device__ T* q(int s) const { return reinterpret_cast<T*>(stage_base(s)); }
  __device__ T* k(int s) const { return q(s) + kTileTokens * K; }
  __device__ T* v(int s) const { return k(s) + kTileTokens * K; }
  __device__ float* g(int s) const { return reinterpret_cast<float*>(v(s) + kTileTokens * kTileColumns); }
  __device__ float* beta(int s) const { return g(s) + kTileTokens * K; }

  // Uses two stages from `raw` (16-byte aligned); returns the first byte after them.
  __device__ unsigned char* carve(unsigned char* raw, int K_) {
    base = raw;
    K = K_;
    return raw + 2 * stage_bytes(K_);
  }

  // Issue the copies of tokens t0 .. t0 + 31 of sequence seq, head h, and value columns v0 .. v0 + 31 into
  // `stage`. Tokens past the sequence's end and columns past V are zero-filled: a zero key and value write
  // nothing, a zero gate decays nothing, a zero beta corrects nothing.
  __device__ void load(const Problem& p, int stage, const SequenceRows& seq, int h, int t0, int v0) const {
    const int valid = min(kTileTokens, seq.length - t0);
    const long long first = (seq.first + t0) * p.H + h;  // (token, h) in [B T, H]
    const long long row_stride = static_cast<long long>(p.H) * p.K;
    const int qk_heads = qk_heads_of(p);
    const long long first_qk = (seq.first + t0) * qk_heads + qk_head_of(p, h);
    const long long qk_stride = static_cast<long long>(qk_heads) * p.K;
    cp_async_rows(q(stage), p.K, static_cast<const T*>(p.q) + first_qk * p.K, qk_stride, kTileTokens, p.K, valid);
    cp_async_rows(k(stage), p.K, static_cast<const T*>(p.k) + first_qk * p.K, qk_stride, kTileTokens, p.K, valid);
    cp_async_rows(g(stage), p.K, p.g + first * p.K, row_stride, kTileTokens, p.K, valid);

    constexpr int kPer16 = 16 / sizeof(T);
    constexpr int kPieces = kTileColumns / kPer16;
    const T* vg = static_cast<const T*>(p.v) + first * p.V + v0;
    for (int i = threadIdx.x; i < kTileTokens * kPieces; i += blockDim.x) {
      const int r = i / kPieces, c = (i % kPieces) * kPer16;
      const bool ok = r < valid && v0 + c < p.V;  // V % 8 == 0: a 16-byte piece is all in or all out
      cp_async_16(v(stage) + r * kTileColumns + c, ok ? vg + static_cast<long long>(r) * p.H * p.V + c : vg, ok);
    }
    if (p.beta)
      for (int i = threadIdx.x; i < kTileTokens; i += blockDim.x) {
        const bool ok = i < valid;
        cp_async_4(beta(stage) + i, ok ? p.beta + first + static_cast<long long>(i) * p.H : p.beta, ok);
      }
  }
};

// Shared memory of a block: two token stages, the fp32 output tile [kTileTokens][kTileColumns] and one float per
// token (k_t . q_t). At K = 256 in float32 that is 209 KB, inside the 227 KB a block may have on sm_90.
template <typename Elem>
inline size_t channel_recurrent_shared_bytes(int K) {
  return 2 * ChannelTiles<Elem>::stage_bytes(K) + (kTileTokens * kTileColumns + kTileTokens) * sizeof(float);
}

// Checks and launch of a per-channel recurrent kernel: Kernels::get<Elem, ROWS>() is the op's kernel, ROWS key
// rows per lane (1, 2, 4 or 8 for K up to 32, 64, 128, 256).
template <typename Kernels>
void forward_channel_recurrent(const Problem& p, const char* name, bool needs_beta) {
  check_common(p, name, needs_beta);
  require_channel_gate(p, name);
  require(p.K <= kKeysUpTo256.max_k, [&] {
    return std::string(name) + ": K must be <= 256 (the state rows live in registers), got K=" + std::to_string(p.K);
  });
  const auto launch_rows = [&](auto elem) {
    using Elem = decltype(elem);
    const dim3 grid(ceil_div(p.V, kTileColumns), p.H, p.B);
    const size_t smem = channel_recurrent_shared_bytes<Elem>(p.K);
    const int threads = kRecurrentWarps * 32;
    if (p.K <= 32) return launch_checked(p, name, Kernels::template get<Elem, 1>(), grid, threads, smem);
    if (p.K <= 64) return launch_checked(p, name, Kernels::template get<Elem, 2>(), grid, threads, smem);
    if (p.K <= 128) return launch_checked(p, name, Kernels::template get<Elem, 4>(), grid, threads, smem);
    return launch_checked(p, name, Kernels::template get<Elem, 8>(), grid, threads, smem);
  };
  if (p.dtype == kFloat32) launch_rows(float{});
  else launch_rows(__nv_bfloat16{});
}

}  // namespace minilin
