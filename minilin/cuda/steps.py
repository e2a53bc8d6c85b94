"""The mixers' one-token decode steps on the GPU: `<mixer>_step`, the NumPy `step` forms on the decode kernel.

Each takes one token of N sequences in the layouts of minilin/mixers/<name>.py's `step` (the T axis dropped) and
the state as a keyword, and returns (o_t, new states); the options are those of `decode` (minilin/cuda/decode.py):
`state` [N, H, K, V] or a pool [P, H, K, V] with `state_indices` [N] (int32 / int64), `in_place=True` (the new
states written over the old rows, `state` returned) or False (a new [N, H, K, V] array), `out=` for o, `version=`,
`check_values=`. The mappings onto the two step engines are the forward's (minilin/cuda/mixers.py):

    gated_linear_step:  linear_attention (no g), simple_gla (g [N, H]), gla (g [N, H, K]), retnet (g = log gamma),
                        lightning (g = -slope), mamba2 (q = C, k = B, v = dt x, g = dt A, scale = 1, y += D x),
                        hgrn2 (gla's step with k = 1 - exp(g))
    delta_rule_step:    deltanet (no g), gated_deltanet (g [N, H]), kda (g [N, H, K])

retnet, lightning, mamba2 and hgrn2 build their g (Mamba-2 its v and y, HGRN2 its k) with CuPy elementwise passes
around the kernel, as their forward wrappers do; the others launch the kernel alone.
"""
from __future__ import annotations

from ..validation import Shapes, check_flag
from .decode import _launch, _step, check_index_values, check_indices
from .front import check_input, cupy_module
from .mixers import (hgrn2_key, lightning_log_gate, mamba2_check, mamba2_check_values, mamba2_mapping, mamba2_skip,
                     retnet_log_gate)


def _common(state, state_indices, in_place, out, version, check_values):
    return dict(state=state, state_indices=state_indices, in_place=in_place, out=out, version=version,
                check_values=check_values)


def linear_attention_step(q, k, v, *, state=None, scale=None, state_indices=None, in_place=True, out=None,
                          version=None, check_values=True):
    """Linear attention (identity feature map), one token: S_t = S_{t-1} + k v^T, o = scale S_t^T q.
    q, k [N, H, K]; v [N, H, V]."""
    return _step(False, q, k, v, None, None, None, scale=scale, allow_neg_eigval=False, normalize_qk=False,
                 **_common(state, state_indices, in_place, out, version, check_values))


def simple_gla_step(q, k, v, g, *, state=None, scale=None, state_indices=None, in_place=True, out=None,
                    version=None, check_values=True):
    """Simple GLA, one token: S_t = exp(g) S_{t-1} + k v^T. g [N, H] float32 log-decays <= 0."""
    return _step(False, q, k, v, g, "scalar", None, scale=scale, allow_neg_eigval=False, normalize_qk=False,
                 **_common(state, state_indices, in_place, out, version, check_values))


def gla_step(q, k, v, g, *, state=None, scale=None, state_indices=None, in_place=True, out=None, version=None,
             check_values=True):
    """GLA, one token: S_t = diag(exp(g)) S_{t-1} + k v^T. g [N, H, K] float32 log-decays <= 0."""
    return _step(False, q, k, v, g, "channel", None, scale=scale, allow_neg_eigval=False, normalize_qk=False,
                 **_common(state, state_indices, in_place, out, version, check_values))


def hgrn2_step(q, v, g, *, state=None, scale=None, state_indices=None, in_place=True, out=None, version=None,
               check_values=True):
    """HGRN2, one token: GLA's step with the key k = 1 - exp(g) (mixers.hgrn2_key). q, g [N, H, K], v [N, H, V]."""
    return gla_step(q, hgrn2_key(q, g, "N H"), v, g, state=state, scale=scale, state_indices=state_indices,
                    in_place=in_place, out=out, version=version, check_values=check_values)


def retnet_step(q, k, v, *, state=None, gamma=None, scale=None, state_indices=None, in_place=True, out=None,
                version=None, check_values=True):
    """RetNet, one token: g = log gamma_h (gamma [H] float32 in (0, 1], RetNet's defaults when None)."""
    check_input("q", q, "N H K", Shapes(), float32_only=False)
    g = retnet_log_gate(gamma, q.shape[:2], q.shape[1], check_values)
    return _step(False, q, k, v, g, "scalar", None, scale=scale, allow_neg_eigval=False, normalize_qk=False,
                 **_common(state, state_indices, in_place, out, version, check_values))


