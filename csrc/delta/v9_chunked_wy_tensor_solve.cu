// delta v9 (the WY solve on tensor cores): v8 with the block products of the WY step's three waves
// (T_ij = -D_i sum_k A_ik T_kj, wy_prepare_blocked.cuh) on tensor cores, mma.sync m16n8k8 in tf32, three per
// product (3xTF32: each fp32 operand split into a tf32 high and low part, so the products keep fp32
// accuracy), because the prepare kernel is a fifth of v8's time with its shared-memory pipe 83% busy (ncu), and
// by a count of its reads the waves' CUDA-core micro-tiles take about half of that pipe: 16-byte reads per
// lane, each row and column read again by every lane group, where an mma fragment reads each element once
// per warp, 4 bytes at a time. The chunk kernel is v8's (chunk_wy_producer.cuh).
// Measured on the H200 (same build, 7 alternating rounds, device time): 0.6085 vs v8's 0.6176 ms at T = 8192
// (1.5%, 9 us of the prepare kernel's ~140), 2.366 vs 2.404 at 32768; errors against float64 the same as
// v8's to four digits. Far less than the count promised: the waves are not where most of the prepare
// kernel's time goes (csrc/NOTES.md).
#include "chunk_wy_producer.cuh"
#include "wy_prepare_blocked.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  delta_wide::check_problem(p, "delta_v9_chunked_wy_tensor_solve");
  auto* wy = static_cast<__nv_bfloat16*>(p.workspace);
  launch_wy_prepare_blocked<wy_blocked::WaveProducts::kTensorCores>(p, wy, "delta_v9_wy_prepare_tensor_solve");
  delta_producer::launch_chunks(p, wy, "delta_v9_chunked_wy_tensor_solve");
}

}  // namespace

extern const Version delta_v9 = {
    "delta", 9, "chunked_wy_tensor_solve",
    "v8 with the WY solve's block products on tensor cores (mma.sync tf32, three per product for fp32 accuracy): the prepare kernel's shared-memory pipe was its limit. 1.5% faster than v8 on an H200, less than its reads promised.",
    false, true, 90, delta_wide::workspace_bytes, forward};

}  // namespace minilin
