// linear v7 (producer warp): v6's 16 compute warps plus one warp that only loads, copying each chunk's q, k
// and v into a ring of three stages guarded by mbarriers and scanning the chunk's gate once for all, because
// ncu's source view of v5 put ~21% of the stall samples on the first barrier and the cp.async issue (~190
// instructions per warp and chunk) and 5% on the gate's scan, which each of the 16 warps repeated.
// Measured on the H200: 7-9% faster than v6 (call time, same run: 0.443 vs 0.476 ms at T = 8192, 1.597 vs
// 1.746 at 32768). The producer must keep up for that: it reads the next chunk's gates ahead and walks its
// copies by stepped pointers; the same copies issued with index math behind a blocking gate load gained ~1%
// (csrc/NOTES.md). It is the Hopper producer/consumer pattern in its smallest form.
//
// Per chunk n (stage n % 3, its barriers waited with parity (n / 3) & 1):
//   producer warp:  wait on the stage's `empty` barrier; cp.async q, k and v (each lane's copies arrive on
//                   `full` when they land); G = cumsum(g) into the stage; lane 0 arrives on `full`
//   compute warps:  wait on `full`; v6's two phases (chunk_mma_wide.cuh) after each of two named barriers
//                   over the 16 compute warps; each warp arrives on `empty` when done with the stage
// Copying each row with one Hopper bulk copy instead (cp.async.bulk, 192 per chunk) is 2x slower than v6:
// the copy engine takes ~7 us a chunk for requests of 128-256 bytes.
// The compute warps take their tiles from compute_warp_tiles (producer.cuh), which leaves the producer's
// sub-partition one of the ten warps that also form Q K^T instead of four: 7% faster again (device time,
// same-run A/B: 0.374 vs 0.403 ms at T = 8192, outputs bit-identical).
// One block per (value block, head, sequence); packed sequences and grouped value heads are read in place, every
// token row and q/k head taken from common/sequences.cuh.
#include "../common/producer.cuh"
#include "chunk_mma_wide.cuh"

namespace minilin {
namespace linear_producer {

using linear_wide::ChunkTiles;
using wide::kBlockV;
using wide::kLdC;
using wide::kLdV;
using bf16 = __nv_bfloat16;

using namespace producer_block;  // the block (16 compute warps + the producer), the ring's kStages and its waits

template <int K>
struct Layout {
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes = (2 * kChunk * kLdK + kChunk * kLdV) * sizeof(bf16) + kChunk * sizeof(float);
  static constexpr size_t kBarrierOffset = kStages * kStageBytes + kChunk * kLdC * sizeof(bf16)  // P
                                      + K * kLdV * sizeof(bf16)                             // S (bf16 copy)
                                      + kChunk * kLdV * sizeof(bf16);                       // V decayed
  static constexpr size_t kBytes = kBarrierOffset + 2 * kStages * sizeof(uint64_t);
  static_assert(kStageBytes % 16 == 0 && kBarrierOffset % 8 == 0,
                "cp.async needs 16-byte rows, an mbarrier 8-byte alignment");
  unsigned char* base;
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * kLdK; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * kLdK; }
  __device__ float* G(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ bf16* P() const { return reinterpret_cast<bf16*>(base + kStages * kStageBytes); }
  __device__ bf16* S() const { return P() + kChunk * kLdC; }
  __device__ bf16* v_decayed() const { return S() + K * kLdV; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + s; }
  __device__ uint64_t* empty(int s) const { return full(kStages) + s; }
};

// The producer warp: every chunk of head (b, h) and value block v0 into the ring (common/producer.cuh:
// 16-byte cp.async by stepped pointers, rows past T zero-filled), each lane's copies reported to the stage's
// `full` barrier as they land (cp.async.mbarrier.arrive.noinc); then G = cumsum(g), published by lane 0's
// arrival. The gates of chunk n + 1 are read into registers while chunk n's copies fly: the producer's own
// chain per chunk is then its ~100 copy instructions, not a global load's latency.
template <int K>
__device__ void produce(const Layout<K>& L, const Problem& p, const SequenceRows& seq, int h, int v0, int chunks) {
  const int lane = threadIdx.x & 31, qk_heads = qk_heads_of(p), qk_head = qk_head_of(p, h);
  const long long token_stride = p.H;  // consecutive tokens of one head, in rows of the [B, T, H, .] tensors
  auto first_token = [&](int n) { return (seq.first + n * kChunk) * p.H + h; };
  auto valid_tokens = [&](int n) { return min(kChunk, seq.length - n * kChunk); };
  float2 gates = producer_token_pair(p.g, first_token(0), token_stride, valid_tokens(0), lane);
  for (int n = 0; n < chunks; ++n) {
    const int s = n % kStages, valid = valid_tokens(n);
    const long long first = first_token(n), first_qk = (seq.first + n * kChunk) * qk_heads + qk_head;
    wait_empty(L, n);
    producer_copy_row_pair<K>(L.q(s), L.k(s), Layout<K>::kLdK, static_cast<const bf16*>(p.q) + first_qk * K,
                              static_cast<const bf16*>(p.k) + first_qk * K, qk_heads * K, valid, lane);
    producer_copy_rows<kBlockV>(L.v(s), kLdV, static_cast<const bf16*>(p.v) + first * p.V + v0, token_stride * p.V,
                                valid, lane);
    cp_async_arrive(L.full(s));
    const float2 these = gates;
    gates = producer_token_pair(p.g, first_token(n + 1), token_stride, n + 1 < chunks ? valid_tokens(n + 1) : 0, lane);
    store_chunk_cumsum(L.G(s), these.x, these.y);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(L.full(s));
  }
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) linear_chunked_producer_warp(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];

