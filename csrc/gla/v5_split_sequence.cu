// gla v5 (split sequence): gla v4's pass over chunks run on P segments of every sequence at once, then each segment's
// start state put back by a short pass over the segments and added to its outputs (linear v8's split, with a decay
// per key channel), because v4 gives each (batch, head, 64 value columns) one block that walks the whole sequence:
// at B = 1, H = 16, V = 128 that is 32 blocks for 132 SMs.
//
// The state is linear in its start (CONVENTIONS.md: S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T). With v4's tiles
// (gla/prepared_tiles.cuh: Qr = q exp(G), G from the chunk's start, and d_n = exp(G_C) of chunk n) and, per key
// channel,
//   c_n = prod_{m in segment p, m < n} d_m      the decay from the segment's start to chunk n's start,
//   D_p = prod_{m in segment p} d_m             the decay over the whole segment,
// segment p run from a zero state gives outputs o^loc and a final state L_p; from its true start state S_p,
//   o_t = o^loc_t + scale (Qr_t * c_n)^T S_p        (t in chunk n of segment p),
//   S_{p+1} = diag(D_p) S_p + L_p,   S_0 = h0,   the final state S_P.
// Five launches:
//   1. v4's prepare over every chunk (its tiles do not depend on the split);
//   2. v4's pass over chunks on the [B P, T / P] view of the same arrays (a segment is a contiguous run of token
//      rows and of chunk rows), no start state, its final states L_p into the workspace;
//   3. segment_decays: D_p, one thread per (segment, head, key channel), a product over the segment's chunks (and
//      on the way c_n at the first chunk of each of the correction's runs);
//   4. combine: S_0 = h0 and S_{p+1} from S_p for p = 0 .. P - 1, S_p written over L_p, S_P the final state;
//   5. correction: o += scale (Qr c_n) S_p on bf16 tensor cores, a block per run of 16 chunks of one segment and
//      64 or 128 value columns (linear v8's correction with Qr c_n in place of q exp(G_t)): S_p's bf16 copy loaded
//      once, the next chunk's Qr and o tile copied while this one multiplies, c_n carried from chunk to chunk.
// Launch 5 skips segment 0 when there is no h0. P is chosen per shape (common/split_segments.cuh) from v4's chunk
// time; P = 1 is plain v4, and packed sequences run as plain v4 (a segment must not straddle two sequences). Qr c_n
// is rounded to bf16 once more than v4's operands, and o^loc once more when the correction is added, as in linear
// v8. bf16 inputs only, K = 64 or 128, V a multiple of 64; reads grouped heads (through v4's tiles).
#include <algorithm>
#include <cstdint>

#include "../common/device.cuh"
#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/sequences.cuh"
#include "../common/split_segments.cuh"
#include "prepared_tiles.cuh"

