// delta_bwd v2 (chunked WY, tensor cores): the backward of the chunked delta rule (delta v3's chunk algorithm) in
// four launches, the WY step and the chunk-local scores, the two passes over the chunk boundaries side by side, then
// the chunks in parallel,
// every product on bf16 tensor cores (mma.sync, fp32 accumulators), because v1's token loops are latency-bound
// (52 ms where the forward takes 0.45).
//
// Per head and chunk of 64 tokens, with G the chunk-local cumulative log-gate (G_L its last entry), E = diag(exp(G)),
// F = diag(exp(G_L - G)), M_ij = exp(G_i - G_j) for j <= i, S the state entering the chunk, S+ the one leaving it,
// D+ = dL/dS+ its adjoint (dht after the last chunk), and T = (I + A)^-1, A = diag(beta) (K K^T * M) strictly below
// the diagonal (the forward's WY step, delta/wy_prepare_blocked.cuh):
//     Delta = T X,  X = diag(beta) (V - E K S)        the chunk's corrections (FLA's v_new = U - W S)
//     S+    = exp(G_L) S + K^T F Delta
//     O     = scale E Q S + P Delta,  P = scale (Q K^T) * M
// Backward, the adjoint recursion first (it needs no state):
//     dDelta = P^T dO + F K D+                        the corrections' adjoint
//     R      = T^T dDelta                             = dL/dX, so dv = diag(beta) R
//     D      = exp(G_L) D+ + scale Q^T E dO - K^T E diag(beta) R        (D of the first chunk is dh0)
// and each chunk's gradients, R being all that T's backward needs: FLA's dW = -dDelta S^T and dU = dDelta become
// R_w = T^T dW = -R S^T and T^T dU = R, and its dA = -(R U^T + R_w W^T) = -R (U - W S)^T = -R Delta^T:
//     dA  = -R Delta^T (strictly lower),  dpair = diag(beta) dA * M,  dS = scale (dO Delta^T) * M (j <= i)
//     dq  = scale E dO S^T + dS K
//     dk  = dS^T Q + F Delta D+^T + diag(beta) E R_w + dpair K + dpair^T K
//     dbeta = rowsum(V * R) + rowsum(E K * R_w) + rowsum(dA * (K K^T * M))
//     dg, inside the chunk as linear_bwd v2 forms it: dL/dG_s = q_s . dq_s - k_s . dk^A_s + k_s . dk^B_s, where
//       dk^B = diag(beta) E R_w + dpair K (the terms where k_s sits at the later token of a decay, or in W) and
//       dk^A the rest (dk = dk^A + dk^B); plus at the last token exp(G_L) <D+, S> + sum_j k_j . (F Delta D+^T)_j;
//       dg_t = the sum of dL/dG_s over t <= s < t0 + 64, plus that last-token term.
// Launches: (1) T for every chunk (delta v10's prepare); (2) P^T dO for every chunk; (3) per (batch, head, 64 value
// columns) 8 warps for the states, forwards, and 8 for the adjoints, backwards, side by side (in separate blocks
// where they fit the card at one block per SM, else in one 16-warp block), storing S, D+ and Delta, R (bf16) and
// dv; (4) one block of 16 warps per (chunk, head, batch) for dq, dk, dbeta and dg. The adjoint pass is the one long
// chain of the backward (its warps walk every chunk, the state pass's do less per chunk), so what does not depend
// on D+ is taken off it: P^T dO by launch 2, Q^T E dO while R is stored, and its next chunk is copied in while it
// computes. The states are recomputed rather than saved by the forward (which stays the inference kernel). Stored in bf16, as tools/emulate_bf16_backward.py shows they
// may be (every gradient within 3e-3 of float64 with all of them rounded): workspace 2 B H N (K V + 64 V + 32 64)
// bf16 for N = ceil(T / 64) chunks.
#include <algorithm>

#include "../common/chunk_backward.cuh"
#include "../delta/wy_prepare_blocked.cuh"

