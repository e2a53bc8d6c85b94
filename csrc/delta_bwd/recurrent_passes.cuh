// The two passes of the recurrent backward of the delta rule with a decay, shared by delta_bwd v1 (a_t = exp(g_t)
// the same for every key row, or 1 without a gate: DeltaNet, Gated DeltaNet) and kda_bwd v1 (a_t = exp(g_t), one
// decay per key row: Kimi Delta Attention), because the adjoint's recursion is the same once the decay is a
// diagonal matrix.
//
// Forward, per token (S' = diag(a_t) S_{t-1}, q already multiplied by scale):
//     p = S'^T k,   u = beta (v - p),   S_t = S' + k u^T,   o_t = S_t^T q
// Backward, with D = dL/dS_t (L = <do, o> + <dht, S_T>), D first gaining q_t do_t^T:
//     du = D^T k                       dv_t = beta du          dbeta_t = du . (v - p)
//     dq_t = S_t do_t                  dk_t = D u - beta S' du
//     D' = dL/dS' = D - beta k du^T    D_{t-1} = diag(a_t) D'
// and dh0 = diag(a_0) D'_0. The gate's gradient, since S' = diag(exp(g_t)) S_{t-1}:
//     dg_t[f] = sum_c D'[f, c] S'[f, c]    (per key row f: kda_bwd)      dg_t = <D', S'>    (one gate: delta_bwd)
// Gates enter only through a_t <= 1 and D' . S': no exponential of a positive number, no difference of large ones.
//
// Kernels: checkpoints runs the forward loop and writes the state entering every chunk of kCheckpointTokens tokens
// ([B, H, chunks, K, V] in the workspace). reverse walks the chunks from the last: it reloads the chunk's entering
// state, runs the chunk forward once more, keeping each token's S_{t-1} in its block's slice of the workspace (each
// thread reads back exactly what it wrote, so no barrier is needed), then walks the chunk backwards. Gradients that
// sum over value columns (dq, dk, dbeta, dg) are reduced over the block's 4 warps through shared memory, written per
// value block and added by sum_value_blocks (common/backward.cuh). The states are checkpointed rather than undone
// because the update reads the state (S'^T k) and cannot be inverted from S_t alone.
#pragma once

#include <string>

#include "../common/backward.cuh"

namespace minilin {
namespace delta_recurrent_backward {

constexpr int kThreads = kBwdWarps * 32;
constexpr int kColumns = kBwdColumnsPerWarp;
constexpr int kCheckpointTokens = 64;

inline int rows_for(int K) { return K <= 32 ? 1 : K <= 64 ? 2 : K <= 128 ? 4 : 8; }  // register rows per lane

// The workspace, carved in this order: checkpoints [B, H, chunks, K, V]; each block's recomputed states
// [chunk tokens][ROWS * 8 values][128 threads]; the parts of dq and dk [value blocks][B, T, H, K]; of dbeta
// [value blocks][B, T, H]; of dg [value blocks][B, T, H] (one gate) or [value blocks][B, T, H, K] (per channel).
struct Workspace {
  float* checkpoints;
  float* states;
  float* dq_parts;
  float* dk_parts;
  float* dbeta_parts;
  float* dg_parts;
};

// The sizes of the workspace's parts, in floats, in carving order.
struct WorkspaceSizes {
  size_t checkpoints, states, dq_parts, dk_parts, dbeta_parts, dg_parts;
  size_t total() const { return checkpoints + states + dq_parts + dk_parts + dbeta_parts + dg_parts; }
};

template <bool kPerChannel>
WorkspaceSizes sizes(int B, int T, int H, int K, int V) {
  const size_t chunks = ceil_div(T, kCheckpointTokens), slices = bwd_value_blocks(V);
  const size_t blocks = slices * H * B, tokens = static_cast<size_t>(B) * T * H;
  return {static_cast<size_t>(B) * H * chunks * K * V, blocks * kCheckpointTokens * rows_for(K) * kColumns * kThreads,
          slices * tokens * K, slices * tokens * K, slices * tokens, slices * tokens * (kPerChannel ? K : 1)};
}

template <bool kPerChannel>
Workspace carve(void* base, int B, int T, int H, int K, int V) {
  const WorkspaceSizes n = sizes<kPerChannel>(B, T, H, K, V);
  Workspace w;
  w.checkpoints = static_cast<float*>(base);
  w.states = w.checkpoints + n.checkpoints;
  w.dq_parts = w.states + n.states;
  w.dk_parts = w.dq_parts + n.dq_parts;
  w.dbeta_parts = w.dk_parts + n.dk_parts;
  w.dg_parts = w.dbeta_parts + n.dbeta_parts;
  return w;
}

template <bool kPerChannel>
size_t workspace_bytes(int B, int T, int H, int K, int V, bool) {
  return sizes<kPerChannel>(B, T, H, K, V).total() * sizeof(float);
}

// One forward token on the block's slice: S <- S' + k u^T with u = beta (v - S'^T k), S' = diag(a) S, and
// S'^T k = S^T (a * k) taken from the state before the decay.
template <typename Elem, int ROWS, bool kPerChannel>
__device__ __forceinline__ void forward_token(float (&S)[ROWS][kColumns], const BackwardProblem& p, long long bth,
                                              int lane, int col0) {
  const float beta = p.beta[bth];
  float a[ROWS], kr[ROWS], ka[ROWS], vc[kColumns], part[kColumns];
  row_decays<kPerChannel>(a, p, bth, lane);
  load_rows<Elem, ROWS>(kr, p.k, bth, p.K, lane, 1.0f);
  load_columns<Elem>(vc, p.v, bth, p.V, col0);
#pragma unroll
  for (int r = 0; r < ROWS; ++r) ka[r] = a[r] * kr[r];
#pragma unroll
  for (int c = 0; c < kColumns; ++c) {
    part[c] = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) part[c] = fmaf(S[r][c], ka[r], part[c]);
  }
  const float Sk = transpose_reduce<kColumns>(part);  // (S'^T k) of column (lane >> 2) & 7, in lanes 4c .. 4c + 3
  float u[kColumns];
#pragma unroll
  for (int c = 0; c < kColumns; ++c) u[c] = beta * (vc[c] - __shfl_sync(kFullMask, Sk, 4 * c));
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int c = 0; c < kColumns; ++c) S[r][c] = fmaf(a[r], S[r][c], kr[r] * u[c]);
}

