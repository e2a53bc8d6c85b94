// How many segments a split-sequence version (linear v8 and v9, gla v5, delta v12, kda v9) cuts each sequence into: its chunk pass, one block
// per (batch, head, value block) walking its chunks one after another, leaves SMs idle when B H is small; on P
// segments at once it runs P times the blocks on chains P times shorter, and a correction pass then adds each
// segment's start state to its outputs.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <deque>
#include <mutex>

#include "launch.cuh"     // check_cuda
#include "sequences.cuh"  // kChunk

namespace minilin {

// The split's fixed limits and the cost model's constants (measured per version, in its file).
struct SplitCosts {
  double chunk_us;            // the chunk pass's time per chunk and block
  double correction_us;       // the correction's time for the whole problem (its traffic over its rate)
  double added_launches_us;   // the launches a split adds
  int min_segment;            // no shorter segments: the added launches would cost more than they save
  int max_segments;
  int run_chunks;             // the correction's chunks per block
};

// With `blocks` blocks of the chunk pass and `slots` resident at once, P segments take ceil(blocks P / slots)
// waves of chains of T / (64 P) chunks, plus the correction and the added launches when P > 1 (counted for every
// segment, as if h0 were given: P must not depend on it, since the workspace is sized before the call). The
// fastest P, a power of 2, wins; T must split into whole chunks, segments stay at least min_segment long, and the
// correction's grid.z (B P runs per segment) stays under 65536.
inline int fastest_split(const SplitCosts& c, long long slots, long long blocks, int B, int T) {
  const auto time_us = [&](int P) {
    const double chain_us = static_cast<double>((blocks * P + slots - 1) / slots) * (T / P / kChunk) * c.chunk_us;
    return chain_us + (P > 1 ? c.correction_us + c.added_launches_us : 0.0);
  };
  int best = 1;
  for (int P = 2; P <= c.max_segments; P *= 2) {
    if (T % (P * kChunk) != 0 || T / P < c.min_segment) break;
    const long long runs = (T / P / kChunk + c.run_chunks - 1) / c.run_chunks;
    if (static_cast<long long>(B) * P * runs > 65535) break;
    if (time_us(P) < time_us(best)) best = P;
  }
  return best;
}

// The same search for a split version whose segments' start states come first from a pass over their
// transitions (delta v12, kda v9): time_us(P) its predicted time with P segments (P = 1 unsplit); the fastest P, a
// power of 2 whose segments are whole chunks and at least min_segment long, wins (B P <= 65535, the grid's z).
template <class TimeUs>
inline int fastest_affine_split(int B, int T, int min_segment, int max_segments, TimeUs time_us) {
  int best = 1;
  for (int P = 2; P <= max_segments; P *= 2) {
    if (T % (P * kChunk) != 0 || T / P < min_segment) break;
    if (static_cast<long long>(B) * P > 65535) break;
    if (time_us(P) < time_us(best)) best = P;
  }
  return best;
}

// The [B P, T / P] view's sequence b P + p that transitions row z = b (P - 1) + p belongs to (a transitions pass's
// blockIdx.z, common/affine_combine.cuh): the first P - 1 segments of each sequence have a transition, the last none.
__host__ __device__ __forceinline__ int segment_row(unsigned z, int segments) {
  return z / (segments - 1) * segments + z % (segments - 1);
}

// The key widths a split version's chunk kernel is instantiated for, as slots of the tables below.
inline int key_slot(int K) { return K == 64 ? 0 : K == 128 ? 1 : 2; }  // 64, 128, 256

// Per device, for one chunk kernel: the SM count and the kernel's resident blocks per SM at each key width, each
// asked once, when first needed (one cache per kernel, `resident_blocks_per_sm`; a deque: growing it for another
// device leaves the entries already handed out where they are).
struct SplitCard {
  int sms = 0;
  int resident[3] = {0, 0, 0};  // K = 64, 128, 256 (key_slot)
};

template <int (*resident_blocks_per_sm)(int K)>
inline const SplitCard& split_card(const char* name, int K) {
  static std::mutex mutex;
  static std::deque<SplitCard> cards;
  int device = 0;
  check_cuda(cudaGetDevice(&device), name, "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(cards.size()) <= device) cards.resize(device + 1);
  SplitCard& c = cards[device];
  if (c.sms == 0)
    check_cuda(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, device), name,
               "cudaDeviceGetAttribute(MultiProcessorCount)");
  if (c.resident[key_slot(K)] == 0) c.resident[key_slot(K)] = std::max(1, resident_blocks_per_sm(K));
  return c;
}

// What a split version measured of itself (its file says from what): its chunk pass's time per chunk and block at
// K = 64, 128 and 256 (where it takes 256), the correction's rate (it moves the queries once and o twice, bf16)
// and the launches a split adds.
struct SplitModel {
  double chunk_us[3];  // key_slot: K = 64, 128, 256
  double correction_bytes_per_us;
  double added_launches_us;
  int min_segment, max_segments, run_chunks;  // SplitCosts's limits
};

// P for B sequences of T tokens, H heads and K, V, with the chunk pass on blocks of block_v value columns whose
// resident blocks per SM `resident_blocks_per_sm` gives (asked once per device and K, under `name`); 1 without
// asking the device where no sequence splits in two.
template <int (*resident_blocks_per_sm)(int K)>
inline int model_segments(const SplitModel& m, const char* name, int B, int T, int H, int K, int V, int block_v) {
  if (T % (2 * kChunk) != 0 || T / 2 < m.min_segment) return 1;
  const SplitCard& c = split_card<resident_blocks_per_sm>(name, K);
  const long long slots = static_cast<long long>(c.sms) * c.resident[key_slot(K)];
  const long long blocks = static_cast<long long>(B) * H * (V / block_v);
  const double correction_us =
      static_cast<double>(B) * T * H * (K + 2.0 * V) * sizeof(__nv_bfloat16) / m.correction_bytes_per_us;
  const SplitCosts costs{m.chunk_us[key_slot(K)], correction_us, m.added_launches_us, m.min_segment, m.max_segments,
                         m.run_chunks};
  return fastest_split(costs, slots, blocks, B, T);
}

// The correction kernels' value columns per block: 128 where V allows, else 64.
inline int column_block(int V) { return V % 128 == 0 ? 128 : 64; }

}  // namespace minilin
