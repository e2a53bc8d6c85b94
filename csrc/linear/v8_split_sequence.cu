// linear v8 (split sequence): v7 run on P segments of every sequence at once, then each segment's start state
// put back by a short pass over the segments and added to its outputs, because v7 gives each (batch, head,
// value block) one block that walks the whole sequence: at B = 1, H = 16 that is 32 blocks for 132 SMs, and
// its time at T = 32768 equals its time at B = 4.
//
// The state is linear in its start, which is what makes the split exact (CONVENTIONS.md, the recurrence
// S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t). Split each sequence into P segments of Ts tokens
// and let G_t be the cumulative log-gate inside t's segment (g summed from the segment's first token to t).
// Run from a zero state, segment p gives outputs o^loc and a final state L_p; from its true start state S_p,
//   o_t = o^loc_t + scale exp(G_t) S_p^T q_t,          S_{p+1} = exp(G_end(p)) S_p + L_p,   S_0 = h0.
// Four launches (three without g):
//   1. v7 on the [B P, Ts, H, .] view of the same arrays (segments are contiguous runs of rows), no start
//      state, its final states L_p into the workspace;
//   2. chunk_gates: the sum of g over every 64-token chunk, one warp per (batch, chunk, head);
//   3. combine: G_end(p) from the chunk sums, then S_0 = h0 and S_{p+1} from S_p for p = 0 .. P - 1, S_p written
//      over L_p, S_P the final state;
//   4. correction: o_t += scale exp(G_t) (q_t^T S_p) on bf16 tensor cores, a block per run of 16 chunks of one
//      segment and 64 or 128 value columns: S_p's bf16 copy (the same bf16 S that v7's Q S reads) loaded once,
//      the next chunk's q and o tile copied (cp.async, 16 bytes a copy) while this one multiplies, the sum formed
//      in shared memory and stored back 16 bytes at a time; G_t from the chunk sums before the run plus a warp's
//      scan inside the chunk. It moves q once and o twice. With o read and written straight from the mma
//      fragments (4 bytes per thread, half of each 32-byte sector) it ran at ~2 TB/s (0.20 ms of v8's 0.58 at
//      B=1, T=32768, H=16, K=V=128); loading o and the gates a chunk ahead into registers measured 4% slower
//      (96 registers, 2 blocks per SM), and capping it at 80 registers for 3 blocks 25% slower.
// Launch 4 skips segment 0 when there is no h0. The segments are chosen per shape (choose_segments): P = 1
// (plain v7) unless the predicted time of v7's shorter chains plus the correction's traffic is lower. Grouped
// value heads are read as v7 reads them (q from head h / (H / qk_heads)); packed sequences run as plain v7.
// linear v9 runs the same split around v7's kernel at K = 256 (split_forward, its chunk pass passed in).
#include <algorithm>
#include <deque>
#include <mutex>

#include "../common/device.cuh"
#include "../common/launch.cuh"
#include "../common/mma.cuh"
#include "../common/sequences.cuh"  // kChunk, the q/k head of a value head
#include "split_sequence.cuh"

