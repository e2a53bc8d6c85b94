// gla v4's workspace, which gla v5 reads too: per chunk row (common/sequences.cuh) and head, the tiles that v4's
// prepare kernel computes from one chunk alone,
//   Qr = q exp(G)  [64, K] bf16,   Ke = k exp(G_C - G)  [64, K] bf16,   P  [64, 64] bf16,   d = exp(G_C)  [K] fp32,
// as four arrays [H][chunk rows][...], each 256-byte aligned (G the chunk-local cumulative gate, G_C its last row).
#pragma once

#include <cuda_bf16.h>

#include "../common/sequences.cuh"

namespace minilin {
namespace gla_prepared {

struct Sections {
  size_t qr, ke, scores, decay;  // bytes of each array
};

__host__ __device__ inline Sections sections(long long rows, int H, int K) {
  const size_t tiles = static_cast<size_t>(rows) * H;
  return {workspace_aligned(tiles * kChunk * K * sizeof(__nv_bfloat16)), workspace_aligned(tiles * kChunk * K * sizeof(__nv_bfloat16)),
          workspace_aligned(tiles * kChunk * kChunk * sizeof(__nv_bfloat16)), workspace_aligned(tiles * K * sizeof(float))};
}

// The workspace's bytes for B sequences of T tokens, or B sequences packed into T.
inline size_t prepared_bytes(int B, int T, int H, int K, bool packed) {
  const Sections s = sections(chunk_rows(B, T, packed), H, K);
  return s.qr + s.ke + s.scores + s.decay;
}

// Chunk row `row` of head h: where its four tiles are.
struct PreparedTiles {
  __nv_bfloat16* qr;      // [64][K]
  __nv_bfloat16* ke;      // [64][K]
  __nv_bfloat16* scores;  // [64][64]
  float* decay;           // [K]
};

// Chunk row `row` of head h in a workspace of `rows` chunk rows and H heads: where its four tiles are.
template <int K>
__device__ __forceinline__ PreparedTiles prepared_tiles(void* workspace, long long rows, int H, int h, long long row) {
  const Sections s = sections(rows, H, K);
  unsigned char* base = static_cast<unsigned char*>(workspace);
  const long long tile = static_cast<long long>(h) * rows + row;
  return {reinterpret_cast<__nv_bfloat16*>(base) + tile * kChunk * K,
          reinterpret_cast<__nv_bfloat16*>(base + s.qr) + tile * kChunk * K,
          reinterpret_cast<__nv_bfloat16*>(base + s.qr + s.ke) + tile * kChunk * kChunk,
          reinterpret_cast<float*>(base + s.qr + s.ke + s.scores) + tile * K};
}

// The same for the forward problem p, whose workspace holds them.
template <int K>
__device__ __forceinline__ PreparedTiles prepared_tiles(const Problem& p, int h, long long row) {
  return prepared_tiles<K>(p.workspace, chunk_rows(p.B, p.T, p.cu_seqlens != nullptr), p.H, h, row);
}

// v4's two launches (gla/v4_prepared_chunks.cu), K = 64 or 128, the problem checked by the caller: the prepare
// kernel over every chunk of p, and the pass over chunks of p, both with p.workspace holding the tiles.
// launch_prepare_halves (gla v6, K = 256): the prepare at K = 128 on each half of the key channels, head h's
// channels [128 s, 128 s + 128) as head 2 h + s of a workspace of 2 H heads (prepared_bytes(B, T, 2 H, 128, ..)):
// Qr, Ke and d are per channel, so the halves' tiles side by side are K = 256's, and P is their two P summed.
void launch_prepare(const Problem& p);
void launch_prepare_halves(const Problem& p);
void launch_chunks(const Problem& p);
int chunks_blocks_per_sm(int K);  // the pass over chunks' resident blocks per SM at this K (64 or 128)

}  // namespace gla_prepared
}  // namespace minilin
