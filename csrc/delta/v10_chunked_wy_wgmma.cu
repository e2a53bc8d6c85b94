// delta v10 (wgmma, sm_90a): v9's WY step and producer warp, with the chunk's products on Hopper warpgroup
// tensor cores, every warpgroup taking an equal 16-column slice of every product, because v9's chunk kernel
// (~480 of its ~595 us at T = 8192) is one ldmatrix -> mma.sync chain per SM in which each 16 x 16 warp tile
// reloads its fragments (~380 KB of shared-memory reads per chunk) and the 10 warps on or below the
// diagonal do half as much again as the other 6 in phase 1. wgmma reads its operands from shared memory
// without ldmatrix or registers, issues a whole k loop at once, and a column slice gives each warpgroup the
// same work (the third session's wgmma attempt, linear v6, gave each warpgroup its own product instead, and
// lost to the waits of the warpgroups with the longer chains).
//
// One block per (batch, head, 64 value columns): 4 warpgroups (warps 0-15) + a producer warp (warp 16, as v8)
// that loads q, k, T's tile (in the 128-byte-swizzled layout wgmma reads, common/wgmma.cuh), v, G = cumsum(g)
// and beta into a ring of 3 stages. The state is kept transposed, S^T [64 value rows, K], in fp32 registers:
// warpgroup w holds its columns w K/4 .. (w + 1) K/4 - 1, and a bf16 copy sits in shared memory. Per chunk,
// warpgroup w computing columns 16 w .. 16 w + 15 (n0) of each 64 x 64 product:
//   phase 1:  KS = K S, then R = Q S and QK = Q K^T   (8 + 8 + 8 k-steps of m64n16k16 for K = 128)
//             X = diag(beta) (V - diag(exp G) KS);  R *= diag(exp G);  P = QK * exp(G_i - G_j) causal
//   phase 2:  Delta = T X;  Delta decayed to the chunk's end, diag(exp(G_last - G)) Delta
//   phase 3:  O = R + P Delta, stored;  S^T <- exp(G_last) S^T + (Delta decayed)^T K (A from registers)
// with a barrier over the 16 compute warps before each phase (X, P, Delta and S's copy are the block's).
#include "../common/producer.cuh"
#include "../common/wgmma.cuh"
#include "chunk_wy_mma_wide.cuh"  // delta_wide::check_problem, workspace_bytes
#include "wy_prepare_blocked.cuh"

