// The ladder: every kernel version, in op then version order. Each version lives in its own file
// (csrc/<op>/v<N>_*.cu) and says there, in one sentence, what it changed and why; its Version's summary
// carries that sentence (`minilin.cuda.versions()` lists them), and csrc/NOTES.md has each one's row with its
// measured time. The ops: "linear" and "delta" (a whole sequence, forward, one decay per head), "gla" and "kda"
// (a whole sequence, forward, one decay per key channel: GLA, and the delta rule with it, Kimi Delta Attention),
// "decode" (one token for each of N sequences, both families), "linear_bwd", "delta_bwd", "gla_bwd" and "kda_bwd"
// (a whole sequence, backward). The versions built from sm_90a code only (wgmma: linear v10, delta v10 and v12)
// are listed under MINILIN_SM90A, which setup.py defines when it compiles for sm_90a.
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
