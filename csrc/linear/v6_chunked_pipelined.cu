// linear v6 (pipelined by one chunk): v5 with the scores of chunk n + 1 formed while the output of chunk n
// is, and the bf16 copy of S double-buffered, so that a chunk needs one block barrier instead of two and
// each warp has four independent products in flight between barriers, because ncu found v5 waiting on the
// latency of one ldmatrix -> mma -> barrier chain per chunk (0.46 issued warps per scheduler), and both
// attempts to split the products among warps made that chain longer.
//
// One block of 16 warps per (batch, head, 64 value columns), sequential over 64-token chunks. Chunk n - 1's
// step left P_n = (Q_n K_n^T) * exp(G_i - G_j) (causal) and V_n decayed to the chunk's end on chip, so
// after the one barrier of chunk n every warp does, for its own tiles,
//   O_n     = diag(exp(G_n)) Q_n S_{n-1} + P_n V_n                  (stored)
//   S_n     = exp(G_n,last) S_{n-1} + K_n^T (V_n decayed)           (registers; bf16 copy to the other buffer)
//   P_{n+1}, V_{n+1} decayed                                        (to the other buffers)
// None of these reads what another warp writes in the same step: the products only meet at the barrier.
// Chunks are three stages deep: chunk n is read (Q, K, V), chunk n + 1 is read (Q, K, V, g), chunk n + 2
// is landing.
#include "chunk_mma_wide.cuh"

namespace minilin {
namespace linear_pipelined {

using linear_wide::bf16;
using linear_wide::kBlockV;
using linear_wide::kLdC;
using linear_wide::kLdV;
using linear_wide::kThreads;
using linear_wide::kWarps;

constexpr int kStages = 3;

template <int K>
struct Layout {
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes = linear_wide::Layout<K>::kStageBytes;  // q, k, v, g of one chunk
  static constexpr size_t kBytes = kStages * kStageBytes
                                   + 2 * kChunk * kLdC * sizeof(bf16)      // P, two buffers
                                   + 2 * K * kLdV * sizeof(bf16)           // S (bf16 copy), two buffers
                                   + 2 * kChunk * kLdV * sizeof(bf16)      // V decayed to the chunk's end, two
                                   + 2 * kWarps * kChunk * sizeof(float);  // G, one copy per warp, two
  unsigned char* base;
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * kLdK; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * kLdK; }
  __device__ float* g(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ bf16* P(int i) const { return reinterpret_cast<bf16*>(base + kStages * kStageBytes) + i * kChunk * kLdC; }
  __device__ bf16* S(int i) const { return P(2) + i * K * kLdV; }
  __device__ bf16* v_decayed(int i) const { return S(2) + i * kChunk * kLdV; }
  __device__ float* G(int warp, int i) const {
    return reinterpret_cast<float*>(v_decayed(2)) + (i * kWarps + warp) * kChunk;
  }
};

template <int K>
__device__ void load_chunk(const Layout<K>& L, int stage, const Problem& p, int b, int h, int t0, int v0) {
  cp_async_chunk<K, kBlockV>(L.q(stage), L.k(stage), Layout<K>::kLdK, L.v(stage), kLdV, L.g(stage), p, b, h, t0, v0);
}

// This warp's 16 x 16 tiles of two products in one k loop over kSteps steps of 16, so that the tensor cores
// always have a second independent chain:
//   qs += Q S          (A = Q rows m0; B = S columns n0, S row-major [k][n])
//   qk += Q' K'^T      (the next chunk's; only when with_qk: tiles above the diagonal are skipped)
template <int kSteps>
__device__ __forceinline__ void warp_state_read_and_next_scores(float (&qs)[1][2][4], float (&qk)[1][2][4],
                                                                const bf16* Q, const bf16* S, int lds,
                                                                const bf16* Q_next, const bf16* K_next, int ldk,
                                                                int m0, int n0, bool with_qk) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int k0 = 16 * s;
    unsigned a_q[4], b_s[4];
    load_a(a_q, Q, ldk, m0, k0);
    load_b_pair_transposed(b_s, S, lds, k0, n0);
    mma_bf16_schedulable(qs[0][0], a_q, b_s[0], b_s[1]);
    mma_bf16_schedulable(qs[0][1], a_q, b_s[2], b_s[3]);
    if (with_qk) {
      unsigned a_next[4], b_k[4];
      load_a(a_next, Q_next, ldk, m0, k0);
      load_b_pair(b_k, K_next, ldk, k0, n0);
      mma_bf16_schedulable(qk[0][0], a_next, b_k[0], b_k[1]);
      mma_bf16_schedulable(qk[0][1], a_next, b_k[2], b_k[3]);
    }
  }
}

// G = the chunk-local cumulative gate of the chunk in stage s (this warp's own copy: no barrier).
__device__ __forceinline__ void warp_chunk_cumsum(float* G, const float* g, bool gated) {
  const int lane = threadIdx.x & 31;
  const float2 G2 = chunk_cumsum_64(gated ? g[2 * lane] : 0.0f, gated ? g[2 * lane + 1] : 0.0f);
  G[2 * lane] = G2.x;
  G[2 * lane + 1] = G2.y;
  __syncwarp();
}

