// gla_bwd v2 (chunked, tensor cores): linear_bwd v2's three steps with a decay per key channel, the chunk-local
// operands taken from gla v4's prepare, because v1's token loops are latency-bound (28 ms at B = 4, T = 8192,
// H = 16, K = V = 128, where the forward takes 0.9).
//
// Per head, with chunks of 64 tokens, G [64, K] the chunk-local cumulative log-gate (G_L its last row, per key
// channel), S_c the state after chunk c (S_{-1} = h0), D_c = dL/dS_c its adjoint (D of the last chunk = dht), and
// gla v4's tiles of each chunk (gla/prepared_tiles.cuh): Qr = q exp(G), Ke = k exp(G_L - G), d = exp(G_L), and
// P_ij = sum_f q_if k_jf exp(G_if - G_jf) for j <= i (0 above), so that the forward's o = scale (Qr S_{c-1} + P V):
//   0. prepare  (gla v4's kernel, parallel over chunks): Qr, Ke, P, d into the workspace.
//   1. states   (forward):  S_c     = diag(d) S_{c-1} + Ke^T V          stores S_{c-1} for chunk c
//   2. adjoints (reverse):  D_{c-1} = diag(d) D_c     + scale Qr^T dO   stores D_c for chunk c
//      one kernel, both chains side by side (linear_bwd v2's passes with the decay on the state's rows); pass 2
//      ends with dh0.
//   3. gradients, one block per chunk, with dA = scale (dO V^T) for j <= i (0 above):
//        dv_j = Ke_j D_c + scale sum_{i >= j} P_ij dO_i
//        dq_i = scale exp(G_i) * (dO_i S_{c-1}^T) + sum_{j <= i} dA_ij k_j * exp(G_i - G_j)
//        dk_j = exp(G_L - G_j) * (v_j D_c^T)      + sum_{i >= j} dA_ij q_i * exp(G_i - G_j)
//      (* elementwise over key channels). The sums over j and i hold the per-channel decay between two tokens,
//      which is no matrix product as it stands; split into sub-chunks of 16 tokens (gla v2's), a pair of tokens in
//      different sub-chunks factors through the boundary r = 16 a - 1 between them (the last token of sub-chunk
//      a - 1), exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j) with both exponents <= 0 (i > r >= j), so for
//      the rows i of sub-chunk a and the columns j of sub-chunk a - 1:
//        dq_i += exp(G_i - G_r) * sum_{j <= r} dA_ij Kref_a,j,       Kref_a,j = k_j exp(G_r - G_j),  j < 16 a
//        dk_j += exp(G_r - G_j) * sum_{i > r}  dA_ij Qref_a-1,i,     Qref_a-1,i = q_i exp(G_i - G_r), i >= 16 a
//      two tensor-core products per warp; the 16 x 16 blocks on the diagonal (i, j in one sub-chunk) term by
//      term on CUDA cores, one exponential per term and channel, no exponent > 0 anywhere.
//      dg, chunk by chunk and channel by channel (linear_bwd v2's derivation with a G per channel f):
//        dg_t[f] = sum_{t <= s < t0 + 64} (q_s[f] dq_s[f] - k_s[f] dk_s[f])
//                  + exp(G_L[f]) <D_c[f, :], S_{c-1}[f, :]> + sum_j k_j[f] dk_j^inter[f]
//      (dk^inter the first term of dk), the form whose bf16 rounding tools/emulate_bf16_backward.py --mixer gla
//      checked (1.7e-3 against 2.1e-2 for one reverse sum over the sequence).
// The states and adjoints are recomputed, as linear_bwd v2 says why, and stored in bf16.
// Workspace: gla v4's tiles ((2 K + 64) bf16 per token and head, K fp32 per chunk and head), then the states and
// the adjoints (2 B H ceil(T / 64) K V bf16).
// bf16 inputs only, K = 64 or 128, V a multiple of 64.
// Measured on an H100 (forward gla v5 + this backward, B = 4, H = 16, K = V = 128): 4.76 ms at T = 8192 against
// v1's 27.8 and FLA chunk_gla's 7.31 (0.65x); 0.56-0.69x FLA's at the other long shapes timed (csrc/NOTES.md).
#include "../common/chunk_backward.cuh"
#include "../common/sequences.cuh"
#include "../gla/prepared_tiles.cuh"

