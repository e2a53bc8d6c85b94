// delta v7 (hoisted addressing): v6 with every shared-memory fragment address and every copy offset worked
// out once per kernel (lane_addressing.cuh), so that a fragment load costs one add instead of a chain of
// integer multiplies, shifts and a generic-to-shared conversion, because ncu found v6's chunk kernel, like
// linear v5, issuing less than half the time with the integer pipe the busiest one (linear v6 is the same step).
#include "chunk_wy_mma_wide.cuh"
#include "wy_prepare_blocked.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  delta_wide::check_problem(p, "delta_v7_chunked_wy_hoisted");
  auto* wy = static_cast<__nv_bfloat16*>(p.workspace);
  launch_wy_prepare_blocked(p, wy, "delta_v7_wy_prepare_blocked");
  delta_wide::launch_chunks<true, true>(p, wy, "delta_v7_chunked_wy_hoisted");
}

}  // namespace

extern const Version delta_v7 = {
    "delta", 7, "chunked_wy_hoisted",
    "v6 with every fragment address and copy offset computed once per kernel: the integer pipe was the busiest one.",
    false, true, 80, delta_wide::workspace_bytes, forward};

}  // namespace minilin
