"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Softmax attention computes (Q K^T) V and keeps every key: a KV cache that grows with T. Replacing
exp(q . k) by a kernel phi(q) . phi(k) lets the bracket move: (phi(Q) phi(K)^T) V = phi(Q) (phi(K)^T V),
and phi(K)^T V is a fixed-size state that a recurrence updates one token at a time:

    S_t = S_{t-1} + phi(k_t) v_t^T                     S: [F, V], F = feature dimension (K for elu+1)
    o_t = scale * S_t^T phi(q_t)
    normalize=True:  o_t = S_t^T phi(q_t) / (z_t . phi(q_t)),   z_t = sum_{i <= t} phi(k_i)   (scale cancels)

Paper symbols: phi = feature map, S_t = sum_i phi(K_i) V_i^T, Z_t = sum_i phi(K_i).

With normalize=True the normalizer z rides along as one extra value column of the state (the memory
of a constant value 1), so the state is [B, H, F, V + 1] and every form, chunked included, gets z for
free. The normalizer is a sum of products of features, so it needs a non-negative feature map (elu+1,
relu, favor+): with the identity map z_t . q_t changes sign and can be zero, and normalize=True raises
there. With non-negative features z_t . phi(q_t) is a sum of non-negative weights phi(q_t) . phi(k_i), so
it is 0 only when every weight is 0 (relu features that are all zero, or scale = 0), and then the
numerator is 0 too: that o_t is defined as 0 (an empty weighting reads nothing), not 0 / 0.