namespace minilin {

extern const Version linear_v7;

namespace linear_producer {
int resident_blocks_per_sm(int K);  // v7's kernel's blocks per SM at this K (v7_chunked_producer_warp.cu)
}

namespace linear_split {

using bf16 = __nv_bfloat16;

constexpr int kBlockV = 64;          // v7's value block
constexpr int kWarps = 8;            // correction: warp w rows 16 (w % 4) .., columns half w / 4 of the block's
constexpr int kThreads = 32 * kWarps;
// The cost model's chunk times, from H200 measurements: v7 takes ~2.9 us per chunk and block at K = 128 (0.373 ms
// for chains of 128 chunks in one wave) and ~2.4 at K = 64 (0.155 ms for chains of 64); at K = 256 (v9's 2-stage
// ring, H100): ~4.1 us (2.08 ms for chains of 512 chunks in one wave, 1.08 for two waves of 128). The
// correction's rate and the added launches: split_sequence.cuh.
constexpr SplitModel kModel{{2.4, 2.9, 4.1}, kCorrectionBytesPerUs, kAddedLaunchesUs, kMinSegment, kMaxSegments,
                            kRunChunks};

// ---- the choice of P ---------------------------------------------------------------------------------------
// P by the split cost model (common/split_segments.cuh) with v7's chunk time and resident blocks.
int choose_segments(int B, int T, int H, int K, int V) {
  if ((K != 64 && K != 128 && K != 256) || V % kBlockV != 0) return 1;  // v7 and v9 refuse these; they say why
  return model_segments<linear_producer::resident_blocks_per_sm>(kModel, "linear_v8_split_sequence", B, T, H, K, V,
                                                                 kBlockV);
}

// ---- the workspace: L_p (then S_p) and the chunk sums of g; each part 256-byte aligned ------------------
struct Workspace {
  float* states;      // [B P, H, K, V]
  float* chunk_gate;  // [B, T / 64, H]: g summed over each chunk
};

inline size_t states_bytes(int P, int B, int H, int K, int V) {
  return workspace_aligned(static_cast<size_t>(B) * P * H * K * V * sizeof(float));
}

// With P > 1 segments: L_p (then S_p), then the chunk sums.
size_t split_bytes(int P, int B, int T, int H, int K, int V) {
  return states_bytes(P, B, H, K, V) + workspace_aligned(static_cast<size_t>(B) * (T / kChunk) * H * sizeof(float));
}

size_t workspace_bytes(int B, int T, int H, int K, int V, bool packed) {
  if (packed || B <= 0 || T <= 0 || H <= 0 || K <= 0 || V <= 0) return 0;  // packed: plain v7 (forward)
  const int P = choose_segments(B, T, H, K, V);
  return P == 1 ? 0 : split_bytes(P, B, T, H, K, V);  // P = 1: plain v7, no workspace
}

inline Workspace carve(const Problem& p, int P) {
  auto* base = static_cast<unsigned char*>(p.workspace);
  return {reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + states_bytes(P, p.B, p.H, p.K, p.V))};
}

// ---- 2. chunk_gates: one warp per (batch, chunk, head), lane l summing tokens 2 l and 2 l + 1 -------------
__global__ void __launch_bounds__(kThreads) chunk_gates(const Problem p, Workspace w) {
  const long long chunks = p.T / kChunk;
  const long long id = static_cast<long long>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (id >= p.B * chunks * p.H) return;
  const int lane = threadIdx.x & 31, h = static_cast<int>(id % p.H);
  const long long n = (id / p.H) % chunks, b = id / p.H / chunks;
  const long long t = b * p.T + n * kChunk + 2 * lane;
  const float total = warp_sum(p.g[t * p.H + h] + p.g[(t + 1) * p.H + h]);
  if (lane == 0) w.chunk_gate[(b * chunks + n) * p.H + h] = total;
}

// ---- 3. combine: 128 threads per block, one per 4 state elements of one (batch, head) ---------------------
// Each block first sums the chunk gates of every segment (fixed order: the runs are deterministic).
constexpr int kCombineThreads = 128;

__global__ void __launch_bounds__(kCombineThreads) combine(const Problem p, int P, Workspace w) {
  __shared__ float warp_part[kCombineThreads / 32];
  __shared__ float G_end[kMaxSegments];
  const int h = blockIdx.y, b = blockIdx.z, chunks_per_segment = p.T / P / kChunk;
  for (int segment = 0; segment < P && p.g; ++segment) {
    float part = 0.0f;
    for (int i = threadIdx.x; i < chunks_per_segment; i += kCombineThreads)
      part += w.chunk_gate[(static_cast<long long>(b) * (p.T / kChunk) + segment * chunks_per_segment + i) * p.H + h];
    part = warp_sum(part);
    if ((threadIdx.x & 31) == 0) warp_part[threadIdx.x >> 5] = part;
    __syncthreads();
    if (threadIdx.x == 0) G_end[segment] = warp_part[0] + warp_part[1] + warp_part[2] + warp_part[3];
    __syncthreads();
  }
  const long long KV = static_cast<long long>(p.K) * p.V;
  const long long e = (static_cast<long long>(blockIdx.x) * kCombineThreads + threadIdx.x) * 4;
  if (e >= KV) return;
  float4 S = p.h0 ? *reinterpret_cast<const float4*>(p.h0 + (static_cast<long long>(b) * p.H + h) * KV + e)
                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int segment = 0; segment < P; ++segment) {
    float4* slot = reinterpret_cast<float4*>(w.states + ((static_cast<long long>(b) * P + segment) * p.H + h) * KV + e);
    const float4 local = *slot;
    *slot = S;
    const float decay = p.g ? expf(G_end[segment]) : 1.0f;
    S = make_float4(decay * S.x + local.x, decay * S.y + local.y, decay * S.z + local.z, decay * S.w + local.w);
  }
  *reinterpret_cast<float4*>(p.ht + (static_cast<long long>(b) * p.H + h) * KV + e) = S;
}

