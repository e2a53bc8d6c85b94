// linear v10 (wgmma, sm_90a): v8 with its chunk pass on Hopper warpgroup tensor cores, because v7's chunk kernel
// is one ldmatrix -> mma.sync chain per SM in which each 16 x 16 warp tile reloads its fragments, as delta v9's
// was before delta v10 moved it to wgmma (22% less time there). The chunk is delta v10's without the WY step
// (T = I, beta = 1, no K S): two phases, two barriers a chunk, as v7.
//
// One block per (sequence, head, 64 value columns; packed sequences and grouped value heads read in place through
// common/sequences.cuh): 4 compute warpgroups (warps 0-15) and a producer warpgroup (warps 16-19: q; k; v; G =
// cumsum(g)) that fills a ring of 3 stages, q, k and v in the 128-byte-swizzled layout wgmma reads
// (common/wgmma.cuh). The state is kept transposed, S^T [64 value rows, K], in the fp32 registers of warpgroups 2
// and 3 (key columns 0 .. K/2 - 1 and K/2 .. K - 1), with a bf16 copy in shared memory (common/wgmma_chunk.cuh).
// Per chunk (CONVENTIONS.md's recurrence S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t; G the
// cumulative log-gate inside the chunk, G_last its total), after a barrier over the 16 compute warps before each
// phase:
//   phase 1:  0, 1: R = diag(exp G) Q S on value columns 0-31 / 32-63 (n32, kept in registers)
//             2, 3: P = (Q K^T) * exp(G_i - G_j), j <= i, on its columns 0-31 / 32-63 (n32)
//   phase 2:  0, 1: O = R + P V on their value columns (n32), stored
//             2, 3: S^T <- exp(G_last) S^T + V^T diag(exp(G_last - G)) K on their key columns (n64 at K = 128),
//                   A = V^T by ldmatrix.trans, each token's decay applied to the fragments in registers
// Where few (batch, head) pairs leave SMs idle (one long sequence), the chunk pass runs on segments of each
// sequence as v8 splits it (split_sequence.cuh), P chosen by v8's cost model with this kernel's chunk time.
//
// Measured on the H100 (device time, 5 alternating rounds, bf16, an initial state; the output's error against
// float64 the same as v8's, 2.35e-3): 0.273 ms against v7's 0.376 and v8's 0.374 at B = 4, T = 8192, H = 16, K = V = 128 (27% less); 0.454
// against v8's 0.556 at one sequence of 32768 (both split in 4), 0.543 against 0.748 at B = 1, T = 8192, H = 96.
#include "../common/producer.cuh"
#include "../common/wgmma_chunk.cuh"
#include "chunk_mma_wide.cuh"  // linear_wide::check_problem
#include "split_sequence.cuh"