Shapes: q, k [B, T, H, K]; v [B, T, HV, V]; o [B, T, HV, V]; state [B, HV, F, V] (V + 1 when normalized).
HV = H is the plain layout; HV a multiple of H groups the value heads (`minilin.heads`: value head j reads
the features of q/k head j // (HV / H)). cu_seqlens [N + 1] with B = 1 packs N sequences along T
(`minilin.varlen`): the states are then [N, HV, F, V (+1)], and the result is each sequence run alone.
Forms: recurrent (the definition), chunked, parallel, step. Each returns (o, final_state).
Gradients: recurrent_backward, chunked_backward, parallel_backward: the engine's (`_gated_linear`, no
gate), back through the normalizer column and the feature map (each map's backward, `feature_maps`).
"""
from __future__ import annotations

import numpy as np

from .. import examples, feature_maps, heads, varlen
from ..backend import array_module
from ..signature import Signature, Tensor
from ..validation import Shapes, all_finite, check_array, check_chunk_size, check_flag, check_min, check_scale
from . import _gated_linear

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V")),
    output="B T H V", state=None, gpu="linear",
    grouped=("q", "k"))  # the state's dims depend on the feature map (`_state_dims`)

def _checked(q, k, v, feature_map, normalize, scale, state, step=False):
    """Checked inputs, as the engine takes them: phi(q) * scale, phi(k) (each q/k head repeated over its
    group of value heads, `heads.expand`), v (with a column of ones when normalized), the state
    [B, HV, F, V (+1)] (all in one working dtype), and the normalize flag."""
    return _checked_with_signature(q, k, v, feature_map, normalize, scale, state, step)[1:]


def _checked_with_signature(q, k, v, feature_map, normalize, scale, state, step=False, cu_seqlens=None):
    """`_checked`'s result behind the `SIGNATURE.check` object it came from (for the backward's checks and
    the packed sequences' offsets, `a.cu_seqlens`)."""
    name = "state" if step else "initial_state"
    a = SIGNATURE.check(q, k, v, step=step, cu_seqlens=cu_seqlens)
    scale = check_scale(scale, a.shapes["K"])
    normalize = check_flag("normalize", normalize)
    phi = feature_maps.resolve(feature_map)
    xp = a.xp
    q, k = _features(phi, a.q, "q", xp), _features(phi, a.k, "k", xp)
    q, k, v = heads.expand(q, a.group), heads.expand(k, a.group), a.v
    F = q.shape[-1]
    if normalize:
        what = "a non-negative feature map with normalize=True (elu+1, relu, favor+: the normalizer is a sum of"
        check_min("feature_map", q, 0.0, f"{what} products of features)")
        check_min("feature_map", k, 0.0, f"{what} products of features)")
        check_min("scale", xp.asarray(scale), 0.0, "scale >= 0 with normalize=True")
        v = xp.concatenate([v, xp.ones_like(v[..., :1])], axis=-1)
    dtype = a.dtype
    if state is not None:
        check_array(name, state, *_state_dims(a, F, v.shape[-1], normalize), xp)
        if normalize:  # its last column is z = sum_i phi(k_i), a sum of non-negative features
            check_min(name, state[..., -1], 0.0, "a normalizer column (the last, z = the sum of phi(k)) >= 0 with "
                      "normalize=True")
        dtype = xp.result_type(dtype, state.dtype)
        state = state.astype(dtype)
    q, k, v = q.astype(dtype, copy=False) * scale, k.astype(dtype, copy=False), v.astype(dtype, copy=False)
    return a, q, k, v, state, normalize


def _features(phi, x, name: str, xp):
    """phi(x) for q or k, checked: a user's map must keep every axis but the last ([..., K] -> [..., F], F >= 1) and
    return finite numbers (a map that overflows, exp of a large entry say, would otherwise come back as NaN
    outputs; the maps of `feature_maps.KEEP_FINITE` cannot, and skip that pass over the features). Errors name
    feature_map and the input it was applied to."""
    features = phi(x)
    shape = getattr(features, "shape", None)
    if shape is None or tuple(shape[:-1]) != tuple(x.shape[:-1]) or shape[-1] < 1:
        raise ValueError(f"feature_map: expected phi({name}) of shape [{', '.join(map(str, x.shape[:-1]))}, F] "
                         f"(F >= 1), got {list(shape) if shape is not None else type(features).__name__}")
    if phi not in feature_maps.KEEP_FINITE and not all_finite(features, xp):
        raise ValueError(f"feature_map: expected finite features, got NaN or inf in phi({name})")
    return features


def _state_dims(a, F, columns, normalize):
    """The state's dims and bound sizes: [B, HV, F, V (+1)], or [N, HV, F, V (+1)] with cu_seqlens (F is
    written K when the feature map keeps the width)."""
    feature, value = ("K" if F == a.shapes["K"] else "F"), ("V+1" if normalize else "V")
    first = "N" if a.cu_seqlens is not None else "B"
    dims = Shapes(**{first: a.shapes[first], "HV": a.shapes["HV"], feature: F, value: columns})
    return f"{first} HV {feature} {value}", dims


def _finish(o, S, normalize):
    """Split the normalizer column off the output and divide by it; a zero normalizer (every weight 0, so
    the numerator is 0 too) gives o_t = 0."""
    if not normalize:
        return o, S
    normalizer = o[..., -1:]
    return o[..., :-1] / array_module(o).where(normalizer == 0, 1, normalizer), S


def _engine_form(form, chunk_size=None):
    """The engine's form on (q', k', v', S0), without a gate; chunked with the chunk clamped per sequence."""
    if form == "chunked":
        return varlen.chunked(lambda q, k, v, S0, C: _gated_linear.chunked(q, k, v, None, S0, C), chunk_size)
    return lambda q, k, v, S0: getattr(_gated_linear, form)(q, k, v, None, S0)


def _forward(form, q, k, v, feature_map, normalize, scale, initial_state, cu_seqlens, chunk_size=None):
    a, q, k, v, S0, normalize = _checked_with_signature(q, k, v, feature_map, normalize, scale, initial_state,
                                                        cu_seqlens=cu_seqlens)
    C = check_chunk_size(chunk_size, a.shapes["T"]) if form == "chunked" else None
    return _finish(*varlen.forward(_engine_form(form, C), (q, k, v), S0, a.cu_seqlens), normalize)


def recurrent(q, k, v, *, feature_map=None, normalize=False, scale=None, initial_state=None, cu_seqlens=None):
    """Token loop (the definition). Returns (o [B, T, HV, V], final state; one per sequence with cu_seqlens,
    each sequence run alone: `varlen.forward`)."""
    return _forward("recurrent", q, k, v, feature_map, normalize, scale, initial_state, cu_seqlens)


def chunked(q, k, v, *, feature_map=None, normalize=False, scale=None, initial_state=None, cu_seqlens=None,
            chunk_size=64):
    """Chunked: causal (Q K^T) V inside each chunk, plus Q S_n from the prefix sum of chunk states
    (chunk_size clamped to T)."""
    return _forward("chunked", q, k, v, feature_map, normalize, scale, initial_state, cu_seqlens, chunk_size)


def parallel(q, k, v, *, feature_map=None, normalize=False, scale=None, initial_state=None, cu_seqlens=None):
    """Quadratic form: o = tril(phi(Q) phi(K)^T) V (+ phi(Q) S0), the left side of the bracket move."""
    return _forward("parallel", q, k, v, feature_map, normalize, scale, initial_state, cu_seqlens)


def step(q, k, v, *, state=None, feature_map=None, normalize=False, scale=None):
    """One decoding step: q, k [B, H, K], v [B, HV, V] -> (o_t [B, HV, V], new state)."""
    q, k, v, S, normalize = _checked(q, k, v, feature_map, normalize, scale, state, step=True)
    return _finish(*_gated_linear.step(q, k, v, None, S), normalize)


def _backward(form, q, k, v, feature_map, normalize, scale, initial_state, cu_seqlens, do, dstate,
              chunk_size=None):
    """The chain rule from the output back to q, k, v, in three steps.

    1. The normalizer (normalize=True). The engine returns o' = [n, z] (values, then the normalizer
       column) and o = n / z. With dL/do given:
           dn = do / z,      dz = -sum_v do * n / z^2 = -(do . o) / z
       and do' = [dn, dz] is the engine's output cotangent (o = 0 where z = 0, as in the forward, and
       there dn = do, dz = 0: the derivative of that definition). The ones column is no input: its
       gradient is dropped. This needs o', so the form's forward runs first.
    2. The engine's backward (`_gated_linear`, no gate) on q' = scale * phi(q), k' = phi(k), v' (per
       sequence with cu_seqlens, `varlen.backward`), each q/k head's gradient summed over its group of
       value heads (`heads.reduce`).
    3. The feature map: dq = phi'(q)^T (scale * dq'), dk = phi'(k)^T dk', by the map's backward.
    """
    phi_backward = feature_maps.backward_of(feature_map)   # a map without a backward: TypeError, first
    a, qf, kf, vf, S0, normalize = _checked_with_signature(q, k, v, feature_map, normalize, scale, initial_state,
                                                           cu_seqlens=cu_seqlens)
    scale = check_scale(scale, a.shapes["K"])
    do, _ = SIGNATURE.check_cotangents(a, do, None)
    if dstate is not None:
        dstate = check_array("dstate", dstate, *_state_dims(a, qf.shape[-1], vf.shape[-1], normalize),
                             a.xp).astype(qf.dtype, copy=False)
    do = do.astype(qf.dtype, copy=False)
    xp = a.xp
    C = check_chunk_size(chunk_size, a.shapes["T"]) if form == "chunked" else None
    if normalize:
        o_ext, _ = varlen.forward(_engine_form(form, C), (qf, kf, vf), S0, a.cu_seqlens)
        z = o_ext[..., -1:]
        zero = z == 0
        z_safe = xp.where(zero, 1, z)
        o = o_ext[..., :-1] / z_safe
        dz = xp.where(zero, 0, -(do * o).sum(-1, keepdims=True) / z_safe)
        do = xp.concatenate([do / z_safe, dz], axis=-1)
    run = varlen.chunked(lambda q, k, v, S0, do, dS, C: _gated_linear.backward(form, q, k, v, None, S0, do, dS, C), C)
    dqf, dkf, dvf, _, dS0 = varlen.backward(run, (qf, kf, vf), S0, do, dstate, a.cu_seqlens)
    dq = phi_backward(a.q, heads.reduce(dqf, a.group) * scale).astype(qf.dtype, copy=False)
    dk = phi_backward(a.k, heads.reduce(dkf, a.group)).astype(qf.dtype, copy=False)
    dv = dvf[..., :-1] if normalize else dvf
    return SIGNATURE.gradients("linear_attention")(dq, dk, xp.ascontiguousarray(dv), dS0)


def recurrent_backward(q, k, v, *, do, dstate=None, feature_map=None, normalize=False, scale=None,
                       initial_state=None, cu_seqlens=None):
    """Gradients of L = <do, o> + <dstate, final state> (dstate None = zeros) by the recurrence run
    backwards. do [B, T, HV, V]; dstate [B, HV, F, V] ([B, HV, F, V + 1] when normalized; N in place of B
    with cu_seqlens). Returns
    (dq, dk, dv, dinitial_state), named; dinitial_state is None when no initial_state was given. The
    feature map needs a backward (`feature_maps.backward_of`): a callable without one is a TypeError."""
    return _backward("recurrent", q, k, v, feature_map, normalize, scale, initial_state, cu_seqlens, do, dstate)


def chunked_backward(q, k, v, *, do, dstate=None, feature_map=None, normalize=False, scale=None,
                     initial_state=None, cu_seqlens=None, chunk_size=64):
    """The same gradients as `recurrent_backward`, chunk-parallel (`_gated_linear.chunked_backward`)."""
    return _backward("chunked", q, k, v, feature_map, normalize, scale, initial_state, cu_seqlens, do, dstate,
                     chunk_size)


def parallel_backward(q, k, v, *, do, dstate=None, feature_map=None, normalize=False, scale=None,
                      initial_state=None, cu_seqlens=None):
    """The same gradients, through the quadratic form (the chunked backward with one chunk)."""
    return _backward("parallel", q, k, v, feature_map, normalize, scale, initial_state, cu_seqlens, do, dstate)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    return (q, k, v), {}
