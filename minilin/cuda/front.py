"""The engines of minilin.cuda: check CuPy arrays, launch one kernel version, return (o, final_state).

    gated_linear(q, k, v, g=None, ...)         S_t = exp(g_t) S_{t-1} + k_t v_t^T,          o_t = scale S_t^T q_t
    delta_rule(q, k, v, g, beta, ...)          S_t = S' + beta_t k_t (v_t - S'^T k_t)^T,   S' = exp(g_t) S_{t-1}
                                               (g None: DeltaNet, no decay; g before beta, as everywhere)
    channel_gated_linear(q, k, v, g, ...)      gated_linear with a decay per key channel,  S' = diag(exp(g_t)) S_{t-1}
                                               (GLA; the op "gla")
    channel_delta_rule(q, k, v, g, beta, ...)  delta_rule with that decay (Kimi Delta Attention; the op "kda")

Shapes (CONVENTIONS.md): q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV] (the channel engines' g
[B, T, HV, K]); initial_state and the returned state [B, HV, K, V]; o [B, T, HV, V]. HV = H is the plain
layout; HV a multiple of H groups the value heads (`minilin.heads`). cu_seqlens [N + 1] with B = 1 packs N
sequences along T (`minilin.varlen`; the states are then [N, HV, K, V]). Versions marked `packed` in `versions`
(the token loops, linear v7 - v10, delta v10 and v12, gla v3 - v6, kda v3 - v10: the bfloat16 defaults of linear at
K = 64, 128 and 256 on compute capability 9.0 or newer, of delta at K = 64 or 128 on an sm_90a build and a 9.0 GPU,
not delta v11 at K = 256, and every default of gla and kda) read
both layouts in the kernel, one launch for the whole batch (up to MAX_PACKED_SEQUENCES sequences: the grid's z
extent); the others see q and k repeated to HV heads (`heads.expand`, one copy of each) and one launch per
sequence, so a packed call to them costs what N calls cost.
Dtypes: q, k, v all float32 or all bfloat16 (native or uint16 bits, see `bf16`); g, beta and the state
float32 (accumulation is float32 throughout); o comes back in the dtype of v.

Every check runs before the launch, in the order dtype, shape, contiguity, device, and each error names the
argument, what was expected and what was given. The kernel runs on CuPy's current stream; a failed launch
raises RuntimeError naming the kernel (set MINILIN_CUDA_SYNC=1 to also catch errors inside kernels at the
call that launched them).
"""
from __future__ import annotations

import functools

import numpy as np

from .. import heads, varlen
from ..backend import is_cupy_array
from ..activations import l2_normalize
from ..validation import KEY_NORM_SLACK, Shapes, check_beta, check_flag, check_log_gate, check_nonempty, check_scale
from . import bf16

OPS = ("linear", "delta", "gla", "kda")


def _describe(x) -> str:
    t = type(x)
    return f"{t.__module__.split('.')[0]}.{t.__name__}" if t.__module__ != "builtins" else t.__name__


def cupy_module():
    """CuPy, or ImportError saying how to get it."""
    try:
        import cupy
    except ImportError as error:
        raise ImportError("minilin.cuda needs CuPy: pip install -e '.[cuda]' (cupy-cuda13x); "
                          "`minilin doctor` says what was found") from error
    return cupy


def extension():
    """The compiled module minilin._cuda, or ImportError saying how to build it."""
    try:
        from .. import _cuda
    except ImportError as error:
        raise ImportError("minilin._cuda is not built: install with nvcc on PATH, e.g. "
                          "MINILIN_CUDA=1 pip install -e . ; `minilin doctor` says what was found") from error
    return _cuda


@functools.lru_cache(maxsize=None)
def _built_versions() -> tuple[dict, ...]:
    """The extension's list, read once: a lone call pays for its checks in its time (the bench's call ms)."""
    return tuple(extension().versions())


@functools.lru_cache(maxsize=None)
def _compute_capability(device: int) -> int:
    """10 * major + minor, e.g. 90. CuPy gives the digits as a string ('90'; '100' for 10.0), so int() of it."""
    return int(cupy_module().cuda.Device(device).compute_capability)


