// kda v9 (split sequence): v8's pass over chunks run on P segments of every sequence at once, each segment's start
// state found first by a pass over the segments' transitions (delta v12's split with a decay per key channel),
// because v8 gives each (batch, head, value block) one block that walks the whole sequence: at B = 1, H = 16,
// K = V = 64 that is 32 blocks of 32 columns for 132 SMs, and v8 ran 0.82-0.86x FLA's chunk_kda there against
// 0.59x at B = 4 (csrc/NOTES.md).
// Measured on an H100 (2026-12-07, bf16, an initial state, device time, 5 alternating rounds): at B = 1, T = 32768,
// H = 16, K = V = 64 (P = 8) 0.938 ms against v8's 1.388 (0.68x; 0.57x FLA's chunk_kda), at K = V = 128 (P = 4)
// 1.831 against 1.977 (0.93x; 0.70x FLA's); errors against float64 equal to v8's (3.3e-3).
//
// KDA's state is affine in its start (CONVENTIONS.md, S_t = (I - beta_t k_t k_t^T) diag(a_t) S_{t-1} +
// beta_t k_t v_t^T, a_t = exp(g_t)): over segment p, S_end = A_p S_start + L_p, where A_p [K, K] is the product of
// the segment's (I - beta_t k_t k_t^T) diag(a_t) and L_p [K, V] the state the segment reaches from zero. Each column
// of S evolves alone, so A_p is what the identity's K columns become when carried through the segment as value
// columns with v = 0: in v3's chunk form X = V - Kg S, Delta = (T diag(beta)) X, S <- diag(d) S + Ke^T Delta, the
// identity's columns have V = 0 and every product is the same. Three passes, as delta v12's:
//   1. transitions: v8's pass over chunks without Qr S, P Delta or outputs (its kTransitions form), on the
//      [B P, T / P] view of the same arrays, segments 0 .. P - 2, from [0 | I] over V + K columns:
//      [L_p | A_p] into the workspace;
//   2. combine (common/affine_combine.cuh): S_0 = h0 and S_{p+1} = A_p S_p + L_p in fp32;
//   3. v8's pass over chunks on the view from the starts S_p, its final states into the workspace, the last
//      segment's copied to ht.
// The prepare (kda v6's) runs once, before pass 1: the view's chunk rows are the sequence's, so its tiles serve both
// passes. P and each pass's value block (32 or 64 columns) are chosen per shape by a cost model (choose_segments);
// P = 1 is v8. Grouped value heads split as the plain layout does (only the prepare reads q and k); packed sequences
// run as plain v8.
#include <cuda_bf16.h>

#include <string>

#include "../common/affine_combine.cuh"  // pass 2
#include "../common/launch.cuh"
#include "../common/sequences.cuh"
#include "../common/split_segments.cuh"
#include "prepared_tiles.cuh"

