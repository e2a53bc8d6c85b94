// Tensor-core building blocks of the v3 kernels: mma.sync m16n8k16 (bf16 in, fp32 accumulate, sm_80+) fed
// from shared memory by ldmatrix. Fragment layouts are the PTX ISA's ("Matrix Fragments for mma.m16n8k16"):
// with g = lane / 4 and t = lane % 4,
//   A (16 x 16, row-major):  a0 = A[g][2t..2t+1]  a1 = A[g+8][2t..]  a2 = A[g][2t+8..]  a3 = A[g+8][2t+8..]
//   B (16 x 8, "col"):       b0 = B[2t..2t+1][g]  b1 = B[2t+8..2t+9][g]
//   C (16 x 8, fp32):        c0, c1 = C[g][2t], C[g][2t+1]      c2, c3 = C[g+8][2t], C[g+8][2t+1]
// Shared tiles are bf16, row-major, with rows padded by 8 elements (16 bytes) so that the 8 rows one
// ldmatrix reads fall into different banks.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

namespace minilin {

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

// d += a b for one 16 x 8 x 16 tile.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same, without `volatile`: a pure register operation the compiler may schedule freely (later than
// the fragment loads of the next step), which is what the unrolled loops below want.
__device__ __forceinline__ void mma_bf16_schedulable(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- fragment loads from shared memory; ld is the row stride in elements ------------------------
// A(m, kk) = X[m][kk]: the 16 x 16 tile at (m0, k0) of a row-major matrix.
__device__ __forceinline__ void load_a(unsigned (&a)[4], const __nv_bfloat16* X, int ld, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4(a, X + (m0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8);
}

// A(m, kk) = X[kk][m]: the 16 x 16 tile at (m0, k0) of the transpose of a row-major X (e.g. K^T from K).
__device__ __forceinline__ void load_a_transposed(unsigned (&a)[4], const __nv_bfloat16* X, int ld, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4_trans(a, X + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + m0 + ((lane >> 3) & 1) * 8);
}

// B(kk, n) = Y[n][kk] for the two 16 x 8 tiles at (k0, n0) and (k0, n0 + 8): b[0], b[1] for the first,
// b[2], b[3] for the second (e.g. B = K^T from K for Q K^T).
__device__ __forceinline__ void load_b_pair(unsigned (&b)[4], const __nv_bfloat16* Y, int ld, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4(b, Y + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + ((lane >> 3) & 1) * 8);
}

// B(kk, n) = Z[kk][n] for the two 16 x 8 tiles at (k0, n0) and (k0, n0 + 8) of a row-major Z (e.g. V).
__device__ __forceinline__ void load_b_pair_transposed(unsigned (&b)[4], const __nv_bfloat16* Z, int ld, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4_trans(b, Z + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * ld + n0 + (lane >> 4) * 8);
}

// ---- one warp's tile of C = A B: MT x NT tiles of 16 x 8 ------------------------------------------------
// kA / kB say how A and B are stored (see the loaders above). NT must be even (B tiles load in pairs).
enum class Stored { kRowMajor, kTransposed };

// The A tile at (m0, k0) and the B pair at (k0, n0), each read the way its operand is stored.
template <Stored kA>
__device__ __forceinline__ void load_a_stored(unsigned (&a)[4], const __nv_bfloat16* A, int lda, int m0, int k0) {
  if constexpr (kA == Stored::kRowMajor) load_a(a, A, lda, m0, k0);
  else load_a_transposed(a, A, lda, m0, k0);
}

template <Stored kB>
__device__ __forceinline__ void load_b_pair_stored(unsigned (&b)[4], const __nv_bfloat16* B, int ldb, int k0, int n0) {
  if constexpr (kB == Stored::kRowMajor) load_b_pair_transposed(b, B, ldb, k0, n0);
  else load_b_pair(b, B, ldb, k0, n0);
}

// One k-step of 16 of a warp's tile of C = A B: MT x NT tiles of 16 x 8 at k0. kSchedulable: the mma without
// `volatile`, for the unrolled loops below.
template <int MT, int NT, Stored kA, Stored kB, bool kSchedulable>
__device__ __forceinline__ void warp_mma_step(float (&acc)[MT][NT][4], const __nv_bfloat16* A, int lda,
                                              const __nv_bfloat16* B, int ldb, int m0, int n0, int k0) {
  static_assert(NT % 2 == 0, "B tiles are loaded in pairs");
  unsigned a[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) load_a_stored<kA>(a[i], A, lda, m0 + 16 * i, k0);
#pragma unroll
  for (int j = 0; j < NT; j += 2) {
    unsigned b[4];
    load_b_pair_stored<kB>(b, B, ldb, k0, n0 + 8 * j);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if constexpr (kSchedulable) {
        mma_bf16_schedulable(acc[i][j], a[i], b[0], b[1]);
        mma_bf16_schedulable(acc[i][j + 1], a[i], b[2], b[3]);
      } else {
        mma_bf16(acc[i][j], a[i], b[0], b[1]);
        mma_bf16(acc[i][j + 1], a[i], b[2], b[3]);
      }
    }
  }
}

// Over kk in [k_begin, k_end).
template <int MT, int NT, Stored kA, Stored kB>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], const __nv_bfloat16* A, int lda, const __nv_bfloat16* B,
                                         int ldb, int m0, int n0, int k_begin, int k_end) {
  for (int k0 = k_begin; k0 < k_end; k0 += 16) warp_mma_step<MT, NT, kA, kB, false>(acc, A, lda, B, ldb, m0, n0, k0);
}