namespace minilin {
namespace {

using namespace chunk_bwd;
using gla_prepared::PreparedTiles;
using gla_prepared::prepared_tiles;

size_t prepared_section(int B, int T, int H, int K) { return gla_prepared::prepared_bytes(B, T, H, K, false); }
// One bf16 [K, V] matrix per (batch, head, chunk), for the states and again for the adjoints.
size_t states_bytes(int B, int T, int H, int K, int V) {
  return workspace_aligned(static_cast<size_t>(B) * H * chunk_count(T) * K * V * sizeof(bf16));
}
size_t workspace_bytes(int B, int T, int H, int K, int V, bool) {
  if (B <= 0 || T <= 0 || H <= 0 || K <= 0 || V <= 0) return 0;
  return prepared_section(B, T, H, K) + 2 * states_bytes(B, T, H, K, V);
}

// Chunk c of head (b, h): its prepared tiles.
template <int K>
__device__ __forceinline__ PreparedTiles chunk_tiles(const BackwardProblem& p, int b, int h, int c) {
  return prepared_tiles<K>(p.workspace, chunk_rows(p.B, p.T, false), p.H, h,
                           static_cast<long long>(b) * chunk_count(p.T) + c);
}

// ---- passes 1 and 2: the state recursion over chunk boundaries, forwards or backwards ----------------------
// One block of 8 warps per (batch, head, 64 value columns), the running matrix R (S or D) in fp32 registers, split
// as linear_bwd v2 splits it; per chunk (X = Ke, Y = V forwards; X = Qr, Y = dO and a factor scale backwards):
//     store R (bf16, for pass 3);   R <- diag(d) R + w X^T Y
template <int K>
struct PassLayout {
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes = (kChunk * kLdK + kChunk * kLdV) * sizeof(bf16) + K * sizeof(float);
  static constexpr size_t kBytes = 2 * kStageBytes + K * kLdV * sizeof(bf16);  // + R's bf16 copy
  unsigned char* base;
  __device__ bf16* x(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* y(int s) const { return x(s) + kChunk * kLdK; }
  __device__ float* d(int s) const { return reinterpret_cast<float*>(y(s) + kChunk * kLdV); }
  __device__ bf16* R() const { return reinterpret_cast<bf16*>(base + 2 * kStageBytes); }
};

template <int K, bool kReverse>
__device__ __forceinline__ void load_pass_chunk(const PassLayout<K>& L, int stage, const BackwardProblem& p, int b, int h,
                                                int c, int v0) {
  const PreparedTiles tiles = chunk_tiles<K>(p, b, h, c);
  cp_async_tile<kThreads, kChunk, K>(L.x(stage), PassLayout<K>::kLdK, kReverse ? tiles.qr : tiles.ke, K);
  cp_async_token_rows<kBlockV>(L.y(stage), kLdV, kReverse ? p.do_ : p.v, p, b, h, c * kChunk, p.V, v0);
  cp_async_tile<kThreads, 1, K>(L.d(stage), K, tiles.decay, K);
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

    // R (S_{c-1} forwards, D_c backwards) for pass 3
    copy_out_rows(stored + ((static_cast<long long>(b) * p.H + h) * chunks + c) * K * p.V + v0, p.V, L.R(), K);
    const float* d = L.d(stage);
    if (kReverse) {  // the scale on the product alone: R <- diag(d) R + scale Qr^T dO
      float acc[1][kStateTiles][4];
      zero(acc);
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(acc, L.x(stage), kLdK, L.y(stage), kLdV, s_m0,
                                                                       s_n0, 0, kChunk);
      scale_rows(R, s_m0, [&](int r) { return d[r]; });
#pragma unroll
      for (int j = 0; j < kStateTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) R[0][j][e] = fmaf(p.scale, acc[0][j][e], R[0][j][e]);
    } else {
      scale_rows(R, s_m0, [&](int r) { return d[r]; });
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(R, L.x(stage), kLdK, L.y(stage), kLdV, s_m0,
                                                                       s_n0, 0, kChunk);
    }
    __syncthreads();  // every read of R's copy is done
    store_state_copy(R, L.R(), kLdV, s_m0, s_n0);
  }
  if (kReverse && p.dh0) store_state(R, p.dh0, head, p.V, v0, s_m0, s_n0);
}

// Both passes in one launch (linear_bwd v2's reason): blocks x < V / 64 run the states, the rest the adjoints.
template <int K>
__global__ void __launch_bounds__(kThreads, 2) gla_bwd_v2_passes(const BackwardProblem p, bf16* states,
                                                                  bf16* adjoints) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int value_blocks = p.V / kBlockV;
  if (static_cast<int>(blockIdx.x) < value_blocks) run_pass<K, false>(p, states, smem, blockIdx.x * kBlockV);
  else run_pass<K, true>(p, adjoints, smem, (blockIdx.x - value_blocks) * kBlockV);
}

// ---- pass 3: the gradients, one block of 8 warps per (chunk, head, batch) ----------------------------------
// Warp w: rows m0 = 16 (w / 2) (sub-chunk a = w / 2) of every product, of the 64 x 64 ones (dA, dv) the columns
// n0 = 32 (w % 2) .., of the 64 x K ones (dq, dk) the columns k0 = (K / 2) (w % 2) ... The value blocks' tiles
// are dead once their sums are in registers, so the sub-chunk references, and then dg's terms, take their place.
template <int K>
struct GradLayout {
  static constexpr int kLdK = K + 8;
  static constexpr int kLdG = K + 4;  // fp32 rows of g (16-byte rows for cp.async)
  static constexpr int kRefRows = 16 + 32 + 48;  // Kref_1..3 (rows j < 16 a), then Qref_0..2 (rows i >= 16 (a + 1))
  static constexpr size_t kValueBytes = 2 * kChunk * kLdV * sizeof(bf16)  // V, dO (one value block)
                                        + 2 * K * kLdV * sizeof(bf16);    // S_{c-1}, D_c (one value block)
  static constexpr size_t kRefBytes = 2 * kRefRows * kLdK * sizeof(bf16);
  static constexpr size_t kTermBytes = kChunk * kLdG * sizeof(float);
  static constexpr size_t kUnionBytes = kValueBytes > kRefBytes ? kValueBytes : kRefBytes;
  static_assert(kTermBytes <= kUnionBytes, "dg's terms fit where the references were");
  static constexpr size_t kBytes = 3 * kChunk * kLdK * sizeof(bf16)  // q, k, Ke
                                   + kChunk * kLdG * sizeof(float)   // g, then G
                                   + 2 * kChunk * kLdC * sizeof(bf16)  // P, dA
                                   + kUnionBytes
                                   + 5 * K * sizeof(float);  // <D_c, S_{c-1}> per row; sum_j k dk^inter per row group
  unsigned char* base;
  __device__ bf16* q() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* k() const { return q() + kChunk * kLdK; }
  __device__ bf16* Ke() const { return k() + kChunk * kLdK; }
  __device__ float* G() const { return reinterpret_cast<float*>(Ke() + kChunk * kLdK); }
  __device__ bf16* P() const { return reinterpret_cast<bf16*>(G() + kChunk * kLdG); }
  __device__ bf16* dA() const { return P() + kChunk * kLdC; }
  __device__ unsigned char* shared() const { return reinterpret_cast<unsigned char*>(dA() + kChunk * kLdC); }
  __device__ bf16* v() const { return reinterpret_cast<bf16*>(shared()); }
  __device__ bf16* dO() const { return v() + kChunk * kLdV; }
  __device__ bf16* S() const { return dO() + kChunk * kLdV; }
  __device__ bf16* D() const { return S() + K * kLdV; }
  // Kref_a (a = 1, 2, 3): rows j = 0 .. 16 a - 1
  __device__ bf16* Kref(int a) const { return reinterpret_cast<bf16*>(shared()) + (a == 1 ? 0 : a == 2 ? 16 : 48) * kLdK; }
  // Qref_a (a = 0, 1, 2) indexed by token: row i (16 (a + 1) <= i < 64) at Qref_rows(a) + i kLdK (the rows before
  // 16 (a + 1) lie in Kref's space and are never read)
  __device__ bf16* Qref_rows(int a) const {
    return reinterpret_cast<bf16*>(shared()) + (kRefRows + (a == 0 ? 0 : a == 1 ? 48 : 80) - 16 * (a + 1)) * kLdK;
  }
  __device__ float* terms() const { return reinterpret_cast<float*>(shared()); }  // dg's per-token terms [64][kLdG]
  __device__ float* state_dot() const { return reinterpret_cast<float*>(shared() + kUnionBytes); }
  __device__ float* inter_dot(int group) const { return state_dot() + (1 + group) * K; }
};

template <int K>
__global__ void __launch_bounds__(kThreads, 1) gla_bwd_v2_gradients(const BackwardProblem p, const bf16* states,
                                                                     const bf16* adjoints) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = GradLayout<K>::kLdK, kLdG = GradLayout<K>::kLdG;
  constexpr int kKeyTiles = K / 16;              // 8-column tiles of a warp's half of a 64 x K gradient
  const GradLayout<K> L{smem};
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t0 = c * kChunk;
  const int warp = threadIdx.x >> 5;
  const int a = warp >> 1;              // this warp's sub-chunk
  const int m0 = kSub * a;              // its 16 rows of every product
  const int n0 = 32 * (warp & 1);       // its 32 columns of the 64 x 64 ones (dA, dv)
  const int k0 = (K / 2) * (warp & 1);  // its K / 2 columns of the 64 x K ones (dq, dk)
  const bool below = n0 < m0 + 16;      // its 64 x 64 tile reaches the causal triangle
  const PreparedTiles tiles = chunk_tiles<K>(p, b, h, c);

