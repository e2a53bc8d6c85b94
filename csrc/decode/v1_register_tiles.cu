// decode v1 (register tiles): one token for each of N sequences, every mixer of both families in one kernel,
// one block per (sequence, head, 32 value columns) with its K x 32 slice of the fp32 state in registers, read
// once and written once with 16-byte accesses, because a decode step does ~4 multiply-adds per state element
// and is bound by moving the state through DRAM.
//
// The step, with a the decay (1, exp(g) for every key row, or exp(g_f) for key row f) and S' = diag(a) S:
//     linear:  u = v                                   S_t = S' + k u^T
//     delta:   u = beta (v - S'^T k)                   S_t = S' + k u^T
//     o = scale S_t^T q = S'^T (scale q) + (k . scale q) u
// Both reads over the key rows come from the state as loaded, S'^T x = S^T (a * x), so one reduction over the
// key rows gives S'^T k and S'^T q together, and the update and the output follow from them without a second
// pass: the state is read once and written once, as the bandwidth floor counts it.
//
// Layout: 128 threads = 16 row groups x 8 column threads. Column thread c holds value columns 4c .. 4c + 3 of the
// block's 32 (one float4 of each state row it owns); row group r holds key rows r, r + 16, r + 32, ...
// (ROWS = ceil(K / 16) of them). A warp is 4 row groups x 8 column threads, so one warp-wide load covers 4 rows
// x 128 bytes: whole 32-byte sectors, 16 bytes per thread. The reduction over key rows: each thread's ROWS rows in
// registers, the warp's 4 row groups by two xor-shuffles (lanes c, c + 8, c + 16, c + 24), the block's 4 warps
// through shared memory; two block barriers in all (the other one publishes q, k, the decays and the sums
// k . q, |q|^2, |k|^2). Splitting the value columns over blocks (V / 32 per head) gives a small batch enough
// blocks: N = 1, H = 16, V = 128 is 64 blocks.
//
// Continuous batching: sequence n reads state row in_indices[n] and writes row out_indices[n] (minilin_cuda.h);
// in place both are the same row, and each thread writes back exactly the elements it read.
#include "../common/device.cuh"
#include "../common/launch.cuh"

namespace minilin {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kBlockColumns = 32;                    // value columns per block
constexpr int kColumnThreads = kBlockColumns / 4;    // 4 columns (16 bytes of fp32 state) per thread
constexpr int kRowGroups = kThreads / kColumnThreads;  // 16
constexpr int kMaxK = 256;                           // key rows: ROWS = K / 16 <= 16 registers of float4
constexpr ShapeRule kDecodeShape{kMaxK, {0, 0}, 4};  // any K up to kMaxK, V in whole float4s of state
constexpr float kNormEps = 1e-6f;  // normalize_qk: minilin.activations.L2_EPS, FLA's l2norm eps

// Row n of an index array of int32 or int64.
__device__ __forceinline__ long long index_at(const void* indices, int n, bool int64) {
  return int64 ? static_cast<const long long*>(indices)[n] : static_cast<const int*>(indices)[n];
}

// Four consecutive elements of v (16-byte aligned for float, 8-byte for bf16) as floats; one of o stored back.
__device__ __forceinline__ void load4(const float* p, float (&x)[4]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float (&x)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
}
__device__ __forceinline__ void store4(float* p, const float (&x)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float (&x)[4]) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x[0], x[1]), hi = __floats2bfloat162_rn(x[2], x[3]);
  uint2 raw;
  raw.x = *reinterpret_cast<const unsigned*>(&lo);
  raw.y = *reinterpret_cast<const unsigned*>(&hi);
  *reinterpret_cast<uint2*>(p) = raw;
}

