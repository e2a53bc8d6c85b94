// kda v10 (head dim 256): kda v6's sliced prepare at K = 256 and a pass over chunks in the 16-warp layout whose one
// stage of tiles is refilled in two halves as each chunk's phases free them, because no tensor-core version of KDA
// took K = 256 (the default ran the token loop v1 there: the grid's (8, 2048, 32, K = V = 256) cell) and at K = 256
// v3's pass does not fit an SM: three 256-wide tiles (Qr, Kg, Ke) make a stage 127 KB, two stages 254 KB.
//
// The algebra is v3's (kda/v3_prepared_chunks.cu; the workspace kda/prepared_tiles.cuh):
//   X = V - Kg S;   Delta = (T diag(beta)) X;   O = scale (Qr S + P Delta);   S <- diag(d) S + Ke^T Delta.
// The prepare is v6's (kda/v4_sliced_prepare.cu, 64 key channels on chip at a time, so any K), the same tiles
// at K = 256. The pass, one block of 16 warps per (batch, head, 64 value columns), chunk after chunk: each warp one
// 16 x 16 tile of X, Delta and O (common/chunk_tiles.cuh wide::warp_tiles<256>) and one 16-row tile of S of its own
// (32 fp32 a thread, as linear v9 and gla v6 at K = 256), S read by the products through one bf16 copy. Shared
// memory (181 KB, one block per SM):
//   first tiles   Qr, Kg [64, 256 + 8], v [64, 64 + 8]               75 KB   read by phase 1 only
//   later tiles   T diag(beta), P [64, 64 + 8], Ke [64, 256 + 8], d  52 KB   read by phases 2 and 3 only
//   S's bf16 copy [256, 64 + 8], X and Delta [64, 64 + 8]            54 KB
// and the three phases of chunk n, each closed by a barrier:
//   1. X = V - Kg S and Qr S (one k loop, each S fragment read once: kda v7's), X stored; chunk n's later tiles
//      arrive meanwhile (asked for after the barrier that opened the chunk);
//   2. (the first tiles are free: chunk n + 1's asked for)  Delta = (T diag(beta)) X, stored;
//   3. O = scale (Qr S + P Delta), S <- diag(d) S + Ke^T Delta, and S's copy rewritten at once (its last reader
//      was phase 1, behind two barriers).
// So every tile is in flight during at least one phase of compute (the first tiles during phases 2 and 3, the
// later ones during phase 1), with one stage instead of two, and three barriers a chunk, as kda v8's two copies of
// S give it. Not split along the sequence (kda v9 splits at K = 64 and 128). bf16 inputs only, K = 256, V a
// multiple of 64; reads packed sequences and grouped heads (Problem).
#include "../common/chunk_tiles.cuh"
#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/sequences.cuh"
#include "prepared_tiles.cuh"

namespace minilin {
namespace {

using bf16 = __nv_bfloat16;
using wide::kThreads, wide::kBlockV, wide::kLdV, wide::kLdC;  // common/chunk_tiles.cuh
using kda_prepared::PreparedTiles, kda_prepared::prepared_tiles;

constexpr const char* kName = "kda_v10_head_dim_256";
constexpr int K = 256;
constexpr int kLdK = K + 8;
constexpr int kStateTiles = wide::kStateTiles<K>;  // 8: a warp's 16-row tile of S spans the value block
constexpr int NT = 2;                              // a warp's 16 x 16 tile of X, Delta and O

struct ChunkLayout {
  static constexpr size_t kFirstBytes = 2 * kChunk * kLdK * sizeof(bf16)  // Qr, Kg
                                        + kChunk * kLdV * sizeof(bf16);   // v
  static constexpr size_t kLaterBytes = 2 * kChunk * kLdC * sizeof(bf16)  // T diag(beta), P
                                        + kChunk * kLdK * sizeof(bf16)    // Ke
                                        + K * sizeof(float);              // d
  static constexpr size_t kBytes = kFirstBytes + kLaterBytes + K * kLdV * sizeof(bf16)  // + S (bf16 copy)
                                   + 2 * kChunk * kLdV * sizeof(bf16);                  // + X, Delta
  unsigned char* base;
  __device__ bf16* Qr() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* Kg() const { return Qr() + kChunk * kLdK; }
  __device__ bf16* v() const { return Kg() + kChunk * kLdK; }
  __device__ bf16* Tb() const { return reinterpret_cast<bf16*>(base + kFirstBytes); }
  __device__ bf16* P() const { return Tb() + kChunk * kLdC; }
  __device__ bf16* Ke() const { return P() + kChunk * kLdC; }
  __device__ float* decay() const { return reinterpret_cast<float*>(Ke() + kChunk * kLdK); }
  __device__ bf16* S() const { return reinterpret_cast<bf16*>(base + kFirstBytes + kLaterBytes); }
  __device__ bf16* X() const { return S() + K * kLdV; }
  __device__ bf16* delta() const { return X() + kChunk * kLdV; }
};
// One block per SM (233472 bytes per SM, 1 KB of it reserved per block); two stages of both halves would not fit.
static_assert(ChunkLayout::kBytes + 1024 <= 233472, "the pass's block fits an SM");
static_assert(ChunkLayout::kBytes + ChunkLayout::kFirstBytes + 1024 > 233472, "a second stage of the first tiles does not");

// Chunk n's first tiles (Qr, Kg and value columns [v0, v0 + 64), values past the sequence's end zero), one commit
// group.
__device__ __forceinline__ void copy_first_tiles(const ChunkLayout& L, const Problem& p, const SequenceRows& seq, int h,
                                                 int n, int v0) {
  const PreparedTiles in = prepared_tiles<K>(p, h, seq.chunk0 + n);
  cp_async_tile<kThreads, kChunk, K>(L.Qr(), kLdK, in.qr, K);
  cp_async_tile<kThreads, kChunk, K>(L.Kg(), kLdK, in.kg, K);
  cp_async_value_tile<kThreads, kBlockV>(L.v(), kLdV, p, seq, h, n * kChunk, v0);
  cp_async_commit();
}

// Chunk n's later tiles (T diag(beta), P, Ke, d), one commit group.
__device__ __forceinline__ void copy_later_tiles(const ChunkLayout& L, const Problem& p, const SequenceRows& seq, int h,
                                                 int n) {
  const PreparedTiles in = prepared_tiles<K>(p, h, seq.chunk0 + n);
  cp_async_tile<kThreads, kChunk, kChunk>(L.Tb(), kLdC, in.solve, kChunk);
  cp_async_tile<kThreads, kChunk, kChunk>(L.P(), kLdC, in.scores, kChunk);
  cp_async_tile<kThreads, kChunk, K>(L.Ke(), kLdK, in.ke, K);
  cp_async_tile<kThreads, 1, K>(L.decay(), K, in.decay, K);
  cp_async_commit();
}

__global__ void __launch_bounds__(kThreads, 1) kda_v10_chunks(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const ChunkLayout L{smem};
  const int H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, b);
  const int chunks = chunk_count(seq.length);
  const auto [m0, n0, s_m0, s_n0] = wide::warp_tiles<K>(threadIdx.x >> 5);  // tiles of X, Delta, O; of S

