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

// The probe's cases, the kernels' uses: D (64 x N) = A (64 x 128) B (128 x N), eight k-steps of 16 that cross
// from one 64-column atom into the next.
enum Case { kSsKMajor = 0, kSsMnMajor = 1, kRsTransposedAMnMajor = 2, kRsTransposedAMnMajorN32 = 3, kSsKMajorN32 = 4 };
constexpr int kM = 64, kK = 128;

__device__ uint64_t raw_descriptor(const void* start, unsigned leading, unsigned stride) {
  return static_cast<uint64_t>((smem_address(start) & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((leading & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((stride & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// A is given row-major 64 x 128, B row-major 128 x N. variant 0 = the library's descriptors, 1 = the two
// strides swapped. In the N = 32 MN-major case B is the right half (columns 32..63) of a 128 x 64 tile.
template <int N>
__global__ void probe(const bf16* A, const bf16* B, float* D, int which, int variant) {
  __shared__ __align__(1024) bf16 a_s[kM * kK];  // A: sw128 (64 rows x 128 cols), or A^T: sw128 (128 rows x 64)
  __shared__ __align__(1024) bf16 b_s[kK * 64];  // B^T: sw128 (N rows x 128 cols), or B: sw128 (128 rows x 64)
  const int tid = threadIdx.x;
  if ((smem_address(a_s) | smem_address(b_s)) & 1023) __trap();
  const bool a_transposed = which == kRsTransposedAMnMajor || which == kRsTransposedAMnMajorN32;
  const bool b_mn_major = which != kSsKMajor && which != kSsKMajorN32;
  const int n0 = which == kRsTransposedAMnMajorN32 ? 32 : 0;
  for (int i = tid; i < kM * kK; i += 128) {
    const int r = i / kK, c = i % kK;
    if (a_transposed) a_s[sw128_index(c, r, kK)] = A[i];
    else a_s[sw128_index(r, c, kM)] = A[i];
  }
  for (int i = tid; i < kK * 64; i += 128) b_s[i] = __float2bfloat16(0.0f);
  __syncthreads();
  for (int i = tid; i < kK * N; i += 128) {
    const int r = i / N, c = i % N;  // B[r][c], r the reduction index
    if (b_mn_major) b_s[sw128_index(r, n0 + c, kK)] = B[i];
    else b_s[sw128_index(c, r, N)] = B[i];
  }
  fence_async_shared();
  __syncthreads();

  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  const int warp = (tid >> 5) & 3, lane = tid & 31;
  unsigned a[kK / 16][4];
  if (a_transposed)
    for (int ks = 0; ks < kK / 16; ++ks) sw128_load_a_transposed(a[ks], a_s, kK, 16 * warp, 16 * ks);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    const int k0 = 16 * ks;
    uint64_t b;
    if (b_mn_major)
      b = variant == 0 ? mn_major_slice(b_s, kK, k0, n0)
                       : raw_descriptor(b_s + (n0 >> 6) * kK * 64 + k0 * 64 + (n0 & 63), 1024, kK * 128);
    else
      b = variant == 0 ? k_major_slice(b_s, N, k0) : raw_descriptor(b_s + (k0 >> 6) * N * 64 + (k0 & 63), 1024, 16);
    if (a_transposed) {
      if (b_mn_major) wgmma_rs<N, true>(d, a[ks], b, ks > 0);
      else wgmma_rs<N, false>(d, a[ks], b, ks > 0);
    } else {
      const uint64_t a_desc = k_major_slice(a_s, kM, k0);
      if (b_mn_major) wgmma_ss<N, true>(d, a_desc, b, ks > 0);
      else wgmma_ss<N, false>(d, a_desc, b, ks > 0);
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
  const char* names[] = {"ss, B K-major (Q K^T, Q S)", "ss, B MN-major (P V)", "rs (A^T by ldmatrix.trans), B MN-major",
                         "rs, B MN-major, N = 32 at column 32", "ss, N = 32, B K-major"};
  int failures = 0;
  srand(7);
  const int only = argc > 1 ? atoi(argv[1]) : -1;
  for (int which = 0; which < 5; ++which) {
    if (only >= 0 && which != only) continue;
    const int N = which == kSsKMajorN32 || which == kRsTransposedAMnMajorN32 ? 32 : 64;
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
