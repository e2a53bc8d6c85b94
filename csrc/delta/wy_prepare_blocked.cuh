// The WY step by blocks (delta v5 onwards): the same T = (I + A)^-1 as wy_prepare.cuh, for every chunk in
// parallel over (batch, head, chunk), but solved in 16 x 16 blocks instead of one 64-long chain per column:
//
//     A_ij = beta_i (k_i . k_j) exp(G_i - G_j)  for j < i, else 0             [64 x 64, 4 x 4 blocks of 16]
//     D_b  = (I + A_bb)^-1                                                     the 4 diagonal blocks
//     T_bb = D_b,   T_ij = -D_i  sum_{k = j}^{i - 1} A_ik T_kj   (i > j)      the blocks below the diagonal
//
// (the block form of forward substitution: row block i of (I + A) T = I reads A_ii T_ij = -sum_k A_ik T_kj).
// The diagonal inverses are 64 independent 16-long forward substitutions (one thread per column of a
// block); the off-diagonal blocks follow in three waves by distance i - j = 1, 2, 3, one warp per block,
// each a sum of 16 x 16 x 16 fp32 products. The dependent chain is 16 + 3 short steps instead of the
// 2016 dependent multiply-adds per thread of wy_prepare.cuh, which ncu measured at 263 us, 29% of delta v4.
// At 4 blocks per SM it took 162 us at T = 8192 (ncu, H200), waiting mostly on its own barriers: in the waves
// only 1 to 3 of the 8 warps work. So more blocks share an SM, to fill those idle slots: the key tile and T
// share their bytes (the keys are dead once A is formed), the waves' partial sums live in A's blocks above
// the diagonal (never read as A), and 40 registers: 35 KB and 6 blocks per SM instead of 56 KB and 4
// (141 us). The shared-memory reads are 16 bytes wide, the pipe then being the limit (csrc/NOTES.md).
// The solve stays fp32: T is rounded to bf16 once, when it is stored, as in v3 and v4. The waves' block
// products run on CUDA cores (v5 - v8: a 2 x 4 micro-tile per lane, 16-byte reads) or, for delta v9 and v10, on
// tensor cores in 3xTF32 (mma.cuh's warp_block_product_3xtf32: three tf32 mma per product, within a few
// 1e-6 of fp32), which read each operand once per warp, 4 bytes at a time, instead of once per lane group.
// One block per (chunk row, head) of the WY workspace (wy_tiles.cuh), which also takes packed sequences and grouped
// value heads (k read from head h's q/k head): delta v10 reads both.
#pragma once

#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/simt.cuh"
#include "wy_tiles.cuh"

