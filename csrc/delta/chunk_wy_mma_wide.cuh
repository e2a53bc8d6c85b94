// The chunk kernel of delta v4 - v7, and its phases for v8 and v9 (they differ in how the WY step T = (I + A)^-1 is
// prepared: wy_prepare.cuh for v4, wy_prepare_blocked.cuh for v5 - v9; and in the template's `Loads`: v6 fuses
// phase 1's fragment loads, v7 - v9 also pipeline every k loop's loads one step ahead; v8 and v9 have their own
// kernel around the phases, fed by a producer warp: chunk_wy_producer.cuh). One block of 16 warps per (batch, head, 64
// value columns), sequential over 64-token chunks, reading each chunk's T (bf16, 64 x 64) from `wy`:
//   phase 1:  P = (Q K^T) * exp(G_i - G_j) causal;  R = diag(exp(G)) Q S;  X = diag(beta) (V - diag(exp(G)) K S)
//   phase 2:  Delta = T X  (and Delta decayed to the chunk's end)
//   phase 3:  O = R + P Delta (stored);  S <- exp(G_last) S + K^T (Delta decayed)
// Only phase 1 reads the bf16 copy of S, so each warp rewrites its slice of that copy right after its update.
#pragma once

#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/simt.cuh"
#include "../common/chunk_tiles.cuh"
#include "wy_tiles.cuh"

namespace minilin {
namespace delta_wide {

using wide::kBlockV;
using wide::kLdC;
using wide::kLdV;
using wide::kStateTiles;
using wide::kThreads;
using wide::kWarps;
using bf16 = __nv_bfloat16;

template <int K>
struct Layout {
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes =
      (2 * kChunk * kLdK + kChunk * kLdV + kChunk * kLdC) * sizeof(bf16) + 2 * kChunk * sizeof(float);
  static constexpr size_t kBytes = 2 * kStageBytes
                                   + kChunk * kLdC * sizeof(bf16)          // P
                                   + K * kLdV * sizeof(bf16)               // S (bf16 copy)
                                   + 3 * kChunk * kLdV * sizeof(bf16)      // X, Delta, Delta decayed to the end
                                   + kWarps * kChunk * sizeof(float);      // G, one copy per warp
  unsigned char* base;
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * kLdK; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * kLdK; }
  __device__ bf16* wy(int s) const { return v(s) + kChunk * kLdV; }
  __device__ float* g(int s) const { return reinterpret_cast<float*>(wy(s) + kChunk * kLdC); }
  __device__ float* beta(int s) const { return g(s) + kChunk; }
  __device__ bf16* P() const { return reinterpret_cast<bf16*>(base + 2 * kStageBytes); }
  __device__ bf16* S() const { return P() + kChunk * kLdC; }
  __device__ bf16* X() const { return S() + K * kLdV; }
  __device__ bf16* delta() const { return X() + kChunk * kLdV; }
  __device__ bf16* delta_decayed() const { return delta() + kChunk * kLdV; }
  __device__ float* G(int warp) const { return reinterpret_cast<float*>(delta_decayed() + kChunk * kLdV) + warp * kChunk; }
};

template <int K>
__device__ void load_chunk(const Layout<K>& L, int stage, const Problem& p, const bf16* wy, int b, int h, int n, int v0) {
  cp_async_wy_chunk<K, kBlockV>(L.q(stage), L.k(stage), Layout<K>::kLdK, L.v(stage), kLdV, L.wy(stage), kLdC,
                                L.g(stage), L.beta(stage), p, wy, b, h, n, v0);
}

// One chunk's on-chip tiles: its q and k rows (stride K + 8), v rows (kLdV), T's tile (kLdC), cumulative gate
// G and betas, and the block's scores P, bf16 copy of S, X, Delta and Delta decayed to the chunk's end.
struct ChunkTiles {
  const bf16 *q, *k, *v, *wy;
  const float *G, *beta;
  bf16 *P, *S, *X, *delta, *delta_decayed;
};

// Phase 1, this warp's tile (m0, n0): P = (Q K^T) * exp(G_i - G_j) causal, into shared memory;
// R = diag(exp(G)) Q S, in registers; X = diag(beta) (V - diag(exp(G)) K S), into shared memory.
// kLoads: the three products in three k loops (v4, v5), in one with Q's and S's fragments loaded once
// (warp_phase1_fused, v6), and that with every k loop's fragments loaded one step ahead (v7).
template <int K, Loads kLoads>
__device__ __forceinline__ void chunk_phase1(float (&R)[1][2][4], const ChunkTiles& c, int m0, int n0) {
  constexpr int kLdK = K + 8;
  float QK[1][2][4], KS[1][2][4];
  zero(QK);
  zero(R);
  zero(KS);
  const bool below_diagonal = n0 < m0 + 16;
  if constexpr (kLoads == Loads::kFusedPipelined) {
    warp_phase1_pipelined<K / 16, true>(QK, R, KS, c.q, c.k, kLdK, c.S, kLdV, m0, n0, below_diagonal);
    store_decayed_scores(QK, c.G, c.P, kLdC, m0, n0);
  } else if constexpr (kLoads == Loads::kFused) {
    warp_phase1_fused<K / 16, true>(QK, R, KS, c.q, c.k, kLdK, c.S, kLdV, m0, n0, below_diagonal);
    store_decayed_scores(QK, c.G, c.P, kLdC, m0, n0);
  } else {
    if (below_diagonal)
      warp_mma_unrolled<1, 2, Stored::kRowMajor, Stored::kTransposed, K / 16>(QK, c.q, kLdK, c.k, kLdK, m0, n0, 0);
    store_decayed_scores(QK, c.G, c.P, kLdC, m0, n0);
    warp_mma_unrolled<1, 2, Stored::kRowMajor, Stored::kRowMajor, K / 16>(R, c.q, kLdK, c.S, kLdV, m0, n0, 0);
    warp_mma_unrolled<1, 2, Stored::kRowMajor, Stored::kRowMajor, K / 16>(KS, c.k, kLdK, c.S, kLdV, m0, n0, 0);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = m0 + acc_row(0, e), col = n0 + acc_col(j, e);
      const float decay = __expf(c.G[r]);
      R[0][j][e] *= decay;
      R[0][j][e + 1] *= decay;
      const float2 v2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(c.v + r * kLdV + col));
      store_bf16x2(c.X + r * kLdV + col, c.beta[r] * (v2.x - decay * KS[0][j][e]),
                   c.beta[r] * (v2.y - decay * KS[0][j][e + 1]));
    }
}

