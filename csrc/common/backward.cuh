// What the recurrent backward kernels (linear_bwd v1 and gla_bwd v1 through linear_bwd/recurrent_loops.cuh,
// delta_bwd v1 and kda_bwd v1 through delta_bwd/recurrent_passes.cuh) share: the forward v1's layout (one block
// per (batch, head, 32 value columns), 4 warps x 8 columns, lane l holding key rows l, l + 32, ...), per-token
// loads straight from global memory, the decays of a lane's key rows, the reduction of a per-row gradient over the
// block's 4 warps, the sum over value blocks that turns the blocks' partial gradients into dq and dk, and the
// host-side checks.
//
// A gradient that sums over value columns (dq_t = S_t do_t, dk_t, and the scalars dg_t, dbeta_t) is only partly
// known to a block, which holds 32 of the V columns: each block writes its part to workspace[value block][...]
// and sum_value_blocks adds the parts in a fixed order (deterministic: the same bits on every run).
#pragma once

#include <string>

#include "device.cuh"
#include "launch.cuh"
#include "../minilin_cuda.h"

namespace minilin {

constexpr int kBwdWarps = 4;
constexpr int kBwdColumnsPerWarp = 8;
constexpr int kBwdBlockColumns = kBwdWarps * kBwdColumnsPerWarp;  // 32 value columns per block
constexpr int kBwdMaxK = kKeysUpTo256.max_k;                      // ROWS = K / 32 <= 8 register rows per lane

__host__ __device__ inline int bwd_value_blocks(int V) { return (V + kBwdBlockColumns - 1) / kBwdBlockColumns; }

// Row n of a per-token [B, T, H] array: (b, t, h).
__device__ __forceinline__ long long token_index(const BackwardProblem& p, int b, int t, int h) {
  return (static_cast<long long>(b) * p.T + t) * p.H + h;
}

// factor * x[bth * width + lane + 32 r] for r < ROWS (0 past width): a lane's key rows of q or k.
template <typename Elem, int ROWS>
__device__ __forceinline__ void load_rows(float (&out)[ROWS], const void* x, long long bth, int width, int lane,
                                          float factor) {
  const Elem* row = static_cast<const Elem*>(x) + bth * width;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int f = lane + 32 * r;
    out[r] = f < width ? factor * to_float(row[f]) : 0.0f;
  }
}

// The decay of a lane's key rows at token bth: exp(g[bth]) for every row (scalar gate), exp(g[bth, row]) (per
// channel), or 1 without a gate.
template <bool kPerChannel, int ROWS>
__device__ __forceinline__ void row_decays(float (&a)[ROWS], const BackwardProblem& p, long long bth, int lane) {
  if constexpr (kPerChannel) {
    load_rows<float, ROWS>(a, p.g, bth, p.K, lane, 1.0f);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) a[r] = expf(a[r]);
  } else {
    const float decay = p.g ? expf(p.g[bth]) : 1.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) a[r] = decay;
  }
}

// The forward call a backward call differentiates (its inputs, sizes, scale, dtype and stream; no outputs), for a
// backward version that runs a forward kernel's step (delta_bwd v2 the WY prepare).
inline Problem forward_problem(const BackwardProblem& p) {
  Problem f;
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.g = p.g;
  f.beta = p.beta;
  f.h0 = p.h0;
  f.B = p.B;
  f.T = p.T;
  f.H = p.H;
  f.K = p.K;
  f.V = p.V;
  f.scale = p.scale;
  f.dtype = p.dtype;
  f.stream = p.stream;
  return f;
}

// x[bth * V + col0 + c] for c < 8 (0 past V): a warp's 8 value columns of v or do, the same in every lane.
template <typename Elem>
__device__ __forceinline__ void load_columns(float (&out)[kBwdColumnsPerWarp], const void* x, long long bth, int V,
                                             int col0) {
  const Elem* row = static_cast<const Elem*>(x) + bth * V;
#pragma unroll
  for (int c = 0; c < kBwdColumnsPerWarp; ++c) out[c] = col0 + c < V ? to_float(row[col0 + c]) : 0.0f;
}