namespace minilin {
namespace linear_wgmma {
namespace {

using bf16 = __nv_bfloat16;
using wide::kBlockV;
using namespace producer_block;  // the block (16 compute warps + the producer), the ring's kStages and its waits
using namespace wgmma_chunk;     // the swizzled copies, exp_ftz, the transposed state's loads and stores

constexpr const char* kName = "linear_v10_chunked_wgmma";

// Shared memory, from a 1024-byte boundary (the swizzled atoms'): per stage q and k (64 x K), v (64 x 64), all
// swizzled, and G; then the block's S^T copy (64 x K) and P (64 x 64), swizzled, and the ring's barriers.
template <int K>
struct Layout {
  static constexpr int kTile = kChunk * kChunk;  // elements of a 64 x 64 tile
  static constexpr size_t kStageBytes = round_up_1024((2 * kChunk * K + kChunk * kBlockV) * sizeof(bf16) +
                                                      kChunk * sizeof(float));
  static constexpr size_t kBlockOffset = kStages * kStageBytes;
  static constexpr size_t kBarrierOffset = kBlockOffset + (kBlockV * K + kTile) * sizeof(bf16);
  static constexpr size_t kBytes = kBarrierOffset + 2 * kStages * sizeof(uint64_t) + 1024;  // + alignment slack
  static_assert(kBytes <= 227 * 1024, "three stages must fit in an H100/H200 SM's shared memory");
  static_assert(kStageBytes % 1024 == 0 && kChunk * K * sizeof(bf16) % 1024 == 0 && kTile * sizeof(bf16) % 1024 == 0 &&
                    kBlockOffset % 1024 == 0 && kBlockV * K * sizeof(bf16) % 1024 == 0,
                "every swizzled tile (q, k, v, S^T, P) must start on a 1024-byte boundary");
  unsigned char* base;  // 1024-byte aligned
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * K; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * K; }
  __device__ float* G(int s) const { return reinterpret_cast<float*>(v(s) + kTile); }
  __device__ bf16* ST() const { return reinterpret_cast<bf16*>(base + kBlockOffset); }
  __device__ bf16* P() const { return ST() + kBlockV * K; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + s; }
  __device__ uint64_t* empty(int s) const { return full(kStages) + s; }
};

// The producer warpgroup, one warp per sub-partition as delta v10's: warp 0 copies q, 1 k, 2 v (each lane's copies
// arrive on `full` when they land), 3 the gates' cumulative sum (then its lane 0 arrives): 3 x 32 + 1 arrivals.
constexpr int kProducerWarps = 4, kCopyingWarps = 3;
[[maybe_unused]] constexpr int kScalarWarp = kCopyingWarps;  // the gates' warp (unused without sm_90a)
constexpr int kBlockThreads = kComputeThreads + 32 * kProducerWarps;

template <int K>
__device__ void produce(const Layout<K>& L, const Problem& p, const SequenceRows& seq, int h, int v0, int chunks,
                        int producer_warp) {
  const int lane = threadIdx.x & 31;
  const long long token_stride = p.H;  // consecutive tokens of one head, in rows of the [B, T, H, .] tensors
  auto first_token = [&](int n) { return (seq.first + n * kChunk) * p.H + h; };
  auto valid_tokens = [&](int n) { return n < chunks ? min(kChunk, seq.length - n * kChunk) : 0; };
  if (producer_warp == kScalarWarp) {  // chunk n + 1's gates are read while chunk n's cumulative sum is stored
    float2 gates = producer_token_pair(p.g, first_token(0), token_stride, valid_tokens(0), lane);
    for (int n = 0; n < chunks; ++n) {
      const int s = n % kStages;
      wait_empty(L, n);
      const float2 next = producer_token_pair(p.g, first_token(n + 1), token_stride, valid_tokens(n + 1), lane);
      store_chunk_cumsum(L.G(s), gates.x, gates.y);
      gates = next;
      __syncwarp();
      if (lane == 0) mbarrier_arrive(L.full(s));
    }
    return;
  }
  const int qk_heads = qk_heads_of(p), qk_head = qk_head_of(p, h);
  for (int n = 0; n < chunks; ++n) {
    const int s = n % kStages, valid = valid_tokens(n);
    const long long first_qk = (seq.first + n * kChunk) * qk_heads + qk_head;
    wait_empty(L, n);
    if (producer_warp == 0)
      producer_copy_rows_sw128<K>(L.q(s), static_cast<const bf16*>(p.q) + first_qk * K, qk_heads * K, valid, lane);
    else if (producer_warp == 1)
      producer_copy_rows_sw128<K>(L.k(s), static_cast<const bf16*>(p.k) + first_qk * K, qk_heads * K, valid, lane);
    else
      producer_copy_rows_sw128<kBlockV>(L.v(s), static_cast<const bf16*>(p.v) + first_token(n) * p.V + v0,
                                        token_stride * p.V, valid, lane);
    cp_async_arrive(L.full(s));  // a lane without copies arrives at once
  }
}

// A bf16 pair (an A fragment's register: the lower column in the low half) times (lo, hi), rounded to bf16.
__device__ __forceinline__ unsigned scale_bf16x2(unsigned x, float lo, float hi) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  const __nv_bfloat162 y = __floats2bfloat162_rn(f.x * lo, f.y * hi);
  return *reinterpret_cast<const unsigned*>(&y);
}

// The warpgroups, named by their phase-1 role (the header's table gives both phases').
enum Group : int { kOutputLow = 0, kOutputHigh = 1, kScoresLow = 2, kScoresHigh = 3 };

template <int K>
__global__ void __launch_bounds__(kBlockThreads, 1) linear_chunked_wgmma(const Problem p) {
#if MINILIN_WGMMA
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kKeySteps = K / 16, kTokenSteps = kChunk / 16;
  constexpr int kStateNT = K / 2 / 8;  // 8-column tiles of S^T per state warpgroup (2 and 3)

  const Layout<K> L{align_1024(smem)};
  const int H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, b);
  const int chunks = ceil_div(seq.length, kChunk);
  const int warp = threadIdx.x >> 5;
  init_ring(L, kCopyingWarps);
  if (warp >= kComputeWarps) {
    produce<K>(L, p, seq, h, v0, chunks, warp - kComputeWarps);
    return;  // the compute warps meet on their own named barrier from here on
  }

