// delta_bwd v1 (recurrent): the backward of the gated delta rule as the definition run backwards, token by token,
// one block per (batch, head, 32 value columns) with its slice of the state's adjoint in registers; the states the
// backward loop needs are checkpointed every 64 tokens by a forward pass and recomputed chunk by chunk, because the
// update reads the state (S'^T k) and cannot be undone from S_t alone.
//
// The two passes and their derivation are delta_bwd/recurrent_passes.cuh's, here with one decay per head
// (S' = exp(g_t) S_{t-1}, or S' = S_{t-1} without a gate): dg_t = <D', S'>, one number per token, the sum over the
// whole slice (kda_bwd v1 runs the same passes with a decay per key row).
#include "recurrent_passes.cuh"

namespace minilin {
namespace {

void backward(const BackwardProblem& p) {
  delta_recurrent_backward::run_backward<false>(p, "delta_bwd_v1_recurrent", "delta_bwd_v1");
}

}  // namespace

extern const Version delta_bwd_v1 = {
    "delta_bwd", 1, "recurrent",
    "The definition run backwards: states checkpointed every 64 tokens by a forward pass and recomputed chunk by "
    "chunk, the state's adjoint in registers, one block per (batch, head, 32 value columns).",
    true, true, kBackwardKeysUpTo256, 80, delta_recurrent_backward::workspace_bytes<false>, nullptr, 0, nullptr,
    backward};

}  // namespace minilin
