// The chunk kernel of linear v4, v5 and v6, and its phases for v7 (they differ in the template's `Loads`: v5
// fuses phase 1's fragment loads, v6 and v7 also pipeline every k loop's loads one step ahead; v7 has its own
// kernel around the phases, fed by a producer warp). One block of 16 warps per
// (batch, head, 64 value columns), sequential over 64-token chunks:
//   phase 1 (after the chunk lands):   P = (Q K^T) * exp(G_i - G_j) causal;  R = diag(exp(G)) Q S;
//                                      V decayed to the chunk's end
//   phase 2:                           O = R + P V (stored);  S <- exp(G_last) S + K^T (V decayed)
// Only phase 1 reads the bf16 copy of S, so each warp rewrites its slice of that copy right after its
// update, and the next chunk's first barrier orders it before any read.
#pragma once

#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/simt.cuh"
#include "../common/chunk_tiles.cuh"

namespace minilin {
namespace linear_wide {

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
  static constexpr size_t kStageBytes = (2 * kChunk * kLdK + kChunk * kLdV) * sizeof(bf16) + kChunk * sizeof(float);
  static constexpr size_t kBytes = 2 * kStageBytes
                                   + kChunk * kLdC * sizeof(bf16)          // P
                                   + K * kLdV * sizeof(bf16)               // S (bf16 copy)
                                   + kChunk * kLdV * sizeof(bf16)          // V decayed to the chunk's end
                                   + kWarps * kChunk * sizeof(float);      // G, one copy per warp
  unsigned char* base;
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * kLdK; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * kLdK; }
  __device__ float* g(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ bf16* P() const { return reinterpret_cast<bf16*>(base + 2 * kStageBytes); }
  __device__ bf16* S() const { return P() + kChunk * kLdC; }
  __device__ bf16* v_decayed() const { return S() + K * kLdV; }
  __device__ float* G(int warp) const { return reinterpret_cast<float*>(v_decayed() + kChunk * kLdV) + warp * kChunk; }
};

template <int K>
__device__ void load_chunk(const Layout<K>& L, int stage, const Problem& p, int b, int h, int t0, int v0) {
  cp_async_chunk<K, kBlockV>(L.q(stage), L.k(stage), Layout<K>::kLdK, L.v(stage), kLdV, L.g(stage), p, b, h, t0, v0);
}

// One chunk's on-chip tiles: its q and k rows (stride K + 8), v rows (kLdV), cumulative gate G, and the
// block's scores P, bf16 copy of S and V decayed.
struct ChunkTiles {
  const bf16 *q, *k, *v;
  const float* G;
  bf16 *P, *S, *v_decayed;
};

// Phase 1, this warp's share: P = (Q K^T) * exp(G_i - G_j) causal, into shared memory (tile at m0, n0);
// R = diag(exp(G)) Q S, in registers; and V decayed to the chunk's end, spread over kThreads threads
// (`thread` is this one's index among them). Returns G_last, the chunk's total log-decay.
// kLoads: Q K^T and Q S in two k loops (v4), in one with Q's A fragments loaded once (v5), and that with every
// k loop's fragments loaded one step ahead (v6).
template <int K, Loads kLoads>
__device__ __forceinline__ float chunk_phase1(float (&R)[1][2][4], const ChunkTiles& c, int m0, int n0, int thread) {
  constexpr int kLdK = K + 8;
  const float* G = c.G;
  float QK[1][2][4];
  zero(QK);
  zero(R);
  const bool below_diagonal = n0 < m0 + 16;
  if constexpr (kLoads == Loads::kFusedPipelined) {
    float unused[1][2][4];
    warp_phase1_pipelined<K / 16, false>(QK, R, unused, c.q, c.k, kLdK, c.S, kLdV, m0, n0, below_diagonal);
    store_decayed_scores(QK, G, c.P, kLdC, m0, n0);
  } else if constexpr (kLoads == Loads::kFused) {
    float unused[1][2][4];
    warp_phase1_fused<K / 16, false>(QK, R, unused, c.q, c.k, kLdK, c.S, kLdV, m0, n0, below_diagonal);
    store_decayed_scores(QK, G, c.P, kLdC, m0, n0);
  } else {
    if (below_diagonal)
      warp_mma_unrolled<1, 2, Stored::kRowMajor, Stored::kTransposed, K / 16>(QK, c.q, kLdK, c.k, kLdK, m0, n0, 0);
    store_decayed_scores(QK, G, c.P, kLdC, m0, n0);
    warp_mma_unrolled<1, 2, Stored::kRowMajor, Stored::kRowMajor, K / 16>(R, c.q, kLdK, c.S, kLdV, m0, n0, 0);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) R[0][j][e] *= __expf(G[m0 + acc_row(0, e)]);
  const float G_last = G[kChunk - 1];
  for (int i = thread; i < kChunk * kBlockV / 8; i += kThreads) {
    const int j = i / (kBlockV / 8), col = (i % (kBlockV / 8)) * 8;
    float x[8];
    load8(c.v + j * kLdV + col, x);
    const float d = __expf(G_last - G[j]);
#pragma unroll
    for (int e = 0; e < 8; e += 2) store_bf16x2(c.v_decayed + j * kLdV + col + e, d * x[e], d * x[e + 1]);
  }
  return G_last;
}

// Phase 2's output (after a barrier: P and V decayed are complete): R += P V for this warp's tile, over the
// key blocks up to the diagonal.
template <Loads kLoads>
__device__ __forceinline__ void chunk_output(float (&R)[1][2][4], const ChunkTiles& c, int m0, int n0) {
  warp_mma_k_loop<kLoads, 1, 2, Stored::kRowMajor, Stored::kRowMajor, kChunk / 16>(R, c.P, kLdC, c.v, kLdV, m0, n0, 0,
                                                                                   (m0 >> 4) + 1);
}

// Phase 2's state update, this warp's slice of S (rows s_m0.., columns s_n0..): S <- exp(G_last) S + K^T (V
// decayed); then the slice's bf16 copy, which only the next chunk's phase 1 reads.
template <int K, Loads kLoads, int NT>
__device__ __forceinline__ void chunk_state_update(float (&S)[1][NT][4], const ChunkTiles& c, float G_last, int s_m0,
                                                   int s_n0) {
  scale_tiles(S, __expf(G_last));
  warp_mma_k_loop<kLoads, 1, NT, Stored::kTransposed, Stored::kRowMajor, kChunk / 16>(S, c.k, K + 8, c.v_decayed, kLdV,
                                                                                      s_m0, s_n0, 0);
  store_state_copy(S, c.S, kLdV, s_m0, s_n0);
}

template <int K, Loads kLoads>
__global__ void __launch_bounds__(kThreads, 1) linear_chunked_mma_wide(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];

