// gla v2 (chunked, CUDA cores): chunks of 64 tokens as dense products inside the chunk plus one state read and one
// state update, as linear v2 does for a decay per head, with GLA's decay per key channel carried through reference
// points inside the chunk so that only non-positive numbers are exponentiated, because a per-channel decay does not
// factor out of Q K^T and exp(-G) overflows (minilin/chunking.py channel_gram); fp32 on plain CUDA cores throughout.
//
// One block per (batch, head, 32 value columns), sequential over the chunks, the K x 32 state in shared memory.
// The chunk's 64 tokens form 4 sub-chunks of 16. With Gs_i[f] = the cumulative gate from the start of token i's
// sub-chunk a = i / 16 to i (inclusive), D_a = Gs at the sub-chunk's last token (its total), and
//     E[a][b][f] = exp(D_b[f] + ... + D_{a-1}[f])   for 0 <= b <= a <= 4   (the decay over sub-chunks b .. a-1),
// the chunk-local cumulative gate is G_i = D_0 + ... + D_{a-1} + Gs_i, and the chunked form
// (minilin/mixers/_gated_linear.py `chunked`) becomes, for token i of sub-chunk a and token j <= i of sub-chunk b:
//     A_ij = sum_f q_if k_jf exp(Gs_if - Gs_jf)                         b = a: term by term
//     A_ij = sum_f q~_if k^_jf E[a][b+1][f]                             b < a: through the reference 16 a - 1
//            q~_i = q_i exp(Gs_i) (decayed from its sub-chunk's start), k^_j = k_j exp(D_b - Gs_j) (to its end)
//     o_i  = sum_{j <= i} A_ij v_j + (q~_i * E[a][0])^T S                state read: q_i exp(G_i)
//     S   <- diag(E[4][0]) S + sum_j (k^_j * E[4][b+1])^T v_j             state update: k_j exp(G_C - G_j)
// Every exponent above is a sum of gates over a span that follows or equals the other's, so <= 0 (Gs is a running
// sum of non-positive numbers, non-increasing even when rounded), and every stored cumulative gate spans at most 16
// tokens, so a difference of two of them keeps float32's precision however strong the gates (a sum over the whole
// chunk at g = -20 would be -1280, whose rounding step is 1.2e-4). q is multiplied by scale as it is loaded.
#include "../common/launch.cuh"
#include "../common/simt.cuh"

namespace minilin {
namespace {

constexpr int kBlockV = 32;         // value columns per block
constexpr int kThreads = 256;
constexpr int kSub = 16;            // tokens per sub-chunk
constexpr int kSubs = kChunk / kSub;  // 4 sub-chunks per chunk
constexpr int kE = kSubs + 1;       // E[a][b] for a, b in 0 .. kSubs
constexpr int kLdV = kBlockV + 1;   // odd row strides keep the shared loads of a warp's 32 rows conflict-free
constexpr int kLdC = kChunk + 1;

__host__ __device__ inline size_t shared_floats(int K) {
  return 3 * size_t(kChunk) * (K + 1)  // q (then q~), k (then k^), g (then Gs)
         + size_t(kChunk) * kLdV       // v
         + size_t(kChunk) * kLdC       // A
         + size_t(K) * kLdV            // S
         + size_t(kE) * kE * K;        // E
}

template <typename Elem>
__global__ void __launch_bounds__(kThreads, 1) gla_v2_chunked(const Problem p) {
  extern __shared__ __align__(16) float smem[];
  const int K = p.K, V = p.V, T = p.T, H = p.H, ldk = K + 1;
  float* q_s = smem;                   // [kChunk][ldk]: scale q, then q~ = scale q exp(Gs)
  float* k_s = q_s + kChunk * ldk;     // [kChunk][ldk]: k, then k^ = k exp(D - Gs)
  float* G_s = k_s + kChunk * ldk;     // [kChunk][ldk]: g, then Gs (cumulative within the sub-chunk)
  float* v_s = G_s + kChunk * ldk;     // [kChunk][kLdV]
  float* A_s = v_s + kChunk * kLdV;    // [kChunk][kLdC], j <= i only
  float* S_s = A_s + kChunk * kLdC;    // [K][kLdV]
  float* E_s = S_s + K * kLdV;         // [kE][kE][K]: E[a][b][f] at (a * kE + b) * K + f
  const auto E = [&](int a, int b) { return E_s + (a * kE + b) * K; };

  const int v0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z;
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
    // 1. the chunk on chip, zero past T (a zero gate decays nothing, a zero key and value write nothing)
    load_chunk_f32(q_s, ldk, q, p, b, h, t0, K, 0, K, p.scale);
    load_chunk_f32(k_s, ldk, k, p, b, h, t0, K, 0, K, 1.0f);
    load_chunk_f32(G_s, ldk, p.g, p, b, h, t0, K, 0, K, 1.0f);
    load_chunk_f32(v_s, kLdV, v, p, b, h, t0, V, v0, kBlockV, 1.0f);
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

    // 3. the diagonal sub-chunk blocks of A term by term (exp(Gs_i - Gs_j) <= 0 for j <= i), and the table E
    for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kThreads) {
      const int i = idx / kChunk, j = idx % kChunk;
      if (j > i || j / kSub != i / kSub) continue;
      const float* qi = q_s + i * ldk;
      const float* kj = k_s + j * ldk;
      const float* Gi = G_s + i * ldk;
      const float* Gj = G_s + j * ldk;
      float acc = 0.0f;
      for (int f = 0; f < K; ++f) acc = fmaf(qi[f] * kj[f], expf(Gi[f] - Gj[f]), acc);
      A_s[i * kLdC + j] = acc;
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

    // 4. q~ = q exp(Gs) and k^ = k exp(D - Gs) in place (Gs is no longer needed after this)
    for (int idx = threadIdx.x; idx < kChunk * K; idx += kThreads) {
      const int i = idx / K, f = idx % K;
      const float Gi = G_s[i * ldk + f];
      const float D = G_s[((i / kSub) * kSub + kSub - 1) * ldk + f];
      q_s[i * ldk + f] *= expf(Gi);
      k_s[i * ldk + f] *= expf(D - Gi);
    }
    __syncthreads();

    // 5. the blocks below the diagonal: A_ij = sum_f q~_if k^_jf E[a][b+1][f]
    for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += kThreads) {
      const int i = idx / kChunk, j = idx % kChunk, a = i / kSub, bj = j / kSub;
      if (bj >= a) continue;
      const float* qi = q_s + i * ldk;
      const float* kj = k_s + j * ldk;
      const float* W = E(a, bj + 1);
      float acc = 0.0f;
      for (int f = 0; f < K; ++f) acc = fmaf(qi[f] * kj[f], W[f], acc);
      A_s[i * kLdC + j] = acc;
    }
    __syncthreads();