// Phase 2's product (after a barrier: X is complete), this warp's tile: Delta = T X (T lower triangular).
template <Loads kLoads>
__device__ __forceinline__ void delta_tile(float (&acc)[1][2][4], const ChunkTiles& c, int m0, int n0) {
  zero(acc);
  warp_mma_k_loop<kLoads, 1, 2, Stored::kRowMajor, Stored::kRowMajor, kChunk / 16>(acc, c.wy, kLdC, c.X, kLdV, m0, n0,
                                                                                   0, (m0 >> 4) + 1);
}

// Phase 2, this warp's tile: Delta and Delta decayed to the chunk's end, both into shared memory.
template <Loads kLoads>
__device__ __forceinline__ void chunk_phase2(const ChunkTiles& c, int m0, int n0) {
  const float G_last = c.G[kChunk - 1];
  float acc[1][2][4];
  delta_tile<kLoads>(acc, c, m0, n0);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = m0 + acc_row(0, e), col = n0 + acc_col(j, e);
      const float d = __expf(G_last - c.G[r]);
      store_bf16x2(c.delta + r * kLdV + col, acc[0][j][e], acc[0][j][e + 1]);
      store_bf16x2(c.delta_decayed + r * kLdV + col, d * acc[0][j][e], d * acc[0][j][e + 1]);
    }
}

// Phase 2 where shared memory has no tile for Delta decayed (delta v11 at K = 256): Delta as above, and the decay
// to the chunk's end put on the keys instead, K^T diag(d) Delta = (diag(d) K)^T Delta: the chunk's k rows, which
// phase 1 has done reading (the barrier before this phase) and only the state update reads again, scaled in place
// by d_r = exp(G_last - G_r), 8 at a time over the `threads` threads (`thread` this one's index).
template <int K, Loads kLoads>
__device__ __forceinline__ void chunk_phase2_decaying_keys(const ChunkTiles& c, bf16* k, int m0, int n0, int thread,
                                                           int threads) {
  const float G_last = c.G[kChunk - 1];
  float acc[1][2][4];
  delta_tile<kLoads>(acc, c, m0, n0);
  store_tile_bf16(acc, c.delta, kLdV, m0, n0);
  for (int i = thread; i < kChunk * K / 8; i += threads) {
    const int r = i / (K / 8), col = (i % (K / 8)) * 8;
    const float d = __expf(G_last - c.G[r]);
    float x[8];
    load8(k + r * (K + 8) + col, x);
#pragma unroll
    for (int e = 0; e < 8; e += 2) store_bf16x2(k + r * (K + 8) + col + e, d * x[e], d * x[e + 1]);
  }
}

