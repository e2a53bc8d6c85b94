// linear v6 (hoisted addressing): v5 with every shared-memory fragment address and every copy offset worked
// out once per kernel (lane_addressing.cuh), so that a fragment load costs one add instead of a chain of
// integer multiplies, shifts and a generic-to-shared conversion, because ncu found v5's one chain per SM
// issuing less than half the time and the integer pipe the busiest one, with ~700 integer PTX instructions
// for ~100 ldmatrix and mma.
#include "chunk_mma_wide.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) { linear_wide::forward<true, true>(p, "linear_v6_chunked_hoisted"); }

}  // namespace

extern const Version linear_v6 = {
    "linear", 6, "chunked_hoisted",
    "v5 with every fragment address and copy offset computed once per kernel: the integer pipe was the busiest one.",
    false, true, 80, nullptr, forward};

}  // namespace minilin
