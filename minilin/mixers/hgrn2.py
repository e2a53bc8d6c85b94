"""HGRN2 (Qin, Yang, Sun, Shen, Li, Sun & Zhong 2024, "HGRN2: Gated Linear RNNs with State Expansion"):
HGRN's forget gate, its state expanded from a vector to a matrix by an outer product.

    S_t = Diag(f_t) S_{t-1} + (1 - f_t) i_t^T,  f_t = exp(g_t) in (0, 1]^K       S: [K, V]
    o_t = scale * S_t^T q_t

Paper symbols -> code: f_t = forget gate (here log-space g_t = log f_t <= 0), i_t = input -> v,
o_t = output gate read against the state -> q, the state H_t -> S, expansion ratio = K per head.
The tied input gate 1 - f_t takes the place of a key.

That is GLA (`gla`) with the key tied to one minus the forget gate:
    q = q,  k = 1 - exp(g) = -expm1(g),  v = v,  g = g
and every form below is the `_gated_linear` engine under this mapping, so HGRN2's chunked form is GLA's
(finite for any gate). FLA's HGRN2 layer calls its GLA kernels the same way, with the default
scale K ** -0.5 used here too. expm1 keeps the key exact when the gate is close to 1 (g near 0).

Shapes: q [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent (the definition), chunked, parallel, step. Each returns (o, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..validation import check_chunk_size, check_log_gate, check_scale, check_tensors, state_name
from . import _gated_linear


def _prepare(q, v, g, scale, state, step=False):
    xp, shapes, (q, v, g, state) = check_tensors(
        ("q", q, "B T H K"), ("v", v, "B T H V"), ("g", g, "B T H K"),
        (state_name(step), state, "B H K V"), step=step)
    check_log_gate("g", g)
    k = -xp.expm1(g)  # the key tied to the forget gate: 1 - f
    return q * check_scale(scale, shapes["K"]), k, v, g, state


def recurrent(q, v, g, *, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    return _gated_linear.recurrent(*_prepare(q, v, g, scale, initial_state))


def chunked(q, v, g, *, scale=None, initial_state=None, chunk_size=64):
    """GLA's chunked form under the mapping; any T, chunk_size > 0."""
    chunk_size = check_chunk_size(chunk_size)
    return _gated_linear.chunked(*_prepare(q, v, g, scale, initial_state), chunk_size)


def parallel(q, v, g, *, scale=None, initial_state=None):
    """Quadratic form: o_i = sum_{j <= i} (sum_k q_ik (1 - f_jk) exp(G_ik - G_jk)) v_j, G = cumsum(g)."""
    return _gated_linear.parallel(*_prepare(q, v, g, scale, initial_state))


def step(q, v, g, *, state=None, scale=None):
    """One decoding step: q, g [B, H, K], v [B, H, V] -> (o_t [B, H, V], new state)."""
    return _gated_linear.step(*_prepare(q, v, g, scale, state, step=True))


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs: q and v standard normal, g a log forget gate. Returns (args, kwargs)."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    g = examples.log_gates(rng, (B, T, H, K), dtype, xp)
    return (q, v, g), {}