// The block's state slice: S[r][c] = row lane + 32 r, column col0 + c of the [K, V] matrix at src (zeros when src is
// null or outside [K, V]); store_slice writes it back where it lies inside.
template <int ROWS>
__device__ __forceinline__ void load_slice(float (&S)[ROWS][kBwdColumnsPerWarp], const float* src, int K, int V,
                                           int lane, int col0) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int c = 0; c < kBwdColumnsPerWarp; ++c) {
      const int row = lane + 32 * r, col = col0 + c;
      S[r][c] = (src && row < K && col < V) ? src[static_cast<long long>(row) * V + col] : 0.0f;
    }
}
template <int ROWS>
__device__ __forceinline__ void store_slice(const float (&S)[ROWS][kBwdColumnsPerWarp], float* dst, int K, int V,
                                            int lane, int col0) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int c = 0; c < kBwdColumnsPerWarp; ++c) {
      const int row = lane + 32 * r, col = col0 + c;
      if (row < K && col < V) dst[static_cast<long long>(row) * V + col] = S[r][c];
    }
}

// Per-row partial sums of the block's 4 warps (each lane's ROWS rows, over its warp's 8 columns) added up and
// written to out[f], f < K; `rows` is the block's shared [kBwdWarps][kBwdMaxK] buffer. Two block barriers: the
// buffer is free again when this returns. Every thread of the block must call it.
template <int ROWS>
__device__ __forceinline__ void block_sum_rows(const float (&part)[ROWS], float (*rows)[kBwdMaxK], float* out, int K) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
    if (lane + 32 * r < K) rows[warp][lane + 32 * r] = part[r];
  __syncthreads();
  for (int f = threadIdx.x; f < K; f += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kBwdWarps; ++w) sum += rows[w][f];
    out[f] = sum;
  }
  __syncthreads();
}

// out[i] = factor * sum_{s < slices} parts[s * count + i]: the value blocks' partial gradients, added in order (in
// float32), then stored as Out.
template <typename Out>
__global__ void sum_value_blocks(const float* parts, Out* out, long long count, int slices, float factor) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < slices; ++s) sum += parts[s * count + i];
    out[i] = from_float<Out>(factor * sum);
  }
}

// Into `out` of type Out: float for the float32 gradients (dg, dbeta), the input dtype for dq and dk.
template <typename Out>
inline void launch_sum_value_blocks(const BackwardProblem& p, const char* name, const float* parts, void* out,
                                    long long count, float factor) {
  const int slices = bwd_value_blocks(p.V);
  const int threads = 256;
  const long long blocks = (count + threads - 1) / threads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);  // grid-stride past that
  sum_value_blocks<Out><<<grid, threads, 0, stream_of(p)>>>(parts, static_cast<Out*>(out), count, slices, factor);
  check_launch(name, p);
}

// The checks every backward version shares: the forward's (check_common, with the backward's pointers), K <= 256,
// and the workspace.
inline void check_backward_problem(const BackwardProblem& p, const char* kernel, bool needs_beta, size_t workspace) {
  const auto k = [kernel] { return std::string(kernel); };
  require(p.B > 0 && p.T > 0 && p.H > 0 && p.K > 0 && p.V > 0, [&] {
    return k() + ": sizes must be positive, got B=" + std::to_string(p.B) + " T=" + std::to_string(p.T) + " H=" +
           std::to_string(p.H) + " K=" + std::to_string(p.K) + " V=" + std::to_string(p.V);
  });
  require(p.q && p.k && p.v && p.do_ && p.dq && p.dk && p.dv, [&] {
    return k() + ": q, k, v, do, dq, dk and dv must be device pointers, got a null one";
  });
  require(!needs_beta || (p.beta && p.dbeta), [&] { return k() + ": beta and dbeta must be device pointers, got null"; });
  require(!p.g || p.dg, [&] { return k() + ": dg must be a device pointer when g is given"; });
  require(p.dtype == kFloat32 || p.dtype == kBFloat16, [&] {
    return k() + ": dtype code must be 0 (float32) or 1 (bfloat16), got " + std::to_string(p.dtype);
  });
  require(p.K <= kBwdMaxK, [&] {
    return k() + ": K must be <= " + std::to_string(kBwdMaxK) + " (the state rows live in registers), got K=" +
           std::to_string(p.K);
  });
  require(workspace == 0 || (p.workspace && p.workspace_size >= workspace), [&] {
    return k() + ": workspace must hold " + std::to_string(workspace) + " bytes, got " +
           std::to_string(p.workspace_size);
  });
}

// The tensor-core backward versions' checks: check_backward_problem, then the shape the forward ones take too.
inline void check_tensor_core_backward(const BackwardProblem& p, const char* kernel, bool needs_beta, size_t workspace,
                                       int block_v) {
  check_backward_problem(p, kernel, needs_beta, workspace);
  require_tensor_core_shape(kernel, p.dtype, p.K, p.V, block_v);
}

}  // namespace minilin
