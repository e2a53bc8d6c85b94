// What the tensor-core backward kernels (csrc/linear_bwd/v2_chunked_mma.cu, csrc/delta_bwd/v2_chunked_wy_mma.cu)
// share: groups of 8 warps over 64-token chunks and 64-column value blocks, a chunk's rows and gates copied on
// chip, rows of a warp's accumulator tile scaled, and dg formed inside a chunk (a reverse sum over its 64 tokens
// of per-token terms, plus one term at the chunk's last token).
//
// A warp's tiles in the 8-warp kernels: rows m0 .. m0 + 15 (m0 = 16 (warp / 2)) of every product with 64 rows,
// and of its columns the half warp % 2 (32 of 64, K / 2 of K), so the two warps 2i and 2i + 1 share their rows;
// delta_bwd v2's 16-warp gradients kernel splits the columns in quarters instead (its header says how). A block
// may run more than one group of 8 warps (delta_bwd v2's paired passes): the copy helpers split their work by a
// thread's index in its group.
#pragma once

#include "backward.cuh"
#include "chunk_tiles.cuh"
#include "mma.cuh"

namespace minilin {
namespace chunk_bwd {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockV = 64;        // value columns per value block
static_assert(kBlockV == kTensorCoreShape.value_multiple, "the tensor-core versions' ShapeRule names this block");
constexpr int kLdV = kBlockV + 8;  // bf16 row strides padded by 16 bytes (conflict-free ldmatrix)
constexpr int kLdC = kChunk + 8;
using bf16 = __nv_bfloat16;
// A pass's running [K, 64] matrix in the 8 warps' registers, split as linear v3 splits S: kRowSharers warps share
// each 16-row tile, each holding kStateTiles 8-column tiles of it.
template <int K>
constexpr int kRowSharers = kWarps / (K / 16);
template <int K>
constexpr int kStateTiles = (kBlockV / 8) / kRowSharers<K>;

// The helpers below split their work over a group of kThreads threads, the block or one of its 256-thread parts
// (threads t with the same t / kThreads), each thread by its index in the group.
__device__ __forceinline__ int group_thread() { return static_cast<int>(threadIdx.x % kThreads); }

// The chunk's 64 per-token scalars of a [B, T, H] float32 array (the log-gates, the betas) into dst (zeros past
// T; nothing when src is null).
__device__ __forceinline__ void cp_async_token_scalars(float* dst, const float* src, const BackwardProblem& p, int b,
                                                       int h, int t0) {
  const int i = group_thread();
  if (src && i < kChunk) {
    const bool ok = t0 + i < p.T;
    const long long row = token_index(p, b, t0, h) + static_cast<long long>(i) * p.H;
    cp_async_4(dst + i, ok ? src + row : src, ok);
  }
}

// Rows [t0, t0 + 64) of a [B, T, H, width] bf16 tensor, columns [c0, c0 + cols), into shared rows of stride ld,
// by a block of kBlockThreads threads.
template <int kCols, int kBlockThreads = kThreads>
__device__ __forceinline__ void cp_async_token_rows(bf16* dst, int ld, const void* src, const BackwardProblem& p, int b,
                                                    int h, int t0, int width, int c0) {
  cp_async_tile<kBlockThreads, kChunk, kCols>(dst, ld,
                                              static_cast<const bf16*>(src) + token_index(p, b, t0, h) * width + c0,
                                              static_cast<long long>(p.H) * width, min(kChunk, p.T - t0));
}

// A [kRows, 64] value block of a workspace matrix (global rows of stride V, the block's first column at src) into
// shared rows of stride kLdV.
template <int kRows, int kBlockThreads = kThreads>
__device__ __forceinline__ void cp_async_value_block(bf16* dst, const bf16* src, int V) {
  cp_async_tile<kBlockThreads, kRows, kBlockV>(dst, kLdV, src, V);
}

// One value block's V, dO, S_{c-1} and D_c columns (c the chunk, v0 its first column) into a gradients kernel's
// shared tiles L.v(), L.dO() (64 rows) and L.S(), L.D() (K rows), from the workspace's per-chunk states and
// adjoints ([B, H, chunks, K, V] bf16).
template <int K, class Layout>
__device__ __forceinline__ void load_value_block(const Layout& L, const BackwardProblem& p, const bf16* states,
                                                 const bf16* adjoints, int b, int h, int c, int v0) {
  const int t0 = c * kChunk;
  cp_async_token_rows<kBlockV>(L.v(), kLdV, p.v, p, b, h, t0, p.V, v0);
  cp_async_token_rows<kBlockV>(L.dO(), kLdV, p.do_, p, b, h, t0, p.V, v0);
  const long long at = ((static_cast<long long>(b) * p.H + h) * chunk_count(p.T) + c) * K * p.V + v0;
  cp_async_value_block<K>(L.S(), states + at, p.V);
  cp_async_value_block<K>(L.D(), adjoints + at, p.V);
}

// A block's [rows, 64] bf16 shared tile (row stride kLdV) copied into global rows of stride ld, 16 bytes per copy.
__device__ __forceinline__ void copy_out_rows(bf16* dst, long long ld, const bf16* src, int rows) {
  for (int i = group_thread(); i < rows * kBlockV / 8; i += kThreads) {
    const int r = i / (kBlockV / 8), col = (i % (kBlockV / 8)) * 8;
    *reinterpret_cast<uint4*>(dst + r * ld + col) = *reinterpret_cast<const uint4*>(src + r * kLdV + col);
  }
}

// acc's rows r (of the warp's tile at row m0) times factor(m0 + r).
template <int NT, typename Factor>
__device__ __forceinline__ void scale_rows(float (&acc)[1][NT][4], int m0, Factor factor) {
  const float top = factor(m0 + acc_row(0, 0)), bottom = factor(m0 + acc_row(0, 2));
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    acc[0][j][0] *= top;
    acc[0][j][1] *= top;
    acc[0][j][2] *= bottom;
    acc[0][j][3] *= bottom;
  }
}

// This thread's parts of sum_c acc[r][c] X[r][c] for its two rows r of the warp's tile (top: row m0 + lane / 4,
// bottom: 8 rows further), X bf16 in shared rows of stride ld, the tile's columns starting at n0.
template <int NT>
__device__ __forceinline__ float2 row_dots(const float (&acc)[1][NT][4], const bf16* X, int ld, int m0, int n0) {
  float top = 0.0f, bottom = 0.0f;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // elements e and e + 1 sit in adjacent columns: one 4-byte load
      const float2 x = __bfloat1622float2(
          *reinterpret_cast<const __nv_bfloat162*>(X + (m0 + acc_row(0, e)) * ld + n0 + acc_col(j, e)));
      const float d = fmaf(acc[0][j][e], x.x, acc[0][j][e + 1] * x.y);
      if (e < 2) top += d;
      else bottom += d;
    }
  return make_float2(top, bottom);
}

