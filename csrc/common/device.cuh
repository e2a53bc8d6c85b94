// Device-side helpers shared by every kernel: element conversion, asynchronous copies into shared
// memory, and warp-level scans and reductions. One concept each; the kernels read top to bottom.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace minilin {

constexpr unsigned kFullMask = 0xffffffffu;

// ---- element conversion: inputs are float or bf16, every sum is float -------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Eight consecutive elements (16 bytes of bf16, 32 bytes of float) from 16-byte-aligned shared memory.
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&x)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

// ---- cp.async: global -> shared without passing through registers (sm_80+) --------------------
// With valid == false nothing is read and the destination is zero-filled: the zero padding of the
// last chunk (a zero key writes nothing, a zero gate decays nothing).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Copy `rows` rows of `row_elems` elements (row_elems * sizeof(T) a multiple of 16 bytes) from global
// rows `gmem + r * g_stride` into shared rows `smem + r * s_stride`, 16 bytes per cp.async, spread over
// the block. Rows r >= valid_rows are zero-filled.
template <typename T>
__device__ __forceinline__ void cp_async_rows(T* smem, int s_stride, const T* gmem, long long g_stride,
                                              int rows, int row_elems, int valid_rows) {
  constexpr int kPer16 = 16 / sizeof(T);
  const int pieces = row_elems / kPer16;
  for (int i = threadIdx.x; i < rows * pieces; i += blockDim.x) {
    const int r = i / pieces, c = (i % pieces) * kPer16;
    const bool valid = r < valid_rows;
    cp_async_16(smem + r * s_stride + c, valid ? gmem + r * g_stride + c : gmem, valid);
  }
}

// cp_async_rows for a tile whose shape and copying threads are known at compile time: each thread of a group of
// kThreads (threads t with the same t / kThreads: the block, or one of its parts that copies on its own) keeps one
// 16-byte column of the tile and steps down its rows, so a copy costs a pointer step instead of the loop above's
// division and 64-bit multiply (~25 integer instructions a copy, a fifth of all the instructions of the delta
// backward's gradients kernel under ncu).
template <int kThreads, int kRows, int kRowElems, typename T>
__device__ __forceinline__ void cp_async_tile(T* smem, int s_stride, const T* gmem, long long g_stride,
                                              int valid_rows = kRows) {
  constexpr int kPer16 = 16 / sizeof(T);
  constexpr int kPieces = kRowElems / kPer16;
  static_assert(kRowElems % kPer16 == 0 && kThreads % kPieces == 0, "rows of whole 16-byte pieces, a group of whole rows");
  constexpr int kRowStep = kThreads / kPieces;
  const unsigned tid = threadIdx.x % kThreads;
  const int r0 = static_cast<int>(tid / kPieces), c = static_cast<int>(tid % kPieces) * kPer16;
  long long offset = r0 * g_stride + c;  // an offset, not a pointer, so rows past the tensor's end form no address
  T* dst = smem + r0 * s_stride + c;
#pragma unroll
  for (int i = 0; i < (kRows + kRowStep - 1) / kRowStep; ++i) {
    const int r = r0 + i * kRowStep;
    if (kRows % kRowStep == 0 || r < kRows) {
      const bool valid = r < valid_rows;
      cp_async_16(dst + i * kRowStep * s_stride, valid ? gmem + offset : gmem, valid);
    }
    offset += kRowStep * g_stride;
  }
}

// ---- warp-level scans and reductions -------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// Inclusive prefix sum over the warp's 32 lanes.
__device__ __forceinline__ float warp_inclusive_scan(float x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const float y = __shfl_up_sync(kFullMask, x, offset);
    if (lane >= offset) x += y;
  }
  return x;
}

// Chunk-local cumulative log-gate of a 64-token chunk, by one warp: G[i] = g[0] + ... + g[i].
// Lane l passes g[2l] and g[2l + 1] and gets back G[2l] and G[2l + 1].
__device__ __forceinline__ float2 chunk_cumsum_64(float g_even, float g_odd) {
  const float pair_inclusive = warp_inclusive_scan(g_even + g_odd);
  return make_float2(pair_inclusive - g_odd, pair_inclusive);
}

// G[0..63] = chunk_cumsum_64 of the chunk's gates, lane l holding g[2l] and g[2l + 1]; stored by the warp.
__device__ __forceinline__ void store_chunk_cumsum(float* G, float g_even, float g_odd) {
  const int lane = threadIdx.x & 31;
  const float2 G2 = chunk_cumsum_64(g_even, g_odd);
  G[2 * lane] = G2.x;
  G[2 * lane + 1] = G2.y;
}

// G[0..63] = chunk_cumsum_64 of the chunk's 64 log-gates staged in g, written by the calling warp; all zeros
// when the op has no gate (gated false: g is then not read).
__device__ __forceinline__ void warp_chunk_cumsum(float* G, const float* g, bool gated) {
  const int lane = threadIdx.x & 31;
  store_chunk_cumsum(G, gated ? g[2 * lane] : 0.0f, gated ? g[2 * lane + 1] : 0.0f);
}

// Reduce N values per lane (N = 8 or 16) over the warp's 32 lanes in log2(N) + (5 - log2(N)) steps
// and N - 1 + 5 - log2(N) shuffles, instead of N * 5 shuffles for N separate butterflies.
// At each halving step a lane keeps the half of its values that its partner sends away, so after
// log2(N) steps every lane holds one partial sum; the last steps finish it with plain butterflies.
// Returns the full sum of value index (lane >> (5 - log2 N)) & (N - 1); x is clobbered.
template <int N>
__device__ __forceinline__ float transpose_reduce(float (&x)[N]) {
  static_assert(N == 2 || N == 4 || N == 8 || N == 16 || N == 32, "N must be a power of two <= 32");
  constexpr int kLevels = N == 2 ? 1 : N == 4 ? 2 : N == 8 ? 3 : N == 16 ? 4 : 5;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int level = 0; level < kLevels; ++level) {
    const int half = N >> (level + 1), offset = 16 >> level;
    const bool upper = lane & offset;
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      if (j < half) {
        const float send = upper ? x[j] : x[j + half];
        const float keep = upper ? x[j + half] : x[j];
        x[j] = keep + __shfl_xor_sync(kFullMask, send, offset);
      }
    }
  }
  float s = x[0];
#pragma unroll
  for (int offset = 16 >> kLevels; offset > 0; offset >>= 1) s += __shfl_xor_sync(kFullMask, s, offset);
  return s;
}

template <int N> __device__ __forceinline__ int transpose_reduce_index(int lane) {
  constexpr int log2n = N == 2 ? 1 : N == 4 ? 2 : N == 8 ? 3 : N == 16 ? 4 : 5;
  return (lane >> (5 - log2n)) & (N - 1);
}

}  // namespace minilin
