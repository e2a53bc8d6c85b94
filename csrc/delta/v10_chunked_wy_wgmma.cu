// delta v10 (wgmma, sm_90a): v9's WY step with the chunk's products on Hopper warpgroup tensor cores, one or two
// warpgroups per product at N = 64 or 32, and a producer warpgroup, because v9's chunk kernel (~480 of its ~595
// us at T = 8192, the rest its WY step) is one ldmatrix -> mma.sync chain per SM in which each 16 x 16 warp tile
// reloads its fragments (~380 KB of shared-memory reads per chunk). wgmma reads its operands from shared memory
// without ldmatrix or registers and issues a whole k loop at once.
// Measured on the H200 (device time, ladder run): 0.464 ms at T = 8192 against v9's 0.595 and v1's 4.684 (10.1x),
// 1.825 ms at 32768 (10.2x); outputs bit-identical to v9's (the same fp32 operations in the same order). What each
// choice below is worth was measured (csrc/NOTES.md): the wgmma descriptors are built once per chunk (from a pointer
// at every k-step they cost ~14 instructions per wgmma); products are split by roles at N = 64 / 32, not into
// 16-column slices (an m64n16k16 reads a 2 KB A tile for 8 cycles of math: 0.619 ms, slower than v9); the
// producer's copy walk is unrolled by 8, not fully (a spill at ptxas's 96-register cap starves the consumers);
// four producer warps, not one (0.524 against 0.542 ms); Q S in phase 2 and ftz exponentials (0.465 against 0.526).
//
// One block per (sequence, head, 64 value columns; packed sequences and grouped value heads read in place through
// common/sequences.cuh, the WY prepare's too): 4 compute warpgroups (warps 0-15) and a producer warpgroup
// (warps 16-19: q; k; v and T's tile; G = cumsum(g) and beta) that fills a ring of 3 stages, q, k and T in the
// 128-byte-swizzled layout wgmma reads (common/wgmma.cuh). The state is kept transposed, S^T [64 value rows, K],
// in the fp32 registers of warpgroups 2 and 3 (key columns 0 .. K/2 - 1 and K/2 .. K - 1), with a bf16 copy in
// shared memory. Per chunk, after a barrier over the 16 compute warps before each phase:
//   phase 1:  0: KS = K S (n64), X = diag(beta) (V - diag(exp G) KS)
//             2, 3: Q K^T's columns 0-31 / 32-63 (n32), P = Q K^T * exp(G_i - G_j) causal
//   phase 2:  1: R = diag(exp G) Q S (n64, kept in registers until phase 3)
//             0, 3: Delta = T X's columns 0-31 / 32-63 (n32), and Delta decayed, diag(exp(G_last - G)) Delta
//   phase 3:  1: O = R + P Delta (n64), stored
//             2, 3: S^T <- exp(G_last) S^T + (Delta decayed)^T K on their key columns (A from registers)
// The same kernel with kTransitions runs v12's first pass (v12_split_sequence.cu): the state alone (no q, P, R or
// O), over the V value columns from zero and K more from the identity with v = 0, the segment's final state into
// v12's workspace; the launches v12 shares with v10 are in namespace delta_wgmma at the end of this file.
#include "../common/producer.cuh"
#include "../common/split_segments.cuh"  // segment_row
#include "../common/wgmma.cuh"
#include "../common/wgmma_chunk.cuh"
#include "chunk_wy_mma_wide.cuh"  // delta_wide::check_problem, workspace_bytes
#include "wy_prepare_blocked.cuh"

