"""RWKV-6 "Finch" time mixing (Peng, Goldstein, Anthony, Albalak, Alcaide, Biderman et al. 2024, "Eagle
and Finch: RWKV with Matrix-Valued States and Dynamic Recurrence"): a per-channel, data-dependent
decay, and a bonus u for the current token.

    o_t = (S_{t-1} + Diag(u) k_t v_t^T)^T (scale r_t)       read the memory *before* this token, plus a bonus
    S_t = Diag(exp(w_t)) S_{t-1} + k_t v_t^T                 then decay and write             S: [K, V]

Paper symbols -> code: r = receptance (the query), k, v = key, value, w_t = the data-dependent decay,
here in log space (the paper's decay factor is exp(-exp(w_raw)); w = -exp(w_raw) <= 0, as FLA's rwkv6
takes it), u = the bonus ("time_first") per head and key channel, wkv state -> S. RWKV-6 itself uses
scale = 1; the default here is K ** -0.5 as for every mixer (CONVENTIONS.md; FLA's chunk_rwkv6 does the
same). Pass scale=1.0 for the paper's numbers.

It is GLA (`gla`) except that the output reads S_{t-1} instead of S_t: token t sees itself only
through the bonus u, never through the memory. In the chunked form this makes the intra-chunk part
strictly causal, and each query is decayed from the chunk's start to the token *before* it:
    o_i = (r_i * exp(G_{i-1}))^T S_n                                           inter-chunk (state S_n)
        + sum_{j < i} (sum_k r_ik k_jk exp(G_{i-1,k} - G_{j,k})) v_j            intra-chunk, strict
        + (r_i . (u * k_i)) v_i                                                 bonus diagonal
with G the chunk-local cumulative gate and G_{-1} = 0. Every exponent is a non-positive difference
(j < i implies G_{i-1} <= G_j), so the form stays finite for any gate. The state passing is GLA's.

Shapes: r, k [B, T, H, K]; v [B, T, H, V]; w [B, T, H, K]; u [H, K]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent (the definition), chunked, parallel, step. Each returns (o, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..chunking import (decay_rows, decay_state, exclusive_cumsum, from_chunks, gram_before_decay, local_cumsum,
                        pass_states, state_or_zeros, to_chunks)
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_log_gate, check_scale

SIGNATURE = Signature(
    inputs=(Tensor("r", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V"),
            Tensor("w", "B T H K", gate=True), Tensor("u", "H K")),
    output="B T H V", state="B H K V")


def _checked(r, k, v, w, u, scale, state, step=False):
    """Checked inputs and the query q = scale * r."""
    a = SIGNATURE.check(r, k, v, w, u, state=state, step=step)
    check_log_gate("w", a.w)
    return a, a.r * check_scale(scale, a.shapes["K"])


def _step(q, k, v, w, u, S):
    """One token on checked inputs: q, k, w [B, H, K], v [B, H, V], u [H, K], S [B, H, K, V] or None."""
    S = state_or_zeros(S, q, v)
    bonus = (q * u * k).sum(-1, keepdims=True) * v           # (q . (u * k)) v: Diag(u) k v^T read by q
    o = (q[..., None, :] @ S)[..., 0, :] + bonus              # S_{t-1}^T q
    return o, decay_state(S, w) + k[..., :, None] * v[..., None, :]


def step(r, k, v, w, u, *, state=None, scale=None):
    """One decoding step: r, k, w [B, H, K], v [B, H, V] -> (o_t [B, H, V], new state [B, H, K, V])."""
    a, q = _checked(r, k, v, w, u, scale, state, step=True)
    return _step(q, a.k, a.v, a.w, a.u, a.state)


def recurrent(r, k, v, w, u, *, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    a, q = _checked(r, k, v, w, u, scale, initial_state)
    k, v, w, u, S = a.k, a.v, a.w, a.u, a.state
    o = array_module(q).empty(v.shape, q.dtype)
    for t in range(q.shape[1]):
        o[:, t], S = _step(q[:, t], k[:, t], v[:, t], w[:, t], u, S)
    return o, S


def chunked(r, k, v, w, u, *, scale=None, initial_state=None, chunk_size=64):
    """Chunked form (see the module docstring), finite for any gate; any T, chunk_size > 0 (clamped to T)."""
    a, q = _checked(r, k, v, w, u, scale, initial_state)
    return _chunked(q, a.k, a.v, a.w, a.u, a.state, check_chunk_size(chunk_size, a.shapes["T"]))


def parallel(r, k, v, w, u, *, scale=None, initial_state=None):
    """Quadratic form: the chunked form with one chunk holding the whole sequence."""
    a, q = _checked(r, k, v, w, u, scale, initial_state)
    return _chunked(q, a.k, a.v, a.w, a.u, a.state, q.shape[1])


def _chunked(q, k, v, w, u, S0, chunk_size):
    T = q.shape[1]
    qc, kc, vc = (to_chunks(x, chunk_size) for x in (q, k, v))           # [B, H, N, C, .]
    G = local_cumsum(to_chunks(w, chunk_size))                          # [B, H, N, C, K]
    G_last = G[:, :, :, -1]                                             # decay over each whole chunk

    scores = gram_before_decay(qc, kc, G)                               # strictly causal, [B, H, N, C, C]
    bonus = (qc * u[:, None, None] * kc).sum(-1)                        # q_i . (u * k_i), [B, H, N, C]
    o = scores @ vc + bonus[..., None] * vc

    dS = decay_rows(kc, G_last[:, :, :, None] - G).swapaxes(-1, -2) @ vc  # what each chunk writes
    S_in, S_final = pass_states(dS, G_last, S0)
    o = o + decay_rows(qc, exclusive_cumsum(G)) @ S_in                  # read S_{i-1}'s part from S_n
    return from_chunks(o, T), S_final


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    r = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    w = examples.log_gates(rng, (B, T, H, K), dtype, xp)
    u = examples.normal(rng, (H, K), dtype, xp)
    return (r, k, v, w, u), {}
