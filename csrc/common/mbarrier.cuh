// mbarriers: barrier objects in shared memory that let one group of warps (a producer) hand a buffer to
// another (the consumers) without stopping the whole block. Threads arrive on a barrier; cp.async copies
// can arrive for their thread when they land; a waiter blocks until the current phase's expected arrivals
// have all come. Phases alternate parity (0, 1, 0, ...), so a barrier guarding stage s of a ring of
// kStages is waited, at its u-th use, with parity u & 1 = (n / kStages) & 1 for chunk n.
// PTX ISA: "Parallel Synchronization and Communication Instructions: mbarrier".
#pragma once

#include <cstdint>

namespace minilin {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// try_wait.parity and the init fence exist from sm_90 on; an older target compiles these helpers to a trap,
// so a build for several architectures still links (the versions using them declare compute capability 90).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define MINILIN_HAS_MBARRIER_WAIT 1
#endif

// Before any use, by one thread: `arrivals` arrivals complete each phase. Then fence_barrier_init() and a
// block barrier make the initialized barrier visible to every thread.
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, unsigned arrivals) {
#ifdef MINILIN_HAS_MBARRIER_WAIT
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void fence_barrier_init() {
#ifdef MINILIN_HAS_MBARRIER_WAIT
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival, with release semantics: this thread's earlier shared-memory writes are visible to whoever
// waits the phase out.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
#ifdef MINILIN_HAS_MBARRIER_WAIT
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(shared_address(barrier))
               : "memory");
#else
  __trap();
#endif
}

// One arrival, made when all of this thread's cp.async copies issued so far have landed (sm_80+; .noinc:
// the barrier's expected count must include these arrivals).
__device__ __forceinline__ void cp_async_arrive(uint64_t* barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}

// Block until the phase of the given parity has completed (acquire semantics).
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, unsigned parity) {
#ifdef MINILIN_HAS_MBARRIER_WAIT
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

// bar.sync on a named barrier (1-15; 0 is __syncthreads) for `threads` threads, a multiple of 32: lets a
// group of warps meet without the block's other warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace minilin