  const Layout<K> L{smem};
  const int H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, b);
  const int chunks = ceil_div(seq.length, kChunk);
  const int warp = threadIdx.x >> 5;
  init_ring(L);
  if (warp == kComputeWarps) {
    produce<K>(L, p, seq, h, v0, chunks);
    return;  // the compute warps meet on their own named barrier from here on
  }

  const auto [m0, n0, s_m0, s_n0] = compute_warp_tiles<K>(warp);
  float S[1][wide::kStateTiles<K>][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n % kStages, t0 = n * kChunk;
    wait_full(L, n);
    named_barrier_sync(kComputeBarrier, kComputeThreads);  // the bf16 copy of S is whole; chunk n - 1 read P

    const ChunkTiles tiles{L.q(stage), L.k(stage), L.v(stage), L.G(stage), L.P(), L.S(), L.v_decayed()};
    float R[1][2][4];
    const float G_last = linear_wide::chunk_phase1<K, Loads::kFusedPipelined>(R, tiles, m0, n0, threadIdx.x);
    named_barrier_sync(kComputeBarrier, kComputeThreads);
    linear_wide::chunk_output<Loads::kFusedPipelined>(R, tiles, m0, n0);
    store_output_tile(R, o, seq, H, V, h, t0, v0, m0, n0, p.scale);
    linear_wide::chunk_state_update<K, Loads::kFusedPipelined>(S, tiles, G_last, s_m0, s_n0);
    release_stage(L, n);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

void forward(const Problem& p) {
  const std::string name = "linear_v7_chunked_producer_warp";
  linear_wide::check_problem(p, name);
  launch_per_value_block(p, name.c_str(), kBlockV, kThreads, linear_chunked_producer_warp<64>, Layout<64>::kBytes,
                         linear_chunked_producer_warp<128>, Layout<128>::kBytes);
}

// Blocks of this kernel that one SM holds at once, at K = 64 or 128 (linear v8 sizes its split by it).
int resident_blocks_per_sm(int K) {
  const auto kernel = K == 64 ? linear_chunked_producer_warp<64> : linear_chunked_producer_warp<128>;
  const size_t smem = K == 64 ? Layout<64>::kBytes : Layout<128>::kBytes;
  const char* name = "linear_v7_chunked_producer_warp";
  return resident_blocks(kernel, kThreads, smem, name);
}

}  // namespace linear_producer

extern const Version linear_v7 = {
    "linear", 7, "chunked_producer_warp",
    "v6 plus one warp that only loads (cp.async into a 3-stage ring guarded by mbarriers) and scans the gate: v5's profile had ~25% of its stalls on load issue, the first barrier and 16 copies of the scan. 7-9% faster than v6 on an H200, and 7% more with its tiles placed to spare the producer's sub-partition.",
    false, true, kTensorCoreShape, 90, nullptr, linear_producer::forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
