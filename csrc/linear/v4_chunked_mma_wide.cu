// linear v4 (chunked, tensor cores, wide): v3 with 16 warps per block instead of 8, two barriers per chunk
// instead of four (each warp scans the gate itself, and Q S moves into the first phase beside P), and
// tensor-core loops unrolled at compile time, because v3 measured ~9000 cycles per chunk for ~1000 cycles of
// tensor-core issue: with one block of 8 warps per SM it waits on latencies and barriers, not on the units.
//
// The chunk kernel, shared with v5 and v6 (and its phases with v7), is in chunk_mma_wide.cuh.
#include "chunk_mma_wide.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) { linear_wide::forward<Loads::kPerProduct>(p, "linear_v4_chunked_mma_wide"); }

}  // namespace

extern const Version linear_v4 = {
    "linear", 4, "chunked_mma_wide",
    "v3 with 16 warps per block, two barriers per chunk instead of four and unrolled tensor-core loops: v3 waits on latency, not on the tensor cores.",
    false, true, kTensorCoreShape, 80, nullptr, forward};

}  // namespace minilin
