// linear v6 (wgmma, sm_90a): v5's three products per chunk given to three kinds of warpgroup that run at the
// same time, each product one asynchronous Hopper wgmma reading its operands straight from shared memory,
// because ncu found v5 waiting on its own ldmatrix traffic (MIO scoreboard) with the tensor pipe mostly idle.
//
// One block of 4 warpgroups per (batch, head, 64 value columns), sequential over 64-token chunks. With G the
// chunk-local cumulative log-gate, S [K, 64] the state entering the chunk and C = 64:
//   warpgroup 0 (scores):  P = (Q K^T) * exp(G_i - G_j), causal                      -> shared, bf16
//   warpgroup 1 (output):  O = diag(exp(G)) Q S, then (after P is stored) O += P V   -> global
//   warpgroups 2, 3 (state, K/2 key channels each):
//                          S^T <- exp(G_C) S^T + (V * exp(G_C - G))^T K              -> registers, fp32
// The state warpgroups keep S^T in their accumulators across chunks and publish a bf16 copy of the new state
// for the next chunk's Q S (two copies, alternating, so the update never waits for the output warpgroup).
// Two block-wide barriers per chunk: "chunk n landed" and "P stored". Every shared operand is in the
// 128-byte-swizzled storage (common/wgmma.cuh), which serves as K-major and, with the transpose flag, as
// MN-major operand: Q K^T reads K K-major; S^T's update and P V read K and V MN-major, so nothing is
// transposed by hand.
#include "../common/chunk_tiles.cuh"
#include "../common/launch.cuh"
#include "../common/simt.cuh"
#include "../common/wgmma.cuh"

