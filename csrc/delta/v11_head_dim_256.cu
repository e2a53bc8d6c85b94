// delta v11 (head dim 256): v9 at K = 256, because no tensor-core version of the delta rule took K = 256 and the
// default ran the token loop v1 there. v9's chunk kernel (chunk_wy_producer.cuh) is generic in K but for its
// shared memory: at K = 256 a stage (q and k rows of 256 + 8, v, T's tile, G, beta) is 85 KB, and two stages with
// P, the bf16 copy of S [256, 64] and the X, Delta and Delta-decayed tiles take 241 KB of the SM's 227. Its
// "slim" layout at K = 256 keeps two stages and drops two tiles:
//   X = diag(beta) (V - diag(exp(G)) K S) is written over the stage's v: each element is read and rewritten by the
//   thread that owns it in phase 1, and nothing reads v after that;
//   Delta decayed to the chunk's end: the state update K^T diag(d) Delta reads (diag(d) K)^T Delta instead, the
//   stage's k rows scaled in place during phase 2 (which does not read k; phase 1 is done with it at the barrier
//   before, the state update reads it after the next).
// 223 KB, one block per SM as at K = 128; each of the 16 compute warps owns one 16-row tile of S (32 floats a
// thread). The WY prepare (wy_prepare_blocked.cuh, on tensor cores as v9's) is generic in K: its key tile is
// 33 KB at K = 256 (fewer blocks per SM than at 128). Delta decayed is now rounded to bf16 through the keys instead
// of through Delta: the same one rounding of a product of a bf16 number and a decay.
#include "chunk_wy_producer.cuh"
#include "wy_prepare_blocked.cuh"

namespace minilin {
namespace {

constexpr const char* kName = "delta_v11_head_dim_256";

void forward(const Problem& p) {
  check_common(p, kName, true);
  require_head_dim_256_shape(kName, p.dtype, p.K, p.V, wide::kBlockV, "v3 to v10 and v12");
  check_workspace(p, kName, delta_wide::workspace_bytes(p.B, p.T, p.H, p.K, p.V, false));
  auto* wy = static_cast<__nv_bfloat16*>(p.workspace);
  constexpr auto kProducts = wy_blocked::WaveProducts::kTensorCores;
  launch_checked(p, "delta_v11_wy_prepare", wy_blocked::delta_wy_prepare_blocked<256, kProducts>, chunk_grid(p, p.H),
                 wy_blocked::kThreads, wy_blocked::shared_bytes(p.K), wy);
  launch_checked(p, kName, delta_producer::delta_chunked_wy_producer_warp<256>,
                 dim3(p.V / wide::kBlockV, p.H, p.B), producer_block::kThreads,
                 delta_producer::Layout<256>::kBytes, static_cast<const __nv_bfloat16*>(wy));
}

}  // namespace

extern const Version delta_v11 = {
    "delta", 11, "head_dim_256",
    "v9 at K = 256 with two stages, X written over the stage's v and the chunk's decay put on its keys instead of a Delta-decayed tile (v9's layout would need 241 KB of shared memory there): no tensor-core version took K = 256, so the default ran the token loop there.",
    false, true, kTensorCoreShape256, 90, delta_wide::workspace_bytes, forward};

}  // namespace minilin
