// The moves the tensor-core chunk kernels of both families share (linear v3-v7, delta v3-v10), and the block
// layout of the 16-warp ones (namespace wide): one chunk's q, k, v and g copied on chip, and a warp's tiles
// moved between the mma accumulators (mma.cuh's C layout), shared memory and global memory: the decayed
// scores P, the output tile, and the warp's slice of the recurrent state S [K, V] (rows s_m0 .. s_m0 + 15,
// columns s_n0 .. s_n0 + 8 NT - 1 of the block's value columns, which start at v0).
#pragma once

#include "../minilin_cuda.h"
#include "device.cuh"
#include "mma.cuh"
#include "sequences.cuh"  // kChunk, SequenceRows
#include "simt.cuh"

namespace minilin {

// What one warp of a chunk kernel computes: its tile at (m0, n0) of each 64 x (value block) product of a chunk (P,
// X, Delta, O: 16 x 16 in the wide layout, 16 x 32 in the narrow one at 64 value columns, 16 x 16 at 32), and its
// slice of the state S [K, value block]: rows s_m0 .. s_m0 + 15, columns s_n0 .. s_n0 + 8 kStateTiles - 1.
struct WarpTiles {
  int m0, n0, s_m0, s_n0;
};

// The layout every 8-warp ("narrow") chunk kernel shares (linear v3, delta v3, gla v3 and v4, kda v3-v5): one block
// of 8 warps per (batch, head, kBlockV = 64 value columns), or per kColumns = 32 where a kernel takes narrower value
// blocks (kda v5); each warp one 16 x kColumns / 2 tile of the chunk's 64 x kColumns products; the state split into
// K / 16 row tiles of 16, each shared by kRowSharers warps, each warp kStateTiles tiles of 8 columns.
namespace narrow {
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockV = 64;
constexpr int kLdV = kBlockV + 8;   // bf16 row strides padded by 16 bytes (conflict-free ldmatrix)
constexpr int kLdC = kChunk + 8;
template <int K>
constexpr int kRowSharers = kWarps / (K / 16);
template <int K, int kColumns = kBlockV>
constexpr int kStateTiles = (kColumns / 8) / kRowSharers<K>;
template <int kColumns = kBlockV>
constexpr int kTileNT = kColumns / 16;  // 8-column tiles of a warp's tile of a product: half the value block
template <int K, int kColumns = kBlockV>
__device__ __forceinline__ WarpTiles warp_tiles(int warp) {
  static_assert(kRowSharers<K> >= 1 && kStateTiles<K, kColumns> % 2 == 0 && kTileNT<kColumns> % 2 == 0,
                "K must be 64 or 128, the value block 32 or 64 columns");
  return {16 * (warp >> 1), (kColumns / 2) * (warp & 1), 16 * (warp / kRowSharers<K>),
          8 * kStateTiles<K, kColumns> * (warp % kRowSharers<K>)};
}
}  // namespace narrow

// The layout every 16-warp ("wide") chunk kernel shares (linear v4-v7, delta v4-v10): one block of 16 warps per
// (batch, head, 64 value columns); shared rows padded by 8 bf16 so that an ldmatrix's 8 rows hit 8 banks.
namespace wide {
constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockV = 64;
static_assert(kBlockV == kTensorCoreShape.value_multiple, "the tensor-core versions' ShapeRule names this block");
constexpr int kLdV = kBlockV + 8;
constexpr int kLdC = kChunk + 8;
template <int K>
constexpr int kRowSharers = kWarps / (K / 16);  // warps sharing one 16-row tile of S
template <int K>
constexpr int kStateTiles = (kBlockV / 8) / kRowSharers<K>;  // 8-column tiles of S per warp

using minilin::WarpTiles;
template <int K>
__device__ __forceinline__ WarpTiles warp_tiles(int warp) {
  static_assert(kRowSharers<K> >= 1 && kStateTiles<K> % 2 == 0, "K must be 64, 128 or 256");
  return {16 * (warp >> 2), 16 * (warp & 3), 16 * (warp / kRowSharers<K>),
          8 * kStateTiles<K> * (warp % kRowSharers<K>)};
}
}  // namespace wide

// Tokens [t0, t0 + 64) of sequence seq as read by value head h: its q/k head's q and k rows (K wide), or their
// channels [c0, c0 + kCols), into shared rows of stride ldk; rows past the sequence's end are zero-filled.
template <int K, int kCols = K>
__device__ __forceinline__ void cp_async_qk_rows(__nv_bfloat16* q_dst, __nv_bfloat16* k_dst, int ldk, const Problem& p,
                                                 const SequenceRows& seq, int h, int t0, int c0 = 0) {
  constexpr int kRows = 64;
  const int valid = min(kRows, seq.length - t0);
  const int qk_heads = qk_heads_of(p);
  const long long first_qk = (seq.first + t0) * qk_heads + qk_head_of(p, h);
  cp_async_rows(q_dst, ldk, static_cast<const __nv_bfloat16*>(p.q) + first_qk * K + c0,
                static_cast<long long>(qk_heads) * K, kRows, kCols, valid);
  cp_async_rows(k_dst, ldk, static_cast<const __nv_bfloat16*>(p.k) + first_qk * K + c0,
                static_cast<long long>(qk_heads) * K, kRows, kCols, valid);
}

// Tokens [t0, t0 + 64) of sequence seq, head h: the per-channel log-gates g [B, T, H, K] (GLA's, KDA's), their
// channels [c0, c0 + kCols), fp32, into shared rows of stride ldg; rows past the sequence's end are zero-filled (a
// zero gate decays nothing).
template <int K, int kCols = K>
__device__ __forceinline__ void cp_async_channel_gate_rows(float* g_dst, int ldg, const Problem& p,
                                                           const SequenceRows& seq, int h, int t0, int c0 = 0) {
  constexpr int kRows = 64;
  cp_async_rows(g_dst, ldg, p.g + ((seq.first + t0) * p.H + h) * K + c0, static_cast<long long>(p.H) * K, kRows, kCols,
                min(kRows, seq.length - t0));
}

// Tokens [t0, t0 + 64) of sequence seq, head h: q and k rows (cp_async_qk_rows), value columns [v0, v0 + kBlockV)
// (stride ldv) and, when g_dst is given and p.g set, the log-gates; rows past the sequence's end are zero-filled.
template <int K, int kBlockV>
__device__ __forceinline__ void cp_async_chunk(__nv_bfloat16* q_dst, __nv_bfloat16* k_dst, int ldk, __nv_bfloat16* v_dst,
                                               int ldv, float* g_dst, const Problem& p, const SequenceRows& seq, int h,
                                               int t0, int v0) {
  constexpr int kRows = 64;
  const int valid = min(kRows, seq.length - t0);
  const long long first = (seq.first + t0) * p.H + h;
  cp_async_qk_rows<K>(q_dst, k_dst, ldk, p, seq, h, t0);
  cp_async_rows(v_dst, ldv, static_cast<const __nv_bfloat16*>(p.v) + first * p.V + v0, static_cast<long long>(p.H) * p.V,
                kRows, kBlockV, valid);
  if (g_dst && p.g && threadIdx.x < kRows) {
    const bool ok = threadIdx.x < valid;
    cp_async_4(g_dst + threadIdx.x, ok ? p.g + first + static_cast<long long>(threadIdx.x) * p.H : p.g, ok);
  }
}

// Value columns [v0, v0 + kColumns) of tokens [t0, t0 + 64) of sequence seq, head h, into shared rows of stride ldv
// by the block's kThreads threads (cp_async_tile); rows past the sequence's end are zero-filled.
template <int kThreads, int kColumns>
__device__ __forceinline__ void cp_async_value_tile(__nv_bfloat16* dst, int ldv, const Problem& p,
                                                    const SequenceRows& seq, int h, int t0, int v0) {
  const __nv_bfloat16* v = static_cast<const __nv_bfloat16*>(p.v) + ((seq.first + t0) * p.H + h) * p.V + v0;
  cp_async_tile<kThreads, kChunk, kColumns>(dst, ldv, v, static_cast<long long>(p.H) * p.V, min(kChunk, seq.length - t0));
}

// The same for head (b, h) of B sequences of T tokens.
template <int K, int kBlockV>
__device__ __forceinline__ void cp_async_chunk(__nv_bfloat16* q_dst, __nv_bfloat16* k_dst, int ldk, __nv_bfloat16* v_dst,
                                               int ldv, float* g_dst, const Problem& p, int b, int h, int t0, int v0) {
  cp_async_chunk<K, kBlockV>(q_dst, k_dst, ldk, v_dst, ldv, g_dst, p, fixed_rows(p, b), h, t0, v0);
}

// P = (Q K^T) * exp(G_i - G_j) for j <= i, else 0, from this warp's accumulator tile at (m0, n0) of the
// 64 x 64 scores into bf16 shared rows (stride ld); G is the chunk-local cumulative gate.
template <int NT>
__device__ __forceinline__ void store_decayed_scores(const float (&acc)[1][NT][4], const float* G, __nv_bfloat16* P,
                                                     int ld, int m0, int n0) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e);
      const float x = c <= r ? acc[0][j][e] * __expf(G[r] - G[c]) : 0.0f;
      const float y = c + 1 <= r ? acc[0][j][e + 1] * __expf(G[r] - G[c + 1]) : 0.0f;
      store_bf16x2(P + r * ld + c, x, y);
    }
}

