// A producer-warp chunk kernel (linear v7, delta v8 and v9): one warp loads every chunk for the block's 16 compute
// warps, into a ring of kStages stages guarded by two mbarriers each, so the compute warps only compute. Delta
// v10 uses the same ring with a producer warpgroup (four warps, 3 x 32 + 1 arrivals on `full`).
//
//   producer (the last warp), chunk n into stage s = n % kStages:
//     wait_empty(n)                 the compute warps are done with the stage's previous chunk (n - kStages)
//     cp.async the tiles; each lane's cp_async_arrive(full): its copies arrive on `full` as they land
//     the per-token scalars (G = cumsum(g), betas) stored by the warp; lane 0 arrives on `full`
//   compute warps:
//     wait_full(n)                  all 33 arrivals are in (32 lanes' copies, the scalars): the stage holds chunk n
//     the chunk's phases, between named barriers over the 16 compute warps (kComputeBarrier)
//     release_stage(n)              lane 0 of each warp arrives on `empty` (16 arrivals free the stage)
//
// The producer's own chain per chunk must stay short: each lane walks one 16-byte column down the rows by
// stepped pointers (no index arithmetic per copy), and a chunk's per-token scalars are read into registers
// one chunk ahead, so their global-load latency hides behind the next chunk's copies.
#pragma once

#include <cuda_bf16.h>

#include "chunk_tiles.cuh"  // wide:: (the 16 compute warps), kChunk
#include "device.cuh"
#include "mbarrier.cuh"

namespace minilin {

namespace producer_block {

constexpr int kComputeWarps = wide::kWarps;
constexpr int kComputeThreads = wide::kThreads;
constexpr int kThreads = kComputeThreads + 32;  // the producer is the last warp
constexpr int kStages = 3;                      // the ring's depth; the helpers below take a smaller kRing
                                                // where three stages do not fit (linear v9 at K = 256: two)
constexpr int kComputeBarrier = 1;              // named barrier id of the compute warps

// The compute warps' tiles: wide::warp_tiles with each row block's column blocks permuted. Warp w issues on
// the SM's sub-partition w % 4, and the producer (warp 16) on sub-partition 0. With wide::warp_tiles that
// sub-partition also held 4 of the 10 warps whose score tile lies on or below the diagonal (they form Q K^T
// besides Q S). kColumnBlock[r][w % 4] (a permutation per row block r, so every sub-partition still has one
// warp of each row block and the products whose length grows with r stay even) leaves it 1, row block 3's,
// and the other three 3 each. On an H200 (same-run A/B, outputs bit-identical): linear v7 7% and delta v8 3%
// faster; a rotation that left it 2 (the others 3, 2, 3) gave 5% and 2%. The 16-warp kernels without a
// producer (linear v4-v6, delta v4-v7) keep warp_tiles: the rotation made linear v5 1% slower.
template <int K>
__device__ __forceinline__ wide::WarpTiles compute_warp_tiles(int warp) {
  constexpr int kColumnBlock[4][4] = {{1, 0, 2, 3}, {2, 3, 0, 1}, {3, 0, 1, 2}, {0, 1, 2, 3}};
  wide::WarpTiles tiles = wide::warp_tiles<K>(warp);
  tiles.n0 = 16 * kColumnBlock[warp >> 2][warp & 3];
  return tiles;
}

// By the whole block, before the warps part: thread 0 sets up every stage's two barriers. `full` counts the
// producer's copies, lane by lane (copying_warps of them), and the arrival that follows its scalars.
template <int kRing = kStages, class Layout>
__device__ __forceinline__ void init_ring(const Layout& L, int copying_warps = 1) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kRing; ++s) {
      mbarrier_init(L.full(s), 32 * copying_warps + 1);
      mbarrier_init(L.empty(s), kComputeWarps);  // lane 0 of every compute warp
    }
    fence_barrier_init();
  }
  __syncthreads();
}

// The producer, before filling chunk n's stage: its previous chunk (n - kRing) has been released.
template <int kRing = kStages, class Layout>
__device__ __forceinline__ void wait_empty(const Layout& L, int n) {
  if (n >= kRing) mbarrier_wait(L.empty(n % kRing), (n / kRing - 1) & 1);
}

// A compute warp, before reading chunk n's stage: every copy has landed and the scalars are stored.
template <int kRing = kStages, class Layout>
__device__ __forceinline__ void wait_full(const Layout& L, int n) {
  mbarrier_wait(L.full(n % kRing), (n / kRing) & 1);
}