  const Layout<K> L{smem};
  const int T = p.T, H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5;
  const auto [m0, n0, s_m0, s_n0] = wide::warp_tiles<K>(warp);
  const float scale = p.scale;
  float* G = L.G(warp);

  load_chunk<K>(L, 0, p, b, h, 0, v0);
  cp_async_commit();

  float S[1][kStateTiles<K>][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n & 1, t0 = n * kChunk;
    cp_async_wait<0>();
    __syncthreads();  // chunk n and the bf16 copy of S are on chip; chunk n - 1's stage is free
    if (n + 1 < chunks) load_chunk<K>(L, stage ^ 1, p, b, h, t0 + kChunk, v0);
    cp_async_commit();

    warp_chunk_cumsum(G, L.g(stage), p.g != nullptr);  // every warp its own copy of G: no barrier
    __syncwarp();

    const ChunkTiles tiles{L.q(stage), L.k(stage), L.v(stage), G, L.P(), L.S(), L.v_decayed()};
    float R[1][2][4];
    const float G_last = chunk_phase1<K, kLoads>(R, tiles, m0, n0, threadIdx.x);
    __syncthreads();
    chunk_output<kLoads>(R, tiles, m0, n0);
    store_output_tile(R, o, T, H, V, b, h, t0, v0, m0, n0, scale);
    chunk_state_update<K, kLoads>(S, tiles, G_last, s_m0, s_n0);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

// The argument checks of every wide linear kernel (v4-v7); `name` is the version's kernel name.
inline void check_problem(const Problem& p, const std::string& name) {
  check_tensor_core_problem(p, name.c_str(), false, kBlockV);
}

// Checks and launch for K = 64 or 128 on p's stream.
template <Loads kLoads>
void forward(const Problem& p, const std::string& name) {
  check_problem(p, name);
  launch_per_value_block(p, name.c_str(), kBlockV, kThreads, linear_chunked_mma_wide<64, kLoads>, Layout<64>::kBytes,
                         linear_chunked_mma_wide<128, kLoads>, Layout<128>::kBytes);
}

}  // namespace linear_wide
}  // namespace minilin