namespace minilin {
namespace {

constexpr int kWarpgroups = 4;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kBlockV = 64;
[[maybe_unused]] constexpr int kScores = 0, kOutput = 1;  // warpgroups 2 and 3 hold the state
using bf16 = __nv_bfloat16;

// Every bf16 tile is a whole number of 1024-byte atoms and starts on an atom boundary (base is aligned).
template <int K>
struct Layout {
  static constexpr size_t kStageBytes = (2 * kChunk * K + kChunk * kBlockV) * sizeof(bf16);
  static constexpr size_t kTileBytes = 2 * kStageBytes
                                       + kChunk * kChunk * sizeof(bf16)   // P
                                       + 2 * kBlockV * K * sizeof(bf16);  // two bf16 copies of S^T
  static constexpr size_t kBytes = 1024  // room to align the base
                                   + kTileBytes
                                   + 2 * kChunk * sizeof(float)                 // the stages' log-gates
                                   + 4 * kWarpgroups * kChunk * sizeof(float);  // G, one copy per warp
  unsigned char* base;
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * K; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * K; }
  __device__ bf16* P() const { return reinterpret_cast<bf16*>(base + 2 * kStageBytes); }
  __device__ bf16* St(int copy) const { return P() + kChunk * kChunk + copy * kBlockV * K; }
  __device__ float* g(int s) const { return reinterpret_cast<float*>(base + kTileBytes) + s * kChunk; }
  __device__ float* G(int warp) const { return g(2) + warp * kChunk; }
};

// Tokens [t0, t0 + 64) of head (b, h) into swizzled storage: q, k [64, K], v [64, 64] (value columns
// v0 ..), and the log-gates.
template <int K>
__device__ void load_chunk(const Layout<K>& L, int stage, const Problem& p, int b, int h, int t0, int v0) {
  const int valid = min(kChunk, p.T - t0);
  const long long first = (static_cast<long long>(b) * p.T + t0) * p.H + h;
  cp_async_rows_sw128(L.q(stage), static_cast<const bf16*>(p.q) + first * K, static_cast<long long>(p.H) * K, kChunk, K,
                   valid);
  cp_async_rows_sw128(L.k(stage), static_cast<const bf16*>(p.k) + first * K, static_cast<long long>(p.H) * K, kChunk, K,
                   valid);
  cp_async_rows_sw128(L.v(stage), static_cast<const bf16*>(p.v) + first * p.V + v0, static_cast<long long>(p.H) * p.V,
                   kChunk, kBlockV, valid);
  cp_async_gates(L.g(stage), p, first, valid);
}

template <int NT>
__device__ __forceinline__ auto flat(float (&acc)[1][NT][4]) -> float (&)[NT * 4] {
  return reinterpret_cast<float(&)[NT * 4]>(acc);
}

// A bf16 pair times (lo, hi), rounded back to bf16.
[[maybe_unused]] __device__ __forceinline__ unsigned scale_bf16x2(unsigned x, float lo, float hi) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  const __nv_bfloat162 r = __floats2bfloat162_rn(f.x * lo, f.y * hi);
  return *reinterpret_cast<const unsigned*>(&r);
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) linear_chunked_wgmma(const Problem p) {
#if MINILIN_WGMMA
  extern __shared__ __align__(1024) unsigned char smem[];
  constexpr int kHalfK = K / 2;  // key channels per state warpgroup: its accumulator is S^T [64, K / 2]
  const Layout<K> L{align_1024(smem)};
  const int T = p.T, H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int role = warp >> 2, m0 = 16 * (warp & 3);  // m0: this warp's 16 rows of its warpgroup's 64-row tile
  const int c0 = (role - 2) * kHalfK;                   // a state warpgroup's first key channel
  float* G = L.G(warp);
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;

  load_chunk<K>(L, 0, p, b, h, 0, v0);
  cp_async_commit();

  // S^T [value column m0 + row][key channel c0 + col] in the state warpgroups' accumulators.
  float St[1][kHalfK / 8][4];
  if (role >= 2) {
#pragma unroll
    for (int j = 0; j < kHalfK / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int col = m0 + acc_row(0, e), key = c0 + acc_col(j, e);
        const long long at = state_base + static_cast<long long>(key) * V + v0 + col;
        St[0][j][e] = p.h0 ? p.h0[at] : 0.0f;
        St[0][j][e + 1] = p.h0 ? p.h0[at + V] : 0.0f;
        store_bf16x2(L.St(0) + sw128_index(col, key, kBlockV), St[0][j][e], St[0][j][e + 1]);
      }
    fence_async_shared();
  }

  bf16* o = static_cast<bf16*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n & 1, t0 = n * kChunk;
    cp_async_wait<0>();
    fence_async_shared();
    __syncthreads();  // chunk n and S_n's copy are on chip; chunk n - 1's stage and P are free
    if (n + 1 < chunks) load_chunk<K>(L, stage ^ 1, p, b, h, t0 + kChunk, v0);
    cp_async_commit();

    const bf16* q_s = L.q(stage);
    const bf16* k_s = L.k(stage);
    const bf16* v_s = L.v(stage);
    {  // every warp its own copy of G: no barrier
      const float* g = L.g(stage);
      const float2 G2 = chunk_cumsum_64(p.g ? g[2 * lane] : 0.0f, p.g ? g[2 * lane + 1] : 0.0f);
      G[2 * lane] = G2.x;
      G[2 * lane + 1] = G2.y;
      __syncwarp();
    }
    const float G_last = G[kChunk - 1];

    float acc[1][kBlockV / 8][4];  // P (scores) or O (output), 64 x 64
    if (role == kScores) {
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks)
        wgmma_ss<64, false>(flat(acc), k_major_slice(q_s, kChunk, 16 * ks), k_major_slice(k_s, kChunk, 16 * ks), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < kChunk / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = m0 + acc_row(0, e), c = acc_col(j, e);
          const float x = c <= r ? acc[0][j][e] * __expf(G[r] - G[c]) : 0.0f;
          const float y = c + 1 <= r ? acc[0][j][e + 1] * __expf(G[r] - G[c + 1]) : 0.0f;
          store_bf16x2(L.P() + sw128_index(r, c, kChunk), x, y);
        }
      fence_async_shared();
    } else if (role == kOutput) {  // O = diag(exp(G)) Q S_n
      const bf16* St_n = L.St(n & 1);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks)
        wgmma_ss<64, false>(flat(acc), k_major_slice(q_s, kChunk, 16 * ks), k_major_slice(St_n, kBlockV, 16 * ks),
                            ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < kBlockV / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] *= __expf(G[m0 + acc_row(0, e)]);
    } else {  // S^T <- exp(G_C) S^T + (V * exp(G_C - G))^T K[:, c0 .. c0 + K/2]
      unsigned a[kChunk / 16][4];  // A = V^T decayed to the chunk's end: the warp's 16 value columns x 64 tokens
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks) {
        sw128_load_a_transposed(a[ks], v_s, kChunk, m0, 16 * ks);
        const int t = 16 * ks + 2 * (lane & 3);  // the tokens (columns of A) this thread's fragment holds
        const float d0 = __expf(G_last - G[t]), d1 = __expf(G_last - G[t + 1]);
        const float d8 = __expf(G_last - G[t + 8]), d9 = __expf(G_last - G[t + 9]);
        a[ks][0] = scale_bf16x2(a[ks][0], d0, d1);
        a[ks][1] = scale_bf16x2(a[ks][1], d0, d1);
        a[ks][2] = scale_bf16x2(a[ks][2], d8, d9);
        a[ks][3] = scale_bf16x2(a[ks][3], d8, d9);
      }
      scale_tiles(St, __expf(G_last));
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks)
        wgmma_rs<kHalfK, true>(flat(St), a[ks], mn_major_slice(k_s, kChunk, 16 * ks, c0), true);
      wgmma_commit();
      wgmma_wait<0>();
      bf16* St_next = L.St((n + 1) & 1);  // last read by the output warpgroup in chunk n - 1
