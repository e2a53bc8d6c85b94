// kda v2 (chunked, CUDA cores): the chunked WY form of the delta rule (minilin/mixers/_delta_rule.py `chunked`) with
// a decay per key channel, chunks of 64 tokens as dense products plus one triangular solve per chunk, because that
// turns 64 sequential rank-1 updates of the state into matrix work; the per-channel decays go through gla v2's
// 16-token sub-chunk references, so that only non-positive numbers are exponentiated; fp32 on plain CUDA cores.
//
// One block per (batch, head, 32 value columns), sequential over the chunks, the K x 32 state S in shared memory.
// With gla v2's names (Gs_i the cumulative gate from the start of token i's sub-chunk a to i, D_a its total,
// E[a][b] = exp(D_b + ... + D_{a-1}) the decay over sub-chunks b .. a-1), G_i = D_0 + ... + D_{a-1} + Gs_i the
// chunk-local cumulative gate, and for token t of sub-chunk a, token j of sub-chunk b:
//     A_tj = beta_t sum_f k_tf k_jf exp(G_tf - G_jf)   j < t     (the WY system's strictly lower part)
//     P_tj = sum_f q_tf k_jf exp(G_tf - G_jf)           j <= t    (the output's intra-chunk scores)
// each built as in gla v2: term by term when b = a, else through q~ = q exp(Gs), k~ = k exp(Gs) (from the
// sub-chunk's start), k^ = k exp(D_b - Gs) (to its end) and E[a][b+1]. Then
//     (I + A) Delta = diag(beta) (V - K_e S),  K_e,t = k~_t E[a][0] = k_t exp(G_t)    forward substitution
//     O = Q_e S + P Delta,                      Q_e,t = q~_t E[a][0]
//     S <- diag(E[4][0]) S + sum_j (k^_j E[4][b+1])^T Delta_j                         (k_j exp(G_C - G_j))
// Delta_t = beta_t (v_t - S'_{t-1}^T k_t) is the correction token t writes (S' the state decayed by g_t). q is
// multiplied by scale as it is loaded; q and k arrive L2-normalized when the caller asked (the front's pre-pass).
#include "../common/launch.cuh"
#include "../common/simt.cuh"