namespace minilin {

namespace wy_blocked {

constexpr int kThreads = 256;  // 8 warps (a power of two: the roles rotate by a mask)
constexpr int kBlock = 16;                // the solve's block size
constexpr int kBlocks = kChunk / kBlock;  // 4 x 4 blocks
constexpr int kLd = kChunk + 4;           // fp32 rows of A and T: 16-byte aligned for the float4 reads

constexpr int kBlocksPerSM = 6;           // 35 KB of shared memory and at most 40 registers per thread each

// The key tile (bf16, until A is formed) and T (fp32, from then on) share their bytes.
__host__ __device__ inline constexpr size_t keys_or_T_bytes(int K) {
  return size_t(kChunk) * (K + 8) * sizeof(__nv_bfloat16) > size_t(kChunk) * kLd * sizeof(float)
             ? size_t(kChunk) * (K + 8) * sizeof(__nv_bfloat16)
             : size_t(kChunk) * kLd * sizeof(float);
}

inline size_t shared_bytes(int K) {
  return keys_or_T_bytes(K)                     // the chunk's keys (bf16), then T (fp32) in the same bytes
         + size_t(kChunk) * kLd * sizeof(float)  // A; its blocks above the diagonal hold the waves' partial sums
         + 2 * kChunk * sizeof(float);           // G and beta
}

// acc (rows r0 and r0 + 8, columns c0 + 0..3 of the lane's micro-tile) += X[row][k_begin..k_end) Y[k_begin..k_end)[col]
// for fp32 row-major X (stride ldx) and Y (stride ldy), rows 16-byte aligned and k_begin, k_end multiples of 4.
// Rows 8 apart, so that the 8 rows a warp reads at once (r0 = lane / 4) fall into 8 different banks; X read 4
// steps at a time (one 16-byte load per row instead of four), the shared-memory pipe being this kernel's limit.
__device__ __forceinline__ void micro_tile_2x4(float (&acc)[2][4], const float* X, int ldx, const float* Y, int ldy,
                                               int r0, int c0, int k_begin, int k_end) {
  for (int kk = k_begin; kk < k_end; kk += 4) {
    const float4 x0 = *reinterpret_cast<const float4*>(X + r0 * ldx + kk);
    const float4 x1 = *reinterpret_cast<const float4*>(X + (r0 + 8) * ldx + kk);
    const float row0[4] = {x0.x, x0.y, x0.z, x0.w}, row1[4] = {x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float4 y = *reinterpret_cast<const float4*>(Y + (kk + u) * ldy + c0);
      acc[0][0] = fmaf(row0[u], y.x, acc[0][0]);
      acc[0][1] = fmaf(row0[u], y.y, acc[0][1]);
      acc[0][2] = fmaf(row0[u], y.z, acc[0][2]);
      acc[0][3] = fmaf(row0[u], y.w, acc[0][3]);
      acc[1][0] = fmaf(row1[u], y.x, acc[1][0]);
      acc[1][1] = fmaf(row1[u], y.y, acc[1][1]);
      acc[1][2] = fmaf(row1[u], y.z, acc[1][2]);
      acc[1][3] = fmaf(row1[u], y.w, acc[1][3]);
    }
  }
}

// Where the waves' 16 x 16 x 16 block products run.
enum class WaveProducts {
  kCudaCores,    // micro_tile_2x4 (delta v5 - v8)
  kTensorCores,  // warp_block_product_3xtf32 (delta v9 and v10)
};

// C = X[0..16)[k_begin..k_end) Y[k_begin..k_end)[0..16) for one warp, stored (times `sign`) as fp32 rows of
// stride kLd at C: each lane's elements in the layout its product leaves them.
template <WaveProducts kProducts>
__device__ __forceinline__ void warp_block_product(float* C, float sign, const float* X, const float* Y, int k_begin,
                                                   int k_end) {
  const int lane = threadIdx.x & 31;
  float acc[2][4] = {};
  if constexpr (kProducts == WaveProducts::kCudaCores) {
    // Lane micro-tile: rows lane / 4 and lane / 4 + 8, columns 4 (lane % 4) + 0..3 of the 16 x 16 block.
    const int r0 = lane >> 2, c0 = 4 * (lane & 3);
    micro_tile_2x4(acc, X, kLd, Y, kLd, r0, c0, k_begin, k_end);
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<float4*>(C + (r0 + 8 * r) * kLd + c0) =
          make_float4(sign * acc[r][0], sign * acc[r][1], sign * acc[r][2], sign * acc[r][3]);
  } else {
    // acc[j]: the mma C fragment of columns 8 j..8 j + 7 (rows lane / 4 and lane / 4 + 8, two columns each).
    warp_block_product_3xtf32(acc, X, kLd, Y, kLd, k_begin, k_end);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<float2*>(C + (g + 8 * r) * kLd + 8 * j + 2 * t) =
            make_float2(sign * acc[j][2 * r], sign * acc[j][2 * r + 1]);
  }
}

// T = (I + A)^-1 of a unit lower-triangular 64 x 64 system by blocks, for the block's 8 warps (warp: this thread's
// role, role_thread = 32 warp + lane): A fp32 in shared rows of stride kLd, read only strictly below the diagonal
// (its diagonal blocks' upper parts may hold anything finite or not: they are loaded 4 at a time and masked), its
// blocks above the diagonal never read as A but used as the waves' scratch; T into Tm (stride kLd), its blocks above
// the diagonal left unwritten. Ends with a barrier.
template <WaveProducts kProducts>
__device__ __forceinline__ void solve_unit_lower(float* A, float* Tm, int warp, int role_thread) {
  // D_b = (I + A_bb)^-1, thread (b, c) the column c of block b: x_i = [i == c] - sum_{j < i} A_ij x_j.
  if (role_thread < kBlocks * kBlock) {
    const int base = kBlock * (role_thread / kBlock), c = role_thread % kBlock;
    float x[kBlock];
#pragma unroll
    for (int i = 0; i < kBlock; ++i) {
      float xi = i == c ? 1.0f : 0.0f;
      const float* row = A + (base + i) * kLd + base;
#pragma unroll
      for (int j4 = 0; j4 < i; j4 += 4) {  // A's row 4 entries per 16-byte load (the shared-memory pipe is the limit)
        const float4 a4 = *reinterpret_cast<const float4*>(row + j4);
        const float a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (j4 + u < i) xi = fmaf(-a[u], x[j4 + u], xi);
      }
      x[i] = xi;
      Tm[(base + i) * kLd + base + c] = xi;
    }
  }
  __syncthreads();

  // The blocks below the diagonal, by distance: warp w of wave d computes T_ij with i = w + d, j = w.
  for (int d = 1; d < kBlocks; ++d) {
    if (warp < kBlocks - d) {
      const int i = warp + d, j = warp;
      float* M = A + kBlock * (warp + 1);  // block (0, warp + 1) of A: above the diagonal, never read as A
      // M = sum_{k = j}^{i - 1} A_ik T_kj: the rows of block row i of A against block column j of T
      warp_block_product<kProducts>(M, 1.0f, A + kBlock * i * kLd, Tm + kBlock * j, kBlock * j, kBlock * i);
      __syncwarp();
      // T_ij = -D_i M
      warp_block_product<kProducts>(Tm + kBlock * i * kLd + kBlock * j, -1.0f, Tm + kBlock * i * kLd + kBlock * i, M,
                                    0, kBlock);
    }
    __syncthreads();
  }
}

template <int K, WaveProducts kProducts>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM) delta_wy_prepare_blocked(const Problem p, __nv_bfloat16* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int h = blockIdx.y;
  const ChunkOfBlock chunk = chunk_of_block(p);  // this block's chunk (common/sequences.cuh's chunk_grid)
  if (!chunk.used) return;                       // a row between two packed sequences' chunks
  const SequenceRows seq = sequence_rows(p, chunk.b);
  const int t0 = chunk.n * kChunk;
  // The roles below fall unevenly on the warps (warp 0 works in every phase, warp 1 in most), and warp w
  // issues on sub-partition w % 4 of the SM: rotating the roles with the chunk spreads the busy ones over
  // the four sub-partitions across the 6 blocks an SM holds. `warp` is the role; the solve's threads by role.
  // Measured (same-run A/B, H200, outputs bit-identical): delta v8 0.6% and v5 0.7% faster at T = 8192,
  // 0.1-0.3% at 32768: the other blocks' warps had already filled most of the idle schedulers.
  const int warp = ((threadIdx.x >> 5) + (blockIdx.x & 3)) & (kThreads / 32 - 1), lane = threadIdx.x & 31;
  const int role_thread = 32 * warp + lane;
  constexpr int ld_k = K + 8;
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem);            // [kChunk][K + 8], until A is formed
  float* Tm = reinterpret_cast<float*>(smem);                              // [kChunk][kLd], from then on
  float* A = reinterpret_cast<float*>(smem + keys_or_T_bytes(K));          // [kChunk][kLd]
  float* G = A + kChunk * kLd;                                             // [kChunk]
  float* beta = G + kChunk;                                                // [kChunk]