// The sum over this thread's elements of a warp's tile of acc * X (row_dots over both rows).
template <int NT>
__device__ __forceinline__ float tile_dot(const float (&acc)[1][NT][4], const bf16* X, int ld, int m0, int n0) {
  const float2 d = row_dots(acc, X, ld, m0, n0);
  return d.x + d.y;
}

// A per-row partial sum (row_dots' pair) added over the 4 lanes that hold each row: every lane gets its rows' sums
// over the warp's columns.
__device__ __forceinline__ float2 sum_row_lanes(float2 t) {
#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    t.x += __shfl_xor_sync(kFullMask, t.x, offset);
    t.y += __shfl_xor_sync(kFullMask, t.y, offset);
  }
  return t;
}

// Rows m0 + lane / 4 and 8 further of a 16-row part (sum_row_lanes' pair), written by the first lane of each row
// into part[row].
__device__ __forceinline__ void store_row_part(float* part, float2 t, int m0) {
  t = sum_row_lanes(t);
  if ((threadIdx.x & 3) == 0) {
    part[m0 + acc_row(0, 0)] = t.x;
    part[m0 + acc_row(0, 2)] = t.y;
  }
}

// ---- per-channel decays of a warp's tile (gla_bwd v2, kda_bwd v2: G [64, kLdG] fp32, per key channel) ----------
// The decay of element (r, f) of the warp's tile at (m0, k0): exp(G[r][f] - G[ref][f]) (sign +1) or
// exp(G[ref][f] - G[r][f]) (sign -1); ref < 0: exp(+-G[r][f]) alone (ref's row taken as zero).
template <int kLdG>
__device__ __forceinline__ float decay_of(const float* G, int r, int f, int ref, float sign) {
  return __expf(sign * (G[r * kLdG + f] - (ref >= 0 ? G[ref * kLdG + f] : 0.0f)));
}

