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
    raise NotImplementedError(
        "TODO: exponents i - j, powers of each head's gamma, zero above the diagonal (about 5 lines)")


def retnet_parallel(q, k, v, gamma, *, scale=None):
    """O = (scale * Q K^T * D) V per batch and head. q, k: [B, T, H, K]; v: [B, T, H, V]; gamma: [H].
    Returns o: [B, T, H, V]."""
    raise NotImplementedError("TODO: scores, times the decay mask, times V (about 4 lines)")


def retnet_recurrent(q, k, v, gamma, *, scale=None):
    """The token loop S_t = gamma S_{t-1} + k_t v_t^T, o_t = scale * S_t^T q_t, from S_0 = 0.
    Returns (o [B, T, H, V], S_T [B, H, K, V])."""
    raise NotImplementedError(
        "TODO: exercise 02's loop with the state decayed by gamma (one per head) before each write (about 8 lines)")


def retnet_chunked(q, k, v, gamma, *, scale=None, chunk_size=64):
    """The chunkwise form of the module docstring: any T, chunk_size C >= 1.
    Returns (o [B, T, H, V], S [B, H, K, V]), equal to retnet_recurrent's."""
    raise NotImplementedError(
        "TODO: exercise 05's chunk loop, with D inside the chunk, xi on the read, zeta and gamma^C on the write (about 15 lines)")