namespace minilin {
namespace gla_split {

using bf16 = __nv_bfloat16;
using gla_prepared::prepared_tiles;

constexpr int kBlockV = 64;          // v4's value block
constexpr int kMinSegment = 1024;
constexpr int kMaxSegments = 16;
constexpr int kRunChunks = 16;       // the correction's chunks per block, sharing one load of S_p
constexpr int kWarps = 8;            // correction: warp w rows 16 (w % 4) .., columns half w / 4 of the block's
constexpr int kThreads = 32 * kWarps;
// The cost model's constants: v4's pass took ~2.07 us per chunk and block at K = 128 (H200: 0.891 ms at B = 4,
// T = 8192 and 1.684 ms at B = 1, T = 32768, H = 16, the same prepare in both, so 384 more chunks per chain cost
// 0.793 ms); K = 64 is not measured, taken as 1.5 us; the correction moves Qr once and o twice at linear v8's
// ~2 TB/s; the four added launches ~20 us (no K = 256 entry: v4 does not take it).
constexpr SplitModel kModel{{1.5, 2.07, 0.0}, 2.0e6, 20.0, kMinSegment, kMaxSegments, kRunChunks};

inline int choose_segments(int B, int T, int H, int K, int V) {
  if ((K != 64 && K != 128) || V % kBlockV != 0) return 1;  // v4 refuses these; it says why
  return model_segments<gla_prepared::chunks_blocks_per_sm>(kModel, "gla_v5_split_sequence", B, T, H, K, V, kBlockV);
}

// ---- the workspace: v4's tiles, then fp32 L_p (then S_p) [B P][H][K][V], D_p [B P][H][K] and c_n at the first chunk
// of each of the correction's runs [B P][H][runs][K] ------------------------------------------------------------------
struct Workspace {
  float* states;      // [B P][H][K][V]
  float* decays;      // [B P][H][K]
  float* run_starts;  // [B P][H][runs][K]
};

__host__ __device__ inline int runs_per_segment(int P, int T) { return (T / P / kChunk + kRunChunks - 1) / kRunChunks; }

inline size_t states_bytes(int P, int B, int H, int K, int V) {
  return workspace_aligned(static_cast<size_t>(B) * P * H * K * V * sizeof(float));
}

inline size_t decays_bytes(int P, int B, int H, int K) {
  return workspace_aligned(static_cast<size_t>(B) * P * H * K * sizeof(float));
}

inline size_t split_bytes(int P, int B, int T, int H, int K, int V) {
  return gla_prepared::prepared_bytes(B, T, H, K, false) + states_bytes(P, B, H, K, V) + decays_bytes(P, B, H, K) +
         workspace_aligned(static_cast<size_t>(B) * P * H * runs_per_segment(P, T) * K * sizeof(float));
}

size_t workspace_bytes(int B, int T, int H, int K, int V, bool packed) {
  if (B <= 0 || T <= 0 || H <= 0 || K <= 0 || V <= 0) return 0;
  const int P = packed ? 1 : choose_segments(B, T, H, K, V);
  return P == 1 ? gla_prepared::prepared_bytes(B, T, H, K, packed) : split_bytes(P, B, T, H, K, V);
}

inline Workspace carve(const Problem& p, int P) {
  auto* base = static_cast<unsigned char*>(p.workspace) + gla_prepared::prepared_bytes(p.B, p.T, p.H, p.K, false);
  const size_t states = states_bytes(P, p.B, p.H, p.K, p.V);
  return {reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + states),
          reinterpret_cast<float*>(base + states + decays_bytes(P, p.B, p.H, p.K))};
}

// ---- 3. segment_decays: D_p[f] = prod over segment p's chunks of d[f], one thread per key channel, and on the way
// c_n[f] at the first chunk of each of the correction's runs -----------------------------------------------------
// grid (B P, H), K threads. Segment p of sequence b (bp = b P + p) has the chunk rows from b T / 64 + p T / (64 P) =
// bp T / (64 P) on.
template <int K>
__global__ void __launch_bounds__(K) segment_decays(const Problem p, int P, Workspace w) {
  const int bp = blockIdx.x, h = blockIdx.y, f = threadIdx.x;
  const int chunks_per_segment = p.T / P / kChunk, runs = runs_per_segment(P, p.T);
  const long long row0 = static_cast<long long>(bp) * chunks_per_segment;
  const long long bph = static_cast<long long>(bp) * p.H + h;
  float decay = 1.0f;
  for (int m = 0; m < chunks_per_segment; ++m) {
    if (m % kRunChunks == 0) w.run_starts[(bph * runs + m / kRunChunks) * K + f] = decay;
    decay *= prepared_tiles<K>(p, h, row0 + m).decay[f];
  }
  w.decays[bph * K + f] = decay;
}

// ---- 4. combine: 128 threads per block, one per 4 state elements (all in one key row) of one (batch, head) -----
constexpr int kCombineThreads = 128;

__global__ void __launch_bounds__(kCombineThreads) combine(const Problem p, int P, Workspace w) {
  const int h = blockIdx.y, b = blockIdx.z;
  const long long KV = static_cast<long long>(p.K) * p.V;
  const long long e = (static_cast<long long>(blockIdx.x) * kCombineThreads + threadIdx.x) * 4;
  if (e >= KV) return;
  const int f = static_cast<int>(e / p.V);  // the key row of these 4 elements (V is a multiple of 64)
  float4 S = p.h0 ? *reinterpret_cast<const float4*>(p.h0 + (static_cast<long long>(b) * p.H + h) * KV + e)
                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int segment = 0; segment < P; ++segment) {
    const long long bph = (static_cast<long long>(b) * P + segment) * p.H + h;
    float4* slot = reinterpret_cast<float4*>(w.states + bph * KV + e);
    const float4 local = *slot;
    *slot = S;
    const float decay = w.decays[bph * p.K + f];
    S = make_float4(decay * S.x + local.x, decay * S.y + local.y, decay * S.z + local.z, decay * S.w + local.w);
  }
  *reinterpret_cast<float4*>(p.ht + (static_cast<long long>(b) * p.H + h) * KV + e) = S;
}

