"""Exercise 20: the chunked backward pass of simple GLA, chunk-parallel like its forward.

Exercise 19 ran the backward one token at a time. The chunked forward (exercises 06, 09) does the work of a
chunk of C tokens as matrix products and passes one state from chunk to chunk; its backward does the same,
backwards. For chunk n (rows i, j are its tokens; G the chunk-local cumulative gate, G_i = g_first + ... +
g_i; G_C its last entry; S_n the state entering the chunk; q' = scale q):

    forward:   o_i     = exp(G_i) q'_i^T S_n  +  sum_{j <= i} exp(G_i - G_j) (q'_i . k_j) v_j
               S_{n+1} = exp(G_C) S_n  +  sum_j exp(G_C - G_j) k_j v_j^T

Write L_ij = exp(G_i - G_j) for j <= i (0 above the diagonal: mask in the exponent, -inf, before exp),
E_i = exp(G_i) and F_j = exp(G_C - G_j): every exponent is <= 0, as in the forward.

1. The adjoint of the chunk states, backwards over chunks (`chunk_state_adjoints`). dS_n = dL/dS_n
   collects the reads of S_n by chunk n's outputs and what S_n passes on to S_{n+1}:

       dS_N = dstate (zeros when None),    dS_n = exp(G_C) dS_{n+1} + sum_i E_i q'_i do_i^T

   N sequential steps, not T: the only sequential part of the backward pass.

2. Inside each chunk, the gradients as matrix products. With dP = dO V^T ([C, C]: dp_ij = do_i . v_j):

       dq'_i = E_i (S_n do_i)        + sum_{j <= i} L_ij dp_ij k_j      ->  dQ' = E * (dO S_n^T) + (dP * L) K
       dk_j  = F_j (dS_{n+1} v_j)    + sum_{i >= j} L_ij dp_ij q'_i     ->  dK  = F * (V dS_{n+1}^T) + (dP * L)^T Q'
       dv_j  = F_j (dS_{n+1}^T k_j)  + sum_{i >= j} L_ij (q'_i . k_j) do_i
                                                                      ->  dV  = (F * K) dS_{n+1} + ((Q' K^T) * L)^T dO

   and dq = scale dq' for the caller's unscaled q. dS0 = dS_0 (the adjoint of the state entering chunk 0).

3. The gate, as in exercise 19: dL/dG_t = q_t . dq_t - k_t . dk_t (plus <dstate, S_T> at the last token),
   summed in reverse over t. The formula holds for the global cumulative gate, so it does not care where
   the chunks begin: dg = reverse cumsum over the whole sequence.

Cost: a handful of [C, C] and [C, K] x [K, V] products per chunk and two loops of N steps; the forward's
chunk states are recomputed first (a chunk loop of the forward), nothing of size T x K x V is kept.

Shapes: q, k [B, T, H, K]; v, do [B, T, H, V]; g [B, T, H]; dstate, initial_state [B, H, K, V]; chunk
adjoints [B, N + 1, H, K, V] with N = ceil(T / C); any T, chunk_size C >= 1 (the last chunk may be short).
Check: `minilin check 20` (compares with minilin.mixers.simple_gla's chunked_backward and with central
finite differences; gates strong enough that exp(-G) overflows; counts the lines that run: chunks, not tokens).
"""
import numpy as np


