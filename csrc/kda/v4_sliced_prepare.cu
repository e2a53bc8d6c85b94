// kda v4 (sliced prepare): v3 with its prepare kernel taken through the key channels 64 at a time, because ncu
// showed v3's prepare, 73% of v3's time at B = 4, T = 8192, H = 16, running one block of 8 warps per SM (its
// 155 KB of shared memory) with the scheduler idle half of the cycles: a quarter of the warps' samples waited at
// a barrier, most of them for the diagonal blocks' terms, 544 causal entries dealt to 256 threads (a third of the
// threads take three, the rest two).
//
// The sums over channels f split into sums over slices of 64 channels, and every per-channel quantity of a chunk
// (Gs, the decay table E, Qr, Kg, Ke, d, the rescaled rows of the sub-chunk pairs) depends on its own channel
// only, so one slice's q, k and g on chip are enough for its share of every output; P's and A's entries are summed
// across the slices in registers. Per slice (v3's steps 1-4 on 64 channels; v3's file has the algebra):
//   1. q, k, g rows of the slice on chip; Gs by running sums within each sub-chunk (gla/sub_chunks.cuh)
//   2. the diagonal 16 x 16 blocks of P and A term by term, four threads per causal entry, each 16 of the slice's
//      channels: 2176 (entry, quarter) items over 256 threads, 8.5 each instead of 2.1 entries (3 for a third), the
//      quarters' partial sums kept across slices and added by two shuffles at the end; E for the slice
//   3. Qr, Kg, Ke, d of the slice into the workspace, the rows of the pairs Q_ab, K_ab and k^ on chip
//   4. the 12 blocks below the diagonal on tensor cores, each warp's accumulators kept across slices
// then v3's step 5 (T = (I + A)^-1, T diag(beta) and P into the workspace). 93 KB of shared memory at any K, so two
// blocks per SM: one block's barriers and memory phases overlap the other's work. The pass over chunks is v3's
// (kda_prepared::launch_chunks), the workspace v3's (kda/prepared_tiles.cuh); outputs equal v3's up to the order of
// the fp32 sums of the diagonal blocks' terms.
#include "../common/chunk_tiles.cuh"
#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/sequences.cuh"
#include "../common/simt.cuh"
#include "../delta/wy_prepare_blocked.cuh"  // wy_blocked::solve_unit_lower, kLd
#include "../gla/sub_chunks.cuh"
#include "prepare_steps.cuh"
#include "prepared_tiles.cuh"