  float S[1][kStateTiles][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  if (chunks > 0) {
    copy_first_tiles(L, p, seq, h, 0, v0);
    copy_later_tiles(L, p, seq, h, 0);
  }
  for (int n = 0; n < chunks; ++n) {
    // Chunk n's first tiles (chunk 0's later ones may still be in flight) and S's copy visible to every warp; every
    // warp is past chunk n - 1's phase 3, so the later tiles' buffers are free for chunk n's.
    if (n == 0) cp_async_wait<1>(); else cp_async_wait<0>();
    __syncthreads();
    if (n > 0) copy_later_tiles(L, p, seq, h, n);

    // 1. X = V - Kg S (what the memory mispredicts), in bf16, beside Qr S (O's first term)
    float out[1][NT][4];
    zero(out);
    {
      float acc[1][NT][4];
      zero(acc);
      warp_mma_shared_b<NT, Stored::kRowMajor, K / 16>(acc, out, L.Kg(), L.Qr(), kLdK, L.S(), kLdV, m0, n0);
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e);
          const float2 v2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.v() + r * kLdV + c));
          store_bf16x2(L.X() + r * kLdV + c, v2.x - acc[0][j][e], v2.y - acc[0][j][e + 1]);
        }
    }
    cp_async_wait<0>();  // chunk n's later tiles
    __syncthreads();     // X and the later tiles visible; every read of Qr, Kg, v and S's copy is done
    if (n + 1 < chunks) copy_first_tiles(L, p, seq, h, n + 1, v0);

    // 2. Delta = (T diag(beta)) X, lower triangular: this warp's rows need X's rows up to its diagonal block
    {
      float acc[1][NT][4];
      zero(acc);
      warp_mma<1, NT, Stored::kRowMajor, Stored::kRowMajor>(acc, L.Tb(), kLdC, L.X(), kLdV, m0, n0, 0, m0 + 16);
      store_tile_bf16(acc, L.delta(), kLdV, m0, n0);
    }
    __syncthreads();

    // 3. O = scale (Qr S + P Delta), P zero above the diagonal, so P Delta stops at this warp's diagonal block;
    //    S <- diag(d) S + Ke^T Delta in registers, then its bf16 copy for chunk n + 1
    const float* decay = L.decay();
#pragma unroll
    for (int j = 0; j < kStateTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[0][j][e] *= decay[s_m0 + acc_row(0, e)];
    warp_mma_unrolled<1, NT, Stored::kRowMajor, Stored::kRowMajor, kChunk / 16>(out, L.P(), kLdC, L.delta(), kLdV, m0,
                                                                                n0, 0, m0 / 16 + 1);
    warp_mma_unrolled<1, kStateTiles, Stored::kTransposed, Stored::kRowMajor, kChunk / 16>(S, L.Ke(), kLdK, L.delta(),
                                                                                         kLdV, s_m0, s_n0, 0);
    store_output_tile(out, o, seq, H, V, h, n * kChunk, v0, m0, n0, p.scale);
    store_state_copy(S, L.S(), kLdV, s_m0, s_n0);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

void forward(const Problem& p) {
  check_common(p, kName, true);
  require_head_dim_256_shape(kName, p.dtype, p.K, p.V, kBlockV, "v3 to v9");
  require_channel_gate(p, kName);
  require_workspace(p, kName, kda_prepared::prepared_bytes(p.B, p.T, p.H, p.K, p.V, p.cu_seqlens != nullptr));
  kda_prepared::launch_sliced_prepare(p, /*halves=*/true);
  launch_checked(p, "kda_v10_chunks", kda_v10_chunks, dim3(p.V / kBlockV, p.H, p.B), kThreads, ChunkLayout::kBytes);
}

}  // namespace

extern const Version kda_v10 = {
    "kda", 10, "head_dim_256",
    "v6's sliced prepare at K = 256 and a 16-warp pass whose one stage of tiles is refilled in two halves as each "
    "chunk's phases free them (two stages of three 256-wide tiles would not fit an SM), because no tensor-core "
    "version of KDA took K = 256 and the default ran the token loop there.",
    false, true, kTensorCoreShape256, 90, kda_prepared::prepared_bytes, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
