// The chunk kernel of delta v8 and v9 (they differ in how the WY step T = (I + A)^-1 is prepared: the waves'
// block products on CUDA cores for v8, on tensor cores for v9; wy_prepare_blocked.cuh): v7's 16 compute warps
// plus one warp that only loads, as linear v7 does: each chunk's q, k, v, T's tile and betas, and the gate's
// cumulative sum, into a ring of three stages guarded by mbarriers (common/producer.cuh).
//
// Per chunk n (stage n % 3, its barriers waited with parity (n / 3) & 1; at K = 256, delta v11, n % 2 and (n / 2) & 1):
//   producer warp:  wait on the stage's `empty` barrier; cp.async q, k, v and T's tile (each lane's copies
//                   arrive on `full` when they land); G = cumsum(g) and beta into the stage; lane 0 arrives
//   compute warps:  wait on `full`; v7's three phases (chunk_wy_mma_wide.cuh), each after a named barrier
//                   over the 16 compute warps; each warp arrives on `empty` when done with the stage
// The compute warps take their tiles from compute_warp_tiles (producer.cuh), as linear v7's do.
#pragma once

#include "../common/producer.cuh"
#include "chunk_wy_mma_wide.cuh"

namespace minilin {
namespace delta_producer {

using delta_wide::ChunkTiles;
using wide::kBlockV;
using wide::kLdC;
using wide::kLdV;
using bf16 = __nv_bfloat16;

using namespace producer_block;  // the block (16 compute warps + the producer), the ring's kStages and its waits

// Up to K = 128: three stages and tiles of its own for X, Delta and Delta decayed. At K = 256 three stages cannot
// fit (a stage is 85 KB), and two with those tiles take 241 KB of the SM's 227: so there ("slim", delta v11) two
// stages, X written over the stage's v (each element read and rewritten by one thread: v is read nowhere else),
// and the decay to the chunk's end put on the stage's keys instead of a Delta decayed tile
// (chunk_phase2_decaying_keys): 223 KB.
template <int K>
struct Layout {
  static constexpr bool kSlim = K > 128;
  static constexpr int kRing = kSlim ? 2 : kStages;
  static constexpr int kOwnTiles = kSlim ? 1 : 3;  // Delta (and X, Delta decayed)
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes =
      (2 * kChunk * kLdK + kChunk * kLdV + kChunk * kLdC) * sizeof(bf16) + 2 * kChunk * sizeof(float);
  static constexpr size_t kBarrierOffset = kRing * kStageBytes + kChunk * kLdC * sizeof(bf16)  // P
                                           + K * kLdV * sizeof(bf16)                           // S (bf16 copy)
                                           + kOwnTiles * kChunk * kLdV * sizeof(bf16);
  static constexpr size_t kBytes = kBarrierOffset + 2 * kRing * sizeof(uint64_t);
  static_assert(kStageBytes % 16 == 0 && kBarrierOffset % 8 == 0,
                "cp.async needs 16-byte rows, an mbarrier 8-byte alignment");
  static_assert(kBytes <= 227 * 1024, "the ring must fit in an H100/H200 SM's shared memory");
  unsigned char* base;
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * kLdK; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * kLdK; }
  __device__ bf16* wy(int s) const { return v(s) + kChunk * kLdV; }
  __device__ float* G(int s) const { return reinterpret_cast<float*>(wy(s) + kChunk * kLdC); }
  __device__ float* beta(int s) const { return G(s) + kChunk; }
  __device__ bf16* P() const { return reinterpret_cast<bf16*>(base + kRing * kStageBytes); }
  __device__ bf16* S() const { return P() + kChunk * kLdC; }
  __device__ bf16* own(int i) const { return S() + K * kLdV + i * kChunk * kLdV; }
  __device__ bf16* X(int s) const { return kSlim ? v(s) : own(1); }
  __device__ bf16* delta() const { return own(0); }
  __device__ bf16* delta_decayed() const { return kSlim ? own(0) : own(2); }  // slim: Delta, the keys decayed
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + s; }
  __device__ uint64_t* empty(int s) const { return full(kRing) + s; }
};