// S <- h0's slice (zeros when h0 is null), and its bf16 copy into the shared rows S_copy (row stride ld).
template <int NT>
__device__ __forceinline__ void load_state(float (&S)[1][NT][4], const float* h0, long long state_base, int V, int v0,
                                           int s_m0, int s_n0, __nv_bfloat16* S_copy, int ld) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = s_m0 + acc_row(0, e), col = s_n0 + acc_col(j, e);
      float2 s2 = make_float2(0.0f, 0.0f);
      if (h0) s2 = *reinterpret_cast<const float2*>(h0 + state_base + static_cast<long long>(row) * V + v0 + col);
      S[0][j][e] = s2.x;
      S[0][j][e + 1] = s2.y;
      store_bf16x2(S_copy + row * ld + col, s2.x, s2.y);
    }
}

// S <- the identity's columns c0 .. of this warp's slice (S[f][c] = 1 where f = c0 + c), and its bf16 copy: the
// start of a split version's transitions pass, which carries the identity through a segment as value columns.
template <int NT>
__device__ __forceinline__ void load_identity_state(float (&S)[1][NT][4], int c0, int s_m0, int s_n0,
                                                    __nv_bfloat16* S_copy, int ld) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = s_m0 + acc_row(0, e), col = s_n0 + acc_col(j, e);
      S[0][j][e] = row == c0 + col ? 1.0f : 0.0f;
      S[0][j][e + 1] = row == c0 + col + 1 ? 1.0f : 0.0f;
      store_bf16x2(S_copy + row * ld + col, S[0][j][e], S[0][j][e + 1]);
    }
}

