// Hoisted shared-memory addressing for the tensor-core kernels (linear v6, delta v7).
//
// mma.cuh's loaders take a generic pointer, a row stride and a tile origin, and work out each lane's
// ldmatrix row address on every call: integer multiplies, shifts and a generic-to-shared conversion in
// front of every fragment. ncu found the integer pipe the busiest one in the v4 kernels, and their PTX
// holds about 700 integer instructions for 100 ldmatrix and mma. Here each lane's part of the address is
// computed once per kernel (the `*_lane_bytes` offsets below, for a compile-time row stride), the warp's
// tile origin is added once per chunk, and every fragment of an unrolled loop is that base plus a
// compile-time offset, so its address costs at most one add.
//
// The three lane patterns are mma.cuh's (same fragments, same registers):
//   A row-major (load_a):                          row lane % 16,                     column 8 (lane / 16)
//   A transposed / B pair of Y[n][k] (load_a_transposed, load_b_pair):
//                                                  row lane % 8 + 8 (lane / 16),      column 8 ((lane / 8) % 2)
//   B pair of row-major Z[k][n] (load_b_pair_transposed):
//                                                  row lane % 8 + 8 ((lane / 8) % 2), column 8 (lane / 16)
#pragma once

#include "mma.cuh"

namespace minilin {

template <int kLd>
__device__ __forceinline__ uint32_t a_lane_bytes() {
  const int lane = threadIdx.x & 31;
  return static_cast<uint32_t>(((lane & 15) * kLd + (lane >> 4) * 8) * 2);
}

template <int kLd>
__device__ __forceinline__ uint32_t yk_lane_bytes() {  // A transposed, or B pair of Y[n][k]
  const int lane = threadIdx.x & 31;
  return static_cast<uint32_t>((((lane & 7) + ((lane >> 4) << 3)) * kLd + ((lane >> 3) & 1) * 8) * 2);
}

template <int kLd>
__device__ __forceinline__ uint32_t zk_lane_bytes() {  // B pair of row-major Z[k][n]
  const int lane = threadIdx.x & 31;
  return static_cast<uint32_t>((((lane & 7) + (((lane >> 3) & 1) << 3)) * kLd + (lane >> 4) * 8) * 2);
}

// ldmatrix.x4 from a shared-memory (32-bit) address, plain or transposed.
template <bool kTrans>
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], uint32_t address) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// acc[0][j] (j < NT, 16 x 8 tiles side by side) += A B over `steps` (<= kSteps) k-steps of 16.
// a: this lane's address of the A fragment at k-step 0, the next step kAStep bytes further;
// b: this lane's address of the B pair for tiles 0 and 1 at k-step 0, pair j / 2 at kBPair * (j / 2) bytes
// further, the next step kBStep bytes further. kATrans / kBTrans: ldmatrix .trans for that operand.
template <int NT, int kSteps, bool kATrans, bool kBTrans, int kAStep, int kBStep, int kBPair>
__device__ __forceinline__ void warp_mma_at(float (&acc)[1][NT][4], uint32_t a, uint32_t b, int steps = kSteps) {
  static_assert(NT % 2 == 0, "B tiles are loaded in pairs");
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (s < steps) {
      unsigned af[4];
      ldsm_x4<kATrans>(af, a + s * kAStep);
#pragma unroll
      for (int j = 0; j < NT; j += 2) {
        unsigned bf[4];
        ldsm_x4<kBTrans>(bf, b + s * kBStep + (j / 2) * kBPair);
        mma_bf16_schedulable(acc[0][j], af, bf[0], bf[1]);
        mma_bf16_schedulable(acc[0][j + 1], af, bf[2], bf[3]);
      }
    }
  }
}

// warp_phase1_fused (mma.cuh) on hoisted addresses: qk += Q K^T (when with_qk), qs += Q S, ks += K S (kWithKS).
// q_a, k_a: A fragments of Q and K rows m0 (row-major, step 32 bytes); k_b: B pair of K rows n0 (Y pattern,
// step 32 bytes); s_b: B pair of S columns n0 (Z pattern, .trans, step kSStep bytes = 16 rows).
template <int kSteps, bool kWithKS, int kSStep>
__device__ __forceinline__ void warp_phase1_at(float (&qk)[1][2][4], float (&qs)[1][2][4], float (&ks)[1][2][4],
                                               uint32_t q_a, uint32_t k_a, uint32_t k_b, uint32_t s_b, bool with_qk) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    unsigned a_q[4], b_s[4];
    ldsm_x4<false>(a_q, q_a + 32 * s);
    ldsm_x4<true>(b_s, s_b + kSStep * s);
    if (with_qk) {
      unsigned b_k[4];
      ldsm_x4<false>(b_k, k_b + 32 * s);
      mma_bf16_schedulable(qk[0][0], a_q, b_k[0], b_k[1]);
      mma_bf16_schedulable(qk[0][1], a_q, b_k[2], b_k[3]);
    }
    mma_bf16_schedulable(qs[0][0], a_q, b_s[0], b_s[1]);
    mma_bf16_schedulable(qs[0][1], a_q, b_s[2], b_s[3]);
    if constexpr (kWithKS) {
      unsigned a_k[4];
      ldsm_x4<false>(a_k, k_a + 32 * s);
      mma_bf16_schedulable(ks[0][0], a_k, b_s[0], b_s[1]);
      mma_bf16_schedulable(ks[0][1], a_k, b_s[2], b_s[3]);
    }
  }
}

// A copy plan for `kRows` rows of `kRowElems` bf16 (16-byte pieces) spread over kThreads threads: each
// thread's pieces, their shared-memory offsets and their offsets in global memory (elements, from the
// chunk's first row, rows g_stride apart) are worked out once; each chunk then costs one cp.async per piece.
template <int kRows, int kRowElems, int kThreads>
struct CopyPlan {
  static constexpr int kPiecesPerRow = kRowElems / 8;
  static constexpr int kPieces = kRows * kPiecesPerRow;
  static constexpr int kPerThread = (kPieces + kThreads - 1) / kThreads;
  int row[kPerThread];
  uint32_t smem_bytes[kPerThread];
  int global_elems[kPerThread];

  __device__ CopyPlan(int smem_ld, int g_stride) {
#pragma unroll
    for (int p = 0; p < kPerThread; ++p) {
      const int i = threadIdx.x + p * kThreads, r = i / kPiecesPerRow, c = (i % kPiecesPerRow) * 8;
      row[p] = i < kPieces ? r : kRows;  // a thread without a p-th piece copies nothing
      smem_bytes[p] = static_cast<uint32_t>((r * smem_ld + c) * 2);
      global_elems[p] = r * g_stride + c;
    }
  }

  // Rows >= valid_rows are zero-filled (cp_async_16's contract); a thread's missing pieces are skipped.
  __device__ __forceinline__ void issue(uint32_t smem_base, const __nv_bfloat16* chunk, int valid_rows) const {
#pragma unroll
    for (int p = 0; p < kPerThread; ++p) {
      if (row[p] >= kRows) continue;
      const bool valid = row[p] < valid_rows;
      const uint32_t dst = smem_base + smem_bytes[p];
      const __nv_bfloat16* src = valid ? chunk + global_elems[p] : chunk;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
    }
  }
};

}  // namespace minilin
