// linear v7's kernel (the producer warp and its ring; v7_chunked_producer_warp.cu says what it changed and why),
// templated on K: v7 launches it at K = 64 and 128 with a 3-stage ring, v9 at K = 256 with a 2-stage one.
#pragma once

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
  // Three stages up to K = 128 (170 KB there); at K = 256 a stage is 75 KB, so two (209 KB in all).
  static constexpr int kRing = K <= 128 ? kStages : 2;
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes = (2 * kChunk * kLdK + kChunk * kLdV) * sizeof(bf16) + kChunk * sizeof(float);
  static constexpr size_t kBarrierOffset = kRing * kStageBytes + kChunk * kLdC * sizeof(bf16)  // P
                                      + K * kLdV * sizeof(bf16)                             // S (bf16 copy)
                                      + kChunk * kLdV * sizeof(bf16);                       // V decayed
  static constexpr size_t kBytes = kBarrierOffset + 2 * kRing * sizeof(uint64_t);
  static_assert(kStageBytes % 16 == 0 && kBarrierOffset % 8 == 0,
                "cp.async needs 16-byte rows, an mbarrier 8-byte alignment");
  unsigned char* base;
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * kLdK; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * kLdK; }
  __device__ float* G(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ bf16* P() const { return reinterpret_cast<bf16*>(base + kRing * kStageBytes); }
  __device__ bf16* S() const { return P() + kChunk * kLdC; }
  __device__ bf16* v_decayed() const { return S() + K * kLdV; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + s; }
  __device__ uint64_t* empty(int s) const { return full(kRing) + s; }
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
    const int s = n % Layout<K>::kRing, valid = valid_tokens(n);
    const long long first = first_token(n), first_qk = (seq.first + n * kChunk) * qk_heads + qk_head;
    wait_empty<Layout<K>::kRing>(L, n);
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
  init_ring<Layout<K>::kRing>(L);
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
    const int stage = n % Layout<K>::kRing, t0 = n * kChunk;
    wait_full<Layout<K>::kRing>(L, n);
    named_barrier_sync(kComputeBarrier, kComputeThreads);  // the bf16 copy of S is whole; chunk n - 1 read P

    const ChunkTiles tiles{L.q(stage), L.k(stage), L.v(stage), L.G(stage), L.P(), L.S(), L.v_decayed()};
    float R[1][2][4];
    const float G_last = linear_wide::chunk_phase1<K, Loads::kFusedPipelined>(R, tiles, m0, n0, threadIdx.x);
    named_barrier_sync(kComputeBarrier, kComputeThreads);
    linear_wide::chunk_output<Loads::kFusedPipelined>(R, tiles, m0, n0);
    store_output_tile(R, o, seq, H, V, h, t0, v0, m0, n0, p.scale);
    linear_wide::chunk_state_update<K, Loads::kFusedPipelined>(S, tiles, G_last, s_m0, s_n0);
    release_stage<Layout<K>::kRing>(L, n);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

}  // namespace linear_producer
}  // namespace minilin
