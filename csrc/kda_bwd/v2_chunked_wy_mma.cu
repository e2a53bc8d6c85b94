// kda_bwd v2 (chunked WY, tensor cores): Kimi Delta Attention's backward as delta_bwd v2's chunked WY backward with
// a decay per key channel, its chunk-local operands from kda v6's prepare and its pairs of tokens through gla_bwd
// v2's sub-chunk references, because v1's token loops are latency-bound (12.6 ms forward + backward at B = 4,
// T = 2048, H = 16, K = V = 128 on an H100, where the forward takes 0.34).
//
// Per head and chunk of 64 tokens, with G [64, K] the chunk-local cumulative log-gate (G_L its last row), S the
// state entering the chunk, D+ = dL/dS+ the adjoint of the one leaving it (dht after the last chunk), and kda's
// prepared tiles (kda/prepared_tiles.cuh): Qr = q exp(G), Kg = k exp(G), Ke = k exp(G_L - G) [64, K], d = exp(G_L)
// [K], P_ij = sum_f q_if k_jf exp(G_if - G_jf) (j <= i), and T = (I + diag(beta) Akk)^-1 with
// Akk_ij = sum_f k_if k_jf exp(G_if - G_jf) (j < i), the forward is
//     Delta = T diag(beta) (V - Kg S)        the chunk's corrections
//     S+    = diag(d) S + Ke^T Delta
//     O     = scale (Qr S + P Delta)
// Backward, the adjoint recursion first:
//     dDelta = scale P^T dO + Ke D+
//     R      = T^T dDelta,   dv = diag(beta) R
//     D      = diag(d) D+ + scale Qr^T dO - Kg^T diag(beta) R          (D of the first chunk is dh0)
// then each chunk's gradients, with dP = scale (dO Delta^T) (j <= i), dA = -R Delta^T (j < i: the adjoint of
// A = diag(beta) Akk, so Akk's is diag(beta) dA), and for a [64, 64] M and rows x the per-channel gram products
//     row(M, x)_i = sum_{j <= i} M_ij x_j exp(G_i - G_j),    col(M, x)_j = sum_{i >= j} M_ij x_i exp(G_i - G_j):
//     dq = scale exp(G) * (dO S^T) + row(dP, k)
//     dk = dk+ + dk-,   dk+ = -exp(G) * (diag(beta) R S^T) + diag(beta) Y,   Y = row(dA, k)
//                       dk- = exp(G_L - G) * (Delta D+^T) + col(dP, q) + col(diag(beta) dA, k)
//     dbeta = rowsum(R * (V - Kg S)) + rowsum(k * Y)        (Y carries rowsum(dA * Akk) without Akk itself)
//     dg_t[f] = sum_{t <= s < t0 + 64} (q_s dq_s + k_s dk+_s - k_s dk-_s)[f]
//               + d[f] <D+[f, :], S[f, :]> + sum_j k_j[f] (exp(G_L - G_j) * (Delta D+^T)_j)[f]
// (dk+ the terms where k_s is scaled by exp(+G_s), dk- by exp(-G_s); the last line is G_L's own share).
// row() and col() split as gla_bwd v2 splits them: the pairs in different 16-token sub-chunks through the boundary
// between them as tensor-core products (every exponent <= 0), the 16 x 16 diagonal blocks term by term, the two
// grams of a diagonal block sharing each term's exponential.
// Launches: (0) kda v6's prepare, its solve tile T without beta; (1) per (batch, head, 64 value columns) one block of
// 8 warps for the states, forwards, and one for the adjoints, backwards, storing S, D+, Delta and R (bf16) and dv;
// (2) one block of 8 warps per (chunk, head, batch) for dq, dk, dbeta and dg. The states are recomputed, not saved by
// the forward, and stored in bf16 as delta_bwd v2's are. Workspace: kda's prepared tiles, then
// 2 B H N (K V + 64 V) bf16 for N = ceil(T / 64) chunks. bf16 inputs only, K = 64 or 128, V a multiple of 64.
// Measured on an H100 (2026-12-07, bf16, an initial state, forward kda v8 + this backward, H = 16, K = V = 128):
// 1.63 ms at B = 4, T = 2048 (v1 12.6; FLA's chunk_kda 3.82, 0.43x), 6.20 at B = 4, T = 8192 (0.54x), 7.66 at
// B = 1, T = 32768 (0.60x); 3.14 at B = 4, T = 8192, K = V = 64.
#include <algorithm>

#include "../common/chunk_backward.cuh"
#include "../kda/prepared_tiles.cuh"

