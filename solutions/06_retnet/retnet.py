"""Exercise 06: fixed decay. RetNet's retention in its three forms (Sun et al. 2023).

Linear attention never forgets: S_t keeps every write forever. Retention multiplies the memory by a
decay gamma in (0, 1) at every step, one gamma per head:

    recurrent   S_t = gamma S_{t-1} + k_t v_t^T,        o_t = scale * S_t^T q_t,       S_0 = 0
    parallel    O = (scale * Q K^T  *  D) V,            D_ij = gamma^(i - j) if i >= j, else 0
    chunkwise   for chunk n of C tokens, positions i, j = 0..C-1 inside it, S_n the state before it:
                O_n     = (scale * Q_n K_n^T * D) V_n  +  (scale * Q_n * xi) S_n,     xi_i = gamma^(i + 1)
                S_{n+1} = gamma^C S_n  +  (K_n * zeta)^T V_n,                       zeta_j = gamma^(C - 1 - j)

Unrolling the recurrence, o_i reads v_j with weight scale * gamma^(i - j) q_i . k_j: D is that decay,
token i sees the state before the chunk decayed i + 1 times (xi), and a key written at position j is
decayed C - 1 - j more times by the chunk's end (zeta). A short last chunk (T % C != 0) uses its own
length for C. RetNet's multi-scale default is gamma_h = 1 - 2^(-5 - h); here gamma is given.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; gamma [H] in (0, 1]; o [B, T, H, V]; S [B, H, K, V];
scale defaults to K ** -0.5. Check: `minilin check 6` (compares with minilin.mixers.retnet, and counts the
lines the parallel and chunked forms run: no loop over tokens, a loop over chunks only).
"""
import numpy as np


def decay_mask(gamma, T):
    """D [H, T, T] with D[h, i, j] = gamma_h^(i - j) for i >= j, else 0. gamma: [H].

    Raise gamma to the power i - j only where i >= j (a negative power of gamma < 1 is large, and for
    gamma -> 0 it is infinite): build the exponent i - j, and mask it before or after the power.
    """
    # TODO: exponents i - j, powers of each head's gamma, zero above the diagonal
    i = np.arange(T)
    exponent = i[:, None] - i[None, :]                              # [T, T]
    lower = exponent >= 0
    powers = gamma[:, None, None] ** np.where(lower, exponent, 0)   # [H, T, T]
    return np.where(lower, powers, 0.0)
    # END TODO


def retnet_parallel(q, k, v, gamma, *, scale=None):
    """O = (scale * Q K^T * D) V per batch and head. q, k: [B, T, H, K]; v: [B, T, H, V]; gamma: [H].
    Returns o: [B, T, H, V]."""
    # TODO: scores, times the decay mask, times V
    K, T = q.shape[-1], q.shape[1]
    scale = K ** -0.5 if scale is None else scale
    scores = scale * np.einsum("bihk,bjhk->bhij", q, k) * decay_mask(gamma, T)
    return np.einsum("bhij,bjhv->bihv", scores, v)
    # END TODO


def retnet_recurrent(q, k, v, gamma, *, scale=None):
    """The token loop S_t = gamma S_{t-1} + k_t v_t^T, o_t = scale * S_t^T q_t, from S_0 = 0.
    Returns (o [B, T, H, V], S_T [B, H, K, V])."""
    # TODO: exercise 02's loop with the state decayed by gamma (one per head) before each write
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, v.shape[-1]))
    o = np.empty(v.shape)
    for t in range(T):
        S = gamma[:, None, None] * S + np.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        o[:, t] = scale * np.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, S
    # END TODO


def retnet_chunked(q, k, v, gamma, *, scale=None, chunk_size=64):
    """The chunkwise form of the module docstring: any T, chunk_size C >= 1.
    Returns (o [B, T, H, V], S [B, H, K, V]), equal to retnet_recurrent's."""
    # TODO: exercise 05's chunk loop, with D inside the chunk, xi on the read, zeta and gamma^C on the write
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, v.shape[-1]))
    o = np.empty(v.shape)
    for start in range(0, T, chunk_size):
        qc, kc, vc = (x[:, start:start + chunk_size] for x in (q * scale, k, v))
        C = qc.shape[1]
        position = np.arange(C)
        xi = gamma[:, None] ** (position + 1)                       # [H, C]: decay from the chunk's start
        zeta = gamma[:, None] ** (C - 1 - position)                 # [H, C]: decay to the chunk's end
        scores = np.einsum("bihk,bjhk->bhij", qc, kc) * decay_mask(gamma, C)
        o[:, start:start + C] = (np.einsum("bhij,bjhv->bihv", scores, vc)
                                 + np.einsum("bihk,hi,bhkv->bihv", qc, xi, S))
        S = gamma[:, None, None] ** C * S + np.einsum("bjhk,hj,bjhv->bhkv", kc, zeta, vc)
    return o, S
    # END TODO
