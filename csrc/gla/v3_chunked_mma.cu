// gla v3 (chunked, tensor cores): v2's chunk algorithm with its three large products (the blocks of A below the
// diagonal, the output O = (q exp(G))^T S + A V, the state update) on bf16 tensor cores (mma.sync m16n8k16, fp32
// accumulators) and the state in registers across chunks, because v2 spends its time in fp32 multiply-adds that the
// tensor cores do an order of magnitude faster; the diagonal 16 x 16 blocks of A, whose decays differ per term, stay
// on CUDA cores.
//
// One block of 8 warps per (batch, head, 64 value columns), sequential over 64-token chunks (linear v3's layout and
// state split). Per chunk, with v2's names (Gs the cumulative gate within a 16-token sub-chunk, D its total, E[a][b]
// the decay over sub-chunks b .. a-1, every exponent <= 0):
//   1. q, k, v (bf16) and g (fp32) on chip, Gs by a running sum per (sub-chunk, channel);
//   2. CUDA cores: the diagonal blocks A_ij = sum_f q_if k_jf exp(Gs_if - Gs_jf) (j <= i in one sub-chunk, 0 above
//      the diagonal) into the bf16 tile P, and the table E;
//   3. CUDA cores, into bf16 tiles: Qr_i = q_i exp(Gs_i) E[a][0] (q_i exp(G_i), the state read), k^_j = k_j exp(D_b -
//      Gs_j), Ke_j = k^_j E[4][b] + 1 (k_j exp(G_C - G_j), the state update), and for each of the 6 pairs b < a the
//      rows Q_ab = q_i exp(Gs_i) E[a][b+1] of sub-chunk a;
//   4. tensor cores: P's blocks below the diagonal, P[a][b] = Q_ab k^_b^T, one warp per pair;
//   5. tensor cores: O = Qr S + P V, times scale;   S <- diag(E[4][0]) S + Ke^T V in registers.
// S is read by the products through a bf16 copy in shared memory, rewritten after each chunk; the fp32 registers are
// the state that is carried and returned. bf16 inputs only, K = 64 or 128, V a multiple of 64.
#include "../common/chunk_tiles.cuh"
#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/simt.cuh"
#include "sub_chunks.cuh"

namespace minilin {
namespace {

using namespace gla_sub_chunks;  // kSub, kSubs, kPairs, pair_index, and the steps both versions share

using narrow::kWarps, narrow::kThreads, narrow::kBlockV, narrow::kLdV, narrow::kLdC;  // common/chunk_tiles.cuh
constexpr int kE = kSubs + 1;             // E[a][b] for a, b in 0 .. kSubs
using bf16 = __nv_bfloat16;

template <int K>
struct Layout {
  static constexpr int kLdK = K + 8;      // bf16 rows of q, k and their decayed forms
  static constexpr int kLdG = K + 4;      // fp32 rows of g (16-byte rows for cp.async)
  static constexpr size_t kBytes = 2 * kChunk * kLdK * sizeof(bf16)      // q, k as loaded
                                   + kChunk * kLdV * sizeof(bf16)        // v
                                   + kChunk * kLdG * sizeof(float)       // g, then Gs
                                   + 3 * kChunk * kLdK * sizeof(bf16)    // Qr, k^, Ke
                                   + kPairs * kSub * kLdK * sizeof(bf16)  // Q_ab
                                   + kChunk * kLdC * sizeof(bf16)        // P
                                   + K * kLdV * sizeof(bf16)             // S (bf16 copy)
                                   + kE * kE * K * sizeof(float);        // E
  unsigned char* base;
  __device__ bf16* q() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* k() const { return q() + kChunk * kLdK; }
  __device__ bf16* v() const { return k() + kChunk * kLdK; }
  __device__ float* G() const { return reinterpret_cast<float*>(v() + kChunk * kLdV); }
  __device__ bf16* Qr() const { return reinterpret_cast<bf16*>(G() + kChunk * kLdG); }
  __device__ bf16* Khat() const { return Qr() + kChunk * kLdK; }
  __device__ bf16* Ke() const { return Khat() + kChunk * kLdK; }
  __device__ bf16* Qpair(int w) const { return Ke() + kChunk * kLdK + w * kSub * kLdK; }
  __device__ bf16* P() const { return Qpair(kPairs); }
  __device__ bf16* S() const { return P() + kChunk * kLdC; }
  __device__ float* E(int a, int b) const { return reinterpret_cast<float*>(S() + K * kLdV) + (a * kE + b) * K; }
};

template <int K>
__global__ void __launch_bounds__(kThreads, 1) gla_v3_chunked_mma(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = Layout<K>::kLdK, kLdG = Layout<K>::kLdG;
  constexpr int kStateTiles = narrow::kStateTiles<K>;  // the state split (narrow::warp_tiles)

  const Layout<K> L{smem};
  const int H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, b);  // sequence b's tokens (common/sequences.cuh)
  const int T = seq.length, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5;
  const WarpTiles tiles = narrow::warp_tiles<K>(warp);  // this warp's tile of O, and of S
  const int s_m0 = tiles.s_m0, s_n0 = tiles.s_n0;