def versions(op: str | None = None) -> list[dict]:
    """The kernel versions the extension was built with (dicts: op, version, name, summary, ...)."""
    return [dict(v) for v in _built_versions() if op is None or v["op"] == op]


def default_version(op: str, dtype_is_bf16: bool = True, K: int | None = None, V: int | None = None) -> int:
    """The version that version=None runs for `op` (one of `OPS`) and dtype on the current GPU, for key width K and
    value width V when given (either alone too; see `takes_shape`)."""
    capability = _compute_capability(cupy_module().cuda.Device().id)
    return _version_info(op, None, dtype_is_bf16, capability, K, V)["version"]


def takes_shape(info: dict, K: int, V: int | None = None) -> bool:
    """Whether version `info` (a dict of `versions`) takes key width K and value width V: K <= its max_k, K one of
    its keys (None: any), V a multiple of its value_multiple (the extension's ShapeRule, csrc/minilin_cuda.h; V None:
    the key width alone)."""
    return (K <= info["max_k"] and (info["keys"] is None or K in info["keys"])
            and (V is None or V % info["value_multiple"] == 0))


def _runs_on(info: dict, capability: int) -> bool:
    """Whether a version's machine code runs on a GPU of this compute capability (10 * major + minor)."""
    highest = info.get("max_compute_capability", 0)
    return info["min_compute_capability"] <= capability and (not highest or capability <= highest)


def _dotted(capability: int) -> str:
    return f"{capability // 10}.{capability % 10}"


def _capability_range(info: dict) -> str:
    """The compute capabilities a version runs on, in words: '8.0 or newer', 'exactly 9.0 (...)', '8.0 to 9.0'."""
    low, high = info["min_compute_capability"], info.get("max_compute_capability", 0)
    if not high:
        return f"{_dotted(low)} or newer"
    if high == low:
        return f"exactly {_dotted(low)} (its machine code is architecture-specific, e.g. sm_90a's wgmma)"
    return f"{_dotted(low)} to {_dotted(high)}"


# Rungs that measured slower than a rung below them, per (op, dtype is bfloat16): version=None passes over them,
# at every key width (None) or at the key widths K listed (csrc/NOTES.md, 2026-12-01, H200, bf16 unless said):
# kda v2, the WY form on CUDA cores, took 42.6 ms against v1's 6.3 at B=4, T=8192, H=16, K=V=128; gla v2 (CUDA
# cores) 29.6 ms against v1's 5.5 (float32 too: v1 is the default of both dtypes where no tensor-core rung runs or
# takes the shape); kda v4 at K = V = 64, where its 64-
# channel slices are one, 0.959 ms against v3's 0.873 (1.10x, 0.133 against 0.120 at B=8, T=1024, H=8), while at
# K = 128 it is the faster (1.445 against 1.645); kda v5, not yet timed beside v3 at K = 64, runs v4's sliced prepare,
# so it is passed over there with it until it is (at K = 128 v5 took 1.449 ms: 2026-12-02).
# kda v6 to v8 run the same prepare but measured faster than v3 at K = V = 64 too (v8 0.752 against v3's 0.886 ms
# at B=4, T=8192, H=16; 1.344 against 1.949 at B=1, T=32768; 0.112 against 0.123 at B=8, T=1024, H=8: H100,
# 2026-12-06), so v8 is the default at both key widths where v9 does not split a sequence (v9 runs v8 there).
# Where a faster rung does not run (kda v3 to v10 below compute capability 9.0, v3 to v9 at K = 256, v10 below it)
# the default falls to the next rung down that is not passed over.
SLOWER_RUNGS = {("kda", True): {2: None, 4: (64,), 5: (64,)}, ("kda", False): {2: None},
                ("gla", True): {2: None}, ("gla", False): {2: None}}


def _passed_over(op: str, dtype_is_bf16: bool, version: int, K: int | None) -> bool:
    """Whether version=None passes over `version` of `op` (SLOWER_RUNGS) at key width K (None: not known)."""
    slower = SLOWER_RUNGS.get((op, dtype_is_bf16), {})
    if version not in slower:
        return False
    widths = slower[version]
    return widths is None or (K is not None and K in widths)


