"""Exercise 18: the backward pass of causal softmax attention, FlashAttention-2 style.

Exercise 01's forward, for one batch and head (scale folded into Q):

    S = Q K^T            s_ij = q_i . k_j           [T, T], -inf where j > i (causal)
    P = softmax_j(S)     p_ij = exp(s_ij - lse_i)   lse_i = log sum_{j <= i} exp(s_ij)   (log-sum-exp)
    O = P V              o_i = sum_j p_ij v_j       [T, V]

The backward pass gets dO = dL/dO (one row do_i per query) and returns dL/dQ, dL/dK, dL/dV. Read the
forward bottom to top; for a product Y = X Z, dX = dY Z^T and dZ = X^T dY:

    O = P V         ->  dV = P^T dO,        dP = dO V^T           dp_ij = do_i . v_j
    P = softmax(S)  ->  ds_ij = p_ij (dp_ij - sum_l p_il dp_il)   (the softmax's Jacobian, one row at a time)
    S = Q K^T       ->  dQ = dS K,          dK = dS^T Q           (times scale, for the unscaled q)

Two facts make this cheap (Dao 2023, FlashAttention-2, Algorithm 2):

1. The row sum needs no [T, T] product: sum_l p_il dp_il = sum_l p_il (do_i . v_l) = do_i . (sum_l p_il v_l)
   = do_i . o_i. So D_i = rowsum(dO * O), one dot product of two V-vectors per query, and
       dS = P * (dP - D)          (D broadcast along each row).
2. P need not be stored: keep the forward's lse_i (one number per query) and recompute
       p_ij = exp(s_ij - lse_i)   (s_ij - lse_i <= 0: no overflow, however large the scores)
   from Q and K when the backward needs it. The forward then saves O and lse only: O(T) memory, where
   storing P would cost T^2 per head.

With both, the backward can run tile by tile (`attention_backward_tiled`): for a block of keys K_j, V_j and
a block of queries Q_i (with their do_i, lse_i, D_i), recompute the tile S = Q_i K_j^T, P = exp(S - lse_i),
and add its share to every gradient:
    dV_j += P^T dO_i,    dP = dO_i V_j^T,    dS = P * (dP - D_i),    dQ_i += dS K_j,    dK_j += dS^T Q_i.
Key blocks after a query block are all masked (causal): skip them, their P is 0.

Shapes: q, k [B, T, H, K]; v, o, do [B, T, H, V]; lse [B, T, H]; scale defaults to K ** -0.5.
Check: `minilin check 18` (compares with minilin.mixers.attention's backward and with central finite
differences of <do, o>, also with scores in the hundreds; counts the lines that run, and the memory the
tiled form takes: never a [T, T] matrix).
"""
import numpy as np


def attention_forward(q, k, v, *, scale=None):
    """Exercise 01's causal attention, also returning the log-sum-exp of each query's scores.

    q, k: [B, T, H, K]; v: [B, T, H, V]; scale: a float, default K ** -0.5.
    Returns (o [B, T, H, V], lse [B, T, H]) with lse_i = log sum_{j <= i} exp(scale * q_i . k_j).

    Compute lse stably: with m_i the row max, lse_i = m_i + log sum_j exp(s_ij - m_i).
    """
    # TODO: masked scores, the row max m and the row sum l of exp(S - m); o = (P / l) V and lse = m + log l
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    scores = scale * np.einsum("bihk,bjhk->bhij", q, k)                 # [B, H, T, T]
    scores = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, scores)
    m = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - m)
    total = weights.sum(axis=-1, keepdims=True)
    o = np.einsum("bhij,bjhv->bihv", weights / total, v)
    lse = (m + np.log(total))[..., 0].transpose(0, 2, 1)               # [B, T, H]
    return o, lse
    # END TODO


def attention_backward(q, k, v, o, lse, do, *, scale=None):
    """Gradients of L = <do, o> through causal softmax attention, with the [T, T] matrices written out.

    q, k: [B, T, H, K]; v, o, do: [B, T, H, V]; lse: [B, T, H] (the forward's); scale as the forward's.
    Returns (dq [B, T, H, K], dk [B, T, H, K], dv [B, T, H, V]).

    1. S = scale Q K^T, masked; P = exp(S - lse) (no softmax again: lse gives the normalization);
    2. dV = P^T dO;  dP = dO V^T;  D_i = do_i . o_i;  dS = P * (dP - D);
    3. dQ = scale dS K,  dK = scale dS^T Q.
    """
    # TODO: recompute P from lse, then dV, dP, D = rowsum(dO * O), dS = P (dP - D), dQ and dK
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    scores = scale * np.einsum("bihk,bjhk->bhij", q, k)
    scores = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, scores)
    P = np.exp(scores - lse.transpose(0, 2, 1)[..., None])             # [B, H, T, T]
    dv = np.einsum("bhij,bihv->bjhv", P, do)
    dP = np.einsum("bihv,bjhv->bhij", do, v)
    D = np.sum(do * o, axis=-1).transpose(0, 2, 1)[..., None]          # [B, H, T, 1]
    dS = P * (dP - D)
    dq = scale * np.einsum("bhij,bjhk->bihk", dS, k)
    dk = scale * np.einsum("bhij,bihk->bjhk", dS, q)
    return dq, dk, dv
    # END TODO


def attention_backward_tiled(q, k, v, o, lse, do, *, scale=None, block_size=16):
    """The same gradients, tile by tile: no array of T x T entries, ever (module docstring).

    q, k: [B, T, H, K]; v, o, do: [B, T, H, V]; lse: [B, T, H]; block_size: C >= 1, any T (the last block
    may be short). Returns (dq, dk, dv) as attention_backward.

    Loop over key blocks j0 = 0, C, 2C, ... and, inside, over the query blocks i0 = j0, j0 + C, ... that can
    see them. Only the diagonal tile (i0 == j0) needs the causal mask inside it.
    """
    # TODO: D once; then per (key block, query block at or after it): the tile S, P, and its share of dV, dQ, dK
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    C = block_size
    Q, Kh, Vh, dO = (x.transpose(0, 2, 1, 3) for x in (q * scale, k, v, do))   # [B, H, T, .]
    L = lse.transpose(0, 2, 1)                                                   # [B, H, T]
    D = np.sum(do * o, axis=-1).transpose(0, 2, 1)                              # [B, H, T]
    dq, dk, dv = np.zeros(Q.shape), np.zeros(Kh.shape), np.zeros(Vh.shape)
    for j0 in range(0, T, C):
        kj, vj = Kh[:, :, j0:j0 + C], Vh[:, :, j0:j0 + C]
        for i0 in range(j0, T, C):
            qi, doi = Q[:, :, i0:i0 + C], dO[:, :, i0:i0 + C]
            S = qi @ kj.swapaxes(-1, -2)                                         # [B, H, Ci, Cj]
            if i0 == j0:
                rows, cols = np.arange(S.shape[-2])[:, None], np.arange(S.shape[-1])[None, :]
                S = np.where(cols > rows, -np.inf, S)
            P = np.exp(S - L[:, :, i0:i0 + C, None])
            dv[:, :, j0:j0 + C] += P.swapaxes(-1, -2) @ doi
            dS = P * (doi @ vj.swapaxes(-1, -2) - D[:, :, i0:i0 + C, None])
            dq[:, :, i0:i0 + C] += dS @ kj
            dk[:, :, j0:j0 + C] += dS.swapaxes(-1, -2) @ qi
    return tuple(np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (scale * dq, dk, dv))
    # END TODO