// warp_mma with the k loop unrolled at compile time: kSteps steps of 16 starting at k_begin, of which the
// first `steps` run (steps == kSteps folds the guards away), so the compiler can load the fragments of step
// s + 1 while the tensor cores work on step s.
template <int MT, int NT, Stored kA, Stored kB, int kSteps>
__device__ __forceinline__ void warp_mma_unrolled(float (&acc)[MT][NT][4], const __nv_bfloat16* A, int lda,
                                                  const __nv_bfloat16* B, int ldb, int m0, int n0, int k_begin,
                                                  int steps = kSteps) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
    if (s < steps) warp_mma_step<MT, NT, kA, kB, true>(acc, A, lda, B, ldb, m0, n0, k_begin + 16 * s);
}

// The first phase of a chunk, one warp's 16 x 16 tiles of up to three products in one k loop over
// kSteps steps of 16, so that each fragment leaves shared memory once instead of once per product:
//   qk += Q K^T   (A = Q rows m0, B = K rows n0; only when with_qk: tiles above the diagonal are skipped)
//   qs += Q S     (A = Q rows m0, the same fragments; B = S columns n0, S row-major [k][n])
//   ks += K S     (only when kWithKS: A = K rows m0; B = the same S fragments)
template <int kSteps, bool kWithKS>
__device__ __forceinline__ void warp_phase1_fused(float (&qk)[1][2][4], float (&qs)[1][2][4], float (&ks)[1][2][4],
                                                  const __nv_bfloat16* Q, const __nv_bfloat16* K, int ldk,
                                                  const __nv_bfloat16* S, int lds, int m0, int n0, bool with_qk) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int k0 = 16 * s;
    unsigned a_q[4], b_s[4];
    load_a(a_q, Q, ldk, m0, k0);
    load_b_pair_transposed(b_s, S, lds, k0, n0);
    if (with_qk) {
      unsigned b_k[4];
      load_b_pair(b_k, K, ldk, k0, n0);
      mma_bf16_schedulable(qk[0][0], a_q, b_k[0], b_k[1]);
      mma_bf16_schedulable(qk[0][1], a_q, b_k[2], b_k[3]);
    }
    mma_bf16_schedulable(qs[0][0], a_q, b_s[0], b_s[1]);
    mma_bf16_schedulable(qs[0][1], a_q, b_s[2], b_s[3]);
    if constexpr (kWithKS) {
      unsigned a_k[4];
      load_a(a_k, K, ldk, m0, k0);
      mma_bf16_schedulable(ks[0][0], a_k, b_s[0], b_s[1]);
      mma_bf16_schedulable(ks[0][1], a_k, b_s[2], b_s[3]);
    }
  }
}