def _version_info(op: str, version, dtype_is_bf16: bool, capability: int, K: int | None = None,
                  V: int | None = None) -> dict:
    available = [v for v in _built_versions() if v["op"] == op]
    if not available:
        raise ValueError(f"op: expected one of {sorted({v['op'] for v in _built_versions()})}, got {op!r}")
    if version is None:
        # The last rung of the ladder that takes this dtype (and K, V when given), runs on this GPU and is not
        # passed over (SLOWER_RUNGS). Where no rung takes the shape the last one is chosen anyway: its checks say
        # why.
        usable = [v for v in available if (v["bfloat16"] if dtype_is_bf16 else v["float32"]) and _runs_on(v, capability)]
        if not usable:
            raise RuntimeError(f"version: no {op} version runs on compute capability "
                               f"{capability // 10}.{capability % 10} (see versions('{op}'))")
        if K is not None:
            usable = [v for v in usable if takes_shape(v, K, V)] or usable[-1:]
        faster = [v for v in usable if not _passed_over(op, dtype_is_bf16, v["version"], K)]
        return (faster or usable)[-1]
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise TypeError(f"version: expected an integer or None, got {_describe(version)} {version!r}")
    for v in available:
        if v["version"] == version:
            if dtype_is_bf16 and not v["bfloat16"] or not dtype_is_bf16 and not v["float32"]:
                takes = "bfloat16" if v["bfloat16"] else "float32"
                given = "bfloat16" if dtype_is_bf16 else "float32"
                raise TypeError(f"version: {op} version {version} ({v['name']}) takes {takes} inputs only, got {given}; "
                                f"use another version or convert with minilin.cuda.to_bf16 / from_bf16")
            return v
    hint = ""
    if "sm_90a" not in getattr(extension(), "cuda_arch", "").split(","):
        hint = " (the wgmma versions, linear v10 and delta v10 and v12, are built only for sm_90a: MINILIN_CUDA_ARCH=90a, the default)"
    raise ValueError(f"version: expected one of {[v['version'] for v in available]} for {op}, got {version}{hint}")


def runnable_version(op: str, version, dtype_is_bf16: bool, K: int | None = None, V: int | None = None) -> dict:
    """The extension's entry (a dict of `versions`) that a call of `op` with `version` (None: the default for the
    dtype and, when given, key and value widths K and V) runs on the current GPU; RuntimeError naming the compute
    capabilities when a version asked for by number does not run on it (`_version_info` raises the rest: an
    unknown number, the wrong dtype, nothing that runs). A version asked for by number is kept whatever the shape:
    its own checks say what it takes."""
    capability = _compute_capability(cupy_module().cuda.Device().id)
    info = _version_info(op, version, dtype_is_bf16, capability, K, V)
    if not _runs_on(info, capability):
        raise RuntimeError(f"version: {op} version {info['version']} ({info['name']}) needs compute capability "
                           f"{_capability_range(info)}, this GPU has {_dotted(capability)}")
    return info


def check_input(name: str, x, dims: str, shapes: Shapes, *, float32_only: bool, like=None, like_name: str = "q",
                device: int | None = None):
    """One CuPy tensor argument: dtype, then shape, then contiguity, then device.

    float32_only: gates, beta and states are float32; otherwise float32 or bfloat16 (native or bits), and
    the same dtype as `like` (the array called `like_name`, q by default) when given. device: the current
    device's id when the caller has it (asking CuPy costs about a microsecond per argument), else looked up.
    """
    if x is None:
        raise TypeError(f"{name}: expected a CuPy array [{', '.join(dims.split())}], got None")
    if not is_cupy_array(x):  # decided without importing CuPy, so this check runs anywhere
        raise TypeError(f"{name}: expected a CuPy array on the GPU, got {_describe(x)} "
                        f"(move it with cupy.asarray)")
    cupy = cupy_module()
    if float32_only:
        if x.dtype != np.float32:
            raise TypeError(f"{name}: expected float32 (gates, beta and states are kept in float32), got {x.dtype}")
    elif like is not None and x.dtype != like.dtype:
        raise TypeError(f"{name}: expected the dtype of {like_name} ({like.dtype}), got {x.dtype}")
    elif not (x.dtype == np.float32 or bf16.is_bf16(x.dtype)):
        raise TypeError(f"{name}: expected float32 or bfloat16 (native, or uint16 bits from minilin.cuda.to_bf16), "
                        f"got {x.dtype}")
    shapes.bind(name, x.shape, dims)
    if not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array (cupy.ascontiguousarray), got strides {x.strides}")
    if device is None:
        device = cupy.cuda.Device().id
    if x.device.id != device:
        raise ValueError(f"{name}: expected an array on the current device {device}, got one on device {x.device.id}")
    return x


