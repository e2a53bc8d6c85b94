// What the tensor-core backward kernels (csrc/linear_bwd/v2_chunked_mma.cu, csrc/delta_bwd/v2_chunked_wy_mma.cu,
// and with a decay per key channel csrc/gla_bwd/v2_chunked_mma.cu, csrc/kda_bwd/v2_chunked_wy_mma.cu) share:
// groups of 8 warps over 64-token chunks and 64-column value blocks, a chunk's rows and gates copied on chip, rows
// of a warp's accumulator tile scaled, and dg formed inside a chunk (a reverse sum over its 64 tokens of per-token
// terms, plus one term at the chunk's last token); for the per-channel gate, the sub-chunk references and dg's
// steps the two kernels take alike.
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

// ---- the chunk's gradients with a decay per key channel: the steps gla_bwd v2 and kda_bwd v2 share ------------
// Both kernels split the chunk into sub-chunks of 16 tokens (warp w: sub-chunk a = w / 2, rows m0 = 16 a) and keep,
// in shared memory, q and k [64, kLdK] bf16, G [64, kLdG] fp32 and the layout's Kref(a), Qref_rows(a), terms(),
// state_dot() and inter_dot(group) (their headers derive each term). Unlike the copy helpers above, these take a
// block of exactly kThreads threads (threadIdx.x is the thread's index).
constexpr int kSub = 16;  // tokens per sub-chunk

// G in place: the chunk-local cumulative sum of the log-gates, one thread per key channel.
template <int K, int kLdG>
__device__ __forceinline__ void channel_cumsum(float* G) {
  for (int f = threadIdx.x; f < K; f += kThreads) {
    float running = 0.0f;
    for (int r = 0; r < kChunk; ++r) {
      running += G[r * kLdG + f];
      G[r * kLdG + f] = running;
    }
  }
}

// This thread's part of sum_c X[r][c] Y[r][c] over two [kRows, 64] bf16 shared tiles (row stride kLdV), added into
// acc: kThreads / kRows threads per row, thread t on row t / (kThreads / kRows).
template <int kRows>
__device__ __forceinline__ void accumulate_row_dot(float& acc, const bf16* X, const bf16* Y) {
  constexpr int kRowThreads = kThreads / kRows, kColumns = kBlockV / kRowThreads;
  static_assert(kRowThreads >= 1 && kColumns % 8 == 0, "rows must split the block's threads in 8-column parts");
  const int row = threadIdx.x / kRowThreads, col0 = (threadIdx.x % kRowThreads) * kColumns;
#pragma unroll
  for (int col = 0; col < kColumns; col += 8) {
    float x[8], y[8];
    load8(X + row * kLdV + col0 + col, x);
    load8(Y + row * kLdV + col0 + col, y);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(x[e], y[e], acc);
  }
}

// accumulate_row_dot's parts added over each row's threads (adjacent lanes), the sum stored into out[row].
template <int kRows>
__device__ __forceinline__ void store_row_dot(float acc, float* out) {
  constexpr int kRowThreads = kThreads / kRows;
#pragma unroll
  for (int offset = 1; offset < kRowThreads; offset <<= 1) acc += __shfl_xor_sync(kFullMask, acc, offset);
  if (threadIdx.x % kRowThreads == 0) out[threadIdx.x / kRowThreads] = acc;
}

// A warp's [16, 32] tile (rows m0, columns n0) of a causal 64 x 64 score gradient, times factor, into dst (bf16, row
// stride kLdC): zero above the diagonal (kStrict: on it too).
template <bool kStrict>
__device__ __forceinline__ void store_lower_scores(const float (&acc)[1][4][4], float factor, bf16* dst, int m0,
                                                   int n0) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = m0 + acc_row(0, e), col = n0 + acc_col(j, e);
      const bool keep0 = kStrict ? col < r : col <= r, keep1 = kStrict ? col + 1 < r : col + 1 <= r;
      store_bf16x2(dst + r * kLdC + col, keep0 ? factor * acc[0][j][e] : 0.0f, keep1 ? factor * acc[0][j][e + 1] : 0.0f);
    }
}