// dst[j][c] = exp(G_last - G[j]) v[j][c]: the chunk's values decayed to its end, spread over the block.
__device__ __forceinline__ void decay_values_to_end(bf16* dst, const bf16* v, const float* G) {
  const float G_last = G[kChunk - 1];
  for (int i = threadIdx.x; i < kChunk * kBlockV / 8; i += kThreads) {
    const int j = i / (kBlockV / 8), c = (i % (kBlockV / 8)) * 8;
    float x[8];
    load8(v + j * kLdV + c, x);
    const float d = __expf(G_last - G[j]);
#pragma unroll
    for (int e = 0; e < 8; e += 2) store_bf16x2(dst + j * kLdV + c + e, d * x[e], d * x[e + 1]);
  }
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) linear_chunked_pipelined(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = Layout<K>::kLdK;
  constexpr int kRowSharers = kWarps / (K / 16);            // warps sharing one 16-row tile of S
  constexpr int kStateTiles = (kBlockV / 8) / kRowSharers;  // 8-column tiles of S per warp
  static_assert(kRowSharers >= 1 && kStateTiles % 2 == 0, "K must be 64 or 128");

  const Layout<K> L{smem};
  const int T = p.T, H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5;
  const int m0 = 16 * (warp >> 2), n0 = 16 * (warp & 3);  // this warp's 16 x 16 tile of P and of O
  const int s_m0 = 16 * (warp / kRowSharers), s_n0 = 8 * kStateTiles * (warp % kRowSharers);
  const bool below_diagonal = n0 < m0 + 16;
  const float scale = p.scale;
  const bool gated = p.g != nullptr;

  // ---- prologue: chunks 0 and 1 in flight; S_{-1} = h0; P_0 and V_0 decayed
  load_chunk<K>(L, 0, p, b, h, 0, v0);
  cp_async_commit();
  if (chunks > 1) load_chunk<K>(L, 1, p, b, h, kChunk, v0);
  cp_async_commit();

  float S[1][kStateTiles][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(0), kLdV);

  cp_async_wait<1>();
  __syncthreads();  // chunk 0 is on chip
  {
    float* G0 = L.G(warp, 0);
    warp_chunk_cumsum(G0, L.g(0), gated);
    float QK[1][2][4];
    zero(QK);
    if (below_diagonal)
      warp_mma_unrolled<1, 2, Stored::kRowMajor, Stored::kTransposed, K / 16>(QK, L.q(0), kLdK, L.k(0), kLdK, m0, n0, 0);
    store_decayed_scores(QK, G0, L.P(0), kLdC, m0, n0);
    decay_values_to_end(L.v_decayed(0), L.v(0), G0);
  }

  bf16* o = static_cast<bf16*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int cur = n & 1, next = cur ^ 1, stage = n % kStages, stage_next = (n + 1) % kStages;
    const bool has_next = n + 1 < chunks;
    cp_async_wait<0>();
    __syncthreads();  // chunk n + 1, P_n, V_n decayed and the copy of S_{n-1} are on chip; chunk n - 1's stage is free
    if (n + 2 < chunks) load_chunk<K>(L, (n + 2) % kStages, p, b, h, (n + 2) * kChunk, v0);
    cp_async_commit();

    const float* G = L.G(warp, cur);
    float* G_next = L.G(warp, next);
    if (has_next) warp_chunk_cumsum(G_next, L.g(stage_next), gated);

    // R = Q_n S_{n-1} beside the next chunk's scores Q_{n+1} K_{n+1}^T
    float R[1][2][4], QK[1][2][4];
    zero(R);
    zero(QK);
    warp_state_read_and_next_scores<K / 16>(R, QK, L.q(stage), L.S(cur), kLdV, L.q(stage_next), L.k(stage_next), kLdK,
                                            m0, n0, has_next && below_diagonal);

    // S_n = exp(G_last) S_{n-1} + K_n^T (V_n decayed), its copy into the other buffer
    scale_tiles(S, __expf(G[kChunk - 1]));
    warp_mma_unrolled<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor, kChunk / 16>(
        S, L.k(stage), kLdK, L.v_decayed(cur), kLdV, s_m0, s_n0, 0);
    store_state_copy(S, L.S(next), kLdV, s_m0, s_n0);

    // O_n = diag(exp(G)) R + P_n V_n
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) R[0][j][e] *= __expf(G[m0 + acc_row(0, e)]);
    warp_mma_unrolled<1, 2, Stored::kRowMajor, Stored::kRowMajor, kChunk / 16>(R, L.P(cur), kLdC, L.v(stage), kLdV, m0,
                                                                               n0, 0, (m0 >> 4) + 1);
    store_output_tile(R, o, T, H, V, b, h, n * kChunk, v0, m0, n0, scale);

    if (has_next) {
      store_decayed_scores(QK, G_next, L.P(next), kLdC, m0, n0);
      decay_values_to_end(L.v_decayed(next), L.v(stage_next), G_next);
    }
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

}  // namespace linear_pipelined

namespace {

void forward(const Problem& p) {
  const std::string name = "linear_v6_chunked_pipelined";
  linear_wide::check_problem(p, name);
  using namespace linear_pipelined;
  auto kernel = p.K == 64 ? linear_chunked_pipelined<64> : linear_chunked_pipelined<128>;
  const size_t smem = p.K == 64 ? Layout<64>::kBytes : Layout<128>::kBytes;
  allow_shared_memory(kernel, smem, name.c_str());
  const dim3 grid(p.V / kBlockV, p.H, p.B);
  kernel<<<grid, kThreads, smem, stream_of(p)>>>(p);
  check_launch(name.c_str(), p);
}

}  // namespace

extern const Version linear_v6 = {
    "linear", 6, "chunked_pipelined",
    "v5 pipelined by one chunk (the next chunk's scores formed beside this chunk's output, S's copy double-buffered): one barrier per chunk instead of two, four independent products per warp between barriers.",
    false, true, 80, nullptr, forward};

}  // namespace minilin
