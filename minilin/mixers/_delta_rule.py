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
from ..chunking import (causal_mask, channel_gram, chunk_view, chunked_output, decay_matrix, decay_state,
                        state_or_zeros, transposed, unit_lower_inverse, unit_lower_solve)


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
        (I + A) Delta = diag(beta) (V - (K * exp(G)) S),
        A_tj = beta_t k_t . exp(G_t - G_j) k_j   for j < t.
    With T = (I + A)^-1 for all chunks at once (`chunking.unit_lower_inverse`), Delta = T diag(beta) (V - K_e S)
    with K_e = K * exp(G). Then chunk after chunk (the only sequential part):
        Delta_n = (T diag(beta))_n (V_n - K_e,n S_n)                      the chunk's corrections
        O_n     = [Q * exp(G) | P]_n [S_n; Delta_n]                       its output, P = (Q K^T) decayed, causal
        S_{n+1} = exp(G_C) S_n + (K * exp(G_C - G))_n^T Delta_n           the state it leaves
    T multiplies each chunk's residual inside the pass, rather than making W = T diag(beta) K_e and
    U = T diag(beta) V for all chunks first as FLA's kernels do: one C x C x K product fewer per chunk. The
    output's two terms are one product against [S_n; Delta_n], the state and the corrections side by side in
    one buffer, so neither the states nor the corrections of all chunks are ever stored.

    Gates: scalar ones are summed in float64 per chunk and rounded once after each difference
    (`decay_matrix`); per-channel ones go through `chunking.channel_gram`, which builds A and P by halving
    the chunk and returns K * exp(G), Q * exp(G), K * exp(G_C - G) and exp(G_C) with them.
    """
    xp = array_module(q)
    B, T, H, K = q.shape
    V, C = v.shape[-1], chunk_size
    qc, kc, vc = (chunk_view(x, C) for x in (q, k, v))             # [B, H, N, C, .], views
    beta_c = chunk_view(beta, C)                                     # [B, H, N, C]
    o, oc = chunked_output(v, C)
    N = qc.shape[2]
    reads = xp.empty((B, H, N, C, K + C), q.dtype)                   # [Q * exp(G) | P] of every chunk
    q_from_start, P = reads[..., :K], reads[..., K:]
    if g is None or g.ndim == 3:
        k_to_end_T = transposed(kc)                                  # [B, H, N, K, C]; K^T for the grams first
        A = kc @ k_to_end_T                                          # k_t . k_j
        xp.matmul(qc, k_to_end_T, out=P)                             # q_t . k_j
        if g is None:
            P *= causal_mask(C, xp)                                  # (A needs no mask: the solve reads below it)
            q_from_start[...] = qc
            k_from_start, chunk_decay = kc, None
        else:
            G = xp.cumsum(chunk_view(g, C), axis=-1, dtype=xp.float64)   # [B, H, N, C]
            L = decay_matrix(G, dtype=q.dtype)
            A *= L
            P *= L
            from_start = xp.exp(G).astype(q.dtype)[..., None]
            xp.multiply(qc, from_start, out=q_from_start)
            k_from_start = kc * from_start
            k_to_end_T *= xp.exp(G[..., -1:] - G).astype(q.dtype)[..., None, :]   # K^T now decayed to the end
            chunk_decay = xp.exp(G[..., -1]).astype(q.dtype)[..., None, None]   # [B, H, N, 1, 1]
    else:
        (A, P_), (k_from_start, q_from_start_), k_to_end, chunk_decay = channel_gram((kc, qc), kc, chunk_view(g, C))
        P[...], q_from_start[...] = P_, q_from_start_
        k_to_end_T = k_to_end.swapaxes(-1, -2)
        chunk_decay = chunk_decay[..., None]                         # [B, H, N, K, 1]
    A *= beta_c[..., None]                                           # beta_t k_t . k_j, decayed
    if N > 1:
        T_beta = unit_lower_inverse(A)
        T_beta *= beta_c[..., None, :]                               # T diag(beta)

    state_and_delta = xp.empty((B, H, K + C, V), q.dtype)            # [S_n; Delta_n]
    S, delta = state_and_delta[:, :, :K], state_and_delta[:, :, K:]
    S[...] = 0 if S0 is None else S0
    residual, write = xp.empty((B, H, C, V), q.dtype), xp.empty((B, H, K, V), q.dtype)
    for n in range(N):
        xp.matmul(k_from_start[:, :, n], S, out=residual)            # K_e S_n: what the memory predicts
        xp.subtract(vc[:, :, n], residual, out=residual)
        if N > 1:
            xp.matmul(T_beta[:, :, n], residual, out=delta)          # Delta_n
        else:  # one chunk (the parallel form): solve rather than invert, C^2 V work instead of C^3
            delta[...] = unit_lower_solve(A[:, :, 0], residual * beta_c[:, :, 0, :, None])
        xp.matmul(reads[:, :, n], state_and_delta, out=oc[:, :, n])  # O_n
        xp.matmul(k_to_end_T[:, :, n], delta, out=write)
        if chunk_decay is not None:
            S *= chunk_decay[:, :, n]
        S += write
    return xp.ascontiguousarray(o[:, :T]), S.copy()


def parallel(q, k, v, g, beta, S0):
    """The quadratic form: the chunked form with one chunk holding the whole sequence, so that
    O = (Q K^T, masked) (I + A)^-1 diag(beta) V when starting from an empty memory (DeltaNet's
    "attention" form)."""
    return chunked(q, k, v, g, beta, S0, max(q.shape[1], 1))
