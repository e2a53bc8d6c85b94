// gla v1 (recurrent): Gated Linear Attention's definition S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,
// o_t = scale S_t^T q_t with a log-decay g_t[f] per key channel, run token by token, one block per (batch, head,
// 32 value columns) with the K x 32 state in registers, because the plainest parallel form of a recurrence is one
// sequential loop per independent state slice (linear v1's kernel with its scalar decay made a vector).
//
// Layout: linear v1's (4 warps x 8 value columns each; lane l holds key rows l, l + 32, ..., ROWS = ceil(K / 32)).
// With a_f = exp(g_t[f]), each lane's rows decay by their own a_f. The read uses the state before the update:
//     o_t = S_t^T q_t = S_{t-1}^T (a * q_t) + (k_t . q_t) v_t
// so the reduction is off the update's dependency chain. Tokens arrive 32 at a time through shared memory, g_t as
// one row of K floats per token (common/channel_tiles.cuh). Every exponent is a gate, <= 0.
#include "../common/channel_tiles.cuh"
#include "../common/device.cuh"
#include "../common/launch.cuh"
#include "../common/token_tiles.cuh"

namespace minilin {
namespace {

constexpr int kWarps = kRecurrentWarps;
constexpr int kColumnsPerWarp = kRecurrentColumnsPerWarp;

template <typename Elem, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) gla_v1_recurrent(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  ChannelTiles<Elem> tiles;
  float* o_tile = reinterpret_cast<float*>(tiles.carve(smem, p.K));  // [kTileTokens][kTileColumns]
  float* kq = o_tile + kTileTokens * kTileColumns;                      // [kTileTokens]: k_t . q_t

  const int K = p.K, V = p.V, H = p.H;
  const int v0 = blockIdx.x * kTileColumns, h = blockIdx.y, b = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, b);  // sequence b's tokens (common/sequences.cuh)
  const int T = seq.length;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int col0 = warp * kColumnsPerWarp;  // this warp's first column inside the tile

  // S[r][c] = state row (lane + 32 r), column (v0 + col0 + c).
  float S[ROWS][kColumnsPerWarp];
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  load_state_rows(S, p, state_base, lane, v0 + col0);

  const int tiles_count = ceil_div(T, kTileTokens);
  tiles.load(p, 0, seq, h, 0, v0);
  cp_async_commit();
  for (int tile = 0; tile < tiles_count; ++tile) {
    const int stage = tile & 1, t0 = tile * kTileTokens;
    if (tile + 1 < tiles_count) tiles.load(p, stage ^ 1, seq, h, t0 + kTileTokens, v0);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's copies have landed (the next tile's may still be in flight)
    __syncthreads();

    const Elem* qs = tiles.q(stage);
    const Elem* ks = tiles.k(stage);
    const Elem* vs = tiles.v(stage);
    const float* gs = tiles.g(stage);
    for (int t = warp; t < kTileTokens; t += kWarps) {
      float dot = 0.0f;
      for (int f = lane; f < K; f += 32) dot += to_float(qs[t * K + f]) * to_float(ks[t * K + f]);
      dot = warp_sum(dot);
      if (lane == 0) kq[t] = dot;
    }
    __syncthreads();

    for (int t = 0; t < kTileTokens; ++t) {  // padded tokens (t0 + t >= T) have k = v = g = 0: no-ops
      float qa[ROWS], kr[ROWS], a[ROWS], vc[kColumnsPerWarp];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int f = lane + 32 * r;
        a[r] = f < K ? expf(gs[t * K + f]) : 0.0f;  // rows past K hold zeros and stay zero
        qa[r] = f < K ? a[r] * to_float(qs[t * K + f]) : 0.0f;
        kr[r] = f < K ? to_float(ks[t * K + f]) : 0.0f;
      }
      load8(vs + t * kTileColumns + col0, vc);

      // read: the 8 columns of S_{t-1}^T (a * q_t), reduced over the warp's lanes
      float partial[kColumnsPerWarp];
#pragma unroll
      for (int c = 0; c < kColumnsPerWarp; ++c) {
        partial[c] = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) partial[c] = fmaf(S[r][c], qa[r], partial[c]);
      }
      const float Sq = transpose_reduce<kColumnsPerWarp>(partial);
      const int c_mine = transpose_reduce_index<kColumnsPerWarp>(lane);  // held by lanes 4c .. 4c + 3
      if ((lane & 3) == 0) {
        const float v_mine = to_float(vs[t * kTileColumns + col0 + c_mine]);
        o_tile[t * kTileColumns + col0 + c_mine] = p.scale * (Sq + kq[t] * v_mine);
      }
      // update: S_t = diag(a) S_{t-1} + k_t v_t^T
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < kColumnsPerWarp; ++c) S[r][c] = fmaf(a[r], S[r][c], kr[r] * vc[c]);
    }
    __syncthreads();

    write_output_tile<Elem>(o_tile, p, seq, h, t0, v0);
  }

  store_state_rows(S, p, state_base, lane, v0 + col0);
}

struct Kernels {
  template <typename Elem, int ROWS>
  static auto get() { return gla_v1_recurrent<Elem, ROWS>; }
};

void forward(const Problem& p) { forward_channel_recurrent<Kernels>(p, "gla_v1_recurrent", false); }

}  // namespace

extern const Version gla_v1 = {
    "gla", 1, "recurrent",
    "The definition with a decay per key channel, token by token: one block per (batch, head, 32 value columns), "
    "the state in registers.",
    true, true, kKeysUpTo256, 80, nullptr, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
