// Host-side helpers shared by every version's launcher: argument checks that throw ArgumentError
// (Python's ValueError); the launch itself (launch_checked, and launch_per_value_block for the wide chunk
// kernels' K = 64 / 128 instances); and the launch check that turns any CUDA error into KernelError
// (Python's RuntimeError) naming the kernel; check_decode_problem, the decode versions' argument checks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "../minilin_cuda.h"

namespace minilin {

// P is a Problem (a forward call) or a DecodeProblem (one decode step): both carry the stream as void*.
template <typename P>
inline cudaStream_t stream_of(const P& p) { return static_cast<cudaStream_t>(p.stream); }

// MINILIN_CUDA_SYNC=1 synchronizes after every launch, so an error inside a kernel (an illegal address,
// say) is reported by the call that launched it, not by whatever CUDA call happens to come next.
inline bool sync_after_launch() {
  static const bool on = [] {
    const char* s = std::getenv("MINILIN_CUDA_SYNC");
    return s != nullptr && s[0] != '\0' && s[0] != '0';
  }();
  return on;
}

inline void check_cuda(cudaError_t status, const char* kernel, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    throw KernelError(std::string("minilin._cuda: kernel ") + kernel + ": " + what + " failed: " +
                      cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
}

// Call right after a <<<...>>> launch.
template <typename P>
inline void check_launch(const char* kernel, const P& p) {
  check_cuda(cudaGetLastError(), kernel, "launch");
  if (sync_after_launch()) check_cuda(cudaStreamSynchronize(stream_of(p)), kernel, "execution");
}

// The current device's SM count (a launch that picks its shape by how many blocks the card holds at once).
inline int multiprocessor_count(const char* name) {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), name, "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), name,
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  return sms;
}

// Kernels that need more than 48 KB of dynamic shared memory must say so before they launch (launch_checked
// does, at every launch: a per-kernel flag would have to be per device too).
template <typename Kernel>
inline void allow_shared_memory(Kernel kernel, size_t bytes, const char* name) {
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
               name, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
}

// Every launch: the kernel's dynamic shared memory allowed, the launch on p's stream, the launch checked.
// `args` follow the problem (a Problem or a DecodeProblem, passed by value) in the kernel's parameters.
// Blocks of `kernel` (`threads` a block, `smem` bytes of dynamic shared memory) that one SM of the current device
// holds at once: what a launch that sizes its split by the card asks (linear v8, gla v5, kda v5).
template <typename Kernel>
inline int resident_blocks(Kernel kernel, int threads, size_t smem, const char* name) {
  allow_shared_memory(kernel, smem, name);
  int blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem), name,
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

template <typename P, typename Kernel, typename... Args>
inline void launch_checked(const P& p, const char* name, Kernel kernel, dim3 grid, int threads, size_t smem,
                           Args... args) {
  allow_shared_memory(kernel, smem, name);
  kernel<<<grid, threads, smem, stream_of(p)>>>(p, args...);
  check_launch(name, p);
}

// The wide chunk kernels' launch: their K = 64 or K = 128 instance (the two sizes they are compiled for) with
// its shared memory, one block per (value block of block_v columns, head, batch).
template <typename Kernel, typename... Args>
inline void launch_per_value_block(const Problem& p, const char* name, int block_v, int threads, Kernel kernel_k64,
                                   size_t smem_k64, Kernel kernel_k128, size_t smem_k128, Args... args) {
  launch_checked(p, name, p.K == 64 ? kernel_k64 : kernel_k128, dim3(p.V / block_v, p.H, p.B), threads,
                 p.K == 64 ? smem_k64 : smem_k128, args...);
}

// `message` is a callable that builds the text (`[&] { return ...; }`), called only when the check fails:
// every launch runs these checks, and building their strings each time cost microseconds per call.
template <typename Message>
inline void require(bool ok, Message&& message) {
  if (!ok) throw ArgumentError("minilin._cuda: " + std::string(message()));
}

// The per-channel ops' own check (gla, kda, gla_bwd, kda_bwd; P a Problem or a BackwardProblem): g, one
// log-decay per key channel [B, T, H, K], must be given.
template <typename P>
inline void require_channel_gate(const P& p, const char* kernel) {
  require(p.g != nullptr, [kernel] {
    return std::string(kernel) + ": g must be a device pointer (the per-channel log-decays [B, T, H, K]), got null";
  });
}

// A version's scratch (p.workspace, p.workspace_size bytes): at least `needed` bytes and, where `aligned`, 16-byte
// aligned (its kernels copy in and store 16 bytes at a time).
inline void require_workspace(const Problem& p, const char* kernel, size_t needed, bool aligned = true) {
  require(p.workspace != nullptr && p.workspace_size >= needed, [&] {
    return std::string(kernel) + ": needs a workspace of " + std::to_string(needed) + " bytes, got " +
           std::to_string(p.workspace_size);
  });
  require(!aligned || reinterpret_cast<uintptr_t>(p.workspace) % 16 == 0, [&] {
    return std::string(kernel) + ": the workspace must be 16-byte aligned (cp.async and 16-byte stores)";
  });
}

// Checks every version shares: positive sizes, pointers present, the gate/beta an op needs.
inline void check_common(const Problem& p, const char* kernel, bool needs_beta) {
  const auto k = [kernel] { return std::string(kernel); };
  require(p.B > 0 && p.T > 0 && p.H > 0 && p.K > 0 && p.V > 0, [&] {
    return k() + ": sizes must be positive, got B=" + std::to_string(p.B) + " T=" + std::to_string(p.T) + " H=" +
           std::to_string(p.H) + " K=" + std::to_string(p.K) + " V=" + std::to_string(p.V);
  });
  require(p.q && p.k && p.v && p.o && p.ht, [&] {
    return k() + ": q, k, v, o and ht must be device pointers, got a null one";
  });
  require(!needs_beta || p.beta, [&] { return k() + ": beta must be a device pointer, got null"; });
  require(p.dtype == kFloat32 || p.dtype == kBFloat16, [&] {
    return k() + ": dtype code must be 0 (float32) or 1 (bfloat16), got " + std::to_string(p.dtype);
  });
  require(p.K % 8 == 0 && p.V % 8 == 0, [&] {
    return k() + ": K and V must be multiples of 8 (16-byte rows for cp.async), got K=" + std::to_string(p.K) + " V=" +
           std::to_string(p.V);
  });
}

// What every tensor-core version takes (forward and backward): bf16 inputs, K = 64 or 128 (the two sizes their
// kernels are instantiated for), V a whole number of block_v-column value blocks.
inline void require_tensor_core_shape(const char* kernel, DType dtype, int K, int V, int block_v) {
  const auto k = [kernel] { return std::string(kernel); };
  static_assert(kTensorCoreKeys[0] == 64 && kTensorCoreKeys[1] == 128, "the message below names the keys");
  require(dtype == kBFloat16, [&] { return k() + ": bfloat16 inputs only (tensor cores multiply bf16), got float32"; });
  require(is_tensor_core_key(K), [&] { return k() + ": K must be 64 or 128, got K=" + std::to_string(K); });
  require(V % block_v == 0, [&] {
    return k() + ": V must be a multiple of " + std::to_string(block_v) + ", got V=" + std::to_string(V);
  });
}

// The shape of the K = 256 tensor-core versions (kTensorCoreShape256: linear v9, delta v11); `others` names the
// versions that take K = 64 and 128, for the message.
inline void require_head_dim_256_shape(const char* kernel, DType dtype, int K, int V, int block_v, const char* others) {
  const auto k = [kernel] { return std::string(kernel); };
  require(dtype == kBFloat16, [&] { return k() + ": bfloat16 inputs only (tensor cores multiply bf16), got float32"; });
  require(K == 256, [&] {
    return k() + ": K must be 256 (" + others + " take 64 and 128), got K=" + std::to_string(K);
  });
  require(V % block_v == 0, [&] {
    return k() + ": V must be a multiple of " + std::to_string(block_v) + ", got V=" + std::to_string(V);
  });
}

// The checks of every tensor-core forward version (linear and delta v3 onwards): check_common, then the shape.
inline void check_tensor_core_problem(const Problem& p, const char* kernel, bool needs_beta, int block_v) {
  check_common(p, kernel, needs_beta);
  require_tensor_core_shape(kernel, p.dtype, p.K, p.V, block_v);
}

// Versions written with wgmma run only from sm_90a machine code (setup.py defines MINILIN_SM90A when it builds
// some), and only compute capability 9.0 runs that.
inline void require_sm90a(const std::string& name) {
#ifndef MINILIN_SM90A
  require(false, [&] { return name + ": this build has no sm_90a code (wgmma); rebuild with MINILIN_CUDA_ARCH=90a"; });
#endif
  int device = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&device), name.c_str(), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), name.c_str(),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), name.c_str(),
             "cudaDeviceGetAttribute");
  require(major == 9 && minor == 0, [&] {
    return name + ": needs a compute capability 9.0 GPU (sm_90a: H100, H200), got " + std::to_string(major) + "." +
           std::to_string(minor);
  });
}

