// Hopper warpgroup tensor-core building blocks (wgmma, sm_90a only): one warpgroup (4 consecutive warps,
// 128 threads) computes a 64 x N tile D (+)= A B with A 64 x 16 and B 16 x N, bf16 in, fp32 accumulate.
// B (and optionally A) is read by the tensor cores straight from shared memory through a 64-bit matrix
// descriptor, without passing through registers; the instruction is asynchronous (issue, commit, wait).
//
// Shared operands use the 128-byte-swizzled layout (PTX ISA, "Shared Memory Matrix Layout"; CUTLASS's
// Layout_K_SW128 / Layout_MN_SW128): a bf16 matrix X with `rows` x `cols` (cols a multiple of 64) is cut into
// column atoms of 64 columns; an atom holds every row, 128 bytes per row, and row r's eight 16-byte chunks
// are stored in the order chunk ^ (r % 8):
//     X[r][c] at element (c / 64) * rows * 64 + r * 64 + (((c / 8) % 8) ^ (r % 8)) * 8 + c % 8    (sw128_index)
// Atoms start on 1024-byte boundaries, because the tensor cores apply the same XOR to address bits 4-6 from
// bits 7-9. The same storage serves as a "K-major" operand (the reduction runs along c: X is A, or B^T) and,
// with the transpose flag, as an "MN-major" operand (the reduction runs along r: X is B itself). ldmatrix
// reads it too; the swizzle spreads the eight rows one 8 x 8 matrix read takes over all banks.
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

__host__ __device__ constexpr int sw128_index(int r, int c, int rows) {
  return (c >> 6) * rows * 64 + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}

// The descriptor of a swizzled operand starting at `start`. Bits: 0-13 start address >> 4, 16-29 leading
// byte offset >> 4, 32-45 stride byte offset >> 4, 62-63 swizzle mode (1: 128 bytes). In the swizzled
// layouts the stride offset is the distance between 8-row groups (1024 bytes here) and the leading offset
// the distance between 64-column atoms along M/N (MN-major operands wider than one atom; K-major operands
// never cross an atom within one instruction and ignore it). csrc/dev/wgmma_probe.cu checks these readings.
__device__ __forceinline__ uint64_t sw128_descriptor(const void* start, unsigned leading, unsigned stride) {
  return static_cast<uint64_t>((smem_address(start) & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((leading & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((stride & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// K-major operand: the 16-wide reduction slice at k0 of X (rows x cols, reduction along cols). Inside an
// atom the slice starts 32 bytes further per step; the hardware swizzles the resulting addresses.
__device__ __forceinline__ uint64_t k_major_slice(const __nv_bfloat16* X, int rows, int k0) {
  return sw128_descriptor(X + (k0 >> 6) * rows * 64 + (k0 & 63), 16, 1024);
}

// MN-major operand (use with the transpose flag): the 16-deep reduction slice at k0 of X (rows x cols,
// reduction along rows), starting at column n0 (a multiple of 8).
__device__ __forceinline__ uint64_t mn_major_slice(const __nv_bfloat16* X, int rows, int k0, int n0 = 0) {
  return sw128_descriptor(X + (n0 >> 6) * rows * 64 + k0 * 64 + (n0 & 63), rows * 128, 1024);
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

// ---- A fragments from swizzled storage (for wgmma_rs and mma.sync) ------------------------------------
// A(m, kk) = X[m][kk]: the 16 x 16 tile at (m0, k0) of X (`rows` rows) stored by sw128_index.
__device__ __forceinline__ void sw128_load_a(unsigned (&a)[4], const __nv_bfloat16* X, int rows, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4(a, X + sw128_index(m0 + (lane & 15), k0 + (lane >> 4) * 8, rows));
}

// A(m, kk) = X[kk][m]: the 16 x 16 tile at (m0, k0) of the transpose of X (`rows` rows) stored by sw128_index.
__device__ __forceinline__ void sw128_load_a_transposed(unsigned (&a)[4], const __nv_bfloat16* X, int rows, int m0,
                                                        int k0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4_trans(a, X + sw128_index(k0 + (lane & 7) + ((lane >> 4) << 3), m0 + ((lane >> 3) & 1) * 8, rows));
}

// Copy `rows` rows of `cols` bf16 (cols a multiple of 64) from global rows `gmem + r * g_stride` into
// swizzled storage, 16 bytes per cp.async, spread over the block; rows >= valid_rows are zero-filled.
// Eight consecutive threads copy one 128-byte row piece: whole sectors from global memory, all banks in
// shared memory.
__device__ __forceinline__ void cp_async_rows_sw128(__nv_bfloat16* smem, const __nv_bfloat16* gmem,
                                                    long long g_stride, int rows, int cols, int valid_rows) {
  const int chunks = cols >> 3;
  for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
    const int r = i / chunks, c = (i % chunks) * 8;
    const bool valid = r < valid_rows;
    cp_async_16(smem + sw128_index(r, c, rows), valid ? gmem + r * g_stride + c : gmem, valid);
  }
}

// The first 1024-byte boundary at or after p in shared memory (the swizzled atoms' alignment).
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  return p + ((1024u - (smem_address(p) & 1023u)) & 1023u);
}

}  // namespace minilin
