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
    Mab_tj = sum_c a_tc b_jc exp(G_{t-1,c} - G_{j,c}),   Mak likewise with k_j
(`chunking.channel_gram(..., before_decay=True)`, which also returns a_t exp(G_{t-1}), b_j exp(G_C - G_j), ...)
so, with Tinv = (I - Mab)^-1 (`chunking.unit_lower_inverse`, all chunks at once),
    U = W S + U_v,    W = Tinv (A * exp(G_prev)),    U_v = Tinv Mak V.
Only the state pass runs chunk after chunk, and each chunk's output is read inside it:
    U_n = W_n S_n + U_v,n,   S_{n+1} = exp(G_C) * S_n + (B * exp(G_C - G))^T U_n + (K * exp(G_C - G))^T V_n
    O_n = [R * exp(G) | R B^T]_n [S_n; U_n] + (R K^T, decayed, causal)_n V_n
(R B^T and R K^T decayed and causal; the last term, which does not depend on S, for all chunks at once).
Every exponential is of a sum of gates w <= 0 (never of a difference of long cumulative sums), so nothing
overflows for any w and float32 keeps its precision in long chunks.

Shapes: r, w, k, a, b [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent (the definition), chunked, step. Each returns (o, final_state).
Gradients: recurrent_backward, chunked_backward, hand-written (derived above the engine functions
`_recurrent_backward`, `_chunked_backward`), returning SIGNATURE.gradients.
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..chunking import (channel_gram, channel_gram_backward, chunk_view, chunked_output, decay_state,
                        from_chunks, reverse_cumsum, state_or_zeros, to_chunks, transposed, unit_lower_inverse)
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
    B, T, H, K = q.shape
    V, C = v.shape[-1], chunk_size
    qc, kc, ac, bc, wc = (chunk_view(u, C) for u in (q, k, a, b, w))   # [B, H, N, C, .], views
    vc = to_chunks(v, C)                            # a copy: the right operand of three products
    N = qc.shape[2]

    # Four intra-chunk matrices in one call (every x against every y, one decay). The output's R B^T and
    # R K^T (decay exp(G_t - G_j), j <= t) are written as reads before token t's decay, like Mab and Mak: for
    # j < t, exp(G_t - G_j) = exp(w_t) exp(G_{t-1} - G_j), and the diagonal j = t is added apart. So the
    # reads are a and r * exp(w_t) (w_t <= 0: no overflow), the writes b and k.
    grams = channel_gram((ac, qc * xp.exp(wc)), (bc, kc), wc, before_decay=True)
    (M_ab, M_ak), (R_b, R_k) = grams.A                                         # [B, H, N, C, C] each
    a_before, q_from_start = grams.x_from_start                                # a e^{G_{t-1}}, r e^{G_t}
    b_to_end, k_to_end = grams.y_to_end
    chunk_decay = grams.chunk_decay[..., None]                                 # [B, H, N, K, 1]
    diagonal = xp.arange(C)
    R_b[..., diagonal, diagonal] = (qc * bc).sum(-1)
    R_k[..., diagonal, diagonal] = (qc * kc).sum(-1)

    # The reads u: (I - Mab) U = (A * exp(G_prev)) S + Mak V, solved for all chunks at once.
    xp.negative(M_ab, out=M_ab)
    T_inv = unit_lower_inverse(M_ab)
    W = T_inv @ a_before                                                       # [B, H, N, C, K]
    U_v = T_inv @ (M_ak @ vc)                                                  # [B, H, N, C, V]
    # What each chunk writes through k (does not depend on S), and what it reads through R K^T.
    dS_kv = k_to_end.swapaxes(-1, -2) @ vc                                     # [B, H, N, K, V]
    o, oc = chunked_output(v, C)
    xp.matmul(R_k, vc, out=oc)

    # Chunk after chunk: U_n = W_n S_n + U_v,n; O_n += [R e^G | R B^T]_n [S_n; U_n];
    # S_{n+1} = exp(G_C) S_n + (B e^{G_C - G})_n^T U_n + dS_kv,n.
    reads = xp.concatenate([q_from_start, R_b], axis=-1)                      # [B, H, N, C, K + C]
    b_to_end_T = b_to_end.swapaxes(-1, -2)
    state_and_u = xp.empty((B, H, K + C, V), q.dtype)                          # [S_n; U_n]
    S, u = state_and_u[:, :, :K], state_and_u[:, :, K:]
    S[...] = 0 if S0 is None else S0
    read, write = xp.empty((B, H, C, V), q.dtype), xp.empty((B, H, K, V), q.dtype)
    for n in range(N):
        xp.matmul(W[:, :, n], S, out=u)
        u += U_v[:, :, n]
        xp.matmul(reads[:, :, n], state_and_u, out=read)
        oc[:, :, n] += read
        xp.matmul(b_to_end_T[:, :, n], u, out=write)
        S *= chunk_decay[:, :, n]
        S += write
        S += dS_kv[:, :, n]
    return xp.ascontiguousarray(o[:, :T]), S.copy()


# ----------------------------------------------------------------------------------------------------------
# Backward passes: the gradients of L = <dO, O> + <dS, S_final> with respect to (q, w, k, v, a, b, S0), on
# checked inputs with q = scale * r (the public functions below apply the scale's chain rule).
# ----------------------------------------------------------------------------------------------------------

# Tokens between two stored states in `_recurrent_backward`.
CHECKPOINT_EVERY = 64


def _update(w, k, v, a, b, S):
    """The state update alone: S_new = exp(w) * S + b (a^T S) + k v^T."""
    read = (a[..., None, :] @ S)[..., 0, :]
    return decay_state(S, w) + b[..., :, None] * read[..., None, :] + k[..., :, None] * v[..., None, :]


def _recurrent_backward(q, w, k, v, a, b, S0, do, dS, checkpoint_every=CHECKPOINT_EVERY):
    """The definition run backwards in time. Returns (dq, dw, dk, dv, da, db, dS0); dS0 None when S0 is.

    One token of the forward and the adjoint of each line (read bottom to top), D_t = Diag(exp(w_t)):

        u   = S_{t-1}^T a_t                          da_t = S_{t-1} du,  dS_{t-1} = D_t dS_t + a_t du^T
        S_t = D_t S_{t-1} + b_t u^T + k_t v_t^T      dw_t = sum_v dS_t * (D_t S_{t-1})   (per key channel)
                                                     db_t = dS_t u,      du = dS_t^T b_t
                                                     dk_t = dS_t v_t,    dv_t = dS_t^T k_t
        o_t = S_t^T q_t                              dS_t += q_t do_t^T, dq_t = S_t do_t

    dS_t on entry is the adjoint of S_t from the future (dS at t = T). The states are not stored: the
    forward pass keeps one every `checkpoint_every` tokens and the backward pass recomputes one segment
    at a time from its checkpoint (T / C + C states held), as `_delta_rule.recurrent_backward` does.
    """
    xp = array_module(q)
    T = q.shape[1]
    C = max(1, int(checkpoint_every))
    checkpoints = []
    S = state_or_zeros(S0, q[:, 0], v[:, 0])
    for t in range(T):
        if t % C == 0:
            checkpoints.append(S)
        S = _update(w[:, t], k[:, t], v[:, t], a[:, t], b[:, t], S)

    dq, dw, dk, dv, da, db = (xp.empty_like(x) for x in (q, w, k, v, a, b))
    dS_t = xp.zeros_like(S) if dS is None else dS.astype(S.dtype, copy=True)
    for segment in reversed(range(len(checkpoints))):
        start, stop = segment * C, min(T, (segment + 1) * C)
        before = [checkpoints[segment]]                      # before[i] = S_{start + i - 1}
        for t in range(start, stop - 1):
            before.append(_update(w[:, t], k[:, t], v[:, t], a[:, t], b[:, t], before[-1]))
        for t in reversed(range(start, stop)):
            S_prev = before[t - start]
            a_t, b_t, k_t, v_t = a[:, t], b[:, t], k[:, t], v[:, t]
            read = (a_t[..., None, :] @ S_prev)[..., 0, :]                  # u = S_{t-1}^T a_t
            S_decayed = decay_state(S_prev, w[:, t])
            S_t = S_decayed + b_t[..., :, None] * read[..., None, :] + k_t[..., :, None] * v_t[..., None, :]
            dS_t += q[:, t][..., :, None] * do[:, t][..., None, :]
            dq[:, t] = (S_t @ do[:, t][..., :, None])[..., 0]
            db[:, t] = (dS_t @ read[..., :, None])[..., 0]
            d_read = (b_t[..., None, :] @ dS_t)[..., 0, :]                  # du = dS_t^T b_t
            dk[:, t] = (dS_t @ v_t[..., :, None])[..., 0]
            dv[:, t] = (k_t[..., None, :] @ dS_t)[..., 0, :]
            dw[:, t] = (dS_t * S_decayed).sum(-1)
            da[:, t] = (S_prev @ d_read[..., :, None])[..., 0]
            dS_t = decay_state(dS_t, w[:, t]) + a_t[..., :, None] * d_read[..., None, :]
    return dq, dw, dk, dv, da, db, (None if S0 is None else dS_t)


def _chunked_backward(q, w, k, v, a, b, S0, do, dS, chunk_size):
    """The chunked form's backward, chunk-parallel (the structure of `_delta_rule.chunked_backward`).
    Returns (dq, dw, dk, dv, da, db, dS0).

    Per chunk, with the module docstring's names, E = exp(G), E_prev = exp(G_{t-1}), E_end = exp(G_C - G)
    scaling rows, S the state entering the chunk and S+ the state leaving it:

        (1) Mab = gbd(A, B), Mak = gbd(A, K) (strict),  Rb = gram(Q, B), Rk = gram(Q, K) (causal)
        (2) Tinv = (I - Mab)^-1
        (3) U = Tinv rhs,   rhs = (A * E_prev) S + Mak V                      } sequential over chunks
        (4) S+ = exp(G_C) S + (B * E_end)^T U + (K * E_end)^T V                }
        (5) O = (Q * E) S + Rb U + Rk V

    (gbd = `chunking.gram_before_decay`, exp(G_{t-1} - G_j) in entry (t, j); gram = `chunking.gated_gram`.)
    Step 0 recomputes (1)-(4) (nothing is kept from the forward call), holding S at every chunk boundary
    and U per chunk. Step 1, the state adjoint chunk by chunk backwards, holding dS+ and X likewise:
        dU = Rb^T dO + (B * E_end) dS+
        X  = Tinv^T dU                           (the transposed solve: drhs = X)
        dS = exp(G_C) dS+ + (Q * E)^T dO + (A * E_prev)^T X = exp(G_C) dS+ + [Q * E; A * E_prev]^T [dO; X]
    Step 2, all chunks at once:
        from (5):  d(Q * E) = dO S^T,  dRb = dO U^T,  dRk = dO V^T (causal),  dV = Rk^T dO
        from (4):  d(B * E_end) = U dS+^T,  d(K * E_end) = V dS+^T,  dV += (K * E_end) dS+,
                   dG_C += sum_v dS+ * exp(G_C) S
        from (3):  d(A * E_prev) = X S^T,  dMak = X V^T (strict),  dV += Mak^T X
        from (2):  (I - Mab) U = rhs, so (the solve's adjoint) dMab = +X U^T (strict)
        from (1):  `chunking.channel_gram_backward`, the four grams at once, gives dQ, dA, dB, dK.
    ([dO; X] is stacked: [dRb; dMab] = [dO; X] U^T and [dRk; dMak] = [dO; X] V^T are one product each.)
    The gate, as in the delta rule: Q's rows carry exp(+G_t), A's exp(+G_{t-1}), B's and K's exp(-G_j),
    and the chunk end exp(+G_C), so with every total gradient
        dG_t = Q_t * dQ_t + A_{t+1} * dA_{t+1} - B_t * dB_t - K_t * dK_t
        dG_C += sum_t (B * E_end)_t * d(B * E_end)_t + (K * E_end)_t * d(K * E_end)_t + sum_v dS+ * exp(G_C) S
    and dw_s = sum_{t >= s} dG_t inside the chunk: a reverse cumulative sum; no exponential of a positive.
    """
    xp = array_module(q)
    T, C = q.shape[1], chunk_size
    qc, kc, ac, bc, wc = (chunk_view(x, C) for x in (q, k, a, b, w))   # [B, H, N, C, .], views
    vc = to_chunks(v, C)                                                 # a copy: the right operand of products
    Bn, H, N, _, K = qc.shape
    V, dtype = vc.shape[-1], qc.dtype

    # Step 0: recompute (1)-(4). The four grams in one `channel_gram` call, as the forward builds them: reads
    # before token t's decay for all four, with Q' = Q * exp(w) for Rb, Rk (exp(G_t - G_j) = exp(w_t)
    # exp(G_{t-1} - G_j) for j < t) and their diagonals added apart. The call also gives the decayed rows
    # A * E_prev, Q * E, B * E_end, K * E_end and exp(G_C), as products of per-token decays.
    q_read = qc * xp.exp(wc)                                             # Q'
    grams = channel_gram((ac, q_read), (bc, kc), wc, before_decay=True)
    (M_ab, M_ak), (R_b, R_k) = grams.A                                   # [B, H, N, C, C] each
    b_to_end, k_to_end = grams.y_to_end
    decay_end = grams.chunk_decay[..., None]                             # exp(G_C) on the state's rows
    diagonal = xp.arange(C)
    R_b[..., diagonal, diagonal] = (qc * bc).sum(-1)
    R_k[..., diagonal, diagonal] = (qc * kc).sum(-1)
    rows_decayed = xp.empty((Bn, H, N, 2 * C, K), dtype)                 # [Q * E; A * E_prev] [.., 2C, K]
    rows_decayed[..., :C, :], rows_decayed[..., C:, :] = grams.x_from_start[1], grams.x_from_start[0]
    del grams
    T_inv = unit_lower_inverse(-M_ab)
    M_ak_V = M_ak @ vc
    written_kv = k_to_end.swapaxes(-1, -2) @ vc                          # (K * E_end)^T V
    S_in = xp.empty((Bn, H, N + 1, K, V), dtype)
    S_in[:, :, 0] = 0 if S0 is None else S0
    U = xp.empty((Bn, H, N, C, V), dtype)
    for n in range(N):
        S = S_in[:, :, n]
        rhs = rows_decayed[:, :, n, C:] @ S + M_ak_V[:, :, n]
        xp.matmul(T_inv[:, :, n], rhs, out=U[:, :, n])
        S_next = S_in[:, :, n + 1]
        xp.matmul(b_to_end[:, :, n].swapaxes(-1, -2), U[:, :, n], out=S_next)
        S_next += S * decay_end[:, :, n] + written_kv[:, :, n]
    del M_ak_V, written_kv

    # Step 1: the state adjoint, backwards over chunks.
    left = xp.empty((Bn, H, N, 2 * C, V), dtype)                         # [dO; X]
    left[..., :C, :] = chunk_view(do, C)
    doc = left[..., :C, :]
    R_b_T_do = R_b.swapaxes(-1, -2) @ doc
    dS_out = xp.empty((Bn, H, N + 1, K, V), dtype)
    dS_out[:, :, N] = 0 if dS is None else dS
    for n in reversed(range(N)):
        dS_next = dS_out[:, :, n + 1]
        dU = R_b_T_do[:, :, n] + b_to_end[:, :, n] @ dS_next
        xp.matmul(T_inv[:, :, n].swapaxes(-1, -2), dU, out=left[:, :, n, C:])   # X = Tinv^T dU
        dS_here = dS_out[:, :, n]
        xp.matmul(rows_decayed[:, :, n].swapaxes(-1, -2), left[:, :, n], out=dS_here)
        dS_here += dS_next * decay_end[:, :, n]
    del R_b_T_do, T_inv
    dS0 = None if S0 is None else dS_out[:, :, 0].copy()
    S_in, dS_out = S_in[:, :, :N], dS_out[:, :, 1:]
    X = left[..., C:, :]

    # Step 2: the intra-chunk gradients, all chunks at once.
    by_state = left @ transposed(S_in)                                   # [d(Q * E); d(A * E_prev)]
    d_by_U = left @ transposed(U)                                        # [dRb; dMab]
    d_by_V = left @ transposed(vc)                                       # [dRk; dMak]
    dS_out_T = transposed(dS_out)
    d_b_to_end, d_k_to_end = U @ dS_out_T, vc @ dS_out_T
    dvc = (R_k.swapaxes(-1, -2) @ doc + M_ak.swapaxes(-1, -2) @ X + k_to_end @ dS_out)
    at_end = ((dS_out * (S_in * decay_end)).sum(-1)
              + (b_to_end * d_b_to_end).sum(-2) + (k_to_end * d_k_to_end).sum(-2))   # [B, H, N, K]
    del S_in, U, dS_out, dS_out_T, M_ak, R_b, R_k, rows_decayed

    # (1)'s backward, the four grams in one call as in step 0, [[dMab, dMak], [dRb, dRk]] against
    # x = (A, Q'), y = (B, K) (strictly below the diagonal; the diagonals of Rb and Rk follow apart).
    d_grams = xp.stack([xp.stack([d_by_U[..., C:, :], d_by_V[..., C:, :]]),
                        xp.stack([d_by_U[..., :C, :], d_by_V[..., :C, :]])])   # [2, 2, B, H, N, C, C]
    (dac, dq_read), (dbc, dkc) = channel_gram_backward(
        d_grams, (ac, q_read), (bc, kc), wc, before_decay=True,
        dx_from_start=(by_state[..., C:, :], by_state[..., :C, :]), dy_to_end=(d_b_to_end, d_k_to_end))[:2]
    del d_grams, d_b_to_end, d_k_to_end, by_state

    # The gate, as in the delta rule: the reads A and Q' carry exp(+G_{t-1}), B and K exp(-G_j), the chunk
    # end exp(+G_C); Q' = Q * exp(w) carries w_t itself once more:
    #     dG_t = A_{t+1} dA_{t+1} + Q'_{t+1} dQ'_{t+1} - B_t dB_t - K_t dK_t   (+ at_end at t = C)
    #     dw_s = sum_{t >= s} dG_t + Q'_s dQ'_s.
    q_terms = q_read * dq_read
    dG = xp.empty_like(dac)
    dG[..., :-1, :] = (ac * dac)[..., 1:, :] + q_terms[..., 1:, :]
    dG[..., -1, :] = 0
    dG -= bc * dbc
    dG -= kc * dkc
    dG[:, :, :, -1] += at_end
    reverse_cumsum(dG, 3, in_place=True)
    dG += q_terms
    dw = from_chunks(dG, T)
    # Q' = Q * exp(w), and the diagonals of Rb, Rk: dQ_t += dRb_tt B_t + dRk_tt K_t, dB_t, dK_t += ... Q_t.
    dqc = dq_read * xp.exp(wc)
    dRb_tt = d_by_U[..., :C, :][..., diagonal, diagonal][..., None]
    dRk_tt = d_by_V[..., :C, :][..., diagonal, diagonal][..., None]
    dqc += dRb_tt * bc + dRk_tt * kc
    dbc += dRb_tt * qc
    dkc += dRk_tt * qc
    return (from_chunks(dqc, T), dw, from_chunks(dkc, T), from_chunks(dvc, T), from_chunks(dac, T),
            from_chunks(dbc, T), dS0)


def _backward(engine, r, w, k, v, a, b, do, dstate, scale, initial_state, chunk_size=None):
    x, q = _checked(r, w, k, v, a, b, scale, initial_state)
    do, dstate = SIGNATURE.check_cotangents(x, do, dstate)
    inputs = (q, x.w, x.k, x.v, x.a, x.b, x.state, do, dstate)
    if engine is _chunked_backward:
        grads = engine(*inputs, check_chunk_size(chunk_size, x.shapes["T"]))
    else:
        grads = engine(*inputs)
    dq, dw, dk, dv, da, db, dS0 = grads
    # q = scale * r
    return SIGNATURE.gradients("rwkv7")(dq * check_scale(scale, x.shapes["K"]), dw, dk, dv, da, db, dS0)


def recurrent_backward(r, w, k, v, a, b, *, do, dstate=None, scale=None, initial_state=None):
    """Gradients of L = <do, o> + <dstate, final_state> through `recurrent`, the definition run backwards
    (`_recurrent_backward`). do [B, T, H, V]; dstate [B, H, K, V] or None (zeros). Returns
    SIGNATURE.gradients("rwkv7"): dr, dw, dk, dv, da, db, dinitial_state (None when initial_state is)."""
    return _backward(_recurrent_backward, r, w, k, v, a, b, do, dstate, scale, initial_state)


def chunked_backward(r, w, k, v, a, b, *, do, dstate=None, scale=None, initial_state=None, chunk_size=64):
    """Gradients through `chunked`, chunk-parallel through its triangular solve (`_chunked_backward`);
    arguments and result as `recurrent_backward`, plus chunk_size (clamped to T)."""
    return _backward(_chunked_backward, r, w, k, v, a, b, do, dstate, scale, initial_state, chunk_size)

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