namespace minilin {
namespace {

constexpr int kBlockV = 32;           // value columns per block
constexpr int kThreads = 256;
constexpr int kSub = 16;              // tokens per sub-chunk
constexpr int kSubs = kChunk / kSub;  // 4
constexpr int kE = kSubs + 1;         // E[a][b] for a, b in 0 .. kSubs
constexpr int kLdV = kBlockV + 1;     // odd row strides keep the shared loads of a warp's 32 rows conflict-free
constexpr int kLdC = kChunk + 1;

__host__ __device__ inline size_t shared_floats(int K) {
  return 4 * size_t(kChunk) * (K + 1)  // q (then q~), k (then k^), k~, g (then Gs)
         + 2 * size_t(kChunk) * kLdV   // v, Delta
         + 2 * size_t(kChunk) * kLdC   // A, P
         + size_t(K) * kLdV            // S
         + size_t(kE) * kE * K         // E
         + kChunk;                     // beta
}

template <typename Elem>
__global__ void __launch_bounds__(kThreads, 1) kda_v2_chunked(const Problem p) {
  extern __shared__ __align__(16) float smem[];
  const int K = p.K, V = p.V, T = p.T, H = p.H, ldk = K + 1;
  float* q_s = smem;                   // [kChunk][ldk]: scale q, then q~ = scale q exp(Gs)
  float* k_s = q_s + kChunk * ldk;     // [kChunk][ldk]: k, then k^ = k exp(D - Gs)
  float* kt_s = k_s + kChunk * ldk;    // [kChunk][ldk]: k~ = k exp(Gs)
  float* G_s = kt_s + kChunk * ldk;    // [kChunk][ldk]: g, then Gs
  float* v_s = G_s + kChunk * ldk;     // [kChunk][kLdV]
  float* delta_s = v_s + kChunk * kLdV;  // [kChunk][kLdV]: the residual, then Delta (solved in place)
  float* A_s = delta_s + kChunk * kLdV;  // [kChunk][kLdC], j < t only
  float* P_s = A_s + kChunk * kLdC;      // [kChunk][kLdC], j <= t only
  float* S_s = P_s + kChunk * kLdC;      // [K][kLdV]
  float* E_s = S_s + K * kLdV;           // [kE][kE][K]: E[a][b][f] at (a * kE + b) * K + f
  float* beta_s = E_s + kE * kE * K;     // [kChunk]
  const auto E = [&](int a, int b) { return E_s + (a * kE + b) * K; };

  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long state_base = (static_cast<long long>(b) * H + h) * K * V;
  for (int i = threadIdx.x; i < K * kBlockV; i += kThreads) {
    const int row = i / kBlockV, c = i % kBlockV, col = v0 + c;
    S_s[row * kLdV + c] = (p.h0 && col < V) ? p.h0[state_base + static_cast<long long>(row) * V + col] : 0.0f;
  }

  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  const Elem* v = static_cast<const Elem*>(p.v);
  Elem* o = static_cast<Elem*>(p.o);
  for (int t0 = 0; t0 < T; t0 += kChunk) {
    // 1. the chunk on chip, zero past T (a zero beta, key and value write nothing, a zero gate decays nothing)
    load_chunk_f32(q_s, ldk, q, p, b, h, t0, K, 0, K, p.scale);
    load_chunk_f32(k_s, ldk, k, p, b, h, t0, K, 0, K, 1.0f);
    load_chunk_f32(G_s, ldk, p.g, p, b, h, t0, K, 0, K, 1.0f);
    load_chunk_f32(v_s, kLdV, v, p, b, h, t0, V, v0, kBlockV, 1.0f);
    load_chunk_scalars(beta_s, p.beta, p, b, h, t0);
    __syncthreads();

    // 2. Gs: the running sum of g within each sub-chunk, one thread per (sub-chunk, channel)
    for (int i = threadIdx.x; i < kSubs * K; i += kThreads) {
      const int a = i / K, f = i % K;
      float running = 0.0f;
      for (int l = 0; l < kSub; ++l) {
        float& x = G_s[(a * kSub + l) * ldk + f];
        running += x;
        x = running;
      }
    }
    __syncthreads();

    // 3. the diagonal sub-chunk blocks of A and P term by term (exp(Gs_t - Gs_j) <= 0 for j <= t), and E
    for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kThreads) {
      const int t = idx / kChunk, j = idx % kChunk;
      if (j > t || j / kSub != t / kSub) continue;
      const float* qt = q_s + t * ldk;
      const float* kt = k_s + t * ldk;
      const float* kj = k_s + j * ldk;
      const float* Gt = G_s + t * ldk;
      const float* Gj = G_s + j * ldk;
      float score = 0.0f, gram = 0.0f;
      for (int f = 0; f < K; ++f) {
        const float d = expf(Gt[f] - Gj[f]) * kj[f];
        score = fmaf(qt[f], d, score);
        gram = fmaf(kt[f], d, gram);
      }
      P_s[t * kLdC + j] = score;
      A_s[t * kLdC + j] = j < t ? beta_s[t] * gram : 0.0f;
    }
    for (int f = threadIdx.x; f < K; f += kThreads) {
      float D[kSubs];
#pragma unroll
      for (int a = 0; a < kSubs; ++a) D[a] = G_s[(a * kSub + kSub - 1) * ldk + f];
#pragma unroll
      for (int lo = 0; lo < kE; ++lo) {
        float sum = 0.0f;  // D_lo + ... + D_{hi - 1}: at most 4 sub-chunk totals, <= 0
#pragma unroll
        for (int hi = lo; hi < kE; ++hi) {
          E(hi, lo)[f] = expf(sum);
          if (hi < kSubs) sum += D[hi];
        }
      }
    }
    __syncthreads();

    // 4. q~ = q exp(Gs), k~ = k exp(Gs), k^ = k exp(D - Gs) (Gs is no longer needed after this)
    for (int idx = threadIdx.x; idx < kChunk * K; idx += kThreads) {
      const int i = idx / K, f = idx % K;
      const float Gi = G_s[i * ldk + f];
      const float D = G_s[((i / kSub) * kSub + kSub - 1) * ldk + f];
      const float from_start = expf(Gi), to_end = expf(D - Gi);
      const float ki = k_s[i * ldk + f];
      q_s[i * ldk + f] *= from_start;
      kt_s[i * ldk + f] = ki * from_start;
      k_s[i * ldk + f] = ki * to_end;
    }
    __syncthreads();

    // 5. the blocks below the diagonal: P_tj = sum_f q~_tf k^_jf E[a][b+1][f], A_tj = beta_t sum_f k~_tf k^_jf E[..]
    for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kThreads) {
      const int t = idx / kChunk, j = idx % kChunk, a = t / kSub, bj = j / kSub;
      if (bj >= a) continue;
      const float* qt = q_s + t * ldk;
      const float* kt = kt_s + t * ldk;
      const float* kj = k_s + j * ldk;
      const float* W = E(a, bj + 1);
      float score = 0.0f, gram = 0.0f;
      for (int f = 0; f < K; ++f) {
        const float d = W[f] * kj[f];
        score = fmaf(qt[f], d, score);
        gram = fmaf(kt[f], d, gram);
      }
      P_s[t * kLdC + j] = score;
      A_s[t * kLdC + j] = beta_s[t] * gram;
    }
    // 6. the residual beta_t (v_t - K_e,t S), K_e,t = k~_t E[a][0] (reads S, k~ and E only: no barrier needed after 5)
    for (int idx = threadIdx.x; idx < kChunk * kBlockV; idx += kThreads) {
      const int t = idx / kBlockV, c = idx % kBlockV;
      const float* kt = kt_s + t * ldk;
      const float* Wt = E(t / kSub, 0);
      float predicted = 0.0f;
      for (int f = 0; f < K; ++f) predicted = fmaf(kt[f] * Wt[f], S_s[f * kLdV + c], predicted);
      delta_s[t * kLdV + c] = beta_s[t] * (v_s[t * kLdV + c] - predicted);
    }
    __syncthreads();