// The delta versions' scratch space (the WY step's T for every chunk): present and at least `bytes` long.
inline void check_workspace(const Problem& p, const char* kernel, size_t bytes) {
  require(p.workspace && p.workspace_size >= bytes, [&] {
    return std::string(kernel) + ": workspace must hold " + std::to_string(bytes) + " bytes, got " +
           std::to_string(p.workspace_size);
  });
}

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The checks every decode version shares (DecodeProblem, minilin_cuda.h): positive sizes and a grid of one block
// per (sequence, head, block_columns value columns) that fits in gridDim.x; the pointers, the gate and the beta the
// step reads; pools of at least one row; K <= max_k (the key rows in registers); V a multiple of 4 and 16-byte
// state rows, v and o pieces (4 columns per 16-byte access); in place, the same rows read and written.
inline void check_decode_problem(const DecodeProblem& p, const char* kernel, int max_k, int block_columns) {
  const auto k = [kernel] { return std::string(kernel); };
  require(p.N > 0 && p.H > 0 && p.K > 0 && p.V > 0, [&] {
    return k() + ": sizes must be positive, got N=" + std::to_string(p.N) + " H=" + std::to_string(p.H) + " K=" +
           std::to_string(p.K) + " V=" + std::to_string(p.V);
  });
  const long long blocks = static_cast<long long>(p.N) * p.H * ceil_div(p.V, block_columns);
  require(blocks <= 0x7fffffffLL, [&] {
    return k() + ": N * H * ceil(V / " + std::to_string(block_columns) + ") must be below 2^31 blocks, got " +
           std::to_string(blocks);
  });
  require(p.q && p.k && p.v && p.o && p.state_out, [&] {
    return k() + ": q, k, v, o and state_out must be device pointers, got a null one";
  });
  require(!p.delta || p.beta, [&] { return k() + ": beta must be a device pointer for the delta rule, got null"; });
  require(p.gate == kNoGate || p.gate == kScalarGate || p.gate == kChannelGate, [&] {
    return k() + ": gate code must be 0 (none), 1 (scalar) or 2 (per channel), got " + std::to_string(p.gate);
  });
  require((p.gate == kNoGate) == (p.g == nullptr), [&] {
    return k() + ": g must be null exactly when the gate code is 0, got gate " + std::to_string(p.gate) +
           (p.g ? " with a pointer" : " with null");
  });
  require(p.dtype == kFloat32 || p.dtype == kBFloat16, [&] {
    return k() + ": dtype code must be 0 (float32) or 1 (bfloat16), got " + std::to_string(p.dtype);
  });
  require(p.K <= max_k, [&] {
    return k() + ": K must be <= " + std::to_string(max_k) + " (the key rows live in registers), got K=" +
           std::to_string(p.K);
  });
  require(p.V % 4 == 0, [&] {
    return k() + ": V must be a multiple of 4 (16-byte state accesses), got V=" + std::to_string(p.V);
  });
  require(p.pool_out >= 1 && (p.state_in == nullptr || p.pool_in >= 1), [&] {
    return k() + ": state pools must hold at least one row, got pool_in=" + std::to_string(p.pool_in) +
           " pool_out=" + std::to_string(p.pool_out);
  });
  require(p.in_indices == nullptr || p.state_in != nullptr, [&] {
    return k() + ": in_indices index state_in, which is null";
  });
  require(p.state_out != p.state_in || p.in_indices == p.out_indices, [&] {
    return k() + ": in place (state_out == state_in) the rows read and written must be the same indices";
  });
  const size_t piece = 4 * (p.dtype == kFloat32 ? 4 : 2);
  const auto aligned = [](const void* x, size_t bytes) { return reinterpret_cast<std::uintptr_t>(x) % bytes == 0; };
  require(aligned(p.state_in, 16) && aligned(p.state_out, 16) && aligned(p.v, piece) && aligned(p.o, piece), [&] {
    return k() + ": the states must be 16-byte aligned and v, o " + std::to_string(piece) +
           "-byte aligned (a view that starts inside an allocation may not be)";
  });
}

}  // namespace minilin