// ---- 4. correction: one block per (column block, head, batch x segment x run of kRunChunks chunks) ---------
template <int K, int kCols>
struct CorrectionLayout {
  static constexpr int kLdS = kCols + 8, kLdQ = K + 8;
  static constexpr size_t kBytes = (K * kLdS + 2 * kChunk * kLdQ + 2 * kChunk * kLdS) * sizeof(bf16);
  unsigned char* base;
  __device__ bf16* S() const { return reinterpret_cast<bf16*>(base); }
  __device__ bf16* Q(int buffer) const { return S() + K * kLdS + buffer * kChunk * kLdQ; }
  __device__ bf16* O(int buffer) const { return Q(2) + buffer * kChunk * kLdS; }  // o's tile, [kChunk][kLdS]
};

template <int K, int kCols>
__global__ void __launch_bounds__(kThreads) correction(const Problem p, int P, int first_segment, Workspace w) {
  using Layout = CorrectionLayout<K, kCols>;
  constexpr int kNT = kCols / 16;  // each warp's 8-column tiles: half the block's columns
  extern __shared__ __align__(16) unsigned char smem[];
  const Layout L{smem};

  const int chunks_per_segment = p.T / P / kChunk, runs = ceil_div(chunks_per_segment, kRunChunks);
  const int c0 = blockIdx.x * kCols, h = blockIdx.y;
  const int run = blockIdx.z % runs, segments = P - first_segment;
  const int segment = first_segment + (blockIdx.z / runs) % segments, b = blockIdx.z / runs / segments;
  const int n_begin = segment * chunks_per_segment + run * kRunChunks;  // chunk index inside sequence b
  const int n_end = min(n_begin + kRunChunks, (segment + 1) * chunks_per_segment);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, m0 = 16 * (warp % 4), n0 = (kCols / 2) * (warp / 4);

  const bf16* q = static_cast<const bf16*>(p.q);
  bf16* o = static_cast<bf16*>(p.o);
  const int qk_heads = qk_heads_of(p), qk_head = qk_head_of(p, h);
  const auto token_of = [&](int n) { return static_cast<long long>(b) * p.T + static_cast<long long>(n) * kChunk; };
  const auto row_of = [&](int n) { return token_of(n) * p.H + h; };
  const auto copy_q = [&](int n, int buffer) {  // chunk n's q and o tile, 16 bytes per copy
    cp_async_rows(L.Q(buffer), Layout::kLdQ, q + (token_of(n) * qk_heads + qk_head) * K,
                  static_cast<long long>(qk_heads) * K, kChunk, K, kChunk);
    cp_async_rows(L.O(buffer), Layout::kLdS, o + row_of(n) * p.V + c0, static_cast<long long>(p.H) * p.V, kChunk,
                  kCols, kChunk);
    cp_async_commit();
  };
  copy_q(n_begin, 0);

  // S_p's columns c0 .. c0 + kCols, fp32 -> bf16, 4 elements per load.
  const float* S = w.states + ((static_cast<long long>(b) * P + segment) * p.H + h) * K * p.V + c0;
  for (int i = threadIdx.x; i < K * kCols / 4; i += kThreads) {
    const int r = i / (kCols / 4), c = (i % (kCols / 4)) * 4;
    const float4 x = *reinterpret_cast<const float4*>(S + static_cast<long long>(r) * p.V + c);
    store_bf16x2(L.S() + r * Layout::kLdS + c, x.x, x.y);
    store_bf16x2(L.S() + r * Layout::kLdS + c + 2, x.z, x.w);
  }

  // The gate summed from the segment's first token to the run's first: the chunk sums before it, by each warp.
  float offset = 0.0f;
  if (p.g) {
    for (int n = segment * chunks_per_segment + lane; n < n_begin; n += 32)
      offset += w.chunk_gate[(static_cast<long long>(b) * (p.T / kChunk) + n) * p.H + h];
    offset = warp_sum(offset);
  }

  for (int n = n_begin; n < n_end; ++n) {
    const int buffer = (n - n_begin) & 1;
    if (n + 1 < n_end) {
      copy_q(n + 1, buffer ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // chunk n's q has landed for every thread; S is stored

    const long long t_first = token_of(n);  // b T + 64 n: this chunk's first token
    // scale exp(G_t) for this thread's two rows: the offset plus the chunk's inclusive scan (lane l: 2 l, 2 l + 1).
    float factor[2] = {p.scale, p.scale};
    if (p.g) {
      const float2 G = chunk_cumsum_64(p.g[(t_first + 2 * lane) * p.H + h], p.g[(t_first + 2 * lane + 1) * p.H + h]);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = m0 + acc_row(0, 2 * half);
        const float Gx = __shfl_sync(kFullMask, G.x, r / 2), Gy = __shfl_sync(kFullMask, G.y, r / 2);
        factor[half] = p.scale * expf(offset + (r % 2 ? Gy : Gx));
      }
      offset += __shfl_sync(kFullMask, G.y, 31);
    }

    float acc[1][kNT][4];
    zero(acc);
    warp_mma_unrolled<1, kNT, Stored::kRowMajor, Stored::kRowMajor, K / 16>(acc, L.Q(buffer), Layout::kLdQ, L.S(),
                                                                             Layout::kLdS, m0, n0, 0);
    // o += the product, in the shared tile (each thread its own accumulator positions), then the tile back to o
    // with 16-byte stores: o's rows are only kCols * 2 bytes long, so the fragments' 4-byte accesses used half of
    // every 32-byte sector they touched.
    bf16* tile = L.O(buffer);
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        bf16* at = tile + (m0 + acc_row(0, 2 * half)) * Layout::kLdS + n0 + acc_col(j, 2 * half);
        const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at));
        store_bf16x2(at, x.x + factor[half] * acc[0][j][2 * half], x.y + factor[half] * acc[0][j][2 * half + 1]);
      }
    __syncthreads();  // the tile is complete
    for (int i = threadIdx.x; i < kChunk * kCols / 8; i += kThreads) {
      const int r = i / (kCols / 8), c = (i % (kCols / 8)) * 8;
      *reinterpret_cast<uint4*>(o + ((t_first + r) * p.H + h) * p.V + c0 + c) =
          *reinterpret_cast<const uint4*>(tile + r * Layout::kLdS + c);
    }
    __syncthreads();  // every warp is done with this buffer before chunk n + 2's copy overwrites it
  }
}