namespace minilin {
namespace {

using namespace chunk_bwd;

// The workspace: T's tiles (wy_tiles.cuh's layout), then per (batch, head, chunk) the state entering it and the
// adjoint of the one leaving it [K, V], its corrections Delta and their R = T^T dDelta [64, V].
struct Workspace {
  bf16 *wy, *states, *adjoints, *deltas, *corrections_adjoint;
};

size_t matrices(int B, int T, int H) { return static_cast<size_t>(B) * H * chunk_count(T); }

size_t workspace_bytes(int B, int T, int H, int K, int V, bool) {
  return (wy_workspace_elements(B, T, H, false) + matrices(B, T, H) * 2 * (size_t(K) * V + size_t(kChunk) * V)) *
         sizeof(bf16);
}

Workspace carve(void* base, int B, int T, int H, int K, int V) {
  Workspace w;
  w.wy = static_cast<bf16*>(base);
  w.states = w.wy + wy_workspace_elements(B, T, H, false);
  w.adjoints = w.states + matrices(B, T, H) * K * V;
  w.deltas = w.adjoints + matrices(B, T, H) * K * V;
  w.corrections_adjoint = w.deltas + matrices(B, T, H) * kChunk * V;
  return w;
}

// Offsets of chunk c of head (b, h): into the [K, V] matrices, and into the [64, V] ones.
__device__ __forceinline__ long long matrix_at(const BackwardProblem& p, int b, int h, int c) {
  return (static_cast<long long>(b) * p.H + h) * chunk_count(p.T) + c;
}

// ---- launch 2: the corrections' adjoint's chunk-local part P^T dO, every chunk at once -------------------------
// One block of 8 warps per (chunk, head, batch): P = scale (Q K^T) * M once, then P^T dO per value block, stored
// where the adjoint pass will store R (it reads the tile before it writes it), so that the adjoint pass, the
// launch's one sequential chain, does neither product.
template <int K>
struct LocalLayout {
  static constexpr int kLdK = K + 8;
  static constexpr size_t kBytes = (2 * kChunk * kLdK + kChunk * kLdC + kChunk * kLdV) * sizeof(bf16)  // Q, K, P, dO
                                   + 2 * kChunk * sizeof(float);                                       // g, G
  unsigned char* base;
  __device__ bf16* q() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* k() const { return q() + kChunk * kLdK; }
  __device__ bf16* P() const { return k() + kChunk * kLdK; }
  __device__ bf16* dO() const { return P() + kChunk * kLdC; }
  __device__ float* g() const { return reinterpret_cast<float*>(dO() + kChunk * kLdV); }
  __device__ float* G() const { return g() + kChunk; }
};

template <int K>
__global__ void __launch_bounds__(kThreads, 2) delta_bwd_v2_local(const BackwardProblem p, const Workspace w) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = LocalLayout<K>::kLdK;
  const LocalLayout<K> L{smem};
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t0 = c * kChunk;
  const int warp = threadIdx.x >> 5, m0 = 16 * (warp >> 1), n0 = 32 * (warp & 1);
  cp_async_token_rows<K>(L.q(), kLdK, p.q, p, b, h, t0, K, 0);
  cp_async_token_rows<K>(L.k(), kLdK, p.k, p, b, h, t0, K, 0);
  cp_async_token_scalars(L.g(), p.g, p, b, h, t0);
  cp_async_token_rows<kBlockV>(L.dO(), kLdV, p.do_, p, b, h, t0, p.V, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  if (warp == 0) warp_chunk_cumsum(L.G(), L.g(), p.g != nullptr);
  float qk[1][4][4];
  zero(qk);
  if (n0 < m0 + 16) warp_mma<1, 4, Stored::kRowMajor, Stored::kTransposed>(qk, L.q(), kLdK, L.k(), kLdK, m0, n0, 0, K);
  scale_tiles(qk, p.scale);
  __syncthreads();  // G is on chip
  store_decayed_scores(qk, L.G(), L.P(), kLdC, m0, n0);
  bf16* out = w.corrections_adjoint + matrix_at(p, b, h, c) * kChunk * p.V;
  for (int v0 = 0; v0 < p.V; v0 += kBlockV) {
    if (v0 > 0) {
      __syncthreads();  // every read of the previous value block is done
      cp_async_token_rows<kBlockV>(L.dO(), kLdV, p.do_, p, b, h, t0, p.V, v0);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();  // P and this value block of dO are complete
    float local[1][4][4];  // P^T dO: rows i take tokens j >= i
    zero(local);
    warp_mma<1, 4, Stored::kTransposed, Stored::kRowMajor>(local, L.P(), kLdC, L.dO(), kLdV, m0, n0, m0, kChunk);
    store_tile_bf16(local, out + v0, p.V, m0, n0);
  }
}

// ---- launch 3: the states (forwards) and the adjoints (backwards) over the chunk boundaries ---------------------
// 8 warps per (batch, head, 64 value columns) and direction, the running matrix (S or D+) in fp32 registers split
// as linear_bwd v2's passes split it; the 64 x 64 products per warp: rows m0, columns n0 .. n0 + 31. Each direction
// has its own shared memory: kStages copies of a chunk's inputs (two: the next copied in while this one computes),
// then the running matrix's bf16 copy and one [64, 64] tile (F Delta forwards; dDelta, then -E diag(beta) R
// backwards). The chunk's other intermediates overwrite the input they are made from: X = diag(beta) (V - E K S)
// the V rows, scale E dO the dO rows.
template <int K, int kStages, bool kReverse>
struct PassLayout {
  static constexpr int kLdK = K + 8;
  static constexpr int kRowInputs = kReverse ? 2 : 1;  // k and V forwards; q, k, dO and P^T dO backwards
  static constexpr size_t kStageBytes = (kRowInputs * (kChunk * kLdK + kChunk * kLdV) + kChunk * kLdC) * sizeof(bf16)
                                        + 2 * kChunk * sizeof(float);  // ..., T; g, beta
  static constexpr size_t kBytes = kStages * kStageBytes + (K * kLdV + kChunk * kLdV) * sizeof(bf16)
                                   + kChunk * sizeof(float);
  unsigned char* base;
  __device__ bf16* k(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* y(int s) const { return k(s) + kChunk * kLdK; }  // V forwards, dO backwards
  __device__ bf16* T(int s) const { return y(s) + kChunk * kLdV; }
  __device__ float* g(int s) const { return reinterpret_cast<float*>(T(s) + kChunk * kLdC); }
  __device__ float* beta(int s) const { return g(s) + kChunk; }
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(beta(s) + kChunk); }  // backwards only
  __device__ bf16* local(int s) const { return q(s) + kChunk * kLdK; }                   // P^T dO, backwards only
  __device__ bf16* R() const { return reinterpret_cast<bf16*>(base + kStages * kStageBytes); }  // S or D+, bf16
  __device__ bf16* tile() const { return R() + K * kLdV; }
  __device__ float* G() const { return reinterpret_cast<float*>(tile() + kChunk * kLdV); }
};

// A barrier over one direction's 256 threads (named barrier 1 forwards, 2 backwards), so that the two directions
// can share a block without waiting on each other.
template <bool kReverse>
__device__ __forceinline__ void pass_barrier() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kReverse ? 2 : 1), "n"(kThreads) : "memory");
}

