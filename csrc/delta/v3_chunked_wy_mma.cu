// delta v3 (chunked WY, tensor cores): v2's chunk algorithm with every product on bf16 tensor cores
// (mma.sync m16n8k16, fp32 accumulators; the WY step's K K^T too), the state kept in registers across
// chunks, and the next chunk copied in (cp.async) while the current one computes, because v2 spends its
// time in fp32 multiply-adds that the tensor cores do an order of magnitude faster.
//
// The WY step T = (I + A)^-1 runs first for all chunks in parallel (wy_prepare.cuh, T stored in bf16).
// Then one block of 8 warps per (batch, head, 64 value columns), sequential over 64-token chunks. Per
// chunk (G the chunk-local cumulative log-gate, zero for DeltaNet; all shared tiles bf16):
//     X     = diag(beta) (V - diag(exp(G)) K S)       warps: 16 rows x 32 columns each
//     Delta = T X
//     P     = (Q K^T) * exp(G_i - G_j), causal
//     O     = diag(exp(G)) Q S + P Delta
//     S    <- exp(G_last) S + K^T diag(exp(G_last - G)) Delta      each warp owns 16 rows of S (fp32 registers)
// S is read by the products through a bf16 copy in shared memory, rewritten after each chunk.
#include "../common/chunk_tiles.cuh"
#include "wy_prepare.cuh"

namespace minilin {
namespace {

using narrow::kWarps, narrow::kThreads, narrow::kBlockV, narrow::kLdV, narrow::kLdC;  // common/chunk_tiles.cuh
using bf16 = __nv_bfloat16;

size_t workspace_bytes(int B, int T, int H, int, int, bool packed) {
  return wy_workspace_elements(B, T, H, packed) * sizeof(bf16);
}

template <int K>
struct Layout {
  static constexpr int kLdK = K + 8;
  // per stage: q, k [kChunk][kLdK], v [kChunk][kLdV], T [kChunk][kLdC] (bf16); g, beta [kChunk] (fp32)
  static constexpr size_t kStageBytes =
      (2 * kChunk * kLdK + kChunk * kLdV + kChunk * kLdC) * sizeof(bf16) + 2 * kChunk * sizeof(float);
  static constexpr size_t kBytes = 2 * kStageBytes
                                   + kChunk * kLdC * sizeof(bf16)       // P
                                   + K * kLdV * sizeof(bf16)            // S (bf16 copy)
                                   + 3 * kChunk * kLdV * sizeof(bf16)   // X, Delta, Delta decayed to the end
                                   + kChunk * sizeof(float);            // G
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
  __device__ float* G() const { return reinterpret_cast<float*>(delta_decayed() + kChunk * kLdV); }
};

template <int K>
__device__ void load_chunk(const Layout<K>& L, int stage, const Problem& p, const bf16* wy, int b, int h, int n, int v0) {
  cp_async_wy_chunk<K, kBlockV>(L.q(stage), L.k(stage), Layout<K>::kLdK, L.v(stage), kLdV, L.wy(stage), kLdC,
                                L.g(stage), L.beta(stage), p, wy, b, h, n, v0);
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) delta_v3_chunked_wy_mma(const Problem p, const bf16* wy) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = Layout<K>::kLdK;
  constexpr int kStateTiles = narrow::kStateTiles<K>;  // the state split (narrow::warp_tiles)

  const Layout<K> L{smem};
  const int T = p.T, H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5;
  const auto [m0, n0, s_m0, s_n0] = narrow::warp_tiles<K>(warp);  // this warp's tile of P, X, Delta and O, and of S
  const float scale = p.scale;

  load_chunk<K>(L, 0, p, wy, b, h, 0, v0);
  cp_async_commit();

