// kda v8 (two state copies): v7 with two bf16 copies of the state S in shared memory, because v7's pass over chunks
// still waits at four barriers a chunk and one of them exists only to keep the copy of S that the chunk's first
// products read from being overwritten while a slower warp still reads it: chunk n reads copy n % 2 and writes S's
// update into the other copy, which every warp finished reading in chunk n - 1, before the barrier that opens chunk
// n. That opening barrier also says every warp is past chunk n - 1, so the next chunk's tiles are copied into the
// other stage right after it instead of before it (still one whole chunk ahead). Three barriers a chunk instead of
// four, 18 KB more shared memory at K = 128 (211 KB a block at 64 value columns). The products and their order are
// v7's, so outputs equal v7's (and v6's) bit for bit (a test checks it); the prepare and the workspace are v6's.
#include "../common/launch.cuh"
#include "prepared_tiles.cuh"

namespace minilin {
namespace {

void forward(const Problem& p) {
  kda_prepared::check_problem(p, "kda_v8_two_state_copies");
  const int columns = kda_prepared::value_columns(p, "kda_v8_two_state_copies");  // may throw: before any launch
  kda_prepared::launch_sliced_prepare(p, /*halves=*/true);
  kda_prepared::launch_chunks(p, columns, /*rung=*/8);
}

}  // namespace

extern const Version kda_v8 = {
    "kda", 8, "two_state_copies",
    "v7 with two bf16 copies of S in shared memory, chunk n reading one and writing the next, so the barrier that "
    "guarded the single copy goes: three barriers a chunk instead of four.",
    false, true, kTensorCoreShape, 90, kda_prepared::prepared_bytes, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
