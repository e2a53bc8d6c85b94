// kda v5 (narrow value blocks): v4 with its pass over chunks on blocks of 32 value columns instead of 64 where a
// block of each (sequence, head, 32 columns) fits the card at once, because at one long sequence that pass is most
// of v4's time (1.81 of 2.80 ms at B = 1, T = 32768, H = 16, K = V = 128: 32 blocks, one per (head, 64 columns), on
// a card of 132 SMs, 3.5 us a chunk) and a delta rule's state cannot be split along the sequence as gla v5 splits
// it (a segment's start state would need a K x K transition per segment), while its value columns are independent:
// column j of S, O and Delta depends on column j of V alone. So the same chain per chunk,
//     X = V - Kg S,   Delta = (T diag(beta)) X,   O = scale (Qr S + P Delta),   S <- diag(d) S + Ke^T Delta,
// is taken on half as many columns by each block (each warp's tile 16 x 16 instead of 16 x 32, its slice of S half
// as wide), twice as many blocks running side by side; each block still copies the chunk's whole tiles (Qr, Kg,
// Ke, P, T diag(beta)), which the blocks of one head then read from L2. Where the 32-column blocks would not all be
// resident at once, the 64-column pass runs (v4 itself). Every output element is the same sum in the same order as
// v4's (the mma k-steps do not depend on the tile's width): outputs equal v4's bit for bit (a test checks it).
#include "../common/launch.cuh"
#include "../common/split_segments.cuh"  // split_card: the SM count and resident blocks, asked once per device
#include "prepared_tiles.cuh"

namespace minilin {

int kda_prepared::value_columns(const Problem& p, const char* name) {
  const SplitCard& card = split_card<kda_prepared::narrow_chunks_blocks_per_sm>(name, p.K);
  const long long narrow_blocks = static_cast<long long>(p.B) * p.H * (p.V / 32);
  return narrow_blocks <= static_cast<long long>(card.sms) * card.resident[key_slot(p.K)] ? 32 : 64;
}

namespace {

void forward(const Problem& p) {
  kda_prepared::check_problem(p, "kda_v5_narrow_value_blocks");
  const int columns = kda_prepared::value_columns(p, "kda_v5_narrow_value_blocks");  // may throw: before any launch
  kda_prepared::launch_sliced_prepare(p);
  kda_prepared::launch_chunks(p, columns);
}

}  // namespace

extern const Version kda_v5 = {
    "kda", 5, "narrow_value_blocks",
    "v4 with its pass over chunks on 32 value columns a block instead of 64 where those blocks fit the card at "
    "once: twice the blocks in flight where few (sequence, head) pairs would leave SMs idle; v4 elsewhere.",
    false, true, kTensorCoreShape, 90, kda_prepared::prepared_bytes, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
