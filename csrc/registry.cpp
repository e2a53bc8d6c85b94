// The ladder: every kernel version, in op then version order. Each version lives in its own file
// (csrc/<op>/v<N>_*.cu) and says there, in one sentence, what it changed and why. The ops: "linear" and "delta"
// (a whole sequence, forward, one decay per head), "gla" and "kda" (a whole sequence, forward, one decay per key
// channel: GLA, and the delta rule with it, Kimi Delta Attention), "decode" (one token for each of N sequences, both
// families), "linear_bwd", "delta_bwd", "gla_bwd" and "kda_bwd" (a whole sequence, backward):
//   linear v8      split_sequence: v7 on segments of each sequence at once, the segments' start states put back
//                  by a short pass and added to the outputs, so that few (batch, head) pairs still fill the card.
//   linear v10     chunked_wgmma: v8 with its chunk pass on Hopper warpgroup tensor cores (sm_90a), delta v10's
//                  roles without the WY step.
//   delta v12      split_sequence: v10 on segments of each sequence at once, each segment's start state found
//                  first from the segments' K x K transitions, so that few (batch, head) pairs still fill the card.
//   gla v1         recurrent: linear v1 with a decay per key channel, g [B, T, H, K] staged a row per token.
//   gla v2         chunked: 64-token chunks on CUDA cores, the decays through references inside the chunk so that
//                  only non-positive numbers are exponentiated.
//   gla v3         chunked_mma: v2's products below the diagonal, state read and update on bf16 tensor cores.
//   gla v4         prepared_chunks: v3's chunk-local work in a kernel parallel over chunks, the pass over chunks
//                  only the state read and update, its tiles copied one chunk ahead.
//   gla v5         split_sequence: v4's pass on segments of each sequence at once, the segments' start states put
//                  back by a short pass and added to the outputs (linear v8's split, a decay per key channel).
//   kda v1         recurrent: delta v1 with a decay per key channel.
//   kda v2         chunked: the WY form on CUDA cores, the decays through gla v2's sub-chunk references.
//   kda v3         prepared_chunks: v2's WY form with gla v4's split, the chunk-local work and the solve in a kernel
//                  parallel over chunks, the pass over chunks the state's products on bf16 tensor cores.
//   kda v4         sliced_prepare: v3 with its prepare taken through the key channels 64 at a time, two blocks per
//                  SM instead of one.
//   kda v5         narrow_value_blocks: v4's pass over chunks on 32 value columns a block where those blocks fit the
//                  card at once (one long sequence), v4 elsewhere.
//   kda v6         half_sub_chunks: v5 with each diagonal block's (8..15, 0..7) quarter a product of rows rescaled
//                  to the sub-chunk's token 7, on tensor cores.
//   kda v7         output_with_memory: v6's pass over chunks with Qr S in Kg S's k loop instead of after Delta, the
//                  last two products side by side: a shorter chain of dependent products per chunk.
//   kda v8         two_state_copies: v7 with two bf16 copies of S, chunk n reading one and writing the other:
//                  three barriers a chunk instead of four.
//   kda v9         split_sequence: v8's pass on P segments of each sequence at once, the segments' start states
//                  first from their K x K transitions (delta v12's split): few (batch, head) pairs fill the card.
//   decode v1      register_tiles: one block per (sequence, head, 32 value columns), its state slice in registers,
//                  read and written once with 16-byte accesses.
//   linear_bwd v1  recurrent: a forward token loop for dq and a backward one for the state's adjoint, dk and dv;
//                  dg a reverse cumulative sum of per-token terms.
//   linear_bwd v2  chunked_mma: the chunk-boundary states and their adjoints by one pass each way, then every
//                  chunk's gradients in parallel as matrix products on bf16 tensor cores.
//   delta_bwd v1   recurrent: the definition run backwards, states checkpointed every 64 tokens and recomputed
//                  chunk by chunk, the state's adjoint in registers.
//   delta_bwd v2   chunked_wy_mma: the forward's T per chunk, the chunk-boundary states and their adjoints by one
//                  pass each way, then every chunk's gradients in parallel on bf16 tensor cores through the WY form.
//   gla_bwd v1     recurrent: linear_bwd v1's token loops with a decay per key row; dg per channel, a reverse
//                  cumulative sum of per-token, per-channel terms.
//   gla_bwd v2     chunked_mma: gla v4's prepared tiles, the chunk-boundary states and their adjoints by one pass
//                  each way, then every chunk's gradients in parallel on bf16 tensor cores (the pairs of tokens in
//                  different sub-chunks through the boundary between them); dg chunk by chunk.
//   kda_bwd v1     recurrent: delta_bwd v1's two passes with a decay per key row; dg per channel, D' . S' kept
//                  row by row.
//   kda_bwd v2     chunked_wy_mma: delta_bwd v2's WY backward with a decay per key channel, kda v6's prepared tiles,
//                  the pairs of tokens in different sub-chunks through the boundary between them (gla_bwd v2's).
#include "minilin_cuda.h"

namespace minilin {

extern const Version linear_v1, linear_v2, linear_v3, linear_v4, linear_v5, linear_v6, linear_v7, linear_v8,
    linear_v9, linear_v10;
extern const Version delta_v1, delta_v2, delta_v3, delta_v4, delta_v5, delta_v6, delta_v7, delta_v8,
    delta_v9, delta_v10, delta_v11, delta_v12;
extern const Version gla_v1, gla_v2, gla_v3, gla_v4, gla_v5, gla_v6;
extern const Version kda_v1, kda_v2, kda_v3, kda_v4, kda_v5, kda_v6, kda_v7, kda_v8, kda_v9, kda_v10;
extern const Version decode_v1;
extern const Version linear_bwd_v1, linear_bwd_v2, delta_bwd_v1, delta_bwd_v2, gla_bwd_v1, gla_bwd_v2,
    kda_bwd_v1, kda_bwd_v2;

// The wgmma versions (linear v10, delta v10 and v12) are listed only when the build holds sm_90a code for them (setup.py's
// MINILIN_SM90A); their files compile either way.

const std::vector<Version>& versions() {
  static const std::vector<Version> all = {linear_v1, linear_v2, linear_v3, linear_v4, linear_v5, linear_v6, linear_v7,
                                                linear_v8, linear_v9,
#ifdef MINILIN_SM90A
                                                linear_v10,
#endif
                                                delta_v1,  delta_v2,  delta_v3,  delta_v4,  delta_v5,  delta_v6,  delta_v7, delta_v8,
                                                delta_v9,
#ifdef MINILIN_SM90A
                                                delta_v10,
#endif
                                                delta_v11,
#ifdef MINILIN_SM90A
                                                delta_v12,
#endif
                                                gla_v1,    gla_v2,    gla_v3,    gla_v4,    gla_v5,    gla_v6,
                                                kda_v1,    kda_v2,    kda_v3,    kda_v4,    kda_v5,    kda_v6,    kda_v7,    kda_v8,
                                                kda_v9,    kda_v10,
                                                decode_v1,
                                                linear_bwd_v1,
                                                linear_bwd_v2,
                                                delta_bwd_v1,
                                                delta_bwd_v2,
                                                gla_bwd_v1,
                                                gla_bwd_v2,
                                                kda_bwd_v1,
                                                kda_bwd_v2,
  };
  return all;
}

}  // namespace minilin