template <typename Elem, int ROWS, bool kPerChannel>
__global__ void __launch_bounds__(kThreads) checkpoints(const BackwardProblem p, const Workspace w) {
  const int vb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, col0 = vb * kBwdBlockColumns + warp * kColumns;
  const long long head = static_cast<long long>(b) * p.H + h, KV = static_cast<long long>(p.K) * p.V;
  const int chunks = ceil_div(p.T, kCheckpointTokens);
  float S[ROWS][kColumns];
  load_slice(S, p.h0 ? p.h0 + head * KV : nullptr, p.K, p.V, lane, col0);
  for (int t = 0; t < p.T; ++t) {
    if (t % kCheckpointTokens == 0)
      store_slice(S, w.checkpoints + (head * chunks + t / kCheckpointTokens) * KV, p.K, p.V, lane, col0);
    forward_token<Elem, ROWS, kPerChannel>(S, p, token_index(p, b, t, h), lane, col0);
  }
}

template <typename Elem, int ROWS, bool kPerChannel>
__global__ void __launch_bounds__(kThreads) reverse(const BackwardProblem p, const Workspace w) {
  constexpr int kRowSums = kPerChannel ? 3 : 2;    // dq, dk (and dg per key row)
  __shared__ float rows[kRowSums][kBwdWarps][kBwdMaxK];  // per warp: its parts of this token's row gradients
  __shared__ float scalars[kBwdWarps][kPerChannel ? 1 : 2];  // per warp: dbeta's part (and dg's, for one gate)
  const int vb = blockIdx.x, h = blockIdx.y, b = blockIdx.z, slices = gridDim.x;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, col0 = vb * kBwdBlockColumns + warp * kColumns;
  const int K = p.K, V = p.V;
  const long long head = static_cast<long long>(b) * p.H + h, KV = static_cast<long long>(K) * V;
  const long long tokens = static_cast<long long>(p.B) * p.T * p.H;
  const int chunks = ceil_div(p.T, kCheckpointTokens);
  // This thread's recomputed states: value e of token j of the chunk at states[(j * ROWS * 8 + e) * 128 + tid].
  float* states = w.states + ((head * slices + vb) * kCheckpointTokens) * ROWS * kColumns * kThreads;
  float* dq_part = w.dq_parts + vb * tokens * K;
  float* dk_part = w.dk_parts + vb * tokens * K;
  float* dbeta_part = w.dbeta_parts + vb * tokens;
  float* dg_part = w.dg_parts + vb * tokens * (kPerChannel ? K : 1);

  float D[ROWS][kColumns], S[ROWS][kColumns];
  load_slice(D, p.dht ? p.dht + head * KV : nullptr, K, V, lane, col0);
  for (int n = chunks - 1; n >= 0; --n) {
    const int t0 = n * kCheckpointTokens, t1 = min(p.T, t0 + kCheckpointTokens);
    load_slice(S, w.checkpoints + (head * chunks + n) * KV, K, V, lane, col0);
    for (int t = t0; t < t1; ++t) {  // the chunk forward again, keeping S_{t-1} for every token
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < kColumns; ++c) states[((t - t0) * ROWS * kColumns + r * kColumns + c) * kThreads + tid] = S[r][c];
      forward_token<Elem, ROWS, kPerChannel>(S, p, token_index(p, b, t, h), lane, col0);
    }
    for (int t = t1 - 1; t >= t0; --t) {
      const long long bth = token_index(p, b, t, h);
      const float beta = p.beta[bth];
      float a[ROWS], qr[ROWS], kr[ROWS], ka[ROWS], vc[kColumns], dc[kColumns];
      row_decays<kPerChannel>(a, p, bth, lane);
      load_rows<Elem, ROWS>(qr, p.q, bth, K, lane, p.scale);
      load_rows<Elem, ROWS>(kr, p.k, bth, K, lane, 1.0f);
      load_columns<Elem>(vc, p.v, bth, V, col0);
      load_columns<Elem>(dc, p.do_, bth, V, col0);
      // S_{t-1} as the forward had it, and D_t = (what came from t + 1) + q_t do_t^T
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        ka[r] = a[r] * kr[r];
#pragma unroll
        for (int c = 0; c < kColumns; ++c) {
          S[r][c] = states[((t - t0) * ROWS * kColumns + r * kColumns + c) * kThreads + tid];
          D[r][c] = fmaf(qr[r], dc[c], D[r][c]);
        }
      }
      // p = S'^T k = S_{t-1}^T (a * k) and du = D_t^T k, over the warp's lanes in one reduction
      float part[2 * kColumns];
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        part[c] = 0.0f;
        part[kColumns + c] = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          part[c] = fmaf(S[r][c], ka[r], part[c]);
          part[kColumns + c] = fmaf(D[r][c], kr[r], part[kColumns + c]);
        }
      }
      const float reduced = transpose_reduce<2 * kColumns>(part);  // value (lane >> 1) & 15, in lanes 2i, 2i + 1
      float pc[kColumns], du[kColumns], u[kColumns];
      float dbeta = 0.0f, u_do = 0.0f;
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        pc[c] = __shfl_sync(kFullMask, reduced, 2 * c);
        du[c] = __shfl_sync(kFullMask, reduced, 2 * (kColumns + c));
        u[c] = beta * (vc[c] - pc[c]);
        dbeta = fmaf(du[c], vc[c] - pc[c], dbeta);  // du . (v - p) over the warp's columns
        u_do = fmaf(u[c], dc[c], u_do);
      }
      const float du_mine = __shfl_sync(kFullMask, reduced, 2 * (kColumns + (lane & (kColumns - 1))));
      if (lane < kColumns && col0 + lane < V) static_cast<Elem*>(p.dv)[bth * V + col0 + lane] = from_float<Elem>(beta * du_mine);
      float dq[ROWS], dk[ROWS], dg[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float Sdo = 0.0f, Du = 0.0f, Sdu = 0.0f;
#pragma unroll
        for (int c = 0; c < kColumns; ++c) {
          Sdo = fmaf(S[r][c], dc[c], Sdo);
          Du = fmaf(D[r][c], u[c], Du);
          Sdu = fmaf(S[r][c], du[c], Sdu);
        }
        dq[r] = fmaf(a[r], Sdo, kr[r] * u_do);  // S_t do = S' do + k (u . do)
        dk[r] = Du - beta * a[r] * Sdu;         // D u - beta S' du
        dg[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < kColumns; ++c) {
          D[r][c] = fmaf(-beta * kr[r], du[c], D[r][c]);  // D' = D - beta k du^T
          dg[r] = fmaf(D[r][c], a[r] * S[r][c], dg[r]);   // (D' . S') on row r
          D[r][c] *= a[r];                                 // D_{t-1} before its own q do^T: diag(a_t) D'
        }
      }
      // the block's parts of dq_t, dk_t, dbeta_t, dg_t: its 4 warps added through shared memory
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
        if (lane + 32 * r < K) {
          rows[0][warp][lane + 32 * r] = dq[r];
          rows[1][warp][lane + 32 * r] = dk[r];
          if constexpr (kPerChannel) rows[kRowSums - 1][warp][lane + 32 * r] = dg[r];
        }
      if (lane == 0) scalars[warp][0] = dbeta;
      if constexpr (!kPerChannel) {  // one gate: <D', S'> over the warp's slice
        float dg_sum = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) dg_sum += dg[r];
        dg_sum = warp_sum(dg_sum);
        if (lane == 0) scalars[warp][1] = dg_sum;
      }
      __syncthreads();
      for (int f = tid; f < K; f += kThreads) {
        float sums[kRowSums] = {};
#pragma unroll
        for (int x = 0; x < kBwdWarps; ++x)
#pragma unroll
          for (int i = 0; i < kRowSums; ++i) sums[i] += rows[i][x][f];
        dq_part[bth * K + f] = sums[0];
        dk_part[bth * K + f] = sums[1];
        if constexpr (kPerChannel) dg_part[bth * K + f] = sums[kRowSums - 1];
      }
      if (tid == 0) {
        float sb = 0.0f;
#pragma unroll
        for (int x = 0; x < kBwdWarps; ++x) sb += scalars[x][0];
        dbeta_part[bth] = sb;
        if constexpr (!kPerChannel) {
          float sg = 0.0f;
#pragma unroll
          for (int x = 0; x < kBwdWarps; ++x) sg += scalars[x][1];
          dg_part[bth] = sg;
        }
      }
      __syncthreads();
    }
  }
  if (p.dh0) store_slice(D, p.dh0 + head * KV, K, V, lane, col0);
}