// ---- software-pipelined k loops (linear v6-v7, delta v7-v9) ------------------------------------
// The loops above leave the order of loads and mma to ptxas, and ncu's source view of linear v5 shows what it
// chose: each k-step's ldmatrix issued right before the mma that needs it, so every step waits out the
// shared-memory latency (short-scoreboard stalls on the mma: ~20% of the chunk kernel's stall samples). The
// loops below load the fragments of step s + 1 into a second register set before the mma of step s issue.

// How a chunk kernel's first phase feeds its products (a template argument of the wide kernels).
enum class Loads {
  kPerProduct,      // one k loop per product (linear v4, delta v4 / v5)
  kFused,           // the products of phase 1 in one k loop, each shared fragment loaded once (linear v5, delta v6)
  kFusedPipelined,  // kFused, and every k loop loads step s + 1 while step s multiplies (linear v6-v7, delta v7-v9)
};

// One k-step's fragments of a warp's MT x NT tile of C = A B (stored as kA / kB say, see warp_mma_step).
template <int MT, int NT>
struct StepFragments {
  unsigned a[MT][4];
  unsigned b[NT / 2][4];
};

template <int MT, int NT, Stored kA, Stored kB>
__device__ __forceinline__ void load_step(StepFragments<MT, NT>& f, const __nv_bfloat16* A, int lda,
                                          const __nv_bfloat16* B, int ldb, int m0, int n0, int k0) {
  static_assert(NT % 2 == 0, "B tiles are loaded in pairs");
#pragma unroll
  for (int i = 0; i < MT; ++i) load_a_stored<kA>(f.a[i], A, lda, m0 + 16 * i, k0);
#pragma unroll
  for (int j = 0; j < NT; j += 2) load_b_pair_stored<kB>(f.b[j / 2], B, ldb, k0, n0 + 8 * j);
}

template <int MT, int NT>
__device__ __forceinline__ void mma_step(float (&acc)[MT][NT][4], const StepFragments<MT, NT>& f) {
#pragma unroll
  for (int j = 0; j < NT; j += 2)
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      mma_bf16_schedulable(acc[i][j], f.a[i], f.b[j / 2][0], f.b[j / 2][1]);
      mma_bf16_schedulable(acc[i][j + 1], f.a[i], f.b[j / 2][2], f.b[j / 2][3]);
    }
}

// warp_mma_unrolled with step s + 1's fragments loaded before step s's mma; 1 <= steps <= kSteps.
template <int MT, int NT, Stored kA, Stored kB, int kSteps>
__device__ __forceinline__ void warp_mma_pipelined(float (&acc)[MT][NT][4], const __nv_bfloat16* A, int lda,
                                                   const __nv_bfloat16* B, int ldb, int m0, int n0, int k_begin,
                                                   int steps = kSteps) {
  StepFragments<MT, NT> f[2];
  load_step<MT, NT, kA, kB>(f[0], A, lda, B, ldb, m0, n0, k_begin);
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
    if (s < steps) {
      if (s + 1 < steps) load_step<MT, NT, kA, kB>(f[(s + 1) & 1], A, lda, B, ldb, m0, n0, k_begin + 16 * (s + 1));
      mma_step(acc, f[s & 1]);
    }
}

// The software pipeline of the k loops below: kSteps steps of 16, step s + 1's fragments loaded into the other of
// two register sets (load(Step&, k0)) before step s's mma issue (multiply(const Step&)).
template <int kSteps, class Step, class Load, class Multiply>
__device__ __forceinline__ void double_buffered_k_steps(const Load& load, const Multiply& multiply) {
  Step f[2];
  load(f[0], 0);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (s + 1 < kSteps) load(f[(s + 1) & 1], 16 * (s + 1));
    multiply(f[s & 1]);
  }
}

