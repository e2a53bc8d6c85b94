// gla v4 (prepared chunks): v3's chunk-local work (the decayed scores P, the decayed queries and keys, the chunk's
// decay) moved into a kernel parallel over every chunk of every head, so that the pass that must run chunk after
// chunk is only v3's step 5, on tiles it copies one chunk ahead; v3 ran all of it inside that pass, once per value
// block, with nothing in flight while it waited for each chunk's loads.
//
// Two kernels, with v3's names (G the chunk-local cumulative gate, Gs its running sum within a 16-token sub-chunk,
// E[a][b] the decay over sub-chunks b .. a-1, every exponent <= 0):
//   prepare, one block of 8 warps per (chunk, head): v3's steps 1-4 (q, k, g on chip; the diagonal 16 x 16 blocks of
//     P on CUDA cores, one exponential per term and channel; the blocks below the diagonal on tensor cores from the
//     sub-chunk references), then into the workspace, per chunk row (common/sequences.cuh) and head:
//       Qr = q exp(G)          [64, K] bf16    the queries decayed from the chunk's start (the state read)
//       Ke = k exp(G_C - G)    [64, K] bf16    the keys decayed to its end (the state update)
//       P                      [64, 64] bf16   the causal decayed scores, zeros above the diagonal
//       d  = exp(G_C)          [K] fp32        the decay over the whole chunk, per key channel
//   chunks, one block of 8 warps per (batch, head, 64 value columns), sequential over chunks: copies chunk n + 1's
//     Qr, Ke, P, d and values while it computes chunk n's
//       O = scale (Qr S + P V),     S <- diag(d) S + Ke^T V
//     on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulators), S in fp32 registers across chunks (v3's split)
//     and read by the products through a bf16 copy in shared memory.
// The workspace holds (2 K + 64) bf16 numbers per token and head and K fp32 per chunk and head (41 KB per chunk and
// head at K = 128).
// bf16 inputs only, K = 64 or 128, V a multiple of 64; reads packed sequences and grouped heads (Problem).
#include "../common/chunk_tiles.cuh"
#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/sequences.cuh"
#include "../common/simt.cuh"
#include "prepared_tiles.cuh"
#include "sub_chunks.cuh"

