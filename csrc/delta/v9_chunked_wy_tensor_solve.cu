// delta v9 (the WY solve on tensor cores): v8 with the block products of the WY step's three waves
// (T_ij = -D_i sum_k A_ik T_kj, wy_prepare_blocked.cuh) on tensor cores, mma.sync m16n8k8 in tf32, three per
// product (3xTF32: each fp32 operand split into a tf32 high part and the rest, so the products stay within a
// few 1e-6 of fp32), because the prepare kernel is a fifth of v8's time with its shared-memory pipe 83% busy
// (ncu), and by a count of its reads the waves' CUDA-core micro-tiles took about half of that pipe: 16-byte
// reads per lane, each row and column read again by every lane group, where an mma fragment reads each
// element once per warp, 4 bytes at a time. The chunk kernel is v8's (chunk_wy_producer.cuh).
// Measured on the H200 (device time, same build, alternating rounds): 0.592 vs v8's 0.618 ms at T = 8192
// (4%: the prepare kernel ~140 -> ~114 us), 2.319 vs 2.421 at 32768 in the ladder; errors against float64
// v8's to four digits. The split masks the low 13 bits of each operand (2 instructions); splitting with
// cvt.rna.tf32.f32 instead, which sm_90 runs as ~10 instructions, gains only 1.5% over v8 (ncu: L1 84% -> 66%
// busy, but as many instructions as v8). Both are far from the ~50 us the count of reads promised: the waves
// are short chains of 1-3 warps that the block's other warps wait on at barriers (csrc/NOTES.md), and shorter
// reads barely shorten them.
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
    "v8 with the WY solve's block products on tensor cores (mma.sync tf32, three per product for near-fp32 accuracy): the prepare kernel's shared-memory pipe was its busiest. 4% faster than v8 on an H200.",
    false, true, kTensorCoreShape, 90, delta_wide::workspace_bytes, forward};

}  // namespace minilin