  cp_async_token_rows<K>(L.q(), kLdK, p.q, p, b, h, t0, K, 0);
  cp_async_token_rows<K>(L.k(), kLdK, p.k, p, b, h, t0, K, 0);
  cp_async_tile<kThreads, kChunk, K>(L.G(), kLdG, p.g + token_index(p, b, t0, h) * K, static_cast<long long>(p.H) * K,
                                     min(kChunk, p.T - t0));
  cp_async_tile<kThreads, kChunk, K>(L.Ke(), kLdK, tiles.ke, K);
  cp_async_tile<kThreads, kChunk, kChunk>(L.P(), kLdC, tiles.scores, kChunk);
  load_value_block<K>(L, p, states, adjoints, b, h, c, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  float* G = L.G();
  channel_cumsum<K, kLdG>(G);  // nothing reads G before the barrier after dA's store

  // Over the value blocks: dA = dO V^T, dq = dO S_{c-1}^T, dk = V D_c^T (all summed over value columns), dv, and
  // <D_c, S_{c-1}> per key row.
  float dA[1][4][4], dq[1][kKeyTiles][4], dk[1][kKeyTiles][4];
  zero(dA);
  zero(dq);
  zero(dk);
  float state_dot = 0.0f;
  for (int v0 = 0; v0 < p.V; v0 += kBlockV) {
    if (v0 > 0) {
      __syncthreads();  // every read of the previous value block is done
      load_value_block<K>(L, p, states, adjoints, b, h, c, v0);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    }
    accumulate_row_dot<K>(state_dot, L.S(), L.D());
    if (below) warp_mma<1, 4, Stored::kRowMajor, Stored::kTransposed>(dA, L.dO(), kLdV, L.v(), kLdV, m0, n0, 0, kBlockV);
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(dq, L.dO(), kLdV, L.S(), kLdV, m0, k0, 0, kBlockV);
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(dk, L.v(), kLdV, L.D(), kLdV, m0, k0, 0, kBlockV);
    float dv[1][4][4];  // scale P^T dO over tokens i >= j (row tiles m0 on), + Ke D_c
    zero(dv);
    warp_mma<1, 4, Stored::kTransposed, Stored::kRowMajor>(dv, L.P(), kLdC, L.dO(), kLdV, m0, n0, m0, kChunk);
    scale_tiles(dv, p.scale);
    warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(dv, L.Ke(), kLdK, L.D(), kLdV, m0, n0, 0, K);
    store_output_tile(dv, static_cast<bf16*>(p.dv), p.T, p.H, p.V, b, h, t0, v0, m0, n0, 1.0f);
  }
  store_row_dot<K>(state_dot, L.state_dot());
  store_lower_scores<false>(dA, p.scale, L.dA(), m0, n0);  // dA = scale dO V^T for j <= i, 0 above
  __syncthreads();  // dA is complete; every read of the value blocks is done (their space takes the references)

  // The sub-chunk references Kref_a (j < 16 a) and Qref_a (i >= 16 (a + 1)), every exponent <= 0
  store_sub_chunk_references<K>(L, G, [](int, int, int, float2) {});

  // The inter-chunk terms: dq = scale exp(G) * (dO S^T); dk = exp(G_L - G) * (V D^T), whose sum_j k_j dk_j^inter
  // per key channel dg's last token needs (this warp's column sums, then the 8 row lanes'; by row group)
  scale_decayed<kKeyTiles, kLdG>(dq, G, m0, k0, -1, 1.0f, p.scale);
  scale_decayed<kKeyTiles, kLdG>(dk, G, m0, k0, kChunk - 1, -1.0f, 1.0f);
  store_column_dots(dk, L.k(), kLdK, m0, k0, L.inter_dot(a));
  __syncthreads();  // the references are complete

  {  // the pairs in different sub-chunks, through the boundary between them
    float part[1][kKeyTiles][4];
    if (a >= 1) {  // rows of sub-chunk a, columns j < 16 a: r = 16 a - 1
      zero(part);
      warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kRowMajor>(part, L.dA(), kLdC, L.Kref(a), kLdK, m0, k0, 0, m0);
      add_decayed<kKeyTiles, kLdG>(dq, part, G, m0, k0, m0 - 1, 1.0f);
    }
    if (a <= 2) {  // columns of sub-chunk a, rows i >= 16 (a + 1): r = 16 a + 15
      zero(part);
      warp_mma<1, kKeyTiles, Stored::kTransposed, Stored::kRowMajor>(part, L.dA(), kLdC, L.Qref_rows(a), kLdK, m0, k0,
                                                                     m0 + kSub, kChunk);
      add_decayed<kKeyTiles, kLdG>(dk, part, G, m0, k0, m0 + kSub - 1, -1.0f);
    }
  }

  // The pairs inside sub-chunk a, term by term: for this thread's elements (i, f) of the warp's tiles,
  //   dq_i[f] += sum_{m0 <= s <= i} dA_is k_s[f] exp(G_i[f] - G_s[f])
  //   dk_i[f] += sum_{i <= s < m0 + 16} dA_si q_s[f] exp(G_s[f] - G_i[f])
  {
    const int top = m0 + acc_row(0, 0), bottom = m0 + acc_row(0, 2);
    for (int s = m0; s < m0 + kSub; ++s) {
      const float dA_top_s = __bfloat162float(L.dA()[top * kLdC + s]);     // 0 for s > top
      const float dA_bottom_s = __bfloat162float(L.dA()[bottom * kLdC + s]);
      const float dA_s_top = s >= top ? __bfloat162float(L.dA()[s * kLdC + top]) : 0.0f;
      const float dA_s_bottom = s >= bottom ? __bfloat162float(L.dA()[s * kLdC + bottom]) : 0.0f;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
        const int f = k0 + acc_col(j, 0);
        const float2 Gs = *reinterpret_cast<const float2*>(G + s * kLdG + f);
        const float2 ks = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.k() + s * kLdK + f));
        const float2 qs = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.q() + s * kLdK + f));
        // elements e, e + 1 (row `row`, channels f, f + 1): s <= row the dq term (exponent G_row - G_s <= 0),
        // s >= row the dk term (G_s - G_row <= 0)
        const auto add_row = [&](int e, int row, float dA_row_s, float dA_s_row) {
          const float2 Gr = *reinterpret_cast<const float2*>(G + row * kLdG + f);
          if (s <= row) {
            dq[0][j][e] = fmaf(dA_row_s * ks.x, __expf(Gr.x - Gs.x), dq[0][j][e]);
            dq[0][j][e + 1] = fmaf(dA_row_s * ks.y, __expf(Gr.y - Gs.y), dq[0][j][e + 1]);
          }
          if (s >= row) {
            dk[0][j][e] = fmaf(dA_s_row * qs.x, __expf(Gs.x - Gr.x), dk[0][j][e]);
            dk[0][j][e + 1] = fmaf(dA_s_row * qs.y, __expf(Gs.y - Gr.y), dk[0][j][e + 1]);
          }
        };
        add_row(0, top, dA_top_s, dA_s_top);
        add_row(2, bottom, dA_bottom_s, dA_s_bottom);
      }
    }
  }
  store_output_tile(dq, static_cast<bf16*>(p.dq), p.T, p.H, K, b, h, t0, 0, m0, k0, 1.0f);
  store_output_tile(dk, static_cast<bf16*>(p.dk), p.T, p.H, K, b, h, t0, 0, m0, k0, 1.0f);

  __syncthreads();  // every read of the references is done: dg's terms take their space
  store_channel_gate_terms(L, dq, dk, -1.0f, m0, k0);  // q_s . dq_s - k_s . dk_s
  __syncthreads();
  // dg_t[f] = sum_{t <= s < t0 + 64} term_s[f] + exp(G_L[f]) <D_c, S_{c-1}>[f] + sum_j k_j[f] dk_j^inter[f]
  store_channel_gate_gradient<K>(L, p, b, h, t0);
}

