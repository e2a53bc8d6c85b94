// kda v7 (output with memory): v6 with the pass over chunks taking Qr S in the same k loop as Kg S, because that
// pass is a chain of dependent products per chunk, one chunk after another (at B = 1, H = 16 on 64 blocks: the
// part that does not shrink as the card grows) and v6 ran Qr S after Delta, on the chain's critical path, although
// it needs only S:
//     v6:  [Kg S] -> X -> [T diag(beta) X] -> Delta -> [Qr S, then P Delta] -> O,   [Ke^T Delta] -> S
//     v7:  [Kg S beside Qr S] -> X -> [T diag(beta) X] -> Delta -> [P Delta beside Ke^T Delta] -> O, S
// Each S fragment now leaves shared memory once for both products, the two accumulators' mma alternate (neither
// waits on its own previous k-step), and the chunk's last two products run in unrolled loops the compiler may
// interleave: 8 dependent k-steps fewer per chunk at K = 128. Every output element is the same sum in the same
// order as v6's, so outputs equal v6's bit for bit (a test checks it); the prepare and the workspace are v6's.
#include "../common/launch.cuh"
#include "prepared_tiles.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  kda_prepared::check_problem(p, "kda_v7_output_with_memory");
  const int columns = kda_prepared::value_columns(p, "kda_v7_output_with_memory");  // may throw: before any launch
  kda_prepared::launch_sliced_prepare(p, /*halves=*/true);
  kda_prepared::launch_chunks(p, columns, /*rung=*/7);
}

}  // namespace

extern const Version kda_v7 = {
    "kda", 7, "output_with_memory",
    "v6 with the pass over chunks taking Qr S in Kg S's k loop (each S fragment read once for both) instead of after "
    "Delta, and P Delta beside Ke^T Delta: 8 dependent k-steps fewer per chunk at K = 128.",
    false, true, kTensorCoreShape, 90, kda_prepared::prepared_bytes, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
