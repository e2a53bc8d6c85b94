// Where a block's tokens and q/k rows are: sequence b's first token row and length (B sequences of T tokens, or
// packed sequences at cu_seqlens offsets), its first row in chunk-indexed scratch, and the q/k head a value head
// reads (grouped value heads). Problem's comment in minilin_cuda.h defines both layouts; kernels of versions
// marked `packed` take every token and q/k index from here, so one kernel runs either layout.
#pragma once

#include <cuda_runtime.h>

#include "../minilin_cuda.h"

namespace minilin {

constexpr int kChunk = 64;  // tokens per chunk (CONVENTIONS.md's default chunk_size)

// Chunks of a sequence of `tokens` tokens, the last one partial.
__host__ __device__ inline int chunk_count(int tokens) { return (tokens + kChunk - 1) / kChunk; }

// Sequence b's tokens and its chunks' rows.
struct SequenceRows {
  long long first;   // row of its first token among the tensors' B T token rows: b T, or cu_seqlens[b]
  int length;        // its tokens: T, or cu_seqlens[b + 1] - cu_seqlens[b]
  long long chunk0;  // row of its first chunk in chunk-indexed scratch (chunk_rows): b ceil(T / 64), or
                     // cu_seqlens[b] / 64 + b
};

// Rows of chunk-indexed scratch (one per 64-token chunk of every sequence): B ceil(T / 64), or packed
// floor(T / 64) + B. Packed, sequence b (L tokens from token s) takes ceil(L / 64) rows from s / 64 + b, which is
// at most floor((s + L) / 64) - floor(s / 64) + 1: it ends at or before the next sequence's first row,
// (s + L) / 64 + b + 1, and the last one by floor(T / 64) + B. Up to B rows stay unused (chunk_of_block).
__host__ __device__ inline long long chunk_rows(int B, int T, bool packed) {
  return packed ? static_cast<long long>(T / kChunk) + B : static_cast<long long>(B) * chunk_count(T);
}

// A workspace section's bytes rounded up to 256, so that every section after it starts 256-byte aligned.
__host__ __device__ inline size_t workspace_aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Sequence b of B sequences of T tokens each.
__host__ __device__ inline SequenceRows fixed_rows(int b, int T) {
  return {static_cast<long long>(b) * T, T, static_cast<long long>(b) * chunk_count(T)};
}

__device__ __forceinline__ SequenceRows fixed_rows(const Problem& p, int b) { return fixed_rows(b, p.T); }

// The first chunk row of packed sequence b, which starts at token `start` (chunk_rows says why rows never overlap).
__host__ __device__ inline long long packed_chunk0(int start, int b) { return static_cast<long long>(start / kChunk) + b; }

__device__ __forceinline__ SequenceRows sequence_rows(const Problem& p, int b) {
  if (p.cu_seqlens == nullptr) return fixed_rows(p, b);
  const int start = p.cu_seqlens[b];
  return {start, p.cu_seqlens[b + 1] - start, packed_chunk0(start, b)};
}

// A grid over every chunk of every sequence, y its second axis (heads): (chunks, y, B) for B sequences of T tokens,
// where the block's chunk is n = blockIdx.x of sequence b = blockIdx.z at no cost; (chunk_rows, y) when packed,
// where chunk_of_block finds it by bisection, and up to B blocks find none and return at once.
inline dim3 chunk_grid(const Problem& p, unsigned y) {
  if (p.cu_seqlens == nullptr) return dim3(chunk_count(p.T), y, p.B);
  return dim3(static_cast<unsigned>(chunk_rows(p.B, p.T, true)), y, 1);
}

// Which chunk a block of chunk_grid holds: chunk n of sequence b, or none (a packed row between two sequences'
// chunks).
struct ChunkOfBlock {
  int b, n;
  bool used;
};

__device__ __forceinline__ ChunkOfBlock chunk_of_block(const Problem& p) {
  if (p.cu_seqlens == nullptr) {
    const int b = blockIdx.z, n = blockIdx.x;
    return {b, n, true};
  }
  const int row = blockIdx.x;
  int lo = 0, hi = p.B - 1;  // the last sequence whose first row (increasing with b) is <= row
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (packed_chunk0(p.cu_seqlens[mid], mid) <= row) lo = mid;
    else hi = mid - 1;
  }
  const SequenceRows seq = sequence_rows(p, lo);
  const int n = row - static_cast<int>(seq.chunk0);
  return {lo, n, n < chunk_count(seq.length)};
}

// The block's row of chunk-indexed scratch (chunk_rows), from blockIdx and the sizes: no bisection.
__device__ __forceinline__ long long chunk_of_block_row(const Problem& p) {
  return p.cu_seqlens ? blockIdx.x : static_cast<long long>(blockIdx.z) * chunk_count(p.T) + blockIdx.x;
}

__host__ __device__ inline int qk_heads_of(const Problem& p) { return p.qk_heads ? p.qk_heads : p.H; }

// The q/k head value head h reads; no division on the plain layout (the WY prepare measured 3-4% slower with
// two integer divisions ahead of its first copy).
__host__ __device__ inline int qk_head_of(const Problem& p, int h) {
  return p.qk_heads == 0 || p.qk_heads == p.H ? h : h / (p.H / p.qk_heads);
}

}  // namespace minilin
