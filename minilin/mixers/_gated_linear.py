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
from ..chunking import (causal_mask, channel_gram, chunk_view, decay_matrix, decay_state, read_and_pass,
                        state_or_zeros, transposed)


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
        o_i = sum_{j <= i in chunk} (q_i . exp(G_i - G_j) k_j) v_j      intra-chunk, A V
            + (q_i * exp(G_i))^T S_n                                      inter-chunk
        S_{n+1} = exp(G_C) S_n + sum_j (k_j * exp(G_C - G_j)) v_j^T        state passing
    For a scalar gate this is Mamba-2's SSD algorithm (diagonal blocks, chunk states, state passing,
    state-to-output); without a gate it is chunked linear attention.

    A per gate: none, (Q K^T) causally masked; scalar, (Q K^T) * `decay_matrix(G)` with G summed in float64
    (long chunks, the parallel form's one chunk of T included, keep float32's precision in every
    difference G_i - G_j); per channel, `chunking.channel_gram`, which builds A by halving the chunk and
    returns q * exp(G), k * exp(G_C - G) and exp(G_C) with it; then `chunking.read_and_pass`. q and k are
    read in place through chunk views, so the large arrays are K^T, A, the chunk writes (summed in place into
    the states), V and o in the chunked layout, and o.
    """
    xp = array_module(q)
    C = chunk_size
    qc, kc = chunk_view(q, C), chunk_view(k, C)              # [B, H, N, C, K], views
    if g is None or g.ndim == 3:
        k_to_end_T = transposed(kc)                          # [B, H, N, K, C]: K^T for the scores first
        A = qc @ k_to_end_T
    if g is None:
        A *= causal_mask(C, xp)
        q_from_start, chunk_decay = qc, None
    elif g.ndim == 3:                                        # scalar gate [B, T, H]
        G = xp.cumsum(chunk_view(g, C), axis=-1, dtype=xp.float64)                 # [B, H, N, C]
        A *= decay_matrix(G, dtype=q.dtype)
        G_last = G[..., -1:]
        q_from_start = qc * xp.exp(G).astype(q.dtype)[..., None]
        k_to_end_T *= xp.exp(G_last - G).astype(q.dtype)[..., None, :]            # then decayed to the end
        chunk_decay = xp.exp(G_last[..., 0]).astype(q.dtype)                        # [B, H, N]
    else:                                                    # per-channel gate [B, T, H, K]
        A, q_from_start, k_to_end, chunk_decay = channel_gram(qc, kc, chunk_view(g, C))
        k_to_end_T = k_to_end.swapaxes(-1, -2)
    return read_and_pass(A, q_from_start, k_to_end_T, chunk_decay, v, S0, C)


def parallel(q, k, v, g, S0):
    """The quadratic form o = (Q K^T * D) V (+ the read of S0): the chunked form with one chunk of T."""
    return chunked(q, k, v, g, S0, max(q.shape[1], 1))
