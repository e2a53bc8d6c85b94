// The plain C++ interface between the kernels (csrc/<op>/v*.cu, compiled by nvcc) and the pybind11
// bindings (csrc/bindings.cpp, compiled by the host compiler). No CUDA types appear here, so the
// bindings need neither CUDA nor CuPy headers: device pointers travel as void*, the stream as void*.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace minilin {

enum DType : int { kFloat32 = 0, kBFloat16 = 1 };

// A bad size or option: pybind11 turns std::invalid_argument into Python's ValueError.
struct ArgumentError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A failed launch or kernel: pybind11 turns std::runtime_error into Python's RuntimeError.
struct KernelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One forward call. Shapes follow CONVENTIONS.md (sequence-first, like FLA):
//   q, k [B, T, H, K] and v, o [B, T, H, V] in `dtype`; g, beta [B, T, H] float32 (g may be null:
//   no decay; beta is read by the delta family only); h0, ht [B, H, K, V] float32 (h0 may be null:
//   zeros). All arrays C-contiguous on the current device. `scale` multiplies q.
struct Problem {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* g = nullptr;
  const float* beta = nullptr;
  const float* h0 = nullptr;
  void* o = nullptr;
  float* ht = nullptr;
  void* workspace = nullptr;     // scratch of workspace_bytes(...) bytes, or null when that is 0
  size_t workspace_size = 0;
  int B = 0, T = 0, H = 0, K = 0, V = 0;
  float scale = 1.0f;
  DType dtype = kFloat32;
  void* stream = nullptr;        // a cudaStream_t; null is the legacy default stream
};

// One kernel version of one op: what the bindings list and dispatch to.
struct Version {
  const char* op;                 // "linear" (scalar-gated linear family) or "delta" (delta rule family)
  int number;                     // 1, 2, 3, ... : the ladder, each step kept callable
  const char* name;               // e.g. "recurrent", "chunked", "chunked_mma"
  const char* summary;            // the file header's one sentence: what changed and why
  bool supports_float32;
  bool supports_bfloat16;
  int min_compute_capability;     // e.g. 80 for mma.sync bf16
  size_t (*workspace_bytes)(int B, int T, int H, int K, int V);  // null: needs none
  void (*forward)(const Problem&);                               // throws ArgumentError / KernelError
  int max_compute_capability = 0;  // 0: any from the minimum up; 90: sm_90a code (wgmma), which runs on 9.0 only
};

// Every version the extension was built with, in op then version order.
const std::vector<Version>& versions();

}  // namespace minilin
