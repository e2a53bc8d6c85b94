// The pieces of a chunk that gla v3 and v4 compute alike (v2's sub-chunk algorithm, csrc/NOTES.md "gla, kda"): a
// 64-token chunk is 4 sub-chunks of 16 tokens; the cumulative gate restarts at each sub-chunk (Gs), so that no
// stored sum spans more than 16 tokens, and the 6 blocks of P below the diagonal blocks are products of queries and
// keys rescaled to the boundaries between sub-chunks, every exponent <= 0.
#pragma once

#include <cuda_bf16.h>

#include "../common/mma.cuh"
#include "../common/sequences.cuh"  // kChunk

namespace minilin {
namespace gla_sub_chunks {

constexpr int kSub = 16;                          // tokens per sub-chunk
constexpr int kSubs = kChunk / kSub;              // 4
constexpr int kPairs = kSubs * (kSubs - 1) / 2;  // 6 blocks below the diagonal

// The pair (a, b), b < a, that P's block below the diagonal number w (0 .. 5) is: (1,0) (2,0) (2,1) (3,0) (3,1) (3,2).
__device__ __forceinline__ int pair_index(int a, int b) { return a * (a - 1) / 2 + b; }

// g's rows on chip (fp32, row stride kLdG, K channels) become Gs: the running sum within each sub-chunk, one thread
// per (sub-chunk, channel), the block's kThreads threads in turn.
template <int K, int kLdG, int kThreads>
__device__ __forceinline__ void running_sums_within_sub_chunks(float* G) {
  for (int i = threadIdx.x; i < kSubs * K; i += kThreads) {
    const int a = i / K, f = i % K;
    float running = 0.0f;
    for (int l = 0; l < kSub; ++l) {
      float& x = G[(a * kSub + l) * kLdG + f];
      running += x;
      x = running;
    }
  }
}

// P's blocks below the diagonal on tensor cores, warp w < kPairs the pair w = (a, b): P[a][b] = Q_ab k^_b^T, with
// Q_ab = q exp(Gs) E[a][b+1] the rows of sub-chunk a (q_pair: this warp's pair's 16 rows, stride kLdK) and k^ = k
// exp(D - Gs) (every sub-chunk's keys to its end, stride kLdK); into bf16 rows of P (stride kLdC).
template <int K, int kLdK, int kLdC>
__device__ __forceinline__ void pair_products(int warp, const __nv_bfloat16* q_pair, const __nv_bfloat16* k_hat,
                                              __nv_bfloat16* P) {
  if (warp >= kPairs) return;
  const int a = warp < 1 ? 1 : warp < 3 ? 2 : 3, b = warp - pair_index(a, 0);
  float acc[1][2][4];
  zero(acc);
  warp_mma<1, 2, Stored::kRowMajor, Stored::kTransposed>(acc, q_pair, kLdK, k_hat, kLdK, 0, b * kSub, 0, K);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2)
      store_bf16x2(P + (a * kSub + acc_row(0, e)) * kLdC + b * kSub + acc_col(j, e), acc[0][j][e], acc[0][j][e + 1]);
}

}  // namespace gla_sub_chunks
}  // namespace minilin
