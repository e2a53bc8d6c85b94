"""Exercise 13: Gated DeltaNet, recurrent and chunked (Yang, Kautz & Hatamizadeh 2025, "Gated Delta
Networks: Improving Mamba2 with Delta Rule").

Mamba-2's decay forgets everything a little; the delta rule overwrites one key precisely. Gated
DeltaNet does both, decay first, then the delta correction of the decayed memory:

    S'  = alpha_t S_{t-1},             alpha_t = exp(g_t) in (0, 1], g_t <= 0 (one per head and token)
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T  =  alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = scale * S_t^T q_t

Chunked: exercise 12 with the decay folded in. In a chunk, with G_t = g_0 + ... + g_t (chunk-local)
and S the state entering it, the memory S'_t that token t corrects is exp(G_t) S plus the earlier
corrections decayed by exp(G_t - G_j). The corrections solve

    (I + A) Delta = diag(beta) V - diag(beta) (K * exp(G)) S,    A_tj = beta_t (k_t . k_j) exp(G_t - G_j), j < t
    W = T diag(beta) (K * exp(G)),    U = T diag(beta) V,        T = (I + A)^-1,     Delta = U - W S
    O  = (Q * exp(G)) S + (Q K^T * L) Delta,                     L_ij = exp(G_i - G_j) for j <= i, else 0
    S <- exp(G_last) S + (K * exp(G_last - G))^T Delta

(row scalings: K * exp(G) multiplies row t of K by exp(G_t)). Every exponent is <= 0: exp(G_t),
exp(G_t - G_j) with j <= t, exp(G_last - G_j). Never exp(-G).

Shapes: q, k [B, T, H, K] (k unit-norm); v [B, T, H, V]; g, beta [B, T, H]; o [B, T, H, V];
S [B, H, K, V]; scale defaults to K ** -0.5. Check: `minilin check 13` (compares with
minilin.mixers.gated_deltanet, and counts the lines the chunked form runs: a loop over chunks, not tokens;
solve each chunk's triangular system with one batched solve).
"""
import numpy as np


def gated_deltanet_recurrent(q, k, v, g, beta, *, scale=None):
    """The token loop: decay S by exp(g_t), then the delta-rule write, then o_t = scale * S_t^T q_t.
    Returns (o [B, T, H, V], S_T [B, H, K, V]), from S_0 = 0."""
    raise NotImplementedError(
        "TODO: exercise 11's loop with S decayed by exp(g_t) before the prediction is read (about 10 lines)")


def gated_deltanet_chunked(q, k, v, g, beta, *, scale=None, chunk_size=64):
    """The chunked form of the module docstring; any T, chunk_size >= 1, from S = 0.
    Returns (o [B, T, H, V], S [B, H, K, V]), equal to gated_deltanet_recurrent's."""
    raise NotImplementedError(
        "TODO: per chunk in [B, H, C, .]: G, L, A, the solve for W and U, Delta, O, and the decayed state update (about 20 lines)")
