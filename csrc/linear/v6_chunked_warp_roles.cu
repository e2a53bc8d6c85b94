// linear v6 (warp roles): v5's products given to groups of warps that work at the same time, each warp on a
// 32 x 32 tile instead of 16 x 16, because ncu found v4 and v5 bound by shared-memory fragment traffic: a
// 32 x 32 tile loads 2 + 2 fragments per 8 mma where a 16 x 16 tile loads 1 + 1 per 2.
//
// One block of 16 warps per (batch, head, 64 value columns), sequential over 64-token chunks. With G the
// chunk-local cumulative log-gate and S [K, 64] the state entering the chunk:
//   warps 0-3 (scores):  P = (Q K^T) * exp(G_i - G_j), causal, one 32 x 32 tile each (the one above the
//                        diagonal is never read and never computed)                             -> shared
//   warps 4-7 (output):  O = diag(exp(G)) Q S, then, once P is stored, O += P V, one 32 x 32 tile each
//   warps 8-15 (state):  V decayed to the chunk's end (then a barrier among these 8 warps only), and
//                        S <- exp(G_C) S + K^T (V decayed), a 16 K/64 x 32 slice each, in registers
// The state warps write the bf16 copy of the new state that the next chunk's Q S reads into the other of two
// copies, so they never wait for the output warps. Two block-wide barriers per chunk, as in v5: "chunk n
// landed" and "P stored".
#include "../common/chunk_tiles.cuh"
#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/simt.cuh"

namespace minilin {
namespace {

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kStateThreads = 8 * 32;  // warps 8-15
constexpr int kBlockV = 64;
constexpr int kLdV = kBlockV + 8;  // rows padded by 16 bytes: the 8 rows one ldmatrix reads hit different banks
constexpr int kLdC = kChunk + 8;
using bf16 = __nv_bfloat16;

template <int K>
struct Layout {
  static constexpr int kLdK = K + 8;
  static constexpr size_t kStageBytes = (2 * kChunk * kLdK + kChunk * kLdV) * sizeof(bf16) + kChunk * sizeof(float);
  static constexpr size_t kBytes = 2 * kStageBytes
                                   + kChunk * kLdC * sizeof(bf16)          // P
                                   + 2 * K * kLdV * sizeof(bf16)           // two bf16 copies of S
                                   + kChunk * kLdV * sizeof(bf16)          // V decayed to the chunk's end
                                   + kWarps * kChunk * sizeof(float);      // G, one copy per warp
  unsigned char* base;
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * kLdK; }
  __device__ bf16* v(int s) const { return k(s) + kChunk * kLdK; }
  __device__ float* g(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ bf16* P() const { return reinterpret_cast<bf16*>(base + 2 * kStageBytes); }
  __device__ bf16* S(int copy) const { return P() + kChunk * kLdC + copy * K * kLdV; }
  __device__ bf16* v_decayed() const { return S(2); }
  __device__ float* G(int warp) const { return reinterpret_cast<float*>(v_decayed() + kChunk * kLdV) + warp * kChunk; }
};

template <int K>
__global__ void __launch_bounds__(kThreads, 1) linear_chunked_warp_roles(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = Layout<K>::kLdK;
  constexpr int kStateMT = K / 64;  // 16-row tiles per state warp: 4 row slices x 2 column halves cover S
  const Layout<K> L{smem};
  const int T = p.T, H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int role = warp >> 2;                                       // 0 scores, 1 output, 2 and 3 state
  const int m0 = 32 * ((warp & 3) >> 1), n0 = 32 * (warp & 1);      // a scores or output warp's 32 x 32 tile
  const int state_warp = warp - 8;                                  // 0..7 for the state warps
  const int s_m0 = 16 * kStateMT * (state_warp >> 1), s_n0 = 32 * (state_warp & 1);
  float* G = L.G(warp);
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;

  cp_async_chunk<K, kBlockV>(L.q(0), L.k(0), kLdK, L.v(0), kLdV, L.g(0), p, b, h, 0, v0);
  cp_async_commit();

  float S[kStateMT][4][4];  // the state warps' slice of S, fp32, across all chunks
  if (role >= 2) load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(0), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n & 1, t0 = n * kChunk;
    cp_async_wait<0>();
    __syncthreads();  // chunk n and S_n's copy are on chip; chunk n - 1's stage, P and V decayed are free
    if (n + 1 < chunks)
      cp_async_chunk<K, kBlockV>(L.q(stage ^ 1), L.k(stage ^ 1), kLdK, L.v(stage ^ 1), kLdV, L.g(stage ^ 1), p, b, h,
                                 t0 + kChunk, v0);
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

    float acc[2][4][4];  // scores: this warp's tile of P; output: its tile of O
    if (role == 0) {
      if (n0 <= m0) {
        zero(acc);
        warp_mma_unrolled<2, 4, Stored::kRowMajor, Stored::kTransposed, K / 16>(acc, q_s, kLdK, k_s, kLdK, m0, n0, 0);
        store_decayed_scores(acc, G, L.P(), kLdC, m0, n0);
      }
    } else if (role == 1) {  // O = diag(exp(G)) Q S_n
      zero(acc);
      warp_mma_unrolled<2, 4, Stored::kRowMajor, Stored::kRowMajor, K / 16>(acc, q_s, kLdK, L.S(n & 1), kLdV, m0, n0, 0);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][j][e] *= __expf(G[m0 + acc_row(i, e)]);
    } else {  // S <- exp(G_C) S + K^T (V * exp(G_C - G)); its bf16 copy into the copy chunk n + 1 reads
      for (int i = threadIdx.x - (kThreads - kStateThreads); i < kChunk * kBlockV / 8; i += kStateThreads) {
        const int j = i / (kBlockV / 8), c = (i % (kBlockV / 8)) * 8;
        float x[8];
        load8(v_s + j * kLdV + c, x);
        const float d = __expf(G_last - G[j]);
#pragma unroll
        for (int e = 0; e < 8; e += 2) store_bf16x2(L.v_decayed() + j * kLdV + c + e, d * x[e], d * x[e + 1]);
      }
      named_barrier(1, kStateThreads);  // V decayed is stored (only the state warps read it)
      scale_tiles(S, __expf(G_last));
      warp_mma_unrolled<kStateMT, 4, Stored::kTransposed, Stored::kRowMajor, kChunk / 16>(
          S, k_s, kLdK, L.v_decayed(), kLdV, s_m0, s_n0, 0);
      store_state_copy(S, L.S((n + 1) & 1), kLdV, s_m0, s_n0);  // last read by the output warps in chunk n - 1
    }
    __syncthreads();  // P is stored

