"""Kimi Delta Attention (Kimi Team 2025, "Kimi Linear"): Gated DeltaNet with a decay for every key
channel instead of one per head.

    S'  = Diag(alpha_t) S_{t-1},  alpha_t = exp(g_t) in (0, 1]^K
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
    o_t = scale * S_t^T q_t

Paper symbols: alpha_t = the channel-wise forget gate (log space here, g_t <= 0), beta_t = writing
strength. The chunked form is the gated WY form with per-channel decays, whose intra-chunk products
sum_k x_ik y_jk exp(G_ik - G_jk) are built as in GLA, finite for any gate (`chunking.gated_gram`).
Keys should be L2-normalized.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K]; beta [B, T, H]; o [B, T, H, V];
state [B, H, K, V]. Forms: recurrent (the definition), chunked, parallel, step; each returns (o, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..validation import check_beta, check_chunk_size, check_log_gate, check_scale, check_tensors, state_name
from . import _delta_rule


def _prepare(q, k, v, g, beta, scale, state, step=False):
    _, shapes, (q, k, v, g, beta, state) = check_tensors(
        ("q", q, "B T H K"), ("k", k, "B T H K"), ("v", v, "B T H V"), ("g", g, "B T H K"),
        ("beta", beta, "B T H"), (state_name(step), state, "B H K V"), step=step)
    check_log_gate("g", g)
    check_beta(beta, False)
    return q * check_scale(scale, shapes["K"]), k, v, g, beta, state


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    return _delta_rule.recurrent(*_prepare(q, k, v, g, beta, scale, initial_state))


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, chunk_size=64):
    """Chunked form (per-channel gated WY representation); any T, chunk_size > 0."""
    chunk_size = check_chunk_size(chunk_size)
    return _delta_rule.chunked(*_prepare(q, k, v, g, beta, scale, initial_state), chunk_size)


def parallel(q, k, v, g, beta, *, scale=None, initial_state=None):
    """Quadratic form: the chunked form with one chunk holding the whole sequence."""
    return _delta_rule.parallel(*_prepare(q, k, v, g, beta, scale, initial_state))


def step(q, k, v, g, beta, *, state=None, scale=None):
    """One decoding step: q, k, g [B, H, K], v [B, H, V], beta [B, H] -> (o_t [B, H, V], new state)."""
    return _delta_rule.step(*_prepare(q, k, v, g, beta, scale, state, step=True))


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.unit_vectors(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    g = examples.log_gates(rng, (B, T, H, K), dtype, xp)
    beta = examples.uniform(rng, 0, 1, (B, T, H), dtype, xp)
    return (q, k, v, g, beta), {}
