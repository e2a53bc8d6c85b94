// kda v3 (prepared chunks, tensor cores): v2's chunked WY form with gla v4's split of the work, because v2 runs
// every product as fp32 multiply-adds on CUDA cores (7x slower than the token loop v1): everything that one chunk
// determines alone, including the WY solve, in a kernel parallel over every chunk of every head; the pass that must
// run chunk after chunk is only the state's four products on bf16 tensor cores, on tiles copied one chunk ahead.
//
// With v2's names (G the chunk-local cumulative gate, Gs its running sum within a 16-token sub-chunk, D_a a
// sub-chunk's total, E[hi][lo] the decay over sub-chunks lo .. hi-1, every exponent <= 0; token t of sub-chunk a,
// token j of sub-chunk b):
//     A_tj = beta_t sum_f k_tf k_jf exp(G_tf - G_jf)   j < t     the WY system's strictly lower part
//     P_tj = sum_f q_tf k_jf exp(G_tf - G_jf)           j <= t    the output's intra-chunk scores
//     T = (I + A)^-1,   Delta = T diag(beta) (V - Kg S),   Kg = k exp(G)
//     O = scale (Qr S + P Delta),   Qr = q exp(G)
//     S <- diag(d) S + Ke^T Delta,  Ke = k exp(G_C - G),  d = exp(G_C)
// Two kernels:
//   prepare, one block of 8 warps per (chunk, head): q, k, g and beta on chip, Gs (gla/sub_chunks.cuh); the
//     diagonal 16 x 16 blocks of A and P term by term on CUDA cores (one exponential per term and channel, shared by
//     the two); the blocks below them on tensor cores from the sub-chunk references (A's from k~ = k exp(Gs)
//     E[a][b+1], P's from q~ = q exp(Gs) E[a][b+1], both against k^ = k exp(D_b - Gs)); T by the delta prepare's
//     blocked solve (delta/wy_prepare_blocked.cuh, fp32); then into the workspace, per chunk row and head: Qr, Kg,
//     Ke [64, K] and P, T diag(beta) [64, 64] in bf16, d [K] in fp32.
//   chunks, one block of 8 warps per (batch, head, 64 value columns; kda v5: 32 where those fit the card at once),
//     sequential over chunks, the next chunk's tiles
//     and values copied while this one computes (gla v4's pipeline):
//       X = V - Kg S;   Delta = (T diag(beta)) X;   O = scale (Qr S + P Delta);   S <- diag(d) S + Ke^T Delta,
//     on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulators), S in fp32 registers across chunks (delta v3's
//     split) and read by the products through a bf16 copy in shared memory.
// A is summed in fp32 (its blocks below the diagonal from bf16-rounded decayed operands, as P's), the solve is fp32,
// and T diag(beta) is rounded to bf16 once, as delta's T is. bf16 inputs only, K = 64 or 128, V a multiple of 64;
// reads packed sequences and grouped heads (Problem). q and k arrive L2-normalized when the caller asked for it (the
// front's pre-pass). The chunk kernel's 193 KB of shared memory at K = 128 needs compute capability 9.0 (an 8.x SM
// gives a block at most 163 KB).
// The pass over chunks with kTransitions runs kda v9's first pass (v9_split_sequence.cu): the state alone, from
// [0 | I] over V + K columns, for the segments of a split sequence.
#include "../common/chunk_tiles.cuh"
#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/sequences.cuh"
#include "../common/simt.cuh"
#include "../common/split_segments.cuh"  // segment_row
#include "../delta/wy_prepare_blocked.cuh"  // wy_blocked::solve_unit_lower, kLd
#include "../gla/sub_chunks.cuh"
#include "prepare_steps.cuh"
#include "prepared_tiles.cuh"

