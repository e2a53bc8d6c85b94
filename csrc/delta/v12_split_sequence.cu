// delta v12 (split sequence, sm_90a): v10 run on P segments of every sequence at once, each segment's start state
// found first by a pass over the segments' transitions, because v10 gives each (batch, head, value block) one
// block that walks the whole sequence: at B = 1, H = 16, K = V = 128 that is 32 blocks for 132 SMs, and v10 ran
// 1.01-1.20x FLA's time there (csrc/NOTES.md).
// Measured on an H100 (2026-12-07, bf16, an initial state, device time, 5 alternating rounds): at B = 1, T = 32768,
// H = 16, K = V = 128 (P = 4) Gated DeltaNet 0.983 ms against v10's 1.504 (0.65x), DeltaNet 0.966 against 1.480;
// errors against float64 equal to v10's (3.3e-3, 4.0e-3). The same day: K = V = 64 Gated DeltaNet 0.496 against
// 1.449 (0.34x), grouped value heads (H_qk = 16, H_v = 32, K = V = 128) 1.414 against 1.618.
//
// The delta rule's state is affine in its start (CONVENTIONS.md, S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} +
// beta_t k_t v_t^T): over segment p, S_end = A_p S_start + L_p, where A_p [K, K] is the product of the segment's
// exp(g_t) (I - beta_t k_t k_t^T) and L_p [K, V] is the state the segment reaches from zero. Each column of S
// evolves alone, so A_p is what the identity's K columns become when carried through the segment as value columns
// with v = 0. Three passes (linear v8 puts the start back into the outputs afterwards; here the outputs depend on
// the start through A_t of every token, so the start comes first):
//   1. transitions: v10's chunk kernel without q or outputs (its kTransitions form), on the [B P, T / P] view of
//      the same arrays, segments 0 .. P - 2, from [0 | I] over V + K columns: [L_p | A_p] into the workspace;
//   2. combine (common/affine_combine.cuh): S_0 = h0 and S_{p+1} = A_p S_p + L_p in fp32;
//   3. v10's chunk kernel on the view from the starts S_p, its final states into the workspace, the last
//      segment's copied to ht.
// The WY prepare runs once, before pass 1 (the view's chunks are the sequence's). P is chosen per shape
// (choose_segments): P = 1 (plain v10) unless the predicted time of the three passes is lower. Packed sequences
// run as plain v10; grouped value heads split as the plain layout does.
#include <cuda_bf16.h>

#include <string>

#include "../common/affine_combine.cuh"  // pass 2
#include "../common/launch.cuh"
#include "../common/sequences.cuh"
#include "../common/split_segments.cuh"
#include "chunk_wy_mma_wide.cuh"  // delta_wide::check_problem, workspace_bytes