namespace minilin {
namespace {

using bf16 = __nv_bfloat16;
using wide::kBlockV;
using wide::kLdV;
using namespace producer_block;  // the block (16 compute warps + the producer), the ring's kStages and its waits

constexpr size_t round_up_1024(size_t bytes) { return (bytes + 1023) / 1024 * 1024; }

// Shared memory, from a 1024-byte boundary (the swizzled atoms'): per stage q and k (64 x K, swizzled), T's
// tile (64 x 64, swizzled), v (64 x 64, rows padded to kLdV for the epilogue's reads), G and beta; then the
// block's S^T copy (64 x K), P, X, Delta and Delta decayed (64 x 64 each, swizzled), and the ring's barriers.
template <int K>
struct Layout {
  static constexpr int kTile = kChunk * kChunk;  // elements of a 64 x 64 tile
  static constexpr size_t kStageBytes =
      round_up_1024((2 * kChunk * K + kTile + kChunk * kLdV) * sizeof(bf16) + 2 * kChunk * sizeof(float));
  static constexpr size_t kBlockOffset = kStages * kStageBytes;
  static constexpr size_t kBarrierOffset = kBlockOffset + (kBlockV * K + 4 * kTile) * sizeof(bf16);
  static constexpr size_t kBytes = kBarrierOffset + 2 * kStages * sizeof(uint64_t) + 1024;  // + alignment slack
  static_assert(kBytes <= 227 * 1024, "three stages must fit in an H100/H200 SM's shared memory");
  unsigned char* base;  // 1024-byte aligned
  __device__ bf16* q(int s) const { return reinterpret_cast<bf16*>(base + s * kStageBytes); }
  __device__ bf16* k(int s) const { return q(s) + kChunk * K; }
  __device__ bf16* wy(int s) const { return k(s) + kChunk * K; }
  __device__ bf16* v(int s) const { return wy(s) + kTile; }
  __device__ float* G(int s) const { return reinterpret_cast<float*>(v(s) + kChunk * kLdV); }
  __device__ float* beta(int s) const { return G(s) + kChunk; }
  __device__ bf16* ST() const { return reinterpret_cast<bf16*>(base + kBlockOffset); }
  __device__ bf16* P() const { return ST() + kBlockV * K; }
  __device__ bf16* X() const { return P() + kTile; }
  __device__ bf16* delta() const { return X() + kTile; }
  __device__ bf16* delta_decayed() const { return delta() + kTile; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + kBarrierOffset) + s; }
  __device__ uint64_t* empty(int s) const { return full(kStages) + s; }
};

// Rows [0, 64) of kRowElems bf16 (a multiple of 64) into swizzled storage of 64 rows, 16 bytes per cp.async;
// rows r >= valid are zero-filled. As producer_copy_rows, each lane walks one 16-byte column down the rows,
// kRowStep rows a step; since the lane's first row is below kRowStep (a power of two), r % 8 = row ^ (kRowStep i
// % 8), so the swizzle is a per-lane constant xor a per-step one and sw128_index is not recomputed per copy.
template <int kRowElems>
__device__ __forceinline__ void producer_copy_rows_sw128(bf16* dst, const bf16* src, long long src_stride, int valid,
                                                         int lane) {
  constexpr int kPieces = kRowElems / 8, kRowStep = 32 / kPieces;
  static_assert(kRowElems % 64 == 0 && 32 % kPieces == 0 && kRowStep <= 8, "rows of 64 or 128 bf16");
  const int row = lane / kPieces, col = (lane % kPieces) * 8;
  const int lane_xor = ((col >> 3) & 7) ^ row;
  const bf16* from = src + row * src_stride + col;
  bf16* to = dst + (col >> 6) * kChunk * 64 + row * 64;
#pragma unroll
  for (int i = 0; i < kChunk / kRowStep; ++i) {
    const int r = row + i * kRowStep;
    cp_async_16(to + i * kRowStep * 64 + ((lane_xor ^ ((i * kRowStep) & 7)) << 3), r < valid ? from : src, r < valid);
    from += kRowStep * src_stride;
  }
}

// The producer warp: v8's (chunk_wy_producer.cuh), writing q, k and T's tile swizzled.
template <int K>
__device__ void produce(const Layout<K>& L, const Problem& p, const bf16* wy, int b, int h, int v0, int chunks) {
  const int lane = threadIdx.x & 31;
  const long long token_stride = p.H;
  auto first_token = [&](int n) { return (static_cast<long long>(b) * p.T + n * kChunk) * p.H + h; };
  auto valid_tokens = [&](int n) { return n < chunks ? min(kChunk, p.T - n * kChunk) : 0; };
  float2 gates = producer_token_pair(p.g, first_token(0), token_stride, valid_tokens(0), lane);
  float2 betas = producer_token_pair(p.beta, first_token(0), token_stride, valid_tokens(0), lane);
  for (int n = 0; n < chunks; ++n) {
    const int s = n % kStages, valid = valid_tokens(n);
    const long long first = first_token(n);
    wait_empty(L, n);
    producer_copy_rows_sw128<K>(L.q(s), static_cast<const bf16*>(p.q) + first * K, token_stride * K, valid, lane);
    producer_copy_rows_sw128<K>(L.k(s), static_cast<const bf16*>(p.k) + first * K, token_stride * K, valid, lane);
    producer_copy_rows<kBlockV>(L.v(s), kLdV, static_cast<const bf16*>(p.v) + first * p.V + v0, token_stride * p.V,
                                valid, lane);
    producer_copy_rows_sw128<kChunk>(L.wy(s), wy + wy_tile_offset(b, p.H, h, chunks, n), kChunk, kChunk, lane);
    cp_async_arrive(L.full(s));
    const float2 these_gates = gates, these_betas = betas;
    gates = producer_token_pair(p.g, first_token(n + 1), token_stride, valid_tokens(n + 1), lane);
    betas = producer_token_pair(p.beta, first_token(n + 1), token_stride, valid_tokens(n + 1), lane);
    store_chunk_cumsum(L.G(s), these_gates.x, these_gates.y);
    L.beta(s)[2 * lane] = these_betas.x;
    L.beta(s)[2 * lane + 1] = these_betas.y;
    __syncwarp();
    if (lane == 0) mbarrier_arrive(L.full(s));
  }
}

// Keeps the compiler from reading an accumulator before the wgmma_wait that completes it: the registers
// count as rewritten here, after the wait (CUTLASS's warpgroup_fence_operand).
template <int NT>
__device__ __forceinline__ void fence_operand(float (&acc)[1][NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(acc[0][j][e])::"memory");
}

// S^T's slice of this thread (rows m0.. of the 64 value columns, columns f0.. of the K keys) from h0 [K, V]
// (zeros when h0 is null), and its bf16 copy into the block's swizzled S^T.
template <int NT>
__device__ __forceinline__ void load_state_transposed(float (&S)[1][NT][4], const float* h0, long long state_base, int V,
                                                      int v0, int m0, int f0, bf16* ST) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = m0 + acc_row(0, e), col = f0 + acc_col(j, e);
      const long long at = state_base + static_cast<long long>(col) * V + v0 + row;
      S[0][j][e] = h0 ? h0[at] : 0.0f;
      S[0][j][e + 1] = h0 ? h0[at + V] : 0.0f;
      store_bf16x2_sw128(ST, kBlockV, row, col, S[0][j][e], S[0][j][e + 1]);
    }
}

