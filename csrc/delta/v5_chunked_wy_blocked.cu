// delta v5 (blocked WY step): v4's chunk kernel unchanged, with the WY step T = (I + A)^-1 solved in
// 16 x 16 blocks (wy_prepare_blocked.cuh) instead of one 64-long forward substitution per column, because
// ncu measured that substitution at 263 us of v4's 904 us (T = 8192): 2016 dependent multiply-adds per
// thread, 64 busy threads per block.
#include "chunk_wy_mma_wide.cuh"
#include "wy_prepare_blocked.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  delta_wide::check_problem(p, "delta_v5_chunked_wy_blocked");
  auto* wy = static_cast<__nv_bfloat16*>(p.workspace);
  launch_wy_prepare_blocked(p, wy, "delta_v5_wy_prepare_blocked");
  delta_wide::launch_chunks<Loads::kPerProduct>(p, wy, "delta_v5_chunked_wy_mma_wide");
}

}  // namespace

extern const Version delta_v5 = {
    "delta", 5, "chunked_wy_blocked",
    "v4 with the WY step solved in 16 x 16 blocks (three waves of small fp32 products) instead of one 64-long chain per column: that chain was 29% of v4's time.",
    false, true, kTensorCoreShape, 80, delta_wide::workspace_bytes, forward};

}  // namespace minilin
