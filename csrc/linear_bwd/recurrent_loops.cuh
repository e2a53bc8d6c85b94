// The two token loops of the recurrent backward of S_t = diag(a_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t (q already
// multiplied by scale), shared by linear_bwd v1 (a_t = exp(g_t) the same for every key row, or 1 without a gate)
// and gla_bwd v1 (a_t = exp(g_t), one decay per key row: GLA's per-channel gate). Each loop is one block per
// (batch, head, 32 value columns), lane l holding key rows l, l + 32, ... of its warp's 8 columns of the state (or
// of its adjoint) in registers (common/backward.cuh). With D_t = dL/dS_t:
//     forward loop:   S_t = diag(a_t) S_{t-1} + k_t v_t^T,    dq_t = S_t do_t
//     backward loop:  D_t = diag(a_{t+1}) D_{t+1} + q_t do_t^T (D_{T-1} = dht + q_{T-1} do_{T-1}^T),
//                     dk_t = D_t v_t,  dv_t = D_t^T k_t,  dh0 = diag(a_0) D_0
// dq_t and dk_t sum over value columns, so each block writes its 32 columns' part to a workspace slice and the
// callers add the slices (sum_value_blocks). The forward loop also leaves <dht, S_T>'s part for the gate's
// gradient: its sum over the block's columns (one number per (batch, head)) for a scalar gate, per key row for a
// per-channel one.
#pragma once

#include <string>
#include <type_traits>

#include "../common/backward.cuh"

namespace minilin {
namespace recurrent_backward {

constexpr int kThreads = kBwdWarps * 32;
constexpr int kColumns = kBwdColumnsPerWarp;

// Forward loop: the states again, dq_t = S_t do_t (this block's columns), and this block's part of <dht, S_T>:
// final_parts[value block][B, H] (scalar gate) or [value block][B, H, K] (per channel), written when g and dht are
// given.
template <typename Elem, int ROWS, bool kPerChannel>
__global__ void __launch_bounds__(kThreads) dq_loop(const BackwardProblem p, float* dq_parts, float* final_parts) {
  __shared__ float rows[kBwdWarps][kBwdMaxK];
  const int vb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, col0 = vb * kBwdBlockColumns + warp * kColumns;
  const long long head = (static_cast<long long>(b) * p.H + h) * p.K * p.V;
  float* dq_part = dq_parts + static_cast<long long>(vb) * p.B * p.T * p.H * p.K;

  float S[ROWS][kColumns];
  load_slice(S, p.h0 ? p.h0 + head : nullptr, p.K, p.V, lane, col0);
  for (int t = 0; t < p.T; ++t) {
    const long long bth = token_index(p, b, t, h);
    float a[ROWS], kr[ROWS], vc[kColumns], dc[kColumns];
    row_decays<kPerChannel>(a, p, bth, lane);
    load_rows<Elem, ROWS>(kr, p.k, bth, p.K, lane, 1.0f);
    load_columns<Elem>(vc, p.v, bth, p.V, col0);
    load_columns<Elem>(dc, p.do_, bth, p.V, col0);
    float dq[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      dq[r] = 0.0f;
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        S[r][c] = fmaf(a[r], S[r][c], kr[r] * vc[c]);  // S_t = diag(a_t) S_{t-1} + k_t v_t^T
        dq[r] = fmaf(S[r][c], dc[c], dq[r]);            // (S_t do_t)_r over this warp's columns
      }
    }
    block_sum_rows(dq, rows, dq_part + bth * p.K, p.K);
  }
  if (!p.g || !p.dht) return;
  float D[ROWS][kColumns];  // <dht, S_T> over this block's columns, for dg's last term
  load_slice(D, p.dht + head, p.K, p.V, lane, col0);
  const long long bh = static_cast<long long>(vb) * p.B * p.H + static_cast<long long>(b) * p.H + h;
  if constexpr (kPerChannel) {  // per key row
    float part[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      part[r] = 0.0f;
#pragma unroll
      for (int c = 0; c < kColumns; ++c) part[r] = fmaf(D[r][c], S[r][c], part[r]);
    }
    block_sum_rows(part, rows, final_parts + bh * p.K, p.K);
  } else {  // one number
    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int c = 0; c < kColumns; ++c) part = fmaf(D[r][c], S[r][c], part);
    part = warp_sum(part);
    if (lane == 0) rows[warp][0] = part;
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.0f;
      for (int w = 0; w < kBwdWarps; ++w) sum += rows[w][0];
      final_parts[bh] = sum;
    }
  }
}