namespace minilin {
namespace {

using namespace gla_sub_chunks;  // kSub, kSubs, kPairs, pair_index, the decay table E, and the shared steps
using namespace kda_prepared;    // the workspace's tiles
using bf16 = __nv_bfloat16;
using narrow::kWarps, narrow::kThreads, narrow::kBlockV, narrow::kLdC;  // common/chunk_tiles.cuh
constexpr int kLdA = wy_blocked::kLd;     // fp32 rows of A and T (the solve's stride)
static_assert(wy_blocked::kThreads == kThreads, "the blocked solve runs on the block's 8 warps");

// ---- prepare: one block per (chunk, head) -------------------------------------------------------------------------
template <int K>
struct PrepareLayout {
  static constexpr int kLdK = K + 8;      // bf16 rows of q, k and their decayed forms
  static constexpr int kLdG = K + 4;      // fp32 rows of g (16-byte rows for cp.async)
  static constexpr size_t kPairBytes = kPairs * kSub * kLdK * sizeof(bf16);
  static_assert(2 * kPairBytes >= kChunk * kLdA * sizeof(float), "T reuses the bytes of the pairs");
  static constexpr size_t kBytes = 2 * kChunk * kLdK * sizeof(bf16)  // q; k, then k^ in place
                                   + kChunk * kLdG * sizeof(float)   // g, then Gs
                                   + 2 * kPairBytes                  // Q_ab, K_ab (then T)
                                   + kChunk * kLdC * sizeof(bf16)    // P
                                   + kChunk * kLdA * sizeof(float)   // A
                                   + kDecays * K * sizeof(float)     // E
                                   + kChunk * sizeof(float);         // beta
  unsigned char* base;
  __device__ bf16* q() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* k() const { return q() + kChunk * kLdK; }
  __device__ float* G() const { return reinterpret_cast<float*>(k() + kChunk * kLdK); }
  __device__ bf16* Qpair(int w) const { return reinterpret_cast<bf16*>(G() + kChunk * kLdG) + w * kSub * kLdK; }
  __device__ float* Tm() const { return reinterpret_cast<float*>(Qpair(0)); }  // over both pairs, after their products
  __device__ bf16* Kpair(int w) const { return Qpair(kPairs) + w * kSub * kLdK; }
  __device__ bf16* P() const { return Kpair(kPairs); }
  __device__ float* A() const { return reinterpret_cast<float*>(P() + kChunk * kLdC); }
  __device__ float* E(int hi, int lo) const { return A() + kChunk * kLdA + decay_index(hi, lo) * K; }
  __device__ float* beta() const { return A() + kChunk * kLdA + kDecays * K; }
};

// A's block (a, b) below the diagonal on tensor cores, for one warp: beta_t (K_ab k^_b^T)_tj into fp32 rows of A.
template <int K, int kLdK>
__device__ __forceinline__ void key_pair_product(int pair, const bf16* k_pair, const bf16* k_hat, const float* beta,
                                                 float* A) {
  const auto [a, b] = pair_of(pair);
  float acc[1][2][4];
  zero(acc);
  warp_mma<1, 2, Stored::kRowMajor, Stored::kTransposed>(acc, k_pair, kLdK, k_hat, kLdK, 0, b * kSub, 0, K);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = a * kSub + acc_row(0, e);
      A[r * kLdA + b * kSub + acc_col(j, e)] = beta[r] * acc[0][j][e];
    }
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) kda_v3_prepare(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = PrepareLayout<K>::kLdK, kLdG = PrepareLayout<K>::kLdG;
  const PrepareLayout<K> L{smem};
  const ChunkOfBlock chunk = chunk_of_block(p);  // (common/sequences.cuh)
  if (!chunk.used) return;
  const int h = blockIdx.y;
  const SequenceRows seq = sequence_rows(p, chunk.b);
  const int t0 = chunk.n * kChunk;
  const PreparedTiles out = prepared_tiles<K>(p, h, seq.chunk0 + chunk.n);
  const int warp = threadIdx.x >> 5;

  // 1. q, k (bf16), g (fp32) and beta on chip, zero past the sequence's end; Gs by a running sum per sub-chunk
  cp_async_qk_rows<K>(L.q(), L.k(), kLdK, p, seq, h, t0);
  cp_async_channel_gate_rows<K>(L.G(), kLdG, p, seq, h, t0);
  cp_async_commit();
  load_chunk_scalars(L.beta(), p.beta, p, seq, h, t0);
  cp_async_wait<0>();
  __syncthreads();
  const bf16* q_s = L.q();
  bf16* k_s = L.k();
  float* G = L.G();
  float* A = L.A();
  const float* beta = L.beta();
  running_sums_within_sub_chunks<K, kLdG, kThreads>(G);
  __syncthreads();

  // 2. the diagonal blocks of P and A term by term, one causal entry (r, c) of a block per thread, the exponential
  //    of each term shared by the two sums; zeros above the diagonal (and on it, for A); then E
  constexpr int kTerms = kSub * (kSub + 1) / 2;
  for (int idx = threadIdx.x; idx < kSubs * kTerms; idx += kThreads) {
    const int a = idx / kTerms;
    int r, c;
    triangular_entry(idx % kTerms, r, c);
    const int i = a * kSub + r, j = a * kSub + c;
    const bf16* qi = q_s + i * kLdK;
    const bf16* ki = k_s + i * kLdK;
    const bf16* kj = k_s + j * kLdK;
    const float* Gi = G + i * kLdG;
    const float* Gj = G + j * kLdG;
    float acc_p = 0.0f, acc_a = 0.0f;
    for (int f = 0; f < K; f += 2) {
      const float2 q2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(qi + f));
      const float2 ki2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(ki + f));
      const float2 kj2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(kj + f));
      const float2 gi = *reinterpret_cast<const float2*>(Gi + f);
      const float2 gj = *reinterpret_cast<const float2*>(Gj + f);
      const float ex = __expf(gi.x - gj.x), ey = __expf(gi.y - gj.y);
      acc_p = fmaf(q2.x * kj2.x, ex, acc_p);
      acc_p = fmaf(q2.y * kj2.y, ey, acc_p);
      acc_a = fmaf(ki2.x * kj2.x, ex, acc_a);
      acc_a = fmaf(ki2.y * kj2.y, ey, acc_a);
    }
    L.P()[i * kLdC + j] = __float2bfloat16_rn(acc_p);
    A[i * kLdA + j] = c < r ? beta[i] * acc_a : 0.0f;
  }
  for (int idx = threadIdx.x; idx < kSubs * kSub * kSub; idx += kThreads) {
    const int a = idx / (kSub * kSub), r = (idx / kSub) % kSub, c = idx % kSub;
    if (c > r) {
      L.P()[(a * kSub + r) * kLdC + a * kSub + c] = __float2bfloat16_rn(0.0f);
      A[(a * kSub + r) * kLdA + a * kSub + c] = 0.0f;
    }
  }
  fill_decays<K, kLdG, kThreads>(G, L.E(0, 0));
  __syncthreads();

  // 3. the decayed operands (kda/prepare_steps.cuh)
  decayed_operands<K, K, kLdK, kLdG, kThreads>(q_s, k_s, G, L.E(0, 0), L.Qpair(0), L.Kpair(0), out, 0);
  __syncthreads();

  // 4. the blocks below the diagonal: P's 6 and A's 6 on tensor cores, 12 products over the 8 warps
  for (int w = warp; w < 2 * kPairs; w += kWarps) {
    if (w < kPairs) pair_products<K, kLdK, kLdC>(w, L.Qpair(w), k_s, L.P());
    else key_pair_product<K, kLdK>(w - kPairs, L.Kpair(w - kPairs), k_s, beta, A);
  }
  __syncthreads();  // A complete; the pairs are dead, so T may take their bytes

  // 5. T = (I + A)^-1, then T diag(beta) and P into the workspace (kda/prepare_steps.cuh)
  solve_and_store<kLdC, kThreads>(A, L.Tm(), L.P(), beta, out, warp);
}