// ---- 5. correction: one block per (column block, head, batch x segment x run of kRunChunks chunks) -------------
template <int K, int kCols>
struct CorrectionLayout {
  static constexpr int kLdS = kCols + 8, kLdQ = K + 8;
  static constexpr size_t kBytes = (K * kLdS + 2 * kChunk * kLdQ + 2 * kChunk * kLdS) * sizeof(bf16) + K * sizeof(float);
  unsigned char* base;
  __device__ bf16* S() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* Q(int buffer) const { return S() + K * kLdS + buffer * kChunk * kLdQ; }
  __device__ bf16* O(int buffer) const { return Q(2) + buffer * kChunk * kLdS; }  // o's tile, [kChunk][kLdS]
  __device__ float* c() const { return reinterpret_cast<float*>(O(2)); }     // c_n, [K]
};

template <int K, int kCols>
__global__ void __launch_bounds__(kThreads) correction(const Problem p, int P, int first_segment, Workspace w) {
  using Layout = CorrectionLayout<K, kCols>;
  constexpr int kNT = kCols / 16;  // each warp's 8-column tiles: half the block's columns
  extern __shared__ __align__(16) unsigned char smem[];
  const Layout L{smem};

  const int chunks = p.T / kChunk, chunks_per_segment = chunks / P, runs = runs_per_segment(P, p.T);
  const int c0 = blockIdx.x * kCols, h = blockIdx.y;
  const int run = blockIdx.z % runs, segments = P - first_segment;
  const int segment = first_segment + (blockIdx.z / runs) % segments, b = blockIdx.z / runs / segments;
  const int n_first = segment * chunks_per_segment;  // the segment's first chunk, inside sequence b
  const int n_begin = n_first + run * kRunChunks;
  const int n_end = min(n_begin + kRunChunks, n_first + chunks_per_segment);
  const int warp = threadIdx.x >> 5, m0 = 16 * (warp % 4), n0 = (kCols / 2) * (warp / 4);

  bf16* o = static_cast<bf16*>(p.o);
  const auto chunk_row = [&](int n) { return static_cast<long long>(b) * chunks + n; };  // v4's tiles (plain layout)
  const auto row_of = [&](int n) { return (static_cast<long long>(b) * p.T + static_cast<long long>(n) * kChunk) * p.H + h; };
  const auto copy_chunk = [&](int n, int buffer) {  // chunk n's Qr and o tile, 16 bytes per copy
    cp_async_rows(L.Q(buffer), Layout::kLdQ, prepared_tiles<K>(p, h, chunk_row(n)).qr, K, kChunk, K, kChunk);
    cp_async_rows(L.O(buffer), Layout::kLdS, o + row_of(n) * p.V + c0, static_cast<long long>(p.H) * p.V, kChunk,
                  kCols, kChunk);
    cp_async_commit();
  };
  copy_chunk(n_begin, 0);

  // S_p's columns c0 .. c0 + kCols, fp32 -> bf16, 4 elements per load.
  const float* S = w.states + ((static_cast<long long>(b) * P + segment) * p.H + h) * K * p.V + c0;
  for (int i = threadIdx.x; i < K * kCols / 4; i += kThreads) {
    const int r = i / (kCols / 4), c = (i % (kCols / 4)) * 4;
    const float4 x = *reinterpret_cast<const float4*>(S + static_cast<long long>(r) * p.V + c);
    store_bf16x2(L.S() + r * Layout::kLdS + c, x.x, x.y);
    store_bf16x2(L.S() + r * Layout::kLdS + c + 2, x.z, x.w);
  }
  // c_n at the run's first chunk (segment_decays: the chunk decays from the segment's start up to it).
  const float* c_first = w.run_starts + (((static_cast<long long>(b) * P + segment) * p.H + h) * runs + run) * K;
  for (int f = threadIdx.x; f < K; f += kThreads) L.c()[f] = c_first[f];

  for (int n = n_begin; n < n_end; ++n) {
    const int buffer = (n - n_begin) & 1;
    if (n + 1 < n_end) {
      copy_chunk(n + 1, buffer ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // chunk n's Qr and o tile have landed for every thread; S and c_n are stored

    // Qr c_n in place, two channels per thread and step.
    bf16* Q = L.Q(buffer);
    for (int i = threadIdx.x; i < kChunk * K / 2; i += kThreads) {
      const int r = i / (K / 2), f = 2 * (i % (K / 2));
      const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Q + r * Layout::kLdQ + f));
      store_bf16x2(Q + r * Layout::kLdQ + f, x.x * L.c()[f], x.y * L.c()[f + 1]);
    }
    __syncthreads();  // Qr c_n complete; every read of c_n is done
    for (int f = threadIdx.x; f < K; f += kThreads) L.c()[f] *= prepared_tiles<K>(p, h, chunk_row(n)).decay[f];

    float acc[1][kNT][4];
    zero(acc);
    warp_mma_unrolled<1, kNT, Stored::kRowMajor, Stored::kRowMajor, K / 16>(acc, Q, Layout::kLdQ, L.S(), Layout::kLdS,
                                                                             m0, n0, 0);
    // o += scale times the product, in the shared tile (each thread its own accumulator positions), then the tile
    // back to o with 16-byte stores.
    bf16* tile = L.O(buffer);
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        bf16* at = tile + (m0 + acc_row(0, 2 * half)) * Layout::kLdS + n0 + acc_col(j, 2 * half);
        const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at));
        store_bf16x2(at, x.x + p.scale * acc[0][j][2 * half], x.y + p.scale * acc[0][j][2 * half + 1]);
      }
    __syncthreads();  // the tile is complete
    for (int i = threadIdx.x; i < kChunk * kCols / 8; i += kThreads) {
      const int r = i / (kCols / 8), c = (i % (kCols / 8)) * 8;
      *reinterpret_cast<uint4*>(o + (row_of(n) + static_cast<long long>(r) * p.H) * p.V + c0 + c) =
          *reinterpret_cast<const uint4*>(tile + r * Layout::kLdS + c);
    }
    __syncthreads();  // every warp is done with this buffer before chunk n + 2's copy overwrites it
  }
}

