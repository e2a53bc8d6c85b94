"""Exercise 10: Gated Linear Attention, chunked in log space without overflow (Yang et al. 2024).

GLA gives every key channel its own data-dependent forget gate alpha_t = exp(g_t), g_t <= 0 in [K]:

    S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T,        o_t = scale * S_t^T q_t,        S: [K, V]

Unrolled inside a chunk, with G_i = g_0 + ... + g_i the chunk-local cumulative gate (a vector in [K],
non-increasing) and S the state entering the chunk:

    o_i = sum_{j <= i} (sum_k q_ik k_jk exp(G_ik - G_jk)) v_j  +  (q_i * exp(G_i))^T S
    S  <- Diag(exp(G_last)) S + sum_j (k_j * exp(G_last - G_j)) v_j^T

The trap: the decay differs per channel, so the intra-chunk matrix is not (Q K^T) * L for one mask L.
Writing it as (Q * exp(G)) (K * exp(-G))^T gets one matrix product, but exp(-G) overflows as soon as the
gates are strong: G reaches -1000 within a chunk and exp(1000) = inf (float32 overflows already at
exp(89)). Keep every exponent non-positive: exp(G_i - G_j) for j <= i only (set the exponent to -inf
above the diagonal before exp, not after), exp(G_i) for the read, exp(G_last - G_j) for the write.
Here that means a [C, C, K] tensor of decays per chunk, batch and head (FLA's kernels split the chunk
into sub-blocks to avoid even that; minilin.chunking.gated_gram shows how).

Shapes: q, k, g [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; S [B, H, K, V]; scale defaults to K ** -0.5.
Check: `minilin check 10` (compares with minilin.mixers.gla, with gates strong enough to overflow exp(-G), and
counts the lines the chunked form runs: a loop over chunks, not tokens).
"""
import numpy as np


def gla_recurrent(q, k, v, g, *, scale=None):
    """The token loop S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = scale * S_t^T q_t, S_0 = 0.
    Returns (o [B, T, H, V], S_T [B, H, K, V])."""
    # TODO: exercise 06's loop with a decay per key channel: exp(g_t)[..., None] scales the rows of S
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, v.shape[-1]))
    o = np.empty(v.shape)
    for t in range(T):
        S = np.exp(g[:, t])[..., None] * S + np.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        o[:, t] = scale * np.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, S
    # END TODO


def gla_chunked(q, k, v, g, *, scale=None, chunk_size=64):
    """The chunked form of the module docstring, finite for any gate g <= 0; any T, chunk_size >= 1.
    Returns (o [B, T, H, V], S [B, H, K, V]), equal to gla_recurrent's."""
    # TODO: per chunk: G = cumsum(g), the [C, C, K] decays exp(G_i - G_j) masked in the exponent, intra + read + write
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, v.shape[-1]))
    o = np.empty(v.shape)
    for s in range(0, T, chunk_size):
        qc, kc, vc = (x[:, s:s + chunk_size] for x in (q * scale, k, v))
        G = np.cumsum(g[:, s:s + chunk_size], axis=1)                   # [B, C, H, K]
        C = G.shape[1]
        below = np.tril(np.ones((C, C), dtype=bool))[None, :, :, None, None]
        exponent = np.where(below, G[:, :, None] - G[:, None, :], -np.inf)  # [B, C(i), C(j), H, K]
        scores = np.einsum("bihk,bjhk,bijhk->bhij", qc, kc, np.exp(exponent))
        o[:, s:s + C] = (np.einsum("bhij,bjhv->bihv", scores, vc)
                         + np.einsum("bihk,bhkv->bihv", qc * np.exp(G), S))
        G_last = G[:, -1]                                               # [B, H, K]
        S = np.exp(G_last)[..., None] * S + np.einsum("bjhk,bjhv->bhkv", kc * np.exp(G_last[:, None] - G), vc)
    return o, S
    # END TODO