template <int K, int kStages, bool kReverse>
__device__ __forceinline__ void load_pass_chunk(const PassLayout<K, kStages, kReverse>& L, int s,
                                                const BackwardProblem& p, const Workspace& w, int b, int h, int c,
                                                int v0) {
  constexpr int kLdK = PassLayout<K, kStages, kReverse>::kLdK;
  const int t0 = c * kChunk;
  if (kReverse) cp_async_token_rows<K>(L.q(s), kLdK, p.q, p, b, h, t0, K, 0);
  cp_async_token_rows<K>(L.k(s), kLdK, p.k, p, b, h, t0, K, 0);
  cp_async_token_rows<kBlockV>(L.y(s), kLdV, kReverse ? p.do_ : p.v, p, b, h, t0, p.V, v0);
  if (kReverse)  // launch 2's P^T dO, which the adjoint pass overwrites with R once it has read it
    cp_async_value_block<kChunk>(L.local(s), w.corrections_adjoint + matrix_at(p, b, h, c) * kChunk * p.V + v0, p.V);
  const long long wy_row = static_cast<long long>(b) * chunk_count(p.T) + c;  // the forward's WY layout
  cp_async_tile<kThreads, kChunk, kChunk>(L.T(s), kLdC, w.wy + wy_row_tile_offset(chunk_rows(p.B, p.T, false), h, wy_row),
                                          kChunk);
  cp_async_token_scalars(L.g(s), p.g, p, b, h, t0);
  cp_async_token_scalars(L.beta(s), p.beta, p, b, h, t0);
}

