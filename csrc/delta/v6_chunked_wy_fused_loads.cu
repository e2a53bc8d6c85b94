// delta v6 (fused fragment loads): v5 with phase 1's three products (Q K^T, Q S, K S) in one k loop, so that
// Q's A fragments (shared by Q K^T and Q S) and S's B fragments (shared by Q S and K S) leave shared memory
// once, because ncu found the wide kernels bound by shared-memory fragment traffic, not by the tensor cores:
// phase 1 issues 4 ldmatrix per k-step and warp instead of 6, about 20% of the chunk's fragment loads.
#include "chunk_wy_mma_wide.cuh"
#include "wy_prepare_blocked.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  delta_wide::check_problem(p, "delta_v6_chunked_wy_fused_loads");
  auto* wy = static_cast<__nv_bfloat16*>(p.workspace);
  launch_wy_prepare_blocked(p, wy, "delta_v6_wy_prepare_blocked");
  delta_wide::launch_chunks<Loads::kFused>(p, wy, "delta_v6_chunked_wy_fused_loads");
}

}  // namespace

extern const Version delta_v6 = {
    "delta", 6, "chunked_wy_fused_loads",
    "v5 with phase 1's three products in one k loop, each Q and S fragment loaded once: the wide kernels are bound by shared-memory fragment traffic.",
    false, true, kTensorCoreShape, 80, delta_wide::workspace_bytes, forward};

}  // namespace minilin
