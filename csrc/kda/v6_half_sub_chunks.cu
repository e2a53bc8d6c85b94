// kda v6 (half sub-chunks): v5 with the diagonal blocks of its prepare taken through 8-token references, because
// those blocks' terms (one exponential per term, entry and channel: 544 entries of 128 channels a chunk) drew ~40% of
// the prepare's samples under ncu, and the prepare is 69% of v4's time at B = 4, T = 8192, H = 16, K = V = 128.
//
// Each 16-token sub-chunk a splits into halves, tokens 0..7 (lo) and 8..15 (hi). Inside a half the entries stay
// term by term (two triangles of 36 entries instead of one of 136); across them, for i in hi and j in lo, the decay
// factors through R_a = Gs at token 7:
//     exp(Gs_i - Gs_j) = exp(Gs_i - R_a) exp(R_a - Gs_j),   both exponents <= 0 (Gs falls along the sub-chunk),
// so the (hi, lo) quarter of P and of A is a product of rescaled rows, QH = q exp(Gs - R_a) and KH = k exp(Gs - R_a)
// of the hi tokens against KL = k exp(R_a - Gs) of the lo tokens, on tensor cores like the blocks below the
// diagonal (two sub-chunks per 16 x 16 product, its off-diagonal quadrants discarded). A factor that underflows
// stands for a decay below exp(-87), whose true product is smaller still. Per 64-channel slice: 288 entries of
// per-term exponentials instead of 544 (18432 exponentials instead of 34816), plus one per token and channel for the
// rescaling (4096); the quarters' operands are rounded to bf16 once, as the pairs' are. The pass over chunks and
// its value block width are v5's; the prepare kernel is v4's with kHalves (kda/v4_sliced_prepare.cu), 107 KB of
// shared memory, still two blocks per SM.
#include "../common/launch.cuh"
#include "prepared_tiles.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  kda_prepared::check_problem(p, "kda_v6_half_sub_chunks");
  const int columns = kda_prepared::value_columns(p, "kda_v6_half_sub_chunks");  // may throw: before any launch
  kda_prepared::launch_sliced_prepare(p, /*halves=*/true);
  kda_prepared::launch_chunks(p, columns);
}

}  // namespace

extern const Version kda_v6 = {
    "kda", 6, "half_sub_chunks",
    "v5 with each diagonal block's (8..15, 0..7) quarter a product of rows rescaled to the sub-chunk's token 7, on "
    "tensor cores: 288 entries of per-term exponentials a chunk instead of 544.",
    false, true, kTensorCoreShape, 90, kda_prepared::prepared_bytes, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