template <int K, int kCols>
void launch_correction(const Problem& p, int P, int first_segment, const Workspace& w) {
  const dim3 grid(p.V / kCols, p.H, p.B * (P - first_segment) * runs_per_segment(P, p.T));
  launch_checked(p, "gla_v5_correction", correction<K, kCols>, grid, kThreads, CorrectionLayout<K, kCols>::kBytes, P,
                 first_segment, w);
}

void forward(const Problem& p) {
  const char* name = "gla_v5_split_sequence";
  check_tensor_core_problem(p, name, false, kBlockV);
  require_channel_gate(p, name);
  const bool packed = p.cu_seqlens != nullptr;
  const int P = packed ? 1 : choose_segments(p.B, p.T, p.H, p.K, p.V);
  const size_t needed = P == 1 ? gla_prepared::prepared_bytes(p.B, p.T, p.H, p.K, packed)
                               : split_bytes(P, p.B, p.T, p.H, p.K, p.V);  // P as chosen above, not chosen again
  require_workspace(p, name, needed);
  gla_prepared::launch_prepare(p);  // 1. every chunk's tiles
  if (P == 1) return gla_prepared::launch_chunks(p);

  const Workspace w = carve(p, P);
  Problem segments = p;  // 2. the [B P, T / P] view: same arrays and tiles, no start state, final states into L_p
  segments.B = p.B * P;
  segments.T = p.T / P;
  segments.h0 = nullptr;
  segments.ht = w.states;
  gla_prepared::launch_chunks(segments);

  if (p.K == 64)  // 3. D_p
    launch_checked(p, "gla_v5_segment_decays", segment_decays<64>, dim3(p.B * P, p.H), 64, 0, P, w);
  else
    launch_checked(p, "gla_v5_segment_decays", segment_decays<128>, dim3(p.B * P, p.H), 128, 0, P, w);
  launch_checked(p, "gla_v5_combine", combine, dim3(ceil_div(p.K * p.V / 4, kCombineThreads), p.H, p.B),  // 4.
                 kCombineThreads, 0, P, w);

  const int first_segment = p.h0 ? 0 : 1;  // 5.
  const bool wide = column_block(p.V) == 128;
  if (p.K == 64) wide ? launch_correction<64, 128>(p, P, first_segment, w) : launch_correction<64, 64>(p, P, first_segment, w);
  else wide ? launch_correction<128, 128>(p, P, first_segment, w) : launch_correction<128, 64>(p, P, first_segment, w);
}

}  // namespace gla_split

extern const Version gla_v5 = {
    "gla", 5, "split_sequence",
    "v4's pass over chunks on P segments of each sequence at once, each segment's start state then rebuilt by a pass "
    "over the segments and its contribution added to the outputs on tensor cores: with few (batch, head) pairs v4 "
    "leaves most SMs idle (P chosen per shape by linear v8's cost model; P = 1 is v4).",
    false, true, kTensorCoreShape, 80, gla_split::workspace_bytes, gla_split::forward, 0, nullptr, nullptr,
    kReadsPacked};

}  // namespace minilin