namespace minilin {

extern const Version kda_v8;

namespace kda_split {

constexpr int kMinSegment = 1024;  // no shorter segments: the added passes would cost more than they save
constexpr int kMaxSegments = 16;
// The cost model's constants, per chunk and block of the pass over chunks, at K = 64 / 128 and 32 / 64 value
// columns (H100, inferred from v8's times, not timed alone): at K = V = 64 v8 took 1.344 ms at B = 1, T = 32768,
// H = 16 (chains of 512 chunks, 32 columns) and 0.752 at B = 4, T = 8192 (chains of 128): ~1.5 us a chunk, the
// prepare the other ~0.55 ms; at K = 128, 1.916 ms at B = 1, T = 32768 less a ~0.9 ms prepare: ~2.0 us; 64 columns
// at 1.35x 32's (v4 against v5 at K = 128, H200). The transitions form, two of the chunk's five products gone but
// its chain (X, Delta, S) the same, is taken at 0.75x (a guess); the combine at ~10 us per segment and the added
// launches at ~15 us, as delta v12's.
constexpr double kChunkUs[2][2] = {{1.5, 2.0}, {2.0, 2.7}};  // [K = 64, 128][32, 64 columns]
constexpr double kTransitionsFactor = 0.75, kCombineUs = 10.0, kAddedLaunchesUs = 15.0;

// ---- the choice of P and of each pass's value block ---------------------------------------------------------
// A pass of n_columns columns per (sequence, head) over `sequences` sequences of `chain` chunks, on blocks of 32 or
// 64 columns, one block per SM (v3's chunk kernel at either K): the faster of the two widths, and its time.
struct PassChoice {
  int columns;
  double us;
};
inline PassChoice pass_choice(int sms, long long sequences, int H, int n_columns, int K, double chain, double factor) {
  PassChoice best{0, 0.0};
  for (const int columns : {32, 64}) {
    const long long blocks = sequences * H * (n_columns / columns);
    const double us = static_cast<double>((blocks + sms - 1) / sms) * chain * factor * kChunkUs[K == 128][columns == 64];
    if (best.columns == 0 || us < best.us) best = {columns, us};
  }
  return best;
}

struct Plan {
  int P = 1;
  int transition_columns = 0, output_columns = 0;  // pass 1's and pass 3's value blocks (P > 1)
  double us = 0.0;                                 // its predicted time
};

// P segments: each pass at its faster width, plus the combine and the added launches (P = 1: v8's pass alone).
inline Plan plan_with(int P, int sms, int B, int T, int H, int K, int V) {
  const double chain = T / P / kChunk;
  const PassChoice outputs = pass_choice(sms, static_cast<long long>(B) * P, H, V, K, chain, 1.0);
  if (P == 1) return {1, 0, 0, outputs.us};
  const PassChoice transitions =
      pass_choice(sms, static_cast<long long>(B) * (P - 1), H, V + K, K, chain, kTransitionsFactor);
  return {P, transitions.columns, outputs.columns,
          transitions.us + outputs.us + (P - 1) * kCombineUs + kAddedLaunchesUs};
}

inline Plan plan_of(int sms, int B, int T, int H, int K, int V) {
  const int P = fastest_affine_split(B, T, kMinSegment, kMaxSegments,
                                     [&](int P) { return plan_with(P, sms, B, T, H, K, V).us; });
  return plan_with(P, sms, B, T, H, K, V);
}

inline Plan choose_plan(int B, int T, int H, int K, int V) {
  if ((K != 64 && K != 128) || V % 64 != 0 || B <= 0 || H <= 0) return {};  // v8 refuses these; it says why
  if (T % (2 * kChunk) != 0 || T / 2 < kMinSegment) return {};
  const SplitCard& card = split_card<kda_prepared::narrow_chunks_blocks_per_sm>("kda_v9_split_sequence", K);
  return plan_of(card.sms * card.resident[key_slot(K)], B, T, H, K, V);
}

// ---- the workspace: v8's prepared tiles, then [L_p | A_p], the starts S_p and pass 3's final states ----------
inline size_t prepared_part(int B, int T, int H, int K, int V) {
  return workspace_aligned(kda_prepared::prepared_bytes(B, T, H, K, V, false));
}
inline size_t split_bytes(int P, int B, int T, int H, int K, int V) {
  return prepared_part(B, T, H, K, V) + affine_combine::split_states_bytes(P, B, H, K, V);
}

size_t workspace_bytes(int B, int T, int H, int K, int V, bool packed) {
  if (packed || B <= 0 || T <= 0 || H <= 0 || K <= 0 || V <= 0) return kda_prepared::prepared_bytes(B, T, H, K, V, packed);
  const int P = choose_plan(B, T, H, K, V).P;
  return P == 1 ? kda_prepared::prepared_bytes(B, T, H, K, V, false) : split_bytes(P, B, T, H, K, V);
}

inline affine_combine::SplitStates carve(const Problem& p, int P) {
  auto* base = static_cast<unsigned char*>(p.workspace);
  return affine_combine::carve_split_states(base + prepared_part(p.B, p.T, p.H, p.K, p.V), P, p.B, p.H, p.K, p.V);
}

void forward(const Problem& p) {
  const std::string name = "kda_v9_split_sequence";
  kda_prepared::check_problem(p, name.c_str());
  // Packed sequences run as plain v8: one chain per sequence already spreads a packed batch over the SMs, and a
  // segment must not straddle two sequences.
  const Plan plan = p.cu_seqlens ? Plan{} : choose_plan(p.B, p.T, p.H, p.K, p.V);
  const int P = plan.P;
  if (P == 1) return kda_v8.forward(p);
  check_workspace(p, name.c_str(), split_bytes(P, p.B, p.T, p.H, p.K, p.V));
  const affine_combine::SplitStates w = carve(p, P);
  kda_prepared::launch_sliced_prepare(p, /*halves=*/true);

  Problem view = p;  // the [B P, T / P] view: the same arrays, segments are contiguous runs of rows
  view.B = p.B * P;
  view.T = p.T / P;
  view.workspace_size = prepared_part(p.B, p.T, p.H, p.K, p.V);  // the prepared tiles, at the workspace's start
  view.h0 = nullptr;
  view.ht = nullptr;
  kda_prepared::launch_transitions(view, plan.transition_columns, w.transitions, P);
  affine_combine::launch(p, P, w.transitions, w.starts, "kda_v9_combine");
  view.h0 = w.starts;
  view.ht = w.finals;
  kda_prepared::launch_chunks(view, plan.output_columns, /*rung=*/8);
  affine_combine::copy_last_final_states(p, P, w.finals, name.c_str());
}

}  // namespace kda_split

extern const Version kda_v9 = {
    "kda", 9, "split_sequence",
    "v8's pass over chunks on P segments of each sequence at once, each segment's start state first found from the "
    "segments' K x K transitions (the identity carried through each segment by v8's pass without outputs), as delta "
    "v12: with few (batch, head) pairs v8 leaves most SMs idle (P chosen per shape by a cost model; P = 1 is v8).",
    false, true, kTensorCoreShape, 90, kda_split::workspace_bytes, kda_split::forward, 0, nullptr, nullptr, kReadsPacked};

}  // namespace minilin
