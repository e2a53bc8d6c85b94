"""The mixers on the GPU: thin wrappers mapping each paper's parameters onto the two engines of `front`.

Same signatures as the NumPy reference (minilin/mixers/<name>.py, CONVENTIONS.md), plus `version=` (which
kernel: None picks `default_version`, the last rung that takes the dtype and runs on this GPU) and
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
"""
from __future__ import annotations

import numpy as np

from ..mixers.lightning import default_slope
from ..mixers.retnet import default_gamma
from ..validation import Shapes, check_max, check_min
from . import bf16
from .front import check_finite, check_input, cupy_module, delta_rule, gated_linear


def linear_attention(q, k, v, *, scale=None, initial_state=None, version=None, check_values=True):
    """Linear attention (identity feature map: apply phi to q and k first). o_t = scale S_t^T q_t."""
    return gated_linear(q, k, v, None, scale=scale, initial_state=initial_state, version=version,
                        check_values=check_values)


def simple_gla(q, k, v, g, *, scale=None, initial_state=None, version=None, check_values=True):
    """Scalar-gated linear attention: g [B, T, H] float32, log-space decays <= 0."""
    return gated_linear(q, k, v, g, scale=scale, initial_state=initial_state, version=version,
                        check_values=check_values)


def _per_head_gate(name, values, q, H: int, check_values: bool, transform):
    """A per-head parameter [H] (CuPy float32) turned into the log-gate g [B, T, H] float32 by `transform`."""
    cupy = cupy_module()
    check_input(name, values, "H", Shapes(H=H), float32_only=True)
    if check_values:
        check_finite(name, values)
    return cupy.ascontiguousarray(cupy.broadcast_to(transform(values), q.shape[:3]), dtype=cupy.float32)


def retnet(q, k, v, *, gamma=None, scale=None, initial_state=None, version=None, check_values=True):
    """RetNet's retention: a fixed decay gamma_h per head (gamma [H] float32 in (0, 1]), g = log gamma."""
    cupy = cupy_module()
    check_input("q", q, "B T H K", Shapes(), float32_only=False)
    H = q.shape[2]
    if gamma is None:
        gamma = cupy.asarray(default_gamma(H), dtype=cupy.float32)
    elif check_values and isinstance(gamma, cupy.ndarray) and gamma.dtype == np.float32:
        check_min("gamma", gamma, 0.0, "decays gamma in (0, 1]", strict=True)
        check_max("gamma", gamma, 1.0, "decays gamma in (0, 1]")
    g = _per_head_gate("gamma", gamma, q, H, check_values, cupy.log)
    return gated_linear(q, k, v, g, scale=scale, initial_state=initial_state, version=version, check_values=False)


def lightning(q, k, v, *, slope=None, scale=None, initial_state=None, version=None, check_values=True):
    """Lightning Attention: a fixed decay exp(-s_h) per head (slope [H] float32 >= 0), g = -slope."""
    cupy = cupy_module()
    check_input("q", q, "B T H K", Shapes(), float32_only=False)
    H = q.shape[2]
    if slope is None:
        slope = cupy.asarray(default_slope(H), dtype=cupy.float32)
    elif check_values and isinstance(slope, cupy.ndarray) and slope.dtype == np.float32:
        check_min("slope", slope, 0.0, "slopes s >= 0 (the decay is exp(-s))")
    g = _per_head_gate("slope", slope, q, H, check_values, lambda s: -s)
    return gated_linear(q, k, v, g, scale=scale, initial_state=initial_state, version=version, check_values=False)


def _as_float32(x):
    """float32 view of a float32 or bfloat16 (native or bits) array, for the mapping's elementwise work."""
    return bf16.from_bf16(x) if bf16.is_bf16(x.dtype) else x


def _like(x32, template):
    """float32 values back in `template`'s dtype (float32, native bfloat16 or uint16 bits)."""
    if template.dtype == np.float32:
        return x32
    return bf16.to_bf16(x32, bits=template.dtype == bf16.BITS)


def mamba2(x, dt, A, B, C, D=None, *, initial_state=None, version=None, check_values=True):
    """Mamba-2's SSD layer. x [B, T, H, P]; dt [B, T, H] float32 >= 0; A [H] float32 <= 0; B, C [B, T, H, N]
    in x's dtype; D [H] float32 or None. Returns (y [B, T, H, P] in x's dtype, state [B, H, N, P] float32).

    The scalar-gate recurrence under q = C, k = B, v = dt * x, g = dt * A, scale = 1 (CONVENTIONS.md). The
    mapping costs two elementwise passes on CuPy (v = dt x, and y = o + D x); for bf16 inputs v is rounded to
    bf16 once more, which the 1e-2 tolerance of bf16 covers.
    """
    cupy = cupy_module()
    shapes = Shapes()
    check_input("x", x, "B T H P", shapes, float32_only=False)
    check_input("dt", dt, "B T H", shapes, float32_only=True)
    check_input("A", A, "H", shapes, float32_only=True)
    check_input("B", B, "B T H N", shapes, float32_only=False, like=x)
    check_input("C", C, "B T H N", shapes, float32_only=False, like=x)
    if D is not None:
        check_input("D", D, "H", shapes, float32_only=True)
    if initial_state is not None:
        check_input("initial_state", initial_state, "B H N P", shapes, float32_only=True)
    if check_values:
        for name, arr in (("dt", dt), ("A", A)):
            check_finite(name, arr)
        check_min("dt", dt, 0.0, "step sizes dt >= 0")
        check_max("A", A, 0.0, "A <= 0 (so the decay exp(dt A) is at most 1)")
    x32 = _as_float32(x)
    v = _like(dt[..., None] * x32, x)
    g = cupy.ascontiguousarray(dt * A)
    y, state = gated_linear(C, B, v, g, scale=1.0, initial_state=initial_state, version=version, check_values=False)
    if D is not None:
        y = _like(_as_float32(y) + D[:, None] * x32, x)
    return y, state


def deltanet(q, k, v, beta, *, scale=None, initial_state=None, allow_neg_eigval=False, version=None,
             check_values=True):
    """DeltaNet: the delta rule without decay. beta [B, T, H] float32 in [0, 1] (or [0, 2])."""
    return delta_rule(q, k, v, beta, None, scale=scale, initial_state=initial_state,
                      allow_neg_eigval=allow_neg_eigval, version=version, check_values=check_values)


def gated_deltanet(q, k, v, g, beta, *, scale=None, initial_state=None, allow_neg_eigval=False, version=None,
                   check_values=True):
    """Gated DeltaNet: decay exp(g_t) first, then the delta rule. g, beta [B, T, H] float32."""
    return delta_rule(q, k, v, beta, g, scale=scale, initial_state=initial_state,
                      allow_neg_eigval=allow_neg_eigval, version=version, check_values=check_values)