// One direction's chain over the chunks, by 256 threads (the block, or one half of a paired block).
template <int K, int kStages, bool kReverse>
__device__ __forceinline__ void run_pass(const BackwardProblem& p, const Workspace& w, unsigned char* smem, int v0) {
  using Layout = PassLayout<K, kStages, kReverse>;
  constexpr int kLdK = Layout::kLdK;
  constexpr int kRowSharers = chunk_bwd::kRowSharers<K>, kStateTiles = chunk_bwd::kStateTiles<K>;
  static_assert(kRowSharers >= 1 && kStateTiles % 2 == 0, "K must be 64 or 128");

  const Layout L{smem};
  const int h = blockIdx.y, b = blockIdx.z, chunks = chunk_count(p.T);
  const int warp = (threadIdx.x >> 5) % kWarps;
  const int s_m0 = 16 * (warp / kRowSharers), s_n0 = 8 * kStateTiles * (warp % kRowSharers);
  const int m0 = 16 * (warp >> 1), n0 = 32 * (warp & 1);
  const long long head = (static_cast<long long>(b) * p.H + h) * K * p.V;
  float* G = L.G();

  load_pass_chunk<K, kStages, kReverse>(L, 0, p, w, b, h, kReverse ? chunks - 1 : 0, v0);
  cp_async_commit();
  float R[1][kStateTiles][4];
  load_state(R, kReverse ? p.dht : p.h0, head, p.V, v0, s_m0, s_n0, L.R(), kLdV);

  for (int n = 0; n < chunks; ++n) {
    const int s = kStages == 2 ? n & 1 : 0, c = kReverse ? chunks - 1 - n : n;
    if (kStages == 1 && n > 0) {
      pass_barrier<kReverse>();  // every read of the previous chunk is done
      load_pass_chunk<K, kStages, kReverse>(L, 0, p, w, b, h, c, v0);
      cp_async_commit();
    }
    cp_async_wait<0>();
    pass_barrier<kReverse>();  // chunk c and R's copy are on chip; every read of the other stage is done
    if (kStages == 2 && n + 1 < chunks)
      load_pass_chunk<K, kStages, kReverse>(L, s ^ 1, p, w, b, h, kReverse ? c - 1 : c + 1, v0);
    cp_async_commit();
    if (warp == 0) warp_chunk_cumsum(G, L.g(s), p.g != nullptr);
    const long long at = matrix_at(p, b, h, c);
    copy_out_rows((kReverse ? w.adjoints : w.states) + at * K * p.V + v0, p.V, L.R(), K);
    const float* beta = L.beta(s);

    if constexpr (!kReverse) {
      // X = diag(beta) (V - E K S), over V's rows (each thread rewrites the elements it reads)
      float ks[1][4][4];
      zero(ks);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(ks, L.k(s), kLdK, L.R(), kLdV, m0, n0, 0, K);
      pass_barrier<kReverse>();  // G is on chip
      bf16* X = L.y(s);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = m0 + acc_row(0, e), col = n0 + acc_col(j, e);
          const float decay = __expf(G[r]);
          const __nv_bfloat162 v2 = *reinterpret_cast<const __nv_bfloat162*>(X + r * kLdV + col);
          store_bf16x2(X + r * kLdV + col, beta[r] * (__low2float(v2) - decay * ks[0][j][e]),
                       beta[r] * (__high2float(v2) - decay * ks[0][j][e + 1]));
        }
      pass_barrier<kReverse>();  // X is complete
      // Delta = T X (T lower triangular: columns up to the tile's last row), stored; F Delta for the update
      float delta[1][4][4];
      zero(delta);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(delta, L.T(s), kLdC, X, kLdV, m0, n0, 0, m0 + 16);
      store_tile_bf16(delta, w.deltas + at * kChunk * p.V + v0, p.V, m0, n0);
      const float G_last = G[kChunk - 1];
      scale_rows(delta, m0, [&](int r) { return __expf(G_last - G[r]); });
      store_tile_bf16(delta, L.tile(), kLdV, m0, n0);
      pass_barrier<kReverse>();  // F Delta is complete; every read of R's copy is done
      // S+ = exp(G_L) S + K^T F Delta
      scale_tiles(R, __expf(G_last));
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(R, L.k(s), kLdK, L.tile(), kLdV, s_m0, s_n0,
                                                                       0, kChunk);
    } else {
      // dDelta = P^T dO + F K D+, P^T dO copied in (launch 2 formed it, chunk-parallel)
      float dd[1][4][4];
      zero(dd);
      warp_mma<1, 4, Stored::kRowMajor, Stored::kRowMajor>(dd, L.k(s), kLdK, L.R(), kLdV, m0, n0, 0, K);
      pass_barrier<kReverse>();  // G is on chip
      const float G_last = G[kChunk - 1];
      bf16* scaled_dO = L.y(s);  // scale E dO, over dO's rows (each thread rewrites the elements it reads)
      for (int i = group_thread(); i < kChunk * kBlockV / 8; i += kThreads) {
        const int j = i / (kBlockV / 8), col = (i % (kBlockV / 8)) * 8;
        float x[8];
        load8(scaled_dO + j * kLdV + col, x);
        const float wgt = p.scale * __expf(G[j]);
#pragma unroll
        for (int e = 0; e < 8; e += 2) store_bf16x2(scaled_dO + j * kLdV + col + e, wgt * x[e], wgt * x[e + 1]);
      }
      scale_rows(dd, m0, [&](int r) { return __expf(G_last - G[r]); });
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = m0 + acc_row(0, e), col = n0 + acc_col(j, e);
          const __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(L.local(s) + r * kLdV + col);
          store_bf16x2(L.tile() + r * kLdV + col, dd[0][j][e] + __low2float(x), dd[0][j][e + 1] + __high2float(x));
        }
      pass_barrier<kReverse>();  // dDelta and scale E dO are complete; every read of R's copy is done
      // R = T^T dDelta (T^T upper triangular: rows j >= i), stored; dv = diag(beta) R
      float ra[1][4][4];
      zero(ra);
      warp_mma<1, 4, Stored::kTransposed, Stored::kRowMajor>(ra, L.T(s), kLdC, L.tile(), kLdV, m0, n0, m0, kChunk);
      store_tile_bf16(ra, w.corrections_adjoint + at * kChunk * p.V + v0, p.V, m0, n0);
      scale_rows(ra, m0, [&](int r) { return beta[r]; });
      store_output_tile(ra, static_cast<bf16*>(p.dv), p.T, p.H, p.V, b, h, c * kChunk, v0, m0, n0, 1.0f);
      // D = exp(G_L) D+ + Q^T (scale E dO) - K^T (E diag(beta) R): the first two terms while the others read dDelta
      scale_tiles(R, __expf(G_last));
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(R, L.q(s), kLdK, scaled_dO, kLdV, s_m0, s_n0,
                                                                       0, kChunk);
      scale_rows(ra, m0, [&](int r) { return -__expf(G[r]); });
      pass_barrier<kReverse>();  // every read of dDelta is done: its tile takes -E diag(beta) R
      store_tile_bf16(ra, L.tile(), kLdV, m0, n0);
      pass_barrier<kReverse>();  // -E diag(beta) R is complete
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(R, L.k(s), kLdK, L.tile(), kLdV, s_m0, s_n0,
                                                                       0, kChunk);
    }
    store_state_copy(R, L.R(), kLdV, s_m0, s_n0);
  }
  if (kReverse && p.dh0) store_state(R, p.dh0, head, p.V, v0, s_m0, s_n0);
}

