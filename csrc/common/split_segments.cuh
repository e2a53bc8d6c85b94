// How many segments a split-sequence version (linear v8, gla v5) cuts each sequence into: its chunk pass, one block
// per (batch, head, value block) walking its chunks one after another, leaves SMs idle when B H is small; on P
// segments at once it runs P times the blocks on chains P times shorter, and a correction pass then adds each
// segment's start state to its outputs.
#pragma once

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

// Per device, for one chunk kernel: the SM count and the kernel's resident blocks per SM at K = 64 and 128, asked
// once (one cache per kernel, `resident_blocks_per_sm`; a deque: growing it for another device leaves the entries
// already handed out where they are).
struct SplitCard {
  int sms = 0;
  int resident[2] = {0, 0};  // K = 64, K = 128
};

template <int (*resident_blocks_per_sm)(int K)>
inline const SplitCard& split_card(const char* name) {
  static std::mutex mutex;
  static std::deque<SplitCard> cards;
  int device = 0;
  check_cuda(cudaGetDevice(&device), name, "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(cards.size()) <= device) cards.resize(device + 1);
  SplitCard& c = cards[device];
  if (c.sms == 0) {
    check_cuda(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, device), name,
               "cudaDeviceGetAttribute(MultiProcessorCount)");
    c.resident[0] = std::max(1, resident_blocks_per_sm(64));
    c.resident[1] = std::max(1, resident_blocks_per_sm(128));
  }
  return c;
}

}  // namespace minilin