template <typename Elem, bool kDelta, int ROWS>
__global__ void __launch_bounds__(kThreads) decode_v1_register_tiles(const DecodeProblem p) {
  static_assert(ROWS * kRowGroups <= kMaxK, "the shared rows hold kMaxK keys");
  __shared__ float s_q[kMaxK], s_k[kMaxK], s_a[kMaxK];  // q_f, k_f as given, a_f the decay of key row f
  __shared__ float s_sums[kWarps][3];                    // per warp: k . q, |q|^2, |k|^2
  __shared__ float4 s_partial[kWarps][kColumnThreads][2];  // per warp and column thread: S'^T q, S'^T k (4 columns)

  const int K = p.K, V = p.V, H = p.H;
  const int tiles = (V + kBlockColumns - 1) / kBlockColumns;
  const int tile = blockIdx.x % tiles, nh = blockIdx.x / tiles;
  const int h = nh % H, n = nh / H;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ct = tid % kColumnThreads, rg = tid / kColumnThreads;
  const int col = tile * kBlockColumns + 4 * ct;  // this thread's first value column
  const bool col_ok = col < V;                    // V % 4 == 0: its four columns are all in or all out
  const long long vec = static_cast<long long>(n) * H + h;  // (n, h) in [N, H]

  // Which state rows this sequence reads and writes; a row outside its pool touches nothing (NaN out instead).
  const long long src = p.in_indices ? index_at(p.in_indices, n, p.indices_int64) : n;
  const long long dst = p.out_indices ? index_at(p.out_indices, n, p.indices_int64) : n;
  const bool src_ok = p.state_in == nullptr || (src >= 0 && src < p.pool_in);
  const bool dst_ok = dst >= 0 && dst < p.pool_out;
  const long long out_head = (dst * H + h) * K * static_cast<long long>(V);  // (dst, h) in state_out
  if (!src_ok || !dst_ok) {  // uniform over the block, before any barrier
    const float nan = __int_as_float(0x7fffffff);
    if (rg == 0 && col_ok) {
      const float x[4] = {nan, nan, nan, nan};
      store4(static_cast<Elem*>(p.o) + vec * V + col, x);
    }
    if (dst_ok && p.state_out != p.state_in && col_ok)
      for (int row = rg; row < K; row += kRowGroups)
        *reinterpret_cast<float4*>(p.state_out + out_head + static_cast<long long>(row) * V + col) =
            make_float4(nan, nan, nan, nan);
    return;
  }

  // 1. Every load the step needs, issued before any of them is used, so that the step waits out one DRAM round
  //    trip rather than two (ncu at N = 256: the q, k and gate loads issued after the state's had arrived held
  //    ~20% of the warps' samples, and KDA's per-channel gate made that wait longer than Gated DeltaNet's).
  //    q_f, k_f and the log-gate g_f of key rows f = tid + 128 j (to registers; staged in step 2), then
  //    S[i] = columns col .. col + 3 of key row rg + 16 i.
  const Elem* q = static_cast<const Elem*>(p.q) + vec * K;
  const Elem* k = static_cast<const Elem*>(p.k) + vec * K;
  constexpr int kKeysPerThread = kMaxK / kThreads;
  float q_in[kKeysPerThread], k_in[kKeysPerThread], g_in[kKeysPerThread];
#pragma unroll
  for (int j = 0; j < kKeysPerThread; ++j) {
    const int f = tid + kThreads * j;
    const bool ok = f < K;
    q_in[j] = ok ? to_float(q[f]) : 0.0f;
    k_in[j] = ok ? to_float(k[f]) : 0.0f;
    g_in[j] = ok && p.gate == kChannelGate ? p.g[vec * K + f] : 0.0f;
  }
  const float head_log_decay = p.gate == kScalarGate ? p.g[vec] : 0.0f;
  float4 S[ROWS];
  const long long in_head = (src * H + h) * K * static_cast<long long>(V);
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const int row = rg + kRowGroups * i;
    S[i] = (p.state_in && col_ok && row < K)
               ? *reinterpret_cast<const float4*>(p.state_in + in_head + static_cast<long long>(row) * V + col)
               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float vc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (col_ok) load4(static_cast<const Elem*>(p.v) + vec * V + col, vc);
  const float beta = kDelta ? p.beta[vec] : 0.0f;

  // 2. q, k and the decays into shared memory, with the block's sums k . q, |q|^2, |k|^2 (the rows past K add 0).
  const float head_decay = p.gate == kScalarGate ? expf(head_log_decay) : 1.0f;
  float kq = 0.0f, qq = 0.0f, kk = 0.0f;
#pragma unroll
  for (int j = 0; j < kKeysPerThread; ++j) {
    const int f = tid + kThreads * j;
    const float qf = q_in[j], kf = k_in[j];
    if (f < K) {
      s_q[f] = qf;
      s_k[f] = kf;
      s_a[f] = p.gate == kChannelGate ? expf(g_in[j]) : head_decay;
    }
    kq = fmaf(kf, qf, kq);
    qq = fmaf(qf, qf, qq);
    kk = fmaf(kf, kf, kk);
  }
  kq = warp_sum(kq);
  qq = warp_sum(qq);
  kk = warp_sum(kk);
  if (lane == 0) s_sums[warp][0] = kq, s_sums[warp][1] = qq, s_sums[warp][2] = kk;
  __syncthreads();
  kq = qq = kk = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) kq += s_sums[w][0], qq += s_sums[w][1], kk += s_sums[w][2];
  // q_t as the read uses it is scale q / |q| (or scale q), k_t is k / |k| (or k)
  const float q_factor = p.scale * (p.normalize_qk ? 1.0f / sqrtf(qq + kNormEps) : 1.0f);
  const float k_factor = p.normalize_qk ? 1.0f / sqrtf(kk + kNormEps) : 1.0f;
  const float k_dot_q = kq * q_factor * k_factor;  // k_t . (scale q_t)

  // 3. This thread's share of S'^T (scale q) and S'^T k over its key rows: S'^T x = S^T (a * x).
  float read[4] = {0.0f, 0.0f, 0.0f, 0.0f}, predict[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    const int row = rg + kRowGroups * i;
    if (row < K) {  // rows past K hold zeros, but their shared entries were never written
      const float a = s_a[row], qa = a * q_factor * s_q[row], ka = a * k_factor * s_k[row];
      const float s[4] = {S[i].x, S[i].y, S[i].z, S[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        read[j] = fmaf(s[j], qa, read[j]);
        if (kDelta) predict[j] = fmaf(s[j], ka, predict[j]);
      }
    }
  }
  // ... summed over the warp's 4 row groups (lanes ct, ct + 8, ct + 16, ct + 24), then over the block's warps
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int offset = kColumnThreads; offset < 32; offset <<= 1) {
      read[j] += __shfl_xor_sync(kFullMask, read[j], offset);
      if (kDelta) predict[j] += __shfl_xor_sync(kFullMask, predict[j], offset);
    }
  }
  if (lane < kColumnThreads) {
    s_partial[warp][ct][0] = make_float4(read[0], read[1], read[2], read[3]);
    s_partial[warp][ct][1] = make_float4(predict[0], predict[1], predict[2], predict[3]);
  }
  __syncthreads();
  float Sq[4] = {0.0f, 0.0f, 0.0f, 0.0f}, Sk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float4 r = s_partial[w][ct][0], d = s_partial[w][ct][1];
    Sq[0] += r.x, Sq[1] += r.y, Sq[2] += r.z, Sq[3] += r.w;
    Sk[0] += d.x, Sk[1] += d.y, Sk[2] += d.z, Sk[3] += d.w;
  }

  // 4. What is written for k_t (u), the state S_t = S' + k_t u^T, and o = S'^T (scale q) + (k . scale q) u.
  float u[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) u[j] = kDelta ? beta * (vc[j] - Sk[j]) : vc[j];
  if (col_ok) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const int row = rg + kRowGroups * i;
      if (row < K) {
        const float a = s_a[row], kr = k_factor * s_k[row];
        const float4 s = S[i];
        *reinterpret_cast<float4*>(p.state_out + out_head + static_cast<long long>(row) * V + col) =
            make_float4(fmaf(a, s.x, kr * u[0]), fmaf(a, s.y, kr * u[1]), fmaf(a, s.z, kr * u[2]),
                        fmaf(a, s.w, kr * u[3]));
      }
    }
    if (rg == 0) {
      float out[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) out[j] = fmaf(k_dot_q, u[j], Sq[j]);
      store4(static_cast<Elem*>(p.o) + vec * V + col, out);
    }
  }
}

