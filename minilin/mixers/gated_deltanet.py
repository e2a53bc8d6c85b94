"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with
Delta Rule"): Mamba-2's scalar decay and DeltaNet's delta rule in one update.

    S'  = alpha_t S_{t-1},  alpha_t = exp(g_t)            decay first ...
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T               ... then correct the decayed memory
        = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = scale * S_t^T q_t

Paper symbols: alpha_t = gating term in (0, 1] (here log-space g_t <= 0), beta_t = writing strength,
S_t = the state. The chunked form is DeltaNet's WY form with the decay folded in: exp(G_t - G_j) on the
intra-chunk products and exp(G) on the rows read from or written to the chunk's boundary states.
allow_neg_eigval=True lets beta reach 2 (transition eigenvalues down to -alpha). Keys should be
L2-normalized.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; g, beta [B, T, H]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent (the definition), chunked (WY), parallel, step. Each returns (o, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..validation import (check_beta, check_chunk_size, check_flag, check_log_gate, check_scale,
                          check_tensors, state_name)
from . import _delta_rule


def _prepare(q, k, v, g, beta, scale, state, allow_neg_eigval, step=False):
    _, shapes, (q, k, v, g, beta, state) = check_tensors(
        ("q", q, "B T H K"), ("k", k, "B T H K"), ("v", v, "B T H V"), ("g", g, "B T H"),
        ("beta", beta, "B T H"), (state_name(step), state, "B H K V"), step=step)
    check_log_gate("g", g)
    check_beta(beta, check_flag("allow_neg_eigval", allow_neg_eigval))
    return q * check_scale(scale, shapes["K"]), k, v, g, beta, state


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, allow_neg_eigval=False):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    return _delta_rule.recurrent(*_prepare(q, k, v, g, beta, scale, initial_state, allow_neg_eigval))


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, allow_neg_eigval=False, chunk_size=64):
    """Chunked form (gated WY representation); any T, chunk_size > 0."""
    chunk_size = check_chunk_size(chunk_size)
    return _delta_rule.chunked(*_prepare(q, k, v, g, beta, scale, initial_state, allow_neg_eigval), chunk_size)


def parallel(q, k, v, g, beta, *, scale=None, initial_state=None, allow_neg_eigval=False):
    """Quadratic form: the chunked form with one chunk holding the whole sequence."""
    return _delta_rule.parallel(*_prepare(q, k, v, g, beta, scale, initial_state, allow_neg_eigval))


def step(q, k, v, g, beta, *, state=None, scale=None, allow_neg_eigval=False):
    """One decoding step: q, k [B, H, K], v [B, H, V], g, beta [B, H] -> (o_t [B, H, V], new state)."""
    return _delta_rule.step(*_prepare(q, k, v, g, beta, scale, state, allow_neg_eigval, step=True))


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.unit_vectors(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    g = examples.log_gates(rng, (B, T, H), dtype, xp)
    beta = examples.uniform(rng, 0, 1, (B, T, H), dtype, xp)
    return (q, k, v, g, beta), {}
