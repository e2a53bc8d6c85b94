// Hopper warpgroup tensor-core building blocks (wgmma, sm_90a only): one warpgroup (4 consecutive warps,
// 128 threads, the first warp's index a multiple of 4) computes a 64 x N tile D (+)= A B with A 64 x 16 and
// B 16 x N, bf16 in, fp32 accumulate. B (and optionally A) is read by the tensor cores straight from shared
// memory through a 64-bit matrix descriptor, not through registers; the instruction is asynchronous (fence,
// issue, commit, wait). Used by delta v10. Every way a chunk kernel uses it (A and B from shared memory or A from
// registers, B K-major or MN-major, N = 32 and 64, starts in the middle of an atom) has been checked against a CPU
// product on an H200; csrc/NOTES.md (lessons: "wgmma descriptors") records what those checks established.
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
// rows 16 w .. 16 w + 15 exactly as mma.sync's C fragment, one 16 x 8 tile after another, so the accumulators
// here are mma.cuh's float[1][N / 8][4] tiles with m0 = 16 w (acc_row, acc_col, chunk_tiles.cuh's helpers):
//     acc[0][j][0..1] = D[16 w + g][8 j + 2 t .. + 1],  acc[0][j][2..3] = D[16 w + g + 8][8 j + 2 t .. + 1]
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

// A swizzled operand's 64-bit matrix descriptor: bits 0-13 the start address >> 4, 16-29 the leading byte
// offset >> 4, 32-45 the stride byte offset >> 4, 62-63 the swizzle mode (1: 128 bytes). In the swizzled layouts
// the stride offset is the distance between 8-row groups (1024 bytes here) and the leading offset the distance
// between 64-column atoms along M/N (MN-major operands wider than one atom; K-major operands never cross an atom
// within one instruction and ignore it). sw128_layout_bits holds every field but the address; a descriptor is
// those bits or'ed with an address, and moving along a tile is adding the offsets below (shared addresses are
// below 2^18, so the sum stays inside bits 0-13). Built once per tile from warp-uniform values, a descriptor
// and its steps cost a 64-bit add per wgmma; built from pointers at each step, they cost ~14 instructions.
__host__ __device__ constexpr uint64_t sw128_layout_bits(unsigned leading_bytes) {
  return (static_cast<uint64_t>((leading_bytes & 0x3FFFF) >> 4) << 16) | (static_cast<uint64_t>(1024 >> 4) << 32) |
         (1ull << 62);
}
constexpr uint64_t kKMajorBits = sw128_layout_bits(16);  // K-major: the leading offset is unused
__host__ __device__ constexpr uint64_t mn_major_bits(int rows) { return sw128_layout_bits(rows * 128); }

__device__ __forceinline__ uint64_t sw128_descriptor(const void* start, uint64_t layout_bits) {
  return layout_bits | (smem_address(start) >> 4);
}

// K-major operand (X is A, or B^T; the reduction runs along X's columns): the 16-wide slice at reduction column
// k0 of X with `rows` rows (it crosses into the next 64-column atom at k0 = 64; inside an atom a step is 32 bytes,
// and the hardware swizzles the final address), and the start at row r0 (B^T's rows n0.., a multiple of 8).
__host__ __device__ constexpr uint64_t k_major_offset(int k0, int rows) {
  return static_cast<uint64_t>(((k0 >> 6) * rows * 128 + (k0 & 63) * 2) >> 4);
}
__host__ __device__ constexpr uint64_t row_offset(int r0) { return static_cast<uint64_t>(r0 * 128 >> 4); }

// MN-major operand (with the transpose flag; X is B itself, the reduction runs along X's rows): the 16-deep
// slice at reduction row k0 from column n0 (a multiple of 8) of X with `rows` rows.
__host__ __device__ constexpr uint64_t mn_major_offset(int k0, int n0, int rows) {
  return static_cast<uint64_t>(((n0 >> 6) * rows * 128 + k0 * 128 + (n0 & 63) * 2) >> 4);
}

__device__ __forceinline__ void wgmma_fence() {
#if MINILIN_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if MINILIN_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if MINILIN_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}
// Shared memory written by ordinary stores (or cp.async) is read by wgmma through the async proxy: each
// thread that wrote, or that observed another's writes through a barrier, fences before the wgmma that
// reads them (or before the barrier that publishes them).
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// The accumulator tile as the flat register list the instruction takes (see the header: same registers).
template <int NT>
__device__ __forceinline__ auto flat(float (&acc)[1][NT][4]) -> float (&)[NT * 4] {
  return reinterpret_cast<float(&)[NT * 4]>(acc);
}

#define MINILIN_ACC16(d)                                                                                          \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),   \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define MINILIN_ACC32(d)                                                                                          \
  MINILIN_ACC16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),  \
      "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),     \
      "+f"(d[31])
#define MINILIN_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define MINILIN_REGS32                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "  \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31}"