def lightning_step(q, k, v, *, state=None, slope=None, scale=None, state_indices=None, in_place=True, out=None,
                   version=None, check_values=True):
    """Lightning Attention, one token: g = -s_h (slope [H] float32 >= 0, ALiBi's slopes when None)."""
    check_input("q", q, "N H K", Shapes(), float32_only=False)
    g = lightning_log_gate(slope, q.shape[:2], q.shape[1], check_values)
    return _step(False, q, k, v, g, "scalar", None, scale=scale, allow_neg_eigval=False, normalize_qk=False,
                 **_common(state, state_indices, in_place, out, version, check_values))


def mamba2_step(x, dt, A, B, C, D=None, *, state=None, state_indices=None, in_place=True, out=None, version=None,
                check_values=True):
    """Mamba-2, one token for each of B sequences: x [B, H, P]; dt [B, H] float32 >= 0; A [H] float32 <= 0;
    B, C [B, H, N] in x's dtype; D [H] or None; state [B, H, N, P] float32, or a pool [S, H, N, P] with
    state_indices [B]. Returns (y [B, H, P] in x's dtype, new states).

    The scalar-gate step under q = C, k = B, v = dt x, g = dt A, scale = 1, then y = o + D x: two elementwise
    passes before the kernel and one after it when D is given (mixers.mamba2_mapping, mamba2_skip).
    """
    cupy = cupy_module() if type(x).__module__.split(".")[0] == "cupy" else None
    device = cupy.cuda.Device().id if cupy is not None else 0
    shapes = Shapes()
    mamba2_check(x, dt, A, B, C, D, shapes, "B H", device=device)
    if state_indices is not None:
        check_indices("state_indices", state_indices, shapes, device, dims="B")
        if state is None:
            raise TypeError("state: expected the pool [S, H, N, P] that state_indices index, got None")
        check_input("state", state, "S H N P", shapes, float32_only=True, device=device)
    elif state is not None:
        check_input("state", state, "B H N P", shapes, float32_only=True, device=device)
    if out is not None:
        check_input("out", out, "B H P", shapes, float32_only=False, like=x, like_name="x", device=device)
    in_place = check_flag("in_place", in_place)
    if check_values:
        if state_indices is not None:
            check_index_values(state_indices, shapes["S"], distinct=in_place, pool_dims="S H N P")
        rows = state if state is None or state_indices is None else state[state_indices]  # the pool's rows in use
        mamba2_check_values(dt, A, ("x", x), ("B", B), ("C", C), ("D", D), ("state", rows))
    v, g, x32 = mamba2_mapping(x, dt, A)
    engine_shapes = Shapes(N=shapes["B"], H=shapes["H"], K=shapes["N"], V=shapes["P"])
    y, new_state = _launch(False, C, B, v, g, "scalar", None, state, state_indices, in_place,
                           out if D is None else None, 1.0, False, version, engine_shapes)
    if D is None:
        return y, new_state
    y = mamba2_skip(y, x32, D, x)
    if out is None:
        return y, new_state
    out[...] = y
    return out, new_state


def deltanet_step(q, k, v, beta, *, state=None, scale=None, state_indices=None, in_place=True, out=None,
                  allow_neg_eigval=False, normalize_qk=False, version=None, check_values=True):
    """DeltaNet, one token: S_t = S_{t-1} + beta k (v - S_{t-1}^T k)^T. beta [N, H] float32 in [0, 1] ([0, 2]
    with allow_neg_eigval); normalize_qk: L2-normalize q and k inside the kernel."""
    return _step(True, q, k, v, None, None, beta, scale=scale, allow_neg_eigval=allow_neg_eigval,
                 normalize_qk=normalize_qk, **_common(state, state_indices, in_place, out, version, check_values))


def gated_deltanet_step(q, k, v, g, beta, *, state=None, scale=None, state_indices=None, in_place=True, out=None,
                        allow_neg_eigval=False, normalize_qk=False, version=None, check_values=True):
    """Gated DeltaNet, one token: S' = exp(g) S_{t-1}, S_t = S' + beta k (v - S'^T k)^T. g, beta [N, H] float32."""
    return _step(True, q, k, v, g, "scalar", beta, scale=scale, allow_neg_eigval=allow_neg_eigval,
                 normalize_qk=normalize_qk, **_common(state, state_indices, in_place, out, version, check_values))


def kda_step(q, k, v, g, beta, *, state=None, scale=None, state_indices=None, in_place=True, out=None,
             normalize_qk=False, version=None, check_values=True):
    """Kimi Delta Attention, one token: S' = diag(exp(g)) S_{t-1}, then the delta rule. g [N, H, K], beta [N, H]
    float32, beta in [0, 1] (as minilin.mixers.kda)."""
    return _step(True, q, k, v, g, "channel", beta, scale=scale, allow_neg_eigval=False, normalize_qk=normalize_qk,
                 **_common(state, state_indices, in_place, out, version, check_values))