// Neither pass needs the other. Where the grid of both directions fits the card at one block per SM, blocks
// x < V / 64 run the states and the rest the adjoints, each with two chunk copies and an SM of its own.
template <int K>
__global__ void __launch_bounds__(kThreads, 1) delta_bwd_v2_passes(const BackwardProblem p, const Workspace w) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int value_blocks = p.V / kBlockV;
  if (static_cast<int>(blockIdx.x) < value_blocks) run_pass<K, 2, false>(p, w, smem, blockIdx.x * kBlockV);
  else run_pass<K, 2, true>(p, w, smem, (blockIdx.x - value_blocks) * kBlockV);
}

// Larger grids: one block of 16 warps per (batch, head, value block) runs both directions side by side, the
// states' 8 warps with one chunk copy, the adjoints' 8 (the longer chain) with two (213 KB at K = 128). The
// adjoints keep their prefetch, where two 8-warp blocks per SM would have left both with one copy, waited out
// every chunk (ncu, B=4, T=8192: ~7.2 us a chunk against ~4.1 with two copies).
template <int K>
__global__ void __launch_bounds__(2 * kThreads, 1) delta_bwd_v2_paired_passes(const BackwardProblem p,
                                                                              const Workspace w) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (threadIdx.x < kThreads) run_pass<K, 1, false>(p, w, smem, blockIdx.x * kBlockV);
  else run_pass<K, 2, true>(p, w, smem + PassLayout<K, 1, false>::kBytes, blockIdx.x * kBlockV);
}

// ---- launch 4: the gradients, one block of 16 warps per (chunk, head, batch) ----------------------------------
// The sums over value columns (dO S^T, Delta D+^T, R S^T, dO Delta^T, R Delta^T) accumulate in registers over
// the value blocks, two of which are on chip at a time (the next copied in while this one computes: 204 KB at
// K = 128, so one block per SM). Sixteen warps split every 64-row product four ways by columns (warp w: rows
// 16 (w / 4), column quarter w % 4), so each holds half the accumulators an 8-warp block would (128 registers),
// and the SM has twice the warps to hide the products' and copies' latency with (ncu, 8 warps: 12% occupancy,
// issue-bound at a third of the SM's throughput).
constexpr int kGradWarps = 16;
constexpr int kGradThreads = 32 * kGradWarps;
constexpr int kQuarters = kGradWarps / 4;  // column groups of a 64-row tile
using GradGateScratch = GateScratch<kQuarters, kGradWarps>;