def _all_finite_on_device(x):
    """A device bool: every element of x (float32 or bfloat16) finite. bfloat16 is read as its bits, an exponent of
    all ones being inf or NaN, so no float32 copy is made."""
    cupy = cupy_module()
    if np.dtype(x.dtype) == np.float32:
        return cupy.isfinite(x).all()
    bits = x if np.dtype(x.dtype) == bf16.BITS else x.view(bf16.BITS)
    return ((bits & 0x7F80) != 0x7F80).all()


def check_finite(name: str, x) -> None:
    """Raise unless every element is finite (one device-to-host sync)."""
    check_all_finite((name, x))


def check_all_finite(*named) -> None:
    """check_finite for each (name, array) pair at one device-to-host sync in all (None arrays skipped); the error
    names the first that holds a NaN or inf."""
    named = [(name, x) for name, x in named if x is not None and x.size]
    if not named:
        return
    flags = cupy_module().stack([_all_finite_on_device(x) for _, x in named]).tolist()
    for (name, _), finite in zip(named, flags):
        if not finite:
            raise ValueError(f"{name}: expected finite values, got NaN or inf")


# How far beta_t |k_t|^2 may exceed its bound. float32 keys: the NumPy forms' slack (validation.KEY_NORM_SLACK), a
# unit key in float32 having |k|^2 = 1 within a few 1e-7. bfloat16 keys: unit keys rounded to bfloat16 have |k|^2
# within about 2 * 2^-8 of 1 (each element off by at most 2^-9 of itself, squared), so 2^-6 lets every rounded unit
# key through; the NumPy check, which sees no rounding, would refuse some of them.
KEY_STRENGTH_SLACK = {"bfloat16": 2.0 ** -6, "float32": KEY_NORM_SLACK}


def check_key_strength(k, beta, allow_neg_eigval: bool, group: int = 1) -> None:
    """validation.check_delta_keys for the GPU's inputs: the transition I - beta_t k_t k_t^T has the eigenvalue
    1 - beta_t |k_t|^2 along k_t (1 on the rest), in [0, 1] when beta_t |k_t|^2 <= 1 and in [-1, 1] when it is
    <= 2 (allow_neg_eigval): only then the state cannot grow. Raise unless beta_t |k_t|^2 is within that bound, up to
    KEY_STRENGTH_SLACK of the keys' dtype.

    k [..., H, K] (float32 or bfloat16), beta [..., H * group] float32 (beta's own range is checked before; value
    head j reads key head j // group). Two syncs; the index of the worst token costs a third, on failure only.
    """
    xp = cupy_module() if is_cupy_array(k) else np
    k32 = bf16.as_float32(k)
    norms = (k32 * k32).sum(-1)
    strength = beta * (xp.repeat(norms, group, axis=-1) if group > 1 else norms)  # beta_t |k_t|^2
    dtype = "bfloat16" if bf16.is_bf16(k.dtype) else "float32"
    bound = 2.0 if allow_neg_eigval else 1.0
    top = float(strength.max()) if strength.size else 0.0
    if not top <= bound * (1.0 + KEY_STRENGTH_SLACK[dtype]):  # NaN fails too
        at = tuple(int(i) for i in np.unravel_index(int(xp.argmax(strength)), strength.shape))
        eigen = "[-1, 1]" if allow_neg_eigval else "[0, 1]"
        raise ValueError(f"k, beta: expected beta |k|^2 <= {bound:g} (allow_neg_eigval={allow_neg_eigval}; "
                         f"+{KEY_STRENGTH_SLACK[dtype]:g} for {dtype} rounding) so that the transition I - beta k k^T "
                         f"keeps its eigenvalues in {eigen}: L2-normalize the keys, or pass normalize_qk=True to have "
                         f"the call do it; got beta |k|^2 = {top:.6g} at index {at}")


