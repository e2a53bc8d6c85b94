// gla_bwd v1 (recurrent): the backward of GLA's S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t (q already
// multiplied by scale; g_t [K], one log-decay per key channel), as linear_bwd v1's two token loops with a decay per
// key row (linear_bwd/recurrent_loops.cuh), because the adjoint's recursion D_{t-1} = diag(exp(g_t)) D_t +
// q_{t-1} do_{t-1}^T is the forward recursion run the other way, whatever the decay.
//
// The gate's gradient, channel by channel. With G_t = g_0 + ... + g_t (per channel f) and h0 the initial state,
// row f of S_t (the state after token t) is
//     S_t[f, :] = sum_{s <= t} exp(G_t[f] - G_s[f]) k_s[f] v_s + exp(G_t[f]) h0[f, :]
// so G_t[f] enters o_t only through row f of S_t (with a plus sign) and every later o_t' through row f of the
// writes of token t (with a minus sign). Treating each G_t[f] as its own variable:
//     dL/dG_t[f] = q_t[f] dq_t[f] - k_t[f] dk_t[f]   (+ <dht[f, :], S_{T-1}[f, :]> at t = T - 1, the final state's)
// with dq_t = S_t do_t and dk_t = D_t v_t as the loops compute them (for the scaled q), and since G_t sums g_0..g_t,
//     dg_t[f] = sum_{s >= t} (q_s[f] dq_s[f] - k_s[f] dk_s[f]) + <dht[f, :], S_{T-1}[f, :]>
// (the last term written <dht, S_T> below, S_T the final state, as linear_bwd v1 writes it)
// linear_bwd v1's reverse cumulative sum, kept per channel instead of summed over channels. No difference of
// exponentials is formed, so gates down to -20 cost no precision here.
//
// Workspace (recurrent_loops.cuh): dq's and dk's parts [value blocks][B, T, H, K] (float32) and the per-row parts of
// <dht, S_T> [value blocks][B, H, K]; sum_value_blocks adds the parts into dq and dk, and the gate kernel adds them
// again (in float32, as the stored dq and dk may be bf16) for its per-token terms.
#include "../linear_bwd/recurrent_loops.cuh"

namespace minilin {
namespace {

constexpr int kGateChannels = 32;  // channels of one gate block: a warp's width, so each token's row is one access
constexpr int kGateTokens = 32;    // tokens of one tile, one per thread row

// dg, channel by channel: a block per (32 channels, head, batch) walks the sequence from the end, 32 tokens a tile,
// thread (x, y) = (tid % 32, tid / 32) forming token t0 + y's term scale q dq' - k dk' (dq', dk' the parts' sums) for
// channel f = 32 blockIdx.x + x; the tile's reverse sums over y from shared memory, plus what the later tiles and
// <dht, S_T> carried.
template <typename Elem>
__global__ void __launch_bounds__(kGateChannels * kGateTokens)
    gla_bwd_v1_gate(const BackwardProblem p, const float* final_parts, const float* dq_parts, const float* dk_parts) {
  __shared__ float terms[kGateTokens][kGateChannels + 1];
  const long long count = static_cast<long long>(p.B) * p.T * p.H * p.K;
  const int slices = bwd_value_blocks(p.V);
  const int x = threadIdx.x % kGateChannels, y = threadIdx.x / kGateChannels;
  const int f = blockIdx.x * kGateChannels + x, h = blockIdx.y, b = blockIdx.z;
  const bool live = f < p.K;
  float carry = 0.0f;  // the sum over the tokens after this tile, plus <dht[f, :], S_T[f, :]>
  if (p.dht && live)
    for (int vb = 0; vb < slices; ++vb)
      carry += final_parts[((static_cast<long long>(vb) * p.B + b) * p.H + h) * p.K + f];
  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  for (int t0 = ((p.T - 1) / kGateTokens) * kGateTokens; t0 >= 0; t0 -= kGateTokens) {
    const int t = t0 + y;
    float term = 0.0f;
    if (t < p.T && live) {
      const long long i = token_index(p, b, t, h) * p.K + f;
      float dq = 0.0f, dk = 0.0f;
      for (int s = 0; s < slices; ++s) dq += dq_parts[s * count + i], dk += dk_parts[s * count + i];
      term = p.scale * to_float(q[i]) * dq - to_float(k[i]) * dk;  // dq = scale (dq's parts)
    }
    terms[y][x] = term;
    __syncthreads();
    float later = 0.0f, tile = 0.0f;  // this tile's terms at tokens >= t, and all of them
#pragma unroll 8
    for (int z = 0; z < kGateTokens; ++z) {
      const float u = terms[z][x];
      tile += u;
      if (z >= y) later += u;
    }
    if (t < p.T && live) p.dg[token_index(p, b, t, h) * p.K + f] = later + carry;
    carry += tile;
    __syncthreads();  // terms is written again by the next tile
  }
}

void backward(const BackwardProblem& p) {
  constexpr const char* name = "gla_bwd_v1_recurrent";
  check_backward_problem(p, name, false, recurrent_backward::workspace_bytes<true>(p.B, p.T, p.H, p.K, p.V, false));
  require_channel_gate(p, name);
  const auto run = [&](auto elem) {
    using Elem = decltype(elem);
    const auto parts = recurrent_backward::launch_loops_and_sums<Elem, true>(p, "gla_bwd_v1");
    launch_checked(p, "gla_bwd_v1_gate", gla_bwd_v1_gate<Elem>,
                   dim3((p.K + kGateChannels - 1) / kGateChannels, p.H, p.B), kGateChannels * kGateTokens, 0,
                   parts.final_state, parts.dq, parts.dk);
  };
  if (p.dtype == kFloat32) run(float{});
  else run(__nv_bfloat16{});
}

}  // namespace

extern const Version gla_bwd_v1 = {
    "gla_bwd", 1, "recurrent",
    "linear_bwd v1's two token loops with one decay per key row (GLA's per-channel gate); dg per channel, a reverse "
    "cumulative sum of q . dq - k . dk kept channel by channel.",
    true, true, kBackwardKeysUpTo256, 80, recurrent_backward::workspace_bytes<true>, nullptr, 0, nullptr,
    backward};

}  // namespace minilin
