// linear_bwd v2 (chunked, tensor cores): the backward of linear v3's chunk algorithm in two launches, the two
// passes over the chunk boundaries side by side and then the chunks in parallel, every product on bf16 tensor
// cores (mma.sync, fp32 accumulators), because v1's token loops are latency-bound (26 ms where the forward takes 0.4).
//
// Per head, with chunks of 64 tokens, G the chunk-local cumulative log-gate (G_L its last entry), q~ = scale q,
// S_c the state after chunk c (S_{-1} = h0) and D_c = dL/dS_c its adjoint (D of the last chunk = dht):
//   1. states   (forward):  S_c     = exp(G_L) S_{c-1} + K^T diag(exp(G_L - G)) V      stores S_{c-1} for chunk c
//   2. adjoints (reverse):  D_{c-1} = exp(G_L) D_c     + Q~^T diag(exp(G)) dO         stores D_c for chunk c
//      one kernel, run forwards over (K, V) and backwards over (Q~, dO): the adjoint recursion is the state
//      recursion run the other way. Pass 2 ends with dh0.
//   3. gradients, one block per chunk, with M_ij = exp(G_i - G_j) for j <= i (0 above the diagonal),
//      P = (Q~ K^T) * M and dP = scale (dO V^T) * M:
//        dq = scale diag(exp(G)) dO S_{c-1}^T + dP K
//        dk = diag(exp(G_L - G)) V D_c^T      + dP^T Q
//        dv = diag(exp(G_L - G)) K D_c        + P^T dO
//      the sums over value columns (dO S^T, V D^T, dO V^T) accumulated in registers over the value blocks of 64.
//      dg, chunk by chunk: inside chunk c, o and S_c depend on the gates through the local G only, so
//      dL/dG_s = q_s . dq_s - k_s . dk_s, plus at the chunk's last token the terms that hold exp(G_L):
//      exp(G_L) <D_c, S_{c-1}> + sum_j k_j . dk_j^inter (dk^inter = diag(exp(G_L - G)) V D_c^T, the first term
//      of dk), and G_s = g_t0 + ... + g_s gives
//        dg_t = sum_{t <= s < t0 + 64} (q_s . dq_s - k_s . dk_s) + exp(G_L) <D_c, S_{c-1}> + sum_j k_j . dk_j^inter
//      v1's form (one reverse sum over the whole sequence, with <dht, S_T>) is the same number, but in bf16 its
//      terms carry the rounding of S and D across every chunk without the cancellation this form keeps: emulated
//      in float64 with v2's roundings (tools/emulate_bf16_backward.py, T = 1000), 2.2e-2 relative error against
//      1.7e-3 for this one.
// The states and adjoints are recomputed here rather than saved by the forward (which keeps only its final
// state): pass 1 costs about a forward's state update, and the forward stays the same kernel for inference.
// They are stored in bf16 (the products read them in bf16 anyway): 2 B H ceil(T / 64) K V bf16 of workspace.
#include "../common/chunk_backward.cuh"