template <int K>
struct GradLayout {
  static constexpr int kLdK = K + 8;
  static constexpr int kDbetaParts = 1 + 2 * kQuarters;  // sum_c V R; rowsum(E K * R_w) and of dA * (K K^T * M)
  static constexpr size_t kValueBytes = (4 * kChunk * kLdV + 2 * K * kLdV) * sizeof(bf16);  // V, dO, Delta, R; S, D+
  static constexpr size_t kBytes = (2 * kChunk * kLdK + 2 * kChunk * kLdC) * sizeof(bf16)  // Q, K; dS, dpair
                                   + 2 * kValueBytes
                                   + (3 + kDbetaParts) * kChunk * sizeof(float)  // g, G, beta; dbeta's parts
                                   + GradGateScratch::kBytes;
  unsigned char* base;
  __device__ bf16* q() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* k() const { return q() + kChunk * kLdK; }
  __device__ bf16* dS() const { return k() + kChunk * kLdK; }
  __device__ bf16* dpair() const { return dS() + kChunk * kLdC; }
  __device__ bf16* v(int s) const {
    return reinterpret_cast<bf16*>(reinterpret_cast<unsigned char*>(dpair() + kChunk * kLdC) + s * kValueBytes);
  }
  __device__ bf16* dO(int s) const { return v(s) + kChunk * kLdV; }
  __device__ bf16* delta(int s) const { return dO(s) + kChunk * kLdV; }
  __device__ bf16* ra(int s) const { return delta(s) + kChunk * kLdV; }  // R = T^T dDelta
  __device__ bf16* S(int s) const { return ra(s) + kChunk * kLdV; }
  __device__ bf16* D(int s) const { return S(s) + K * kLdV; }
  __device__ float* g() const { return reinterpret_cast<float*>(v(2)); }
  __device__ float* G() const { return g() + kChunk; }
  __device__ float* beta() const { return G() + kChunk; }
  __device__ float* dbeta_part(int i) const { return beta() + kChunk + i * kChunk; }  // i < kDbetaParts
  __device__ GradGateScratch gate_scratch() const {
    return {dbeta_part(kDbetaParts), dbeta_part(kDbetaParts) + kQuarters * kChunk};
  }
};

template <int K>
__device__ __forceinline__ void load_value_block(const GradLayout<K>& L, int s, const BackwardProblem& p,
                                                 const Workspace& w, int b, int h, int c, int v0) {
  const int t0 = c * kChunk;
  const long long at = matrix_at(p, b, h, c);
  cp_async_token_rows<kBlockV, kGradThreads>(L.v(s), kLdV, p.v, p, b, h, t0, p.V, v0);
  cp_async_token_rows<kBlockV, kGradThreads>(L.dO(s), kLdV, p.do_, p, b, h, t0, p.V, v0);
  cp_async_value_block<kChunk, kGradThreads>(L.delta(s), w.deltas + at * kChunk * p.V + v0, p.V);
  cp_async_value_block<kChunk, kGradThreads>(L.ra(s), w.corrections_adjoint + at * kChunk * p.V + v0, p.V);
  cp_async_value_block<K, kGradThreads>(L.S(s), w.states + at * K * p.V + v0, p.V);
  cp_async_value_block<K, kGradThreads>(L.D(s), w.adjoints + at * K * p.V + v0, p.V);
}

