// Checks the wgmma building blocks of common/wgmma.cuh on a Hopper GPU against a CPU product, one case per
// way the kernels use them, and for each shared operand both readings of the descriptor's two strides (so
// that a wrong reading shows up as a failing line here, not as a wrong kernel).
//   nvcc -std=c++17 -arch=sm_90a -o /tmp/wgmma_probe csrc/dev/wgmma_probe.cu
//   for c in 0 1 2 3 4; do /tmp/wgmma_probe $c; done      (one process per case: a wrong reading of the
//                                                           strides can read past the tile and kill the context)
// Prints one line per variant: the largest |error| against the float64 product of the same bf16 inputs;
// exit status 0 when the library's descriptors are right for the case.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../common/wgmma.cuh"

using namespace minilin;
using bf16 = __nv_bfloat16;

// The probe's cases: D (64 x N) = A (64 x 32) B (32 x N), two k-steps of 16.
enum Case { kSsKMajor = 0, kSsMnMajor = 1, kRsKMajor = 2, kRsTransposedAMnMajor = 3, kSsKMajorN32 = 4 };
constexpr int kM = 64, kK = 32;

__device__ uint64_t raw_descriptor(const void* start, unsigned leading, unsigned stride) {
  return static_cast<uint64_t>((smem_address(start) & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((leading & 0x3FFFF) >> 4) << 16) | (static_cast<uint64_t>((stride & 0x3FFFF) >> 4) << 32);
}

// A is given row-major 64 x 32, B row-major 32 x N. variant 0 = the library's descriptor, 1 = the strides swapped.
template <int N>
__global__ void probe(const bf16* A, const bf16* B, float* D, int which, int variant) {
  __shared__ __align__(128) bf16 a_s[kM * kK];      // A: cm (64 rows x 32 cols), or A^T: cm (32 rows x 64 cols)
  __shared__ __align__(128) bf16 b_s[kK * 64];      // B^T: cm (N rows x 32 cols), or B: cm (32 rows x N cols)
  const int tid = threadIdx.x;
  const bool a_transposed = which == kRsTransposedAMnMajor;
  const bool b_mn_major = which == kSsMnMajor || which == kRsTransposedAMnMajor;
  for (int i = tid; i < kM * kK; i += 128) {
    const int r = i / kK, c = i % kK;
    if (a_transposed) a_s[cm_index(c, r, kM)] = A[i];
    else a_s[cm_index(r, c, kK)] = A[i];
  }
  for (int i = tid; i < kK * N; i += 128) {
    const int r = i / N, c = i % N;  // B[r][c], r the reduction index
    if (b_mn_major) b_s[cm_index(r, c, N)] = B[i];
    else b_s[cm_index(c, r, kK)] = B[i];
  }
  fence_async_shared();
  __syncthreads();

  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  const int warp = (tid >> 5) & 3, lane = tid & 31;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    const int k0 = 16 * ks;
    uint64_t b;
    if (b_mn_major) {
      b = variant == 0 ? mn_major_slice(b_s, N, k0) : raw_descriptor(b_s + (k0 >> 3) * (N >> 3) * 64, 128, N * 16);
    } else {
      b = variant == 0 ? k_major_slice(b_s, kK, k0) : raw_descriptor(b_s + (k0 >> 3) * 64, kK * 16, 128);
    }
    if (which == kRsKMajor || which == kRsTransposedAMnMajor) {
      unsigned a[4];
      if (a_transposed) cm_load_a_transposed(a, a_s, kM, 16 * warp, k0);
      else cm_load_a(a, a_s, kK, 16 * warp, k0);
      if (b_mn_major) wgmma_rs<N, true>(d, a, b, ks > 0);
      else wgmma_rs<N, false>(d, a, b, ks > 0);
    } else {
      const uint64_t a = k_major_slice(a_s, kK, k0);
      if (b_mn_major) wgmma_ss<N, true>(d, a, b, ks > 0);
      else wgmma_ss<N, false>(d, a, b, ks > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  const int g = lane >> 2, t = lane & 3;
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * warp + g + (e >= 2 ? 8 : 0), c = 8 * j + 2 * t + (e & 1);
      D[r * N + c] = d[4 * j + e];
    }
}

int main(int argc, char** argv) {
  const char* names[] = {"ss, B K-major", "ss, B MN-major (trans-b)", "rs (A by ldmatrix), B K-major",
                         "rs (A^T by ldmatrix.trans), B MN-major", "ss, N = 32, B K-major"};
  int failures = 0;
  srand(7);
  const int only = argc > 1 ? atoi(argv[1]) : -1;
  for (int which = 0; which < 5; ++which) {
    if (only >= 0 && which != only) continue;
    const int N = which == kSsKMajorN32 ? 32 : 64;
    std::vector<bf16> A(kM * kK), B(kK * N);
    std::vector<double> ref(kM * N, 0.0);
    for (auto& x : A) x = __float2bfloat16(rand() / (float)RAND_MAX - 0.5f);
    for (auto& x : B) x = __float2bfloat16(rand() / (float)RAND_MAX - 0.5f);
    for (int r = 0; r < kM; ++r)
      for (int c = 0; c < N; ++c)
        for (int k = 0; k < kK; ++k) ref[r * N + c] += (double)__bfloat162float(A[r * kK + k]) * __bfloat162float(B[k * N + c]);
    bf16 *dA, *dB;
    float* dD;
    cudaMalloc(&dA, A.size() * 2);
    cudaMalloc(&dB, B.size() * 2);
    cudaMalloc(&dD, kM * N * 4);
    cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice);
    bool library_ok = false;
    for (int variant = 0; variant < 2; ++variant) {
      cudaMemset(dD, 0xFF, kM * N * 4);  // NaN: an element the fragment mapping misses fails
      if (N == 64) probe<64><<<1, 128>>>(dA, dB, dD, which, variant);
      else probe<32><<<1, 128>>>(dA, dB, dD, which, variant);
      cudaError_t err = cudaDeviceSynchronize();
      std::vector<float> D(kM * N);
      cudaMemcpy(D.data(), dD, kM * N * 4, cudaMemcpyDeviceToHost);
      double worst = 0.0;
      for (int i = 0; i < kM * N; ++i) {
        const double e = std::fabs(D[i] - ref[i]);
        worst = std::isnan(D[i]) ? INFINITY : (e > worst ? e : worst);
      }
      const bool ok = err == cudaSuccess && worst < 1e-3;
      if (variant == 0) library_ok = ok;
      printf("%-42s %-22s max|err| %.3g %s %s\n", names[which], variant == 0 ? "library strides" : "strides swapped",
             worst, ok ? "ok" : "WRONG", err == cudaSuccess ? "" : cudaGetErrorString(err));
      if (err != cudaSuccess) return 2;
    }
    failures += !library_ok;
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
  }
  printf("%s\n", failures ? "FAILED: the library's descriptors are wrong for some case" : "all cases ok");
  return failures ? 1 : 0;
}