// Two products that share their B operand, C1 += A1 B and C2 += A2 B (A1, A2 row-major with one stride), in one
// k loop of kSteps steps: each B fragment leaves shared memory once, the two accumulators' mma alternate so that
// neither waits on its own previous step, and step s + 1's fragments are loaded before step s's mma. Each
// accumulator sums its k-steps in warp_mma's order, so both equal two warp_mma calls bit for bit.
template <int NT, Stored kB, int kSteps>
__device__ __forceinline__ void warp_mma_shared_b(float (&acc1)[1][NT][4], float (&acc2)[1][NT][4],
                                                  const __nv_bfloat16* A1, const __nv_bfloat16* A2, int lda,
                                                  const __nv_bfloat16* B, int ldb, int m0, int n0) {
  struct Step {
    StepFragments<1, NT> first;  // A1's fragment and B's
    unsigned a2[4];
  };
  const auto load = [&](Step& f, int k0) {
    load_step<1, NT, Stored::kRowMajor, kB>(f.first, A1, lda, B, ldb, m0, n0, k0);
    load_a(f.a2, A2, lda, m0, k0);
  };
  const auto multiply = [&](const Step& x) {
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
      mma_bf16_schedulable(acc1[0][j], x.first.a[0], x.first.b[j / 2][0], x.first.b[j / 2][1]);
      mma_bf16_schedulable(acc2[0][j], x.a2, x.first.b[j / 2][0], x.first.b[j / 2][1]);
      mma_bf16_schedulable(acc1[0][j + 1], x.first.a[0], x.first.b[j / 2][2], x.first.b[j / 2][3]);
      mma_bf16_schedulable(acc2[0][j + 1], x.a2, x.first.b[j / 2][2], x.first.b[j / 2][3]);
    }
  };
  double_buffered_k_steps<kSteps, Step>(load, multiply);
}

// The k loop a wide kernel built with `kLoads` uses for a product outside the fused first phase.
template <Loads kLoads, int MT, int NT, Stored kA, Stored kB, int kSteps>
__device__ __forceinline__ void warp_mma_k_loop(float (&acc)[MT][NT][4], const __nv_bfloat16* A, int lda,
                                                const __nv_bfloat16* B, int ldb, int m0, int n0, int k_begin,
                                                int steps = kSteps) {
  if constexpr (kLoads == Loads::kFusedPipelined)
    warp_mma_pipelined<MT, NT, kA, kB, kSteps>(acc, A, lda, B, ldb, m0, n0, k_begin, steps);
  else
    warp_mma_unrolled<MT, NT, kA, kB, kSteps>(acc, A, lda, B, ldb, m0, n0, k_begin, steps);
}

// warp_phase1_fused with step s + 1's fragments loaded before step s's mma, and the diagonal test taken once
// outside the loop (kWithQK) instead of in every step, where it predicated the loads.
template <int kSteps, bool kWithQK, bool kWithKS>
__device__ __forceinline__ void warp_phase1_pipelined_loop(float (&qk)[1][2][4], float (&qs)[1][2][4],
                                                           float (&ks)[1][2][4], const __nv_bfloat16* Q,
                                                           const __nv_bfloat16* K, int ldk, const __nv_bfloat16* S,
                                                           int lds, int m0, int n0) {
  struct Step {
    unsigned a_q[4], b_s[4], b_k[4], a_k[4];
  };
  const auto load = [&](Step& f, int k0) {
    load_a(f.a_q, Q, ldk, m0, k0);
    load_b_pair_transposed(f.b_s, S, lds, k0, n0);
    if constexpr (kWithQK) load_b_pair(f.b_k, K, ldk, k0, n0);
    if constexpr (kWithKS) load_a(f.a_k, K, ldk, m0, k0);
  };
  const auto multiply = [&](const Step& x) {
    if constexpr (kWithQK) {
      mma_bf16_schedulable(qk[0][0], x.a_q, x.b_k[0], x.b_k[1]);
      mma_bf16_schedulable(qk[0][1], x.a_q, x.b_k[2], x.b_k[3]);
    }
    mma_bf16_schedulable(qs[0][0], x.a_q, x.b_s[0], x.b_s[1]);
    mma_bf16_schedulable(qs[0][1], x.a_q, x.b_s[2], x.b_s[3]);
    if constexpr (kWithKS) {
      mma_bf16_schedulable(ks[0][0], x.a_k, x.b_s[0], x.b_s[1]);
      mma_bf16_schedulable(ks[0][1], x.a_k, x.b_s[2], x.b_s[3]);
    }
  };
  double_buffered_k_steps<kSteps, Step>(load, multiply);
}