#pragma unroll
      for (int j = 0; j < kHalfK / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2)
          store_bf16x2(St_next + sw128_index(m0 + acc_row(0, e), c0 + acc_col(j, e), kBlockV), St[0][j][e],
                       St[0][j][e + 1]);
      fence_async_shared();
    }
    __syncthreads();  // P is stored

    if (role == kOutput) {  // O += P V, then out
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks)
        wgmma_ss<64, true>(flat(acc), k_major_slice(L.P(), kChunk, 16 * ks), mn_major_slice(v_s, kChunk, 16 * ks),
                           true);
      wgmma_commit();
      wgmma_wait<0>();
      store_output_tile(acc, o, T, H, V, b, h, t0, v0, m0, 0, p.scale);
    }
  }

  if (role >= 2) {
#pragma unroll
    for (int j = 0; j < kHalfK / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int col = m0 + acc_row(0, e), key = c0 + acc_col(j, e);
        const long long at = state_base + static_cast<long long>(key) * V + v0 + col;
        p.ht[at] = St[0][j][e];
        p.ht[at + V] = St[0][j][e + 1];
      }
  }
#else
  __trap();  // compiled without sm_90a features: forward() refuses to launch this
#endif
}

void forward(const Problem& p) {
  const std::string name = "linear_v6_chunked_wgmma";
  check_common(p, name.c_str(), false);
  require(p.dtype == kBFloat16, name + ": bfloat16 inputs only (tensor cores multiply bf16), got float32");
  require(p.K == 64 || p.K == 128, name + ": K must be 64 or 128, got K=" + std::to_string(p.K));
  require(p.V % kBlockV == 0, name + ": V must be a multiple of 64, got V=" + std::to_string(p.V));
  require_sm90a(name);
  auto kernel = p.K == 64 ? linear_chunked_wgmma<64> : linear_chunked_wgmma<128>;
  const size_t smem = p.K == 64 ? Layout<64>::kBytes : Layout<128>::kBytes;
  allow_shared_memory(kernel, smem, name.c_str());
  const dim3 grid(p.V / kBlockV, p.H, p.B);
  kernel<<<grid, kThreads, smem, stream_of(p)>>>(p);
  check_launch(name.c_str(), p);
}

}  // namespace

extern const Version linear_v6 = {
    "linear", 6, "chunked_wgmma",
    "v5's three products run by separate warpgroups at once, each an asynchronous wgmma reading shared memory "
    "directly: v5 waits on its own ldmatrix traffic.",
    false, true, 90, nullptr, forward, 90};

}  // namespace minilin