template <int K, int kCols>
void launch_correction(const Problem& p, int P, int first_segment, const Workspace& w) {
  const int runs = ceil_div(p.T / P / kChunk, kRunChunks);
  const dim3 grid(p.V / kCols, p.H, p.B * (P - first_segment) * runs);
  launch_checked(p, "linear_v8_correction", correction<K, kCols>, grid, kThreads, CorrectionLayout<K, kCols>::kBytes,
                 P, first_segment, w);
}

// The split around a chunk pass (v7's forward for v8, its K = 256 launch for v9, the wgmma pass for v10).
void split_forward(const Problem& p, const char* name, void (*chunk_pass)(const Problem&), int P) {
  // Packed sequences run as the plain pass: one block per sequence's chain already spreads a packed batch over the
  // SMs, and a segment must not straddle two sequences.
  if (P == 1 || p.cu_seqlens) return chunk_pass(p);
  const size_t needed = split_bytes(P, p.B, p.T, p.H, p.K, p.V);  // P as the caller chose it, not chosen again
  require_workspace(p, name, needed, false);
  const Workspace w = carve(p, P);

  Problem segments = p;  // 1. the [B P, T / P] view: same arrays, no start state, final states into L_p
  segments.B = p.B * P;
  segments.T = p.T / P;
  segments.h0 = nullptr;
  segments.ht = w.states;
  segments.workspace = nullptr;
  segments.workspace_size = 0;
  chunk_pass(segments);

  if (p.g) {
    const long long warps = static_cast<long long>(p.B) * (p.T / kChunk) * p.H;
    launch_checked(p, "linear_v8_chunk_gates", chunk_gates, dim3(static_cast<unsigned>((warps + kWarps - 1) / kWarps)),
                   kThreads, 0, w);
  }
  launch_checked(p, "linear_v8_combine", combine, dim3(ceil_div(p.K * p.V / 4, kCombineThreads), p.H, p.B),
                 kCombineThreads, 0, P, w);

  const int first_segment = p.h0 ? 0 : 1;
  const bool wide = column_block(p.V) == 128;
  if (p.K == 64) wide ? launch_correction<64, 128>(p, P, first_segment, w) : launch_correction<64, 64>(p, P, first_segment, w);
  else if (p.K == 128) wide ? launch_correction<128, 128>(p, P, first_segment, w) : launch_correction<128, 64>(p, P, first_segment, w);
  else wide ? launch_correction<256, 128>(p, P, first_segment, w) : launch_correction<256, 64>(p, P, first_segment, w);
}

void forward(const Problem& p) {
  const char* name = "linear_v8_split_sequence";
  check_tensor_core_problem(p, name, false, kBlockV);
  split_forward(p, name, linear_v7.forward, choose_segments(p.B, p.T, p.H, p.K, p.V));
}

}  // namespace linear_split

extern const Version linear_v8 = {
    "linear", 8, "split_sequence",
    "v7 on P segments of each sequence at once, each segment's start state then rebuilt by a pass over the segments and its contribution added to the outputs on tensor cores: with few (batch, head) pairs v7 leaves most SMs idle (P chosen per shape by a cost model; P = 1 is v7).",
    false, true, kTensorCoreShape, 90, linear_split::workspace_bytes, linear_split::forward, 0, nullptr, nullptr,
    kReadsPacked};

}  // namespace minilin
