// One warp's slice of the recurrent state S [K, V] and its tile of the chunk's output, moved between the
// mma accumulators (mma.cuh's C layout), shared memory and global memory. The state slice covers rows
// s_m0 .. s_m0 + 15 and columns s_n0 .. s_n0 + 8 NT - 1 of the block's value columns (from v0); shared by
// the tensor-core chunk kernels of both families (linear v3-v5, delta v3-v6).
#pragma once

#include "../minilin_cuda.h"
#include "mma.cuh"

namespace minilin {

// S <- h0's slice (zeros when h0 is null), and its bf16 copy into the shared rows S_copy (row stride ld).
template <int NT>
__device__ __forceinline__ void load_state(float (&S)[1][NT][4], const float* h0, long long state_base, int V, int v0,
                                           int s_m0, int s_n0, __nv_bfloat16* S_copy, int ld) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = s_m0 + acc_row(0, e), col = s_n0 + acc_col(j, e);
      float2 s2 = make_float2(0.0f, 0.0f);
      if (h0) s2 = *reinterpret_cast<const float2*>(h0 + state_base + static_cast<long long>(row) * V + v0 + col);
      S[0][j][e] = s2.x;
      S[0][j][e + 1] = s2.y;
      store_bf16x2(S_copy + row * ld + col, s2.x, s2.y);
    }
}

// The bf16 copy of this warp's slice, which the next chunk's products read.
template <int NT>
__device__ __forceinline__ void store_state_copy(const float (&S)[1][NT][4], __nv_bfloat16* S_copy, int ld, int s_m0,
                                                 int s_n0) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2)
      store_bf16x2(S_copy + (s_m0 + acc_row(0, e)) * ld + s_n0 + acc_col(j, e), S[0][j][e], S[0][j][e + 1]);
}

// The final state, fp32, into ht.
template <int NT>
__device__ __forceinline__ void store_state(const float (&S)[1][NT][4], float* ht, long long state_base, int V, int v0,
                                            int s_m0, int s_n0) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = s_m0 + acc_row(0, e), col = s_n0 + acc_col(j, e);
      *reinterpret_cast<float2*>(ht + state_base + static_cast<long long>(row) * V + v0 + col) =
          make_float2(S[0][j][e], S[0][j][e + 1]);
    }
}

template <int NT>
__device__ __forceinline__ void scale_tiles(float (&acc)[1][NT][4], float factor) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] *= factor;
}

// o[b, t0 + r, h, v0 + c] = scale acc for this warp's output tile at rows m0.., columns n0.. of the chunk and
// value block; rows past T (the last chunk's padding) are not written.
template <int NT>
__device__ __forceinline__ void store_output_tile(const float (&acc)[1][NT][4], __nv_bfloat16* o, int T, int H, int V,
                                                  int b, int h, int t0, int v0, int m0, int n0, float scale) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int r = m0 + acc_row(0, e), c = n0 + acc_col(j, e), t = t0 + r;
      if (t < T)
        store_bf16x2(o + ((static_cast<long long>(b) * T + t) * H + h) * V + v0 + c, scale * acc[0][j][e],
                     scale * acc[0][j][e + 1]);
    }
}

}  // namespace minilin
