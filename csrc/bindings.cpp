// minilin._cuda: the pybind11 module around the kernels. It takes raw device pointers (Python ints),
// sizes, a dtype code and a stream handle, so it needs neither CUDA nor CuPy headers; minilin/cuda/front.py
// validates CuPy arrays and passes their pointers here. Errors: ArgumentError -> ValueError,
// KernelError -> RuntimeError, both naming the kernel.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "minilin_cuda.h"

#ifndef MINILIN_CUDA_ARCH
#define MINILIN_CUDA_ARCH "unknown"
#endif
#ifndef MINILIN_NVCC_VERSION
#define MINILIN_NVCC_VERSION "unknown"
#endif

namespace py = pybind11;

namespace {

const minilin::Version& find_version(const std::string& op, int number) {
  for (const auto& v : minilin::versions())
    if (op == v.op && number == v.number) return v;
  std::string known;
  for (const auto& v : minilin::versions())
    if (op == v.op) known += (known.empty() ? "" : ", ") + std::to_string(v.number);
  if (known.empty())
    throw minilin::ArgumentError("minilin._cuda: op must be 'linear', 'delta', 'gla', 'kda', 'decode', "
                                 "'linear_bwd', 'delta_bwd', 'gla_bwd' or 'kda_bwd', got '" + op + "'");
  throw minilin::ArgumentError("minilin._cuda: " + op + " has versions " + known + ", got " + std::to_string(number));
}

template <typename P>
P* pointer(std::uintptr_t address) {
  return reinterpret_cast<P*>(address);
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "minilin's CUDA kernels (see csrc/). Use minilin.cuda, which validates CuPy arrays first.";
  m.attr("cuda_arch") = MINILIN_CUDA_ARCH;
  m.attr("nvcc_version") = MINILIN_NVCC_VERSION;

  m.def("versions", [] {
    py::list out;
    for (const auto& v : minilin::versions()) {
      py::dict d;
      d["op"] = v.op;
      d["version"] = v.number;
      d["name"] = v.name;
      d["summary"] = v.summary;
      d["float32"] = v.supports_float32;
      d["bfloat16"] = v.supports_bfloat16;
      d["min_compute_capability"] = v.min_compute_capability;
      d["max_compute_capability"] = v.max_compute_capability;  // 0: no maximum
      d["max_k"] = v.shape.max_k;
      py::object keys = py::none();
      if (v.shape.keys[0] != 0) {
        py::list taken;
        for (int K : v.shape.keys)
          if (K != 0) taken.append(K);
        keys = taken;
      }
      d["keys"] = keys;
      d["value_multiple"] = v.shape.value_multiple;
      d["packed"] = v.packed;
      out.append(d);
    }
    return out;
  }, "Every kernel version: op, version, name, summary, dtypes, minimum and maximum (0: none) compute capability, "
     "the shapes it takes: K <= max_k, K in keys (None: any), V a multiple of value_multiple; and whether it reads "
     "packed sequences and grouped heads in the kernel (packed).");

  m.def("workspace_bytes", [](const std::string& op, int version, int B, int T, int H, int K, int V,
                               bool packed) -> size_t {
    const auto& v = find_version(op, version);
    return v.workspace_bytes ? v.workspace_bytes(B, T, H, K, V, packed) : 0;
  }, py::arg("op"), py::arg("version"), py::arg("B"), py::arg("T"), py::arg("H"), py::arg("K"), py::arg("V"),
     py::arg("packed") = false,
     "Scratch bytes the version needs for these sizes (0: none); packed: B sequences packed into T tokens.");

  m.def("forward",
        [](const std::string& op, int version, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t g,
           std::uintptr_t beta, std::uintptr_t h0, std::uintptr_t o, std::uintptr_t ht, std::uintptr_t workspace,
           size_t workspace_size, int B, int T, int H, int K, int V, float scale, int dtype, std::uintptr_t stream,
           std::uintptr_t cu_seqlens, int qk_heads) {
          const auto& ver = find_version(op, version);
          if (!ver.forward)
            throw minilin::ArgumentError("minilin._cuda: " + op + " is not a forward op (decode steps: decode(); "
                                         "backward ops: backward())");
          const std::string which = "minilin._cuda: " + op + " v" + std::to_string(version);
          if (qk_heads != 0 && (qk_heads < 0 || H % qk_heads != 0))
            throw minilin::ArgumentError(which + ": qk_heads must divide H = " + std::to_string(H) + ", got " +
                                         std::to_string(qk_heads));
          if (!ver.packed && (cu_seqlens != 0 || (qk_heads != 0 && qk_heads != H)))
            throw minilin::ArgumentError(which + " reads neither packed sequences (cu_seqlens) nor grouped heads "
                                         "(qk_heads); versions()'s 'packed' lists those that do");
          minilin::Problem p;
          p.q = pointer<const void>(q);
          p.k = pointer<const void>(k);
          p.v = pointer<const void>(v);
          p.g = pointer<const float>(g);
          p.beta = pointer<const float>(beta);
          p.h0 = pointer<const float>(h0);
          p.o = pointer<void>(o);
          p.ht = pointer<float>(ht);
          p.workspace = pointer<void>(workspace);
          p.workspace_size = workspace_size;
          p.B = B, p.T = T, p.H = H, p.K = K, p.V = V;
          p.scale = scale;
          p.dtype = static_cast<minilin::DType>(dtype);
          p.stream = pointer<void>(stream);
          p.cu_seqlens = pointer<const int>(cu_seqlens);
          p.qk_heads = qk_heads;
          py::gil_scoped_release release;
          ver.forward(p);
        },
        py::arg("op"), py::arg("version"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"),
        py::arg("h0"), py::arg("o"), py::arg("ht"), py::arg("workspace"), py::arg("workspace_size"), py::arg("B"),
        py::arg("T"), py::arg("H"), py::arg("K"), py::arg("V"), py::arg("scale"), py::arg("dtype"), py::arg("stream"),
        py::arg("cu_seqlens") = 0, py::arg("qk_heads") = 0,
        "Launch one forward pass on `stream`. Pointers are device addresses (0 for an absent g, beta, h0 or "
        "workspace); dtype 0 = float32, 1 = bfloat16. Versions with 'packed' also take cu_seqlens (the address of "
        "B + 1 int32 offsets, checked by the caller: B sequences packed into T tokens) and qk_heads (q and k heads, "
        "a divisor of H; 0: H). Checks sizes (ValueError) and the launch (RuntimeError).");

  // Positional arguments are the fast path here: a decode step's host work is most of a small batch's time.
  m.def("decode",
        [](int version, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t g, int gate,
           std::uintptr_t beta, std::uintptr_t state_in, std::uintptr_t in_indices, long long pool_in,
           std::uintptr_t state_out, std::uintptr_t out_indices, long long pool_out, bool indices_int64,
           std::uintptr_t o, int N, int H, int K, int V, float scale, bool delta, bool normalize_qk, int dtype,
           std::uintptr_t stream) {
          const auto& ver = find_version("decode", version);
          if (!ver.decode) throw minilin::ArgumentError("minilin._cuda: decode version has no decode entry");
          minilin::DecodeProblem p;
          p.q = pointer<const void>(q);
          p.k = pointer<const void>(k);
          p.v = pointer<const void>(v);
          p.g = pointer<const float>(g);
          p.gate = static_cast<minilin::GateKind>(gate);
          p.beta = pointer<const float>(beta);
          p.state_in = pointer<const float>(state_in);
          p.in_indices = pointer<const void>(in_indices);
          p.pool_in = pool_in;
          p.state_out = pointer<float>(state_out);
          p.out_indices = pointer<const void>(out_indices);
          p.pool_out = pool_out;
          p.indices_int64 = indices_int64;
          p.o = pointer<void>(o);
          p.N = N, p.H = H, p.K = K, p.V = V;
          p.scale = scale;
          p.delta = delta;
          p.normalize_qk = normalize_qk;
          p.dtype = static_cast<minilin::DType>(dtype);
          p.stream = pointer<void>(stream);
          py::gil_scoped_release release;
          ver.decode(p);
        },
        py::arg("version"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("gate"), py::arg("beta"),
        py::arg("state_in"), py::arg("in_indices"), py::arg("pool_in"), py::arg("state_out"), py::arg("out_indices"),
        py::arg("pool_out"), py::arg("indices_int64"), py::arg("o"), py::arg("N"), py::arg("H"), py::arg("K"),
        py::arg("V"), py::arg("scale"), py::arg("delta"), py::arg("normalize_qk"), py::arg("dtype"), py::arg("stream"),
        "Launch one decode step (csrc/minilin_cuda.h, DecodeProblem) on `stream`: one token for each of N sequences. "
        "gate 0 = none (g = 0), 1 = scalar [N, H], 2 = per channel [N, H, K]; indices int32 unless indices_int64. "
        "Checks sizes and alignment (ValueError) and the launch (RuntimeError).");

  m.def("backward",
        [](const std::string& op, int version, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t g,
           std::uintptr_t beta, std::uintptr_t h0, std::uintptr_t do_, std::uintptr_t dht, std::uintptr_t dq,
           std::uintptr_t dk, std::uintptr_t dv, std::uintptr_t dg, std::uintptr_t dbeta, std::uintptr_t dh0,
           std::uintptr_t workspace, size_t workspace_size, int B, int T, int H, int K, int V,
           float scale, int dtype, std::uintptr_t stream) {
          const auto& ver = find_version(op, version);
          if (!ver.backward)
            throw minilin::ArgumentError("minilin._cuda: " + op + " is not a backward op ('linear_bwd', 'delta_bwd', 'gla_bwd', 'kda_bwd')");
          minilin::BackwardProblem p;
          p.q = pointer<const void>(q);
          p.k = pointer<const void>(k);
          p.v = pointer<const void>(v);
          p.g = pointer<const float>(g);
          p.beta = pointer<const float>(beta);
          p.h0 = pointer<const float>(h0);
          p.do_ = pointer<const void>(do_);
          p.dht = pointer<const float>(dht);
          p.dq = pointer<void>(dq);
          p.dk = pointer<void>(dk);
          p.dv = pointer<void>(dv);
          p.dg = pointer<float>(dg);
          p.dbeta = pointer<float>(dbeta);
          p.dh0 = pointer<float>(dh0);
          p.workspace = pointer<void>(workspace);
          p.workspace_size = workspace_size;
          p.B = B, p.T = T, p.H = H, p.K = K, p.V = V;
          p.scale = scale;
          p.dtype = static_cast<minilin::DType>(dtype);
          p.stream = pointer<void>(stream);
          py::gil_scoped_release release;
          ver.backward(p);
        },
        py::arg("op"), py::arg("version"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"), py::arg("beta"),
        py::arg("h0"), py::arg("do"), py::arg("dht"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("dg"),
        py::arg("dbeta"), py::arg("dh0"), py::arg("workspace"), py::arg("workspace_size"), py::arg("B"),
        py::arg("T"), py::arg("H"), py::arg("K"), py::arg("V"), py::arg("scale"), py::arg("dtype"), py::arg("stream"),
        "Launch one backward pass (csrc/minilin_cuda.h, BackwardProblem) on `stream`: gradients dq, dk, dv in dtype "
        "(and float32 dg when g is given, [B, T, H, K] for gla_bwd and kda_bwd, dbeta for delta_bwd and kda_bwd, dh0 when not 0). Checks sizes "
        "(ValueError) and the launches (RuntimeError).");
}