// Phase 3's output (after a barrier: P and Delta are complete): R += P Delta for this warp's tile.
template <Loads kLoads>
__device__ __forceinline__ void chunk_output(float (&R)[1][2][4], const ChunkTiles& c, int m0, int n0) {
  warp_mma_k_loop<kLoads, 1, 2, Stored::kRowMajor, Stored::kRowMajor, kChunk / 16>(R, c.P, kLdC, c.delta, kLdV, m0, n0,
                                                                                   0, (m0 >> 4) + 1);
}

// Phase 3's state update, this warp's slice of S: S <- exp(G_last) S + K^T (Delta decayed); then the slice's
// bf16 copy, which only the next chunk's phase 1 reads.
template <int K, Loads kLoads, int NT>
__device__ __forceinline__ void chunk_state_update(float (&S)[1][NT][4], const ChunkTiles& c, int s_m0, int s_n0) {
  scale_tiles(S, __expf(c.G[kChunk - 1]));
  warp_mma_k_loop<kLoads, 1, NT, Stored::kTransposed, Stored::kRowMajor, kChunk / 16>(S, c.k, K + 8, c.delta_decayed,
                                                                                      kLdV, s_m0, s_n0, 0);
  store_state_copy(S, c.S, kLdV, s_m0, s_n0);
}

template <int K, Loads kLoads>
__global__ void __launch_bounds__(kThreads, 1) delta_chunked_wy_mma_wide(const Problem p, const bf16* wy) {
  extern __shared__ __align__(16) unsigned char smem[];

  const Layout<K> L{smem};
  const int T = p.T, H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5;
  const auto [m0, n0, s_m0, s_n0] = wide::warp_tiles<K>(warp);
  const float scale = p.scale;
  float* G = L.G(warp);

  load_chunk<K>(L, 0, p, wy, b, h, 0, v0);
  cp_async_commit();

  float S[1][kStateTiles<K>][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n & 1, t0 = n * kChunk;
    cp_async_wait<0>();
    __syncthreads();  // chunk n and the bf16 copy of S are on chip; chunk n - 1's stage is free
    if (n + 1 < chunks) load_chunk<K>(L, stage ^ 1, p, wy, b, h, n + 1, v0);
    cp_async_commit();

    warp_chunk_cumsum(G, L.g(stage), p.g != nullptr);  // every warp its own copy of G: no barrier
    __syncwarp();

    const ChunkTiles tiles{L.q(stage), L.k(stage), L.v(stage), L.wy(stage), G,          L.beta(stage),
                           L.P(),      L.S(),      L.X(),      L.delta(),   L.delta_decayed()};
    float R[1][2][4];
    chunk_phase1<K, kLoads>(R, tiles, m0, n0);
    __syncthreads();
    chunk_phase2<kLoads>(tiles, m0, n0);
    __syncthreads();
    chunk_output<kLoads>(R, tiles, m0, n0);
    store_output_tile(R, o, T, H, V, b, h, t0, v0, m0, n0, scale);
    chunk_state_update<K, kLoads>(S, tiles, s_m0, s_n0);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

// Launch the chunk kernel for K = 64 or 128 on p's stream, reading T from `wy`.
template <Loads kLoads>
void launch_chunks(const Problem& p, const bf16* wy, const char* name) {
  launch_per_value_block(p, name, kBlockV, kThreads, delta_chunked_wy_mma_wide<64, kLoads>, Layout<64>::kBytes,
                         delta_chunked_wy_mma_wide<128, kLoads>, Layout<128>::kBytes, wy);
}

inline size_t workspace_bytes(int B, int T, int H, int, int, bool packed) {
  return wy_workspace_elements(B, T, H, packed) * sizeof(bf16);
}

// The argument checks v4 - v10 share; `name` is the version's kernel name for the messages.
inline void check_problem(const Problem& p, const std::string& name) {
  check_tensor_core_problem(p, name.c_str(), true, kBlockV);
  check_workspace(p, name.c_str(), workspace_bytes(p.B, p.T, p.H, p.K, p.V, p.cu_seqlens != nullptr));
}

}  // namespace delta_wide
}  // namespace minilin