// The sub-chunk references, two channels per thread, r the last token of sub-chunk a - 1 (Kref) or of a (Qref):
//   Kref_a,j = k_j exp(G_r - G_j)  (a = 1, 2, 3; j < 16 a),   Qref_a,i = q_i exp(G_i - G_r)  (a = 0, 1, 2; i >= 16 (a + 1))
// every exponent <= 0; for each Qref pair, more(a, i, f, e) with e its two exp(G_i - G_r) (kda_bwd v2's Kup).
template <int K, class Layout, class More>
__device__ __forceinline__ void store_sub_chunk_references(const Layout& L, const float* G, More more) {
  constexpr int kLdK = Layout::kLdK, kLdG = Layout::kLdG;
  for (int idx = threadIdx.x; idx < Layout::kRefRows * K / 2; idx += kThreads) {
    const int row = idx / (K / 2), f = 2 * (idx % (K / 2));
    {
      const int a = row < 16 ? 1 : row < 48 ? 2 : 3, j = row - (a == 1 ? 0 : a == 2 ? 16 : 48), r = kSub * a - 1;
      const float2 k2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.k() + j * kLdK + f));
      store_bf16x2(L.Kref(a) + j * kLdK + f, k2.x * __expf(G[r * kLdG + f] - G[j * kLdG + f]),
                   k2.y * __expf(G[r * kLdG + f + 1] - G[j * kLdG + f + 1]));
    }
    {
      const int a = row < 48 ? 0 : row < 80 ? 1 : 2, i = kSub * (a + 1) + row - (a == 0 ? 0 : a == 1 ? 48 : 80);
      const int r = kSub * a + kSub - 1;
      const float2 e = make_float2(__expf(G[i * kLdG + f] - G[r * kLdG + f]),
                                   __expf(G[i * kLdG + f + 1] - G[r * kLdG + f + 1]));
      const float2 q2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.q() + i * kLdK + f));
      store_bf16x2(L.Qref_rows(a) + i * kLdK + f, q2.x * e.x, q2.y * e.y);
      more(a, i, f, e);
    }
  }
}

// sum_j X_j[f] acc_j[f] over the warp's 16 rows, per key column f of its tile (columns k0 ..; X bf16 rows of stride
// ld): lanes 0 .. 3 write it into out[f].
template <int NT>
__device__ __forceinline__ void store_column_dots(const float (&acc)[1][NT][4], const bf16* X, int ld, int m0, int k0,
                                                  float* out) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    float column[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int f = k0 + acc_col(j, u);
      column[u] = acc[0][j][u] * __bfloat162float(X[(m0 + acc_row(0, 0)) * ld + f]) +
                  acc[0][j][u + 2] * __bfloat162float(X[(m0 + acc_row(0, 2)) * ld + f]);
#pragma unroll
      for (int offset = 4; offset < 32; offset <<= 1) column[u] += __shfl_xor_sync(kFullMask, column[u], offset);
    }
    if (lane < 4) {
      out[k0 + acc_col(j, 0)] = column[0];
      out[k0 + acc_col(j, 1)] = column[1];
    }
  }
}

// dg's per-token, per-channel terms q * dq + k_sign (k * Y) for the elements of the warp's tiles, into L.terms()
// [64][kLdG] (gla_bwd v2: Y = dk, k_sign = -1).
template <int NT, class Layout>
__device__ __forceinline__ void store_channel_gate_terms(const Layout& L, const float (&dq)[1][NT][4],
                                                         const float (&Y)[1][NT][4], float k_sign, int m0, int k0) {
  constexpr int kLdK = Layout::kLdK, kLdG = Layout::kLdG;
  float* terms = L.terms();
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = m0 + acc_row(0, e), f = k0 + acc_col(j, e);
      const float2 q2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.q() + r * kLdK + f));
      const float2 k2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(L.k() + r * kLdK + f));
      *reinterpret_cast<float2*>(terms + r * kLdG + f) =
          make_float2(q2.x * dq[0][j][e] + k_sign * (k2.x * Y[0][j][e]),
                      q2.y * dq[0][j][e + 1] + k_sign * (k2.y * Y[0][j][e + 1]));
    }
}

// dg of one chunk, channel by channel (after a barrier over store_channel_gate_terms):
//   dg_t[f] = sum_{t <= s < t0 + 64} terms_s[f] + exp(G_L[f]) state_dot[f] + sum over the 4 row groups inter_dot[f]
// (rows past T not written).
template <int K, class Layout>
__device__ __forceinline__ void store_channel_gate_gradient(const Layout& L, const BackwardProblem& p, int b, int h,
                                                            int t0) {
  constexpr int kLdG = Layout::kLdG;
  const float* G = L.G();
  const float* terms = L.terms();
  for (int f = threadIdx.x; f < K; f += kThreads) {
    float running = __expf(G[(kChunk - 1) * kLdG + f]) * L.state_dot()[f];
#pragma unroll
    for (int group = 0; group < 4; ++group) running += L.inter_dot(group)[f];
    for (int r = kChunk - 1; r >= 0; --r) {
      running += terms[r * kLdG + f];
      if (t0 + r < p.T) p.dg[token_index(p, b, t0 + r, h) * K + f] = running;
    }
  }
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
