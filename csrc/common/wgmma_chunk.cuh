// The pieces the warpgroup (wgmma) chunk kernels share, delta v10 (and v12's transitions pass through it) and
// linear v10: the producer's swizzled copy of a chunk's rows, the ftz exponential of their epilogues, the decayed
// causal scores P, and the state kept transposed, S^T [64 value rows, K], in the fp32 accumulators of the
// warpgroups that hold it (its load, its update by a chunk, its store), with its bf16 copy in the swizzled layout
// wgmma reads (common/wgmma.cuh).
#pragma once

#include <cuda_bf16.h>

#include "chunk_tiles.cuh"  // wide::kBlockV, acc_row / acc_col, kChunk, scale_tiles, store_bf16x2
#include "device.cuh"       // cp_async_16
#include "wgmma.cuh"

namespace minilin {
namespace wgmma_chunk {

using bf16 = __nv_bfloat16;
using wide::kBlockV;

// Rows [0, 64) of kRowElems bf16 (a multiple of 64) into swizzled storage of 64 rows, 16 bytes per cp.async;
// rows r >= valid are zero-filled. As producer_copy_rows, each lane walks one 16-byte column down the rows,
// kRowStep rows a step. The lane's first row is below kRowStep (a power of two), so r % 8 = row ^ (kRowStep i % 8)
// for step i: the swizzle is a per-lane constant xor a per-step one, which the unrolled inner loop knows (8
// steps, a multiple of its period 8 / kRowStep). A fully unrolled walk spilled at the kernel's 96 registers.
template <int kRowElems>
__device__ __forceinline__ void producer_copy_rows_sw128(bf16* dst, const bf16* src, long long src_stride, int valid,
                                                         int lane) {
  constexpr int kPieces = kRowElems / 8, kRowStep = 32 / kPieces, kSteps = kChunk / kRowStep, kInner = 8;
  static_assert(kRowElems % 64 == 0 && 32 % kPieces == 0 && kRowStep <= 8 && kSteps % kInner == 0,
                "rows of 64 or 128 bf16");
  const int row = lane / kPieces, col = (lane % kPieces) * 8;
  const int lane_xor = ((col >> 3) & 7) ^ row;
  const bf16* from = src + row * src_stride + col;
  bf16* to = dst + (col >> 6) * kChunk * 64 + row * 64;
#pragma unroll 1
  for (int outer = 0; outer < kSteps; outer += kInner) {
#pragma unroll
    for (int i = 0; i < kInner; ++i) {
      const int r = row + (outer + i) * kRowStep;
      cp_async_16(to + i * kRowStep * 64 + ((lane_xor ^ ((i * kRowStep) & 7)) << 3), r < valid ? from : src, r < valid);
      from += kRowStep * src_stride;
    }
    to += kInner * kRowStep * 64;
  }
}

// exp(x) as ex2.approx.ftz(x log2 e): __expf's value wherever the result is a normal float, without the four
// instructions that __expf spends per call on denormal results (the P epilogue takes 16 per thread and chunk).
__device__ __forceinline__ float exp_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}

// Half of the chunk's decayed causal scores, P[r][c] = (Q K^T)[r][c] exp(G_r - G_c) for c <= r, else 0, on P's
// columns half_col .. half_col + 31: this thread's m64n32 accumulators QK (rows m0..) into the swizzled bf16 tile
// P (64 x 64). G is the chunk's cumulative log-gate, so every exponent G_r - G_c with c <= r is <= 0.
__device__ __forceinline__ void store_decayed_scores_half(const float (&QK)[1][4][4], bf16* P, const float* G, int m0,
                                                          int half_col) {
#pragma unroll
  for (int e = 0; e < 4; e += 2) {
    const int r = m0 + acc_row(0, e);
    const float G_r = G[r];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = half_col + acc_col(j, e);
      const float x = c <= r ? QK[0][j][e] * exp_ftz(G_r - G[c]) : 0.0f;
      const float y = c + 1 <= r ? QK[0][j][e + 1] * exp_ftz(G_r - G[c + 1]) : 0.0f;
      store_bf16x2(P + sw128_thread_offset(kChunk, m0, c) + (e ? kLowerHalf : 0), x, y);
    }
  }
}

// One chunk's update of this thread's slice of S^T (key columns f0..), S^T <- decay S^T + A K, with A = the
// chunk's written values transposed and decayed to its end (64 value rows x 64 tokens, as kTokenSteps A fragments
// in registers) and k_cols the descriptor of K's columns f0.. (mn-major); then S^T's bf16 copy in ST, fenced for
// the next chunk's wgmma reads.
template <int NT, int kTokenSteps>
__device__ __forceinline__ void update_state_transposed(float (&S)[1][NT][4], const unsigned (&a)[kTokenSteps][4],
                                                        uint64_t k_cols, float decay, bf16* ST, int m0, int f0) {
  scale_tiles(S, decay);
  fence_operand(S);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < kTokenSteps; ++s) wgmma_rs<true>(S, a[s], k_cols + mn_major_offset(16 * s, 0, kChunk), true);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(S);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int at = sw128_thread_offset(kBlockV, m0, f0 + acc_col(j, 0));
    store_bf16x2(ST + at, S[0][j][0], S[0][j][1]);
    store_bf16x2(ST + at + kLowerHalf, S[0][j][2], S[0][j][3]);
  }
  fence_async_shared();
}

// Each pair of this thread's S^T elements, S^T[row][col] and S^T[row][col + 1] (rows m0.. of the 64 value
// columns, columns f0.. of the K keys), with `at`, the index of S[col][v0 + row] in a [B, H, K, V] state
// (S[col + 1][v0 + row] is V further): f(j, e, row, col, at) for accumulator element S[0][j][e] and e + 1.
template <int NT, class F>
__device__ __forceinline__ void for_each_state_pair(long long state_base, int V, int v0, int m0, int f0, F f) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = m0 + acc_row(0, e), col = f0 + acc_col(j, e);
      f(j, e, row, col, state_base + static_cast<long long>(col) * V + v0 + row);
    }
}

// This thread's slice of S^T from h0 [K, V] (zeros when h0 is null), and its bf16 copy into the block's swizzled S^T.
template <int NT>
__device__ __forceinline__ void load_state_transposed(float (&S)[1][NT][4], const float* h0, long long state_base, int V,
                                                      int v0, int m0, int f0, bf16* ST) {
  for_each_state_pair<NT>(state_base, V, v0, m0, f0, [&](int j, int e, int row, int col, long long at) {
    S[0][j][e] = h0 ? h0[at] : 0.0f;
    S[0][j][e + 1] = h0 ? h0[at + V] : 0.0f;
    store_bf16x2_sw128(ST, kBlockV, row, col, S[0][j][e], S[0][j][e + 1]);
  });
}

// The final state: this thread's slice of S^T, fp32, into ht [K, V].
template <int NT>
__device__ __forceinline__ void store_state_transposed(const float (&S)[1][NT][4], float* ht, long long state_base,
                                                       int V, int v0, int m0, int f0) {
  for_each_state_pair<NT>(state_base, V, v0, m0, f0, [&](int j, int e, int, int, long long at) {
    ht[at] = S[0][j][e];
    ht[at + V] = S[0][j][e + 1];
  });
}

}  // namespace wgmma_chunk
}  // namespace minilin