namespace minilin {
namespace {

using bf16 = __nv_bfloat16;
using wide::kBlockV;
using wide::kLdV;
using namespace producer_block;  // the block (16 compute warps + the producer), the ring's kStages and its waits
using namespace wgmma_chunk;     // the swizzled copies, exp_ftz, the transposed state's loads and stores

// Shared memory, from a 1024-byte boundary (the swizzled atoms'): per stage q and k (64 x K, swizzled), T's
// tile (64 x 64, swizzled), v (64 x 64, rows padded to kLdV for the epilogue's reads), G and beta; then the
// block's S^T copy (64 x K), P, X, Delta and Delta decayed (64 x 64 each, swizzled), and the ring's barriers.
template <int K>
struct Layout {
  static constexpr int kTile = kChunk * kChunk;  // elements of a 64 x 64 tile
  static constexpr size_t kStageBytes =
      round_up_1024((2 * kChunk * K + kTile + kChunk * kLdV) * sizeof(bf16) + 2 * kChunk * sizeof(float));
  static constexpr size_t kBlockOffset = kStages * kStageBytes;
  static constexpr size_t kBarrierOffset = kBlockOffset + (kBlockV * K + 4 * kTile) * sizeof(bf16);
  static constexpr size_t kBytes = kBarrierOffset + 2 * kStages * sizeof(uint64_t) + 1024;  // + alignment slack
  static_assert(kBytes <= 227 * 1024, "three stages must fit in an H100/H200 SM's shared memory");
  static_assert(kStageBytes % 1024 == 0 && kChunk * K * sizeof(bf16) % 1024 == 0 && kTile * sizeof(bf16) % 1024 == 0 &&
                    kBlockOffset % 1024 == 0 && kBlockV * K * sizeof(bf16) % 1024 == 0,
                "every swizzled tile (q, k, T, S^T, P, X, Delta) must start on a 1024-byte boundary");
  unsigned char* base;  // 1024-byte aligned
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * K; }
  __device__ bf16* wy(int s) const { return k(s) + kChunk * K; }
  __device__ bf16* v(int s) const { return wy(s) + kTile; }
  __device__ float* G(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ float* beta(int s) const { return G(s) + kChunk; }
  __device__ bf16* ST() const { return reinterpret_cast<bf16*>(base + kBlockOffset); }
  __device__ bf16* P() const { return ST() + kBlockV * K; }
  __device__ bf16* X() const { return P() + kTile; }
  __device__ bf16* delta() const { return X() + kTile; }
  __device__ bf16* delta_decayed() const { return delta() + kTile; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + s; }
  __device__ uint64_t* empty(int s) const { return full(kStages) + s; }
};

// The producer: v8's (chunk_wy_producer.cuh) over a warpgroup instead of one warp, one warp per sub-partition,
// because one warp copying q, k, v and T swizzled (~970 instructions per chunk) fell behind the warpgroups'
// faster chunk. Producer warp 0 copies q, 1 k, 2 v and T's tile (each lane's copies arrive on `full` when they
// land), 3 the gates' cumulative sum and the betas (then its lane 0 arrives): 3 x 32 + 1 arrivals.
constexpr int kProducerWarps = 4, kCopyingWarps = 3;
[[maybe_unused]] constexpr int kScalarWarp = kCopyingWarps;  // the gates-and-betas warp (unused without sm_90a)
constexpr int kBlockThreads = kComputeThreads + 32 * kProducerWarps;
// kTransitions (v12's first pass): no q, and no v for the identity's columns (v0 >= V).
template <int K, bool kTransitions>
__device__ void produce(const Layout<K>& L, const Problem& p, const bf16* wy, const SequenceRows& seq, int h, int v0,
                        int chunks, int producer_warp) {
  const int lane = threadIdx.x & 31, qk_heads = qk_heads_of(p);
  const long long token_stride = p.H;
  auto first_token = [&](int n) { return (seq.first + n * kChunk) * p.H + h; };
  auto valid_tokens = [&](int n) { return n < chunks ? min(kChunk, seq.length - n * kChunk) : 0; };
  if (producer_warp == kScalarWarp) {
    float2 gates = producer_token_pair(p.g, first_token(0), token_stride, valid_tokens(0), lane);
    float2 betas = producer_token_pair(p.beta, first_token(0), token_stride, valid_tokens(0), lane);
    for (int n = 0; n < chunks; ++n) {
      const int s = n % kStages;
      wait_empty(L, n);
      producer_store_scalars(L, s, gates, betas,
                             producer_token_pair(p.g, first_token(n + 1), token_stride, valid_tokens(n + 1), lane),
                             producer_token_pair(p.beta, first_token(n + 1), token_stride, valid_tokens(n + 1), lane),
                             lane);
    }
    return;
  }
  const int qk_head = qk_head_of(p, h);
  for (int n = 0; n < chunks; ++n) {
    const int s = n % kStages, valid = valid_tokens(n);
    const long long first_qk = (seq.first + n * kChunk) * qk_heads + qk_head;
    wait_empty(L, n);
    if (producer_warp == 0) {
      if (!kTransitions)
        producer_copy_rows_sw128<K>(L.q(s), static_cast<const bf16*>(p.q) + first_qk * K, qk_heads * K, valid, lane);
    } else if (producer_warp == 1) {
      producer_copy_rows_sw128<K>(L.k(s), static_cast<const bf16*>(p.k) + first_qk * K, qk_heads * K, valid, lane);
    } else {
      if (!kTransitions || v0 < p.V)
        producer_copy_rows<kBlockV>(L.v(s), kLdV, static_cast<const bf16*>(p.v) + first_token(n) * p.V + v0,
                                    token_stride * p.V, valid, lane);
      producer_copy_rows_sw128<kChunk>(L.wy(s), wy + wy_tile_offset(p, seq, h, n), kChunk, kChunk, lane);
    }
    cp_async_arrive(L.full(s));  // a lane without copies arrives at once
  }
}

// kTransitions: this thread's slice of S^T for the identity's columns c0.. (S[f][V + c] = 1 where f = c), and its
// bf16 copy.
template <int NT>
__device__ __forceinline__ void load_identity_transposed(float (&S)[1][NT][4], int c0, int m0, int f0, bf16* ST) {
  for_each_state_pair<NT>(0, 0, 0, m0, f0, [&](int j, int e, int row, int col, long long) {
    S[0][j][e] = col == c0 + row ? 1.0f : 0.0f;
    S[0][j][e + 1] = col + 1 == c0 + row ? 1.0f : 0.0f;
    store_bf16x2_sw128(ST, kBlockV, row, col, S[0][j][e], S[0][j][e + 1]);
  });
}

// The warpgroups, named by their phase-1 role (the header's table gives every phase's).
enum Group : int { kKeys = 0, kQueries = 1, kScoresLow = 2, kScoresHigh = 3 };

// kTransitions (v12's first pass): blockIdx.z counts the first `segments` - 1 segments of every sequence of p (the
// [B P, T / P] view), blockIdx.x the V value columns' blocks and then the identity's K / 64; the final state goes to
// transitions [B (P - 1), H, K, V + K] (L_p, then A_p).
template <int K, bool kTransitions>
__global__ void __launch_bounds__(kBlockThreads, 1)
    delta_chunked_wy_wgmma(const Problem p, const bf16* wy, float* transitions, int segments) {
#if MINILIN_WGMMA
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kKeySteps = K / 16, kTokenSteps = kChunk / 16;
  constexpr int kStateNT = K / 2 / 8;  // 8-column tiles of S^T per state warpgroup (2 and 3)

  const Layout<K> L{align_1024(smem)};
  const int H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y;
  const int b = kTransitions ? segment_row(blockIdx.z, segments) : blockIdx.z;
  const bool identity = kTransitions && v0 >= V;  // this block's columns carry the identity, with v = 0
  const SequenceRows seq = sequence_rows(p, b);
  const int chunks = ceil_div(seq.length, kChunk);
  const int warp = threadIdx.x >> 5;
  init_ring(L, kCopyingWarps);
  if (warp >= kComputeWarps) {
    produce<K, kTransitions>(L, p, wy, seq, h, v0, chunks, warp - kComputeWarps);
    return;  // the compute warps meet on their own named barrier from here on
  }

  // The warpgroup index from lane 0: the compiler then knows it is warp-uniform and keeps the descriptors,
  // which depend on it, in uniform registers (as CUTLASS's canonical_warp_group_idx).
  const int group = __shfl_sync(kFullMask, warp >> 2, 0);
  const int m0 = 16 * (warp & 3);
  const bool holds_state = group >= kScoresLow;
  const int half_col = 32 * (group - kScoresLow), f0 = (K / 2) * (group - kScoresLow);  // warpgroups 2 and 3
  const int delta_col = group == kKeys ? 0 : 32;                                          // warpgroups 0 and 3
  // One register array holds warpgroup 1's R = Q S (64 x 64, phases 2 and 3) or a state warpgroup's half of S^T
  // (64 x K / 2): the 96 registers a 640-thread block gets leave no room for both.
  float held[1][8][4];
  auto& R = held;
  auto& S = reinterpret_cast<float(&)[1][kStateNT][4]>(held);
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  if (holds_state) {
    if (identity) load_identity_transposed(S, v0 - V, m0, f0, L.ST());
    else load_state_transposed(S, kTransitions ? nullptr : p.h0, state_base, V, v0, m0, f0, L.ST());
  }
  fence_async_shared();

  bf16* o = static_cast<bf16*>(p.o);
  bf16 *const ST = L.ST(), *const P = L.P(), *const X = L.X(), *const delta = L.delta();
  bf16* const delta_decayed = L.delta_decayed();
  constexpr uint64_t kTileMN = mn_major_bits(kChunk);
  const uint64_t ST_rows = sw128_descriptor(ST, kKMajorBits);  // B^T = S^T for K S and Q S
  const uint64_t P_rows = sw128_descriptor(P, kKMajorBits);
  const uint64_t X_cols = sw128_descriptor(X, kTileMN);
  const uint64_t delta_cols = sw128_descriptor(delta, kTileMN);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n % kStages, t0 = n * kChunk;
    wait_full(L, n);
    fence_async_shared();  // the producer's copies, now visible to this thread, also to its wgmma reads
    named_barrier_sync(kComputeBarrier, kComputeThreads);  // S's copy is whole; chunk n - 1 read P and Delta
    const bf16* v = L.v(stage);
    const float *G = L.G(stage), *beta = L.beta(stage);
    const uint64_t q_rows = sw128_descriptor(L.q(stage), kKMajorBits);
    const uint64_t k_rows = sw128_descriptor(L.k(stage), kKMajorBits);
    // k-step s of the operands phases 1 and 2 share: Q or K as A, and S^T as B^T (K S and Q S).
    const auto queries = [&](int s) { return q_rows + k_major_offset(16 * s, kChunk); };
    const auto keys = [&](int s) { return k_rows + k_major_offset(16 * s, kChunk); };
    const auto state_rows = [&](int s) { return ST_rows + k_major_offset(16 * s, kBlockV); };

    // Phase 1.
    if (group == kKeys) {  // X = diag(beta) (V - diag(exp G) K S)
      float KS[1][8][4];
      wgmma_ss_product<false, kKeySteps>(KS, keys, state_rows, false);
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = m0 + acc_row(0, e);
        const float decay = exp_ftz(G[r]), beta_r = beta[r];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int c = acc_col(j, e);
          const float2 v2 = identity ? make_float2(0.0f, 0.0f)
                                     : __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v + r * kLdV + c));
          store_bf16x2(X + sw128_thread_offset(kChunk, m0, c) + (e ? kLowerHalf : 0),
                       beta_r * (v2.x - decay * KS[0][j][e]), beta_r * (v2.y - decay * KS[0][j][e + 1]));
        }
      }
    } else if (!kTransitions && group != kQueries) {  // P's columns half_col..: (Q K^T) exp(G_i - G_j), j <= i, else 0
      float QK[1][4][4];
      const auto keys_from_half = [&](int s) { return keys(s) + row_offset(half_col); };  // B^T: K's rows half_col..
      wgmma_ss_product<false, kKeySteps>(QK, queries, keys_from_half, false);
      store_decayed_scores_half(QK, P, G, m0, half_col);
    }
    fence_async_shared();
    named_barrier_sync(kComputeBarrier, kComputeThreads);

    // Phase 2: Delta = T X's columns delta_col.., and Delta decayed to the chunk's end; R = diag(exp G) Q S
    // (S's copy changes only in phase 3; here warpgroup 1 would otherwise wait, and phase 1's tensor cores have
    // one product fewer to serve).
    const float G_last = G[kChunk - 1];
    if (group == kQueries) {
      if (!kTransitions) {
        wgmma_ss_product<false, kKeySteps>(R, queries, state_rows, false);
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const float decay = exp_ftz(G[m0 + acc_row(0, e)]);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            R[0][j][e] *= decay;
            R[0][j][e + 1] *= decay;
          }
        }
      }
    } else if (group == kKeys || group == kScoresHigh) {
      const uint64_t T_rows = sw128_descriptor(L.wy(stage), kKMajorBits);
      float D[1][4][4];
      wgmma_ss_product<true, kTokenSteps>(
          D, [&](int s) { return T_rows + k_major_offset(16 * s, kChunk); },
          [&](int s) { return X_cols + mn_major_offset(16 * s, delta_col, kChunk); }, false);
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const float d = exp_ftz(G_last - G[m0 + acc_row(0, e)]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int at = sw128_thread_offset(kChunk, m0, delta_col + acc_col(j, e)) + (e ? kLowerHalf : 0);
          if (!kTransitions) store_bf16x2(delta + at, D[0][j][e], D[0][j][e + 1]);  // only O reads it
          store_bf16x2(delta_decayed + at, d * D[0][j][e], d * D[0][j][e + 1]);
        }
      }
    }
    fence_async_shared();
    named_barrier_sync(kComputeBarrier, kComputeThreads);

    // Phase 3.
    if (group == kQueries) {  // O = R + P Delta
      if (!kTransitions) {
        wgmma_ss_product<true, kTokenSteps>(
            R, [&](int s) { return P_rows + k_major_offset(16 * s, kChunk); },
            [&](int s) { return delta_cols + mn_major_offset(16 * s, 0, kChunk); }, true);
        store_output_tile(R, o, seq, H, V, h, t0, v0, m0, 0, p.scale);
      }
    } else if (holds_state) {  // S^T <- exp(G_last) S^T + (Delta decayed)^T K, on key columns f0..
      const uint64_t k_cols = sw128_descriptor(L.k(stage), kTileMN) + mn_major_offset(0, f0, kChunk);
      unsigned a[kTokenSteps][4];  // A = (Delta decayed)^T: ldmatrix.trans of the swizzled tile
#pragma unroll
      for (int s = 0; s < kTokenSteps; ++s) sw128_load_a_transposed(a[s], delta_decayed, kChunk, m0, 16 * s);
      update_state_transposed(S, a, k_cols, exp_ftz(G_last), ST, m0, f0);
    }
    release_stage(L, n);
  }

  if (holds_state) {
    if (kTransitions)
      store_state_transposed(S, transitions, (static_cast<long long>(blockIdx.z) * H + h) * K * (V + K), V + K, v0, m0,
                             f0);
    else
      store_state_transposed(S, p.ht, state_base, V, v0, m0, f0);
  }