// D (+)= A B for N = 32 or 64 (the shapes delta v10 uses; N = 16 slices of every product were slower than
// mma.sync: csrc/NOTES.md), A and B from shared memory (descriptors). accumulate = false: D = A B.
// kTransB: B is MN-major (its descriptor from mn_major_bits); otherwise K-major (B^T's, from kKMajorBits).
template <bool kTransB, int NT>
__device__ __forceinline__ void wgmma_ss(float (&acc)[1][NT][4], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(NT == 4 || NT == 8, "N must be 32 or 64");
#if MINILIN_WGMMA
  float(&d)[NT * 4] = flat(acc);
  const int scale_d = accumulate;
  if constexpr (NT == 8) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MINILIN_REGS32 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
                 : MINILIN_ACC32(d)
                 : "l"(a), "l"(b), "r"(scale_d), "n"(static_cast<int>(kTransB)));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " MINILIN_REGS16 ", %16, %17, p, 1, 1, 0, %19;\n}\n"
                 : MINILIN_ACC16(d)
                 : "l"(a), "l"(b), "r"(scale_d), "n"(static_cast<int>(kTransB)));
  }
#else
  __trap();  // compiled without sm_90a features: no wgmma (the kernels that use it check MINILIN_WGMMA first)
#endif
}

// D (+)= A B with A from registers (mma.sync's A fragment of this warp's 16 rows), B from shared memory.
template <bool kTransB, int NT>
__device__ __forceinline__ void wgmma_rs(float (&acc)[1][NT][4], const unsigned (&a)[4], uint64_t b, bool accumulate) {
  static_assert(NT == 4 || NT == 8, "N must be 32 or 64");
#if MINILIN_WGMMA
  float(&d)[NT * 4] = flat(acc);
  const int scale_d = accumulate;
  if constexpr (NT == 8) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MINILIN_REGS32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : MINILIN_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(static_cast<int>(kTransB)));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " MINILIN_REGS16
                 ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
                 : MINILIN_ACC16(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d), "n"(static_cast<int>(kTransB)));
  }
#else
  __trap();  // compiled without sm_90a features: no wgmma (the kernels that use it check MINILIN_WGMMA first)
#endif
}

// Keeps the compiler from reading an accumulator before the wgmma_wait that completes it: the registers
// count as rewritten here, after the wait (CUTLASS's warpgroup_fence_operand).
template <int NT>
__device__ __forceinline__ void fence_operand(float (&acc)[1][NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(acc[0][j][e])::"memory");
}

// acc (+)= the sum over kSteps k-steps s of A_s B_s, A and B from shared memory through the descriptors a(s) and
// b(s) (callables: s is a compile-time constant once the loop unrolls), then waited for, so the accumulator can be
// read on return. accumulate = false: acc = the sum.
template <bool kTransB, int kSteps, int NT, class ADescriptors, class BDescriptors>
__device__ __forceinline__ void wgmma_ss_product(float (&acc)[1][NT][4], ADescriptors a, BDescriptors b,
                                                 bool accumulate) {
  fence_operand(acc);  // the accumulator's last writes by other instructions stay before the wgmma.fence
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < kSteps; ++s) wgmma_ss<kTransB>(acc, a(s), b(s), accumulate || s > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(acc);
}

#undef MINILIN_ACC16
#undef MINILIN_ACC32
#undef MINILIN_REGS16
#undef MINILIN_REGS32

// A(m, kk) = X[kk][m]: mma.sync's A fragment of the 16 x 16 tile at (m0, k0) of the transpose of X (`rows`
// rows) stored by sw128_index.
__device__ __forceinline__ void sw128_load_a_transposed(unsigned (&a)[4], const __nv_bfloat16* X, int rows, int m0,
                                                        int k0) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4_trans(a, X + sw128_index(k0 + (lane & 7) + ((lane >> 4) << 3), m0 + ((lane >> 3) & 1) * 8, rows));
}

// Two neighbouring fp32 values as bf16 at (r, c), (r, c + 1) of swizzled storage (c even).
__device__ __forceinline__ void store_bf16x2_sw128(__nv_bfloat16* X, int rows, int r, int c, float x, float y) {
  store_bf16x2(X + sw128_index(r, c, rows), x, y);
}

// Offset of this thread's accumulator element (row m0 + lane / 4, column c, c = c0 + 8 j + 2 (lane % 4)) in
// swizzled storage of `rows` rows; the element 8 rows further is kLowerHalf beyond. sw128_index's formula with
// the row's swizzle known: m0 is a multiple of 8, so it is lane / 4.
constexpr int kLowerHalf = 8 * 64;
__device__ __forceinline__ int sw128_thread_offset(int rows, int m0, int c) {
  const int lane = threadIdx.x & 31, quad_row = lane >> 2;
  return (c >> 6) * rows * 64 + (m0 + quad_row) * 64 + ((((c >> 3) & 7) ^ quad_row) << 3) + (c & 7);
}

// The first 1024-byte boundary at or after p in shared memory (the swizzled atoms' alignment).
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  return p + ((1024u - (smem_address(p) & 1023u)) & 1023u);
}

// bytes rounded up to a whole number of 1024-byte atoms: shared-memory layouts of swizzled tiles place each
// tile on such a boundary.
constexpr size_t round_up_1024(size_t bytes) { return (bytes + 1023) / 1024 * 1024; }

}  // namespace minilin