  // The warpgroup index from lane 0: the compiler then knows it is warp-uniform and keeps the descriptors,
  // which depend on it, in uniform registers (as CUTLASS's canonical_warp_group_idx).
  const int group = __shfl_sync(kFullMask, warp >> 2, 0);
  const int m0 = 16 * (warp & 3);
  const bool holds_state = group >= kScoresLow;
  const int half_col = 32 * (group & 1);                  // O's (groups 0, 1) or P's (2, 3) columns half_col..
  const int f0 = (K / 2) * (group - kScoresLow);          // the state's key columns f0.. (groups 2, 3)
  // One register array holds an output warpgroup's R (64 x 32) or a state warpgroup's half of S^T (64 x K / 2):
  // the 96 registers a 640-thread block gets leave no room for both.
  float held[1][kStateNT > 4 ? kStateNT : 4][4];
  auto& R = reinterpret_cast<float(&)[1][4][4]>(held);
  auto& S = reinterpret_cast<float(&)[1][kStateNT][4]>(held);
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  if (holds_state) load_state_transposed(S, p.h0, state_base, V, v0, m0, f0, L.ST());
  fence_async_shared();

  bf16* o = static_cast<bf16*>(p.o);
  bf16 *const ST = L.ST(), *const P = L.P();
  constexpr uint64_t kTileMN = mn_major_bits(kChunk);
  const uint64_t ST_rows = sw128_descriptor(ST, kKMajorBits);  // B^T = S^T for Q S
  const uint64_t P_rows = sw128_descriptor(P, kKMajorBits);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n % kStages, t0 = n * kChunk;
    wait_full(L, n);
    fence_async_shared();  // the producer's copies, now visible to this thread, also to its wgmma reads
    named_barrier_sync(kComputeBarrier, kComputeThreads);  // S's copy is whole; chunk n - 1 read P
    const float* G = L.G(stage);
    const uint64_t q_rows = sw128_descriptor(L.q(stage), kKMajorBits);
    const auto queries = [&](int s) { return q_rows + k_major_offset(16 * s, kChunk); };

    // Phase 1.
    if (!holds_state) {  // R = diag(exp G) Q S on value columns half_col..: B^T = S^T's rows half_col..
      wgmma_ss_product<false, kKeySteps>(
          R, queries, [&](int s) { return ST_rows + k_major_offset(16 * s, kBlockV) + row_offset(half_col); }, false);
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const float decay = exp_ftz(G[m0 + acc_row(0, e)]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          R[0][j][e] *= decay;
          R[0][j][e + 1] *= decay;
        }
      }
    } else {  // P's columns half_col..: (Q K^T) exp(G_i - G_j), j <= i, else 0; B^T = K's rows half_col..
      const uint64_t k_rows = sw128_descriptor(L.k(stage), kKMajorBits);
      float QK[1][4][4];
      wgmma_ss_product<false, kKeySteps>(
          QK, queries, [&](int s) { return k_rows + k_major_offset(16 * s, kChunk) + row_offset(half_col); }, false);
      store_decayed_scores_half(QK, P, G, m0, half_col);
    }
    fence_async_shared();
    named_barrier_sync(kComputeBarrier, kComputeThreads);

    // Phase 2.
    const float G_last = G[kChunk - 1];
    if (!holds_state) {  // O = R + P V on value columns half_col..
      const uint64_t v_cols = sw128_descriptor(L.v(stage), kTileMN);
      wgmma_ss_product<true, kTokenSteps>(
          R, [&](int s) { return P_rows + k_major_offset(16 * s, kChunk); },
          [&](int s) { return v_cols + mn_major_offset(16 * s, half_col, kChunk); }, true);
      store_output_tile(R, o, seq, H, V, h, t0, v0, m0, half_col, p.scale);
    } else {  // S^T <- exp(G_last) S^T + V^T diag(exp(G_last - G)) K, on key columns f0..
      const uint64_t k_cols = sw128_descriptor(L.k(stage), kTileMN) + mn_major_offset(0, f0, kChunk);
      // A = V^T (ldmatrix.trans of the swizzled tile): fragment registers 0 and 1 hold tokens 16 s + 2 t, + 1,
      // registers 2 and 3 tokens 16 s + 2 t + 8, + 9 (t = lane % 4), each scaled by its token's decay to the
      // chunk's end, which the value rounded to bf16 then carries (v7 stored V decayed in bf16 alike).
      const int t = 2 * (threadIdx.x & 3);
      unsigned a[kTokenSteps][4];
#pragma unroll
      for (int s = 0; s < kTokenSteps; ++s) {
        sw128_load_a_transposed(a[s], L.v(stage), kChunk, m0, 16 * s);
        const int j = 16 * s + t;
        const float d0 = exp_ftz(G_last - G[j]), d1 = exp_ftz(G_last - G[j + 1]);
        const float d8 = exp_ftz(G_last - G[j + 8]), d9 = exp_ftz(G_last - G[j + 9]);
        a[s][0] = scale_bf16x2(a[s][0], d0, d1);
        a[s][1] = scale_bf16x2(a[s][1], d0, d1);
        a[s][2] = scale_bf16x2(a[s][2], d8, d9);
        a[s][3] = scale_bf16x2(a[s][3], d8, d9);
      }
      update_state_transposed(S, a, k_cols, exp_ftz(G_last), ST, m0, f0);
    }
    release_stage(L, n);
  }

  if (holds_state) store_state_transposed(S, p.ht, state_base, V, v0, m0, f0);