// acc times factor and its decay, in place.
template <int NT, int kLdG>
__device__ __forceinline__ void scale_decayed(float (&acc)[1][NT][4], const float* G, int m0, int k0, int ref,
                                              float sign, float factor) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[0][j][e] = factor * acc[0][j][e] * decay_of<kLdG>(G, m0 + acc_row(0, e), k0 + acc_col(j, e), ref, sign);
}

// acc times its decay, added into out.
template <int NT, int kLdG>
__device__ __forceinline__ void add_decayed(float (&out)[1][NT][4], const float (&acc)[1][NT][4], const float* G,
                                            int m0, int k0, int ref, float sign) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      out[0][j][e] = fmaf(acc[0][j][e], decay_of<kLdG>(G, m0 + acc_row(0, e), k0 + acc_col(j, e), ref, sign),
                          out[0][j][e]);
}

// Shared scratch for store_gate_gradient in a block of kBlockWarps warps whose tiles split their columns into
// kColumnGroups groups (warp w takes group w % kColumnGroups): per-token terms of each group [kColumnGroups][64],
// and a per-warp term [kBlockWarps].
template <int kColumnGroups = 2, int kBlockWarps = kWarps>
struct GateScratch {
  float* term;
  float* last;
  static constexpr size_t kBytes = (kColumnGroups * kChunk + kBlockWarps) * sizeof(float);
};

// dg of one chunk: dg_t = sum_{t <= s < t0 + 64} term_s + last, with term_s this thread's part of the per-token term
// for its two rows (top, bottom: row_dots' rows) and `last` its part of the chunk's last-token term. The terms are
// added over each row's 4 lanes and the warps that share its rows (one per column group), `last` over the block,
// then a reverse scan over the 64 tokens by warp 0 stores dg (rows past T are not written). Every thread must call
// it; it ends with warp 0 alone still running, so nothing may follow it but the kernel's end.
template <int kColumnGroups, int kBlockWarps>
__device__ __forceinline__ void store_gate_gradient(const GateScratch<kColumnGroups, kBlockWarps>& s,
                                                    const BackwardProblem& p, float2 term, float last, int b, int h,
                                                    int t0, int m0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, group = warp % kColumnGroups;
  term = sum_row_lanes(term);
  if ((lane & 3) == 0) {
    s.term[group * kChunk + m0 + acc_row(0, 0)] = term.x;
    s.term[group * kChunk + m0 + acc_row(0, 2)] = term.y;
  }
  last = warp_sum(last);
  if (lane == 0) s.last[warp] = last;
  __syncthreads();
  if (warp != 0) return;
  float total_last = 0.0f;
#pragma unroll
  for (int w = 0; w < kBlockWarps; ++w) total_last += s.last[w];
  // lane l: tokens 2l and 2l + 1; x = the pair's sum, then the sum over pairs l .. 31
  float even = 0.0f, odd = 0.0f;
#pragma unroll
  for (int g = 0; g < kColumnGroups; ++g) {
    even += s.term[g * kChunk + 2 * lane];
    odd += s.term[g * kChunk + 2 * lane + 1];
  }
  float x = even + odd;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const float y = __shfl_down_sync(kFullMask, x, offset);
    if (lane + offset < 32) x += y;
  }
  float after = __shfl_down_sync(kFullMask, x, 1);  // the sum over pairs l + 1 .. 31
  if (lane == 31) after = 0.0f;
  const float dg_odd = odd + after + total_last, dg_even = even + odd + after + total_last;
  if (t0 + 2 * lane < p.T) p.dg[token_index(p, b, t0 + 2 * lane, h)] = dg_even;
  if (t0 + 2 * lane + 1 < p.T) p.dg[token_index(p, b, t0 + 2 * lane + 1, h)] = dg_odd;
}

}  // namespace chunk_bwd
}  // namespace minilin
