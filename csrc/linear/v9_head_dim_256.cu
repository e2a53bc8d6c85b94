// linear v9 (head dim 256): v7's kernel at K = 256, with a ring of two stages instead of three, because no
// tensor-core version took K = 256 and the default fell back to the token loop v1 there, while models with
// 256-wide heads (FLA benchmarks K = V = 256) are common.
//
// What grows with K, per block of 16 compute warps + the producer (one block per (64 value columns, head,
// sequence), as v7):
//   a stage (q and k rows of 256 + 8, v rows of 64 + 8, G)   75 KB   (K = 128: 43 KB)
//   the bf16 copy of S [256, 64]                             36 KB   (18 KB)
//   the state in registers: 16 row tiles, one warp each, 8 column tiles of 8: 32 floats a thread (16)
// Three stages would take 231 KB of the SM's 227; two take 209 KB, one block per SM as at K = 128. With two
// stages the producer can run only one chunk ahead, which the compute warps' longer chunk (Q K^T, Q S and
// K^T V each twice as deep) leaves it time for.
// The phases are v7's (chunk_mma_wide.cuh): nothing in them is specific to K = 64 or 128; each k loop runs
// K / 16 = 16 steps, and wide::warp_tiles<256> gives every warp one row tile of S of its own.
// Where few (batch, head) pairs leave SMs idle (one long sequence), the chunk pass runs on segments of each
// sequence as v8 splits it (split_forward, v8_split_sequence.cu: the same cost model, the correction at K = 256).
#include "chunk_producer.cuh"
#include "split_sequence.cuh"

namespace minilin {

namespace linear_split {  // v8_split_sequence.cu: v8's choice of P (v7's cost model), and its workspace
int choose_segments(int B, int T, int H, int K, int V);
size_t workspace_bytes(int B, int T, int H, int K, int V, bool packed);
}  // namespace linear_split

namespace linear_producer {

namespace {
constexpr const char* kName = "linear_v9_head_dim_256";

// One chunk pass at K = 256 over p's sequences (v8's split calls it on the segments' view).
void chunk_pass_256(const Problem& p) {
  launch_checked(p, kName, linear_chunked_producer_warp<256>, dim3(p.V / kBlockV, p.H, p.B), kThreads,
                 Layout<256>::kBytes);
}

void forward_head_dim_256(const Problem& p) {
  check_common(p, kName, false);
  require_head_dim_256_shape(kName, p.dtype, p.K, p.V, kBlockV, "v7 and v8");
  linear_split::split_forward(p, kName, chunk_pass_256, linear_split::choose_segments(p.B, p.T, p.H, p.K, p.V));
}
}  // namespace

int resident_blocks_per_sm_256() {
  return resident_blocks(linear_chunked_producer_warp<256>, kThreads, Layout<256>::kBytes, kName);
}

}  // namespace linear_producer

extern const Version linear_v9 = {
    "linear", 9, "head_dim_256",
    "v7's kernel at K = 256 with a 2-stage ring (three stages would need 231 KB of shared memory), split over segments of long sequences as v8 splits them: no tensor-core version took K = 256, so the default ran the token loop there.",
    false, true, kTensorCoreShape256, 90, linear_split::workspace_bytes, linear_producer::forward_head_dim_256, 0,
    nullptr, nullptr, kReadsPacked};

}  // namespace minilin
