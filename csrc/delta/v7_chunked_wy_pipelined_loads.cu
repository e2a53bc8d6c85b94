// delta v7 (pipelined fragment loads): v6 with every k loop of the chunk kernel loading the fragments of step
// s + 1 into a second register set before the mma of step s issue, and the diagonal test of Q K^T taken
// outside the loop, because ncu's source view of the linear chunk kernel (the same loops) showed each mma
// waiting on the ldmatrix that ptxas issued just before it.
// Measured on the H200: within 2% either way, inside the machine's run-to-run noise (csrc/NOTES.md):
// with four warps per scheduler the other warps had been hiding most of that wait already.
#include "chunk_wy_mma_wide.cuh"
#include "wy_prepare_blocked.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  delta_wide::check_problem(p, "delta_v7_chunked_wy_pipelined_loads");
  auto* wy = static_cast<__nv_bfloat16*>(p.workspace);
  launch_wy_prepare_blocked(p, wy, "delta_v7_wy_prepare_blocked");
  delta_wide::launch_chunks<Loads::kFusedPipelined>(p, wy, "delta_v7_chunked_wy_pipelined_loads");
}

}  // namespace

extern const Version delta_v7 = {
    "delta", 7, "chunked_wy_pipelined_loads",
    "v6 with every k loop loading step s + 1's fragments before step s's mma: each mma waited on the ldmatrix issued just before it.",
    false, true, kTensorCoreShape, 80, delta_wide::workspace_bytes, forward};

}  // namespace minilin
