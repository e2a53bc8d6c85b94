"""Exercise 12: DeltaNet, chunked, with the WY representation and a triangular solve
(Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length").

The delta rule (exercise 11) is not a sum of independent writes: each correction depends on what the
earlier writes left in S. Inside a chunk of C tokens, starting from the state S, write S_t as

    S_t = S + sum_{j <= t} k_j delta_j^T,     delta_t = beta_t (v_t - S_{t-1}^T k_t)   (the corrections)

Substituting S_{t-1} into delta_t:  delta_t + sum_{j < t} beta_t (k_t . k_j) delta_j = beta_t v_t - beta_t S^T k_t,
for all t of the chunk at once a unit lower-triangular system:

    (I + A) Delta = diag(beta) V - diag(beta) K S,        A_tj = beta_t k_t . k_j  for j < t, else 0
                                                          (A = tril(diag(beta) K K^T, -1))

With T = (I + A)^-1, the WY representation of the chunk is

    W = T diag(beta) K     [C, K],        U = T diag(beta) V     [C, V],        Delta = U - W S

W and U depend on the chunk's own keys, values and betas only: every chunk's can be computed at once,
in parallel. Then, chunk after chunk (the only sequential part):

    Delta = U - W S
    O     = Q S + tril(Q K^T) Delta              (scale folded into Q)
    S    <- S + K^T Delta

Solving the system: a forward substitution (row t: delta_t = rhs_t - sum_{j < t} A_tj delta_j), or
scipy.linalg.solve_triangular(I + A, rhs, lower=True, unit_diagonal=True), or np.linalg.solve (batched).
A loop over the rows of a chunk belongs in wy_representation: deltanet_chunked itself loops over chunks
only (the check counts the lines it runs, and a loop over tokens there fails, as does calling minilin's
DeltaNet).

Shapes: q, k [B, T, H, K] (k unit-norm); v [B, T, H, V]; beta [B, T, H]; o [B, T, H, V]; S [B, H, K, V];
in the WY functions the chunk comes as k [..., C, K], v [..., C, V], beta [..., C] (any leading axes).
Check: `minilin check 12` (compares with minilin.mixers.deltanet and minilin.chunking.unit_lower_inverse).
"""
import numpy as np


def wy_representation(k, v, beta):
    """W = T diag(beta) K and U = T diag(beta) V for one chunk, T = (I + tril(diag(beta) K K^T, -1))^-1.

    k: [..., C, K]; v: [..., C, V]; beta: [..., C] (leading axes are independent chunks).
    Returns (W [..., C, K], U [..., C, V]).
    """
    # TODO: A from the keys' Gram matrix (strictly lower part, rows scaled by beta), then one solve for both
    C = k.shape[-2]
    k_beta = beta[..., None] * k
    A = np.tril(k_beta @ np.swapaxes(k, -1, -2), -1)                   # [..., C, C]
    rhs = np.concatenate([k_beta, beta[..., None] * v], axis=-1)       # [..., C, K + V]
    WU = np.linalg.solve(np.eye(C) + A, rhs)
    return WU[..., :k.shape[-1]], WU[..., k.shape[-1]:]
    # END TODO


def deltanet_chunked(q, k, v, beta, *, scale=None, chunk_size=64):
    """DeltaNet in chunks of C tokens (module docstring); any T, chunk_size >= 1, from S = 0.

    q, k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H].
    Returns (o [B, T, H, V], S [B, H, K, V]), equal to exercise 11's recurrence.
    """
    # TODO: per chunk ([B, H, C, .] layout): W, U; Delta = U - W S; O = Q S + tril(Q K^T) Delta; S += K^T Delta
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, v.shape[-1]))
    o = np.empty(v.shape)
    for s in range(0, T, chunk_size):
        qc, kc, vc = (x[:, s:s + chunk_size].transpose(0, 2, 1, 3) for x in (q * scale, k, v))  # [B, H, C, .]
        bc = beta[:, s:s + chunk_size].transpose(0, 2, 1)                                          # [B, H, C]
        W, U = wy_representation(kc, vc, bc)
        delta = U - W @ S
        C = qc.shape[2]
        scores = np.tril(qc @ kc.swapaxes(-1, -2))
        o[:, s:s + C] = (qc @ S + scores @ delta).transpose(0, 2, 1, 3)
        S = S + kc.swapaxes(-1, -2) @ delta
    return o, S
    # END TODO
