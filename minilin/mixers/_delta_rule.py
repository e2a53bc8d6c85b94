"""Engine: the gated delta rule, behind deltanet, gated_deltanet and kda. The public modules check
their inputs and map their paper's symbols onto this; here the inputs are already checked, cast to one
dtype, and `q` already carries `scale`.

    S'  = Diag(exp(g_t)) S_{t-1}                        decay first (no gate: S' = S_{t-1})
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T             then correct what S' predicts for k_t
    o_t = S_t^T q_t

`g` is None (DeltaNet), scalar [B, T, H] (Gated DeltaNet) or per key channel [B, T, H, K] (KDA).
Shapes: q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; state [B, H, K, V]; o [B, T, H, V].
"""
from __future__ import annotations

from ..backend import array_module
from ..chunking import (causal_mask, decay_rows, decay_state, from_chunks, gated_gram, local_cumsum,
                        state_or_zeros, to_chunks, unit_lower_inverse)


def step(q, k, v, g, beta, S):
    """One token: q, k [B, H, K], v [B, H, V], g None / [B, H] / [B, H, K], beta [B, H], S or None."""
    S = state_or_zeros(S, q, v)
    S = decay_state(S, g)
    prediction = (k[..., None, :] @ S)[..., 0, :]  # S'^T k_t: what the memory holds for k_t
    S = S + (beta[..., None] * k)[..., :, None] * (v - prediction)[..., None, :]
    return (q[..., None, :] @ S)[..., 0, :], S


def recurrent(q, k, v, g, beta, S0):
    """The definition: one `step` per token, vectorized over batch and heads."""
    xp = array_module(q)
    S = state_or_zeros(S0, q[:, 0], v[:, 0])
    o = xp.empty(v.shape, q.dtype)
    for t in range(q.shape[1]):
        o[:, t], S = step(q[:, t], k[:, t], v[:, t], None if g is None else g[:, t], beta[:, t], S)
    return o, S


def chunked(q, k, v, g, beta, S0, chunk_size):
    """Chunked form with the WY representation (DeltaNet: Yang et al. 2024; gated: Yang et al. 2025).

    Inside one chunk, with G the chunk-local cumulative gate and S the state entering the chunk,
    unroll the recurrence: S_t = exp(G_t) S + sum_{j <= t} exp(G_t - G_j) k_j delta_j^T, where the
    corrections delta_t = beta_t (v_t - S_{t-1}'^T k_t) solve the unit lower-triangular system
        (I + A) Delta = diag(beta) V - diag(beta) (K * exp(G)) S,
        A_tj = beta_t k_t . exp(G_t - G_j) k_j   for j < t.
    With T = (I + A)^-1 (for all chunks at once, `chunking.unit_lower_inverse`):
        W = T diag(beta) (K * exp(G)),  U = T diag(beta) V,  Delta = U - W S.
    Only the state pass is sequential, chunk after chunk (FLA's chunk_gated_delta_rule_fwd_h):
        Delta_n = U_n - W_n S_n,    S_{n+1} = exp(G_C) S_n + (K * exp(G_C - G))^T Delta_n
    and then every chunk's output at once (FLA's chunk_fwd_o):
        O_n = (Q * exp(G)) S_n + (Q K^T, decayed and causally masked) Delta_n
    """
    xp = array_module(q)
    T = q.shape[1]
    qc, kc, vc = (to_chunks(x, chunk_size) for x in (q, k, v))   # [B, H, N, C, .]
    beta_c = to_chunks(beta, chunk_size)[..., None]              # [B, H, N, C, 1]
    G = None if g is None else local_cumsum(to_chunks(g, chunk_size))

    k_beta = kc * beta_c
    # Both intra-chunk matrices share the decay exp(G_t - G_j): build them in one call, [k*beta; q] vs k.
    grams = gated_gram(xp.stack([k_beta, qc]), kc, G)
    A = grams[0] * causal_mask(chunk_size, xp, strict=True)         # beta_t k_t . k_j decayed, j < t
    scores = grams[1]                                                # q_t . k_j decayed, j <= t
    T_inv = unit_lower_inverse(A)                                    # (I + A)^-1
    W = T_inv @ decay_rows(k_beta, G)
    U = T_inv @ (vc * beta_c)
    if G is None:
        G_last, k_to_end = None, kc
    else:
        G_last = G[:, :, :, -1]
        k_to_end = decay_rows(kc, G_last[:, :, :, None] - G)
    k_to_end_T = xp.ascontiguousarray(k_to_end.swapaxes(-1, -2))   # [B, H, N, K, C]

    S = state_or_zeros(S0, q[:, 0], v[:, 0])
    S_in, delta = xp.empty(U.shape[:3] + S.shape[-2:], S.dtype), xp.empty_like(U)
    for n in range(qc.shape[2]):
        S_in[:, :, n] = S
        delta[:, :, n] = U[:, :, n] - W[:, :, n] @ S
        S = decay_state(S, None if G_last is None else G_last[:, :, n]) + k_to_end_T[:, :, n] @ delta[:, :, n]
    o = decay_rows(qc, G) @ S_in + scores @ delta
    return from_chunks(o, T), S


def parallel(q, k, v, g, beta, S0):
    """The quadratic form: the chunked form with one chunk holding the whole sequence, so that
    O = (Q K^T, masked) (I + A)^-1 diag(beta) V when starting from an empty memory (DeltaNet's
    "attention" form)."""
    return chunked(q, k, v, g, beta, S0, max(q.shape[1], 1))
