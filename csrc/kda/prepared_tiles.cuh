// kda v3's workspace, which kda v4 writes too, and v3's pass over chunks that reads it: per chunk row
// (common/sequences.cuh) and head, the tiles that a prepare kernel computes from one chunk alone,
//   Qr = q exp(G), Kg = k exp(G), Ke = k exp(G_C - G)  [64, K] bf16,   P, T diag(beta)  [64, 64] bf16 (zero above
//   the diagonal; T alone for kda_bwd v2, launch_sliced_prepare),   d = exp(G_C)  [K] fp32,
// as six arrays [H][chunk rows][...], each 256-byte aligned (G the chunk-local cumulative gate, G_C its last row,
// T = (I + A)^-1 the WY system's inverse: kda/v3_prepared_chunks.cu has the algebra).
#pragma once

#include <cuda_bf16.h>

#include "../common/sequences.cuh"

namespace minilin {
namespace kda_prepared {

struct Sections {
  size_t rows_k, tile, decay;  // bytes of one [H][rows][64][K] bf16 array, one [H][rows][64][64] bf16, the decays
};

__host__ __device__ inline Sections sections(long long rows, int H, int K) {
  const size_t tiles = static_cast<size_t>(rows) * H;
  return {workspace_aligned(tiles * kChunk * K * sizeof(__nv_bfloat16)), workspace_aligned(tiles * kChunk * kChunk * sizeof(__nv_bfloat16)),
          workspace_aligned(tiles * K * sizeof(float))};
}

// The workspace's bytes for B sequences of T tokens, or B sequences packed into T (0 for an empty problem): the
// workspace_bytes of kda v3 - v8 (Version, minilin_cuda.h).
inline size_t prepared_bytes(int B, int T, int H, int K, int V, bool packed) {
  if (B <= 0 || T <= 0 || H <= 0 || K <= 0 || V <= 0) return 0;
  const Sections s = sections(chunk_rows(B, T, packed), H, K);
  return 3 * s.rows_k + 2 * s.tile + s.decay;
}

// Chunk row `row` of head h: where its six tiles are.
struct PreparedTiles {
  __nv_bfloat16* qr;      // [64][K]  q exp(G)
  __nv_bfloat16* kg;      // [64][K]  k exp(G)
  __nv_bfloat16* ke;      // [64][K]  k exp(G_C - G)
  __nv_bfloat16* scores;  // [64][64] P, zeros above the diagonal
  __nv_bfloat16* solve;   // [64][64] T diag(beta), zeros above the diagonal
  float* decay;           // [K]      exp(G_C)
};

// Chunk row `row` of head h in a workspace of `rows` chunk rows (`chunk_rows`) and H heads.
template <int K>
__device__ __forceinline__ PreparedTiles prepared_tiles(void* workspace, long long rows, int H, int h, long long row) {
  const Sections s = sections(rows, H, K);
  unsigned char* base = static_cast<unsigned char*>(workspace);
  const long long tile = static_cast<long long>(h) * rows + row;
  using bf16 = __nv_bfloat16;
  return {reinterpret_cast<bf16*>(base) + tile * kChunk * K,
          reinterpret_cast<bf16*>(base + s.rows_k) + tile * kChunk * K,
          reinterpret_cast<bf16*>(base + 2 * s.rows_k) + tile * kChunk * K,
          reinterpret_cast<bf16*>(base + 3 * s.rows_k) + tile * kChunk * kChunk,
          reinterpret_cast<bf16*>(base + 3 * s.rows_k + s.tile) + tile * kChunk * kChunk,
          reinterpret_cast<float*>(base + 3 * s.rows_k + 2 * s.tile) + tile * K};
}

template <int K>
__device__ __forceinline__ PreparedTiles prepared_tiles(const Problem& p, int h, long long row) {
  return prepared_tiles<K>(p.workspace, chunk_rows(p.B, p.T, p.cu_seqlens != nullptr), p.H, h, row);
}

// What every version that writes these tiles checks before launching (bf16, K = 64 or 128, V a multiple of 64, g
// given, the workspace large enough and 16-byte aligned), naming `name` in the error; v3's pass over chunks
// (kda/v3_prepared_chunks.cu) over every sequence of p, its tiles in p.workspace, one block per `columns` value
// columns (64, or 32 for kda v5), in the order of work of kda v3 (rung 3), v7 or v8; and that pass's resident
// blocks per SM at 32 columns and this K (64 or 128), the same for every rung.
void check_problem(const Problem& p, const char* name);
void launch_chunks(const Problem& p, int columns = 64, int rung = 3);
// kda v9's first pass (kda/v9_split_sequence.cu): rung 8's pass in its transitions form over the [B P, T / P] view
// `view` of a problem (`segments` = P), segments 0 .. P - 2 of each sequence, V + K columns from [0 | I] in blocks of
// `columns` (32 or 64), the final states [L_p | A_p] into `transitions` [B (P - 1), H, K, V + K] fp32.
void launch_transitions(const Problem& view, int columns, float* transitions, int segments);
int narrow_chunks_blocks_per_sm(int K);
// The pass's value block width for p (kda/v5_narrow_value_blocks.cu): 32 where every (sequence, head, 32 columns)
// block is resident on the card at once, else 64; `name`, the calling version's, names a failed device query.
int value_columns(const Problem& p, const char* name);
// kda v4's prepare kernel over every chunk of p (kda/v4_sliced_prepare.cu); halves: kda v6's form of it. With
// solve_times_beta false the solve tile holds T itself, not T diag(beta) (kda_bwd v2, whose backward needs
// R = T^T dDelta, applies beta to the rows of the right-hand side instead).
void launch_sliced_prepare(const Problem& p, bool halves = false, bool solve_times_beta = true);

}  // namespace kda_prepared
}  // namespace minilin
