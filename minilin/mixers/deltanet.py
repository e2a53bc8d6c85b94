"""DeltaNet: linear attention with the delta rule (Schlag et al. 2021, "Linear Transformers Are
Secretly Fast Weight Programmers"; chunked training: Yang et al. 2024, "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length").

    S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = scale * S_t^T q_t

Instead of adding v_t on top of what the memory already holds for k_t (additive linear attention), the
delta rule reads the memory's prediction S^T k_t, and writes only the correction toward v_t, with
strength beta_t. With unit keys and beta = 1 the memory then holds exactly v_t for k_t.

Paper symbols: beta_t = writing strength, v_t^old = S_{t-1}^T k_t (the value being replaced),
T = (I + tril(diag(beta) K K^T, -1))^-1, W = T diag(beta) K, U = T diag(beta) V (the WY representation).
allow_neg_eigval=True lets beta reach 2, so the transition I - beta k k^T can have eigenvalue -1
(Grazzi et al. 2025): needed for state tracking such as parity. Keys should be L2-normalized (as in the
papers); with |k| > 1 the recurrence can grow without bound.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent (the definition), chunked (WY), parallel, step. Each returns (o, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..validation import check_beta, check_chunk_size, check_flag, check_scale, check_tensors, state_name
from . import _delta_rule


def _prepare(q, k, v, beta, scale, state, allow_neg_eigval, step=False):
    _, shapes, (q, k, v, beta, state) = check_tensors(
        ("q", q, "B T H K"), ("k", k, "B T H K"), ("v", v, "B T H V"), ("beta", beta, "B T H"),
        (state_name(step), state, "B H K V"), step=step)
    check_beta(beta, check_flag("allow_neg_eigval", allow_neg_eigval))
    return q * check_scale(scale, shapes["K"]), k, v, None, beta, state


def recurrent(q, k, v, beta, *, scale=None, initial_state=None, allow_neg_eigval=False):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    return _delta_rule.recurrent(*_prepare(q, k, v, beta, scale, initial_state, allow_neg_eigval))


def chunked(q, k, v, beta, *, scale=None, initial_state=None, allow_neg_eigval=False, chunk_size=64):
    """Chunked form with the WY representation (a triangular solve per chunk); any T, chunk_size > 0."""
    chunk_size = check_chunk_size(chunk_size)
    return _delta_rule.chunked(*_prepare(q, k, v, beta, scale, initial_state, allow_neg_eigval), chunk_size)


def parallel(q, k, v, beta, *, scale=None, initial_state=None, allow_neg_eigval=False):
    """Quadratic form: O = tril(Q K^T) (I + tril(diag(beta) K K^T, -1))^-1 diag(beta) V from an empty memory."""
    return _delta_rule.parallel(*_prepare(q, k, v, beta, scale, initial_state, allow_neg_eigval))


def step(q, k, v, beta, *, state=None, scale=None, allow_neg_eigval=False):
    """One decoding step: q, k [B, H, K], v [B, H, V], beta [B, H] -> (o_t [B, H, V], new state)."""
    return _delta_rule.step(*_prepare(q, k, v, beta, scale, state, allow_neg_eigval, step=True))


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.unit_vectors(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    beta = examples.uniform(rng, 0, 1, (B, T, H), dtype, xp)
    return (q, k, v, beta), {}
