// linear v7 (producer warp): v6's 16 compute warps plus one warp that only loads, copying each chunk's q, k
// and v rows with Hopper's bulk copies (one instruction per row, completion counted by an mbarrier) into a
// ring of three stages, and scanning the chunk's gate once for all, because ncu's source view of v5 put
// ~21% of the stall samples on the first barrier and the cp.async issue (~190 instructions per warp and
// chunk) and 5% on the gate's scan, which every one of the 16 warps repeated.
//
// Per chunk n (stage n % 3):
//   producer warp:  wait until the stage is free; announce its bytes; one bulk copy per q, k and v row;
//                   G = cumsum(g) into the stage; arrive on the stage's `full` barrier
//   compute warps:  wait on `full`; v6's two phases (chunk_mma_wide.cuh) between two named barriers over
//                   the 16 compute warps; each warp arrives on the stage's `empty` barrier when done
#include "../common/bulk_copy.cuh"
#include "chunk_mma_wide.cuh"

namespace minilin {
namespace linear_producer {

using linear_wide::ChunkTiles;
using linear_wide::kBlockV;
using linear_wide::kLdC;
using linear_wide::kLdV;
using bf16 = __nv_bfloat16;

constexpr int kComputeWarps = linear_wide::kWarps;
constexpr int kComputeThreads = linear_wide::kThreads;
constexpr int kThreads = kComputeThreads + 32;  // the producer is the last warp
constexpr int kStages = 3;
constexpr int kComputeBarrier = 1;              // named barrier id of the compute warps

template <int K>
struct Layout {
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes = (2 * kChunk * kLdK + kChunk * kLdV) * sizeof(bf16) + kChunk * sizeof(float);
  static constexpr size_t kBarriers = kStages * kStageBytes + kChunk * kLdC * sizeof(bf16)  // P
                                      + K * kLdV * sizeof(bf16)                             // S (bf16 copy)
                                      + kChunk * kLdV * sizeof(bf16);                       // V decayed
  static constexpr size_t kBytes = kBarriers + 2 * kStages * sizeof(uint64_t);
  static_assert(kStageBytes % 16 == 0 && kBarriers % 8 == 0, "bulk copies need 16-byte rows, mbarriers 8 bytes");
  unsigned char* base;
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * kLdK; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * kLdK; }
  __device__ float* G(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ bf16* P() const { return reinterpret_cast<bf16*>(base + kStages * kStageBytes); }
  __device__ bf16* S() const { return P() + kChunk * kLdC; }
  __device__ bf16* v_decayed() const { return S() + K * kLdV; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + kBarriers) + s; }
  __device__ uint64_t* empty(int s) const { return full(kStages) + s; }
};

// The producer warp: every chunk of head (b, h) and value block v0 into the ring. Rows past T are zeroed
// with plain stores (a bulk copy cannot zero-fill), before the arrival that publishes them.
template <int K>
__device__ void produce(const Layout<K>& L, const Problem& p, int b, int h, int v0, int chunks) {
  constexpr int kLdK = Layout<K>::kLdK;
  const int lane = threadIdx.x & 31;
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k = static_cast<const bf16*>(p.k);
  const bf16* v = static_cast<const bf16*>(p.v);
  for (int n = 0; n < chunks; ++n) {
    const int s = n % kStages, t0 = n * kChunk, valid = min(kChunk, p.T - t0);
    if (n >= kStages) mbarrier_wait(L.empty(s), (n / kStages - 1) & 1);
    if (lane == 0) mbarrier_expect_bytes(L.full(s), valid * (2 * K + kBlockV) * sizeof(bf16));
    __syncwarp();
    const long long first = (static_cast<long long>(b) * p.T + t0) * p.H + h;
    for (int r = lane; r < kChunk; r += 32) {
      if (r < valid) {
        const long long row = first + static_cast<long long>(r) * p.H;
        bulk_copy_to_shared(L.q(s) + r * kLdK, q + row * K, K * sizeof(bf16), L.full(s));
        bulk_copy_to_shared(L.k(s) + r * kLdK, k + row * K, K * sizeof(bf16), L.full(s));
        bulk_copy_to_shared(L.v(s) + r * kLdV, v + row * p.V + v0, kBlockV * sizeof(bf16), L.full(s));
      } else {
        const uint4 zero = make_uint4(0, 0, 0, 0);
        for (int c = 0; c < K; c += 8) {
          *reinterpret_cast<uint4*>(L.q(s) + r * kLdK + c) = zero;
          *reinterpret_cast<uint4*>(L.k(s) + r * kLdK + c) = zero;
        }
        for (int c = 0; c < kBlockV; c += 8) *reinterpret_cast<uint4*>(L.v(s) + r * kLdV + c) = zero;
      }
    }
    float g_even = 0.0f, g_odd = 0.0f;  // a padded token's gate is 0: it decays nothing
    if (p.g) {
      if (2 * lane < valid) g_even = p.g[first + static_cast<long long>(2 * lane) * p.H];
      if (2 * lane + 1 < valid) g_odd = p.g[first + static_cast<long long>(2 * lane + 1) * p.H];
    }
    const float2 G2 = chunk_cumsum_64(g_even, g_odd);
    L.G(s)[2 * lane] = G2.x;
    L.G(s)[2 * lane + 1] = G2.y;
    __syncwarp();
    if (lane == 0) mbarrier_arrive(L.full(s));
  }
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) linear_chunked_producer_warp(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kRowSharers = kComputeWarps / (K / 16);
  constexpr int kStateTiles = (kBlockV / 8) / kRowSharers;
  static_assert(kRowSharers >= 1 && kStateTiles % 2 == 0, "K must be 64 or 128");

  const Layout<K> L{smem};
  const int T = p.T, H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(L.full(s), 1);                 // the producer's lane 0
      mbarrier_init(L.empty(s), kComputeWarps);    // lane 0 of every compute warp
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (warp == kComputeWarps) {
    produce<K>(L, p, b, h, v0, chunks);
    return;  // the compute warps meet on their own named barrier from here on
  }

  const int m0 = 16 * (warp >> 2), n0 = 16 * (warp & 3);  // this warp's 16 x 16 tile of P and of O
  const int s_m0 = 16 * (warp / kRowSharers), s_n0 = 8 * kStateTiles * (warp % kRowSharers);
  float S[1][kStateTiles][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n % kStages, t0 = n * kChunk;
    mbarrier_wait(L.full(stage), (n / kStages) & 1);
    named_barrier_sync(kComputeBarrier, kComputeThreads);  // the bf16 copy of S is whole; chunk n - 1 read P

    const ChunkTiles tiles{L.q(stage), L.k(stage), L.v(stage), L.G(stage), L.P(), L.S(), L.v_decayed()};
    float R[1][2][4];
    const float G_last = linear_wide::chunk_phase1<K, Loads::kFusedPipelined>(R, tiles, m0, n0, threadIdx.x);
    named_barrier_sync(kComputeBarrier, kComputeThreads);
    linear_wide::chunk_output<Loads::kFusedPipelined>(R, tiles, m0, n0);
    store_output_tile(R, o, T, H, V, b, h, t0, v0, m0, n0, p.scale);
    linear_wide::chunk_state_update<K, Loads::kFusedPipelined>(S, tiles, G_last, s_m0, s_n0);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbarrier_arrive(L.empty(stage));  // this warp is done with the stage
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

void forward(const Problem& p) {
  const std::string name = "linear_v7_chunked_producer_warp";
  linear_wide::check_problem(p, name);
  auto kernel = p.K == 64 ? linear_chunked_producer_warp<64> : linear_chunked_producer_warp<128>;
  const size_t smem = p.K == 64 ? Layout<64>::kBytes : Layout<128>::kBytes;
  allow_shared_memory(kernel, smem, name.c_str());
  const dim3 grid(p.V / kBlockV, p.H, p.B);
  kernel<<<grid, kThreads, smem, stream_of(p)>>>(p);
  check_launch(name.c_str(), p);
}

}  // namespace linear_producer

extern const Version linear_v7 = {
    "linear", 7, "chunked_producer_warp",
    "v6 plus one warp that only loads (bulk copies into a 3-stage ring, mbarriers) and scans the gate: v5's profile had ~25% of its stalls on load issue, the first barrier and 16 copies of the scan.",
    false, true, 90, nullptr, linear_producer::forward};

}  // namespace minilin