def l2_normalized(x):
    """x / sqrt(|x|^2 + eps) over the last axis (`activations.l2_normalize`, FLA's eps), computed in float32 and
    returned in x's dtype (bfloat16 rounded once more): normalize_qk's pre-pass, a few CuPy elementwise and
    reduction launches over q and k."""
    return bf16.like(l2_normalize(bf16.as_float32(x)), x)


# Sequences a packed version takes in one launch: they lie along the grid's z axis, which CUDA caps at 65535.
# Larger batches run one launch per sequence, as the other versions do.
MAX_PACKED_SEQUENCES = 65535


def address(x) -> int:
    """A CuPy array's device address, 0 for None (an absent input)."""
    return 0 if x is None else x.data.ptr


def _launch_one(op: str, info: dict, q, k, v, g, beta, initial_state, scale, o, final_state, cu_seqlens=None):
    """One launch of version `info` of `op` over checked arrays, writing o and final_state (preallocated,
    C-contiguous: whole arrays or one sequence's slices). q and k have v's heads or, for a version that reads
    grouped heads (`packed` in `versions`), their own; cu_seqlens: None, or the offsets as an int32 device array
    for such a version (then the states hold one row per sequence)."""
    cupy = cupy_module()
    cuda = extension()
    B, T, H, V = v.shape
    K = q.shape[-1]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    # The layouts' arguments only where they are not the plain layout's: the plain call stays the same call.
    layout = {} if cu_seqlens is None and q.shape[2] == H else dict(cu_seqlens=address(cu_seqlens), qk_heads=q.shape[2])
    sizing = {} if cu_seqlens is None else dict(packed=True)
    workspace_size = cuda.workspace_bytes(op, info["version"], N, T, H, K, V, **sizing)
    # Scratch bytes from CuPy's pool, without an array around them (a few microseconds less per call); held
    # here until the launch is queued, after which the pool may hand them to later work on the same stream.
    workspace = cupy.cuda.alloc(workspace_size) if workspace_size else None

    cuda.forward(op, info["version"], address(q), address(k), address(v), address(g), address(beta),
                 address(initial_state), address(o), address(final_state),
                 workspace.ptr if workspace is not None else 0, workspace_size,
                 N, T, H, K, V, float(scale), 1 if bf16.is_bf16(q.dtype) else 0, cupy.cuda.get_current_stream().ptr,
                 **layout)


