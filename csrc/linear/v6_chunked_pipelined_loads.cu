// linear v6 (pipelined fragment loads): v5 with every k loop loading the fragments of step s + 1 into a
// second register set before the mma of step s issue, and the diagonal test of Q K^T taken outside the
// loop, because ncu's source view of v5 showed ptxas issuing each step's ldmatrix right before the mma
// that needs it: every mma waited out the shared-memory latency (~20% of the kernel's stall samples).
// Measured on the H200: within 2% either way, inside the machine's run-to-run noise (csrc/NOTES.md):
// with four warps per scheduler the other warps had been hiding most of that wait already.
#include "chunk_mma_wide.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) { linear_wide::forward<Loads::kFusedPipelined>(p, "linear_v6_chunked_pipelined_loads"); }

}  // namespace

extern const Version linear_v6 = {
    "linear", 6, "chunked_pipelined_loads",
    "v5 with every k loop loading step s + 1's fragments before step s's mma: v5's mma each waited on the ldmatrix issued just before it.",
    false, true, kTensorCoreShape, 80, nullptr, forward};

}  // namespace minilin
