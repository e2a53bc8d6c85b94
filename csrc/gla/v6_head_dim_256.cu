// gla v6 (head dim 256): gla v4's two launches at K = 256, the prepare run on each half of the key channels and
// the pass over chunks in the 16-warp layout, because no tensor-core version of GLA took K = 256 and the default
// fell back to the token loop v1 there (the grid's (8, 2048, 32, K = V = 256) cell, HGRN2 with wide heads).
//
// Why the halves are enough (gla/prepared_tiles.cuh's names; G the chunk-local cumulative gate, per channel):
//   Qr = q exp(G),  Ke = k exp(G_C - G),  d = exp(G_C)      each entry reads its own key channel only,
//   P[i][j] = sum_f q_i[f] k_j[f] exp(G_i[f] - G_j[f])     a sum over channels: P = P_lo + P_hi,
// so v4's prepare at K = 128 on channels [0, 128) and [128, 256) of every head (`launch_prepare_halves`: two blocks
// per SM as at K = 128, none of its code specific to the width) gives every tile of K = 256: Qr, Ke and d are the
// two halves' side by side, P the sum of their two P. The pass over chunks is then v4's:
//   O = scale (Qr S + (P_lo + P_hi) V),     S <- diag(d) S + Ke^T V,
// S [256, 64 value columns] in fp32 registers across chunks, on bf16 tensor cores (mma.sync m16n8k16, fp32
// accumulators). What grows with K, per block (one per (batch, head, 64 value columns), sequential over chunks):
//   a stage (Qr and Ke rows of 256 + 8, the two P, v rows of 64 + 8, d)   94 KB   (v4 at K = 128: 52 KB)
//   the bf16 copy of S [256, 64]                                           36 KB   (18 KB)
// two stages (the next chunk's tiles copied while this one computes, as v4) take 224 KB, one block per SM; in
// v4's 8-warp layout each warp would hold two row tiles of S (64 floats a thread), so the pass runs 16 warps, each
// one 16 x 16 tile of O and one 16-row tile of S of its own (common/chunk_tiles.cuh wide::warp_tiles<256>: 32
// floats a thread). P_lo + P_hi is formed by the products, P_lo V + P_hi V, each stopping at the warp's diagonal
// block (both tiles zero above it).
// Not split along the sequence: at one long sequence the pass holds (V / 64) H blocks (gla v5's split at K = 64
// and 128). bf16 inputs only, K = 256, V a multiple of 64; reads packed sequences and grouped heads (Problem).
#include "../common/chunk_tiles.cuh"
#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/sequences.cuh"
#include "prepared_tiles.cuh"
#include "sub_chunks.cuh"