template <int K>
__global__ void __launch_bounds__(kGradThreads, 1) delta_bwd_v2_gradients(const BackwardProblem p, const Workspace w) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = GradLayout<K>::kLdK;
  constexpr int kKeyTiles = K / (8 * kQuarters);  // 8-column tiles of a warp's quarter of a 64 x K gradient
  constexpr int kRowThreads = kGradThreads / kChunk;  // threads per row in the sum of V * R
  const GradLayout<K> L{smem};
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t0 = c * kChunk;
  const int warp = threadIdx.x >> 5, quarter = warp % kQuarters;
  const int m0 = 16 * (warp / kQuarters), n0 = 16 * quarter, k0 = (K / kQuarters) * quarter;
  const bool below = n0 < m0 + 16;

  cp_async_token_rows<K, kGradThreads>(L.q(), kLdK, p.q, p, b, h, t0, K, 0);
  cp_async_token_rows<K, kGradThreads>(L.k(), kLdK, p.k, p, b, h, t0, K, 0);
  if (threadIdx.x < kThreads) {  // the first 256 threads (the helper's group)
    cp_async_token_scalars(L.g(), p.g, p, b, h, t0);
    cp_async_token_scalars(L.beta(), p.beta, p, b, h, t0);
  }
  load_value_block<K>(L, 0, p, w, b, h, c, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  float* G = L.G();
  const float* beta = L.beta();
  if (warp == 0) warp_chunk_cumsum(G, L.g(), p.g != nullptr);
  __syncthreads();
  const float G_last = G[kChunk - 1];

  float dP[1][2][4], dA[1][2][4], dq[1][kKeyTiles][4], dk_end[1][kKeyTiles][4], rs[1][kKeyTiles][4];
  zero(dP);
  zero(dA);
  zero(dq);
  zero(dk_end);
  zero(rs);
  float state_dot = 0.0f;  // this thread's part of <D+, S>
  float v_r = 0.0f;        // ... of row threadIdx.x / kRowThreads's sum of V * R, over its columns of each value block
  for (int v0 = 0, s = 0; v0 < p.V; v0 += kBlockV, s ^= 1) {
    const bool next = v0 + kBlockV < p.V;
    if (next) {
      if (v0 > 0) __syncthreads();  // every read of the value block before this one (in stage s ^ 1) is done
      load_value_block<K>(L, s ^ 1, p, w, b, h, c, v0 + kBlockV);
      cp_async_commit();
    }
    if (v0 > 0) {  // this value block's copy, issued one block earlier
      if (next) cp_async_wait<1>();
      else cp_async_wait<0>();
      __syncthreads();
    }
    if (p.g)
#pragma unroll
      for (int i = threadIdx.x; i < K * kBlockV / 8; i += kGradThreads) {
        const int r = i / (kBlockV / 8), col = (i % (kBlockV / 8)) * 8;
        float x[8], y[8];
        load8(L.S(s) + r * kLdV + col, x);
        load8(L.D(s) + r * kLdV + col, y);
#pragma unroll
        for (int e = 0; e < 8; ++e) state_dot = fmaf(x[e], y[e], state_dot);
      }
    {
      const int r = threadIdx.x / kRowThreads, col = (kBlockV / kRowThreads) * (threadIdx.x % kRowThreads);
#pragma unroll
      for (int part = 0; part < kBlockV / kRowThreads; part += 8) {
        float x[8], y[8];
        load8(L.v(s) + r * kLdV + col + part, x);
        load8(L.ra(s) + r * kLdV + col + part, y);
#pragma unroll
        for (int e = 0; e < 8; ++e) v_r = fmaf(x[e], y[e], v_r);
      }
    }
    if (below) {
      warp_mma<1, 2, Stored::kRowMajor, Stored::kTransposed>(dP, L.dO(s), kLdV, L.delta(s), kLdV, m0, n0, 0, kBlockV);
      warp_mma<1, 2, Stored::kRowMajor, Stored::kTransposed>(dA, L.ra(s), kLdV, L.delta(s), kLdV, m0, n0, 0, kBlockV);
    }
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(dq, L.dO(s), kLdV, L.S(s), kLdV, m0, k0, 0, kBlockV);
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(dk_end, L.delta(s), kLdV, L.D(s), kLdV, m0, k0, 0,
                                                                   kBlockV);
    warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kTransposed>(rs, L.ra(s), kLdV, L.S(s), kLdV, m0, k0, 0, kBlockV);
  }

  {  // dbeta's part sum_c V R, over the kRowThreads lanes of each row
    float x = v_r;
#pragma unroll
    for (int offset = 1; offset < kRowThreads; offset <<= 1) x += __shfl_xor_sync(kFullMask, x, offset);
    if (threadIdx.x % kRowThreads == 0) L.dbeta_part(0)[threadIdx.x / kRowThreads] = x;
  }
  {  // dA = -R Delta^T below the diagonal: dpair = diag(beta) dA * M, and dbeta's part rowsum(dA * (K K^T * M))
    float gram[1][2][4];
    zero(gram);
    if (below) warp_mma<1, 2, Stored::kRowMajor, Stored::kTransposed>(gram, L.k(), kLdK, L.k(), kLdK, m0, n0, 0, K);
    float top = 0.0f, bottom = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = m0 + acc_row(0, e), col = n0 + acc_col(j, e);
        float pair[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const float a = col + x < r ? -dA[0][j][e + x] * __expf(G[r] - G[col + x]) : 0.0f;  // dA * M
          (e < 2 ? top : bottom) += a * gram[0][j][e + x];
          pair[x] = beta[r] * a;
        }
        store_bf16x2(L.dpair() + r * kLdC + col, pair[0], pair[1]);
      }
    store_row_part(L.dbeta_part(1 + kQuarters + quarter), make_float2(top, bottom), m0);
  }
  scale_tiles(dP, p.scale);  // dS = scale (dO Delta^T) * M
  store_decayed_scores(dP, G, L.dS(), kLdC, m0, n0);
  __syncthreads();  // dS and dpair are complete

  // dq = scale E dO S^T + dS K   (tokens j <= i: row tiles up to m0)
  scale_rows(dq, m0, [&](int r) { return p.scale * __expf(G[r]); });
  warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kRowMajor>(dq, L.dS(), kLdC, L.k(), kLdK, m0, k0, 0, m0 + 16);
  store_output_tile(dq, static_cast<bf16*>(p.dq), p.T, p.H, K, b, h, t0, 0, m0, k0, 1.0f);

  // dk^B = diag(beta) E R_w + dpair K, with R_w = -R S^T; dbeta's part rowsum(E K * R_w)
  scale_tiles(rs, -1.0f);
  const float2 k_rw = row_dots(rs, L.k(), kLdK, m0, k0);
  store_row_part(L.dbeta_part(1 + quarter),
                 make_float2(k_rw.x * __expf(G[m0 + acc_row(0, 0)]), k_rw.y * __expf(G[m0 + acc_row(0, 2)])), m0);
  scale_rows(rs, m0, [&](int r) { return beta[r] * __expf(G[r]); });
  warp_mma<1, kKeyTiles, Stored::kRowMajor, Stored::kRowMajor>(rs, L.dpair(), kLdC, L.k(), kLdK, m0, k0, 0, m0 + 16);
  const float2 k_dk_b = row_dots(rs, L.k(), kLdK, m0, k0);
  // dk = dk^B + F Delta D+^T + dpair^T K + dS^T Q   (the transposed ones over tokens i >= j)
  scale_rows(dk_end, m0, [&](int r) { return __expf(G_last - G[r]); });
  const float k_dk_end = p.g ? tile_dot(dk_end, L.k(), kLdK, m0, k0) : 0.0f;
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) rs[0][j][e] += dk_end[0][j][e];
  warp_mma<1, kKeyTiles, Stored::kTransposed, Stored::kRowMajor>(rs, L.dpair(), kLdC, L.k(), kLdK, m0, k0, m0, kChunk);
  warp_mma<1, kKeyTiles, Stored::kTransposed, Stored::kRowMajor>(rs, L.dS(), kLdC, L.q(), kLdK, m0, k0, m0, kChunk);
  store_output_tile(rs, static_cast<bf16*>(p.dk), p.T, p.H, K, b, h, t0, 0, m0, k0, 1.0f);

  __syncthreads();  // dbeta's parts are complete
  if (threadIdx.x < kChunk && t0 + static_cast<int>(threadIdx.x) < p.T) {
    const int r = threadIdx.x;
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < GradLayout<K>::kDbetaParts; ++i) sum += L.dbeta_part(i)[r];
    p.dbeta[token_index(p, b, t0 + r, h)] = sum;
  }
  if (p.g) {  // dL/dG_s = q . dq - k . dk + 2 k . dk^B (dk^A = dk - dk^B)
    const float2 q_dq = row_dots(dq, L.q(), kLdK, m0, k0), k_dk = row_dots(rs, L.k(), kLdK, m0, k0);
    store_gate_gradient(L.gate_scratch(), p,
                        make_float2(q_dq.x - k_dk.x + 2.0f * k_dk_b.x, q_dq.y - k_dk.y + 2.0f * k_dk_b.y),
                        __expf(G_last) * state_dot + k_dk_end, b, h, t0, m0);
  }
}