namespace minilin {
namespace {

using namespace chunk_bwd;

// One bf16 [K, V] matrix per (batch, head, chunk), for the states and again for the adjoints.
size_t states_bytes(int B, int T, int H, int K, int V) {
  return static_cast<size_t>(B) * H * chunk_count(T) * K * V * sizeof(bf16);
}
size_t workspace_bytes(int B, int T, int H, int K, int V, bool) { return 2 * states_bytes(B, T, H, K, V); }

// ---- passes 1 and 2: the state recursion over chunk boundaries, forwards or backwards ----------------------
// One block of 8 warps per (batch, head, 64 value columns), the running matrix R (S or D) in fp32 registers, split
// as linear v3 splits S; per chunk (X = K, Y = V forwards; X = Q, Y = dO backwards, w the per-token weights):
//     store R (bf16, for pass 3);   R <- exp(G_L) R + X^T diag(w) Y,   w = exp(G_L - G) or scale exp(G)
template <int K>
struct PassLayout {
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes = (kChunk * kLdK + kChunk * kLdV) * sizeof(bf16) + kChunk * sizeof(float);
  static constexpr size_t kBytes = 2 * kStageBytes + kChunk * kLdV * sizeof(bf16)  // w Y
                                   + K * kLdV * sizeof(bf16)                       // R's bf16 copy
                                   + kChunk * sizeof(float);                       // G
  unsigned char* base;
  __device__ bf16* x(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* y(int s) const { return x(s) + kChunk * kLdK; }
  __device__ float* g(int s) const { return reinterpret_cast<float*>(y(s) + kChunk * kLdV); }
  __device__ bf16* y_weighted() const { return reinterpret_cast<bf16*>(base + 2 * kStageBytes); }
  __device__ bf16* R() const { return y_weighted() + kChunk * kLdV; }
  __device__ float* G() const { return reinterpret_cast<float*>(R() + K * kLdV); }
};

template <int K, bool kReverse>
__device__ __forceinline__ void load_pass_chunk(const PassLayout<K>& L, int stage, const BackwardProblem& p, int b, int h,
                                                int c, int v0) {
  const int t0 = c * kChunk;
  cp_async_token_rows<K>(L.x(stage), PassLayout<K>::kLdK, kReverse ? p.q : p.k, p, b, h, t0, K, 0);
  cp_async_token_rows<kBlockV>(L.y(stage), kLdV, kReverse ? p.do_ : p.v, p, b, h, t0, p.V, v0);
  cp_async_token_scalars(L.g(stage), p.g, p, b, h, t0);
}

template <int K, bool kReverse>
__device__ __forceinline__ void run_pass(const BackwardProblem& p, bf16* stored, unsigned char* smem, int v0) {
  constexpr int kLdK = PassLayout<K>::kLdK;
  constexpr int kRowSharers = chunk_bwd::kRowSharers<K>, kStateTiles = chunk_bwd::kStateTiles<K>;
  static_assert(kRowSharers >= 1 && kStateTiles % 2 == 0, "K must be 64 or 128");

  const PassLayout<K> L{smem};
  const int h = blockIdx.y, b = blockIdx.z, chunks = chunk_count(p.T);
  const int warp = threadIdx.x >> 5;
  const int s_m0 = 16 * (warp / kRowSharers), s_n0 = 8 * kStateTiles * (warp % kRowSharers);
  const long long head = (static_cast<long long>(b) * p.H + h) * K * p.V;

  load_pass_chunk<K, kReverse>(L, 0, p, b, h, kReverse ? chunks - 1 : 0, v0);
  cp_async_commit();
  float R[1][kStateTiles][4];
  load_state(R, kReverse ? p.dht : p.h0, head, p.V, v0, s_m0, s_n0, L.R(), kLdV);

  for (int n = 0; n < chunks; ++n) {
    const int stage = n & 1, c = kReverse ? chunks - 1 - n : n;
    cp_async_wait<0>();
    __syncthreads();  // chunk c and R's copy are on chip; every read of the other stage is done
    if (n + 1 < chunks) load_pass_chunk<K, kReverse>(L, stage ^ 1, p, b, h, kReverse ? c - 1 : c + 1, v0);
    cp_async_commit();

    float* G = L.G();
    if (warp == 0) warp_chunk_cumsum(G, L.g(stage), p.g != nullptr);
    // R (S_{c-1} forwards, D_c backwards) for pass 3
    copy_out_rows(stored + ((static_cast<long long>(b) * p.H + h) * chunks + c) * K * p.V + v0, p.V, L.R(), K);
    __syncthreads();
    const float G_last = G[kChunk - 1];

    const bf16* y = L.y(stage);
    for (int i = threadIdx.x; i < kChunk * kBlockV / 8; i += kThreads) {
      const int j = i / (kBlockV / 8), col = (i % (kBlockV / 8)) * 8;
      float x[8];
      load8(y + j * kLdV + col, x);
      const float w = kReverse ? p.scale * __expf(G[j]) : __expf(G_last - G[j]);
#pragma unroll
      for (int e = 0; e < 8; e += 2) store_bf16x2(L.y_weighted() + j * kLdV + col + e, w * x[e], w * x[e + 1]);
    }
    __syncthreads();  // w Y is complete; every read of R's copy is done

    scale_tiles(R, __expf(G_last));
    warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(R, L.x(stage), kLdK, L.y_weighted(), kLdV, s_m0,
                                                                     s_n0, 0, kChunk);
    store_state_copy(R, L.R(), kLdV, s_m0, s_n0);
  }
  if (kReverse && p.dh0) store_state(R, p.dh0, head, p.V, v0, s_m0, s_n0);
}

// Both passes in one launch, since neither needs the other: blocks x < V / 64 run the states, the rest the
// adjoints, so the two chains of chunks share the card (two blocks per SM) instead of running one after the other.
template <int K>
__global__ void __launch_bounds__(kThreads, 2) linear_bwd_v2_passes(const BackwardProblem p, bf16* states,
                                                                     bf16* adjoints) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int value_blocks = p.V / kBlockV;
  if (static_cast<int>(blockIdx.x) < value_blocks) run_pass<K, false>(p, states, smem, blockIdx.x * kBlockV);
  else run_pass<K, true>(p, adjoints, smem, (blockIdx.x - value_blocks) * kBlockV);
}

// ---- pass 3: the gradients, one block of 8 warps per (chunk, head, batch) ----------------------------------
// One value block on chip at a time, so that two blocks fit an SM (110 KB each at K = 128): one block's loads
// then overlap the other's products. (Two value blocks in flight, the next copied in while this one computes, at
// one block per SM, measured 11-27% slower at each of the seven shapes timed on the H200.)
template <int K>
struct GradLayout {
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes = 2 * kChunk * kLdV * sizeof(bf16)  // V, dO (one value block)
                                        + 2 * K * kLdV * sizeof(bf16);    // S_{c-1}, D_c (one value block)
  static constexpr size_t kBytes = 2 * kChunk * kLdK * sizeof(bf16)    // Q, K
                                   + 2 * kChunk * kLdC * sizeof(bf16)  // P, dP
                                   + kStageBytes
                                   + 2 * kChunk * sizeof(float)        // g, G
                                   + GateScratch<>::kBytes;            // dg's terms
  unsigned char* base;
  __device__ bf16* q() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* k() const { return q() + kChunk * kLdK; }
  __device__ bf16* P() const { return k() + kChunk * kLdK; }
  __device__ bf16* dP() const { return P() + kChunk * kLdC; }
  __device__ bf16* v() const { return dP() + kChunk * kLdC; }
  __device__ bf16* dO() const { return v() + kChunk * kLdV; }
  __device__ bf16* S() const { return dO() + kChunk * kLdV; }
  __device__ bf16* D() const { return S() + K * kLdV; }
  __device__ float* g() const { return reinterpret_cast<float*>(D() + K * kLdV); }
  __device__ float* G() const { return g() + kChunk; }
  __device__ GateScratch<> gate_scratch() const { return {G() + kChunk, G() + 3 * kChunk}; }
};

template <int K>
__global__ void __launch_bounds__(kThreads, 2) linear_bwd_v2_gradients(const BackwardProblem p, const bf16* states,
                                                                        const bf16* adjoints) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = GradLayout<K>::kLdK;
  constexpr int kKeyTiles = K / 16;  // 8-column tiles of a warp's half of a 64 x K gradient
  const GradLayout<K> L{smem};
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t0 = c * kChunk;
  const int warp = threadIdx.x >> 5;
  const int m0 = 16 * (warp >> 1);      // this warp's 16 rows of every product
  const int n0 = 32 * (warp & 1);       // ... its 32 columns of the 64 x 64 ones (P, dP, dv)
  const int k0 = (K / 2) * (warp & 1);  // ... its K / 2 columns of the 64 x K ones (dq, dk)
  const bool below = n0 < m0 + 16;      // its 64 x 64 tile reaches the causal triangle