namespace minilin {
namespace {

using bf16 = __nv_bfloat16;
using wide::kThreads, wide::kBlockV, wide::kLdV, wide::kLdC;  // common/chunk_tiles.cuh

constexpr const char* kName = "gla_v6_head_dim_256";
constexpr int K = 256, kHalf = K / 2;
constexpr int kStateTiles = wide::kStateTiles<K>;  // 8: a warp's 16-row tile of S spans the value block
constexpr int kOutTiles = 2;                       // a warp's 16 x 16 tile of O (wide::warp_tiles)

// The prepared tiles of the two halves: v4's workspace at K = 128 for 2 H heads.
size_t workspace_bytes(int B, int T, int H, int K_, int V, bool packed) {
  if (B <= 0 || T <= 0 || H <= 0 || K_ <= 0 || V <= 0) return 0;
  return gla_prepared::prepared_bytes(B, T, 2 * H, kHalf, packed);
}

struct ChunkLayout {
  static constexpr int kLdK = K + 8;
  static constexpr int kStages = 2;
  static constexpr size_t kStageBytes = 2 * kChunk * kLdK * sizeof(bf16)  // Qr, Ke
                                        + 2 * kChunk * kLdC * sizeof(bf16)  // P_lo, P_hi
                                        + kChunk * kLdV * sizeof(bf16)    // v
                                        + K * sizeof(float);              // d
  static constexpr size_t kBytes = kStages * kStageBytes + K * kLdV * sizeof(bf16);  // + S (bf16 copy)
  unsigned char* base;
  __device__ bf16* Qr(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* Ke(int s) const { return Qr(s) + kChunk * kLdK; }
  __device__ bf16* P(int s) const { return Ke(s) + kChunk * kLdK; }  // P_lo, then P_hi kChunk rows on
  __device__ bf16* v(int s) const { return P(s) + 2 * kChunk * kLdC; }
  __device__ float* decay(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ bf16* S() const { return reinterpret_cast<bf16*>(base + kStages * kStageBytes); }
};
// One block per SM (233472 bytes per SM, 1 KB of it reserved per block).
static_assert(ChunkLayout::kBytes + 1024 <= 233472, "the pass's block fits an SM");

// Chunk n's tiles, both halves' (channels [128 s, 128 s + 128) from head 2 h + s of the halves' workspace), and
// value columns [v0, v0 + 64) into stage s (values past the sequence's end zero).
__device__ __forceinline__ void copy_chunk(const ChunkLayout& L, int s, const Problem& p, const SequenceRows& seq,
                                           int h, int n, int v0) {
  constexpr int kLdK = ChunkLayout::kLdK;
  const long long rows = chunk_rows(p.B, p.T, p.cu_seqlens != nullptr);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    using gla_prepared::PreparedTiles;
    const PreparedTiles in =
        gla_prepared::prepared_tiles<kHalf>(p.workspace, rows, 2 * p.H, 2 * h + half, seq.chunk0 + n);
    cp_async_tile<kThreads, kChunk, kHalf>(L.Qr(s) + half * kHalf, kLdK, in.qr, kHalf);
    cp_async_tile<kThreads, kChunk, kHalf>(L.Ke(s) + half * kHalf, kLdK, in.ke, kHalf);
    cp_async_tile<kThreads, kChunk, kChunk>(L.P(s) + half * kChunk * kLdC, kLdC, in.scores, kChunk);
    cp_async_tile<kThreads, 1, kHalf>(L.decay(s) + half * kHalf, K, in.decay, kHalf);
  }
  cp_async_value_tile<kThreads, kBlockV>(L.v(s), kLdV, p, seq, h, n * kChunk, v0);
  cp_async_commit();
}

__global__ void __launch_bounds__(kThreads, 1) gla_v6_chunks(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = ChunkLayout::kLdK;

  const ChunkLayout L{smem};
  const int H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, b);
  const int chunks = chunk_count(seq.length);
  const WarpTiles tiles = wide::warp_tiles<K>(threadIdx.x >> 5);  // this warp's tile of O, and of S
  const int s_m0 = tiles.s_m0, s_n0 = tiles.s_n0;

  float S[1][kStateTiles][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  if (chunks > 0) copy_chunk(L, 0, p, seq, h, 0, v0);
  for (int n = 0; n < chunks; ++n) {
    const int s = n & 1;
    // The other stage was last read in chunk n - 1, before its closing barrier.
    if (n + 1 < chunks) {
      copy_chunk(L, s ^ 1, p, seq, h, n + 1, v0);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // stage s, and the bf16 copy of S written after chunk n - 1, visible to every warp

    // O = scale (Qr S + (P_lo + P_hi) V), then S <- diag(d) S + Ke^T V in registers (gla/sub_chunks.cuh)
    gla_sub_chunks::read_and_update_state<K, kLdK, kLdC, kLdV, kOutTiles, kStateTiles, 2>(
        S, tiles, L.Qr(s), L.Ke(s), L.P(s), L.v(s), L.S(), L.decay(s), o, seq, H, V, h, n * kChunk, v0, p.scale);
    __syncthreads();  // every read of the bf16 copy of S and of stage s is done
    store_state_copy(S, L.S(), kLdV, s_m0, s_n0);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

void forward(const Problem& p) {
  check_common(p, kName, false);
  require_head_dim_256_shape(kName, p.dtype, p.K, p.V, kBlockV, "v3 to v5");
  require_channel_gate(p, kName);
  require_workspace(p, kName, workspace_bytes(p.B, p.T, p.H, p.K, p.V, p.cu_seqlens != nullptr));
  gla_prepared::launch_prepare_halves(p);
  launch_checked(p, "gla_v6_chunks", gla_v6_chunks, dim3(p.V / kBlockV, p.H, p.B), kThreads, ChunkLayout::kBytes);
}

}  // namespace

extern const Version gla_v6 = {
    "gla", 6, "head_dim_256",
    "v4's two launches at K = 256: the prepare on each half of the key channels (every tile but P is per channel, "
    "and P is the halves' sum) and the pass over chunks in the 16-warp layout with two stages in 224 KB, because "
    "no tensor-core version of GLA took K = 256 and the default ran the token loop there.",
    false, true, kTensorCoreShape256, 90, workspace_bytes, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