template <int kSteps, bool kWithKS>
__device__ __forceinline__ void warp_phase1_pipelined(float (&qk)[1][2][4], float (&qs)[1][2][4], float (&ks)[1][2][4],
                                                      const __nv_bfloat16* Q, const __nv_bfloat16* K, int ldk,
                                                      const __nv_bfloat16* S, int lds, int m0, int n0, bool with_qk) {
  if (with_qk) warp_phase1_pipelined_loop<kSteps, true, kWithKS>(qk, qs, ks, Q, K, ldk, S, lds, m0, n0);
  else warp_phase1_pipelined_loop<kSteps, false, kWithKS>(qk, qs, ks, Q, K, ldk, S, lds, m0, n0);
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

// Row and column, inside the warp's tile, of accumulator element e of tile (i, j).
__device__ __forceinline__ int acc_row(int i, int e) { return 16 * i + ((threadIdx.x & 31) >> 2) + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int acc_col(int j, int e) { return 8 * j + 2 * (threadIdx.x & 3) + (e & 1); }

__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* dst, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
}

// ---- fp32 products on tensor cores: mma.sync m16n8k8 in tf32, three times (delta v9's and v10's WY solve) --
// tf32 keeps 10 of fp32's 23 mantissa bits (the mma reads an operand's top 19 bits). Split each operand into
// x = hi + lo: hi = x with its low 13 bits cleared (a tf32 value), lo = x - hi (exact in fp32; the mma keeps
// lo's top 10 mantissa bits). Then a b ~= a_hi b_hi + a_hi b_lo + a_lo b_hi ("3xTF32"), off by a_lo b_lo and
// the cut of the lo parts: a few 1e-6 of |a| |b| at most, where one tf32 product is off by ~1e-3.
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32), with g = lane / 4, t = lane % 4:
//   A (16 x 8, row-major):  a0 = A[g][t]  a1 = A[g+8][t]  a2 = A[g][t+4]  a3 = A[g+8][t+4]
//   B (8 x 8, "col"):       b0 = B[t][g]  b1 = B[t+4][g]
//   C (16 x 8, fp32):       as for m16n8k16 above (c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][2t..2t+1])
// The split takes two instructions; cvt.rna.tf32.f32 (rounding instead of cutting) took about ten on sm_90.
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// d += a b for one 16 x 8 x 8 tile, tf32 in, fp32 accumulate (sm_80+).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One warp's 16 x 16 block: acc += X[0..16)[k_begin..k_end) Y[k_begin..k_end)[0..16) for fp32 row-major X
// (stride ldx) and Y (stride ldy) in shared memory, k_begin and k_end multiples of 8, in 3xTF32. acc[j] is the
// C fragment of columns 8 j .. 8 j + 7. Scalar loads, each a warp-wide 128-byte read (X's rows g fall into
// distinct banks when ldx % 32 == 4; Y's may pair up, two ways at most). (Accumulating the small terms apart
// from the large one, two chains per k-step instead of one three long, measured 0.4% faster on the H200 with
// a 4-byte spill at the prepare kernel's 40-register cap: left out.)
__device__ __forceinline__ void warp_block_product_3xtf32(float (&acc)[2][4], const float* X, int ldx, const float* Y,
                                                          int ldy, int k_begin, int k_end) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int k0 = k_begin; k0 < k_end; k0 += 8) {
    const float a[4] = {X[g * ldx + k0 + t], X[(g + 8) * ldx + k0 + t], X[g * ldx + k0 + t + 4],
                        X[(g + 8) * ldx + k0 + t + 4]};
    unsigned a_hi[4], a_lo[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) split_tf32(a[e], a_hi[e], a_lo[e]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      unsigned b_hi[2], b_lo[2];
      split_tf32(Y[(k0 + t) * ldy + 8 * j + g], b_hi[0], b_lo[0]);
      split_tf32(Y[(k0 + t + 4) * ldy + 8 * j + g], b_hi[1], b_lo[1]);
      mma_tf32(acc[j], a_lo, b_hi[0], b_hi[1]);  // the small terms first, then the large one
      mma_tf32(acc[j], a_hi, b_lo[0], b_lo[1]);
      mma_tf32(acc[j], a_hi, b_hi[0], b_hi[1]);
    }
  }
}

}  // namespace minilin