namespace minilin {
namespace {

using namespace gla_sub_chunks;  // kSub, kSubs, kPairs, pair_index, the decay table E, and the shared steps
using namespace kda_prepared;    // the workspace's tiles, v3's checks and pass over chunks
using bf16 = __nv_bfloat16;
using narrow::kThreads, narrow::kWarps, narrow::kLdC;
constexpr int kLdA = wy_blocked::kLd;  // fp32 rows of A and T (the solve's stride)
static_assert(wy_blocked::kThreads == kThreads, "the blocked solve runs on the block's 8 warps");

constexpr int kSlice = 64;                     // key channels on chip at a time
constexpr int kTerms = kSub * (kSub + 1) / 2;  // causal entries of a diagonal block: 136
constexpr int kHalf = kSub / 2;                // kda v6: the halves of a sub-chunk, 8 tokens each
constexpr int kHalfTerms = kHalf * (kHalf + 1) / 2;  // causal entries of an 8 x 8 triangle: 36
constexpr int kQuarters = 4;                   // threads per entry, each 16 of a slice's channels
// The entries taken term by term: v4 every causal entry of the 4 diagonal blocks (544); v6 (kHalves) only those of
// the 8 triangles (lo, lo) and (hi, hi) inside them (288), the (hi, lo) quarters being products (below).
template <bool kHalves>
constexpr int kEntries = kHalves ? kSubs * 2 * kHalfTerms : kSubs * kTerms;
template <bool kHalves>
constexpr int kItems = kEntries<kHalves> * kQuarters;  // (entry, quarter) items a slice: 2176 or 1152
template <bool kHalves>
constexpr int kRounds = (kItems<kHalves> + kThreads - 1) / kThreads;  // 9 or 5, the last for the first 128 threads
static_assert(kItems<false> % 32 == 0 && (kItems<false> % kThreads) % 32 == 0 && kItems<true> % 32 == 0 &&
                  (kItems<true> % kThreads) % 32 == 0, "each round's items fill whole warps");
// P's 6 blocks below the diagonal, then A's 6; v6 adds P's and A's (hi, lo) quarters, two sub-chunks per product.
template <bool kHalves>
constexpr int kProducts = 2 * kPairs + (kHalves ? 4 : 0);
constexpr int kProductsPerWarp = 2;
static_assert(kProducts<true> <= kProductsPerWarp * kWarps, "two products per warp at most");

template <bool kHalves>
struct SliceLayout {
  static constexpr int kLdK = kSlice + 8;  // bf16 rows of q, k and the pairs: 36 words, 8 rows on distinct banks
  static constexpr int kLdG = kSlice + 8;  // fp32 rows of g: 72 words, a half warp's 8-byte reads of 4 rows apart
  static constexpr int kHalfRows = kSubs * kHalf;  // 32: one half of every sub-chunk (v6's rescaled rows)
  static constexpr size_t kPairBytes = kPairs * kSub * kLdK * sizeof(bf16);
  static_assert(2 * kPairBytes >= kChunk * kLdA * sizeof(float), "T reuses the bytes of the pairs");
  static constexpr size_t kBytes = 2 * kChunk * kLdK * sizeof(bf16)    // q; k, then k^ in place
                                   + kChunk * kLdG * sizeof(float)     // g, then Gs
                                   + 2 * kPairBytes                    // Q_ab, K_ab (then T)
                                   + kChunk * kLdC * sizeof(bf16)      // P
                                   + kChunk * kLdA * sizeof(float)     // A
                                   + kDecays * kSlice * sizeof(float)  // E of the slice
                                   + kChunk * sizeof(float)            // beta
                                   + (kHalves ? 3 * kHalfRows * kLdK * sizeof(bf16) : 0);  // v6: QH, KH, KL
  unsigned char* base;
  __device__ bf16* q() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* k() const { return q() + kChunk * kLdK; }
  __device__ float* G() const { return reinterpret_cast<float*>(k() + kChunk * kLdK); }
  __device__ bf16* Qpair(int w) const { return reinterpret_cast<bf16*>(G() + kChunk * kLdG) + w * kSub * kLdK; }
  __device__ float* Tm() const { return reinterpret_cast<float*>(Qpair(0)); }  // over both pairs, after the slices
  __device__ bf16* Kpair(int w) const { return Qpair(kPairs) + w * kSub * kLdK; }
  __device__ bf16* P() const { return Kpair(kPairs); }
  __device__ float* A() const { return reinterpret_cast<float*>(P() + kChunk * kLdC); }
  __device__ float* E(int hi, int lo) const { return A() + kChunk * kLdA + decay_index(hi, lo) * kSlice; }
  __device__ float* beta() const { return A() + kChunk * kLdA + kDecays * kSlice; }
  // v6's rescaled halves, row 8 a + r for row r of sub-chunk a's half: QH = q exp(Gs - R_a) and KH = k exp(Gs - R_a)
  // of its tokens 8..15, KL = k exp(R_a - Gs) of its tokens 0..7, R_a = Gs at its token 7.
  __device__ bf16* QH() const { return reinterpret_cast<bf16*>(beta() + kChunk); }
  __device__ bf16* KH() const { return QH() + kHalfRows * kLdK; }
  __device__ bf16* KL() const { return KH() + kHalfRows * kLdK; }
};
static_assert(2 * (SliceLayout<true>::kBytes + 256 + 1024) <= 228 * 1024,  // 256: the entry table (fill_entry_table)
              "two prepare blocks per SM (compute capability 9.0)");

// Item idx of a round: the causal entry (i, j) (row i, column j of the chunk) of a diagonal block (v4) or of one of
// its two 8 x 8 triangles (v6: triangle h, rows and columns from 8 h), and its quarter.
struct DiagonalItem {
  int i, j, quarter;
  bool below;  // j < i: an entry of A (A's diagonal is zero)
};
template <bool kHalves>
constexpr int kBlockTerms = kHalves ? kHalfTerms : kTerms;  // causal entries of one triangle
template <bool kHalves>
constexpr int kBlockRows = kHalves ? kHalf : kSub;

// A triangle's entries row by row, (r << 4) | c a byte each: triangular_entry's square root and fix-ups, once per
// block instead of at every item of every slice (they drew ~7% of v6's prepare samples, whose items are short).
template <bool kHalves>
__device__ __forceinline__ void fill_entry_table(unsigned char* table) {
  for (int t = threadIdx.x; t < kBlockTerms<kHalves>; t += kThreads) {
    int r, c;
    triangular_entry(t, r, c);  // row by row, for a triangle of any size
    table[t] = static_cast<unsigned char>((r << 4) | c);
  }
}

template <bool kHalves>
__device__ __forceinline__ DiagonalItem diagonal_item(int idx, const unsigned char* entry_table) {
  constexpr int kTriangle = kBlockTerms<kHalves>, kRows = kBlockRows<kHalves>;
  const int entry = idx / kQuarters, block = entry / kTriangle;
  const int rc = entry_table[entry % kTriangle], r = rc >> 4, c = rc & 15;
  return {block * kRows + r, block * kRows + c, idx % kQuarters, c < r};
}

// Product u (< kProducts) for one warp, over the slice's channels, accumulated: P's pair u below the diagonal blocks
// (Q_ab k^_b^T) for u < kPairs, A's pair u - kPairs (K_ab k^_b^T, beta applied when stored) up to 2 kPairs; in v6
// then P's and A's (hi, lo) quarters of sub-chunks 2 s and 2 s + 1 (s = 0, 1): the 16 x 16 product of rows
// 16 s .. 16 s + 15 of QH (or KH) and KL, whose two diagonal 8 x 8 quadrants are the two sub-chunks' quarters.
template <bool kHalves>
__device__ __forceinline__ void block_product(int u, const SliceLayout<kHalves>& L, float (&acc)[1][2][4]) {
  constexpr int kLdK = SliceLayout<kHalves>::kLdK;
  if (kHalves && u >= 2 * kPairs) {
    const int s = (u - 2 * kPairs) % 2;
    const bf16* rows = u - 2 * kPairs < 2 ? L.QH() : L.KH();
    warp_mma<1, 2, Stored::kRowMajor, Stored::kTransposed>(acc, rows, kLdK, L.KL(), kLdK, 16 * s, 16 * s, 0, kSlice);
    return;
  }
  const int w = u < kPairs ? u : u - kPairs, b = pair_of(w).b;
  const bf16* rows = u < kPairs ? L.Qpair(w) : L.Kpair(w);
  warp_mma<1, 2, Stored::kRowMajor, Stored::kTransposed>(acc, rows, kLdK, L.k(), kLdK, 0, b * kSub, 0, kSlice);
}

// kHalves: kda v6's form of the diagonal blocks (the (hi, lo) quarter of each as products of rescaled halves);
// kTimesBeta false: the solve tile holds T, not T diag(beta) (kda_bwd v2).
template <int K, bool kHalves, bool kTimesBeta = true>
__global__ void __launch_bounds__(kThreads, 2) kda_v4_prepare(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = SliceLayout<kHalves>::kLdK, kLdG = SliceLayout<kHalves>::kLdG;
  constexpr int kRoundsHere = kRounds<kHalves>, kItemsHere = kItems<kHalves>, kProductsHere = kProducts<kHalves>;
  const SliceLayout<kHalves> L{smem};
  const ChunkOfBlock chunk = chunk_of_block(p);  // (common/sequences.cuh)
  if (!chunk.used) return;
  const int h = blockIdx.y;
  const SequenceRows seq = sequence_rows(p, chunk.b);
  const int t0 = chunk.n * kChunk;
  const PreparedTiles out = prepared_tiles<K>(p, h, seq.chunk0 + chunk.n);
  const int warp = threadIdx.x >> 5;
  bf16* q_s = L.q();
  bf16* k_s = L.k();
  float* G = L.G();
  float* A = L.A();
  const float* beta = L.beta();
  load_chunk_scalars(L.beta(), p.beta, p, seq, h, t0);  // visible after the first slice's barrier
  __shared__ unsigned char entry_table[kBlockTerms<kHalves>];
  fill_entry_table<kHalves>(entry_table);  // likewise

  float diag_p[kRoundsHere], diag_a[kRoundsHere];  // this thread's items' partial sums over the slices so far
  float lower[kProductsPerWarp][1][2][4];          // this warp's products (block_product)
#pragma unroll
  for (int r = 0; r < kRoundsHere; ++r) diag_p[r] = diag_a[r] = 0.0f;
#pragma unroll
  for (int u = 0; u < kProductsPerWarp; ++u) zero(lower[u]);

  for (int c0 = 0; c0 < K; c0 += kSlice) {
    if (c0 > 0) __syncthreads();  // the last slice's step 4 has read k^ and the pairs
    // 1. the slice's q, k (bf16) and g (fp32) on chip, zero past the sequence's end; Gs
    cp_async_qk_rows<K, kSlice>(q_s, k_s, kLdK, p, seq, h, t0, c0);
    cp_async_channel_gate_rows<K, kSlice>(G, kLdG, p, seq, h, t0, c0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    running_sums_within_sub_chunks<kSlice, kLdG, kThreads>(G);
    __syncthreads();

    // 2. the diagonal blocks' terms of the slice, quarter q of an entry taking channel pairs 4 m + q (m < 8), so
    //    that the four quarters read one 16-byte run of a row; then E
#pragma unroll
    for (int r = 0; r < kRoundsHere; ++r) {
      const int idx = threadIdx.x + r * kThreads;
      if (kItemsHere % kThreads != 0 && idx >= kItemsHere) break;  // warp-uniform: the last round is whole warps
      const DiagonalItem it = diagonal_item<kHalves>(idx, entry_table);
      const bf16* qi = q_s + it.i * kLdK;
      const bf16* ki = k_s + it.i * kLdK;
      const bf16* kj = k_s + it.j * kLdK;
      const float* Gi = G + it.i * kLdG;
      const float* Gj = G + it.j * kLdG;
      float acc_p = diag_p[r], acc_a = diag_a[r];
#pragma unroll
      for (int m = 0; m < kSlice / 8; ++m) {
        const int f = 8 * m + 2 * it.quarter;
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
      diag_p[r] = acc_p;
      diag_a[r] = acc_a;
    }
    fill_decays<kSlice, kLdG, kThreads>(G, L.E(0, 0));
    if constexpr (kHalves) {
      // v6: the rescaled halves, one row per warp and step (the branch warp-uniform), two channels per lane:
      // tokens 8..15 of sub-chunk a scaled by exp(Gs - R_a), tokens 0..7 by exp(R_a - Gs), R_a = Gs at token 7;
      // every exponent <= 0 (Gs falls along the sub-chunk), their product exp(Gs_i - Gs_j) for i >= 8 > j.
      for (int idx = threadIdx.x; idx < kChunk * kSlice / 2; idx += kThreads) {
        const int i = idx / (kSlice / 2), f = 2 * (idx % (kSlice / 2)), a = i / kSub, r = i % kSub;
        const float* R = G + (a * kSub + kHalf - 1) * kLdG + f;
        const float* Gi = G + i * kLdG + f;
        const int row = (a * kHalf + r % kHalf) * kLdK + f;
        if (r >= kHalf) {
          const float e0 = __expf(Gi[0] - R[0]), e1 = __expf(Gi[1] - R[1]);
          store_bf16x2(L.QH() + row, to_float(q_s[i * kLdK + f]) * e0, to_float(q_s[i * kLdK + f + 1]) * e1);
          store_bf16x2(L.KH() + row, to_float(k_s[i * kLdK + f]) * e0, to_float(k_s[i * kLdK + f + 1]) * e1);
        } else {
          const float e0 = __expf(R[0] - Gi[0]), e1 = __expf(R[1] - Gi[1]);
          store_bf16x2(L.KL() + row, to_float(k_s[i * kLdK + f]) * e0, to_float(k_s[i * kLdK + f + 1]) * e1);
        }
      }
    }
    __syncthreads();

    // 3. the slice's decayed operands (kda/prepare_steps.cuh): Qr, Kg, Ke, d into the workspace, Q_ab, K_ab and k^
    decayed_operands<K, kSlice, kLdK, kLdG, kThreads>(q_s, k_s, G, L.E(0, 0), L.Qpair(0), L.Kpair(0), out, c0);
    __syncthreads();

    // 4. the slice's share of the 12 products below the diagonal blocks (v6: and the 4 of the (hi, lo) quarters),
    //    warp w taking w and w + 8
#pragma unroll
    for (int u = 0; u < kProductsPerWarp; ++u)
      if (warp + u * kWarps < kProductsHere) block_product<kHalves>(warp + u * kWarps, L, lower[u]);
  }

  // The sums complete: the diagonal blocks' entries (the quarters added by shuffles within each group of four
  // lanes, the first lane storing), zeros above their diagonals, then the blocks below from the accumulators.
#pragma unroll
  for (int r = 0; r < kRoundsHere; ++r) {
    const int idx = threadIdx.x + r * kThreads;
    if (kItemsHere % kThreads != 0 && idx >= kItemsHere) break;
    float acc_p = diag_p[r], acc_a = diag_a[r];
    acc_p += __shfl_xor_sync(0xffffffffu, acc_p, 1);
    acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 1);
    acc_p += __shfl_xor_sync(0xffffffffu, acc_p, 2);
    acc_a += __shfl_xor_sync(0xffffffffu, acc_a, 2);
    const DiagonalItem it = diagonal_item<kHalves>(idx, entry_table);
    if (it.quarter == 0) {
      L.P()[it.i * kLdC + it.j] = __float2bfloat16_rn(acc_p);
      A[it.i * kLdA + it.j] = it.below ? beta[it.i] * acc_a : 0.0f;
    }
  }
  for (int idx = threadIdx.x; idx < kSubs * kSub * kSub; idx += kThreads) {
    const int a = idx / (kSub * kSub), r = (idx / kSub) % kSub, c = idx % kSub;
    if (c > r) {
      L.P()[(a * kSub + r) * kLdC + a * kSub + c] = __float2bfloat16_rn(0.0f);
      A[(a * kSub + r) * kLdA + a * kSub + c] = 0.0f;
    }
  }
#pragma unroll
  for (int u = 0; u < kProductsPerWarp; ++u) {
    const int product = warp + u * kWarps;
    if (product >= kProductsHere) continue;
    if (kHalves && product >= 2 * kPairs) {
      // v6's (hi, lo) quarters: the 16 x 16 tile's quadrant (r < 8, c < 8) is sub-chunk 2 s's, (r >= 8, c >= 8)
      // 2 s + 1's, each rows 8..15 and columns 0..7 of its diagonal block; the other two quadrants are discarded.
      const int s = (product - 2 * kPairs) % 2;
      const bool keys = product - 2 * kPairs >= 2;  // A's (beta K_H K_L^T) rather than P's (Q_H K_L^T)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = acc_row(0, e), c = acc_col(j, e);  // c, c + 1 in one quadrant (c even)
          if ((r < kHalf) != (c < kHalf)) continue;
          const int a = 2 * s + (r >= kHalf);
          const int row = a * kSub + kHalf + r % kHalf, col = a * kSub + c % kHalf;
          if (!keys) {
            store_bf16x2(L.P() + row * kLdC + col, lower[u][0][j][e], lower[u][0][j][e + 1]);
          } else {
            A[row * kLdA + col] = beta[row] * lower[u][0][j][e];
            A[row * kLdA + col + 1] = beta[row] * lower[u][0][j][e + 1];
          }
        }
      continue;
    }
    const auto [a, b] = pair_of(product < kPairs ? product : product - kPairs);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int row = a * kSub + acc_row(0, e), col = b * kSub + acc_col(j, e);
        if (product < kPairs) {
          store_bf16x2(L.P() + row * kLdC + col, lower[u][0][j][e], lower[u][0][j][e + 1]);
        } else {
          A[row * kLdA + col] = beta[row] * lower[u][0][j][e];
          A[row * kLdA + col + 1] = beta[row] * lower[u][0][j][e + 1];
        }
      }
  }
  __syncthreads();  // A and P complete; the pairs are dead, so T may take their bytes

