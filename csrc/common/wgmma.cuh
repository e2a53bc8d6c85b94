// Hopper warpgroup tensor-core building blocks (wgmma, sm_90a only): one warpgroup (4 consecutive warps,
// 128 threads) computes a 64 x N tile D (+)= A B with A 64 x 16 and B 16 x N, bf16 in, fp32 accumulate.
// B (and optionally A) is read by the tensor cores straight from shared memory through a 64-bit matrix
// descriptor, without passing through registers; the instruction is asynchronous (issue, commit, wait).
//
// Shared operands use the "core matrix" layout without swizzling (PTX ISA, "Shared Memory Matrix Layout"):
// a matrix X with `rows` x `cols` bf16 is cut into 8 x 8 core matrices of 128 contiguous bytes (8 rows of
// 16 bytes), ordered row-block by row-block:
//     X[r][c] at element ((r / 8) * (cols / 8) + c / 8) * 64 + (r % 8) * 8 + c % 8        (cm_index)
// The same storage serves as a "K-major" operand (the reduction runs along c: X is A, or B^T) and, with the
// transpose flag, as an "MN-major" operand (the reduction runs along r: X is B itself). ldmatrix reads it
// too (each 8 x 8 matrix it reads is one core matrix: 128 contiguous bytes, no bank conflicts).
//
// Accumulator layout (64 x N fp32 over the warpgroup, N / 2 registers per thread): warp w of the group holds
// rows 16 w .. 16 w + 15 exactly as mma.sync's C fragment, one 16 x 8 tile after another:
//     d[4 j + 0..1] = D[16 w + g][8 j + 2 t .. + 1],  d[4 j + 2..3] = D[16 w + g + 8][8 j + 2 t .. + 1]
// with g = lane / 4, t = lane % 4. A register A operand is mma.sync's A fragment of the warp's 16 rows.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "device.cuh"
#include "mma.cuh"

namespace minilin {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MINILIN_WGMMA 1
#else
#define MINILIN_WGMMA 0
#endif

__host__ __device__ constexpr int cm_index(int r, int c, int cols) {
  return (((r >> 3) * (cols >> 3) + (c >> 3)) << 6) + ((r & 7) << 3) + (c & 7);
}

// The descriptor of a core-matrix operand starting at `start`: `k_stride` bytes between core matrices
// adjacent along the reduction, `mn_stride` bytes between core matrices adjacent along M (or N).
// Bits: 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 62-63 swizzle mode (0: none). Without swizzling the leading offset is the reduction-direction stride and
// the stride offset the M/N-direction one, for K-major and MN-major operands alike (csrc/dev/wgmma_probe.cu
// checks both readings; the other one reads the wrong elements, or past the tile).
__device__ __forceinline__ uint64_t cm_descriptor(const void* start, unsigned k_stride, unsigned mn_stride) {
  return static_cast<uint64_t>((smem_address(start) & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((k_stride & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((mn_stride & 0x3FFFF) >> 4) << 32);
}

// K-major operand: the 16-wide reduction slice at k0 of X (rows x cols, reduction along cols).
__device__ __forceinline__ uint64_t k_major_slice(const __nv_bfloat16* X, int cols, int k0) {
  return cm_descriptor(X + (k0 >> 3) * 64, 128, cols * 16);
}

// MN-major operand (use with the transpose flag): the 16-deep reduction slice at k0 of X (rows x cols,
// reduction along rows), starting at column n0.
__device__ __forceinline__ uint64_t mn_major_slice(const __nv_bfloat16* X, int cols, int k0, int n0 = 0) {
  return cm_descriptor(X + (k0 >> 3) * (cols >> 3) * 64 + (n0 >> 3) * 64, cols * 16, 128);
}

__device__ __forceinline__ void wgmma_fence() {
#if MINILIN_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if MINILIN_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if MINILIN_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Shared memory written by ordinary stores (or cp.async) is read by wgmma through the async proxy: each
// writer fences before the barrier that publishes the writes.
__device__ __forceinline__ void fence_async_shared() {
#if MINILIN_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

#define MINILIN_ACC16(d)                                                                                          \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),   \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define MINILIN_ACC32(d)                                                                                          \
  MINILIN_ACC16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),  \
      "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),     \
      "+f"(d[31])
#define MINILIN_REGS16                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define MINILIN_REGS32                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "  \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"

// D (+)= A B for N = 32 or 64, A and B from shared memory (descriptors). accumulate = false: D = A B.
// kTransB: B is MN-major (mn_major_slice); otherwise K-major (k_major_slice of B^T).
template <int N, bool kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(N == 32 || N == 64, "N must be 32 or 64");
#if MINILIN_WGMMA
  if constexpr (N == 64) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MINILIN_REGS32
                 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
                 : MINILIN_ACC32(d)
                 : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(static_cast<int>(kTransB)));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " MINILIN_REGS16
                 ", %16, %17, p, 1, 1, 0, %19;\n}\n"
                 : MINILIN_ACC16(d)
                 : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(static_cast<int>(kTransB)));
  }
#endif
}

// D (+)= A B with A from registers (mma.sync's A fragment of this warp's 16 rows), B from shared memory.
template <int N, bool kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], uint64_t b, bool accumulate) {
  static_assert(N == 32 || N == 64, "N must be 32 or 64");
#if MINILIN_WGMMA
  if constexpr (N == 64) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MINILIN_REGS32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : MINILIN_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
                   "n"(static_cast<int>(kTransB)));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " MINILIN_REGS16
                 ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
                 : MINILIN_ACC16(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
                   "n"(static_cast<int>(kTransB)));
  }
#endif
}

// ---- A fragments from core-matrix storage (for wgmma_rs and mma.sync) ---------------------------------
// A(m, kk) = X[m][kk]: the 16 x 16 tile at (m0, k0) of X (cols wide) stored by cm_index.
__device__ __forceinline__ void cm_load_a(unsigned (&a)[4], const __nv_bfloat16* X, int cols, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4(a, X + cm_index(m0 + (lane & 15), k0 + (lane >> 4) * 8, cols));
}

// A(m, kk) = X[kk][m]: the 16 x 16 tile at (m0, k0) of the transpose of X (cols wide) stored by cm_index.
__device__ __forceinline__ void cm_load_a_transposed(unsigned (&a)[4], const __nv_bfloat16* X, int cols, int m0,
                                                     int k0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4_trans(a, X + cm_index(k0 + (lane & 7) + ((lane >> 4) << 3), m0 + ((lane >> 3) & 1) * 8, cols));
}

// Copy `rows` rows (a multiple of 8) of `cols` bf16 from global rows `gmem + r * g_stride` into core-matrix
// storage, 16 bytes per cp.async, spread over the block; rows >= valid_rows are zero-filled. Eight
// consecutive threads fill one core matrix, so each warp writes four whole 128-byte core matrices.
__device__ __forceinline__ void cp_async_rows_cm(__nv_bfloat16* smem, const __nv_bfloat16* gmem, long long g_stride,
                                                 int rows, int cols, int valid_rows) {
  const int col_blocks = cols >> 3;
  for (int i = threadIdx.x; i < rows * col_blocks; i += blockDim.x) {
    const int r = ((i >> 3) / col_blocks) * 8 + (i & 7), c = ((i >> 3) % col_blocks) * 8;
    const bool valid = r < valid_rows;
    cp_async_16(smem + cm_index(r, c, cols), valid ? gmem + r * g_stride + c : gmem, valid);
  }
}

}  // namespace minilin
