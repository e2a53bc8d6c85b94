// Plain CUDA-core building blocks of the v2 (chunked, no tensor cores) kernels: fp32 tiles in shared
// memory, a register-blocked micro-GEMM, and the loaders that bring one 64-token chunk on chip.
#pragma once

#include "device.cuh"
#include "sequences.cuh"  // kChunk
#include "../minilin_cuda.h"

namespace minilin {

// acc[i][j] += sum_{k_begin <= kk < k_end} A(m0 + i, kk) B(kk, n0 + j), each thread one TM x TN tile, with
// A(m, kk) = a[m * a_m + kk * a_k] and B(kk, n) = b[kk * b_k + n * b_n]: the strides say which operand is
// read transposed. TM + TN shared loads feed TM * TN fused multiply-adds.
template <int TM, int TN>
__device__ __forceinline__ void micro_gemm(float (&acc)[TM][TN], const float* a, int a_m, int a_k, const float* b,
                                           int b_k, int b_n, int m0, int n0, int k_begin, int k_end) {
  for (int kk = k_begin; kk < k_end; ++kk) {
    float av[TM], bv[TN];
#pragma unroll
    for (int i = 0; i < TM; ++i) av[i] = a[(m0 + i) * a_m + kk * a_k];
#pragma unroll
    for (int j = 0; j < TN; ++j) bv[j] = b[kk * b_k + (n0 + j) * b_n];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

template <int TM, int TN>
__device__ __forceinline__ void zero(float (&acc)[TM][TN]) {
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
}

// Tokens [t0, t0 + kChunk) of head (b, h) of a [B, T, H, width] tensor, columns [c0, c0 + cols), into fp32
// shared rows dst[r * ld + c], multiplied by `factor`; zero past T and past width.
template <typename Elem>
__device__ void load_chunk_f32(float* dst, int ld, const Elem* src, const Problem& p, int b, int h, int t0, int width,
                               int c0, int cols, float factor) {
  for (int i = threadIdx.x; i < kChunk * cols; i += blockDim.x) {
    const int r = i / cols, c = i % cols, t = t0 + r, col = c0 + c;
    dst[r * ld + c] = (t < p.T && col < width)
                          ? factor * to_float(src[((static_cast<long long>(b) * p.T + t) * p.H + h) * width + col])
                          : 0.0f;
  }
}

// Per-token scalars of a [B, T, H] float32 tensor for one chunk into shared x[kChunk]; zero past T or when
// the tensor is absent.
__device__ __forceinline__ void load_chunk_scalars(float* dst, const float* src, const Problem& p,
                                                   const SequenceRows& seq, int h, int t0) {
  for (int i = threadIdx.x; i < kChunk; i += blockDim.x) {
    const int t = t0 + i;
    dst[i] = (src && t < seq.length) ? src[(seq.first + t) * p.H + h] : 0.0f;
  }
}

__device__ __forceinline__ void load_chunk_scalars(float* dst, const float* src, const Problem& p, int b, int h, int t0) {
  load_chunk_scalars(dst, src, p, fixed_rows(p, b), h, t0);
}

}  // namespace minilin

namespace minilin {

// Chunk-local cumulative log-gate G[0..63] of tokens [t0, t0 + 64), computed by the calling warp straight
// from global memory (g == nullptr or tokens past T count as 0: no decay).
__device__ __forceinline__ void load_chunk_cumsum(float* G, const float* g, const Problem& p, const SequenceRows& seq,
                                                  int h, int t0) {
  const int lane = threadIdx.x & 31, t = t0 + 2 * lane;
  const long long at = (seq.first + t) * p.H + h;
  const float g_even = (g && t < seq.length) ? g[at] : 0.0f;
  const float g_odd = (g && t + 1 < seq.length) ? g[at + p.H] : 0.0f;
  store_chunk_cumsum(G, g_even, g_odd);
}

__device__ __forceinline__ void load_chunk_cumsum(float* G, const float* g, const Problem& p, int b, int h, int t0) {
  load_chunk_cumsum(G, g, p, fixed_rows(p, b), h, t0);
}

// S <- exp(G_last) S + K^T X for the block's [K, kCols] fp32 state in shared rows S (stride ld), with K the
// chunk's keys (k[t * ldk + r]) and X [kChunk, kCols] (stride ld) already decayed to the chunk's end: the
// chunked state update of the v2 kernels, K/4 x kCols/4 tiles of 4 x 4 spread over the block's kThreads.
template <int kCols, int kThreads>
__device__ __forceinline__ void update_state_simt(float* S, int ld, const float* k, int ldk, const float* X, int K,
                                                  float G_last) {
  for (int tile = threadIdx.x; tile < (K / 4) * (kCols / 4); tile += kThreads) {
    const int m0 = (tile / (kCols / 4)) * 4, n0 = (tile % (kCols / 4)) * 4;
    float acc[4][4];
    zero(acc);
    micro_gemm<4, 4>(acc, k, 1, ldk, X, ld, 1, m0, n0, 0, kChunk);
    const float decay = expf(G_last);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float& s = S[(m0 + i) * ld + n0 + j];
        s = decay * s + acc[i][j];
      }
  }
}

}  // namespace minilin