template <int NT>
__device__ __forceinline__ void store_state_transposed(const float (&S)[1][NT][4], float* ht, long long state_base,
                                                       int V, int v0, int m0, int f0) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = m0 + acc_row(0, e), col = f0 + acc_col(j, e);
      const long long at = state_base + static_cast<long long>(col) * V + v0 + row;
      ht[at] = S[0][j][e];
      ht[at + V] = S[0][j][e + 1];
    }
}

template <int K>
__global__ void __launch_bounds__(kThreads, 1) delta_chunked_wy_wgmma(const Problem p, const bf16* wy) {
#if MINILIN_WGMMA
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kKeySteps = K / 16, kTokenSteps = kChunk / 16;
  constexpr int kStateNT = K / 4 / 8;  // 8-column tiles of S^T per warpgroup

  const Layout<K> L{align_1024(smem)};
  const int T = p.T, H = p.H, V = p.V;
  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, chunks = ceil_div(T, kChunk);
  const int warp = threadIdx.x >> 5;
  init_ring(L);
  if (warp == kComputeWarps) {
    produce<K>(L, p, wy, b, h, v0, chunks);
    return;  // the compute warps meet on their own named barrier from here on
  }

  // The warpgroup index from lane 0: the compiler then knows it is warp-uniform and keeps the descriptors,
  // which depend on it, in uniform registers (as CUTLASS's canonical_warp_group_idx).
  const int group = __shfl_sync(kFullMask, warp >> 2, 0);
  const int m0 = 16 * (warp & 3), n0 = 16 * group, f0 = (K / 4) * group;
  float S[1][kStateNT][4];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state_transposed(S, p.h0, state_base, V, v0, m0, f0, L.ST());
  fence_async_shared();

  // This thread's elements of a 64 x 64 swizzled tile (P, X, Delta): rows m0 + lane / 4 (+ 8), columns
  // n0 + 8 j + 2 (lane % 4); the row's swizzle is lane / 4 (m0 is a multiple of 8). And of S^T's copy (64 x K):
  // columns f0 + 8 j + 2 (lane % 4).
  const int lane = threadIdx.x & 31, quad_row = lane >> 2, pair_col = 2 * (lane & 3);
  int tile_at[2], state_at[kStateNT];
#pragma unroll
  for (int j = 0; j < 2; ++j) tile_at[j] = (m0 + quad_row) * 64 + ((((n0 >> 3) + j) & 7) ^ quad_row) * 8 + pair_col;
#pragma unroll
  for (int j = 0; j < kStateNT; ++j) {
    const int f = f0 + 8 * j;
    state_at[j] = (f >> 6) * kBlockV * 64 + (m0 + quad_row) * 64 + (((f >> 3) & 7) ^ quad_row) * 8 + pair_col;
  }
  constexpr int kLowerHalf = 8 * 64;  // the accumulator's rows + 8

  bf16* o = static_cast<bf16*>(p.o);
  bf16 *const ST = L.ST(), *const P = L.P(), *const X = L.X(), *const delta = L.delta();
  bf16* const delta_decayed = L.delta_decayed();
  constexpr uint64_t kTileMN = mn_major_bits(kChunk);
  const uint64_t ST_cols = sw128_descriptor(ST, kKMajorBits) + row_offset(n0);  // B^T = S^T's rows n0..
  const uint64_t P_rows = sw128_descriptor(P, kKMajorBits);
  const uint64_t X_cols = sw128_descriptor(X, kTileMN) + mn_major_offset(0, n0, kChunk);
  const uint64_t delta_cols = sw128_descriptor(delta, kTileMN) + mn_major_offset(0, n0, kChunk);
  for (int n = 0; n < chunks; ++n) {
    const int stage = n % kStages, t0 = n * kChunk;
    wait_full(L, n);
    fence_async_shared();  // the producer's copies, now visible to this thread, also to its wgmma reads
    named_barrier_sync(kComputeBarrier, kComputeThreads);  // S's copy is whole; chunk n - 1 read P and Delta
    const bf16* v = L.v(stage);
    const float *G = L.G(stage), *beta = L.beta(stage);
    const uint64_t q_rows = sw128_descriptor(L.q(stage), kKMajorBits);
    const uint64_t k_rows = sw128_descriptor(L.k(stage), kKMajorBits);
    const uint64_t k_cols = sw128_descriptor(L.k(stage), kTileMN) + mn_major_offset(0, f0, kChunk);
    const uint64_t T_rows = sw128_descriptor(L.wy(stage), kKMajorBits);

    // Phase 1: KS first, in its own group, so that X's epilogue overlaps the other two products.
    float KS[1][2][4], R[1][2][4], QK[1][2][4];
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kKeySteps; ++s)
      wgmma_ss<false>(KS, k_rows + k_major_offset(16 * s, kChunk), ST_cols + k_major_offset(16 * s, kBlockV), s > 0);
    wgmma_commit();
#pragma unroll
    for (int s = 0; s < kKeySteps; ++s)
      wgmma_ss<false>(R, q_rows + k_major_offset(16 * s, kChunk), ST_cols + k_major_offset(16 * s, kBlockV), s > 0);
#pragma unroll
    for (int s = 0; s < kKeySteps; ++s)  // B^T = K's rows n0..
      wgmma_ss<false>(QK, q_rows + k_major_offset(16 * s, kChunk), k_rows + row_offset(n0) + k_major_offset(16 * s, kChunk),
                      s > 0);
    wgmma_commit();
    wgmma_wait<1>();
    fence_operand(KS);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e);
        const float decay = __expf(G[r]);
        const float2 v2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v + r * kLdV + c));
        store_bf16x2(X + tile_at[j] + (e ? kLowerHalf : 0), beta[r] * (v2.x - decay * KS[0][j][e]),
                     beta[r] * (v2.y - decay * KS[0][j][e + 1]));
      }
    wgmma_wait<0>();
    fence_operand(R);
    fence_operand(QK);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e);
        const float decay = __expf(G[r]);
        R[0][j][e] *= decay;
        R[0][j][e + 1] *= decay;
        const float x = c <= r ? QK[0][j][e] * __expf(G[r] - G[c]) : 0.0f;
        const float y = c + 1 <= r ? QK[0][j][e + 1] * __expf(G[r] - G[c + 1]) : 0.0f;
        store_bf16x2(P + tile_at[j] + (e ? kLowerHalf : 0), x, y);
      }
    fence_async_shared();
    named_barrier_sync(kComputeBarrier, kComputeThreads);

    // Phase 2: Delta = T X, and Delta decayed to the chunk's end.
    const float G_last = G[kChunk - 1];
    float D[1][2][4];
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kTokenSteps; ++s)
      wgmma_ss<true>(D, T_rows + k_major_offset(16 * s, kChunk), X_cols + mn_major_offset(16 * s, 0, kChunk), s > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(D);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int r = m0 + acc_row(0, e), at = tile_at[j] + (e ? kLowerHalf : 0);
        const float d = __expf(G_last - G[r]);
        store_bf16x2(delta + at, D[0][j][e], D[0][j][e + 1]);
        store_bf16x2(delta_decayed + at, d * D[0][j][e], d * D[0][j][e + 1]);
      }
    fence_async_shared();
    named_barrier_sync(kComputeBarrier, kComputeThreads);

    // Phase 3: O = R + P Delta; S^T <- exp(G_last) S^T + (Delta decayed)^T K, A = (Delta decayed)^T from
    // registers (ldmatrix.trans of the swizzled tile), B = K's columns f0.. (MN-major).
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kTokenSteps; ++s)
      wgmma_ss<true>(R, P_rows + k_major_offset(16 * s, kChunk), delta_cols + mn_major_offset(16 * s, 0, kChunk), true);
    wgmma_commit();
    unsigned a[kTokenSteps][4];
