// What a split version whose state is affine in its start shares (delta v12, kda v9): over segment p of a sequence,
// S_end = A_p S_start + L_p, with [L_p | A_p] [K, V + K] what the segment's transitions pass stored (its first pass,
// from [0 | I], over segments 0 .. P - 2: transitions row z = b (P - 1) + p, split_segments.cuh's segment_row).
// The combine pass: from S_0 = h0 (zeros without one) the start of every segment follows in order,
//     S_{p+1} = A_p S_p + L_p,   p = 0 .. P - 2,
// in fp32, written to starts [B P, H, K, V] (segment p of sequence b at row b P + p) for the chunk pass that then
// runs every segment from its start into finals [B P, H, K, V]; copy_last_final_states then hands the last
// segment's final states to ht. The three arrays follow the version's own workspace (SplitStates).
#pragma once

#include "launch.cuh"     // launch_checked, check_cuda, stream_of
#include "sequences.cuh"  // workspace_aligned

namespace minilin {
namespace affine_combine {

constexpr int kThreads = 256;
constexpr int kBlockV = 64;  // value columns per block

// The transitions, the starts and the finals, each 256-byte aligned, from `base` on (after the version's own parts).
struct SplitStates {
  float* transitions;  // [B (P - 1), H, K, V + K]
  float* starts;       // [B P, H, K, V]
  float* finals;       // [B P, H, K, V]
};

inline size_t transitions_bytes(int P, int B, int H, int K, int V) {
  return workspace_aligned(static_cast<size_t>(B) * (P - 1) * H * K * (V + K) * sizeof(float));
}
inline size_t states_bytes(int P, int B, int H, int K, int V) {
  return workspace_aligned(static_cast<size_t>(B) * P * H * K * V * sizeof(float));
}
inline size_t split_states_bytes(int P, int B, int H, int K, int V) {
  return transitions_bytes(P, B, H, K, V) + 2 * states_bytes(P, B, H, K, V);
}
inline SplitStates carve_split_states(void* base, int P, int B, int H, int K, int V) {
  auto* at = static_cast<unsigned char*>(base);
  const size_t starts_at = transitions_bytes(P, B, H, K, V), finals_at = starts_at + states_bytes(P, B, H, K, V);
  return {reinterpret_cast<float*>(at), reinterpret_cast<float*>(at + starts_at),
          reinterpret_cast<float*>(at + finals_at)};
}

// S_p's columns [K][64] and A_p [K][K] in shared memory (fp32: 96 KB at K = 128).
template <int K>
struct Layout {
  static constexpr size_t kBytes = (K * K + K * kBlockV) * sizeof(float);
};

// One block per (64 value columns, head, batch); thread t owns column t % 64 and rows t / 64 + 4 m, so a warp reads
// one row of A at a time (a broadcast) and 32 consecutive columns of S (no bank conflicts).
template <int K>
__global__ void __launch_bounds__(kThreads) combine(const Problem p, int P, const float* transitions, float* starts) {
  constexpr int kRowGroups = kThreads / kBlockV, kRows = K / kRowGroups;
  extern __shared__ __align__(16) float shared[];
  float* A = shared;           // [K][K]
  float* S = shared + K * K;   // [K][kBlockV]
  const int c0 = blockIdx.x * kBlockV, h = blockIdx.y, b = blockIdx.z, V = p.V;
  const int c = threadIdx.x % kBlockV, r0 = threadIdx.x / kBlockV;
  const long long KV = static_cast<long long>(K) * V;
  const auto start_of = [&](int segment) { return starts + ((static_cast<long long>(b) * P + segment) * p.H + h) * KV; };

  const float* h0 = p.h0 ? p.h0 + (static_cast<long long>(b) * p.H + h) * KV : nullptr;
  for (int m = 0; m < kRows; ++m) {
    const int i = r0 + kRowGroups * m;
    const float x = h0 ? h0[i * V + c0 + c] : 0.0f;
    S[i * kBlockV + c] = x;
    start_of(0)[i * V + c0 + c] = x;
  }
  for (int segment = 0; segment + 1 < P; ++segment) {
    const float* LA = transitions + ((static_cast<long long>(b) * (P - 1) + segment) * p.H + h) * K * (V + K);
    __syncthreads();  // S_p is whole; the previous step's reads of A are done
    for (int e = threadIdx.x * 4; e < K * K; e += kThreads * 4) {
      const int i = e / K, j = e % K;
      *reinterpret_cast<float4*>(A + e) = *reinterpret_cast<const float4*>(LA + static_cast<long long>(i) * (V + K) + V + j);
    }
    __syncthreads();
    float acc[kRows];
#pragma unroll
    for (int m = 0; m < kRows; ++m) acc[m] = LA[static_cast<long long>(r0 + kRowGroups * m) * (V + K) + c0 + c];
#pragma unroll 4
    for (int j = 0; j < K; j += 4) {
      const float s0 = S[j * kBlockV + c], s1 = S[(j + 1) * kBlockV + c], s2 = S[(j + 2) * kBlockV + c],
                  s3 = S[(j + 3) * kBlockV + c];
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        const float4 a = *reinterpret_cast<const float4*>(A + (r0 + kRowGroups * m) * K + j);
        acc[m] = fmaf(a.x, s0, fmaf(a.y, s1, fmaf(a.z, s2, fmaf(a.w, s3, acc[m]))));
      }
    }
    __syncthreads();  // every thread has read S_p
    float* next = start_of(segment + 1);
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const int i = r0 + kRowGroups * m;
      S[i * kBlockV + c] = acc[m];
      next[i * V + c0 + c] = acc[m];
    }
  }
}

// The combine over p's B sequences of P segments (V a multiple of 64, K = 64 or 128), named `name` in errors.
inline void launch(const Problem& p, int P, const float* transitions, float* starts, const char* name) {
  if (p.K == 64)
    launch_checked(p, name, combine<64>, dim3(p.V / kBlockV, p.H, p.B), kThreads, Layout<64>::kBytes, P, transitions,
                   starts);
  else
    launch_checked(p, name, combine<128>, dim3(p.V / kBlockV, p.H, p.B), kThreads, Layout<128>::kBytes, P,
                   transitions, starts);
}

// After the chunk pass from the starts: the last segment's final state is the sequence's. finals [B P, H, K, V]
// holds every segment's, so ht takes B rows of H K V floats, P of them apart.
inline void copy_last_final_states(const Problem& p, int P, const float* finals, const char* name) {
  const size_t row_bytes = static_cast<size_t>(p.H) * p.K * p.V * sizeof(float);
  check_cuda(cudaMemcpy2DAsync(p.ht, row_bytes, finals + static_cast<size_t>(P - 1) * p.H * p.K * p.V, P * row_bytes,
                               row_bytes, p.B, cudaMemcpyDeviceToDevice, stream_of(p)),
             name, "cudaMemcpy2DAsync(final state)");
}

}  // namespace affine_combine
}  // namespace minilin
