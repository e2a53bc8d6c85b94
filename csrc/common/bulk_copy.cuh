// Hopper (sm_90) asynchronous copies that report to an mbarrier: one thread copies a whole row from global
// to shared memory with one instruction (cp.async.bulk, served by the copy engine beside the SM), and the
// consumers wait on a barrier object in shared memory that counts both thread arrivals and bytes landed.
//
// An mbarrier completes a phase when its expected arrivals have arrived and every byte announced with
// expect_tx has landed; waiting names the phase by its parity (0, 1, 0, ...), so a barrier that guards a
// ring of stages is waited with parity (use / stages) & 1. PTX ISA: "Parallel Synchronization and
// Communication Instructions: mbarrier" and "Data Movement: cp.async.bulk".
#pragma once

#include <cstdint>

namespace minilin {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// The instructions below exist from sm_90 on; an older target compiles them to a trap, so a build for
// several architectures still links (the versions using them declare min_compute_capability 90).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define MINILIN_HAS_BULK_COPY 1
#endif

// Before any use: `arrivals` threads must arrive per phase. Make the initialization visible to the async
// proxy (the copy engine) and to the other threads with fence_barrier_init() and a block barrier.
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, unsigned arrivals) {
#ifdef MINILIN_HAS_BULK_COPY
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void fence_barrier_init() {
#ifdef MINILIN_HAS_BULK_COPY
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Announce `bytes` more to land in the barrier's current phase (no arrival).
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* barrier, unsigned bytes) {
#ifdef MINILIN_HAS_BULK_COPY
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// One arrival, with release semantics: this thread's earlier shared-memory writes are visible to whoever
// waits the phase out.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
#ifdef MINILIN_HAS_BULK_COPY
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(shared_address(barrier))
               : "memory");
#else
  __trap();
#endif
}

// Block until the phase of the given parity has completed (acquire semantics).
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, unsigned parity) {
#ifdef MINILIN_HAS_BULK_COPY
  asm volatile(
      "{\n"
      " .reg .pred done;\n"
      " WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT;\n"
      "}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
#else
  __trap();
#endif
}

// Copy `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory; the bytes
// count against `barrier`'s current phase when they land.
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* gmem, unsigned bytes, uint64_t* barrier) {
#ifdef MINILIN_HAS_BULK_COPY
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   shared_address(smem)),
               "l"(gmem), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
#else
  __trap();
#endif
}

// bar.sync on a named barrier (1-15; 0 is __syncthreads) for `threads` threads, a multiple of 32: lets a
// group of warps meet without the block's other warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace minilin
