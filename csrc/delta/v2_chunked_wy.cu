// delta v2 (chunked, WY representation, CUDA cores): chunks of 64 tokens with the WY step T = (I + A)^-1
// computed for all chunks at once beforehand (wy_prepare.cuh), because only the product with the state is
// sequential; everything in fp32 on plain CUDA cores, so this version shows what the chunked form costs
// before tensor cores enter (v3).
//
// One block per (batch, head, 32 value columns), sequential over the chunks, the K x 32 state S in shared
// memory. With G the chunk-local cumulative log-gate (zero for DeltaNet), for the chunk's tokens i, j:
//     X     = diag(beta) (V - diag(exp(G)) K S)          what each token would write, given the entering S
//     Delta = T X                                        the corrections, all tokens of the chunk at once
//     P_ij  = (q_i . k_j) exp(G_i - G_j)  for j <= i    intra-chunk "attention"
//     O     = diag(exp(G)) Q S + P Delta
//     S    <- exp(G_last) S + K^T diag(exp(G_last - G)) Delta
// (minilin/mixers/_delta_rule.py `chunked`, with U - W S = T X). Only non-positive numbers are exponentiated.
#include "wy_prepare.cuh"

namespace minilin {
namespace {

constexpr int kBlockV = 32;
constexpr int kThreads = 256;
constexpr int kLdV = kBlockV + 1;
constexpr int kLdC = kChunk + 1;

__host__ __device__ inline size_t shared_floats(int K) {
  return 2 * size_t(kChunk) * (K + 1)   // q, k
         + 4 * size_t(kChunk) * kLdV    // v, X, Delta, Delta decayed to the chunk's end
         + 2 * size_t(kChunk) * kLdC    // P, T
         + size_t(K) * kLdV             // S
         + 2 * kChunk;                  // G, beta
}

size_t workspace_bytes(int B, int T, int H, int, int, bool packed) {
  return wy_workspace_elements(B, T, H, packed) * sizeof(float);
}

template <typename Elem>
__global__ void __launch_bounds__(kThreads, 1) delta_v2_chunked(const Problem p, const float* wy) {
  extern __shared__ __align__(16) float smem[];
  const int K = p.K, V = p.V, T = p.T, H = p.H, ldk = K + 1;
  float* q_s = smem;                    // [kChunk][ldk], already times scale
  float* k_s = q_s + kChunk * ldk;      // [kChunk][ldk]
  float* v_s = k_s + kChunk * ldk;      // [kChunk][kLdV]
  float* X_s = v_s + kChunk * kLdV;     // [kChunk][kLdV]
  float* D_s = X_s + kChunk * kLdV;     // [kChunk][kLdV]: Delta
  float* Dd_s = D_s + kChunk * kLdV;    // [kChunk][kLdV]: exp(G_last - G_j) Delta_j
  float* P_s = Dd_s + kChunk * kLdV;    // [kChunk][kLdC]
  float* T_s = P_s + kChunk * kLdC;     // [kChunk][kLdC]
  float* S_s = T_s + kChunk * kLdC;     // [K][kLdV]
  float* G = S_s + K * kLdV;            // [kChunk]
  float* beta = G + kChunk;             // [kChunk]

  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  for (int i = threadIdx.x; i < K * kBlockV; i += kThreads) {
    const int row = i / kBlockV, c = i % kBlockV, col = v0 + c;
    S_s[row * kLdV + c] = (p.h0 && col < V) ? p.h0[state_base + static_cast<long long>(row) * V + col] : 0.0f;
  }

  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  const Elem* v = static_cast<const Elem*>(p.v);
  Elem* o = static_cast<Elem*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int t0 = n * kChunk;
    // 1. the chunk on chip (zero past T), its cumulative gate and its T = (I + A)^-1
    load_chunk_f32(q_s, ldk, q, p, b, h, t0, K, 0, K, p.scale);
    load_chunk_f32(k_s, ldk, k, p, b, h, t0, K, 0, K, 1.0f);
    load_chunk_f32(v_s, kLdV, v, p, b, h, t0, V, v0, kBlockV, 1.0f);
    load_chunk_scalars(beta, p.beta, p, b, h, t0);
    const float* T_chunk = wy + wy_tile_offset(p, b, h, n);
    for (int i = threadIdx.x; i < kChunk * kChunk; i += kThreads) T_s[(i / kChunk) * kLdC + i % kChunk] = T_chunk[i];
    if (threadIdx.x < 32) load_chunk_cumsum(G, p.g, p, b, h, t0);
    __syncthreads();
    const float G_last = G[kChunk - 1];

    // 2. P = (Q K^T) * exp(G_i - G_j), causal; X = diag(beta) (V - diag(exp(G)) K S)
    {
      const int m0 = (threadIdx.x / 16) * 4, n0 = (threadIdx.x % 16) * 4;
      float acc[4][4];
      zero(acc);
      if (n0 <= m0 + 3) micro_gemm<4, 4>(acc, q_s, ldk, 1, k_s, 1, ldk, m0, n0, 0, K);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = m0 + i, c = n0 + j;
          P_s[r * kLdC + c] = c <= r ? acc[i][j] * expf(G[r] - G[c]) : 0.0f;
        }
    }
    {
      const int m0 = (threadIdx.x / 16) * 4, n0 = (threadIdx.x % 16) * 2;
      float KS[4][2];
      zero(KS);
      micro_gemm<4, 2>(KS, k_s, ldk, 1, S_s, kLdV, 1, m0, n0, 0, K);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int r = m0 + i, c = n0 + j;
          X_s[r * kLdV + c] = beta[r] * (v_s[r * kLdV + c] - expf(G[r]) * KS[i][j]);
        }
    }
    __syncthreads();