    // 7. (I + A) Delta = residual by forward substitution, one thread per value column (row t reads rows j < t,
    //    already solved)
    if (warp == 0) {
      const int c = lane;
      for (int t = 1; t < kChunk; ++t) {
        float x = delta_s[t * kLdV + c];
        for (int j = 0; j < t; ++j) x = fmaf(-A_s[t * kLdC + j], delta_s[j * kLdV + c], x);
        delta_s[t * kLdV + c] = x;
      }
    }
    __syncthreads();

    // 8. o_t = Q_e,t S + sum_{j <= t} P_tj Delta_j
    for (int idx = threadIdx.x; idx < kChunk * kBlockV; idx += kThreads) {
      const int t = idx / kBlockV, c = idx % kBlockV, tok = t0 + t, col = v0 + c;
      const float* qt = q_s + t * ldk;
      const float* Wt = E(t / kSub, 0);
      float read = 0.0f, intra = 0.0f;
      for (int f = 0; f < K; ++f) read = fmaf(qt[f] * Wt[f], S_s[f * kLdV + c], read);
      for (int j = 0; j <= t; ++j) intra = fmaf(P_s[t * kLdC + j], delta_s[j * kLdV + c], intra);
      if (tok < T && col < V)
        o[((static_cast<long long>(b) * T + tok) * H + h) * V + col] = from_float<Elem>(read + intra);
    }
    __syncthreads();  // every read of S is done before it changes

    // 9. S <- diag(E[4][0]) S + sum_j (k^_j E[4][b+1])^T Delta_j: each thread its own elements of S
    for (int idx = threadIdx.x; idx < K * kBlockV; idx += kThreads) {
      const int f = idx / kBlockV, c = idx % kBlockV;
      float acc = E(kSubs, 0)[f] * S_s[f * kLdV + c];
#pragma unroll
      for (int bj = 0; bj < kSubs; ++bj) {
        float part = 0.0f;
        for (int j = bj * kSub; j < (bj + 1) * kSub; ++j) part = fmaf(k_s[j * ldk + f], delta_s[j * kLdV + c], part);
        acc = fmaf(E(kSubs, bj + 1)[f], part, acc);
      }
      S_s[f * kLdV + c] = acc;
    }
    __syncthreads();  // the next chunk overwrites the tiles and reads S
  }

  for (int i = threadIdx.x; i < K * kBlockV; i += kThreads) {
    const int row = i / kBlockV, c = i % kBlockV, col = v0 + c;
    if (col < V) p.ht[state_base + static_cast<long long>(row) * V + col] = S_s[row * kLdV + c];
  }
}

template <typename Elem>
void launch(const Problem& p) {
  launch_checked(p, "kda_v2_chunked", kda_v2_chunked<Elem>, dim3(ceil_div(p.V, kBlockV), p.H, p.B), kThreads,
                 shared_floats(p.K) * sizeof(float));
}

void forward(const Problem& p) {
  check_common(p, "kda_v2_chunked", true);
  require_channel_gate(p, "kda_v2_chunked");
  require(p.K <= kKeysUpTo128.max_k, [&] {
    return "kda_v2_chunked: K must be <= 128 (q, k, the gates and the state share one block's shared memory), got K=" +
           std::to_string(p.K);
  });
  if (p.dtype == kFloat32) launch<float>(p);
  else launch<__nv_bfloat16>(p);
}

}  // namespace

extern const Version kda_v2 = {
    "kda", 2, "chunked",
    "The chunked WY form with a decay per key channel: 64-token chunks as dense fp32 products and one triangular "
    "solve on CUDA cores, the decays through gla v2's 16-token sub-chunk references.",
    true, true, kKeysUpTo128, 80, nullptr, forward};

}  // namespace minilin