// Backward loop: D from dht, dk_t = D_t v_t (this block's columns), dv_t = D_t^T k_t, dh0.
template <typename Elem, int ROWS, bool kPerChannel>
__global__ void __launch_bounds__(kThreads) dkv_loop(const BackwardProblem p, float* dk_parts) {
  __shared__ float rows[kBwdWarps][kBwdMaxK];
  const int vb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, col0 = vb * kBwdBlockColumns + warp * kColumns;
  const long long head = (static_cast<long long>(b) * p.H + h) * p.K * p.V;
  float* dk_part = dk_parts + static_cast<long long>(vb) * p.B * p.T * p.H * p.K;

  float D[ROWS][kColumns];
  load_slice(D, p.dht ? p.dht + head : nullptr, p.K, p.V, lane, col0);
  for (int t = p.T - 1; t >= 0; --t) {
    const long long bth = token_index(p, b, t, h);
    float a[ROWS], qr[ROWS], kr[ROWS], vc[kColumns], dc[kColumns];
    row_decays<kPerChannel>(a, p, bth, lane);
    load_rows<Elem, ROWS>(qr, p.q, bth, p.K, lane, p.scale);
    load_rows<Elem, ROWS>(kr, p.k, bth, p.K, lane, 1.0f);
    load_columns<Elem>(vc, p.v, bth, p.V, col0);
    load_columns<Elem>(dc, p.do_, bth, p.V, col0);
    float dk[ROWS], dv[kColumns];
#pragma unroll
    for (int c = 0; c < kColumns; ++c) dv[c] = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      dk[r] = 0.0f;
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        D[r][c] = fmaf(qr[r], dc[c], D[r][c]);  // D_t = (what came from t + 1) + q_t do_t^T
        dk[r] = fmaf(D[r][c], vc[c], dk[r]);    // (D_t v_t)_r over this warp's columns
        dv[c] = fmaf(D[r][c], kr[r], dv[c]);    // (D_t^T k_t)_c over this lane's rows
      }
    }
    const float dv_sum = transpose_reduce<kColumns>(dv);  // column (lane >> 2) & 7, in lanes 4c .. 4c + 3
    const int c_mine = transpose_reduce_index<kColumns>(lane);
    if ((lane & 3) == 0 && col0 + c_mine < p.V) static_cast<Elem*>(p.dv)[bth * p.V + col0 + c_mine] = from_float<Elem>(dv_sum);
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int c = 0; c < kColumns; ++c) D[r][c] *= a[r];  // what reaches S_{t-1}: diag(a_t) D_t
    block_sum_rows(dk, rows, dk_part + bth * p.K, p.K);
  }
  if (p.dh0) store_slice(D, p.dh0 + head, p.K, p.V, lane, col0);
}

// Both loops over grid (value blocks, H, B), ROWS = ceil(K / 32) register rows per lane.
template <typename Elem, bool kPerChannel>
void launch_loops(const BackwardProblem& p, const char* dq_name, const char* dkv_name, float* dq_parts,
                  float* dk_parts, float* final_parts) {
  const dim3 grid(bwd_value_blocks(p.V), p.H, p.B);
  const auto both = [&](auto rows) {
    constexpr int ROWS = decltype(rows)::value;
    launch_checked(p, dq_name, dq_loop<Elem, ROWS, kPerChannel>, grid, kThreads, 0, dq_parts, final_parts);
    launch_checked(p, dkv_name, dkv_loop<Elem, ROWS, kPerChannel>, grid, kThreads, 0, dk_parts);
  };
  if (p.K <= 32) both(std::integral_constant<int, 1>{});
  else if (p.K <= 64) both(std::integral_constant<int, 2>{});
  else if (p.K <= 128) both(std::integral_constant<int, 4>{});
  else both(std::integral_constant<int, 8>{});
}

// The workspace both versions carve: dq's and dk's parts [value blocks][B, T, H, K], then <dht, S_T>'s parts
// [value blocks][B, H] (scalar gate) or [value blocks][B, H, K] (per channel).
template <bool kPerChannel>
size_t workspace_bytes(int B, int T, int H, int K, int V, bool) {
  const size_t blocks = bwd_value_blocks(V);
  return (2 * blocks * B * T * H * K + blocks * B * H * (kPerChannel ? K : 1)) * sizeof(float);
}

struct Parts {
  float* dq;
  float* dk;
  float* final_state;  // <dht, S_T>'s
};

// The loops and the sums both versions run before their gate's kernel: the workspace carved as workspace_bytes
// says, both loops, then dq and dk from their parts (dL/dq = scale dL/d(scale q)); the kernels are named
// `version` + "_dq", "_dkv", "_sum_dq", "_sum_dk". Returns the parts, which the gate's kernel reads again.
template <typename Elem, bool kPerChannel>
Parts launch_loops_and_sums(const BackwardProblem& p, const std::string& version) {
  const long long count = static_cast<long long>(p.B) * p.T * p.H * p.K;
  float* dq = static_cast<float*>(p.workspace);
  const Parts parts{dq, dq + bwd_value_blocks(p.V) * count, dq + 2 * bwd_value_blocks(p.V) * count};
  launch_loops<Elem, kPerChannel>(p, (version + "_dq").c_str(), (version + "_dkv").c_str(), parts.dq, parts.dk,
                                  parts.final_state);
  launch_sum_value_blocks<Elem>(p, (version + "_sum_dq").c_str(), parts.dq, p.dq, count, p.scale);
  launch_sum_value_blocks<Elem>(p, (version + "_sum_dk").c_str(), parts.dk, p.dk, count, 1.0f);
  return parts;
}

}  // namespace recurrent_backward
}  // namespace minilin