template <int K>
void launch(const BackwardProblem& p, bf16* states, bf16* adjoints) {
  launch_checked(p, "gla_bwd_v2_passes", gla_bwd_v2_passes<K>, dim3(2 * (p.V / kBlockV), p.H, p.B), kThreads,
                 PassLayout<K>::kBytes, states, adjoints);
  launch_checked(p, "gla_bwd_v2_gradients", gla_bwd_v2_gradients<K>, dim3(chunk_count(p.T), p.H, p.B), kThreads,
                 GradLayout<K>::kBytes, static_cast<const bf16*>(states), static_cast<const bf16*>(adjoints));
}

void backward(const BackwardProblem& p) {
  constexpr const char* name = "gla_bwd_v2_chunked_mma";
  check_tensor_core_backward(p, name, false, workspace_bytes(p.B, p.T, p.H, p.K, p.V, false), kBlockV);
  require_channel_gate(p, name);
  require(reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0, [] {
    return std::string(name) + ": the workspace must be 256-byte aligned (its sections are)";
  });
  Problem prepare = forward_problem(p);  // gla v4's prepare over the same q, k, g
  prepare.workspace = p.workspace;
  prepare.workspace_size = prepared_section(p.B, p.T, p.H, p.K);
  gla_prepared::launch_prepare(prepare);
  bf16* states = reinterpret_cast<bf16*>(static_cast<unsigned char*>(p.workspace) + prepare.workspace_size);
  bf16* adjoints = states + states_bytes(p.B, p.T, p.H, p.K, p.V) / sizeof(bf16);
  if (p.K == 64) launch<64>(p, states, adjoints);
  else launch<128>(p, states, adjoints);
}

}  // namespace

extern const Version gla_bwd_v2 = {
    "gla_bwd", 2, "chunked_mma",
    "Chunks on bf16 tensor cores from gla v4's prepared tiles: the chunk-boundary states and their adjoints by one "
    "pass each way, then every chunk's gradients in parallel, the pairs of tokens in different sub-chunks as matrix "
    "products through the boundary between them and the diagonal blocks term by term; dg chunk by chunk.",
    false, true, kTensorCoreShape, 80, workspace_bytes, nullptr, 0, nullptr, backward};

}  // namespace minilin