// A warp's accumulator tile at (m0, n0) into bf16 rows of stride ld (shared or global memory).
template <int NT>
__device__ __forceinline__ void store_tile_bf16(const float (&acc)[1][NT][4], __nv_bfloat16* dst, int ld, int m0,
                                                int n0) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2)
      store_bf16x2(dst + (m0 + acc_row(0, e)) * ld + n0 + acc_col(j, e), acc[0][j][e], acc[0][j][e + 1]);
}

// The bf16 copy of this warp's slice, which the next chunk's products read.
template <int NT>
__device__ __forceinline__ void store_state_copy(const float (&S)[1][NT][4], __nv_bfloat16* S_copy, int ld, int s_m0,
                                                 int s_n0) {
  store_tile_bf16(S, S_copy, ld, s_m0, s_n0);
}

// The final state, fp32, into ht.
template <int NT>
__device__ __forceinline__ void store_state(const float (&S)[1][NT][4], float* ht, long long state_base, int V, int v0,
                                            int s_m0, int s_n0) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = s_m0 + acc_row(0, e), col = s_n0 + acc_col(j, e);
      *reinterpret_cast<float2*>(ht + state_base + static_cast<long long>(row) * V + v0 + col) =
          make_float2(S[0][j][e], S[0][j][e + 1]);
    }
}

template <int NT>
__device__ __forceinline__ void scale_tiles(float (&acc)[1][NT][4], float factor) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] *= factor;
}

// o[token t0 + r of sequence seq, h, v0 + c] = scale acc for this warp's output tile at rows m0.., columns n0.. of
// the chunk and value block; rows past the sequence's end (the last chunk's padding) are not written.
template <int NT>
__device__ __forceinline__ void store_output_tile(const float (&acc)[1][NT][4], __nv_bfloat16* o,
                                                  const SequenceRows& seq, int H, int V, int h, int t0, int v0, int m0,
                                                  int n0, float scale) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e), t = t0 + r;
      if (t < seq.length)
        store_bf16x2(o + ((seq.first + t) * H + h) * V + v0 + c, scale * acc[0][j][e], scale * acc[0][j][e + 1]);
    }
}

// The same for head (b, h) of B sequences of T tokens.
template <int NT>
__device__ __forceinline__ void store_output_tile(const float (&acc)[1][NT][4], __nv_bfloat16* o, int T, int H, int V,
                                                  int b, int h, int t0, int v0, int m0, int n0, float scale) {
  store_output_tile(acc, o, fixed_rows(b, T), H, V, h, t0, v0, m0, n0, scale);
}

}  // namespace minilin
