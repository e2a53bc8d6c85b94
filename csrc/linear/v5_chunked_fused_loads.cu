// linear v5 (fused fragment loads): v4 with Q K^T and Q S in one k loop, so that Q's A fragments leave
// shared memory once per chunk instead of twice, because ncu found v4 bound by shared-memory fragment
// traffic (L1 72%, tensor pipe 20%): about 80 of the ~690 ldmatrix per chunk and block go away.
#include "chunk_mma_wide.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) { linear_wide::forward<Loads::kFused>(p, "linear_v5_chunked_fused_loads"); }

}  // namespace

extern const Version linear_v5 = {
    "linear", 5, "chunked_fused_loads",
    "v4 with Q K^T and Q S in one k loop, Q's fragments loaded once: v4 is bound by shared-memory fragment traffic.",
    false, true, kTensorCoreShape, 80, nullptr, forward};

}  // namespace minilin