  const int qk_heads = qk_heads_of(p);
  const __nv_bfloat16* k =
      static_cast<const __nv_bfloat16*>(p.k) + ((seq.first + t0) * qk_heads + qk_head_of(p, h)) * K;
  cp_async_rows(k_s, ld_k, k, static_cast<long long>(qk_heads) * K, kChunk, K, min(kChunk, seq.length - t0));
  cp_async_commit();
  load_chunk_scalars(beta, p.beta, p, seq, h, t0);
  if (warp == 0) load_chunk_cumsum(G, p.g, p, seq, h, t0);
  cp_async_wait<0>();
  __syncthreads();

  {  // A = strictly lower part of diag(beta) (K K^T) decayed: warp w, rows 16 (w / 2).., columns 32 (w % 2)..
    const int m0 = 16 * (warp >> 1), n0 = 32 * (warp & 1);
    float acc[1][4][4];
    zero(acc);
    if (n0 < m0 + 16)
      warp_mma_unrolled<1, 4, Stored::kRowMajor, Stored::kTransposed, K / 16>(acc, k_s, ld_k, k_s, ld_k, m0, n0, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e);
        A[r * kLd + c] = c < r ? beta[r] * acc[0][j][e] * __expf(G[r] - G[c]) : 0.0f;
      }
  }
  __syncthreads();

  solve_unit_lower<kProducts>(A, Tm, warp, role_thread);

  // Store T in bf16, zeros above the diagonal blocks: 8 elements (16 bytes) per thread and step.
  // The row again from blockIdx (free), not kept from the start: at the 40 registers 6 blocks per SM allow, a
  // row held across the solve spilled.
  __nv_bfloat16* T_out = out + wy_row_tile_offset(p, h, chunk_of_block_row(p));
  for (int e = threadIdx.x * 8; e < kChunk * kChunk; e += kThreads * 8) {
    const int r = e / kChunk, c = e % kChunk;
    const bool above = c / kBlock > r / kBlock;
    const float4 lo = above ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : *reinterpret_cast<const float4*>(Tm + r * kLd + c);
    const float4 hi = above ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : *reinterpret_cast<const float4*>(Tm + r * kLd + c + 4);
    const float t[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    unsigned packed[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(t[2 * q], t[2 * q + 1]);
      packed[q] = *reinterpret_cast<const unsigned*>(&pair);
    }
    *reinterpret_cast<uint4*>(T_out + e) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

}  // namespace wy_blocked

// For K = 64 or 128 (the callers check).
template <wy_blocked::WaveProducts kProducts = wy_blocked::WaveProducts::kCudaCores>
inline void launch_wy_prepare_blocked(const Problem& p, __nv_bfloat16* out, const char* name) {
  using wy_blocked::delta_wy_prepare_blocked;
  launch_checked(p, name,
                 p.K == 64 ? delta_wy_prepare_blocked<64, kProducts> : delta_wy_prepare_blocked<128, kProducts>,
                 chunk_grid(p, p.H), wy_blocked::kThreads, wy_blocked::shared_bytes(p.K), out);
}

}  // namespace minilin
