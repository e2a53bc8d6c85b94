"""Engine: gated linear attention, the recurrence behind linear_attention, simple_gla, retnet,
lightning, mamba2 and gla. The public modules check their inputs and map their paper's symbols onto
this; here the inputs are already checked, cast to one dtype, and `q` already carries `scale`.

    S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T          S: [K, V] per (batch, head)
    o_t = S_t^T q_t

`g` is None (no decay: plain linear attention), scalar ([B, T, H]: one decay per head and token,
RetNet / Lightning / Mamba-2 / simple GLA) or per key channel ([B, T, H, K]: GLA).

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; state [B, H, K, V]; o [B, T, H, V].
"""
from __future__ import annotations

from ..backend import array_module
from ..chunking import (decay_rows, decay_state, from_chunks, gated_gram, local_cumsum,
                        pass_states, state_or_zeros, to_chunks)


def step(q, k, v, g, S):
    """One token: q, k [B, H, K], v [B, H, V], g None / [B, H] / [B, H, K], S [B, H, K, V] or None."""
    S = state_or_zeros(S, q, v)
    S = decay_state(S, g) + k[..., :, None] * v[..., None, :]
    return (q[..., None, :] @ S)[..., 0, :], S


def recurrent(q, k, v, g, S0):
    """The definition: one `step` per token, vectorized over batch and heads."""
    xp = array_module(q)
    S = state_or_zeros(S0, q[:, 0], v[:, 0])
    o = xp.empty(v.shape, q.dtype)
    for t in range(q.shape[1]):
        o[:, t], S = step(q[:, t], k[:, t], v[:, t], None if g is None else g[:, t], S)
    return o, S


def chunked(q, k, v, g, S0, chunk_size):
    """Chunked form: dense work inside chunks of C tokens, the state passed between chunks.

    With G the chunk-local cumulative gate and S_n the state entering chunk n, for token i of chunk n:
        o_i = sum_{j <= i in chunk} (q_i . exp(G_i - G_j) k_j) v_j      intra-chunk, A = gated_gram(q, k, G)
            + (q_i * exp(G_i))^T S_n                                      inter-chunk
        S_{n+1} = exp(G_C) S_n + sum_j (k_j * exp(G_C - G_j)) v_j^T        state passing
    For a scalar gate this is Mamba-2's SSD algorithm (diagonal blocks, chunk states, state passing,
    state-to-output); without a gate it is chunked linear attention.
    """
    T = q.shape[1]
    qc, kc, vc = (to_chunks(x, chunk_size) for x in (q, k, v))  # [B, H, N, C, .]
    G = None if g is None else local_cumsum(to_chunks(g, chunk_size))
    G_last = None if G is None else G[:, :, :, -1]  # log-decay over each whole chunk

    o = gated_gram(qc, kc, G) @ vc                  # intra-chunk: masked, decayed Q K^T, then V
    k_to_end = decay_rows(kc, None if G is None else G_last[:, :, :, None] - G)
    dS = k_to_end.swapaxes(-1, -2) @ vc             # what each chunk writes: [B, H, N, K, V]
    S_in, S_final = pass_states(dS, G_last, S0)
    o = o + decay_rows(qc, G) @ S_in                # inter-chunk: read the state entering the chunk
    return from_chunks(o, T), S_final


def parallel(q, k, v, g, S0):
    """The quadratic form o = (Q K^T * D) V (+ the read of S0): the chunked form with one chunk of T."""
    return chunked(q, k, v, g, S0, max(q.shape[1], 1))
