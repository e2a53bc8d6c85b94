// delta v4 (chunked WY, tensor cores, wide): v3 with 16 warps per block instead of 8, three barriers per
// chunk instead of five (each warp scans the gate itself; Q S and K S both move into the first phase beside
// P), and tensor-core loops unrolled at compile time, because v3 is bound by latencies and barriers along
// its chain K S -> X -> T X -> (O, S), not by the tensor cores.
//
// The WY step T = (I + A)^-1 runs first for all chunks in parallel, as in v3 (wy_prepare.cuh); the chunk
// kernel, shared with v5 - v7 (and its phases with v8 and v9), is in chunk_wy_mma_wide.cuh.
#include "chunk_wy_mma_wide.cuh"
#include "wy_prepare.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  delta_wide::check_problem(p, "delta_v4_chunked_wy_mma_wide");
  auto* wy = static_cast<__nv_bfloat16*>(p.workspace);
  launch_wy_prepare<__nv_bfloat16, __nv_bfloat16, true>(p, wy, "delta_v4_wy_prepare_mma");
  delta_wide::launch_chunks<Loads::kPerProduct>(p, wy, "delta_v4_chunked_wy_mma_wide");
}

}  // namespace

extern const Version delta_v4 = {
    "delta", 4, "chunked_wy_mma_wide",
    "v3 with 16 warps per block, three barriers per chunk instead of five and unrolled tensor-core loops: v3 waits on latency, not on the tensor cores.",
    false, true, kTensorCoreShape, 80, delta_wide::workspace_bytes, forward};

}  // namespace minilin