    // 6. o_i = sum_{j <= i} A_ij v_j + (q~_i * E[a][0])^T S
    for (int idx = threadIdx.x; idx < kChunk * kBlockV; idx += kThreads) {
      const int i = idx / kBlockV, c = idx % kBlockV, t = t0 + i, col = v0 + c;
      const float* qi = q_s + i * ldk;
      const float* Wi = E(i / kSub, 0);
      float read = 0.0f, intra = 0.0f;
      for (int f = 0; f < K; ++f) read = fmaf(qi[f] * Wi[f], S_s[f * kLdV + c], read);
      for (int j = 0; j <= i; ++j) intra = fmaf(A_s[i * kLdC + j], v_s[j * kLdV + c], intra);
      if (t < T && col < V) o[((static_cast<long long>(b) * T + t) * H + h) * V + col] = from_float<Elem>(read + intra);
    }
    __syncthreads();  // every read of S is done before it changes

    // 7. S <- diag(E[4][0]) S + sum_j (k^_j * E[4][b+1])^T v_j: each thread its own elements of S
    for (int idx = threadIdx.x; idx < K * kBlockV; idx += kThreads) {
      const int f = idx / kBlockV, c = idx % kBlockV;
      float acc = E(kSubs, 0)[f] * S_s[f * kLdV + c];
#pragma unroll
      for (int bj = 0; bj < kSubs; ++bj) {
        float part = 0.0f;
        for (int j = bj * kSub; j < (bj + 1) * kSub; ++j) part = fmaf(k_s[j * ldk + f], v_s[j * kLdV + c], part);
        acc = fmaf(E(kSubs, bj + 1)[f], part, acc);
      }
      S_s[f * kLdV + c] = acc;
    }
    __syncthreads();  // the next chunk overwrites q, k, g, v and reads S
  }

  for (int i = threadIdx.x; i < K * kBlockV; i += kThreads) {
    const int row = i / kBlockV, c = i % kBlockV, col = v0 + c;
    if (col < V) p.ht[state_base + static_cast<long long>(row) * V + col] = S_s[row * kLdV + c];
  }
}

template <typename Elem>
void launch(const Problem& p) {
  launch_checked(p, "gla_v2_chunked", gla_v2_chunked<Elem>, dim3(ceil_div(p.V, kBlockV), p.H, p.B), kThreads,
                 shared_floats(p.K) * sizeof(float));
}

void forward(const Problem& p) {
  check_common(p, "gla_v2_chunked", false);
  require_channel_gate(p, "gla_v2_chunked");
  require(p.K <= kKeysUpTo128.max_k, [&] {
    return "gla_v2_chunked: K must be <= 128 (q, k, the gates and the state share one block's shared memory), got K=" +
           std::to_string(p.K);
  });
  if (p.dtype == kFloat32) launch<float>(p);
  else launch<__nv_bfloat16>(p);
}

}  // namespace

extern const Version gla_v2 = {
    "gla", 2, "chunked",
    "Chunks of 64 tokens as dense products on plain fp32 CUDA cores, the per-channel decays through references "
    "inside the chunk (16-token sub-chunks) so that only non-positive numbers are exponentiated.",
    true, true, kKeysUpTo128, 80, nullptr, forward};

}  // namespace minilin