  float S[1][kStateTiles][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n & 1, t0 = n * kChunk;
    cp_async_wait<0>();
    __syncthreads();  // chunk n is on chip; every read of chunk n - 1's stage is done
    if (n + 1 < chunks) load_chunk<K>(L, stage ^ 1, p, wy, b, h, n + 1, v0);
    cp_async_commit();

    const bf16* q_s = L.q(stage);
    const bf16* k_s = L.k(stage);
    const bf16* v_s = L.v(stage);
    const float* beta = L.beta(stage);
    float* G = L.G();
    if (warp == 0) warp_chunk_cumsum(G, L.g(stage), p.g != nullptr);
    __syncthreads();
    const float G_last = G[kChunk - 1];

    // P = (Q K^T) * exp(G_i - G_j) for j <= i (scale applied at the output)
    {
      float acc[1][4][4];
      zero(acc);
      if (n0 < m0 + 16) warp_mma<1, 4, Stored::kRowMajor, Stored::kTransposed>(acc, q_s, kLdK, k_s, kLdK, m0, n0, 0, K);
      store_decayed_scores(acc, G, L.P(), kLdC, m0, n0);
    }
    // X = diag(beta) (V - diag(exp(G)) K S)
    {
      float acc[1][4][4];
      zero(acc);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(acc, k_s, kLdK, L.S(), kLdV, m0, n0, 0, K);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e);
          const float2 v2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v_s + r * kLdV + c));
          const float decay = __expf(G[r]);
          store_bf16x2(L.X() + r * kLdV + c, beta[r] * (v2.x - decay * acc[0][j][e]),
                       beta[r] * (v2.y - decay * acc[0][j][e + 1]));
        }
    }
    __syncthreads();

    // Delta = T X (T lower triangular), and Delta decayed to the chunk's end
    {
      float acc[1][4][4];
      zero(acc);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(acc, L.wy(stage), kLdC, L.X(), kLdV, m0, n0, 0, m0 + 16);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e);
          const float d = __expf(G_last - G[r]);
          store_bf16x2(L.delta() + r * kLdV + c, acc[0][j][e], acc[0][j][e + 1]);
          store_bf16x2(L.delta_decayed() + r * kLdV + c, d * acc[0][j][e], d * acc[0][j][e + 1]);
        }
    }
    __syncthreads();

    // O = diag(exp(G)) Q S + P Delta, times scale
    {
      float acc[1][4][4];
      zero(acc);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(acc, q_s, kLdK, L.S(), kLdV, m0, n0, 0, K);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] *= __expf(G[m0 + acc_row(0, e)]);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(acc, L.P(), kLdC, L.delta(), kLdV, m0, n0, 0, m0 + 16);
      store_output_tile(acc, o, T, H, V, b, h, t0, v0, m0, n0, scale);
    }
    // S <- exp(G_last) S + K^T (Delta decayed to the end), in registers
    {
      const float decay = __expf(G_last);
      scale_tiles(S, decay);
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(S, k_s, kLdK, L.delta_decayed(), kLdV, s_m0, s_n0,
                                                                       0, kChunk);
    }
    __syncthreads();  // every read of the bf16 copy of S is done
    store_state_copy(S, L.S(), kLdV, s_m0, s_n0);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

template <int K>
void launch(const Problem& p) {
  bf16* wy = static_cast<bf16*>(p.workspace);
  launch_wy_prepare<bf16, bf16, true>(p, wy, "delta_v3_wy_prepare_mma");
  launch_checked(p, "delta_v3_chunked_wy_mma", delta_v3_chunked_wy_mma<K>, dim3(p.V / kBlockV, p.H, p.B), kThreads,
                 Layout<K>::kBytes, wy);
}

void forward(const Problem& p) {
  check_tensor_core_problem(p, "delta_v3_chunked_wy_mma", true, kBlockV);
  check_workspace(p, "delta_v3_chunked_wy_mma", workspace_bytes(p.B, p.T, p.H, p.K, p.V, false));
  if (p.K == 64) launch<64>(p);
  else launch<128>(p);
}

}  // namespace

extern const Version delta_v3 = {
    "delta", 3, "chunked_wy_mma",
    "v2's chunks and WY step on bf16 tensor cores (mma.sync, fp32 accumulators), the state in registers, the next chunk copied in meanwhile.",
    false, true, kTensorCoreShape, 80, workspace_bytes, forward};

}  // namespace minilin
