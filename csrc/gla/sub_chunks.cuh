// The pieces of a chunk that gla v3 and v4 compute alike (v2's sub-chunk algorithm, csrc/NOTES.md "gla, kda"): a
// 64-token chunk is 4 sub-chunks of 16 tokens; the cumulative gate restarts at each sub-chunk (Gs), so that no
// stored sum spans more than 16 tokens, and the 6 blocks of P below the diagonal blocks are products of queries and
// keys rescaled to the boundaries between sub-chunks, every exponent <= 0. The compacted decay table (fill_decays)
// and the mapping of threads to causal entries (triangular_entry) are v4's; v3 keeps its square table and its
// mapping of every entry of a diagonal block, as measured.
#pragma once

#include <cuda_bf16.h>

#include "../common/chunk_tiles.cuh"  // narrow::, WarpTiles, store_output_tile
#include "../common/mma.cuh"
#include "../common/sequences.cuh"  // kChunk

namespace minilin {
namespace gla_sub_chunks {

constexpr int kSub = 16;                          // tokens per sub-chunk
constexpr int kSubs = kChunk / kSub;              // 4
constexpr int kPairs = kSubs * (kSubs - 1) / 2;  // 6 blocks below the diagonal

// The pair (a, b), b < a, that P's block below the diagonal number w (0 .. 5) is: (1,0) (2,0) (2,1) (3,0) (3,1) (3,2).
__device__ __forceinline__ int pair_index(int a, int b) { return a * (a - 1) / 2 + b; }

// And back: the sub-chunks (a, b) of pair w.
struct SubChunkPair {
  int a, b;
};
__device__ __forceinline__ SubChunkPair pair_of(int w) {
  const int a = w < 1 ? 1 : w < 3 ? 2 : 3;
  return {a, w - pair_index(a, 0)};
}

// The table of sub-chunk decays E[hi][lo] = exp(D_lo + ... + D_{hi - 1}) for 0 <= lo <= hi <= kSubs (D_a: sub-chunk
// a's total gate, the last row of its Gs), compacted: entry decay_index(hi, lo) of kDecays, each K channels.
constexpr int kDecays = (kSubs + 1) * (kSubs + 2) / 2;  // 15
__device__ __forceinline__ int decay_index(int hi, int lo) { return hi * (hi + 1) / 2 + lo; }

// E from Gs (fp32 rows of stride kLdG) into E [kDecays][K], one thread per channel; every exponent <= 0.
template <int K, int kLdG, int kThreads>
__device__ __forceinline__ void fill_decays(const float* G, float* E) {
  for (int f = threadIdx.x; f < K; f += kThreads) {
    float D[kSubs];
#pragma unroll
    for (int a = 0; a < kSubs; ++a) D[a] = G[(a * kSub + kSub - 1) * kLdG + f];
#pragma unroll
    for (int lo = 0; lo <= kSubs; ++lo) {
      float sum = 0.0f;  // D_lo + ... + D_{hi - 1} <= 0
#pragma unroll
      for (int hi = lo; hi <= kSubs; ++hi) {
        E[decay_index(hi, lo) * K + f] = __expf(sum);
        if (hi < kSubs) sum += D[hi];
      }
    }
  }
}

// Entry t (0 .. 135) of a 16 x 16 block's causal part, row by row: its row r and column c <= r.
__device__ __forceinline__ void triangular_entry(int t, int& r, int& c) {
  r = static_cast<int>((sqrtf(8.0f * t + 1.0f) - 1.0f) * 0.5f);
  if ((r + 1) * (r + 2) / 2 <= t) ++r;  // guards against the square root's rounding
  if (r * (r + 1) / 2 > t) --r;
  c = t - r * (r + 1) / 2;
}

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
  const auto [a, b] = pair_of(warp);
  float acc[1][2][4];
  zero(acc);
  warp_mma<1, 2, Stored::kRowMajor, Stored::kTransposed>(acc, q_pair, kLdK, k_hat, kLdK, 0, b * kSub, 0, K);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2)
      store_bf16x2(P + (a * kSub + acc_row(0, e)) * kLdC + b * kSub + acc_col(j, e), acc[0][j][e], acc[0][j][e + 1]);
}

// A chunk's state read and update, for one warp of the narrow layout (common/chunk_tiles.cuh; t its tiles):
//     O = scale (Qr S + P V)             its output tile, stored into o (rows past the sequence's end not written)
//     S <- diag(d) S + Ke^T V            its slice of the state, in fp32 registers
// with the chunk's tiles in bf16 shared rows (Qr, Ke of stride kLdK; P, zero above the diagonal, so that P V stops
// at the warp's diagonal block, of stride kLdC; v and the bf16 copy of S entering the chunk, S_copy, of stride
// kLdV) and d = exp(G_C) per key channel. gla v6's wide layout at K = 256 passes its tile widths (kOutTiles,
// kStateTiles: 8-column tiles of O and of S per warp) and kScores = 2: P is then the sum of two tiles, the second
// kChunk rows after the first (its two halves of the key channels, gla/prepared_tiles.cuh).
template <int K, int kLdK, int kLdC, int kLdV, int kOutTiles = 4, int kStateTiles = narrow::kStateTiles<K>,
          int kScores = 1>
__device__ __forceinline__ void read_and_update_state(float (&S)[1][kStateTiles][4], const WarpTiles& t,
                                                      const __nv_bfloat16* Qr, const __nv_bfloat16* Ke,
                                                      const __nv_bfloat16* P, const __nv_bfloat16* v,
                                                      const __nv_bfloat16* S_copy, const float* decay,
                                                      __nv_bfloat16* o, const SequenceRows& seq, int H, int V, int h,
                                                      int t0, int v0, float scale) {
  static_assert(kScores == 1 || kScores == 2, "P is one tile or the sum of two");
  {
    float acc[1][kOutTiles][4];
    zero(acc);
    warp_mma<1, kOutTiles, Stored::kRowMajor, Stored::kRowMajor>(acc, Qr, kLdK, S_copy, kLdV, t.m0, t.n0, 0, K);
    warp_mma<1, kOutTiles, Stored::kRowMajor, Stored::kRowMajor>(acc, P, kLdC, v, kLdV, t.m0, t.n0, 0, t.m0 + 16);
    if constexpr (kScores == 2)
      warp_mma<1, kOutTiles, Stored::kRowMajor, Stored::kRowMajor>(acc, P + kChunk * kLdC, kLdC, v, kLdV, t.m0, t.n0,
                                                                   0, t.m0 + 16);
    store_output_tile(acc, o, seq, H, V, h, t0, v0, t.m0, t.n0, scale);
  }
#pragma unroll
  for (int j = 0; j < kStateTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) S[0][j][e] *= decay[t.s_m0 + acc_row(0, e)];
  warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(S, Ke, kLdK, v, kLdV, t.s_m0, t.s_n0, 0, kChunk);
}

}  // namespace gla_sub_chunks
}  // namespace minilin
