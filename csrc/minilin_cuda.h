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
//   The ops with a decay per key channel ("gla", "kda") read g as [B, T, H, K] float32 instead, never null.
// Two layouts that versions with `packed` (Version below) read in the kernel; the others refuse them:
//   grouped value heads: q, k [B, T, qk_heads, K] with H a multiple of qk_heads, value head h reading q/k head
//     h / (H / qk_heads) (GVA, as Qwen3-Next); qk_heads = 0 means H.
//   packed sequences: cu_seqlens [B + 1] int32 device offsets, 0 = cu_seqlens[0] < ... < cu_seqlens[B] = T, of B
//     sequences laid end to end along T (the tensors' batch axis is 1 and T their total length); h0, ht hold one
//     [H, K, V] state per sequence. The offsets are checked on the host (minilin/varlen.py) before any launch.
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
  const int* cu_seqlens = nullptr;  // packed sequences (above), or null: B sequences of T tokens each
  int qk_heads = 0;                 // q and k heads (grouped value heads, above); 0: H
};

// How a decode step decays the state before it writes: not at all, by one exp(g) per (sequence, head), or by
// exp(g_f) per key channel f (GLA, KDA).
enum GateKind : int { kNoGate = 0, kScalarGate = 1, kChannelGate = 2 };

// One decode step: one token for each of N sequences (csrc/decode/). Shapes:
//   q, k [N, H, K] and v, o [N, H, V] in `dtype`; g null, [N, H] (kScalarGate) or [N, H, K] (kChannelGate)
//   float32 log-decays; beta [N, H] float32 (read when `delta`).
//   state_in [pool_in, H, K, V] float32, or null (zeros); sequence n reads row in_indices[n] of it (row n when
//   in_indices is null). state_out [pool_out, H, K, V] float32; sequence n writes row out_indices[n] (row n when
//   null). Indices are int32, or int64 when indices_int64. In place: state_out == state_in with the same indices,
//   so that every state element is read and then written by one thread; any other overlap is a race.
// A sequence whose row lies outside its pool gets NaN outputs and writes no state row in place (out of place, its
// row of state_out, if that row is inside, is set to NaN): a bad index never reads or writes outside the pools.
// The step (S' = decay(S), CONVENTIONS.md):
//   linear (delta false):  S_t = S' + k v^T,                          o = scale S_t^T q
//   delta (delta true):    S_t = S' + beta k (v - S'^T k)^T,          o = scale S_t^T q
// normalize_qk: q and k are first divided by sqrt(|x|^2 + 1e-6) (FLA's use_qk_l2norm_in_kernel).
struct DecodeProblem {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* g = nullptr;
  const float* beta = nullptr;
  const float* state_in = nullptr;
  const void* in_indices = nullptr;
  float* state_out = nullptr;
  const void* out_indices = nullptr;
  void* o = nullptr;
  long long pool_in = 0, pool_out = 0;
  int N = 0, H = 0, K = 0, V = 0;
  GateKind gate = kNoGate;
  bool delta = false;
  bool normalize_qk = false;
  bool indices_int64 = false;
  float scale = 1.0f;
  DType dtype = kFloat32;
  void* stream = nullptr;        // a cudaStream_t; null is the legacy default stream
};

// One backward call of a whole sequence (csrc/linear_bwd/, csrc/delta_bwd/, csrc/gla_bwd/, csrc/kda_bwd/): the
// gradients of L = <do, o> + <dht, final state> with respect to the forward's inputs (CONVENTIONS.md, Gradients).
//   q, k [B, T, H, K], v and do [B, T, H, V] in `dtype`; g, beta [B, T, H] float32 (g may be null, except for
//   gla_bwd and kda_bwd, whose g is [B, T, H, K]; beta read by the delta family only: delta_bwd, kda_bwd);
//   h0 [B, H, K, V] float32 or null (zeros);
//   dht [B, H, K, V] float32 or null (zeros).
//   Outputs: dq, dk [B, T, H, K] and dv [B, T, H, V] in `dtype` (dq with respect to q itself: the kernels
//   differentiate scale q and multiply by scale); float32 dg shaped as g when g is given, the delta family's dbeta
//   [B, T, H], and dh0 [B, H, K, V] when not null. Every sum is taken in float32 first.
struct BackwardProblem {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* g = nullptr;
  const float* beta = nullptr;
  const float* h0 = nullptr;
  const void* do_ = nullptr;
  const float* dht = nullptr;
  void* dq = nullptr;            // in dtype, as dk and dv
  void* dk = nullptr;
  void* dv = nullptr;
  float* dg = nullptr;
  float* dbeta = nullptr;
  float* dh0 = nullptr;
  void* workspace = nullptr;     // scratch of workspace_bytes(...) bytes, or null when that is 0
  size_t workspace_size = 0;
  int B = 0, T = 0, H = 0, K = 0, V = 0;
  float scale = 1.0f;
  DType dtype = kFloat32;
  void* stream = nullptr;
};

