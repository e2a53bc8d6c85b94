// linear v7 (producer warp): v6's 16 compute warps plus one warp that only loads, copying each chunk's q, k
// and v into a ring of three stages guarded by mbarriers and scanning the chunk's gate once for all, because
// ncu's source view of v5 put ~21% of the stall samples on the first barrier and the cp.async issue (~190
// instructions per warp and chunk) and 5% on the gate's scan, which each of the 16 warps repeated.
// Measured on the H200: 7-9% faster than v6 (call time, same run: 0.443 vs 0.476 ms at T = 8192, 1.597 vs
// 1.746 at 32768). The producer must keep up for that: it reads the next chunk's gates ahead and walks its
// copies by stepped pointers; the same copies issued with index math behind a blocking gate load gained ~1%
// (csrc/NOTES.md). It is the Hopper producer/consumer pattern in its smallest form.
//
// Per chunk n (stage n % 3, its barriers waited with parity (n / 3) & 1):
//   producer warp:  wait on the stage's `empty` barrier; cp.async q, k and v (each lane's copies arrive on
//                   `full` when they land); G = cumsum(g) into the stage; lane 0 arrives on `full`
//   compute warps:  wait on `full`; v6's two phases (chunk_mma_wide.cuh) after each of two named barriers
//                   over the 16 compute warps; each warp arrives on `empty` when done with the stage
// Copying each row with one Hopper bulk copy instead (cp.async.bulk, 192 per chunk) is 2x slower than v6:
// the copy engine takes ~7 us a chunk for requests of 128-256 bytes.
// The compute warps take their tiles from compute_warp_tiles (producer.cuh), which leaves the producer's
// sub-partition one of the ten warps that also form Q K^T instead of four: 7% faster again (device time,
// same-run A/B: 0.374 vs 0.403 ms at T = 8192, outputs bit-identical).
// One block per (value block, head, sequence); packed sequences and grouped value heads are read in place, every
// token row and q/k head taken from common/sequences.cuh.
#include "chunk_producer.cuh"

namespace minilin {
namespace linear_producer {

void forward(const Problem& p) {
  const std::string name = "linear_v7_chunked_producer_warp";
  linear_wide::check_problem(p, name);
  launch_per_value_block(p, name.c_str(), kBlockV, kThreads, linear_chunked_producer_warp<64>, Layout<64>::kBytes,
                         linear_chunked_producer_warp<128>, Layout<128>::kBytes);
}

int resident_blocks_per_sm_256();  // v9_head_dim_256.cu: the K = 256 instance lives there

// Blocks of this kernel that one SM holds at once, at K = 64, 128 or 256 (linear v8 and v9 size their split by it).
int resident_blocks_per_sm(int K) {
  if (K == 256) return resident_blocks_per_sm_256();
  const auto kernel = K == 64 ? linear_chunked_producer_warp<64> : linear_chunked_producer_warp<128>;
  const size_t smem = K == 64 ? Layout<64>::kBytes : Layout<128>::kBytes;
  const char* name = "linear_v7_chunked_producer_warp";
  return resident_blocks(kernel, kThreads, smem, name);
}

}  // namespace linear_producer

extern const Version linear_v7 = {
    "linear", 7, "chunked_producer_warp",
    "v6 plus one warp that only loads (cp.async into a 3-stage ring guarded by mbarriers) and scans the gate: v5's profile had ~25% of its stalls on load issue, the first barrier and 16 copies of the scan. 7-9% faster than v6 on an H200, and 7% more with its tiles placed to spare the producer's sub-partition.",
    false, true, kTensorCoreShape, 90, nullptr, linear_producer::forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
