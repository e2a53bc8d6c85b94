// delta v8 (producer warp): v7's 16 compute warps plus one warp that only loads, as linear v7 does: each
// chunk's q, k, v, T's tile and betas, and the gate's cumulative sum, into a ring of three stages guarded by
// mbarriers, because the same change made the linear chunk kernel 7-9% faster (linear v7, csrc/NOTES.md):
// the compute warps stop issuing ~200 copy instructions per chunk and scanning the gate 16 times over.
// The kernel is chunk_wy_producer.cuh's (v9 shares it); the WY step T = (I + A)^-1 is prepared by v5's
// blocked kernel (wy_prepare_blocked.cuh), as in v5 - v7.
// The compute warps take their tiles from compute_warp_tiles (producer.cuh), as linear v7's do: 3% faster
// (device time, same-run A/B on an H200: 0.622 vs 0.644 ms at T = 8192, outputs bit-identical).
#include "chunk_wy_producer.cuh"
#include "wy_prepare_blocked.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  delta_wide::check_problem(p, "delta_v8_chunked_wy_producer_warp");
  auto* wy = static_cast<__nv_bfloat16*>(p.workspace);
  launch_wy_prepare_blocked(p, wy, "delta_v8_wy_prepare_blocked");
  delta_producer::launch_chunks(p, wy, "delta_v8_chunked_wy_producer_warp");
}

}  // namespace

extern const Version delta_v8 = {
    "delta", 8, "chunked_wy_producer_warp",
    "v7 plus one warp that only loads (cp.async into a 3-stage ring guarded by mbarriers) and scans the gate, as linear v7: that made the linear chunk kernel 7-9% faster. 7-8% faster than v7 on an H200, and 3% more with its tiles placed to spare the producer's sub-partition; outputs bit-identical.",
    false, true, kTensorCoreShape, 90, delta_wide::workspace_bytes, forward};

}  // namespace minilin