  float S[1][kStateTiles][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  for (int n = 0; n < chunks; ++n) {
    const int t0 = n * kChunk;
    // 1. the chunk on chip (zero past T: a zero gate decays nothing, a zero key and value write nothing)
    {
      cp_async_chunk<K, kBlockV>(L.q(), L.k(), kLdK, L.v(), kLdV, nullptr, p, seq, h, t0, v0);
      cp_async_channel_gate_rows<K>(L.G(), kLdG, p, seq, h, t0);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* q_s = L.q();
    const bf16* k_s = L.k();
    float* G = L.G();
    running_sums_within_sub_chunks<K, kLdG, kThreads>(G);
    __syncthreads();

    // 2. the diagonal blocks of P term by term, and E
    for (int idx = threadIdx.x; idx < kSubs * kSub * kSub; idx += kThreads) {
      const int a = idx / (kSub * kSub), r = (idx / kSub) % kSub, c = idx % kSub;
      const int i = a * kSub + r, j = a * kSub + c;
      float acc = 0.0f;
      if (c <= r) {
        const bf16* qi = q_s + i * kLdK;
        const bf16* kj = k_s + j * kLdK;
        const float* Gi = G + i * kLdG;
        const float* Gj = G + j * kLdG;
        for (int f = 0; f < K; ++f) acc = fmaf(to_float(qi[f]) * to_float(kj[f]), __expf(Gi[f] - Gj[f]), acc);
      }
      L.P()[i * kLdC + j] = __float2bfloat16_rn(acc);
    }
    for (int f = threadIdx.x; f < K; f += kThreads) {
      float D[kSubs];
#pragma unroll
      for (int a = 0; a < kSubs; ++a) D[a] = G[(a * kSub + kSub - 1) * kLdG + f];
#pragma unroll
      for (int lo = 0; lo < kE; ++lo) {
        float sum = 0.0f;  // D_lo + ... + D_{hi - 1} <= 0
#pragma unroll
        for (int hi = lo; hi < kE; ++hi) {
          L.E(hi, lo)[f] = __expf(sum);
          if (hi < kSubs) sum += D[hi];
        }
      }
    }
    __syncthreads();

    // 3. the decayed operands of the products, in bf16
    for (int idx = threadIdx.x; idx < kChunk * K; idx += kThreads) {
      const int i = idx / K, f = idx % K, a = i / kSub;
      const float Gi = G[i * kLdG + f];
      const float D = G[(a * kSub + kSub - 1) * kLdG + f];
      const float qf = to_float(q_s[i * kLdK + f]) * __expf(Gi);       // q~: from the sub-chunk's start
      const float kf = to_float(k_s[i * kLdK + f]) * __expf(D - Gi);   // k^: to the sub-chunk's end
      L.Qr()[i * kLdK + f] = __float2bfloat16_rn(qf * L.E(a, 0)[f]);
      L.Khat()[i * kLdK + f] = __float2bfloat16_rn(kf);
      L.Ke()[i * kLdK + f] = __float2bfloat16_rn(kf * L.E(kSubs, a + 1)[f]);
      for (int bb = 0; bb < a; ++bb)
        L.Qpair(pair_index(a, bb))[(i - a * kSub) * kLdK + f] = __float2bfloat16_rn(qf * L.E(a, bb + 1)[f]);
    }
    __syncthreads();

    // 4. P's blocks below the diagonal: P[a][b] = Q_ab k^_b^T, one warp per pair
    pair_products<K, kLdK, kLdC>(warp, L.Qpair(warp), L.Khat(), L.P());
    __syncthreads();

    // 5. O = Qr S + P V, times scale; then S <- diag(E[4][0]) S + Ke^T V in registers
    read_and_update_state<K, kLdK, kLdC, kLdV>(S, tiles, L.Qr(), L.Ke(), L.P(), L.v(), L.S(), L.E(kSubs, 0), o, seq, H,
                                               V, h, t0, v0, p.scale);
    __syncthreads();  // every read of the bf16 copy of S, and of this chunk's tiles, is done
    store_state_copy(S, L.S(), kLdV, s_m0, s_n0);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

template <int K>
void launch(const Problem& p) {
  launch_checked(p, "gla_v3_chunked_mma", gla_v3_chunked_mma<K>, dim3(p.V / kBlockV, p.H, p.B), kThreads,
                 Layout<K>::kBytes);
}

void forward(const Problem& p) {
  check_tensor_core_problem(p, "gla_v3_chunked_mma", false, kBlockV);
  require_channel_gate(p, "gla_v3_chunked_mma");
  if (p.K == 64) launch<64>(p);
  else launch<128>(p);
}

}  // namespace

extern const Version gla_v3 = {
    "gla", 3, "chunked_mma",
    "v2's chunks with the products below the diagonal, the state read and update on bf16 tensor cores (mma.sync, "
    "fp32 accumulators), the state in registers; the diagonal 16-token blocks on CUDA cores.",
    false, true, kTensorCoreShape, 80, nullptr, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