namespace minilin {
namespace {

using namespace gla_sub_chunks;  // kSub, kSubs, kPairs, pair_index, the decay table E, and the shared steps
using namespace gla_prepared;    // the workspace's tiles

using bf16 = __nv_bfloat16;
using narrow::kWarps, narrow::kThreads, narrow::kBlockV, narrow::kLdV, narrow::kLdC;  // common/chunk_tiles.cuh

// The workspace (gla/prepared_tiles.cuh): Qr, Ke, P and d of every chunk row and head.
size_t workspace_bytes(int B, int T, int H, int K, int V, bool packed) {
  if (B <= 0 || T <= 0 || H <= 0 || K <= 0 || V <= 0) return 0;
  return prepared_bytes(B, T, H, K, packed);
}

// ---- prepare: one block per (chunk, head) -------------------------------------------------------------------------
template <int K>
struct PrepareLayout {
  static constexpr int kLdK = K + 8;      // bf16 rows of q, k and their decayed forms
  static constexpr int kLdG = K + 4;      // fp32 rows of g (16-byte rows for cp.async)
  static constexpr size_t kBytes = 2 * kChunk * kLdK * sizeof(bf16)       // q; k, then k^ in place
                                   + kChunk * kLdG * sizeof(float)        // g, then Gs
                                   + kPairs * kSub * kLdK * sizeof(bf16)  // Q_ab
                                   + kChunk * kLdC * sizeof(bf16)         // P
                                   + kDecays * K * sizeof(float);         // E
  unsigned char* base;
  __device__ bf16* q() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* k() const { return q() + kChunk * kLdK; }
  __device__ float* G() const { return reinterpret_cast<float*>(k() + kChunk * kLdK); }
  __device__ bf16* Qpair(int w) const { return reinterpret_cast<bf16*>(G() + kChunk * kLdG) + w * kSub * kLdK; }
  __device__ bf16* P() const { return Qpair(kPairs); }
  __device__ float* E(int hi, int lo) const {
    return reinterpret_cast<float*>(P() + kChunk * kLdC) + decay_index(hi, lo) * K;
  }
};
// Two blocks per SM at K = 128 (233472 bytes per SM, 1 KB of it reserved per block).
static_assert(2 * (PrepareLayout<128>::kBytes + 1024) <= 233472, "two prepare blocks per SM");

// kSlices > 1 (gla v6 at K = 256): q, k and g rows are kSlices K channels wide, and block y = h kSlices + slice
// prepares channels [slice K, slice K + K) of head h as head y of a workspace of H kSlices heads: every tile but P
// is per channel, and P is the sum of the slices' P (gla/prepared_tiles.cuh).
template <int K, int kSlices = 1>
__global__ void __launch_bounds__(kThreads, 2) gla_v4_prepare(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = PrepareLayout<K>::kLdK, kLdG = PrepareLayout<K>::kLdG;
  const PrepareLayout<K> L{smem};
  const ChunkOfBlock chunk = chunk_of_block(p);  // (common/sequences.cuh)
  if (!chunk.used) return;
  const int h = blockIdx.y / kSlices, c0 = (blockIdx.y % kSlices) * K;
  const SequenceRows seq = sequence_rows(p, chunk.b);
  const int t0 = chunk.n * kChunk;
  const PreparedTiles out = prepared_tiles<K>(p.workspace, chunk_rows(p.B, p.T, p.cu_seqlens != nullptr),
                                              p.H * kSlices, blockIdx.y, seq.chunk0 + chunk.n);
  const int warp = threadIdx.x >> 5;

  // 1. q, k (bf16) and g (fp32) on chip, zero past the sequence's end (a zero gate decays nothing, a zero key writes
  //    nothing); Gs by a running sum per (sub-chunk, channel)
  cp_async_qk_rows<K * kSlices, K>(L.q(), L.k(), kLdK, p, seq, h, t0, c0);
  cp_async_channel_gate_rows<K * kSlices, K>(L.G(), kLdG, p, seq, h, t0, c0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const bf16* q_s = L.q();
  bf16* k_s = L.k();
  float* G = L.G();
  running_sums_within_sub_chunks<K, kLdG, kThreads>(G);
  __syncthreads();

  // 2. the diagonal blocks of P term by term, each thread one of the 136 causal entries (r, c), c <= r, of a block
  //    (v3 gave every thread an entry of the whole 16 x 16 block, so half the lanes of each warp idled over the
  //    zeros above the diagonal), two channels per shared-memory load; the same sums in the same order as v3's.
  //    Then the zeros above the diagonal, and E.
  constexpr int kTerms = kSub * (kSub + 1) / 2;
  for (int idx = threadIdx.x; idx < kSubs * kTerms; idx += kThreads) {
    const int a = idx / kTerms, t = idx % kTerms;
    int r, c;
    triangular_entry(t, r, c);
    const int i = a * kSub + r, j = a * kSub + c;
    const bf16* qi = q_s + i * kLdK;
    const bf16* kj = k_s + j * kLdK;
    const float* Gi = G + i * kLdG;
    const float* Gj = G + j * kLdG;
    float acc = 0.0f;
    for (int f = 0; f < K; f += 2) {
      const __nv_bfloat162 q2 = *reinterpret_cast<const __nv_bfloat162*>(qi + f);
      const __nv_bfloat162 k2 = *reinterpret_cast<const __nv_bfloat162*>(kj + f);
      const float2 gi = *reinterpret_cast<const float2*>(Gi + f);
      const float2 gj = *reinterpret_cast<const float2*>(Gj + f);
      acc = fmaf(__low2float(q2) * __low2float(k2), __expf(gi.x - gj.x), acc);
      acc = fmaf(__high2float(q2) * __high2float(k2), __expf(gi.y - gj.y), acc);
    }
    L.P()[i * kLdC + j] = __float2bfloat16_rn(acc);
  }
  for (int idx = threadIdx.x; idx < kSubs * kSub * kSub; idx += kThreads) {
    const int a = idx / (kSub * kSub), r = (idx / kSub) % kSub, c = idx % kSub;
    if (c > r) L.P()[(a * kSub + r) * kLdC + a * kSub + c] = __float2bfloat16_rn(0.0f);
  }
  fill_decays<K, kLdG, kThreads>(G, L.E(0, 0));
  __syncthreads();

  // 3. the decayed operands, two channels per thread: Qr and Ke straight to the workspace; k^_j = k_j exp(D_b - Gs_j)
  //    (to the sub-chunk's end) over k in place, and the rows Q_ab = q_i exp(Gs_i) E[a][b+1] of each pair b < a
  for (int idx = threadIdx.x; idx < kChunk * K / 2; idx += kThreads) {
    const int i = idx / (K / 2), f = 2 * (idx % (K / 2)), a = i / kSub;
    float qd[2], kd[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float Gi = G[i * kLdG + f + u];
      const float D = G[(a * kSub + kSub - 1) * kLdG + f + u];
      qd[u] = to_float(q_s[i * kLdK + f + u]) * __expf(Gi);      // q~: from the sub-chunk's start
      kd[u] = to_float(k_s[i * kLdK + f + u]) * __expf(D - Gi);  // k^: to the sub-chunk's end
    }
    store_bf16x2(out.qr + i * K + f, qd[0] * L.E(a, 0)[f], qd[1] * L.E(a, 0)[f + 1]);
    store_bf16x2(out.ke + i * K + f, kd[0] * L.E(kSubs, a + 1)[f], kd[1] * L.E(kSubs, a + 1)[f + 1]);
    store_bf16x2(k_s + i * kLdK + f, kd[0], kd[1]);
    for (int bb = 0; bb < a; ++bb)
      store_bf16x2(L.Qpair(pair_index(a, bb)) + (i - a * kSub) * kLdK + f, qd[0] * L.E(a, bb + 1)[f],
                   qd[1] * L.E(a, bb + 1)[f + 1]);
  }
  for (int f = threadIdx.x; f < K; f += kThreads) out.decay[f] = L.E(kSubs, 0)[f];
  __syncthreads();

  // 4. P's blocks below the diagonal: P[a][b] = Q_ab k^_b^T, one warp per pair
  pair_products<K, kLdK, kLdC>(warp, L.Qpair(warp), k_s, L.P());
  __syncthreads();

  // 5. P into the workspace, 16 bytes per thread and step, zeros for the blocks above the diagonal
  for (int e = threadIdx.x * 8; e < kChunk * kChunk; e += kThreads * 8) {
    const int r = e / kChunk, c = e % kChunk;
    const uint4 zeros = make_uint4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4*>(out.scores + e) =
        c / kSub > r / kSub ? zeros : *reinterpret_cast<const uint4*>(L.P() + r * kLdC + c);
  }
}

// ---- chunks: one block per (batch, head, 64 value columns), chunk after chunk -----------------------------------
template <int K>
struct ChunkLayout {
  static constexpr int kLdK = K + 8;
  static constexpr int kStages = 2;
  static constexpr size_t kStageBytes = 2 * kChunk * kLdK * sizeof(bf16)  // Qr, Ke
                                        + kChunk * kLdC * sizeof(bf16)    // P
                                        + kChunk * kLdV * sizeof(bf16)    // v
                                        + K * sizeof(float);              // d
  static constexpr size_t kBytes = kStages * kStageBytes + K * kLdV * sizeof(bf16);  // + S (bf16 copy)
  unsigned char* base;
  __device__ bf16* Qr(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* Ke(int s) const { return Qr(s) + kChunk * kLdK; }
  __device__ bf16* P(int s) const { return Ke(s) + kChunk * kLdK; }
  __device__ bf16* v(int s) const { return P(s) + kChunk * kLdC; }
  __device__ float* decay(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ bf16* S() const { return reinterpret_cast<bf16*>(base + kStages * kStageBytes); }
};

// Chunk n's prepared tiles and value columns [v0, v0 + 64) into stage s (values past the sequence's end zero).
template <int K>
__device__ __forceinline__ void copy_chunk(const ChunkLayout<K>& L, int s, const Problem& p, const SequenceRows& seq,
                                           int h, int n, int v0) {
  constexpr int kLdK = ChunkLayout<K>::kLdK;
  const PreparedTiles in = prepared_tiles<K>(p, h, seq.chunk0 + n);
  const int t0 = n * kChunk;
  cp_async_tile<kThreads, kChunk, K>(L.Qr(s), kLdK, in.qr, K);
  cp_async_tile<kThreads, kChunk, K>(L.Ke(s), kLdK, in.ke, K);
  cp_async_tile<kThreads, kChunk, kChunk>(L.P(s), kLdC, in.scores, kChunk);
  cp_async_value_tile<kThreads, kBlockV>(L.v(s), kLdV, p, seq, h, t0, v0);
  cp_async_tile<kThreads, 1, K>(L.decay(s), K, in.decay, K);
  cp_async_commit();
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) gla_v4_chunks(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLdK = ChunkLayout<K>::kLdK;
  constexpr int kStateTiles = narrow::kStateTiles<K>;  // the state split (narrow::warp_tiles)

  const ChunkLayout<K> L{smem};
  const int H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, b);
  const int chunks = chunk_count(seq.length);
  const int warp = threadIdx.x >> 5;
  const WarpTiles tiles = narrow::warp_tiles<K>(warp);  // this warp's tile of O, and of S
  const int s_m0 = tiles.s_m0, s_n0 = tiles.s_n0;

  float S[1][kStateTiles][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state(S, p.h0, state_base, V, v0, s_m0, s_n0, L.S(), kLdV);

  bf16* o = static_cast<bf16*>(p.o);
  if (chunks > 0) copy_chunk<K>(L, 0, p, seq, h, 0, v0);
  for (int n = 0; n < chunks; ++n) {
    const int s = n & 1;
    // The other stage was last read in chunk n - 1, before its closing barrier.
    if (n + 1 < chunks) {
      copy_chunk<K>(L, s ^ 1, p, seq, h, n + 1, v0);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // stage s, and the bf16 copy of S written after chunk n - 1, visible to every warp

    // O = scale (Qr S + P V), then S <- diag(d) S + Ke^T V in registers: v3's step 5
    read_and_update_state<K, kLdK, kLdC, kLdV>(S, tiles, L.Qr(s), L.Ke(s), L.P(s), L.v(s), L.S(), L.decay(s), o, seq, H,
                                               V, h, n * kChunk, v0, p.scale);
    __syncthreads();  // every read of the bf16 copy of S and of stage s is done
    store_state_copy(S, L.S(), kLdV, s_m0, s_n0);
  }

  store_state(S, p.ht, state_base, V, v0, s_m0, s_n0);
}

template <int K>
void launch_prepare_k(const Problem& p) {
  launch_checked(p, "gla_v4_prepare", gla_v4_prepare<K>, chunk_grid(p, p.H), kThreads, PrepareLayout<K>::kBytes);
}

template <int K>
void launch_chunks_k(const Problem& p) {
  launch_checked(p, "gla_v4_chunks", gla_v4_chunks<K>, dim3(p.V / kBlockV, p.H, p.B), kThreads, ChunkLayout<K>::kBytes);
}

void forward(const Problem& p) {
  const char* name = "gla_v4_prepared_chunks";
  check_tensor_core_problem(p, name, false, kBlockV);
  require_channel_gate(p, name);
  const size_t needed = workspace_bytes(p.B, p.T, p.H, p.K, p.V, p.cu_seqlens != nullptr);
  require_workspace(p, name, needed);
  gla_prepared::launch_prepare(p);
  gla_prepared::launch_chunks(p);
}

}  // namespace

void gla_prepared::launch_prepare(const Problem& p) { p.K == 64 ? launch_prepare_k<64>(p) : launch_prepare_k<128>(p); }
void gla_prepared::launch_prepare_halves(const Problem& p) {
  launch_checked(p, "gla_v4_prepare", gla_v4_prepare<128, 2>, chunk_grid(p, 2 * p.H), kThreads,
                 PrepareLayout<128>::kBytes);
}
void gla_prepared::launch_chunks(const Problem& p) { p.K == 64 ? launch_chunks_k<64>(p) : launch_chunks_k<128>(p); }

int gla_prepared::chunks_blocks_per_sm(int K) {
  const auto kernel = K == 64 ? gla_v4_chunks<64> : gla_v4_chunks<128>;
  const size_t smem = K == 64 ? ChunkLayout<64>::kBytes : ChunkLayout<128>::kBytes;
  const char* name = "gla_v4_chunks";
  return resident_blocks(kernel, kThreads, smem, name);
}

extern const Version gla_v4 = {
    "gla", 4, "prepared_chunks",
    "v3's chunk-local work (the decayed scores, queries and keys, the chunk's decay) in a kernel parallel over every "
    "chunk, so that the pass over chunks is only the state read and update on tensor cores, one chunk's tiles copied "
    "ahead.",
    false, true, kTensorCoreShape, 80, workspace_bytes, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
