// kda v1 (recurrent): Kimi Delta Attention's definition S' = diag(exp(g_t)) S_{t-1},
// S_t = S' + beta_t k_t (v_t - S'^T k_t)^T, o_t = scale S_t^T q_t with a log-decay g_t[f] per key channel, run token
// by token, one block per (batch, head, 32 value columns) with the K x 32 state in registers (delta v1's kernel with
// its scalar decay made a vector, because the plainest parallel form of a recurrence is one loop per state slice).
//
// Layout: delta v1's (4 warps x 8 value columns, lane l holds key rows l, l + 32, ...). With a_f = exp(g_t[f]), both
// reads of the decayed state come from the state before the decay, S'^T x = S_{t-1}^T (a * x), in one 16-value warp
// reduction:
//     p = S_{t-1}^T (a * k_t),  r = S_{t-1}^T (a * q_t)      (one transpose_reduce of 8 + 8 values)
//     u = beta_t (v_t - p)                                    the correction written for k_t
//     o_t = scale (r + (k_t . q_t) u),   S_t = diag(a) S_{t-1} + k_t u^T
// q and k arrive L2-normalized when the caller asked for it (normalize_qk is a pre-pass of the front). Tokens
// arrive 32 at a time, g_t as one row of K floats (common/channel_tiles.cuh). Every exponent is a gate, <= 0.
#include "../common/channel_tiles.cuh"
#include "../common/device.cuh"
#include "../common/launch.cuh"
#include "../common/token_tiles.cuh"

namespace minilin {
namespace {

constexpr int kWarps = kRecurrentWarps;
constexpr int kColumnsPerWarp = kRecurrentColumnsPerWarp;

template <typename Elem, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) kda_v1_recurrent(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  ChannelTiles<Elem> tiles;
  float* o_tile = reinterpret_cast<float*>(tiles.carve(smem, p.K));  // [kTileTokens][kTileColumns]
  float* kq = o_tile + kTileTokens * kTileColumns;                      // [kTileTokens]: k_t . q_t

  const int K = p.K, V = p.V, H = p.H;
  const int v0 = blockIdx.x * kTileColumns, h = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, b);  // sequence b's tokens (common/sequences.cuh)
  const int T = seq.length;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int col0 = warp * kColumnsPerWarp;

  float S[ROWS][kColumnsPerWarp];  // S[r][c] = state row (lane + 32 r), column (v0 + col0 + c)
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state_rows(S, p, state_base, lane, v0 + col0);

  const int tiles_count = ceil_div(T, kTileTokens);
  tiles.load(p, 0, seq, h, 0, v0);
  cp_async_commit();
  for (int tile = 0; tile < tiles_count; ++tile) {
    const int stage = tile & 1, t0 = tile * kTileTokens;
    if (tile + 1 < tiles_count) tiles.load(p, stage ^ 1, seq, h, t0 + kTileTokens, v0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const Elem* qs = tiles.q(stage);
    const Elem* ks = tiles.k(stage);
    const Elem* vs = tiles.v(stage);
    const float* gs = tiles.g(stage);
    const float* betas = tiles.beta(stage);
    for (int t = warp; t < kTileTokens; t += kWarps) {
      float dot = 0.0f;
      for (int f = lane; f < K; f += 32) dot += to_float(qs[t * K + f]) * to_float(ks[t * K + f]);
      dot = warp_sum(dot);
      if (lane == 0) kq[t] = dot;
    }
    __syncthreads();

    for (int t = 0; t < kTileTokens; ++t) {  // padded tokens have k = v = beta = g = 0: no-ops
      float qa[ROWS], ka[ROWS], kr[ROWS], a[ROWS], vc[kColumnsPerWarp];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int f = lane + 32 * r;
        a[r] = f < K ? expf(gs[t * K + f]) : 0.0f;  // rows past K hold zeros and stay zero
        kr[r] = f < K ? to_float(ks[t * K + f]) : 0.0f;
        qa[r] = f < K ? a[r] * to_float(qs[t * K + f]) : 0.0f;
        ka[r] = a[r] * kr[r];
      }
      load8(vs + t * kTileColumns + col0, vc);
      const float beta = betas[t];

      // partial[c] = (S^T (a k))_c and partial[8 + c] = (S^T (a q))_c over this lane's rows, then over the warp
      float partial[2 * kColumnsPerWarp];
#pragma unroll
      for (int c = 0; c < kColumnsPerWarp; ++c) {
        float Sk = 0.0f, Sq = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          Sk = fmaf(S[r][c], ka[r], Sk);
          Sq = fmaf(S[r][c], qa[r], Sq);
        }
        partial[c] = Sk;
        partial[kColumnsPerWarp + c] = Sq;
      }
      const float reduced = transpose_reduce<2 * kColumnsPerWarp>(partial);  // value index (lane >> 1) & 15

      // u_c = beta (v_c - (S'^T k)_c) for every column: (S'^T k)_c sits in lanes 2c, 2c + 1
      float u[kColumnsPerWarp];
#pragma unroll
      for (int c = 0; c < kColumnsPerWarp; ++c) u[c] = beta * (vc[c] - __shfl_sync(kFullMask, reduced, 2 * c));

      // lanes 16 + 2c hold (S'^T q)_c; lane 2c (= lane - 16) holds (S'^T k)_c for the same column
      const float Sk_mine = __shfl_sync(kFullMask, reduced, (lane - 16) & 31);
      if (lane >= 16 && (lane & 1) == 0) {
        const int c = (lane - 16) >> 1;
        const float u_mine = beta * (to_float(vs[t * kTileColumns + col0 + c]) - Sk_mine);
        o_tile[t * kTileColumns + col0 + c] = p.scale * (reduced + kq[t] * u_mine);
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < kColumnsPerWarp; ++c) S[r][c] = fmaf(a[r], S[r][c], kr[r] * u[c]);
    }
    __syncthreads();

    write_output_tile<Elem>(o_tile, p, seq, h, t0, v0);
  }

  store_state_rows(S, p, state_base, lane, v0 + col0);
}

struct Kernels {
  template <typename Elem, int ROWS>
  static auto get() { return kda_v1_recurrent<Elem, ROWS>; }
};

void forward(const Problem& p) { forward_channel_recurrent<Kernels>(p, "kda_v1_recurrent", true); }

}  // namespace

extern const Version kda_v1 = {
    "kda", 1, "recurrent",
    "The delta rule with a decay per key channel, token by token: one block per (batch, head, 32 value columns), "
    "the state in registers.",
    true, true, kKeysUpTo256, 80, nullptr, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