template <typename Elem, int ROWS, bool kPerChannel>
void launch(const BackwardProblem& p, const Workspace& w, const char* prefix_text) {
  const dim3 grid(bwd_value_blocks(p.V), p.H, p.B);
  const std::string prefix(prefix_text);
  launch_checked(p, (prefix + "_checkpoints").c_str(), checkpoints<Elem, ROWS, kPerChannel>, grid, kThreads, 0, w);
  launch_checked(p, (prefix + "_reverse").c_str(), reverse<Elem, ROWS, kPerChannel>, grid, kThreads, 0, w);
}

// Both passes and the sums over value blocks; `name` (e.g. "delta_bwd_v1_recurrent") names the version in its
// checks' messages, `prefix` ("delta_bwd_v1") each launch.
template <bool kPerChannel>
void run_backward(const BackwardProblem& p, const char* name, const char* prefix_text) {
  check_backward_problem(p, name, true, workspace_bytes<kPerChannel>(p.B, p.T, p.H, p.K, p.V, false));
  if constexpr (kPerChannel)
    require_channel_gate(p, name);
  const Workspace w = carve<kPerChannel>(p.workspace, p.B, p.T, p.H, p.K, p.V);
  const long long tokens = static_cast<long long>(p.B) * p.T * p.H;
  const std::string prefix(prefix_text);
  const auto run = [&](auto elem) {
    using Elem = decltype(elem);
    switch (rows_for(p.K)) {
      case 1: launch<Elem, 1, kPerChannel>(p, w, prefix_text); break;
      case 2: launch<Elem, 2, kPerChannel>(p, w, prefix_text); break;
      case 4: launch<Elem, 4, kPerChannel>(p, w, prefix_text); break;
      default: launch<Elem, 8, kPerChannel>(p, w, prefix_text);
    }
    // dL/dq = scale dL/d(scale q)
    launch_sum_value_blocks<Elem>(p, (prefix + "_sum_dq").c_str(), w.dq_parts, p.dq, tokens * p.K, p.scale);
    launch_sum_value_blocks<Elem>(p, (prefix + "_sum_dk").c_str(), w.dk_parts, p.dk, tokens * p.K, 1.0f);
  };
  if (p.dtype == kFloat32) run(float{});
  else run(__nv_bfloat16{});
  launch_sum_value_blocks<float>(p, (prefix + "_sum_dbeta").c_str(), w.dbeta_parts, p.dbeta, tokens, 1.0f);
  if (p.g)
    launch_sum_value_blocks<float>(p, (prefix + "_sum_dg").c_str(), w.dg_parts, p.dg,
                                   tokens * (kPerChannel ? p.K : 1), 1.0f);
}

}  // namespace delta_recurrent_backward
}  // namespace minilin
