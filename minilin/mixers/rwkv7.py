"""RWKV-7 "Goose" time mixing (Peng, Zhang, Goldstein, Alcaide, Du, Hou, Lin, Liu, Lu, Merrill et al.
2025, "RWKV-7 "Goose" with Expressive Dynamic State Evolution"): the generalized delta rule, a
diagonal decay plus a rank-one transition, in the [K, V] state layout of CONVENTIONS.md.

    S_t = (Diag(exp(w_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T         S: [K, V]
    o_t = S_t^T (scale r_t)

`a` reads the state (a_t^T S_{t-1}, a row of V numbers), `b` writes that read back as a correction.

Paper symbols -> code. The paper keeps the transposed state, wkv [V, K], and writes
    wkv_t = wkv_{t-1} (diag(w_t) - kappa_t^T (alpha_t * kappa_t)) + v_t^T k~_t
with kappa_t the normalized removal key, alpha_t the in-context learning rate, k~_t the written key,
w_t = exp(-e^{-1/2} sigmoid(.)) the decay. Transposing to S = wkv^T gives the form above with
    w = log w_t (log space, <= 0),  a = -kappa_t,  b = kappa_t * alpha_t,  k = k~_t,  r = r_t,
the same mapping FLA's chunk_rwkv7 feeds its generalized (DPLR) delta rule kernel. With w = 0,
a = k, b = -beta k and the written key beta k it is DeltaNet's (I - beta k k^T) S + beta k v^T.
The argument order follows FLA's chunk_rwkv7 (r, w, k, v, a, b). RWKV-7 uses scale = 1 (FLA's default
there); the default here is K ** -0.5 as for every mixer (CONVENTIONS.md): pass scale=1.0 for the
paper's numbers. The bonus term (r . (rho * k)) v of RWKV-7 sits outside the state update, in the
layer, and is left out.

Chunked form (WY-style, derived here). Inside a chunk with state S entering it, G the chunk-local
cumulative log-decay (per key channel) and G_{t-1} its exclusive version (G_{-1} = 0), name the read
u_t = a_t^T S_{t-1} (a row of V numbers). Then S_t = Diag(exp(w_t)) S_{t-1} + b_t u_t^T + k_t v_t^T is
a plain per-channel-gated recurrence with two writes, which unrolls to
    S_t = exp(G_t) * S + sum_{j <= t} exp(G_t - G_j) * (b_j u_j^T + k_j v_j^T)          (rows scaled)
Reading it with a_t one token earlier gives a unit lower-triangular system for all u of the chunk:
    u_t = (a_t * exp(G_{t-1}))^T S + sum_{j < t} Mab_tj u_j + sum_{j < t} Mak_tj v_j,
    Mab_tj = sum_c a_tc b_jc exp(G_{t-1,c} - G_{j,c}),   Mak likewise with k_j     (`gram_before_decay`)
so, with Tinv = (I - Mab)^-1 (`chunking.unit_lower_inverse`, all chunks at once),
    U = W S + U_v,    W = Tinv (A * exp(G_prev)),    U_v = Tinv Mak V.
Only the state pass runs chunk after chunk:
    U_n = W_n S_n + U_v,n,   S_{n+1} = exp(G_C) * S_n + (B * exp(G_C - G))^T U_n + (K * exp(G_C - G))^T V_n
and then every chunk's output at once:
    O_n = (R * exp(G)) S_n + (R B^T, decayed, causal) U_n + (R K^T, decayed, causal) V_n.
Every exponent is a non-positive difference of cumulative gates, so nothing overflows for any w.

Shapes: r, w, k, a, b [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent (the definition), chunked, step. Each returns (o, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..chunking import (decay_rows, decay_state, exclusive_cumsum, from_chunks, gram_before_decay, local_cumsum,
                        state_or_zeros, to_chunks, unit_lower_inverse)
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_log_gate, check_scale

SIGNATURE = Signature(
    inputs=(Tensor("r", "B T H K"), Tensor("w", "B T H K", gate=True), Tensor("k", "B T H K"),
            Tensor("v", "B T H V"), Tensor("a", "B T H K"), Tensor("b", "B T H K")),
    output="B T H V", state="B H K V")


def _checked(r, w, k, v, a, b, scale, state, step=False):
    """Checked inputs and the query q = scale * r."""
    x = SIGNATURE.check(r, w, k, v, a, b, state=state, step=step)
    check_log_gate("w", x.w)
    return x, x.r * check_scale(scale, x.shapes["K"])


def _step(q, w, k, v, a, b, S):
    """One token on checked inputs: q, w, k, a, b [B, H, K], v [B, H, V], S [B, H, K, V] or None."""
    S = state_or_zeros(S, q, v)
    read = (a[..., None, :] @ S)[..., 0, :]                     # a_t^T S_{t-1}: [B, H, V]
    S = decay_state(S, w) + b[..., :, None] * read[..., None, :] + k[..., :, None] * v[..., None, :]
    return (q[..., None, :] @ S)[..., 0, :], S


def step(r, w, k, v, a, b, *, state=None, scale=None):
    """One decoding step: r, w, k, a, b [B, H, K], v [B, H, V] -> (o_t [B, H, V], new state)."""
    x, q = _checked(r, w, k, v, a, b, scale, state, step=True)
    return _step(q, x.w, x.k, x.v, x.a, x.b, x.state)


def recurrent(r, w, k, v, a, b, *, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    x, q = _checked(r, w, k, v, a, b, scale, initial_state)
    w, k, v, a, b, S = x.w, x.k, x.v, x.a, x.b, x.state
    o = array_module(q).empty(v.shape, q.dtype)
    for t in range(q.shape[1]):
        o[:, t], S = _step(q[:, t], w[:, t], k[:, t], v[:, t], a[:, t], b[:, t], S)
    return o, S


def chunked(r, w, k, v, a, b, *, scale=None, initial_state=None, chunk_size=64):
    """WY-style chunked form (module docstring), finite for any w; any T, chunk_size > 0 (clamped to T)."""
    x, q = _checked(r, w, k, v, a, b, scale, initial_state)
    chunk_size = check_chunk_size(chunk_size, x.shapes["T"])
    w, k, v, a, b, S0 = x.w, x.k, x.v, x.a, x.b, x.state
    xp = array_module(q)
    T = q.shape[1]
    qc, kc, vc, ac, bc = (to_chunks(x, chunk_size) for x in (q, k, v, a, b))   # [B, H, N, C, .]
    wc = to_chunks(w, chunk_size)
    G = local_cumsum(wc)                                                       # [B, H, N, C, K]
    G_last = G[:, :, :, -1]
    to_end = G_last[:, :, :, None] - G                                         # G_C - G_j <= 0

    # Four intra-chunk matrices in two calls. The output's R B^T and R K^T (decay exp(G_t - G_j), j <= t)
    # are written as reads before token t's decay, like Mab and Mak: for j < t,
    # exp(G_t - G_j) = exp(w_t) exp(G_{t-1} - G_j), and the diagonal j = t is added apart. So each call
    # stacks a and r * exp(w_t) (w_t <= 0: no overflow) against one of b, k.
    x = xp.stack([ac, qc * xp.exp(wc)])
    M_ab, R_b = gram_before_decay(x, bc, G)                                    # [B, H, N, C, C] each
    M_ak, R_k = gram_before_decay(x, kc, G)
    diagonal = xp.arange(chunk_size)
    R_b[..., diagonal, diagonal] = (qc * bc).sum(-1)
    R_k[..., diagonal, diagonal] = (qc * kc).sum(-1)

    # The reads u: (I - Mab) U = (A * exp(G_prev)) S + Mak V, solved for all chunks at once.
    T_inv = unit_lower_inverse(-M_ab)
    W = T_inv @ decay_rows(ac, exclusive_cumsum(G))                            # [B, H, N, C, K]
    U_v = T_inv @ (M_ak @ vc)                                                  # [B, H, N, C, V]

    # What each chunk writes through b (depends on S) and through k (does not).
    b_to_end_T = xp.ascontiguousarray(decay_rows(bc, to_end).swapaxes(-1, -2))  # [B, H, N, K, C]
    dS_kv = decay_rows(kc, to_end).swapaxes(-1, -2) @ vc                        # [B, H, N, K, V]

    S = state_or_zeros(S0, q[:, 0], v[:, 0])
    S_in, U = xp.empty(dS_kv.shape, S.dtype), xp.empty_like(U_v)
    for n in range(qc.shape[2]):
        S_in[:, :, n] = S
        U[:, :, n] = W[:, :, n] @ S + U_v[:, :, n]
        S = decay_state(S, G_last[:, :, n]) + b_to_end_T[:, :, n] @ U[:, :, n] + dS_kv[:, :, n]

    o = decay_rows(qc, G) @ S_in + R_b @ U + R_k @ vc
    return from_chunks(o, T), S


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs built the way RWKV-7 builds them: a = -kappa, b = kappa * alpha with kappa a
    unit removal key and alpha in [0, 1] the in-context learning rate; w in RWKV-7's decay range
    log w in (-e^{-1/2}, 0) ~ (-0.61, 0); k a unit key (the transition then has norm <= 1). Returns
    (args, kwargs)."""
    rng = examples.generator(seed)
    r = examples.normal(rng, (B, T, H, K), dtype, xp)
    w = examples.log_gates(rng, (B, T, H, K), dtype, xp, low=-np.exp(-0.5), high=-0.01)
    k = examples.unit_vectors(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    kappa = examples.unit_vectors(rng, (B, T, H, K), np.float64, np)
    alpha = rng.uniform(0, 1, (B, T, H, K))
    a = xp.asarray(-kappa, dtype=dtype)
    b = xp.asarray(kappa * alpha, dtype=dtype)
    return (r, w, k, v, a, b), {}