template <typename Elem, bool kDelta, int ROWS>
void launch(const DecodeProblem& p, const char* name) {
  const long long blocks = static_cast<long long>(p.N) * p.H * ceil_div(p.V, kBlockColumns);
  launch_checked(p, name, decode_v1_register_tiles<Elem, kDelta, ROWS>, dim3(static_cast<unsigned>(blocks)), kThreads, 0);
}

template <typename Elem, bool kDelta>
void launch_rows(const DecodeProblem& p, const char* name) {
  if (p.K <= 16) return launch<Elem, kDelta, 1>(p, name);
  if (p.K <= 32) return launch<Elem, kDelta, 2>(p, name);
  if (p.K <= 64) return launch<Elem, kDelta, 4>(p, name);
  if (p.K <= 128) return launch<Elem, kDelta, 8>(p, name);
  return launch<Elem, kDelta, 16>(p, name);
}

void decode(const DecodeProblem& p) {
  constexpr const char* name = "decode_v1_register_tiles";
  check_decode_problem(p, name, kMaxK, kBlockColumns);
  if (p.dtype == kFloat32) {
    if (p.delta) return launch_rows<float, true>(p, name);
    return launch_rows<float, false>(p, name);
  }
  if (p.delta) return launch_rows<__nv_bfloat16, true>(p, name);
  return launch_rows<__nv_bfloat16, false>(p, name);
}

}  // namespace

extern const Version decode_v1 = {
    "decode", 1, "register_tiles",
    "One token per sequence: one block per (sequence, head, 32 value columns), its state slice in registers, read "
    "and written once with 16-byte accesses.",
    true, true, kDecodeShape, 80, nullptr, nullptr, 0, decode};

}  // namespace minilin