template <int K>
void launch(const BackwardProblem& p, const Workspace& w) {
  launch_wy_prepare_blocked<wy_blocked::WaveProducts::kTensorCores>(forward_problem(p), w.wy, "delta_bwd_v2_wy_prepare");
  launch_checked(p, "delta_bwd_v2_local", delta_bwd_v2_local<K>, dim3(chunk_count(p.T), p.H, p.B), kThreads,
                 LocalLayout<K>::kBytes, w);
  const int value_blocks = p.V / kBlockV;
  if (2LL * value_blocks * p.H * p.B <= multiprocessor_count("delta_bwd_v2_passes"))
    launch_checked(p, "delta_bwd_v2_passes", delta_bwd_v2_passes<K>, dim3(2 * value_blocks, p.H, p.B), kThreads,
                   std::max(PassLayout<K, 2, false>::kBytes, PassLayout<K, 2, true>::kBytes), w);
  else
    launch_checked(p, "delta_bwd_v2_paired_passes", delta_bwd_v2_paired_passes<K>, dim3(value_blocks, p.H, p.B),
                   2 * kThreads, PassLayout<K, 1, false>::kBytes + PassLayout<K, 2, true>::kBytes, w);
  launch_checked(p, "delta_bwd_v2_gradients", delta_bwd_v2_gradients<K>, dim3(chunk_count(p.T), p.H, p.B),
                 kGradThreads, GradLayout<K>::kBytes, w);
}

void backward(const BackwardProblem& p) {
  constexpr const char* name = "delta_bwd_v2_chunked_wy_mma";
  check_tensor_core_backward(p, name, true, workspace_bytes(p.B, p.T, p.H, p.K, p.V, false), kBlockV);
  const Workspace w = carve(p.workspace, p.B, p.T, p.H, p.K, p.V);
  if (p.K == 64) launch<64>(p, w);
  else launch<128>(p, w);
}

}  // namespace

extern const Version delta_bwd_v2 = {
    "delta_bwd", 2, "chunked_wy_mma",
    "Chunks on bf16 tensor cores through the WY form: the forward's T and the scores' P^T dO per chunk, the "
    "chunk-boundary states and their adjoints by one pass each way (one launch), then every chunk's gradients in "
    "parallel as matrix products.",
    false, true, kTensorCoreShape, 80, workspace_bytes, nullptr, 0, nullptr, backward};

}  // namespace minilin