// The producer warp: every chunk of head (b, h) and value block v0 into the ring; the gates and betas of
// chunk n + 1 are read into registers while chunk n's copies fly (common/producer.cuh).
template <int K>
__device__ void produce(const Layout<K>& L, const Problem& p, const bf16* wy, int b, int h, int v0, int chunks) {
  const int lane = threadIdx.x & 31;
  const long long token_stride = p.H;
  auto first_token = [&](int n) { return (static_cast<long long>(b) * p.T + n * kChunk) * p.H + h; };
  auto valid_tokens = [&](int n) { return n < chunks ? min(kChunk, p.T - n * kChunk) : 0; };
  float2 gates = producer_token_pair(p.g, first_token(0), token_stride, valid_tokens(0), lane);
  float2 betas = producer_token_pair(p.beta, first_token(0), token_stride, valid_tokens(0), lane);
  for (int n = 0; n < chunks; ++n) {
    const int s = n % Layout<K>::kRing, valid = valid_tokens(n);
    const long long first = first_token(n);
    wait_empty<Layout<K>::kRing>(L, n);
    producer_copy_row_pair<K>(L.q(s), L.k(s), Layout<K>::kLdK, static_cast<const bf16*>(p.q) + first * K,
                              static_cast<const bf16*>(p.k) + first * K, token_stride * K, valid, lane);
    producer_copy_rows<kBlockV>(L.v(s), kLdV, static_cast<const bf16*>(p.v) + first * p.V + v0, token_stride * p.V,
                                valid, lane);
    producer_copy_rows<kChunk>(L.wy(s), kLdC, wy + wy_tile_offset(p, b, h, n), kChunk, kChunk, lane);
    cp_async_arrive(L.full(s));
    producer_store_scalars(L, s, gates, betas,
                           producer_token_pair(p.g, first_token(n + 1), token_stride, valid_tokens(n + 1), lane),
                           producer_token_pair(p.beta, first_token(n + 1), token_stride, valid_tokens(n + 1), lane), lane);
  }
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) delta_chunked_wy_producer_warp(const Problem p, const bf16* wy) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr Loads kLoads = Loads::kFusedPipelined;

  const Layout<K> L{smem};
  const int T = p.T, H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5;
  init_ring<Layout<K>::kRing>(L);
  if (warp == kComputeWarps) {
    produce<K>(L, p, wy, b, h, v0, chunks);
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
    named_barrier_sync(kComputeBarrier, kComputeThreads);  // the bf16 copy of S is whole; chunk n - 1 read P, Delta

    const ChunkTiles tiles{L.q(stage), L.k(stage), L.v(stage), L.wy(stage), L.G(stage),         L.beta(stage),
                           L.P(),      L.S(),      L.X(stage), L.delta(),   L.delta_decayed()};
    float R[1][2][4];
    delta_wide::chunk_phase1<K, kLoads>(R, tiles, m0, n0);
    named_barrier_sync(kComputeBarrier, kComputeThreads);
    if constexpr (Layout<K>::kSlim)
      delta_wide::chunk_phase2_decaying_keys<K, kLoads>(tiles, L.k(stage), m0, n0, threadIdx.x, kComputeThreads);
    else
      delta_wide::chunk_phase2<kLoads>(tiles, m0, n0);
    named_barrier_sync(kComputeBarrier, kComputeThreads);
    delta_wide::chunk_output<kLoads>(R, tiles, m0, n0);
    store_output_tile(R, o, T, H, V, b, h, t0, v0, m0, n0, p.scale);
    delta_wide::chunk_state_update<K, kLoads>(S, tiles, s_m0, s_n0);
    release_stage<Layout<K>::kRing>(L, n);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

// Launch the chunk kernel for K = 64 or 128 on p's stream, reading T from `wy` (the callers check p).
inline void launch_chunks(const Problem& p, const bf16* wy, const char* name) {
  launch_per_value_block(p, name, kBlockV, kThreads, delta_chunked_wy_producer_warp<64>, Layout<64>::kBytes,
                         delta_chunked_wy_producer_warp<128>, Layout<128>::kBytes, wy);
}

}  // namespace delta_producer
}  // namespace minilin