    // 3. Delta = T X (T is lower triangular), and Delta decayed to the chunk's end
    {
      const int m0 = (threadIdx.x / 16) * 4, n0 = (threadIdx.x % 16) * 2;
      float acc[4][2];
      zero(acc);
      micro_gemm<4, 2>(acc, T_s, kLdC, 1, X_s, kLdV, 1, m0, n0, 0, m0 + 4);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int r = m0 + i, c = n0 + j;
          D_s[r * kLdV + c] = acc[i][j];
          Dd_s[r * kLdV + c] = expf(G_last - G[r]) * acc[i][j];
        }
    }
    __syncthreads();

    // 4. O = diag(exp(G)) Q S + P Delta
    {
      const int m0 = (threadIdx.x / 16) * 4, n0 = (threadIdx.x % 16) * 2;
      float read[4][2], intra[4][2];
      zero(read);
      zero(intra);
      micro_gemm<4, 2>(read, q_s, ldk, 1, S_s, kLdV, 1, m0, n0, 0, K);
      micro_gemm<4, 2>(intra, P_s, kLdC, 1, D_s, kLdV, 1, m0, n0, 0, m0 + 4);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int t = t0 + m0 + i, col = v0 + n0 + j;
          if (t < T && col < V)
            o[((static_cast<long long>(b) * T + t) * H + h) * V + col] =
                from_float<Elem>(expf(G[m0 + i]) * read[i][j] + intra[i][j]);
        }
    }
    __syncthreads();

    // 5. S <- exp(G_last) S + K^T (Delta decayed to the end)
    update_state_simt<kBlockV, kThreads>(S_s, kLdV, k_s, ldk, Dd_s, K, G_last);
    __syncthreads();
  }

  for (int i = threadIdx.x; i < K * kBlockV; i += kThreads) {
    const int row = i / kBlockV, c = i % kBlockV, col = v0 + c;
    if (col < V) p.ht[state_base + static_cast<long long>(row) * V + col] = S_s[row * kLdV + c];
  }
}

template <typename Elem>
void launch(const Problem& p) {
  float* wy = static_cast<float*>(p.workspace);
  launch_wy_prepare<Elem, float, false>(p, wy, "delta_v2_wy_prepare");
  launch_checked(p, "delta_v2_chunked", delta_v2_chunked<Elem>, dim3(ceil_div(p.V, kBlockV), p.H, p.B), kThreads,
                 shared_floats(p.K) * sizeof(float), wy);
}

void forward(const Problem& p) {
  check_common(p, "delta_v2_chunked", true);
  require(p.K <= kKeysUpTo128.max_k, [&] {
    return "delta_v2_chunked: K must be <= 128 (q, k and the state share one block's shared memory), got K=" +
           std::to_string(p.K);
  });
  check_workspace(p, "delta_v2_chunked", workspace_bytes(p.B, p.T, p.H, p.K, p.V, false));
  if (p.dtype == kFloat32) launch<float>(p);
  else launch<__nv_bfloat16>(p);
}

}  // namespace

extern const Version delta_v2 = {
    "delta", 2, "chunked_wy",
    "Chunks of 64 tokens with the WY step T = (I + A)^-1 precomputed for all chunks, the rest dense fp32 products on CUDA cores.",
    true, true, kKeysUpTo128, 80, workspace_bytes, forward};

}  // namespace minilin
