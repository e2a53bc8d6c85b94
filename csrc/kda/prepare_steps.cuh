// The steps of kda's prepare kernel that v3 and v4 take alike (kda/v3_prepared_chunks.cu has the algebra; v4 runs
// the first on each 64-channel slice of the keys): the decayed operands of a chunk's channels, and the WY solve
// with the workspace's last two tiles.
#pragma once

#include <cuda_bf16.h>

#include "../common/mma.cuh"                // store_bf16x2
#include "../common/simt.cuh"               // to_float
#include "../delta/wy_prepare_blocked.cuh"  // wy_blocked::solve_unit_lower, kLd
#include "../gla/sub_chunks.cuh"
#include "prepared_tiles.cuh"

namespace minilin {
namespace kda_prepared {

// Step 3 for channels [c0, c0 + kChannels) of a K-wide problem, two channels per thread of the block's kThreads:
// Qr = q exp(G), Kg = k exp(G) and Ke = k exp(G_C - G) straight to the workspace (out), d = exp(G_C); on chip the
// rows Q_ab = q~ E[a][b+1] and K_ab = k~ E[a][b+1] of each pair b < a (pair w at q_pairs / k_pairs + w 16 kLdK) and
// k^ = k exp(D_a - Gs) over k in place. q_s, k_s: the channels' bf16 rows (stride kLdK); G: their Gs (stride
// kLdG); E: their decay table [kDecays][kChannels] (gla_sub_chunks::fill_decays).
template <int K, int kChannels, int kLdK, int kLdG, int kThreads>
__device__ __forceinline__ void decayed_operands(const __nv_bfloat16* q_s, __nv_bfloat16* k_s, const float* G,
                                                 const float* E, __nv_bfloat16* q_pairs, __nv_bfloat16* k_pairs,
                                                 const PreparedTiles& out, int c0) {
  using namespace gla_sub_chunks;
  const auto table = [&](int hi, int lo) { return E + decay_index(hi, lo) * kChannels; };
  for (int idx = threadIdx.x; idx < kChunk * kChannels / 2; idx += kThreads) {
    const int i = idx / (kChannels / 2), f = 2 * (idx % (kChannels / 2)), a = i / kSub;
    float qd[2], kt[2], kh[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float Gi = G[i * kLdG + f + u];
      const float D = G[(a * kSub + kSub - 1) * kLdG + f + u];
      const float from_start = __expf(Gi), to_end = __expf(D - Gi);
      qd[u] = to_float(q_s[i * kLdK + f + u]) * from_start;  // q~: from the sub-chunk's start
      kt[u] = to_float(k_s[i * kLdK + f + u]) * from_start;  // k~
      kh[u] = to_float(k_s[i * kLdK + f + u]) * to_end;      // k^: to the sub-chunk's end
    }
    const float* to_chunk = table(a, 0);            // from the chunk's start to the sub-chunk's
    const float* from_chunk = table(kSubs, a + 1);  // from the sub-chunk's end to the chunk's
    const int col = i * K + c0 + f;
    store_bf16x2(out.qr + col, qd[0] * to_chunk[f], qd[1] * to_chunk[f + 1]);
    store_bf16x2(out.kg + col, kt[0] * to_chunk[f], kt[1] * to_chunk[f + 1]);
    store_bf16x2(out.ke + col, kh[0] * from_chunk[f], kh[1] * from_chunk[f + 1]);
    store_bf16x2(k_s + i * kLdK + f, kh[0], kh[1]);
    for (int bb = 0; bb < a; ++bb) {
      const float* Eab = table(a, bb + 1);
      const int row = pair_index(a, bb) * kSub * kLdK + (i - a * kSub) * kLdK + f;
      store_bf16x2(q_pairs + row, qd[0] * Eab[f], qd[1] * Eab[f + 1]);
      store_bf16x2(k_pairs + row, kt[0] * Eab[f], kt[1] * Eab[f + 1]);
    }
  }
  for (int f = threadIdx.x; f < kChannels; f += kThreads) out.decay[c0 + f] = table(kSubs, 0)[f];
}

// Step 5: T = (I + A)^-1 by blocks (fp32, A complete in shared rows of stride wy_blocked::kLd, its blocks above the diagonal the solve's
// scratch; T into Tm), then
// T diag(beta) (T alone when kTimesBeta is false) and P (bf16 shared rows of stride kLdC) into the workspace, 8 bf16
// (16 bytes) per thread and step, zeros above the diagonal blocks.
template <int kLdC, int kThreads, bool kTimesBeta = true>
__device__ __forceinline__ void solve_and_store(float* A, float* Tm, const __nv_bfloat16* P, const float* beta,
                                                const PreparedTiles& out, int warp) {
  using gla_sub_chunks::kSub;
  constexpr int kLdA = wy_blocked::kLd;
  wy_blocked::solve_unit_lower<wy_blocked::WaveProducts::kCudaCores>(A, Tm, warp, threadIdx.x);
  for (int e = threadIdx.x * 8; e < kChunk * kChunk; e += kThreads * 8) {
    const int r = e / kChunk, c = e % kChunk;
    const bool above = c / kSub > r / kSub;
    const uint4 zeros = make_uint4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4*>(out.scores + e) = above ? zeros : *reinterpret_cast<const uint4*>(P + r * kLdC + c);
    unsigned packed[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c0 = c + 2 * u;
      const float x = above ? 0.0f : Tm[r * kLdA + c0] * (kTimesBeta ? beta[c0] : 1.0f);
      const float y = above ? 0.0f : Tm[r * kLdA + c0 + 1] * (kTimesBeta ? beta[c0 + 1] : 1.0f);
      const __nv_bfloat162 pair = __floats2bfloat162_rn(x, y);
      packed[u] = *reinterpret_cast<const unsigned*>(&pair);
    }
    *reinterpret_cast<uint4*>(out.solve + e) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

}  // namespace kda_prepared
}  // namespace minilin
