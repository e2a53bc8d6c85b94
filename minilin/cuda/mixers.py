"""The mixers on the GPU: thin wrappers mapping each paper's parameters onto the four engines of `front`.

Same signatures as the NumPy reference (minilin/mixers/<name>.py, CONVENTIONS.md), grouped value heads and
`cu_seqlens` included where the reference takes them (linear attention, simple GLA, GLA, DeltaNet, Gated
DeltaNet, KDA: front.py says how), plus `version=` (which kernel: None picks
`default_version`, the last rung that takes the dtype and the shape (`front.takes_shape`: K, V) and runs on this
GPU and is not a rung measured slower than one below it, `front.SLOWER_RUNGS`) and
`check_values=` (value checks that cost a device sync; False for timing). All return (o, final_state) as
CuPy arrays, the state float32.

    scalar-gated linear family -> front.gated_linear:
        linear_attention   g = none
        simple_gla         g as given
        retnet             g = log gamma_h        (RetNet's default gammas when gamma is None)
        lightning          g = -slope_h           (ALiBi / MiniMax-01 slopes when slope is None)
        mamba2             q = C, k = B, v = dt * x, g = dt * A, scale = 1, then y = o + D x
    delta family -> front.delta_rule:
        deltanet           g = none
        gated_deltanet     g as given
    a decay per key channel -> front.channel_gated_linear, front.channel_delta_rule:
        gla                g [B, T, H, K] as given
        hgrn2              k = 1 - exp(g), the input gate tied to the forget gate (minilin.mixers.hgrn2)
        kda                g [B, T, H, K] as given, with the delta rule
RWKV-6 does not fit these kernels: its output reads the state before the token's decay and write, S_{t-1}, plus a
bonus term, where the kernels read S_t; mapping it would take shifted copies of k, v and w and a pass for the
bonus, so it runs in NumPy (on CuPy arrays too) only.
"""
from __future__ import annotations

import functools

import numpy as np

from ..mixers.lightning import default_slope
from ..mixers.retnet import default_gamma
from ..validation import Shapes, check_max, check_min
from . import bf16
from .front import (_delta_rule, _gated_linear, channel_delta_rule, channel_gated_linear, check_all_finite,
                    check_finite, check_input, cupy_module, delta_rule, gated_linear)


def linear_attention(q, k, v, *, scale=None, initial_state=None, cu_seqlens=None, version=None, check_values=True):
    """Linear attention (identity feature map: apply phi to q and k first). o_t = scale S_t^T q_t."""
    return gated_linear(q, k, v, None, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                        version=version, check_values=check_values)


def simple_gla(q, k, v, g, *, scale=None, initial_state=None, cu_seqlens=None, version=None, check_values=True):
    """Scalar-gated linear attention: g [B, T, HV] float32, log-space decays <= 0 (required: None is no decay)."""
    return _gated_linear("linear", "B T HV", q, k, v, g, scale, initial_state, cu_seqlens, version, check_values)


def gla(q, k, v, g, *, scale=None, initial_state=None, cu_seqlens=None, version=None, check_values=True):
    """Gated Linear Attention: g [B, T, HV, K] float32, log-space decays <= 0, one per key channel."""
    return channel_gated_linear(q, k, v, g, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                                version=version, check_values=check_values)


def hgrn2_key(q, g, per_token: str):
    """HGRN2's key k = 1 - exp(g) = -expm1(g) [per_token K] in q's dtype (bf16 rounds it once), from the log forget
    gate g [per_token K] float32; q and g checked first, so that a bad g is named as g, not as the key it makes.
    expm1 keeps the key exact where the gate is close to 1 (g near 0)."""
    cupy = cupy_module()
    shapes = Shapes()
    check_input("q", q, f"{per_token} K", shapes, float32_only=False)
    check_input("g", g, f"{per_token} K", shapes, float32_only=True)
    return bf16.like(cupy.negative(cupy.expm1(g)), q)


def hgrn2(q, v, g, *, scale=None, initial_state=None, version=None, check_values=True):
    """HGRN2: GLA with the input gate tied to the forget gate, k = 1 - exp(g) (minilin.mixers.hgrn2). q [B, T, H, K],
    v [B, T, H, V], g [B, T, H, K] float32 log forget gates <= 0; the key is one elementwise pass on CuPy, then the
    GLA kernels (`versions('gla')`). Returns (o [B, T, H, V], final state [B, H, K, V] float32)."""
    return channel_gated_linear(q, hgrn2_key(q, g, "B T H"), v, g, scale=scale, initial_state=initial_state,
                                version=version, check_values=check_values)


