// linear v1 (recurrent): the definition S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t run token by
// token, one block per (batch, head, 32 value columns) with the K x 32 state in registers, because the
// plainest parallel form of a recurrence is one sequential loop per independent state slice.
//
// Layout: 4 warps x 8 value columns each; lane l holds key rows l, l + 32, ... (ROWS = ceil(K / 32)) of
// its warp's 8 columns, so one token costs each thread 8 * ROWS fused multiply-adds for the update and as
// many for the read, plus one 8-value warp reduction. The read uses the state before the update:
//     o_t = S_t^T q_t = exp(g_t) S_{t-1}^T q_t + (k_t . q_t) v_t
// so the reduction is off the update's dependency chain, and k_t . q_t is computed once per token for
// the whole block. Tokens arrive 32 at a time through shared memory (common/token_tiles.cuh).
#include "../common/device.cuh"
#include "../common/launch.cuh"
#include "../common/token_tiles.cuh"

namespace minilin {
namespace {

constexpr int kWarps = kRecurrentWarps;
constexpr int kColumnsPerWarp = kRecurrentColumnsPerWarp;

template <typename Elem, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) linear_v1_recurrent(const Problem p) {
  extern __shared__ __align__(16) unsigned char smem[];
  TokenTiles<Elem> tiles;
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
    for (int t = warp; t < kTileTokens; t += kWarps) {
      float dot = 0.0f;
      for (int f = lane; f < K; f += 32) dot += to_float(qs[t * K + f]) * to_float(ks[t * K + f]);
      dot = warp_sum(dot);
      if (lane == 0) kq[t] = dot;
    }
    __syncthreads();

    for (int t = 0; t < kTileTokens; ++t) {  // padded tokens (t0 + t >= T) have k = v = g = 0: no-ops
      float qr[ROWS], kr[ROWS], vc[kColumnsPerWarp];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int f = lane + 32 * r;
        qr[r] = f < K ? to_float(qs[t * K + f]) : 0.0f;
        kr[r] = f < K ? to_float(ks[t * K + f]) : 0.0f;
      }
      load8(vs + t * kTileColumns + col0, vc);
      const float decay = p.g ? expf(tiles.g(stage)[t]) : 1.0f;

      // read: the 8 columns of S_{t-1}^T q_t, reduced over the warp's lanes
      float partial[kColumnsPerWarp];
#pragma unroll
      for (int c = 0; c < kColumnsPerWarp; ++c) {
        partial[c] = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) partial[c] = fmaf(S[r][c], qr[r], partial[c]);
      }
      const float Sq = transpose_reduce<kColumnsPerWarp>(partial);
      const int c_mine = transpose_reduce_index<kColumnsPerWarp>(lane);  // held by lanes 4c .. 4c + 3
      if ((lane & 3) == 0) {
        const float v_mine = to_float(vs[t * kTileColumns + col0 + c_mine]);
        o_tile[t * kTileColumns + col0 + c_mine] = p.scale * (decay * Sq + kq[t] * v_mine);
      }
      // update: S_t = exp(g_t) S_{t-1} + k_t v_t^T
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < kColumnsPerWarp; ++c) S[r][c] = fmaf(decay, S[r][c], kr[r] * vc[c]);
    }
    __syncthreads();

    write_output_tile<Elem>(o_tile, p, seq, h, t0, v0);
  }

  store_state_rows(S, p, state_base, lane, v0 + col0);
}

struct Kernels {
  template <typename Elem, int ROWS>
  static auto get() { return linear_v1_recurrent<Elem, ROWS>; }
};

void forward(const Problem& p) { forward_recurrent<Kernels>(p, "linear_v1_recurrent", false); }

}  // namespace

extern const Version linear_v1 = {
    "linear", 1, "recurrent",
    "The definition, token by token: one block per (batch, head, 32 value columns), the state in registers.",
    true, true, kKeysUpTo256, 80, nullptr, forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
