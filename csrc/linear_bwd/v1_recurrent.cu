// linear_bwd v1 (recurrent): the backward of S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t (q already
// multiplied by scale) as two token loops over the definition, one forward and one backward, each one block per
// (batch, head, 32 value columns) with its slice of the state (or of the state's adjoint) in registers, because the
// adjoint recursion is the forward recursion run the other way.
//
// With D_t = dL/dS_t the state's adjoint (L = <do, o> + <dht, S_T>):
//     D_{T-1} = dht + q_{T-1} do_{T-1}^T,   D_{t-1} = exp(g_t) D_t + q_{t-1} do_{t-1}^T,   dh0 = exp(g_0) D_0
//     dq_t = S_t do_t            (forward loop: S_t is what the forward pass holds at token t)
//     dk_t = D_t v_t,  dv_t = D_t^T k_t     (backward loop)
// The gate's gradient needs neither S_{t-1} in the backward loop nor a difference of exponentials: with
// G_t = g_0 + ... + g_t, every term of o_t and S_T that holds exp(G_t - G_s) gives dL/dG_t = q_t . dq_t and
// dL/dG_s = -k_s . dk_s, and <dht, S_T> gives dL/dG_{T-1} += <dht, S_T>, so
//     dg_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s) + <dht, S_T>
// a reverse cumulative sum of per-token terms, which a third kernel forms from dq, dk and <dht, S_T> (each block's
// part of it from the forward loop's last state). So no state is stored for the backward loop; the forward loop
// recomputes the states as it goes.
//
// The two loops are recurrent_loops.cuh's (gla_bwd v1 runs them with a decay per key row). dq_t and dk_t sum over
// value columns: each block writes the part of its 32 columns (its 4 warps added through shared memory) to the
// workspace, and sum_value_blocks adds the blocks' parts (common/backward.cuh). dv_t is complete in each block: its
// reduction runs over the key rows, in the warp (common/device.cuh transpose_reduce).
#include "recurrent_loops.cuh"

namespace minilin {
namespace {

// dg_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s) + <dht, S_T>: one warp per (batch, head), 32 tokens at a time from
// the end, lane l one token (its dot products over K, dq and dk from their float32 parts: the stored ones may be
// bf16), the tile's reverse sums by a scan over lanes.
template <typename Elem>
__global__ void linear_bwd_v1_gate(const BackwardProblem p, const float* final_parts, const float* dq_parts,
                                   const float* dk_parts) {
  const long long count = static_cast<long long>(p.B) * p.T * p.H * p.K;
  const int slices = bwd_value_blocks(p.V);
  const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x;
  float carry = 0.0f;  // the sum over the tokens after this tile, plus <dht, S_T>
  if (p.dht)
    for (int vb = 0; vb < slices; ++vb) carry += final_parts[(static_cast<long long>(vb) * p.B + b) * p.H + h];
  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  for (int t0 = ((p.T - 1) / 32) * 32; t0 >= 0; t0 -= 32) {
    const int t = t0 + lane;
    float x = 0.0f;  // q_t . dq_t - k_t . dk_t
    if (t < p.T) {
      const long long row = token_index(p, b, t, h) * p.K;
      for (int f = 0; f < p.K; ++f) {
        float dq = 0.0f, dk = 0.0f;
        for (int s = 0; s < slices; ++s) dq += dq_parts[s * count + row + f], dk += dk_parts[s * count + row + f];
        x += p.scale * to_float(q[row + f]) * dq - to_float(k[row + f]) * dk;  // dq = scale (dq's parts)
      }
    }
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {  // x = the sum over this tile's tokens t' >= t
      const float y = __shfl_down_sync(kFullMask, x, offset);
      if (lane + offset < 32) x += y;
    }
    if (t < p.T) p.dg[token_index(p, b, t, h)] = x + carry;
    carry += __shfl_sync(kFullMask, x, 0);
  }
}

void backward(const BackwardProblem& p) {
  constexpr const char* name = "linear_bwd_v1_recurrent";
  check_backward_problem(p, name, false, recurrent_backward::workspace_bytes<false>(p.B, p.T, p.H, p.K, p.V, false));
  const auto run = [&](auto elem) {
    using Elem = decltype(elem);
    const auto parts = recurrent_backward::launch_loops_and_sums<Elem, false>(p, "linear_bwd_v1");
    if (p.g)
      launch_checked(p, "linear_bwd_v1_gate", linear_bwd_v1_gate<Elem>, dim3(p.H, p.B), 32, 0, parts.final_state,
                     parts.dq, parts.dk);
  };
  if (p.dtype == kFloat32) run(float{});
  else run(__nv_bfloat16{});
}

}  // namespace

extern const Version linear_bwd_v1 = {
    "linear_bwd", 1, "recurrent",
    "The definition run backwards: a forward token loop for dq, a backward one for the state's adjoint, dk and dv, "
    "one block per (batch, head, 32 value columns); dg a reverse cumulative sum.",
    true, true, kBackwardKeysUpTo256, 80, recurrent_backward::workspace_bytes<false>, nullptr, 0, nullptr, backward};

}  // namespace minilin
