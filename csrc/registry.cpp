// The ladder: every kernel version, in op then version order. Each version lives in its own file
// (csrc/<op>/v<N>_*.cu) and says there, in one sentence, what it changed and why.
#include "minilin_cuda.h"

namespace minilin {

extern const Version linear_v1, linear_v2, linear_v3, linear_v4, linear_v5, linear_v6, linear_v7;
extern const Version delta_v1, delta_v2, delta_v3, delta_v4, delta_v5, delta_v6, delta_v7, delta_v8,
    delta_v9, delta_v10;

// The wgmma versions (delta v10) are listed only when the build holds sm_90a code for them (setup.py's
// MINILIN_SM90A); their files compile either way.

const std::vector<Version>& versions() {
  static const std::vector<Version> all = {linear_v1, linear_v2, linear_v3, linear_v4, linear_v5, linear_v6, linear_v7,
                                                delta_v1,  delta_v2,  delta_v3,  delta_v4,  delta_v5,  delta_v6,  delta_v7, delta_v8,
                                                delta_v9,
#ifdef MINILIN_SM90A
                                                delta_v10,
#endif
  };
  return all;
}

}  // namespace minilin