namespace minilin {
namespace {

using namespace chunk_bwd;
using kda_prepared::PreparedTiles;


struct Workspace {
  bf16 *states, *adjoints, *deltas, *corrections_adjoint;
};

size_t prepared_section(int B, int T, int H, int K, int V) {
  return kda_prepared::prepared_bytes(B, T, H, K, V, false);
}
size_t matrices(int B, int T, int H) { return static_cast<size_t>(B) * H * chunk_count(T); }
size_t state_section(int B, int T, int H, int K, int V) {
  return workspace_aligned(matrices(B, T, H) * K * V * sizeof(bf16));
}
size_t chunk_section(int B, int T, int H, int V) {
  return workspace_aligned(matrices(B, T, H) * kChunk * V * sizeof(bf16));
}
size_t workspace_bytes(int B, int T, int H, int K, int V, bool) {
  if (B <= 0 || T <= 0 || H <= 0 || K <= 0 || V <= 0) return 0;
  return prepared_section(B, T, H, K, V) + 2 * state_section(B, T, H, K, V) + 2 * chunk_section(B, T, H, V);
}

Workspace carve(void* base, int B, int T, int H, int K, int V) {
  unsigned char* at = static_cast<unsigned char*>(base) + prepared_section(B, T, H, K, V);
  Workspace w;
  w.states = reinterpret_cast<bf16*>(at);
  at += state_section(B, T, H, K, V);
  w.adjoints = reinterpret_cast<bf16*>(at);
  at += state_section(B, T, H, K, V);
  w.deltas = reinterpret_cast<bf16*>(at);
  at += chunk_section(B, T, H, V);
  w.corrections_adjoint = reinterpret_cast<bf16*>(at);
  return w;
}

// Chunk c of head (b, h): its index among the [K, V] and [64, V] matrices, and its prepared tiles.
__device__ __forceinline__ long long matrix_at(const BackwardProblem& p, int b, int h, int c) {
  return (static_cast<long long>(b) * p.H + h) * chunk_count(p.T) + c;
}

template <int K>
__device__ __forceinline__ PreparedTiles chunk_tiles(const BackwardProblem& p, int b, int h, int c) {
  return kda_prepared::prepared_tiles<K>(p.workspace, chunk_rows(p.B, p.T, false), p.H, h,
                                         static_cast<long long>(b) * chunk_count(p.T) + c);
}

// ---- launch 1: the states (forwards) and the adjoints (backwards) over the chunk boundaries ---------------------
// 8 warps per (batch, head, 64 value columns) and direction, the running matrix (S or D+) in fp32 registers split
// as linear_bwd v2's passes split it; the 64 x 64 products per warp: rows m0, columns n0 .. n0 + 31. Two copies of
// a chunk's tiles (the next copied in while this one computes), then the running matrix's bf16 copy and one
// [64, 64] tile (Delta forwards; dDelta, then -diag(beta) R backwards). X = diag(beta) (V - Kg S) overwrites V.
template <int K, bool kReverse>
struct PassLayout {
  static constexpr int kLdK = K + 8;
  static constexpr int kKeyRows = kReverse ? 3 : 2;     // Ke, Kg (and Qr backwards)
  static constexpr int kSquares = kReverse ? 2 : 1;     // T (and P backwards)
  static constexpr size_t kStageBytes = (kKeyRows * kChunk * kLdK + kSquares * kChunk * kLdC + kChunk * kLdV) *
                                            sizeof(bf16) + (K + kChunk) * sizeof(float);  // ..., V or dO; d, beta
  static constexpr size_t kBytes = 2 * kStageBytes + (K * kLdV + kChunk * kLdV) * sizeof(bf16);
  unsigned char* base;
  __device__ bf16* ke(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* kg(int s) const { return ke(s) + kChunk * kLdK; }
  __device__ bf16* qr(int s) const { return kg(s) + kChunk * kLdK; }  // backwards only
  __device__ bf16* T(int s) const { return ke(s) + kKeyRows * kChunk * kLdK; }
  __device__ bf16* P(int s) const { return T(s) + kChunk * kLdC; }  // backwards only
  __device__ bf16* y(int s) const { return T(s) + kSquares * kChunk * kLdC; }  // V forwards, dO backwards
  __device__ float* d(int s) const { return reinterpret_cast<float*>(y(s) + kChunk * kLdV); }
  __device__ float* beta(int s) const { return d(s) + K; }
  __device__ bf16* R() const { return reinterpret_cast<bf16*>(base + 2 * kStageBytes); }  // S or D+, bf16
  __device__ bf16* tile() const { return R() + K * kLdV; }
};

template <int K, bool kReverse>
__device__ __forceinline__ void load_pass_chunk(const PassLayout<K, kReverse>& L, int s, const BackwardProblem& p,
                                                int b, int h, int c, int v0) {
  constexpr int kLdK = PassLayout<K, kReverse>::kLdK;
  const PreparedTiles tiles = chunk_tiles<K>(p, b, h, c);
  cp_async_tile<kThreads, kChunk, K>(L.ke(s), kLdK, tiles.ke, K);
  cp_async_tile<kThreads, kChunk, K>(L.kg(s), kLdK, tiles.kg, K);
  if (kReverse) {
    cp_async_tile<kThreads, kChunk, K>(L.qr(s), kLdK, tiles.qr, K);
    cp_async_tile<kThreads, kChunk, kChunk>(L.P(s), kLdC, tiles.scores, kChunk);
  }
  cp_async_tile<kThreads, kChunk, kChunk>(L.T(s), kLdC, tiles.solve, kChunk);
  cp_async_token_rows<kBlockV>(L.y(s), kLdV, kReverse ? p.do_ : p.v, p, b, h, c * kChunk, p.V, v0);
  cp_async_tile<kThreads, 1, K>(L.d(s), K, tiles.decay, K);
  cp_async_token_scalars(L.beta(s), p.beta, p, b, h, c * kChunk);
}

template <int K, bool kReverse>
__device__ __forceinline__ void run_pass(const BackwardProblem& p, const Workspace& w, unsigned char* smem, int v0) {
  using Layout = PassLayout<K, kReverse>;
  constexpr int kLdK = Layout::kLdK;
  constexpr int kRowSharers = chunk_bwd::kRowSharers<K>, kStateTiles = chunk_bwd::kStateTiles<K>;
  static_assert(kRowSharers >= 1 && kStateTiles % 2 == 0, "K must be 64 or 128");

  const Layout L{smem};
  const int h = blockIdx.y, b = blockIdx.z, chunks = chunk_count(p.T);
  const int warp = threadIdx.x >> 5;
  const int s_m0 = 16 * (warp / kRowSharers), s_n0 = 8 * kStateTiles * (warp % kRowSharers);
  const int m0 = 16 * (warp >> 1), n0 = 32 * (warp & 1);
  const long long head = (static_cast<long long>(b) * p.H + h) * K * p.V;

  load_pass_chunk<K, kReverse>(L, 0, p, b, h, kReverse ? chunks - 1 : 0, v0);
  cp_async_commit();
  float R[1][kStateTiles][4];
  load_state(R, kReverse ? p.dht : p.h0, head, p.V, v0, s_m0, s_n0, L.R(), kLdV);

  for (int n = 0; n < chunks; ++n) {
    const int s = n & 1, c = kReverse ? chunks - 1 - n : n;
    cp_async_wait<0>();
    __syncthreads();  // chunk c and R's copy are on chip; every read of the other stage is done
    if (n + 1 < chunks) load_pass_chunk<K, kReverse>(L, s ^ 1, p, b, h, kReverse ? c - 1 : c + 1, v0);
    cp_async_commit();
    const long long at = matrix_at(p, b, h, c);
    copy_out_rows((kReverse ? w.adjoints : w.states) + at * K * p.V + v0, p.V, L.R(), K);
    const float* beta = L.beta(s);
    const float* d = L.d(s);

    if constexpr (!kReverse) {
      // X = diag(beta) (V - Kg S), over V's rows (each thread rewrites the elements it reads)
      float ks[1][4][4];
      zero(ks);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(ks, L.kg(s), kLdK, L.R(), kLdV, m0, n0, 0, K);
      bf16* X = L.y(s);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = m0 + acc_row(0, e), col = n0 + acc_col(j, e);
          const __nv_bfloat162 v2 = *reinterpret_cast<const __nv_bfloat162*>(X + r * kLdV + col);
          store_bf16x2(X + r * kLdV + col, beta[r] * (__low2float(v2) - ks[0][j][e]),
                       beta[r] * (__high2float(v2) - ks[0][j][e + 1]));
        }
      __syncthreads();  // X is complete
      // Delta = T X (T lower triangular: columns up to the tile's last row), stored, and on chip for the update
      float delta[1][4][4];
      zero(delta);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(delta, L.T(s), kLdC, X, kLdV, m0, n0, 0, m0 + 16);
      store_tile_bf16(delta, w.deltas + at * kChunk * p.V + v0, p.V, m0, n0);
      store_tile_bf16(delta, L.tile(), kLdV, m0, n0);
      __syncthreads();  // Delta is complete; every read of R's copy is done
      // S+ = diag(d) S + Ke^T Delta
      scale_rows(R, s_m0, [&](int r) { return d[r]; });
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(R, L.ke(s), kLdK, L.tile(), kLdV, s_m0, s_n0,
                                                                       0, kChunk);
    } else {
      // dDelta = scale P^T dO + Ke D+ (P^T: rows j take tokens i >= j)
      float dd[1][4][4];
      zero(dd);
      warp_mma<1, 4, Stored::kTransposed, Stored::kRowMajor>(dd, L.P(s), kLdC, L.y(s), kLdV, m0, n0, m0, kChunk);
      scale_tiles(dd, p.scale);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(dd, L.ke(s), kLdK, L.R(), kLdV, m0, n0, 0, K);
      store_tile_bf16(dd, L.tile(), kLdV, m0, n0);
      __syncthreads();  // dDelta is complete; every read of R's copy is done
      // R = T^T dDelta (T^T upper triangular: rows j >= i), stored; dv = diag(beta) R
      float ra[1][4][4];
      zero(ra);
      warp_mma<1, 4, Stored::kTransposed, Stored::kRowMajor>(ra, L.T(s), kLdC, L.tile(), kLdV, m0, n0, m0, kChunk);
      store_tile_bf16(ra, w.corrections_adjoint + at * kChunk * p.V + v0, p.V, m0, n0);
      scale_rows(ra, m0, [&](int r) { return beta[r]; });
      store_output_tile(ra, static_cast<bf16*>(p.dv), p.T, p.H, p.V, b, h, c * kChunk, v0, m0, n0, 1.0f);
      // D = diag(d) D+ + scale Qr^T dO - Kg^T diag(beta) R: the first two terms while the others read dDelta
      float qo[1][kStateTiles][4];
      zero(qo);
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(qo, L.qr(s), kLdK, L.y(s), kLdV, s_m0, s_n0,
                                                                       0, kChunk);
      scale_rows(R, s_m0, [&](int r) { return d[r]; });
#pragma unroll
      for (int j = 0; j < kStateTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) R[0][j][e] = fmaf(p.scale, qo[0][j][e], R[0][j][e]);
      scale_tiles(ra, -1.0f);
      __syncthreads();  // every read of dDelta is done: its tile takes -diag(beta) R
      store_tile_bf16(ra, L.tile(), kLdV, m0, n0);
      __syncthreads();  // -diag(beta) R is complete
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(R, L.kg(s), kLdK, L.tile(), kLdV, s_m0, s_n0,
                                                                       0, kChunk);
    }
    store_state_copy(R, L.R(), kLdV, s_m0, s_n0);
  }
  if (kReverse && p.dh0) store_state(R, p.dh0, head, p.V, v0, s_m0, s_n0);
}

// Neither pass needs the other: blocks x < V / 64 run the states and the rest the adjoints.
template <int K>
__global__ void __launch_bounds__(kThreads, 1) kda_bwd_v2_passes(const BackwardProblem p, const Workspace w) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int value_blocks = p.V / kBlockV;
  if (static_cast<int>(blockIdx.x) < value_blocks) run_pass<K, false>(p, w, smem, blockIdx.x * kBlockV);
  else run_pass<K, true>(p, w, smem, (blockIdx.x - value_blocks) * kBlockV);
}

// ---- launch 2: the gradients, one block of 8 warps per (chunk, head, batch) ----------------------------------
// Warp w: rows m0 = 16 (w / 2) (sub-chunk a = w / 2) of every product, of the 64 x 64 ones (dP, dA) the columns
// n0 = 32 (w % 2) .., of the 64 x K ones the columns k0 = (K / 2) (w % 2) ... The sums over value columns
// (dO Delta^T, R Delta^T, dO S^T, Delta D+^T, R S^T) accumulate in registers over the value blocks; once they are
// done the value blocks' tiles are dead, so the sub-chunk references, and then dg's terms, take their place.
template <int K>
struct GradLayout {
  static constexpr int kLdK = K + 8;
  static constexpr int kLdG = K + 4;             // fp32 rows of g (16-byte rows for cp.async)
  static constexpr int kRefRows = 16 + 32 + 48;  // the rows of one kind of reference over the sub-chunks
  static constexpr int kDbetaParts = 5;          // rowsum(V R); -rowsum(Kg S * R) and rowsum(k Y) by column half
  static constexpr size_t kValueBytes = (4 * kChunk * kLdV + 2 * K * kLdV) * sizeof(bf16);  // V, dO, Delta, R; S, D+
  static constexpr size_t kRefBytes = 3 * kRefRows * kLdK * sizeof(bf16);                   // Kref, Qref, Kup
  static constexpr size_t kTermBytes = kChunk * kLdG * sizeof(float);
  static constexpr size_t kUnionBytes = kValueBytes > kRefBytes ? kValueBytes : kRefBytes;
  static_assert(kTermBytes <= kUnionBytes, "dg's terms fit where the references were");
  static constexpr size_t kBytes = 2 * kChunk * kLdK * sizeof(bf16)    // q, k
                                   + kChunk * kLdG * sizeof(float)     // g, then G
                                   + 2 * kChunk * kLdC * sizeof(bf16)  // dP, dA
                                   + kUnionBytes
                                   + (kChunk + kDbetaParts * kChunk + 5 * K) * sizeof(float);
  unsigned char* base;
  __device__ bf16* q() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* k() const { return q() + kChunk * kLdK; }
  __device__ float* G() const { return reinterpret_cast<float*>(k() + kChunk * kLdK); }
  __device__ bf16* dP() const { return reinterpret_cast<bf16*>(G() + kChunk * kLdG); }
  __device__ bf16* dA() const { return dP() + kChunk * kLdC; }
  __device__ unsigned char* shared() const { return reinterpret_cast<unsigned char*>(dA() + kChunk * kLdC); }
  __device__ bf16* v() const { return reinterpret_cast<bf16*>(shared()); }
  __device__ bf16* dO() const { return v() + kChunk * kLdV; }
  __device__ bf16* delta() const { return dO() + kChunk * kLdV; }
  __device__ bf16* ra() const { return delta() + kChunk * kLdV; }  // R = T^T dDelta
  __device__ bf16* S() const { return ra() + kChunk * kLdV; }
  __device__ bf16* D() const { return S() + K * kLdV; }
  // gla_bwd v2's references: Kref_a (a = 1, 2, 3) rows j = 0 .. 16 a - 1; Qref_a and Kup_a (a = 0, 1, 2) indexed
  // by token, row i (16 (a + 1) <= i < 64) at rows(a) + i kLdK (the rows before 16 (a + 1) are never read)
  __device__ bf16* Kref(int a) const {
    return reinterpret_cast<bf16*>(shared()) + (a == 1 ? 0 : a == 2 ? 16 : 48) * kLdK;
  }
  __device__ bf16* ref_rows(int kind, int a) const {
    return reinterpret_cast<bf16*>(shared()) + (kind * kRefRows + (a == 0 ? 0 : a == 1 ? 48 : 80) - 16 * (a + 1)) * kLdK;
  }
  __device__ bf16* Qref_rows(int a) const { return ref_rows(1, a); }
  __device__ bf16* Kup_rows(int a) const { return ref_rows(2, a); }
  __device__ float* terms() const { return reinterpret_cast<float*>(shared()); }  // dg's per-token terms [64][kLdG]
  __device__ float* beta() const { return reinterpret_cast<float*>(shared() + kUnionBytes); }
  __device__ float* dbeta_part(int i) const { return beta() + kChunk + i * kChunk; }  // i < kDbetaParts
  __device__ float* state_dot() const { return dbeta_part(kDbetaParts); }            // <D+, S> per key row
  __device__ float* inter_dot(int group) const { return state_dot() + (1 + group) * K; }
};

template <int K>
__device__ __forceinline__ void load_value_block(const GradLayout<K>& L, const BackwardProblem& p, const Workspace& w,
                                                 int b, int h, int c, int v0) {
  const int t0 = c * kChunk;
  const long long at = matrix_at(p, b, h, c);
  cp_async_token_rows<kBlockV>(L.v(), kLdV, p.v, p, b, h, t0, p.V, v0);
  cp_async_token_rows<kBlockV>(L.dO(), kLdV, p.do_, p, b, h, t0, p.V, v0);
  cp_async_value_block<kChunk>(L.delta(), w.deltas + at * kChunk * p.V + v0, p.V);
  cp_async_value_block<kChunk>(L.ra(), w.corrections_adjoint + at * kChunk * p.V + v0, p.V);
  cp_async_value_block<K>(L.S(), w.states + at * K * p.V + v0, p.V);
  cp_async_value_block<K>(L.D(), w.adjoints + at * K * p.V + v0, p.V);
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) kda_bwd_v2_gradients(const BackwardProblem p, const Workspace w) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = GradLayout<K>::kLdK, kLdG = GradLayout<K>::kLdG;
  constexpr int kKeyTiles = K / 16;          // 8-column tiles of a warp's half of a 64 x K gradient
  const GradLayout<K> L{smem};
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t0 = c * kChunk;
  const int warp = threadIdx.x >> 5;
  const int a = warp >> 1;              // this warp's sub-chunk
  const int m0 = kSub * a;              // its 16 rows of every product
  const int n0 = 32 * (warp & 1);       // its 32 columns of the 64 x 64 ones (dP, dA)
  const int k0 = (K / 2) * (warp & 1);  // its K / 2 columns of the 64 x K ones
  const bool below = n0 < m0 + 16;      // its 64 x 64 tile reaches the causal triangle