def _launch(op: str, q, k, v, g, beta, initial_state, scale, version, cu_seqlens=None):
    """(o, final state) of `op` over checked arrays: q and k [B, T, H, K], v [B, T, HV, V] (HV a multiple of H).
    cu_seqlens: the checked offsets (a tuple), or None.

    A version that reads grouped heads and packed sequences in the kernel (`packed` in `versions`; the module
    docstring names them) runs in one launch, the offsets copied to the device as int32 (up to
    MAX_PACKED_SEQUENCES sequences). For the others, and beyond that, q and k are repeated to HV heads
    (`heads.expand`, a copy of each) and, with cu_seqlens, each sequence is launched on its own slice of the arrays
    (B = 1, so each slice along T is contiguous): N launches, one after the other."""
    cupy = cupy_module()
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    info = runnable_version(op, version, bf16.is_bf16(q.dtype), K, V)
    o = cupy.empty(v.shape, v.dtype)
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    final_state = cupy.empty((N, HV, K, V), cupy.float32)
    if info.get("packed") and N <= MAX_PACKED_SEQUENCES:
        offsets = None if cu_seqlens is None else cupy.asarray(np.asarray(cu_seqlens, dtype=np.int32))
        _launch_one(op, info, q, k, v, g, beta, initial_state, scale, o, final_state, offsets)
        return o, final_state
    q, k = heads.expand(q, HV // H), heads.expand(k, HV // H)
    if cu_seqlens is None:
        _launch_one(op, info, q, k, v, g, beta, initial_state, scale, o, final_state)
        return o, final_state
    for n, (start, end) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        tokens = slice(start, end)
        _launch_one(op, info, q[:, tokens], k[:, tokens], v[:, tokens], None if g is None else g[:, tokens],
                    None if beta is None else beta[:, tokens],
                    None if initial_state is None else initial_state[n:n + 1], scale, o[:, tokens],
                    final_state[n:n + 1])
    return o, final_state


def _check_common(q, k, v, initial_state, cu_seqlens=None):
    """q, k [B, T, H, K], v [B, T, HV, V] (HV a multiple of H), initial_state [B, HV, K, V] ([N, HV, K, V] with
    cu_seqlens). Returns (shapes, the offsets as a tuple or None)."""
    shapes = Shapes()
    q = check_input("q", q, "B T H K", shapes, float32_only=False)
    check_input("k", k, "B T H K", shapes, float32_only=False, like=q)
    check_input("v", v, "B T HV V", shapes, float32_only=False, like=q)
    check_nonempty(shapes, (("q", "B T H K"), ("v", "B T HV V")))  # before H divides HV and K ** -0.5
    if shapes["HV"] % shapes["H"]:
        raise ValueError(f"v: expected a number of heads HV that is a multiple of q's and k's H = {shapes['H']} "
                         f"(grouped value heads), got HV = {shapes['HV']}")
    offsets = None
    if cu_seqlens is not None:
        offsets = varlen.check_cu_seqlens(cu_seqlens, shapes["B"], shapes["T"])
        shapes.sizes["N"] = len(offsets) - 1
    if initial_state is not None:
        check_input("initial_state", initial_state, "N HV K V" if offsets else "B HV K V", shapes,
                    float32_only=True)
    return shapes, offsets


def _gated_linear(op: str, g_dims: str, q, k, v, g, scale, initial_state, cu_seqlens, version, check_values,
                  g_optional=False):
    """gated_linear and channel_gated_linear: the checks, then the launch of `op` with g [g_dims]. g_optional: None
    is no decay (gated_linear itself, linear attention); a mixer whose decay is an input (simple GLA) requires g,
    since None would run linear attention instead."""
    shapes, offsets = _check_common(q, k, v, initial_state, cu_seqlens)
    if g is not None or not g_optional:
        check_input("g", g, g_dims, shapes, float32_only=True)
    if check_values:
        check_all_finite(("q", q), ("k", k), ("v", v), ("g", g), ("initial_state", initial_state))
        if g is not None:
            check_log_gate("g", g)
    scale = check_scale(scale, shapes["K"])
    return _launch(op, q, k, v, g, None, initial_state, scale, version, offsets)


def gated_linear(q, k, v, g=None, *, scale=None, initial_state=None, cu_seqlens=None, version=None,
                 check_values=True):
    """Scalar-gated linear attention on the GPU. Returns (o [B, T, HV, V], final state [B, HV, K, V] float32;
    [N, HV, K, V] with cu_seqlens).

    g: None (no decay) or [B, T, HV] float32 log-decays <= 0. scale: default K ** -0.5.
    version: None (`default_version`: the last rung for the dtype, K and V and this GPU) or 1, 2, 3, ...
    (`versions('linear')`).
    check_values: check q, k, v, g and initial_state finite and g <= 0 (two device-to-host syncs); False skips it,
    for timing.
    """
    return _gated_linear("linear", "B T HV", q, k, v, g, scale, initial_state, cu_seqlens, version, check_values,
                         g_optional=True)


def _delta_rule(op: str, g_dims: str, q, k, v, g, beta, scale, initial_state, cu_seqlens, allow_neg_eigval,
                normalize_qk, version, check_values, g_optional=False):
    """delta_rule and channel_delta_rule: the checks, the normalize_qk pre-pass, then the launch of `op` with
    g [g_dims]. g_optional: None is no decay (delta_rule itself, DeltaNet); Gated DeltaNet requires g."""
    shapes, offsets = _check_common(q, k, v, initial_state, cu_seqlens)
    if g is not None or not g_optional:
        check_input("g", g, g_dims, shapes, float32_only=True)
    check_input("beta", beta, "B T HV", shapes, float32_only=True)
    allow_neg_eigval = check_flag("allow_neg_eigval", allow_neg_eigval)
    if check_flag("normalize_qk", normalize_qk):
        q, k = l2_normalized(q), l2_normalized(k)
    if check_values:
        check_all_finite(("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state))
        if g is not None:
            check_log_gate("g", g)
        check_beta(beta, allow_neg_eigval)
        if not normalize_qk:  # normalized keys have |k|^2 < 1: beta's own range is the bound
            check_key_strength(k, beta, allow_neg_eigval, group=shapes["HV"] // shapes["H"])
    scale = check_scale(scale, shapes["K"])
    return _launch(op, q, k, v, g, beta, initial_state, scale, version, offsets)


def delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, allow_neg_eigval=False,
               normalize_qk=False, version=None, check_values=True):
    """The (gated) delta rule on the GPU. Returns (o [B, T, HV, V], final state [B, HV, K, V] float32; [N, HV, K, V]
    with cu_seqlens).

    g: None (DeltaNet) or [B, T, HV] float32 log-decays <= 0 (Gated DeltaNet). beta: [B, T, HV] float32 in [0, 1]
    ([0, 2] with allow_neg_eigval). Keys should be L2-normalized: normalize_qk=True divides q and k by
    sqrt(|x|^2 + 1e-6) first (`activations.l2_normalize`, FLA's use_qk_l2norm_in_kernel), in a CuPy pre-pass
    (float32, bfloat16 inputs rounded to bfloat16 again: one more read and write of q and k). version: see
    `versions('delta')`.
    check_values: check q, k, v, g, beta and initial_state finite, g <= 0, beta's range and beta |k|^2 <= 1 (<= 2
    with allow_neg_eigval; `check_key_strength`) with device-to-host syncs; False skips them, for timing.
    """
    return _delta_rule("delta", "B T HV", q, k, v, g, beta, scale, initial_state, cu_seqlens, allow_neg_eigval,
                       normalize_qk, version, check_values, g_optional=True)


def channel_gated_linear(q, k, v, g, *, scale=None, initial_state=None, cu_seqlens=None, version=None,
                         check_values=True):
    """Linear attention with a decay per key channel (GLA) on the GPU: S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,
    o_t = scale S_t^T q_t. Returns (o [B, T, HV, V], final state [B, HV, K, V] float32; [N, HV, K, V] with
    cu_seqlens).

    g: [B, T, HV, K] float32 log-decays <= 0, one per key channel. scale: default K ** -0.5.
    version: None (`default_version`) or 1, 2, ... (`versions('gla')`).
    check_values: check q, k, v, g and initial_state finite and g <= 0 (two device-to-host syncs); False skips it,
    for timing.
    """
    return _gated_linear("gla", "B T HV K", q, k, v, g, scale, initial_state, cu_seqlens, version, check_values)


def channel_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, normalize_qk=False,
                       version=None, check_values=True):
    """The delta rule with a decay per key channel (Kimi Delta Attention) on the GPU: S' = diag(exp(g_t)) S_{t-1},
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T, o_t = scale S_t^T q_t. Returns (o [B, T, HV, V], final state
    [B, HV, K, V] float32; [N, HV, K, V] with cu_seqlens).

    g: [B, T, HV, K] float32 log-decays <= 0; beta: [B, T, HV] float32 in [0, 1]. normalize_qk: as `delta_rule`
    (a CuPy pre-pass dividing q and k by sqrt(|x|^2 + 1e-6)). version: see `versions('kda')`.
    check_values: check the inputs finite, g <= 0, beta in [0, 1] and beta |k|^2 <= 1 (`check_key_strength`) with
    device-to-host syncs; False skips them, for timing.
    """
    return _delta_rule("kda", "B T HV K", q, k, v, g, beta, scale, initial_state, cu_seqlens, False, normalize_qk,
                       version, check_values)