#else
  __trap();  // compiled without sm_90a features: forward() refuses to launch this (require_sm90a)
#endif
}

// One chunk pass over p's sequences (the split calls it on the segments' view).
void chunk_pass(const Problem& p) {
  launch_per_value_block(p, kName, kBlockV, kBlockThreads, linear_chunked_wgmma<64>, Layout<64>::kBytes,
                         linear_chunked_wgmma<128>, Layout<128>::kBytes);
}

int resident_blocks_per_sm(int K) {
  return K == 64 ? resident_blocks(linear_chunked_wgmma<64>, kBlockThreads, Layout<64>::kBytes, kName)
                 : resident_blocks(linear_chunked_wgmma<128>, kBlockThreads, Layout<128>::kBytes, kName);
}

// The split's cost model (common/split_segments.cuh) with this kernel's time per chunk and block at K = 64 and 128
// (it takes no K = 256), H100, B = 4, T = 8192, H = 16: ~2.13 us at K = 128 (0.273 ms for chains of 128 chunks in
// one wave) and ~1.7 at K = 64 (0.226 ms split in two by v7's constants: chains of 64 chunks plus the correction's
// modelled 0.1 ms and the launches' 15 us), against v7's 2.9 and 2.4.
constexpr SplitModel kModel{{1.7, 2.13, 0.0}, linear_split::kCorrectionBytesPerUs, linear_split::kAddedLaunchesUs,
                            linear_split::kMinSegment, linear_split::kMaxSegments, linear_split::kRunChunks};

int choose_segments(int B, int T, int H, int K, int V) {
  if (!is_tensor_core_key(K) || V % kBlockV != 0) return 1;  // forward refuses these and says why
  return model_segments<resident_blocks_per_sm>(kModel, kName, B, T, H, K, V, kBlockV);
}

size_t workspace_bytes(int B, int T, int H, int K, int V, bool packed) {
  if (packed || B <= 0 || T <= 0 || H <= 0 || K <= 0 || V <= 0) return 0;  // packed: the plain pass
  const int P = choose_segments(B, T, H, K, V);
  return P == 1 ? 0 : linear_split::split_bytes(P, B, T, H, K, V);
}

void forward(const Problem& p) {
  linear_wide::check_problem(p, kName);
  require_sm90a(kName);
  linear_split::split_forward(p, kName, chunk_pass, choose_segments(p.B, p.T, p.H, p.K, p.V));
}

}  // namespace
}  // namespace linear_wgmma

extern const Version linear_v10 = {
    "linear", 10, "chunked_wgmma",
    "v8 with its chunk pass on Hopper warpgroup tensor cores (wgmma, sm_90a) in delta v10's roles without the WY step, fed by a producer warpgroup: v7's chunk was one ldmatrix -> mma.sync chain per SM, as delta v9's was.",
    false, true, kTensorCoreShape, 90, linear_wgmma::workspace_bytes, linear_wgmma::forward, 90, nullptr, nullptr,
    kReadsPacked};

}  // namespace minilin