  cp_async_token_rows<K>(L.q(), kLdK, p.q, p, b, h, t0, K, 0);
  cp_async_token_rows<K>(L.k(), kLdK, p.k, p, b, h, t0, K, 0);
  cp_async_tile<kThreads, kChunk, K>(L.G(), kLdG, p.g + token_index(p, b, t0, h) * K, static_cast<long long>(p.H) * K,
                                     min(kChunk, p.T - t0));
  cp_async_token_scalars(L.beta(), p.beta, p, b, h, t0);
  load_value_block<K>(L, p, w, b, h, c, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  float* G = L.G();
  const float* beta = L.beta();
  channel_cumsum<K, kLdG>(G);  // nothing reads G before the barrier after dP's store

  // Over the value blocks: dP = dO Delta^T and dA = R Delta^T (below the diagonal), dq = dO S^T,
  // dk- = Delta D+^T, rs = R S^T (all summed over value columns); <D+, S> per key row and rowsum(V R) per token.
  float dP[1][4][4], dA[1][4][4], dq[1][kKeyTiles][4], dk_minus[1][kKeyTiles][4], rs[1][kKeyTiles][4];
  zero(dP);
  zero(dA);
  zero(dq);
  zero(dk_minus);
  zero(rs);
  float state_dot = 0.0f, v_r = 0.0f;
  for (int v0 = 0; v0 < p.V; v0 += kBlockV) {
    if (v0 > 0) {
      __syncthreads();  // every read of the previous value block is done
      load_value_block<K>(L, p, w, b, h, c, v0);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    }
    accumulate_row_dot<K>(state_dot, L.S(), L.D());
    accumulate_row_dot<kChunk>(v_r, L.v(), L.ra());
    if (below) {
      warp_mma<1, 4, Stored::kRowMajor, Stored::kTransposed>(dP, L.dO(), kLdV, L.delta(), kLdV, m0, n0, 0, kBlockV);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kTransposed>(dA, L.ra(), kLdV, L.delta(), kLdV, m0, n0, 0, kBlockV);
    }
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(dq, L.dO(), kLdV, L.S(), kLdV, m0, k0, 0, kBlockV);
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(dk_minus, L.delta(), kLdV, L.D(), kLdV, m0, k0, 0,
                                                                   kBlockV);
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(rs, L.ra(), kLdV, L.S(), kLdV, m0, k0, 0, kBlockV);
  }
  store_row_dot<K>(state_dot, L.state_dot());
  store_row_dot<kChunk>(v_r, L.dbeta_part(0));
  store_lower_scores<false>(dP, p.scale, L.dP(), m0, n0);  // dP = scale dO Delta^T for j <= i, 0 above
  store_lower_scores<true>(dA, -1.0f, L.dA(), m0, n0);     // dA = -R Delta^T for j < i, 0 elsewhere
  __syncthreads();  // dP and dA are complete; every read of the value blocks is done (their space takes the references)

  // The sub-chunk references (gla_bwd v2's Kref_a, Qref_a) and a third kind beside Qref:
  //   Kup_a,i = beta_i k_i exp(G_i - G_r)  (i >= 16 (a + 1), r the last token of sub-chunk a)
  store_sub_chunk_references<K>(L, G, [&](int qa, int i, int f, float2 e) {
    const float2 k2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.k() + i * kLdK + f));
    store_bf16x2(L.Kup_rows(qa) + i * kLdK + f, beta[i] * k2.x * e.x, beta[i] * k2.y * e.y);
  });

  // The inter-chunk terms: dq = scale exp(G) * (dO S^T); dk- starts as exp(G_L - G) * (Delta D+^T), whose
  // sum_j k_j dk-_j per key channel dg's last token needs (this warp's column sums, then the 8 row lanes'; by row
  // group); dk+ starts as -diag(beta) exp(G) * (R S^T), and -rowsum(Kg S * R) = -rowsum(k * exp(G) * (R S^T)) is a
  // part of dbeta.
  scale_decayed<kKeyTiles, kLdG>(dq, G, m0, k0, -1, 1.0f, p.scale);
  scale_decayed<kKeyTiles, kLdG>(dk_minus, G, m0, k0, kChunk - 1, -1.0f, 1.0f);
  store_column_dots(dk_minus, L.k(), kLdK, m0, k0, L.inter_dot(a));
  scale_decayed<kKeyTiles, kLdG>(rs, G, m0, k0, -1, 1.0f, 1.0f);
  {
    const float2 k_rs = row_dots(rs, L.k(), kLdK, m0, k0);
    store_row_part(L.dbeta_part(1 + (warp & 1)), make_float2(-k_rs.x, -k_rs.y), m0);
  }
  float (&dk_plus)[1][kKeyTiles][4] = rs;
  scale_rows(dk_plus, m0, [&](int r) { return -beta[r]; });
  __syncthreads();  // the references are complete

  float Y[1][kKeyTiles][4];  // row(dA, k)
  zero(Y);
  {  // the pairs in different sub-chunks, through the boundary between them
    float part[1][kKeyTiles][4];
    if (a >= 1) {  // rows of sub-chunk a, columns j < 16 a: r = 16 a - 1
      zero(part);
      warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kRowMajor>(part, L.dP(), kLdC, L.Kref(a), kLdK, m0, k0, 0, m0);
      add_decayed<kKeyTiles, kLdG>(dq, part, G, m0, k0, m0 - 1, 1.0f);
      zero(part);
      warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kRowMajor>(part, L.dA(), kLdC, L.Kref(a), kLdK, m0, k0, 0, m0);
      add_decayed<kKeyTiles, kLdG>(Y, part, G, m0, k0, m0 - 1, 1.0f);
    }
    if (a <= 2) {  // columns of sub-chunk a, rows i >= 16 (a + 1): r = 16 a + 15; col(dP, q) + col(diag(beta) dA, k)
      zero(part);
      warp_mma<1, kKeyTiles, Stored::kTransposed, Stored::kRowMajor>(part, L.dP(), kLdC, L.Qref_rows(a), kLdK, m0, k0,
                                                                     m0 + kSub, kChunk);
      warp_mma<1, kKeyTiles, Stored::kTransposed, Stored::kRowMajor>(part, L.dA(), kLdC, L.Kup_rows(a), kLdK, m0, k0,
                                                                     m0 + kSub, kChunk);
      add_decayed<kKeyTiles, kLdG>(dk_minus, part, G, m0, k0, m0 + kSub - 1, -1.0f);
    }
  }

  // The pairs inside sub-chunk a, term by term, each exponential shared by the two grams: for this thread's
  // elements (i, f) of the warp's tiles,
  //   dq_i[f] += sum_{m0 <= s <= i} dP_is k_s[f] e_is,   Y_i[f] += sum_{m0 <= s < i} dA_is k_s[f] e_is,
  //   dk-_i[f] += sum_{i <= s < m0 + 16} (dP_si q_s[f] + beta_s dA_si k_s[f]) e_si,   e_is = exp(G_i[f] - G_s[f])
  {
    const int top = m0 + acc_row(0, 0), bottom = m0 + acc_row(0, 2);
    for (int s = m0; s < m0 + kSub; ++s) {
      const float dP_top_s = __bfloat162float(L.dP()[top * kLdC + s]);  // 0 for s > top
      const float dP_bottom_s = __bfloat162float(L.dP()[bottom * kLdC + s]);
      const float dA_top_s = __bfloat162float(L.dA()[top * kLdC + s]);  // 0 for s >= top
      const float dA_bottom_s = __bfloat162float(L.dA()[bottom * kLdC + s]);
      const float dP_s_top = s >= top ? __bfloat162float(L.dP()[s * kLdC + top]) : 0.0f;
      const float dP_s_bottom = s >= bottom ? __bfloat162float(L.dP()[s * kLdC + bottom]) : 0.0f;
      const float dA_s_top = s > top ? beta[s] * __bfloat162float(L.dA()[s * kLdC + top]) : 0.0f;
      const float dA_s_bottom = s > bottom ? beta[s] * __bfloat162float(L.dA()[s * kLdC + bottom]) : 0.0f;
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j) {
        const int f = k0 + acc_col(j, 0);
        const float2 Gs = *reinterpret_cast<const float2*>(G + s * kLdG + f);
        const float2 ks = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.k() + s * kLdK + f));
        const float2 qs = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.q() + s * kLdK + f));
        // elements e, e + 1 (row `row`, channels f, f + 1): s <= row the row grams (exponent G_row - G_s <= 0),
        // s >= row the column grams (G_s - G_row <= 0)
        const auto add_row = [&](int e, int row, float dP_row_s, float dA_row_s, float dP_s_row, float dA_s_row) {
          const float2 Gr = *reinterpret_cast<const float2*>(G + row * kLdG + f);
          if (s <= row) {
            const float ex = __expf(Gr.x - Gs.x), ey = __expf(Gr.y - Gs.y);
            dq[0][j][e] = fmaf(dP_row_s * ks.x, ex, dq[0][j][e]);
            dq[0][j][e + 1] = fmaf(dP_row_s * ks.y, ey, dq[0][j][e + 1]);
            Y[0][j][e] = fmaf(dA_row_s * ks.x, ex, Y[0][j][e]);
            Y[0][j][e + 1] = fmaf(dA_row_s * ks.y, ey, Y[0][j][e + 1]);
          }
          if (s >= row) {
            const float ex = __expf(Gs.x - Gr.x), ey = __expf(Gs.y - Gr.y);
            dk_minus[0][j][e] = fmaf(fmaf(dP_s_row, qs.x, dA_s_row * ks.x), ex, dk_minus[0][j][e]);
            dk_minus[0][j][e + 1] = fmaf(fmaf(dP_s_row, qs.y, dA_s_row * ks.y), ey, dk_minus[0][j][e + 1]);
          }
        };
        add_row(0, top, dP_top_s, dA_top_s, dP_s_top, dA_s_top);
        add_row(2, bottom, dP_bottom_s, dA_bottom_s, dP_s_bottom, dA_s_bottom);
      }
    }
  }

  // Y complete: rowsum(k * Y) is dbeta's last part, and dk+ gains diag(beta) Y
  store_row_part(L.dbeta_part(3 + (warp & 1)), row_dots(Y, L.k(), kLdK, m0, k0), m0);
  {
    const float top = beta[m0 + acc_row(0, 0)], bottom = beta[m0 + acc_row(0, 2)];
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j) {
      dk_plus[0][j][0] = fmaf(top, Y[0][j][0], dk_plus[0][j][0]);
      dk_plus[0][j][1] = fmaf(top, Y[0][j][1], dk_plus[0][j][1]);
      dk_plus[0][j][2] = fmaf(bottom, Y[0][j][2], dk_plus[0][j][2]);
      dk_plus[0][j][3] = fmaf(bottom, Y[0][j][3], dk_plus[0][j][3]);
    }
  }
  store_output_tile(dq, static_cast<bf16*>(p.dq), p.T, p.H, K, b, h, t0, 0, m0, k0, 1.0f);
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) Y[0][j][e] = dk_plus[0][j][e] + dk_minus[0][j][e];  // dk
  store_output_tile(Y, static_cast<bf16*>(p.dk), p.T, p.H, K, b, h, t0, 0, m0, k0, 1.0f);

  __syncthreads();  // every read of the references is done: dg's terms take their space; dbeta's parts are complete
  if (threadIdx.x < kChunk && t0 + static_cast<int>(threadIdx.x) < p.T) {
    const int r = threadIdx.x;
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < GradLayout<K>::kDbetaParts; ++i) sum += L.dbeta_part(i)[r];
    p.dbeta[token_index(p, b, t0 + r, h)] = sum;
  }
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) Y[0][j][e] = dk_plus[0][j][e] - dk_minus[0][j][e];
  store_channel_gate_terms(L, dq, Y, 1.0f, m0, k0);  // q_s . dq_s + k_s . (dk+_s - dk-_s)
  __syncthreads();
  // dg_t[f] = sum_{t <= s < t0 + 64} term_s[f] + d[f] <D+, S>[f] + sum_j k_j[f] (exp(G_L - G_j) (Delta D+^T)_j)[f]
  store_channel_gate_gradient<K>(L, p, b, h, t0);
}