// ---- chunks: one block per (batch, head, kColumns value columns: 64, or kda v5's 32), chunk after chunk --------
template <int K, int kColumns = kBlockV, int kStateCopies = 1>
struct ChunkLayout {
  static constexpr int kLdV = kColumns + 8;  // bf16 rows of v, S, X and Delta: 16 bytes of padding
  static constexpr int kLdK = K + 8;
  static constexpr int kStages = 2;
  static constexpr size_t kStageBytes = 3 * kChunk * kLdK * sizeof(bf16)  // Qr, Kg, Ke
                                        + 2 * kChunk * kLdC * sizeof(bf16)  // P, T diag(beta)
                                        + kChunk * kLdV * sizeof(bf16)      // v
                                        + K * sizeof(float);                // d
  static constexpr size_t kBytes = kStages * kStageBytes + kStateCopies * K * kLdV * sizeof(bf16)  // + S (bf16)
                                   + 2 * kChunk * kLdV * sizeof(bf16);                             // + X, Delta
  unsigned char* base;
  __device__ bf16* Qr(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* Kg(int s) const { return Qr(s) + kChunk * kLdK; }
  __device__ bf16* Ke(int s) const { return Kg(s) + kChunk * kLdK; }
  __device__ bf16* P(int s) const { return Ke(s) + kChunk * kLdK; }
  __device__ bf16* Tb(int s) const { return P(s) + kChunk * kLdC; }
  __device__ bf16* v(int s) const { return Tb(s) + kChunk * kLdC; }
  __device__ float* decay(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ bf16* S(int c = 0) const { return reinterpret_cast<bf16*>(base + kStages * kStageBytes) + c * K * kLdV; }
  __device__ bf16* X() const { return S(kStateCopies); }
  __device__ bf16* delta() const { return X() + kChunk * kLdV; }
};
static_assert(ChunkLayout<128, kBlockV, 2>::kBytes <= 227 * 1024 && ChunkLayout<128, 32, 2>::kBytes <= ChunkLayout<128>::kBytes,
              "the chunks kernel's shared memory (compute capability 9.0)");
// kda v5's choice of width reads v3's resident count (narrow_chunks_blocks_per_sm): one block per SM at either K, its
// smallest layout (ChunkLayout<64, 32>) being 116 KB; v7's are v3's layouts and v8's larger, so the count is theirs.
static_assert(ChunkLayout<64, 32>::kBytes > 227 * 1024 / 2, "narrow_chunks_blocks_per_sm speaks for every rung");

// Chunk n's prepared tiles and value columns [v0, v0 + kColumns) into stage s (values past the sequence's end zero).
// kTransitions (kda v9's first pass) reads no Qr or P, and a block carrying the identity (`identity`) no values.
template <int K, int kColumns, int kStateCopies, bool kTransitions = false>
__device__ __forceinline__ void copy_chunk(const ChunkLayout<K, kColumns, kStateCopies>& L, int s, const Problem& p,
                                           const SequenceRows& seq, int h, int n, int v0, bool identity = false) {
  constexpr int kLdK = ChunkLayout<K, kColumns>::kLdK, kLdV = ChunkLayout<K, kColumns>::kLdV;
  const PreparedTiles in = prepared_tiles<K>(p, h, seq.chunk0 + n);
  const int t0 = n * kChunk;
  if constexpr (!kTransitions) cp_async_tile<kThreads, kChunk, K>(L.Qr(s), kLdK, in.qr, K);
  cp_async_tile<kThreads, kChunk, K>(L.Kg(s), kLdK, in.kg, K);
  cp_async_tile<kThreads, kChunk, K>(L.Ke(s), kLdK, in.ke, K);
  if constexpr (!kTransitions) cp_async_tile<kThreads, kChunk, kChunk>(L.P(s), kLdC, in.scores, kChunk);
  cp_async_tile<kThreads, kChunk, kChunk>(L.Tb(s), kLdC, in.solve, kChunk);
  if (!identity) cp_async_value_tile<kThreads, kColumns>(L.v(s), kLdV, p, seq, h, t0, v0);
  cp_async_tile<kThreads, 1, K>(L.decay(s), K, in.decay, K);
  cp_async_commit();
}

// kRung: the version whose order of work the pass takes, each keeping v3's order of sums per output element, so
// outputs are v3's bit for bit:
//   3   v3's;
//   7   kda v7: Qr S in X's k loop beside Kg S, both reading each S fragment once, and the chunk's last two products
//       (P Delta, Ke^T Delta) in unrolled loops free to interleave;
//   8   kda v8: v7 with two bf16 copies of S, chunk n reading copy n % 2 and writing the next one, so the barrier
//       before the copy's write goes: three barriers a chunk instead of four, the next chunk's tiles copied after
//       the chunk's first barrier (the one that also says every warp is done with chunk n - 1).
// kTransitions (kda v9's first pass, v9_split_sequence.cu; rung 8's order): the state alone, no Qr S, P Delta or
// outputs. blockIdx.z counts the first `segments` - 1 segments of every sequence of p (the [B P, T / P] view), and
// blockIdx.x runs over V + K columns: the first V / kColumns blocks take v from zero, the rest carry the identity's
// columns with v = 0, so each block's final state is its columns of [L_p | A_p], stored into `transitions`
// [B (P - 1), H, K, V + K].
template <int K, int kColumns, int kRung, bool kTransitions = false>
__global__ void __launch_bounds__(kThreads, 1) kda_v3_chunks(const Problem p, float* transitions, int segments) {
  extern __shared__ __align__(16) unsigned char smem[];
  static_assert(!kTransitions || kRung == 8, "the transitions form follows rung 8's order of work");
  constexpr bool kOutputWithMemory = kRung >= 7 && !kTransitions, kTwoStateCopies = kRung >= 8;
  constexpr int kCopies = kTwoStateCopies ? 2 : 1;
  using Layout = ChunkLayout<K, kColumns, kCopies>;
  constexpr int kLdK = Layout::kLdK, kLdV = Layout::kLdV;
  constexpr int kStateTiles = narrow::kStateTiles<K, kColumns>;  // the state split (narrow::warp_tiles)
  constexpr int NT = narrow::kTileNT<kColumns>;                  // 8-column tiles of a warp's tile of X, Delta, O

  const Layout L{smem};
  const int H = p.H, V = p.V;
  const int v0 = blockIdx.x * kColumns, h = blockIdx.y;
  const int b = kTransitions ? segment_row(blockIdx.z, segments) : blockIdx.z;
  const bool identity = kTransitions && v0 >= V;  // this block's columns carry the identity, with v = 0
  const SequenceRows seq = sequence_rows(p, b);
  const int chunks = chunk_count(seq.length);
  const int warp = threadIdx.x >> 5;
  const auto [m0, n0, s_m0, s_n0] = narrow::warp_tiles<K, kColumns>(warp);  // this warp's tile of X, Delta and O, and of S

  float S[1][kStateTiles][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  if (identity) load_identity_state(S, v0 - V, s_m0, s_n0, L.S(0), kLdV);
  else load_state(S, kTransitions ? nullptr : p.h0, state_base, V, v0, s_m0, s_n0, L.S(0), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  if (chunks > 0) copy_chunk<K, kColumns, kCopies, kTransitions>(L, 0, p, seq, h, 0, v0, identity);
  for (int n = 0; n < chunks; ++n) {
    const int s = n & 1;
    const bf16* S_copy = L.S(kTwoStateCopies ? s : 0);  // S entering chunk n, in bf16
    if constexpr (kTwoStateCopies) {
      cp_async_wait<0>();
      __syncthreads();  // stage s and S's copy s visible; every warp is past chunk n - 1, so stage s ^ 1 is free
      if (n + 1 < chunks)
        copy_chunk<K, kColumns, kCopies, kTransitions>(L, s ^ 1, p, seq, h, n + 1, v0, identity);
    } else {
      // The other stage was last read in chunk n - 1, before its closing barrier.
      if (n + 1 < chunks) {
        copy_chunk(L, s ^ 1, p, seq, h, n + 1, v0);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // stage s, and the bf16 copy of S written after chunk n - 1, visible to every warp
    }

    float out[1][NT][4];  // O's tile, scale (Qr S + P Delta) once complete
    zero(out);
    {  // X = V - Kg S (what the memory mispredicts), in bf16
      float acc[1][NT][4];
      zero(acc);
      if constexpr (kOutputWithMemory)
        warp_mma_shared_b<NT, Stored::kRowMajor, K / 16>(acc, out, L.Kg(s), L.Qr(s), kLdK, S_copy, kLdV, m0, n0);
      else
        warp_mma<1, NT, Stored::kRowMajor, Stored::kRowMajor>(acc, L.Kg(s), kLdK, S_copy, kLdV, m0, n0, 0, K);
      const bf16* v_s = L.v(s);
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e);
          const float2 v2 = identity ? make_float2(0.0f, 0.0f)
                                     : __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v_s + r * kLdV + c));
          store_bf16x2(L.X() + r * kLdV + c, v2.x - acc[0][j][e], v2.y - acc[0][j][e + 1]);
        }
    }
    __syncthreads();
    {  // Delta = (T diag(beta)) X, lower triangular: this warp's rows need X's rows up to its diagonal block
      float acc[1][NT][4];
      zero(acc);
      warp_mma<1, NT, Stored::kRowMajor, Stored::kRowMajor>(acc, L.Tb(s), kLdC, L.X(), kLdV, m0, n0, 0, m0 + 16);
      store_tile_bf16(acc, L.delta(), kLdV, m0, n0);
    }
    __syncthreads();
    // O = scale (Qr S + P Delta); P is 0 above the diagonal, so P Delta stops at this warp's diagonal block.
    // S <- diag(d) S + Ke^T Delta in registers.
    const float* decay = L.decay(s);
    if constexpr (kTransitions) {
#pragma unroll
      for (int j = 0; j < kStateTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[0][j][e] *= decay[s_m0 + acc_row(0, e)];
      warp_mma_unrolled<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor, kChunk / 16>(
          S, L.Ke(s), kLdK, L.delta(), kLdV, s_m0, s_n0, 0);
    } else if constexpr (kOutputWithMemory) {
#pragma unroll
      for (int j = 0; j < kStateTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[0][j][e] *= decay[s_m0 + acc_row(0, e)];
      warp_mma_unrolled<1, NT, Stored::kRowMajor, Stored::kRowMajor, kChunk / 16>(out, L.P(s), kLdC, L.delta(), kLdV,
                                                                                  m0, n0, 0, m0 / 16 + 1);
      warp_mma_unrolled<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor, kChunk / 16>(
          S, L.Ke(s), kLdK, L.delta(), kLdV, s_m0, s_n0, 0);
      store_output_tile(out, o, seq, H, V, h, n * kChunk, v0, m0, n0, p.scale);
    } else {
      warp_mma<1, NT, Stored::kRowMajor, Stored::kRowMajor>(out, L.Qr(s), kLdK, S_copy, kLdV, m0, n0, 0, K);
      warp_mma<1, NT, Stored::kRowMajor, Stored::kRowMajor>(out, L.P(s), kLdC, L.delta(), kLdV, m0, n0, 0, m0 + 16);
      store_output_tile(out, o, seq, H, V, h, n * kChunk, v0, m0, n0, p.scale);
#pragma unroll
      for (int j = 0; j < kStateTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[0][j][e] *= decay[s_m0 + acc_row(0, e)];
      warp_mma<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor>(S, L.Ke(s), kLdK, L.delta(), kLdV, s_m0, s_n0,
                                                                       0, kChunk);
    }
    if constexpr (kTwoStateCopies) {
      store_state_copy(S, L.S(s ^ 1), kLdV, s_m0, s_n0);  // copy s ^ 1 was last read in chunk n - 1
    } else {
      __syncthreads();  // every read of the bf16 copy of S, of X, Delta and of stage s is done
      store_state_copy(S, L.S(0), kLdV, s_m0, s_n0);
    }
  }

  if constexpr (kTransitions)
    store_state(S, transitions, (static_cast<long long>(blockIdx.z) * H + h) * K * (V + K), V + K, v0, s_m0, s_n0);
  else
    store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

void forward(const Problem& p) {
  check_problem(p, "kda_v3_prepared_chunks");
  launch_checked(p, "kda_v3_prepare", p.K == 64 ? kda_v3_prepare<64> : kda_v3_prepare<128>, chunk_grid(p, p.H),
                 kThreads, p.K == 64 ? PrepareLayout<64>::kBytes : PrepareLayout<128>::kBytes);
  launch_chunks(p);
}

template <int K, int kColumns, int kRung>
void launch_chunks_k(const Problem& p) {
  constexpr const char* kName = kRung == 8 ? "kda_v8_chunks" : kRung == 7 ? "kda_v7_chunks" : "kda_v3_chunks";
  launch_checked(p, kName, kda_v3_chunks<K, kColumns, kRung>, dim3(p.V / kColumns, p.H, p.B), kThreads,
                 ChunkLayout<K, kColumns, kRung >= 8 ? 2 : 1>::kBytes, static_cast<float*>(nullptr), 0);
}

template <int K, int kColumns>
void launch_transitions_k(const Problem& view, float* transitions, int segments) {
  const dim3 grid((view.V + view.K) / kColumns, view.H, view.B / segments * (segments - 1));
  launch_checked(view, "kda_v9_transitions", kda_v3_chunks<K, kColumns, 8, true>, grid, kThreads,
                 ChunkLayout<K, kColumns, 2>::kBytes, transitions, segments);
}

template <int kRung>
void launch_chunks_of(const Problem& p, int columns) {
  if (columns == 32) p.K == 64 ? launch_chunks_k<64, 32, kRung>(p) : launch_chunks_k<128, 32, kRung>(p);
  else p.K == 64 ? launch_chunks_k<64, kBlockV, kRung>(p) : launch_chunks_k<128, kBlockV, kRung>(p);
}

}  // namespace

void kda_prepared::check_problem(const Problem& p, const char* name) {
  check_tensor_core_problem(p, name, true, kBlockV);
  require_channel_gate(p, name);
  const size_t needed = prepared_bytes(p.B, p.T, p.H, p.K, p.V, p.cu_seqlens != nullptr);
  require_workspace(p, name, needed);
}

void kda_prepared::launch_chunks(const Problem& p, int columns, int rung) {
  require(columns == 32 || columns == kBlockV, [&] {
    return "kda_v3_chunks: a value block of 32 or 64 columns, got " + std::to_string(columns);
  });
  require(rung == 3 || rung == 7 || rung == 8, [&] {
    return "kda_v3_chunks: the order of work of kda v3, v7 or v8 (rung 3, 7 or 8), got " + std::to_string(rung);
  });
  if (rung == 8) launch_chunks_of<8>(p, columns);
  else if (rung == 7) launch_chunks_of<7>(p, columns);
  else launch_chunks_of<3>(p, columns);
}

void kda_prepared::launch_transitions(const Problem& view, int columns, float* transitions, int segments) {
  require(columns == 32 || columns == kBlockV, [&] {
    return "kda_v9_transitions: a value block of 32 or 64 columns, got " + std::to_string(columns);
  });
  if (columns == 32)
    view.K == 64 ? launch_transitions_k<64, 32>(view, transitions, segments)
                 : launch_transitions_k<128, 32>(view, transitions, segments);
  else
    view.K == 64 ? launch_transitions_k<64, kBlockV>(view, transitions, segments)
                 : launch_transitions_k<128, kBlockV>(view, transitions, segments);
}

int kda_prepared::narrow_chunks_blocks_per_sm(int K) {
  const auto kernel = K == 64 ? kda_v3_chunks<64, 32, 3> : kda_v3_chunks<128, 32, 3>;
  const size_t smem = K == 64 ? ChunkLayout<64, 32>::kBytes : ChunkLayout<128, 32>::kBytes;
  const char* name = "kda_v3_chunks";
  return resident_blocks(kernel, kThreads, smem, name);
}

extern const Version kda_v3 = {
    "kda", 3, "prepared_chunks",
    "v2's chunked WY form with gla v4's split: the chunk-local work (scores, decayed operands, the WY solve) in a "
    "kernel parallel over every chunk, the pass over chunks only the state's products on bf16 tensor cores, one "
    "chunk's tiles copied ahead.",
    false, true, kTensorCoreShape, 90, kda_prepared::prepared_bytes, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
