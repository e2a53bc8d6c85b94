// linear v2 (chunked, CUDA cores): chunks of 64 tokens, each handled as dense matrix products inside the
// chunk plus one state read and one state update, because that turns 64 sequential rank-1 updates into
// matrix work; everything in fp32 on plain CUDA cores, so this version shows what the chunked form costs
// before tensor cores enter (v3).
//
// One block per (batch, head, 32 value columns), sequential over the chunks, the K x 32 state in shared
// memory. With G the chunk-local cumulative log-gate (G_i = g_1 + ... + g_i), for token i of the chunk:
//     P_ij = (q_i . k_j) exp(G_i - G_j)   for j <= i, else 0          intra-chunk "attention"
//     o_i  = exp(G_i) (S^T q_i) + sum_j P_ij v_j                       state read + intra-chunk
//     S   <- exp(G_last) S + sum_j exp(G_last - G_j) k_j v_j^T         state update
// (minilin/mixers/_gated_linear.py `chunked`, step for step). Only non-positive numbers are exponentiated.
#include "../common/launch.cuh"
#include "../common/simt.cuh"

namespace minilin {
namespace {

constexpr int kBlockV = 32;    // value columns per block
constexpr int kThreads = 256;
constexpr int kLdV = kBlockV + 1;   // odd row strides keep the micro-GEMM's shared loads conflict-free
constexpr int kLdC = kChunk + 1;

__host__ __device__ inline size_t shared_floats(int K) {
  return 2 * size_t(kChunk) * (K + 1)   // q, k
         + 2 * size_t(kChunk) * kLdV    // v, v decayed to the chunk's end
         + size_t(kChunk) * kLdC        // P
         + size_t(K) * kLdV             // S
         + kChunk;                      // G
}

template <typename Elem>
__global__ void __launch_bounds__(kThreads, 1) linear_v2_chunked(const Problem p) {
  extern __shared__ __align__(16) float smem[];
  const int K = p.K, V = p.V, T = p.T, H = p.H, ldk = K + 1;
  float* q_s = smem;                    // [kChunk][ldk], already times scale
  float* k_s = q_s + kChunk * ldk;      // [kChunk][ldk]
  float* v_s = k_s + kChunk * ldk;      // [kChunk][kLdV]
  float* vd_s = v_s + kChunk * kLdV;    // [kChunk][kLdV]: exp(G_last - G_j) v_j
  float* P_s = vd_s + kChunk * kLdV;    // [kChunk][kLdC]
  float* S_s = P_s + kChunk * kLdC;     // [K][kLdV]
  float* G = S_s + K * kLdV;            // [kChunk]

  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z;
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  for (int i = threadIdx.x; i < K * kBlockV; i += kThreads) {
    const int row = i / kBlockV, c = i % kBlockV, col = v0 + c;
    S_s[row * kLdV + c] = (p.h0 && col < V) ? p.h0[state_base + static_cast<long long>(row) * V + col] : 0.0f;
  }

  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  const Elem* v = static_cast<const Elem*>(p.v);
  Elem* o = static_cast<Elem*>(p.o);
  for (int t0 = 0; t0 < T; t0 += kChunk) {
    // 1. the chunk on chip (zero past T), and its cumulative gate
    load_chunk_f32(q_s, ldk, q, p, b, h, t0, K, 0, K, p.scale);
    load_chunk_f32(k_s, ldk, k, p, b, h, t0, K, 0, K, 1.0f);
    load_chunk_f32(v_s, kLdV, v, p, b, h, t0, V, v0, kBlockV, 1.0f);
    if (threadIdx.x < 32) load_chunk_cumsum(G, p.g, p, b, h, t0);
    __syncthreads();
    const float G_last = G[kChunk - 1];

    // 2. P = (Q K^T) * exp(G_i - G_j), causal; and the values decayed to the chunk's end
    {
      const int m0 = (threadIdx.x / 16) * 4, n0 = (threadIdx.x % 16) * 4;  // 16 x 16 tiles of 4 x 4
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
    for (int i = threadIdx.x; i < kChunk * kBlockV; i += kThreads) {
      const int j = i / kBlockV, c = i % kBlockV;
      vd_s[j * kLdV + c] = expf(G_last - G[j]) * v_s[j * kLdV + c];
    }
    __syncthreads();

    // 3. o_i = exp(G_i) (S^T q_i) + sum_{j <= i} P_ij v_j: 16 x 16 tiles of 4 x 2
    {
      const int m0 = (threadIdx.x / 16) * 4, n0 = (threadIdx.x % 16) * 2;
      float read[4][2], intra[4][2];
      zero(read);
      zero(intra);
      micro_gemm<4, 2>(read, q_s, ldk, 1, S_s, kLdV, 1, m0, n0, 0, K);
      micro_gemm<4, 2>(intra, P_s, kLdC, 1, v_s, kLdV, 1, m0, n0, 0, m0 + 4);  // P_ij = 0 for j > i
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
    __syncthreads();  // every read of S is done before it changes

    // 4. S <- exp(G_last) S + K^T (values decayed to the end): K/4 x 8 tiles of 4 x 4
    update_state_simt<kBlockV, kThreads>(S_s, kLdV, k_s, ldk, vd_s, K, G_last);
    __syncthreads();  // the next chunk overwrites q, k, v and reads S
  }

  for (int i = threadIdx.x; i < K * kBlockV; i += kThreads) {
    const int row = i / kBlockV, c = i % kBlockV, col = v0 + c;
    if (col < V) p.ht[state_base + static_cast<long long>(row) * V + col] = S_s[row * kLdV + c];
  }
}

template <typename Elem>
void launch(const Problem& p) {
  launch_checked(p, "linear_v2_chunked", linear_v2_chunked<Elem>, dim3(ceil_div(p.V, kBlockV), p.H, p.B), kThreads,
                 shared_floats(p.K) * sizeof(float));
}

void forward(const Problem& p) {
  check_common(p, "linear_v2_chunked", false);
  require(p.K <= kKeysUpTo128.max_k, [&] {
    return "linear_v2_chunked: K must be <= 128 (q, k and the state share one block's shared memory), got K=" +
           std::to_string(p.K);
  });
  if (p.dtype == kFloat32) launch<float>(p);
  else launch<__nv_bfloat16>(p);
}

}  // namespace

extern const Version linear_v2 = {
    "linear", 2, "chunked",
    "Chunks of 64 tokens as dense products (intra-chunk P V, state read, state update) on plain fp32 CUDA cores.",
    true, true, kKeysUpTo128, 80, nullptr, forward};

}  // namespace minilin