def chunk_state_adjoints(q, do, g, *, scale=None, dstate=None, chunk_size=16):
    """dS_n for the states entering each chunk, backwards over chunks (module docstring, step 1).

    q: [B, T, H, K]; do: [B, T, H, V]; g: [B, T, H]; dstate: [B, H, K, V] or None (zeros).
    Returns [B, N + 1, H, K, V]: entry n (n < N) the adjoint of the state entering chunk n, entry N dstate.
    """
    # TODO: start from dstate (or zeros) at N; for n = N-1 down to 0: decay by exp(G_C), add (Q' * E)^T dO
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    C = chunk_size
    N = -(-T // C)
    adjoints = np.empty((B, N + 1, H, K, do.shape[-1]))
    adjoints[:, N] = 0 if dstate is None else dstate
    for n in range(N - 1, -1, -1):
        s = n * C
        G = np.cumsum(g[:, s:s + C], axis=1)                               # [B, C, H]
        read = np.einsum("bih,bihk,bihv->bhkv", np.exp(G), scale * q[:, s:s + C], do[:, s:s + C])
        adjoints[:, n] = np.exp(G[:, -1])[..., None, None] * adjoints[:, n + 1] + read
    return adjoints
    # END TODO


def chunked_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None, chunk_size=16):
    """Gradients of L = sum_t <do_t, o_t> + <dstate, S_{T-1}>, chunk by chunk (module docstring).

    q, k: [B, T, H, K]; v, do: [B, T, H, V]; g: [B, T, H]; dstate, initial_state: [B, H, K, V] or None.
    Returns (dq, dk, dv, dg, dinitial_state) as exercise 19's recurrent_backward.
    """
    # TODO: recompute the chunk states, take chunk_state_adjoints, then per chunk dQ, dK, dV as products; dg last
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    C = chunk_size
    N = -(-T // C)
    states = np.empty((B, N + 1, H, K, V))                                 # the state entering chunk n
    states[:, 0] = 0 if initial_state is None else initial_state
    for n in range(N):
        s = n * C
        G = np.cumsum(g[:, s:s + C], axis=1)
        F = np.exp(G[:, -1:] - G)                                          # exp(G_C - G_j) <= 1
        states[:, n + 1] = (np.exp(G[:, -1])[..., None, None] * states[:, n]
                            + np.einsum("bjh,bjhk,bjhv->bhkv", F, k[:, s:s + C], v[:, s:s + C]))
    adjoints = chunk_state_adjoints(q, do, g, scale=scale, dstate=dstate, chunk_size=C)
    dq, dk, dv = np.empty(q.shape), np.empty(k.shape), np.empty(v.shape)
    for n in range(N):
        s = n * C
        qc, kc, vc, doc = scale * q[:, s:s + C], k[:, s:s + C], v[:, s:s + C], do[:, s:s + C]
        G = np.cumsum(g[:, s:s + C], axis=1)                               # [B, C, H]
        c = G.shape[1]
        diff = G[:, :, None] - G[:, None, :]                               # G_i - G_j: [B, C, C, H]
        L = np.exp(np.where(np.tril(np.ones((c, c), dtype=bool))[None, :, :, None], diff, -np.inf))
        E, F = np.exp(G), np.exp(G[:, -1:] - G)
        dP = np.einsum("bihv,bjhv->bijh", doc, vc) * L                     # dp_ij L_ij
        A = np.einsum("bihk,bjhk->bijh", qc, kc) * L                       # (q'_i . k_j) L_ij
        dq[:, s:s + c] = scale * (E[..., None] * np.einsum("bihv,bhkv->bihk", doc, states[:, n])
                                  + np.einsum("bijh,bjhk->bihk", dP, kc))
        dk[:, s:s + c] = (F[..., None] * np.einsum("bjhv,bhkv->bjhk", vc, adjoints[:, n + 1])
                          + np.einsum("bijh,bihk->bjhk", dP, qc))
        dv[:, s:s + c] = (np.einsum("bjh,bjhk,bhkv->bjhv", F, kc, adjoints[:, n + 1])
                          + np.einsum("bijh,bihv->bjhv", A, doc))
    dG = np.sum(q * dq, axis=-1) - np.sum(k * dk, axis=-1)
    if dstate is not None:
        dG[:, -1] += np.sum(dstate * states[:, N], axis=(-2, -1))
    dg = np.cumsum(dG[:, ::-1], axis=1)[:, ::-1]
    return dq, dk, dv, dg, (None if initial_state is None else adjoints[:, 0])
    # END TODO