    if (role == 1) {  // O += P V over the tokens up to this tile's last row, then out
      warp_mma_unrolled<2, 4, Stored::kRowMajor, Stored::kRowMajor, kChunk / 16>(acc, L.P(), kLdC, v_s, kLdV, m0, n0, 0,
                                                                                 (m0 >> 4) + 2);
      store_output_tile(acc, o, T, H, V, b, h, t0, v0, m0, n0, p.scale);
    }
  }

  if (role >= 2) store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

void forward(const Problem& p) {
  const std::string name = "linear_v6_chunked_warp_roles";
  check_common(p, name.c_str(), false);
  require(p.dtype == kBFloat16, name + ": bfloat16 inputs only (tensor cores multiply bf16), got float32");
  require(p.K == 64 || p.K == 128, name + ": K must be 64 or 128, got K=" + std::to_string(p.K));
  require(p.V % kBlockV == 0, name + ": V must be a multiple of 64, got V=" + std::to_string(p.V));
  auto kernel = p.K == 64 ? linear_chunked_warp_roles<64> : linear_chunked_warp_roles<128>;
  const size_t smem = p.K == 64 ? Layout<64>::kBytes : Layout<128>::kBytes;
  allow_shared_memory(kernel, smem, name.c_str());
  const dim3 grid(p.V / kBlockV, p.H, p.B);
  kernel<<<grid, kThreads, smem, stream_of(p)>>>(p);
  check_launch(name.c_str(), p);
}

}  // namespace

extern const Version linear_v6 = {
    "linear", 6, "chunked_warp_roles",
    "v5's products on groups of warps working at once, 32 x 32 tiles each: half the fragment loads per mma, "
    "because v5 is bound by shared-memory fragment traffic.",
    false, true, 80, nullptr, forward};

}  // namespace minilin