template <int K>
void launch(const BackwardProblem& p, const Workspace& w) {
  launch_checked(p, "kda_bwd_v2_passes", kda_bwd_v2_passes<K>, dim3(2 * (p.V / kBlockV), p.H, p.B), kThreads,
                 std::max(PassLayout<K, false>::kBytes, PassLayout<K, true>::kBytes), w);
  launch_checked(p, "kda_bwd_v2_gradients", kda_bwd_v2_gradients<K>, dim3(chunk_count(p.T), p.H, p.B), kThreads,
                 GradLayout<K>::kBytes, w);
}

void backward(const BackwardProblem& p) {
  constexpr const char* name = "kda_bwd_v2_chunked_wy_mma";
  check_tensor_core_backward(p, name, true, workspace_bytes(p.B, p.T, p.H, p.K, p.V, false), kBlockV);
  require_channel_gate(p, name);
  require(reinterpret_cast<uintptr_t>(p.workspace) % 256 == 0, [] {
    return std::string(name) + ": the workspace must be 256-byte aligned (its sections are)";
  });
  Problem prepare = forward_problem(p);  // kda v6's prepare over the same q, k, g, beta, T alone in its solve tile
  prepare.workspace = p.workspace;
  prepare.workspace_size = prepared_section(p.B, p.T, p.H, p.K, p.V);
  kda_prepared::launch_sliced_prepare(prepare, /*halves=*/true, /*solve_times_beta=*/false);
  const Workspace w = carve(p.workspace, p.B, p.T, p.H, p.K, p.V);
  if (p.K == 64) launch<64>(p, w);
  else launch<128>(p, w);
}

}  // namespace

extern const Version kda_bwd_v2 = {
    "kda_bwd", 2, "chunked_wy_mma",
    "Chunks on bf16 tensor cores through the WY form with a decay per key channel: kda v6's prepared tiles (T "
    "without beta), the chunk-boundary states and their adjoints by one pass each way, then every chunk's gradients "
    "in parallel, the pairs of tokens in different sub-chunks through the boundary between them; dg chunk by chunk.",
    false, true, kTensorCoreShape, 90, workspace_bytes, nullptr, 0, nullptr, backward};

}  // namespace minilin
