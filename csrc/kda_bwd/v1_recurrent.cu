// kda_bwd v1 (recurrent): the backward of Kimi Delta Attention, S' = diag(exp(g_t)) S_{t-1},
// S_t = S' + beta_t k_t (v_t - S'^T k_t)^T, o_t = S_t^T q_t (q already multiplied by scale; g_t [K], one log-decay
// per key channel), as delta_bwd v1's two passes with the decay made a vector (delta_bwd/recurrent_passes.cuh),
// because the adjoint's recursion D_{t-1} = diag(a_t) D' does not care whether the diagonal is constant.
//
// What changes with the decay per key row f: S'^T k = S_{t-1}^T (a * k) and S' du read each row's own a_t[f], and
// the gate's gradient is kept per row instead of summed over the slice,
//     dg_t[f] = sum_c D'[f, c] S'[f, c]
// (a [B, T, H, K] array, reduced over the block's warps and then over value blocks as dq and dk are). No cumulative
// sum of gates is formed: every exponent is one gate, <= 0, so gates down to -20 cost no precision.
//
// Measured (2026-12-07, H100, bf16, B=4, T=2048, H=16, K=V=128, an initial state): forward (kda v8) + this
// backward 12.6 ms, 3.46x FLA's chunk_kda forward + backward (3.66 ms): the definition, not a training kernel.
#include "../delta_bwd/recurrent_passes.cuh"

namespace minilin {
namespace {

void backward(const BackwardProblem& p) {
  delta_recurrent_backward::run_backward<true>(p, "kda_bwd_v1_recurrent", "kda_bwd_v1");
}

}  // namespace

extern const Version kda_bwd_v1 = {
    "kda_bwd", 1, "recurrent",
    "delta_bwd v1's two passes with one decay per key row (Kimi Delta Attention's per-channel gate); dg per channel, "
    "D' . S' kept row by row.",
    true, true, kBackwardKeysUpTo256, 80, delta_recurrent_backward::workspace_bytes<true>, nullptr, 0, nullptr,
    backward};

}  // namespace minilin
