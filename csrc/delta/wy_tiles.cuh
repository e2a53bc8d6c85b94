// The WY workspace every chunked delta kernel shares: T = (I + A)^-1 of each chunk of each head is one 64 x 64
// tile, row-major; the workspace is [H][chunk_rows][64][64] (common/sequences.cuh's chunk rows: every sequence's
// chunks, B sequences of T tokens or packed ones). The prepare kernels (wy_prepare.cuh, wy_prepare_blocked.cuh)
// write it; the chunk kernels read it, one tile per chunk.
#pragma once

#include "../common/chunk_tiles.cuh"
#include "../common/sequences.cuh"
#include "../common/simt.cuh"

namespace minilin {

inline size_t wy_workspace_elements(int B, int T, int H, bool packed) {
  return size_t(H) * chunk_rows(B, T, packed) * kChunk * kChunk;
}

// First element of the tile of chunk row `row` of `rows` (common/sequences.cuh's chunk_rows), head h.
__host__ __device__ inline long long wy_row_tile_offset(long long rows, int h, long long row) {
  return (h * rows + row) * kChunk * kChunk;
}

__device__ __forceinline__ long long wy_row_tile_offset(const Problem& p, int h, long long row) {
  return wy_row_tile_offset(chunk_rows(p.B, p.T, p.cu_seqlens != nullptr), h, row);
}

// The same for chunk n of sequence `seq`.
__device__ __forceinline__ long long wy_tile_offset(const Problem& p, const SequenceRows& seq, int h, int n) {
  return wy_row_tile_offset(p, h, seq.chunk0 + n);
}

// The same for chunk n of head (b, h) of B sequences of T tokens.
__device__ __forceinline__ long long wy_tile_offset(const Problem& p, int b, int h, int n) {
  return wy_tile_offset(p, fixed_rows(p, b), h, n);
}

// Chunk n of head (b, h) on chip for the tensor-core delta kernels: q, k, the value columns [v0, v0 + kBlockV)
// (cp_async_chunk), T's bf16 tile from `wy` (row stride ldc) and the chunk's log-gates (when p.g) and betas;
// positions past T are zero-filled.
template <int K, int kBlockV>
__device__ __forceinline__ void cp_async_wy_chunk(__nv_bfloat16* q_dst, __nv_bfloat16* k_dst, int ldk,
                                                  __nv_bfloat16* v_dst, int ldv, __nv_bfloat16* wy_dst, int ldc,
                                                  float* g_dst, float* beta_dst, const Problem& p,
                                                  const __nv_bfloat16* wy, int b, int h, int n, int v0) {
  const int t0 = n * kChunk, valid = min(kChunk, p.T - t0);
  const long long first = (static_cast<long long>(b) * p.T + t0) * p.H + h;
  // g travels below, beside beta, in one pass of the first 64 threads
  cp_async_chunk<K, kBlockV>(q_dst, k_dst, ldk, v_dst, ldv, nullptr, p, b, h, t0, v0);
  cp_async_rows(wy_dst, ldc, wy + wy_tile_offset(p, b, h, n), kChunk, kChunk, kChunk, kChunk);
  if (threadIdx.x < kChunk) {
    const bool ok = threadIdx.x < valid;
    const long long at = first + static_cast<long long>(threadIdx.x) * p.H;
    if (p.g) cp_async_4(g_dst + threadIdx.x, ok ? p.g + at : p.g, ok);
    cp_async_4(beta_dst + threadIdx.x, ok ? p.beta + at : p.beta, ok);
  }
}

}  // namespace minilin