#else
  __trap();  // compiled without sm_90a features: forward() refuses to launch this (require_sm90a)
#endif
}

}  // namespace

// The launches v12 shares with v10 (v12_split_sequence.cu declares them): the WY prepare, the chunk pass, and the
// chunk pass's kTransitions form over the [B P, T / P] view `view` (`segments` = P).
namespace delta_wgmma {

void prepare(const Problem& p, bf16* wy) {
  launch_wy_prepare_blocked<wy_blocked::WaveProducts::kTensorCores>(p, wy, "delta_v10_wy_prepare_tensor_solve");
}

void chunk_pass(const Problem& p, const bf16* wy) {
  launch_per_value_block(p, "delta_v10_chunked_wy_wgmma", kBlockV, kBlockThreads, delta_chunked_wy_wgmma<64, false>,
                         Layout<64>::kBytes, delta_chunked_wy_wgmma<128, false>, Layout<128>::kBytes, wy,
                         static_cast<float*>(nullptr), 0);
}

void transitions_pass(const Problem& view, const bf16* wy, float* transitions, int segments) {
  const dim3 grid((view.V + view.K) / kBlockV, view.H, view.B / segments * (segments - 1));
  if (view.K == 64)
    launch_checked(view, "delta_v12_transitions", delta_chunked_wy_wgmma<64, true>, grid, kBlockThreads,
                   Layout<64>::kBytes, wy, transitions, segments);
  else
    launch_checked(view, "delta_v12_transitions", delta_chunked_wy_wgmma<128, true>, grid, kBlockThreads,
                   Layout<128>::kBytes, wy, transitions, segments);
}

}  // namespace delta_wgmma

namespace {

void forward(const Problem& p) {
  const std::string name = "delta_v10_chunked_wy_wgmma";
  delta_wide::check_problem(p, name);
  require_sm90a(name);
  auto* wy = static_cast<bf16*>(p.workspace);
  delta_wgmma::prepare(p, wy);
  delta_wgmma::chunk_pass(p, wy);
}

}  // namespace

extern const Version delta_v10 = {
    "delta", 10, "chunked_wy_wgmma",
    "v9 with the chunk's products on Hopper warpgroup tensor cores (wgmma, sm_90a), one or two warpgroups per product, fed by a producer warpgroup: v9's chunk was one ldmatrix -> mma.sync chain per SM. 22% less time than v9 on an H200.",
    false, true, kTensorCoreShape, 90, delta_wide::workspace_bytes, forward, 90, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
