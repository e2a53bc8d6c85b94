// delta v1 (recurrent): the gated delta rule S' = exp(g_t) S_{t-1}, S_t = S' + beta_t k_t (v_t - S'^T k_t)^T,
// o_t = S_t^T q_t run token by token, one block per (batch, head, 32 value columns) with the K x 32 state
// in registers, because the plainest parallel form of a recurrence is one sequential loop per state slice.
//
// Same layout as linear v1 (4 warps x 8 value columns, lane l holds key rows l, l + 32, ...). Unlike
// linear attention, the update needs a read first: the prediction S'^T k_t, reduced over the key rows.
// Both reads are taken from the state before the update, in one 16-value warp reduction:
//     a = S_{t-1}^T k_t,  b = S_{t-1}^T q_t                   (one transpose_reduce of 8 + 8 values)
//     u = beta_t (v_t - exp(g_t) a)                            the correction written for k_t
//     o_t = exp(g_t) b + (k_t . q_t) u,   S_t = exp(g_t) S_{t-1} + k_t u^T
// DeltaNet is the same with g = 0 (no decay).
#include "../common/device.cuh"
#include "../common/launch.cuh"
#include "../common/token_tiles.cuh"

namespace minilin {
namespace {

constexpr int kWarps = kRecurrentWarps;
constexpr int kColumnsPerWarp = kRecurrentColumnsPerWarp;

template <typename Elem, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) delta_v1_recurrent(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  TokenTiles<Elem> tiles;
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
      float qr[ROWS], kr[ROWS], vc[kColumnsPerWarp];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int f = lane + 32 * r;
        qr[r] = f < K ? to_float(qs[t * K + f]) : 0.0f;
        kr[r] = f < K ? to_float(ks[t * K + f]) : 0.0f;
      }
      load8(vs + t * kTileColumns + col0, vc);
      const float decay = p.g ? expf(gs[t]) : 1.0f;
      const float beta = betas[t];

      // partial[c] = (S^T k)_c and partial[8 + c] = (S^T q)_c over this lane's rows, then over the warp
      float partial[2 * kColumnsPerWarp];
#pragma unroll
      for (int c = 0; c < kColumnsPerWarp; ++c) {
        float Sk = 0.0f, Sq = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          Sk = fmaf(S[r][c], kr[r], Sk);
          Sq = fmaf(S[r][c], qr[r], Sq);
        }
        partial[c] = Sk;
        partial[kColumnsPerWarp + c] = Sq;
      }
      const float reduced = transpose_reduce<2 * kColumnsPerWarp>(partial);  // value index (lane >> 1) & 15

      // u_c = beta (v_c - exp(g) (S^T k)_c) for every column: (S^T k)_c sits in lanes 2c, 2c + 1
      float u[kColumnsPerWarp];
#pragma unroll
      for (int c = 0; c < kColumnsPerWarp; ++c)
        u[c] = beta * (vc[c] - decay * __shfl_sync(kFullMask, reduced, 2 * c));

      // lanes 16 + 2c hold (S^T q)_c; lane 2c (= lane - 16) holds (S^T k)_c for the same column
      const float Sk_mine = __shfl_sync(kFullMask, reduced, (lane - 16) & 31);
      if (lane >= 16 && (lane & 1) == 0) {
        const int c = (lane - 16) >> 1;
        const float u_mine = beta * (to_float(vs[t * kTileColumns + col0 + c]) - decay * Sk_mine);
        o_tile[t * kTileColumns + col0 + c] = p.scale * (decay * reduced + kq[t] * u_mine);
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < kColumnsPerWarp; ++c) S[r][c] = fmaf(decay, S[r][c], kr[r] * u[c]);
    }
    __syncthreads();

    write_output_tile<Elem>(o_tile, p, seq, h, t0, v0);
  }

  store_state_rows(S, p, state_base, lane, v0 + col0);
}

struct Kernels {
  template <typename Elem, int ROWS>
  static auto get() { return delta_v1_recurrent<Elem, ROWS>; }
};

void forward(const Problem& p) { forward_recurrent<Kernels>(p, "delta_v1_recurrent", true); }

}  // namespace

extern const Version delta_v1 = {
    "delta", 1, "recurrent",
    "The definition, token by token: one block per (batch, head, 32 value columns), the state in registers.",
    true, true, kKeysUpTo256, 80, nullptr, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