def _per_head_gate(name, values, shape, H: int, check_values: bool, transform):
    """A per-head parameter [H] (CuPy float32) turned into the log-gate g of `shape` ([B, T, H], or [N, H] for a
    decode step) float32 by `transform`."""
    cupy = cupy_module()
    check_input(name, values, "H", Shapes(H=H), float32_only=True)
    if check_values:
        check_finite(name, values)
    return cupy.ascontiguousarray(cupy.broadcast_to(transform(values), shape), dtype=cupy.float32)


@functools.lru_cache(maxsize=None)
def _default_per_head(name: str, H: int, device: int):
    """RetNet's default gammas or Lightning's default slopes [H] as a CuPy float32 array, made once per device (a
    decode step would otherwise copy them from the host at every call)."""
    cupy = cupy_module()
    values = default_gamma(H) if name == "gamma" else default_slope(H)
    with cupy.cuda.Device(device):
        return cupy.asarray(values, dtype=cupy.float32)


def retnet_log_gate(gamma, shape, H: int, check_values: bool):
    """RetNet's g = log gamma_h [H] (RetNet's default gammas when gamma is None), broadcast to `shape`."""
    cupy = cupy_module()
    if gamma is None:
        gamma = _default_per_head("gamma", H, cupy.cuda.Device().id)
    elif check_values and isinstance(gamma, cupy.ndarray) and gamma.dtype == np.float32:
        check_min("gamma", gamma, 0.0, "decays gamma in (0, 1]", strict=True)
        check_max("gamma", gamma, 1.0, "decays gamma in (0, 1]")
    return _per_head_gate("gamma", gamma, shape, H, check_values, cupy.log)


def lightning_log_gate(slope, shape, H: int, check_values: bool):
    """Lightning's g = -s_h [H] (ALiBi / MiniMax-01 slopes when slope is None), broadcast to `shape`."""
    cupy = cupy_module()
    if slope is None:
        slope = _default_per_head("slope", H, cupy.cuda.Device().id)
    elif check_values and isinstance(slope, cupy.ndarray) and slope.dtype == np.float32:
        check_min("slope", slope, 0.0, "slopes s >= 0 (the decay is exp(-s))")
    return _per_head_gate("slope", slope, shape, H, check_values, lambda s: -s)


def per_head_shapes(q, v) -> None:
    """RetNet's and Lightning's q [B, T, H, K] and v [B, T, H, V], checked before their gate [B, T, H] is built
    from q's heads: one decay per head, and no grouped value heads (the NumPy forms take none either)."""
    shapes = Shapes()
    check_input("q", q, "B T H K", shapes, float32_only=False)
    check_input("v", v, "B T H V", shapes, float32_only=False)


def retnet(q, k, v, *, gamma=None, scale=None, initial_state=None, version=None, check_values=True):
    """RetNet's retention: a fixed decay gamma_h per head (gamma [H] float32 in (0, 1]), g = log gamma."""
    per_head_shapes(q, v)
    g = retnet_log_gate(gamma, q.shape[:3], q.shape[2], check_values)
    return gated_linear(q, k, v, g, scale=scale, initial_state=initial_state, version=version, check_values=False)


def lightning(q, k, v, *, slope=None, scale=None, initial_state=None, version=None, check_values=True):
    """Lightning Attention: a fixed decay exp(-s_h) per head (slope [H] float32 >= 0), g = -slope."""
    per_head_shapes(q, v)
    g = lightning_log_gate(slope, q.shape[:3], q.shape[2], check_values)
    return gated_linear(q, k, v, g, scale=scale, initial_state=initial_state, version=version, check_values=False)


def mamba2_check(x, dt, A, B, C, D, shapes: Shapes, per_token: str, device=None) -> None:
    """Mamba-2's arrays: x [per_token, P], dt [per_token], A [H], B, C [per_token, N], D [H] or None (per_token is
    "B T H" for a sequence, "B H" for a decode step)."""
    check_input("x", x, f"{per_token} P", shapes, float32_only=False, device=device)
    check_input("dt", dt, per_token, shapes, float32_only=True, device=device)
    check_input("A", A, "H", shapes, float32_only=True, device=device)
    check_input("B", B, f"{per_token} N", shapes, float32_only=False, like=x, like_name="x", device=device)
    check_input("C", C, f"{per_token} N", shapes, float32_only=False, like=x, like_name="x", device=device)
    if D is not None:
        check_input("D", D, "H", shapes, float32_only=True, device=device)