  // 5. T = (I + A)^-1, then T diag(beta) and P into the workspace (kda/prepare_steps.cuh)
  solve_and_store<kLdC, kThreads, kTimesBeta>(A, L.Tm(), L.P(), beta, out, warp);
}

void forward(const Problem& p) {
  check_problem(p, "kda_v4_sliced_prepare");
  launch_sliced_prepare(p);
  launch_chunks(p);
}

template <bool kHalves, bool kTimesBeta>
void launch_prepare(const Problem& p) {
  require(p.K == 64 || p.K == 128 || (kHalves && kTimesBeta && p.K == 256), [&] {
    return "kda prepare: K must be 64 or 128 (256 in kda v10's form), got K=" + std::to_string(p.K);
  });
  auto kernel = p.K == 64 ? kda_v4_prepare<64, kHalves, kTimesBeta> : kda_v4_prepare<128, kHalves, kTimesBeta>;
  if constexpr (kHalves && kTimesBeta) {
    if (p.K == 256) kernel = kda_v4_prepare<256, true, true>;  // kda v10's (the slices make any K the same kernel)
  }
  launch_checked(p, kHalves ? "kda_v6_prepare" : "kda_v4_prepare", kernel, chunk_grid(p, p.H), kThreads,
                 SliceLayout<kHalves>::kBytes);
}

}  // namespace

void kda_prepared::launch_sliced_prepare(const Problem& p, bool halves, bool solve_times_beta) {
  if (!solve_times_beta) {
    require(halves, [] { return std::string("kda prepare: T without beta is built for the halves form only"); });
    launch_prepare<true, false>(p);
  } else {
    halves ? launch_prepare<true, true>(p) : launch_prepare<false, true>(p);
  }
}

extern const Version kda_v4 = {
    "kda", 4, "sliced_prepare",
    "v3 with its prepare taken through the key channels 64 at a time (the sums of P and A kept across the slices in "
    "registers, four threads per diagonal entry): 93 KB of shared memory instead of 155, two blocks per SM.",
    false, true, kTensorCoreShape, 90, kda_prepared::prepared_bytes, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