// A compute warp, done with chunk n's stage: one arrival per warp hands it back to the producer.
template <int kRing = kStages, class Layout>
__device__ __forceinline__ void release_stage(const Layout& L, int n) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbarrier_arrive(L.empty(n % kRing));
}

}  // namespace producer_block


// Rows [0, 64) of a chunk into shared rows (stride ld): row r from src + r * src_stride, kRowElems bf16 each
// (a multiple of 8: 16-byte pieces); rows r >= valid are zero-filled (cp.async with no source bytes).
// Called by all 32 lanes of the producer warp.
template <int kRowElems>
__device__ __forceinline__ void producer_copy_rows(__nv_bfloat16* dst, int ld, const __nv_bfloat16* src,
                                                   long long src_stride, int valid, int lane) {
  constexpr int kPieces = kRowElems / 8, kRowStep = 32 / kPieces;
  static_assert(kRowElems % 8 == 0 && 32 % kPieces == 0, "rows of 8, 16, 32, 64, 128 or 256 bf16");
  const int row = lane / kPieces, col = (lane % kPieces) * 8;
  const __nv_bfloat16* from = src + row * src_stride + col;
  __nv_bfloat16* to = dst + row * ld + col;
#pragma unroll 8
  for (int r = row; r < kChunk; r += kRowStep) {
    cp_async_16(to, r < valid ? from : src, r < valid);
    from += kRowStep * src_stride;
    to += kRowStep * ld;
  }
}

// Two tensors of the same row geometry (q and k) in one walk: their copies interleave and share the stepping,
// fewer instructions from a warp that shares its scheduler with four compute warps. Measured against two
// walks (csrc/compare_builds.py, H200): delta v8 1% faster, linear v7 within 1% either way.
template <int kRowElems>
__device__ __forceinline__ void producer_copy_row_pair(__nv_bfloat16* dst_a, __nv_bfloat16* dst_b, int ld,
                                                       const __nv_bfloat16* src_a, const __nv_bfloat16* src_b,
                                                       long long src_stride, int valid, int lane) {
  constexpr int kPieces = kRowElems / 8, kRowStep = 32 / kPieces;
  static_assert(kRowElems % 8 == 0 && 32 % kPieces == 0, "rows of 8, 16, 32, 64, 128 or 256 bf16");
  const int row = lane / kPieces, col = (lane % kPieces) * 8;
  const long long offset = row * src_stride + col;
  const __nv_bfloat16 *from_a = src_a + offset, *from_b = src_b + offset;
  __nv_bfloat16 *to_a = dst_a + row * ld + col, *to_b = dst_b + row * ld + col;
#pragma unroll 8
  for (int r = row; r < kChunk; r += kRowStep) {
    cp_async_16(to_a, r < valid ? from_a : src_a, r < valid);
    cp_async_16(to_b, r < valid ? from_b : src_b, r < valid);
    from_a += kRowStep * src_stride, from_b += kRowStep * src_stride;
    to_a += kRowStep * ld, to_b += kRowStep * ld;
  }
}

// A delta chunk's per-token scalars into stage s (G = cumsum(g) and the betas, which the lanes have held since the
// previous chunk), then the next chunk's (already read by the caller, so their loads were issued first) kept in
// their place, and lane 0's arrival on `full`. delta v8 - v10's producers.
template <class Layout>
__device__ __forceinline__ void producer_store_scalars(const Layout& L, int s, float2& gates, float2& betas,
                                                       float2 next_gates, float2 next_betas, int lane) {
  store_chunk_cumsum(L.G(s), gates.x, gates.y);
  L.beta(s)[2 * lane] = betas.x;
  L.beta(s)[2 * lane + 1] = betas.y;
  gates = next_gates;
  betas = next_betas;
  __syncwarp();
  if (lane == 0) mbarrier_arrive(L.full(s));
}

// Tokens 2 lane and 2 lane + 1 of a chunk from a [B, T, H] tensor of per-token scalars, `first` being the
// element of the chunk's first token and `stride` (= H) the step between tokens: 0 past the chunk's `valid`
// tokens (a padded token's gate decays nothing, its beta writes nothing) and when x is null.
__device__ __forceinline__ float2 producer_token_pair(const float* x, long long first, long long stride, int valid,
                                                      int lane) {
  float2 pair = make_float2(0.0f, 0.0f);
  if (x && 2 * lane < valid) pair.x = x[first + (2 * lane) * stride];
  if (x && 2 * lane + 1 < valid) pair.y = x[first + (2 * lane + 1) * stride];
  return pair;
}

}  // namespace minilin