  cp_async_token_rows<K>(L.q(), kLdK, p.q, p, b, h, t0, K, 0);
  cp_async_token_rows<K>(L.k(), kLdK, p.k, p, b, h, t0, K, 0);
  cp_async_token_scalars(L.g(), p.g, p, b, h, t0);
  load_value_block<K>(L, p, states, adjoints, b, h, c, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  float* G = L.G();
  if (warp == 0) warp_chunk_cumsum(G, L.g(), p.g != nullptr);
  __syncthreads();
  const float G_last = G[kChunk - 1];
  const auto decay_to_end = [&](int r) { return __expf(G_last - G[r]); };

  {  // P = scale (Q K^T) * M
    float acc[1][4][4];
    zero(acc);
    if (below) warp_mma<1, 4, Stored::kRowMajor, Stored::kTransposed>(acc, L.q(), kLdK, L.k(), kLdK, m0, n0, 0, K);
    scale_tiles(acc, p.scale);
    store_decayed_scores(acc, G, L.P(), kLdC, m0, n0);
  }
  __syncthreads();

  // Over the value blocks: dA = dO V^T, dq = dO S_{c-1}^T, dk = V D_c^T (all summed over value columns) and dv.
  float dA[1][4][4], dq[1][kKeyTiles][4], dk[1][kKeyTiles][4];
  zero(dA);
  zero(dq);
  zero(dk);
  float state_dot = 0.0f;  // this thread's part of <D_c, S_{c-1}>
  for (int v0 = 0; v0 < p.V; v0 += kBlockV) {
    if (v0 > 0) {
      __syncthreads();  // every read of the previous value block is done
      load_value_block<K>(L, p, states, adjoints, b, h, c, v0);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    }
    if (p.g)  // <D_c, S_{c-1}> over this value block, for dg
      for (int i = threadIdx.x; i < K * kBlockV / 8; i += kThreads) {
        const int r = i / (kBlockV / 8), col = (i % (kBlockV / 8)) * 8;
        float x[8], y[8];
        load8(L.S() + r * kLdV + col, x);
        load8(L.D() + r * kLdV + col, y);
#pragma unroll
        for (int e = 0; e < 8; ++e) state_dot = fmaf(x[e], y[e], state_dot);
      }
    if (below) warp_mma<1, 4, Stored::kRowMajor, Stored::kTransposed>(dA, L.dO(), kLdV, L.v(), kLdV, m0, n0, 0, kBlockV);
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(dq, L.dO(), kLdV, L.S(), kLdV, m0, k0, 0, kBlockV);
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(dk, L.v(), kLdV, L.D(), kLdV, m0, k0, 0, kBlockV);
    float dv[1][4][4];  // diag(exp(G_L - G)) K D_c + P^T dO, the latter over tokens i >= j (row tiles m0 on)
    zero(dv);
    warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(dv, L.k(), kLdK, L.D(), kLdV, m0, n0, 0, K);
    scale_rows(dv, m0, decay_to_end);
    warp_mma<1, 4, Stored::kTransposed, Stored::kRowMajor>(dv, L.P(), kLdC, L.dO(), kLdV, m0, n0, m0, kChunk);
    store_output_tile(dv, static_cast<bf16*>(p.dv), p.T, p.H, p.V, b, h, t0, v0, m0, n0, 1.0f);
  }

  {  // dP = scale dA * M
    scale_tiles(dA, p.scale);
    store_decayed_scores(dA, G, L.dP(), kLdC, m0, n0);
  }
  __syncthreads();
  // dq = scale diag(exp(G)) dO S_{c-1}^T + dP K   (tokens j <= i: row tiles up to m0)
  scale_rows(dq, m0, [&](int r) { return p.scale * __expf(G[r]); });
  warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kRowMajor>(dq, L.dP(), kLdC, L.k(), kLdK, m0, k0, 0, m0 + 16);
  store_output_tile(dq, static_cast<bf16*>(p.dq), p.T, p.H, K, b, h, t0, 0, m0, k0, 1.0f);
  // dk = diag(exp(G_L - G)) V D_c^T + dP^T Q    (tokens i >= j)
  scale_rows(dk, m0, decay_to_end);
  const float k_dk_inter = p.g ? tile_dot(dk, L.k(), kLdK, m0, k0) : 0.0f;  // this thread's part of sum_j k_j . dk_j^inter
  warp_mma<1, kKeyTiles, Stored::kTransposed, Stored::kRowMajor>(dk, L.dP(), kLdC, L.q(), kLdK, m0, k0, m0, kChunk);
  store_output_tile(dk, static_cast<bf16*>(p.dk), p.T, p.H, K, b, h, t0, 0, m0, k0, 1.0f);
  if (p.g) {
    const float2 q_dq = row_dots(dq, L.q(), kLdK, m0, k0), k_dk = row_dots(dk, L.k(), kLdK, m0, k0);
    store_gate_gradient(L.gate_scratch(), p, make_float2(q_dq.x - k_dk.x, q_dq.y - k_dk.y),
                        __expf(G_last) * state_dot + k_dk_inter, b, h, t0, m0);
  }
}

template <int K>
void launch(const BackwardProblem& p, bf16* states, bf16* adjoints) {
  launch_checked(p, "linear_bwd_v2_passes", linear_bwd_v2_passes<K>, dim3(2 * (p.V / kBlockV), p.H, p.B), kThreads,
                 PassLayout<K>::kBytes, states, adjoints);
  launch_checked(p, "linear_bwd_v2_gradients", linear_bwd_v2_gradients<K>, dim3(chunk_count(p.T), p.H, p.B), kThreads,
                 GradLayout<K>::kBytes, static_cast<const bf16*>(states), static_cast<const bf16*>(adjoints));
}

void backward(const BackwardProblem& p) {
  constexpr const char* name = "linear_bwd_v2_chunked_mma";
  check_tensor_core_backward(p, name, false, workspace_bytes(p.B, p.T, p.H, p.K, p.V, false), kBlockV);
  bf16* states = static_cast<bf16*>(p.workspace);
  bf16* adjoints = states + states_bytes(p.B, p.T, p.H, p.K, p.V) / sizeof(bf16);
  if (p.K == 64) launch<64>(p, states, adjoints);
  else launch<128>(p, states, adjoints);
}

}  // namespace

extern const Version linear_bwd_v2 = {
    "linear_bwd", 2, "chunked_mma",
    "Chunks on bf16 tensor cores: the chunk-boundary states and their adjoints by one pass each way (one kernel, "
    "run both ways), then every chunk's gradients in parallel as matrix products.",
    false, true, kTensorCoreShape, 80, workspace_bytes, nullptr, 0, nullptr, backward};

}  // namespace minilin
