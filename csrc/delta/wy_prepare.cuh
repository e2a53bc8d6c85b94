// The WY step of the chunked delta rule (shared by delta v2, v3 and v4): for every chunk at once, in parallel
// over (batch, head, chunk), the unit lower-triangular matrix
//     T = (I + A)^-1,   A_ij = beta_i (k_i . k_j) exp(G_i - G_j)  for j < i, else 0        [64 x 64]
// which does not depend on the state, so it is taken off the sequential chunk loop. The chunk kernel then
// needs only products with T: the corrections of the chunk are Delta = T X with
// X = diag(beta) (V - diag(exp(G)) K S) (minilin/mixers/_delta_rule.py: W S = T diag(beta) (K * exp(G)) S).
//
// A is built from K K^T (fp32 CUDA cores for v2, bf16 tensor cores for v3); T is found by forward
// substitution, one thread per column c: x_i = [i == c] - sum_{j < i} A_ij x_j (64 threads, no barriers).
// Output: T for chunk n of head (b, h) as one tile of the WY workspace (wy_tiles.cuh).
#pragma once

#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/simt.cuh"
#include "wy_tiles.cuh"

namespace minilin {

constexpr int kWyThreads = 256;
constexpr int kLdA = kChunk + 4;  // fp32 rows of A: 16-byte aligned, so the solve's row reads can vectorize

inline size_t wy_shared_bytes(int K, bool tensor_cores) {
  const size_t keys = tensor_cores ? size_t(kChunk) * (K + 8) * sizeof(__nv_bfloat16) : size_t(kChunk) * (K + 1) * sizeof(float);
  return keys + (size_t(kChunk) * kLdA + 2 * kChunk) * sizeof(float);
}

template <typename Elem, typename Out, bool kTensorCores>
__global__ void __launch_bounds__(kWyThreads) delta_wy_prepare(const Problem p, Out* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int K = p.K, n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t0 = n * kChunk;
  const int keys_bytes = kTensorCores ? kChunk * (K + 8) * sizeof(__nv_bfloat16) : kChunk * (K + 1) * sizeof(float);
  float* A = reinterpret_cast<float*>(smem + keys_bytes);  // [kChunk][kLdA]
  float* G = A + kChunk * kLdA;                            // [kChunk]
  float* beta = G + kChunk;                                // [kChunk]

  load_chunk_scalars(beta, p.beta, p, b, h, t0);
  if (threadIdx.x < 32) load_chunk_cumsum(G, p.g, p, b, h, t0);

  if constexpr (kTensorCores) {
    static_assert(sizeof(Elem) == 2, "tensor cores take bf16 keys");
    __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem);  // [kChunk][K + 8]
    const int ld = K + 8;
    const __nv_bfloat16* k = static_cast<const __nv_bfloat16*>(p.k) + ((static_cast<long long>(b) * p.T + t0) * p.H + h) * K;
    cp_async_rows(k_s, ld, k, static_cast<long long>(p.H) * K, kChunk, K, min(kChunk, p.T - t0));
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    // K K^T: warp w computes rows 16 (w / 2) .. + 15, columns 32 (w % 2) .. + 31
    const int warp = threadIdx.x >> 5, m0 = 16 * (warp >> 1), n0 = 32 * (warp & 1);
    float acc[1][4][4];
    zero(acc);
    if (n0 < m0 + 16) warp_mma<1, 4, Stored::kRowMajor, Stored::kTransposed>(acc, k_s, ld, k_s, ld, m0, n0, 0, K);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e);
        A[r * kLdA + c] = c < r ? beta[r] * acc[0][j][e] * __expf(G[r] - G[c]) : 0.0f;
      }
  } else {
    float* k_s = reinterpret_cast<float*>(smem);  // [kChunk][K + 1]
    load_chunk_f32(k_s, K + 1, static_cast<const Elem*>(p.k), p, b, h, t0, K, 0, K, 1.0f);
    __syncthreads();
    const int m0 = (threadIdx.x / 16) * 4, n0 = (threadIdx.x % 16) * 4;  // 16 x 16 tiles of 4 x 4
    float acc[4][4];
    zero(acc);
    if (n0 <= m0 + 3) micro_gemm<4, 4>(acc, k_s, K + 1, 1, k_s, 1, K + 1, m0, n0, 0, K);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = m0 + i, c = n0 + j;
        A[r * kLdA + c] = c < r ? beta[r] * acc[i][j] * expf(G[r] - G[c]) : 0.0f;
      }
  }
  __syncthreads();

  if (threadIdx.x < kChunk) {
    const int c = threadIdx.x;
    Out* T_out = out + wy_tile_offset(p, b, h, n);
    float x[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      float xi = i == c ? 1.0f : 0.0f;
#pragma unroll
      for (int j = 0; j < i; ++j) xi = fmaf(-A[i * kLdA + j], x[j], xi);
      x[i] = xi;
      T_out[i * kChunk + c] = from_float<Out>(xi);
    }
  }
}

template <typename Elem, typename Out, bool kTensorCores>
void launch_wy_prepare(const Problem& p, Out* out, const char* name) {
  launch_checked(p, name, delta_wy_prepare<Elem, Out, kTensorCores>, dim3(ceil_div(p.T, kChunk), p.H, p.B), kWyThreads,
                 wy_shared_bytes(p.K, kTensorCores), out);
}

}  // namespace minilin