// The key and value widths a version takes: K <= max_k, K one of `keys` where keys[0] != 0 (zeros end the
// list; all zero: any K), V a multiple of value_multiple (the forward ops' common checks also want K a multiple
// of 8). minilin.cuda's default version (version=None) is the last rung whose rule takes the call's shape; a
// version's own checks refuse the shapes its rule leaves out, with a message naming them.
struct ShapeRule {
  int max_k;
  int keys[2];
  int value_multiple;
};
constexpr int kTensorCoreKeys[] = {64, 128};  // the key widths the tensor-core kernels are instantiated for
constexpr ShapeRule kKeysUpTo256{256, {0, 0}, 8};   // the forward token loops (v1s): the state's rows in registers
constexpr ShapeRule kBackwardKeysUpTo256{256, {0, 0}, 1};  // the backward token loops: any V (columns bound-checked)
constexpr ShapeRule kKeysUpTo128{128, {0, 0}, 8};   // the chunked CUDA-core versions (v2s): a chunk's rows in shared memory
constexpr ShapeRule kTensorCoreShape{128, {kTensorCoreKeys[0], kTensorCoreKeys[1]}, 64};  // every tensor-core version
                                                                                           // at K <= 128: 64-column value blocks
constexpr ShapeRule kTensorCoreShape256{256, {256, 0}, 64};  // the K = 256 tensor-core versions (linear v9)

constexpr bool is_tensor_core_key(int K) { return K == kTensorCoreKeys[0] || K == kTensorCoreKeys[1]; }
constexpr bool takes_key(const ShapeRule& rule, int K) {
  return rule.keys[0] == 0 || K == rule.keys[0] || (rule.keys[1] != 0 && K == rule.keys[1]);
}
constexpr bool takes_shape(const ShapeRule& rule, int K, int V) {
  return K <= rule.max_k && takes_key(rule, K) && V % rule.value_multiple == 0;
}

// One kernel version of one op: what the bindings list and dispatch to.
struct Version {
  const char* op;                 // "linear" (scalar-gated linear family), "delta" (delta rule family),
                                  // "gla", "kda" (their per-channel-gated members: GLA, Kimi Delta Attention),
                                  // "decode" (one token per sequence, both families), "linear_bwd",
                                  // "delta_bwd", "gla_bwd", "kda_bwd"
  int number;                     // 1, 2, 3, ... : the ladder, each step kept callable
  const char* name;               // e.g. "recurrent", "chunked", "chunked_mma"
  const char* summary;            // the file header's one sentence: what changed and why
  bool supports_float32;
  bool supports_bfloat16;
  ShapeRule shape;                // the K and V it takes
  int min_compute_capability;     // e.g. 80 for mma.sync bf16
  // Scratch for B sequences of T tokens, or (packed) B sequences packed into T tokens; null: needs none.
  size_t (*workspace_bytes)(int B, int T, int H, int K, int V, bool packed);
  void (*forward)(const Problem&);                               // throws ArgumentError / KernelError; null for "decode"
  int max_compute_capability = 0;  // 0: any from the minimum up; 90: sm_90a code (wgmma), which runs on 9.0 only
  void (*decode)(const DecodeProblem&) = nullptr;                // the "decode" op's entry; null for the others
  void (*backward)(const BackwardProblem&) = nullptr;            // the "*_bwd" ops' entry; null for the others
  bool packed = false;  // forward: reads grouped heads and packed sequences (Problem) in the kernel
};
constexpr bool kReadsPacked = true;  // a Version's `packed`, by name

// Every version the extension was built with, in op then version order.
const std::vector<Version>& versions();

}  // namespace minilin