def mamba2_check_values(dt, A, *named) -> None:
    """dt >= 0 and A <= 0, and they and the (name, array) pairs `named` (x, B, C, D, states) finite, each named in
    Mamba-2's terms (device-to-host syncs)."""
    check_all_finite(("dt", dt), ("A", A), *named)
    check_min("dt", dt, 0.0, "step sizes dt >= 0")
    check_max("A", A, 0.0, "A <= 0 (so the decay exp(dt A) is at most 1)")


def mamba2_mapping(x, dt, A):
    """(v = dt x in x's dtype, g = dt A float32, x as float32): the scalar-gate recurrence's inputs. Two elementwise
    passes on CuPy; bf16 v is rounded to bf16 once more, which the 1e-2 tolerance of bf16 covers."""
    cupy = cupy_module()
    x32 = bf16.as_float32(x)
    return bf16.like(dt[..., None] * x32, x), cupy.ascontiguousarray(dt * A), x32


def mamba2_skip(y, x32, D, x):
    """y + D x (D per head, [H]) in x's dtype; y itself when D is None."""
    return y if D is None else bf16.like(bf16.as_float32(y) + D[:, None] * x32, x)


def mamba2(x, dt, A, B, C, D=None, *, initial_state=None, version=None, check_values=True):
    """Mamba-2's SSD layer. x [B, T, H, P]; dt [B, T, H] float32 >= 0; A [H] float32 <= 0; B, C [B, T, H, N]
    in x's dtype; D [H] float32 or None. Returns (y [B, T, H, P] in x's dtype, state [B, H, N, P] float32).

    The scalar-gate recurrence under q = C, k = B, v = dt * x, g = dt * A, scale = 1 (CONVENTIONS.md). The
    mapping costs two elementwise passes on CuPy (v = dt x, and y = o + D x); for bf16 inputs v is rounded to
    bf16 once more, which the 1e-2 tolerance of bf16 covers.
    """
    shapes = Shapes()
    mamba2_check(x, dt, A, B, C, D, shapes, "B T H")
    if initial_state is not None:
        check_input("initial_state", initial_state, "B H N P", shapes, float32_only=True)
    if check_values:
        mamba2_check_values(dt, A, ("x", x), ("B", B), ("C", C), ("D", D), ("initial_state", initial_state))
    v, g, x32 = mamba2_mapping(x, dt, A)
    y, state = gated_linear(C, B, v, g, scale=1.0, initial_state=initial_state, version=version, check_values=False)
    return mamba2_skip(y, x32, D, x), state


def deltanet(q, k, v, beta, *, scale=None, initial_state=None, cu_seqlens=None, allow_neg_eigval=False,
             normalize_qk=False, version=None, check_values=True):
    """DeltaNet: the delta rule without decay. beta [B, T, HV] float32 in [0, 1] (or [0, 2]).
    normalize_qk: L2-normalize q and k first (front.delta_rule)."""
    return delta_rule(q, k, v, None, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                      allow_neg_eigval=allow_neg_eigval, normalize_qk=normalize_qk, version=version,
                      check_values=check_values)


def gated_deltanet(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, allow_neg_eigval=False,
                   normalize_qk=False, version=None, check_values=True):
    """Gated DeltaNet: decay exp(g_t) first, then the delta rule. g, beta [B, T, HV] float32.
    normalize_qk: L2-normalize q and k first (front.delta_rule). g is required (None is no decay: DeltaNet)."""
    return _delta_rule("delta", "B T HV", q, k, v, g, beta, scale, initial_state, cu_seqlens, allow_neg_eigval,
                       normalize_qk, version, check_values)


def kda(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, normalize_qk=False, version=None,
        check_values=True):
    """Kimi Delta Attention: decay diag(exp(g_t)) first, then the delta rule. g [B, T, HV, K], beta [B, T, HV]
    float32, beta in [0, 1] (as minilin.mixers.kda). normalize_qk: L2-normalize q and k first (front.delta_rule)."""
    return channel_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                              normalize_qk=normalize_qk, version=version, check_values=check_values)
