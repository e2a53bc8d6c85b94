// The moves of a producer warp (linear v7, delta v8): one warp loads every chunk for the block's compute
// warps, so its own chain per chunk must stay short. Each lane walks one 16-byte column down the rows by
// stepped pointers (no index arithmetic per copy), and a chunk's per-token scalars (gates, betas) are read
// into registers one chunk ahead, so their global-load latency hides behind the next chunk's copies.
#pragma once

#include <cuda_bf16.h>

#include "device.cuh"
#include "simt.cuh"  // kChunk

namespace minilin {

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

// G[0..63] = the chunk-local cumulative gate from lane-held pairs of gates (chunk_cumsum_64), stored by the warp.
__device__ __forceinline__ void producer_store_cumsum(float* G, float2 gates, int lane) {
  const float2 G2 = chunk_cumsum_64(gates.x, gates.y);
  G[2 * lane] = G2.x;
  G[2 * lane + 1] = G2.y;
}

}  // namespace minilin
