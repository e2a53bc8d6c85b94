// linear v8's split of each sequence into segments (v8_split_sequence.cu says how and why), around the chunk
// pass of whichever version calls it: v8 (v7's kernel), v9 (v7's kernel at K = 256) and v10 (the wgmma kernel).
// Each caller chooses P by the cost model of common/split_segments.cuh with its own chunk pass's constants.
#pragma once

#include "../common/split_segments.cuh"

namespace minilin {
namespace linear_split {

constexpr int kMinSegment = 1024;    // no shorter segments: the added launches would cost more than they save
constexpr int kMaxSegments = 16;
constexpr int kRunChunks = 16;       // the correction's chunks per block, sharing one load of S_p (8: 2%, 4: 7% slower)
// The correction moves q once and o twice at ~2 TB/s (0.20 ms for 402 MB, H200); the three added launches are a
// guess of ~15 us. A caller's SplitModel is its chunk pass's time per chunk and block with these.
constexpr double kCorrectionBytesPerUs = 2.0e6, kAddedLaunchesUs = 15.0;

// The workspace of a split into P > 1 segments: the segments' states, then the chunk sums of g.
size_t split_bytes(int P, int B, int T, int H, int K, int V);

// The split around `chunk_pass` (a launch over a Problem's sequences), once p is checked, with P segments;
// P = 1, and packed sequences, run the plain pass.
void split_forward(const Problem& p, const char* name, void (*chunk_pass)(const Problem&), int P);

}  // namespace linear_split
}  // namespace minilin
