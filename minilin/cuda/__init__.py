"""minilin.cuda: the hand-written CUDA kernels (csrc/), called with CuPy arrays.

    import cupy
    from minilin import cuda
    o, state = cuda.gated_deltanet(q, k, v, g, beta)          # q, k, v: CuPy [B, T, H, K/V], float32 or bf16
    o, state = cuda.simple_gla(q, k, v, g, version=1)          # any rung of the ladder: versions('linear')
    o_t, pool = cuda.gated_deltanet_step(q_t, k_t, v_t, g_t, beta_t, state=pool, state_indices=slots)
                                                               # one decode token per sequence, pool updated in place

Each op has numbered kernel versions side by side, every one callable (`version=`). For the forward ops: 1 =
recurrent (the definition, token by token), 2 = chunked on plain CUDA cores, 3 = chunked on bf16 tensor cores, then
each op's later steps, each named by what it changed (`versions(op)` lists them with their one-sentence summaries,
csrc/NOTES.md with their measured times). The scalar-gated mixers (linear attention, RetNet, Lightning, Mamba-2,
simple GLA) run the op "linear", DeltaNet and Gated DeltaNet "delta", GLA and HGRN2 "gla", Kimi Delta Attention
"kda". version=None runs the highest version that the build holds, that takes the input dtype and the shape (K,
V), that runs on the GPU's compute capability, and that did not measure slower than a rung below it
(front.SLOWER_RUNGS). For bfloat16 at K = 64 or 128 (K = 256 in brackets) that is: on compute capability 9.0 in a
build with sm_90a code (warpgroup tensor cores, wgmma), linear 10 (9), delta 12 (11), gla 5 (6), kda 9 (10); on 9.0
without sm_90a code, or above 9.0 from the compute_90 PTX, linear 8 (9), delta 9 (11), gla 5 (6), kda 9 (10);
below 9.0, linear 6, delta 7, gla 5, kda 1 (the token loops at K = 256). For float32: linear and delta 2 (1 at K =
256), gla and kda 1 (their CUDA-core v2s are slower than the token loop).

The decode steps (`<mixer>_step`, minilin/cuda/decode.py and steps.py) run the op "decode": one token for each of N sequences, every mixer of both families, the states [N, H, K, V] (or a pool
indexed by `state_indices`) updated in place. The backward passes (`<mixer>_backward`, minilin/cuda/backward.py)
run the ops "linear_bwd", "delta_bwd", "gla_bwd" (GLA and HGRN2) and "kda_bwd" (KDA), each a v1 (token loops,
float32 and bf16, K up to 256) and a v2 (chunked on bf16 tensor cores, the bf16 default at K = 64 and 128; kda_bwd
v2 on compute capability 9.0 and newer), and
return the mixers' named tuples of gradients (dq, dk, dv in their inputs' dtype, the rest float32).

Inputs follow CONVENTIONS.md (shapes [B, T, H, K] etc., C-contiguous, on the current device); q, k, v are
float32 or bfloat16 (`to_bf16` / `from_bf16`: CuPy's bfloat16 dtype where it has one, else uint16 bit
patterns; never a silent cast); g, beta and states are float32, and so is all accumulation. Outputs are
CuPy arrays, computed on CuPy's current stream.

Importing this package needs neither CuPy nor the extension; calling a kernel needs both, and the error
says how to get what is missing (`minilin doctor` lists what was found).
"""
from .. import catalog
from .backward import (channel_delta_rule_backward, channel_gated_linear_backward, delta_rule_backward,
                       deltanet_backward, gated_deltanet_backward, gated_linear_backward, gla_backward,
                       hgrn2_backward, kda_backward, lightning_backward, linear_attention_backward, mamba2_backward,
                       retnet_backward, simple_gla_backward)
from .bf16 import from_bf16, native_dtype, to_bf16
from .decode import delta_rule_step, gated_linear_step
from .front import channel_delta_rule, channel_gated_linear, default_version, delta_rule, extension, gated_linear, versions
from .mixers import deltanet, gated_deltanet, gla, hgrn2, kda, lightning, linear_attention, mamba2, retnet, simple_gla
from .steps import (deltanet_step, gated_deltanet_step, gla_step, hgrn2_step, kda_step, lightning_step,
                    linear_attention_step, mamba2_step, retnet_step, simple_gla_step)

__all__ = ["available", "channel_delta_rule", "channel_delta_rule_backward", "channel_gated_linear", "channel_gated_linear_backward", "default_version", "delta_rule", "delta_rule_backward", "delta_rule_step", "deltanet",
           "deltanet_backward", "deltanet_step", "extension", "from_bf16", "gated_deltanet", "gated_deltanet_backward",
           "gated_deltanet_step", "gated_linear", "gated_linear_backward", "gated_linear_step", "gla", "gla_backward",
           "gla_step", "hgrn2", "hgrn2_backward", "hgrn2_step", "kda", "kda_backward", "kda_step",
           "lightning", "lightning_backward", "lightning_step", "linear_attention", "linear_attention_backward", "linear_attention_step",
           "mamba2", "mamba2_backward", "mamba2_step", "native_dtype", "retnet", "retnet_backward", "retnet_step", "simple_gla", "simple_gla_backward",
           "simple_gla_step", "to_bf16", "versions"]

# Which op each GPU mixer's forward runs on, "linear" (scalar-gated linear family), "delta", or their per-channel-gated
# members "gla" and "kda": each mixer's SIGNATURE says it (`gpu`); the mixers without one have no forward kernel.
OPS = {name: catalog.signature(name).gpu for name in catalog.names() if catalog.signature(name).gpu}
# The one-token steps of these mixers, and of gla and kda, all run on the "decode" op: STEPS maps each mixer to its
# `<mixer>_step`.
STEPS = {"linear_attention": linear_attention_step, "simple_gla": simple_gla_step, "gla": gla_step,
         "retnet": retnet_step, "lightning": lightning_step, "mamba2": mamba2_step, "deltanet": deltanet_step,
         "gated_deltanet": gated_deltanet_step, "kda": kda_step, "hgrn2": hgrn2_step}


def available() -> tuple[bool, str]:
    """(True, "") when CuPy sees a GPU and the extension is built; else (False, the reason)."""
    try:
        from .front import cupy_module

        cupy = cupy_module()
    except ImportError as error:
        return False, str(error)
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return False, "CuPy sees no GPU"
    except Exception as error:  # noqa: BLE001 - no driver, no device: CuPy raises its own types
        return False, f"CuPy sees no GPU ({error})"
    try:
        extension()
    except ImportError as error:
        return False, str(error)
    return True, ""
