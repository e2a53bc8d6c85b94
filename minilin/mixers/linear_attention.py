"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Softmax attention computes (Q K^T) V and keeps every key: a KV cache that grows with T. Replacing
exp(q . k) by a kernel phi(q) . phi(k) lets the bracket move: (phi(Q) phi(K)^T) V = phi(Q) (phi(K)^T V),
and phi(K)^T V is a fixed-size state that a recurrence updates one token at a time:

    S_t = S_{t-1} + phi(k_t) v_t^T                     S: [F, V], F = feature dimension (K for elu+1)
    o_t = scale * S_t^T phi(q_t)
    normalize=True:  o_t /= scale * z_t . phi(q_t),    z_t = sum_{i <= t} phi(k_i)

Paper symbols: phi = feature map, S_t = sum_i phi(K_i) V_i^T, Z_t = sum_i phi(K_i).

With normalize=True the normalizer z rides along as one extra value column of the state (the memory
of a constant value 1), so the state is [B, H, F, V + 1] and every form, chunked included, gets z for
free. Normalizing wants a positive feature map (elu+1, relu with care, favor+); with the identity map
z_t . q_t can reach zero.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; state [B, H, F, V] (V + 1 when normalized).
Forms: recurrent (the definition), chunked, parallel, step. Each returns (o, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples, feature_maps
from ..validation import (Shapes, check_array, check_chunk_size, check_flag, check_scale, check_tensors,
                          state_name)
from . import _gated_linear


def _prepare(q, k, v, feature_map, normalize, scale, state, step=False):
    xp, shapes, (q, k, v) = check_tensors(("q", q, "B T H K"), ("k", k, "B T H K"), ("v", v, "B T H V"), step=step)
    scale = check_scale(scale, shapes["K"])
    normalize = check_flag("normalize", normalize)
    phi = feature_maps.resolve(feature_map)
    q, k = phi(q) * scale, phi(k)
    F = q.shape[-1]
    if normalize:
        v = xp.concatenate([v, xp.ones_like(v[..., :1])], axis=-1)
    if state is not None:
        feature, value = ("K" if F == shapes["K"] else "F"), ("V+1" if normalize else "V")
        dims = Shapes(B=shapes["B"], H=shapes["H"], **{feature: F, value: v.shape[-1]})
        check_array(state_name(step), state, f"B H {feature} {value}", dims, xp)
        state = state.astype(q.dtype)
    return q, k, v, state, normalize


def _finish(o, S, normalize):
    """Split the normalizer column off the output and divide by it."""
    return (o[..., :-1] / o[..., -1:], S) if normalize else (o, S)


def recurrent(q, k, v, *, feature_map=None, normalize=False, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state)."""
    q, k, v, S0, normalize = _prepare(q, k, v, feature_map, normalize, scale, initial_state)
    return _finish(*_gated_linear.recurrent(q, k, v, None, S0), normalize)


def chunked(q, k, v, *, feature_map=None, normalize=False, scale=None, initial_state=None, chunk_size=64):
    """Chunked: causal (Q K^T) V inside each chunk, plus Q S_n from the prefix sum of chunk states."""
    chunk_size = check_chunk_size(chunk_size)
    q, k, v, S0, normalize = _prepare(q, k, v, feature_map, normalize, scale, initial_state)
    return _finish(*_gated_linear.chunked(q, k, v, None, S0, chunk_size), normalize)


def parallel(q, k, v, *, feature_map=None, normalize=False, scale=None, initial_state=None):
    """Quadratic form: o = tril(phi(Q) phi(K)^T) V (+ phi(Q) S0), the left side of the bracket move."""
    q, k, v, S0, normalize = _prepare(q, k, v, feature_map, normalize, scale, initial_state)
    return _finish(*_gated_linear.parallel(q, k, v, None, S0), normalize)


def step(q, k, v, *, state=None, feature_map=None, normalize=False, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V] -> (o_t [B, H, V], new state)."""
    q, k, v, S, normalize = _prepare(q, k, v, feature_map, normalize, scale, state, step=True)
    return _finish(*_gated_linear.step(q, k, v, None, S), normalize)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    return (q, k, v), {}