namespace minilin {

extern const Version delta_v10;

namespace delta_wgmma {  // v10_chunked_wy_wgmma.cu
void prepare(const Problem& p, __nv_bfloat16* wy);
void chunk_pass(const Problem& p, const __nv_bfloat16* wy);
void transitions_pass(const Problem& view, const __nv_bfloat16* wy, float* transitions, int segments);
}  // namespace delta_wgmma

namespace delta_split {

using bf16 = __nv_bfloat16;

using wide::kBlockV;                // v10's value block
constexpr int kMinSegment = 1024;   // no shorter segments: the added passes would cost more than they save
constexpr int kMaxSegments = 16;
// The cost model's constants (H100, 2026-12-07): v10's chunk pass takes ~2.9 us per chunk and block (1.48 ms for
// chains of 512 chunks at B = 1, H = 16); its kTransitions form, with half the products, is taken at ~2.0, a guess
// (the form was not timed alone), the combine at ~10 us per segment and the added launches at ~15 us: at B = 1,
// T = 32768, H = 16 the model puts P = 4 at 0.93 ms before the WY prepare, and the call measured 0.97-0.98 ms.
constexpr double kChunkUs = 2.9, kTransitionUs = 2.0, kCombineUs = 10.0, kAddedLaunchesUs = 15.0;

// ---- the choice of P ---------------------------------------------------------------------------------------
// v10's kernel holds one block per SM (its launch bounds and ~200 KB of shared memory), both forms.
inline int one_block_per_sm(int) { return 1; }

// With `sms` SMs: P = 1 takes ceil(blocks / sms) waves of chains of T / 64 chunks; P > 1 takes pass 1's
// ceil(B H (V + K) / 64 (P - 1) / sms) waves and pass 3's ceil(blocks P / sms), each of chains of T / (64 P), plus
// the combine and the added launches; fastest_affine_split (common/split_segments.cuh) picks the fastest P.
inline int fastest_segments(int sms, int B, int T, int H, int K, int V) {
  const long long blocks = static_cast<long long>(B) * H * (V / kBlockV);
  const long long transition_blocks = static_cast<long long>(B) * H * ((V + K) / kBlockV);
  const auto waves = [&](long long n) { return static_cast<double>((n + sms - 1) / sms); };
  return fastest_affine_split(B, T, kMinSegment, kMaxSegments, [&](int P) {
    const double chain = T / P / kChunk;
    if (P == 1) return waves(blocks) * chain * kChunkUs;
    return waves(transition_blocks * (P - 1)) * chain * kTransitionUs + waves(blocks * P) * chain * kChunkUs +
           (P - 1) * kCombineUs + kAddedLaunchesUs;
  });
}

inline int choose_segments(int B, int T, int H, int K, int V) {
  if ((K != 64 && K != 128) || V % kBlockV != 0 || B <= 0 || H <= 0) return 1;  // v10 refuses these; it says why
  if (T % (2 * kChunk) != 0 || T / 2 < kMinSegment) return 1;
  const SplitCard& card = split_card<one_block_per_sm>("delta_v12_split_sequence", K);
  return fastest_segments(card.sms, B, T, H, K, V);
}

// ---- the workspace: the WY tiles, then [L_p | A_p], the starts S_p and pass 3's final states, each 256-aligned
struct Workspace {
  bf16* wy;  // v10's: [H][chunk rows][64][64]
  affine_combine::SplitStates states;
};

inline size_t wy_bytes(int B, int T, int H) {
  return workspace_aligned(delta_wide::workspace_bytes(B, T, H, 0, 0, false));
}
inline size_t split_bytes(int P, int B, int T, int H, int K, int V) {
  return wy_bytes(B, T, H) + affine_combine::split_states_bytes(P, B, H, K, V);
}

size_t workspace_bytes(int B, int T, int H, int K, int V, bool packed) {
  if (packed || B <= 0 || T <= 0 || H <= 0 || K <= 0 || V <= 0)
    return delta_wide::workspace_bytes(B, T, H, K, V, packed);  // packed: plain v10
  const int P = choose_segments(B, T, H, K, V);
  return P == 1 ? delta_wide::workspace_bytes(B, T, H, K, V, false) : split_bytes(P, B, T, H, K, V);
}

inline Workspace carve(const Problem& p, int P) {
  auto* base = static_cast<unsigned char*>(p.workspace);
  return {reinterpret_cast<bf16*>(base),
          affine_combine::carve_split_states(base + wy_bytes(p.B, p.T, p.H), P, p.B, p.H, p.K, p.V)};
}

void forward(const Problem& p) {
  const std::string name = "delta_v12_split_sequence";
  check_tensor_core_problem(p, name.c_str(), true, kBlockV);
  require_sm90a(name);
  // Packed sequences run as plain v10: one chain per sequence already spreads a packed batch over the SMs, and a
  // segment must not straddle two sequences. Grouped value heads split as the plain layout does: the view keeps
  // qk_heads, and every pass reads q and k of value head h from q/k head h / (H / qk_heads) as v10 does.
  const int P = p.cu_seqlens ? 1 : choose_segments(p.B, p.T, p.H, p.K, p.V);
  check_workspace(p, name.c_str(), P == 1 ? delta_wide::workspace_bytes(p.B, p.T, p.H, p.K, p.V, p.cu_seqlens != nullptr)
                                          : split_bytes(P, p.B, p.T, p.H, p.K, p.V));  // P as chosen above
  if (P == 1) return delta_v10.forward(p);
  const Workspace w = carve(p, P);
  delta_wgmma::prepare(p, w.wy);  // the view's chunk rows are the sequence's, so its tiles serve both passes

  Problem view = p;  // the [B P, T / P] view: the same arrays, segments are contiguous runs of rows
  view.B = p.B * P;
  view.T = p.T / P;
  view.workspace = nullptr;
  view.workspace_size = 0;
  delta_wgmma::transitions_pass(view, w.wy, w.states.transitions, P);
  affine_combine::launch(p, P, w.states.transitions, w.states.starts, "delta_v12_combine");
  view.h0 = w.states.starts;
  view.ht = w.states.finals;
  delta_wgmma::chunk_pass(view, w.wy);
  affine_combine::copy_last_final_states(p, P, w.states.finals, name.c_str());
}

}  // namespace delta_split

extern const Version delta_v12 = {
    "delta", 12, "split_sequence",
    "v10 on P segments of each sequence at once, each segment's start state first found from the segments' K x K transitions (the identity carried through each segment by v10's kernel without outputs): with few (batch, head) pairs v10 leaves most SMs idle (P chosen per shape by a cost model; P = 1 is v10).",
    false, true, kTensorCoreShape, 90, delta_split::workspace_bytes, delta_split::forward, 90, nullptr, nullptr,
    kReadsPacked};

}  // namespace minilin