#pragma unroll
    for (int s = 0; s < kTokenSteps; ++s) sw128_load_a_transposed(a[s], delta_decayed, kChunk, m0, 16 * s);
    scale_tiles(S, __expf(G_last));
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kTokenSteps; ++s) wgmma_rs<true>(S, a[s], k_cols + mn_major_offset(16 * s, 0, kChunk), true);
    wgmma_commit();
    wgmma_wait<1>();
    fence_operand(R);
    store_output_tile(R, o, T, H, V, b, h, t0, v0, m0, n0, p.scale);
    wgmma_wait<0>();
    fence_operand(S);
#pragma unroll
    for (int j = 0; j < kStateNT; ++j) {
      store_bf16x2(ST + state_at[j], S[0][j][0], S[0][j][1]);
      store_bf16x2(ST + state_at[j] + kLowerHalf, S[0][j][2], S[0][j][3]);
    }
    fence_async_shared();
    release_stage(L, n);
  }

  store_state_transposed(S, p.ht, state_base, V, v0, m0, f0);
#else
  __trap();  // compiled without sm_90a features: forward() refuses to launch this (require_sm90a)
#endif
}

void forward(const Problem& p) {
  const std::string name = "delta_v10_chunked_wy_wgmma";
  delta_wide::check_problem(p, name);
  require_sm90a(name);
  auto* wy = static_cast<bf16*>(p.workspace);
  launch_wy_prepare_blocked<wy_blocked::WaveProducts::kTensorCores>(p, wy, "delta_v10_wy_prepare_tensor_solve");
  launch_per_value_block(p, name.c_str(), kBlockV, kThreads, delta_chunked_wy_wgmma<64>, Layout<64>::kBytes,
                         delta_chunked_wy_wgmma<128>, Layout<128>::kBytes, wy);
}

}  // namespace

extern const Version delta_v10 = {
    "delta", 10, "chunked_wy_wgmma",
    "v9 with the chunk's products on Hopper warpgroup tensor cores (wgmma, sm_90a), each warpgroup an equal column slice of every product: v9's chunk was one ldmatrix -> mma.sync chain per SM with unequal warps.",
    false, true, 90, delta_wide::workspace_bytes, forward, 90};

}  // namespace minilin
