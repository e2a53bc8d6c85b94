"""RWKV-6 "Finch" time mixing (Peng, Goldstein, Anthony, Albalak, Alcaide, Biderman et al. 2024, "Eagle
and Finch: RWKV with Matrix-Valued States and Dynamic Recurrence"): a per-channel, data-dependent
decay, and a bonus u for the current token.

    o_t = (S_{t-1} + Diag(u) k_t v_t^T)^T (scale r_t)       read the memory *before* this token, plus a bonus
    S_t = Diag(exp(w_t)) S_{t-1} + k_t v_t^T                 then decay and write             S: [K, V]

Paper symbols -> code: r = receptance (the query), k, v = key, value, w_t = the data-dependent decay,
here in log space (the paper's decay factor is exp(-exp(w_raw)); w = -exp(w_raw) <= 0, as FLA's rwkv6
takes it), u = the bonus ("time_first") per head and key channel, wkv state -> S. RWKV-6 itself uses
scale = 1; the default here is K ** -0.5 as for every mixer (CONVENTIONS.md; FLA's chunk_rwkv6 does the
same). Pass scale=1.0 for the paper's numbers.

It is GLA (`gla`) except that the output reads S_{t-1} instead of S_t: token t sees itself only
through the bonus u, never through the memory. In the chunked form this makes the intra-chunk part
strictly causal, and each query is decayed from the chunk's start to the token *before* it:
    o_i = (r_i * exp(G_{i-1}))^T S_n                                           inter-chunk (state S_n)
        + sum_{j < i} (sum_k r_ik k_jk exp(G_{i-1,k} - G_{j,k})) v_j            intra-chunk, strict
        + (r_i . (u * k_i)) v_i                                                 bonus diagonal
with G the chunk-local cumulative gate and G_{-1} = 0. Every exponent is a non-positive difference
(j < i implies G_{i-1} <= G_j), so the form stays finite for any gate. The state passing is GLA's.

Shapes: r, k [B, T, H, K]; v [B, T, H, V]; w [B, T, H, K]; u [H, K]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent (the definition), chunked, parallel, step. Each returns (o, final_state).
Gradients: recurrent_backward, chunked_backward, parallel_backward (du for the bonus included).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..chunking import (channel_gram, channel_gram_backward, chunk_view, chunked_output, decay_state,
                        output_rows, pass_states_backward, read_and_pass, reverse_cumsum, state_or_zeros,
                        row_dot, states_after_chunks, to_chunks_transposed)
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_log_gate, check_scale
from ._gated_linear import states_backwards

SIGNATURE = Signature(
    inputs=(Tensor("r", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V"),
            Tensor("w", "B T H K", gate=True), Tensor("u", "H K")),
    output="B T H V", state="B H K V")


def _checked(r, k, v, w, u, scale, state, step=False):
    """Checked inputs and the query q = scale * r."""
    a = SIGNATURE.check(r, k, v, w, u, state=state, step=step)
    check_log_gate("w", a.w)
    return a, a.r * check_scale(scale, a.shapes["K"])


def _step(q, k, v, w, u, S):
    """One token on checked inputs: q, k, w [B, H, K], v [B, H, V], u [H, K], S [B, H, K, V] or None."""
    S = state_or_zeros(S, q, v)
    bonus = (q * u * k).sum(-1, keepdims=True) * v           # (q . (u * k)) v: Diag(u) k v^T read by q
    o = (q[..., None, :] @ S)[..., 0, :] + bonus              # S_{t-1}^T q
    return o, decay_state(S, w) + k[..., :, None] * v[..., None, :]


def step(r, k, v, w, u, *, state=None, scale=None):
    """One decoding step: r, k, w [B, H, K], v [B, H, V] -> (o_t [B, H, V], new state [B, H, K, V])."""
    a, q = _checked(r, k, v, w, u, scale, state, step=True)
    return _step(q, a.k, a.v, a.w, a.u, a.state)


def recurrent(r, k, v, w, u, *, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    a, q = _checked(r, k, v, w, u, scale, initial_state)
    k, v, w, u, S = a.k, a.v, a.w, a.u, a.state
    o = array_module(q).empty(v.shape, q.dtype)
    for t in range(q.shape[1]):
        o[:, t], S = _step(q[:, t], k[:, t], v[:, t], w[:, t], u, S)
    return o, S


def chunked(r, k, v, w, u, *, scale=None, initial_state=None, chunk_size=64):
    """Chunked form (see the module docstring), finite for any gate; any T, chunk_size > 0 (clamped to T)."""
    a, q = _checked(r, k, v, w, u, scale, initial_state)
    return _chunked(q, a.k, a.v, a.w, a.u, a.state, check_chunk_size(chunk_size, a.shapes["T"]))


def parallel(r, k, v, w, u, *, scale=None, initial_state=None):
    """Quadratic form: the chunked form with one chunk holding the whole sequence."""
    a, q = _checked(r, k, v, w, u, scale, initial_state)
    return _chunked(q, a.k, a.v, a.w, a.u, a.state, q.shape[1])


def _chunked(q, k, v, w, u, S0, chunk_size):
    """The chunked form on checked inputs: GLA's pieces with the reads taken before each token's decay
    (`chunking.channel_gram(..., before_decay=True)`: the strictly causal scores and q_i exp(G_{i-1})), the
    bonus on the scores' diagonal, A_ii = q_i . (u * k_i), then `chunking.read_and_pass`."""
    C = chunk_size
    qc, kc = chunk_view(q, C), chunk_view(k, C)                          # [B, H, N, C, K], views
    A, q_before, k_to_end, chunk_decay = channel_gram(qc, kc, chunk_view(w, C), before_decay=True)
    diagonal = array_module(q).arange(A.shape[-1])
    A[..., diagonal, diagonal] = (qc * u[:, None, None] * kc).sum(-1)   # the bonus, [B, H, N, C]
    return read_and_pass(A, q_before, k_to_end.swapaxes(-1, -2), chunk_decay, v, S0, C)


def _backward(form, r, k, v, w, u, scale, initial_state, do, dstate, chunk_size=None):
    """Check, run this module's backward (`_recurrent_backward` or `_chunked_backward`, below) on
    q = scale * r, and undo the scale: dr = scale * dq."""
    a, q = _checked(r, k, v, w, u, scale, initial_state)
    do, dstate = SIGNATURE.check_cotangents(a, do, dstate)
    if form == "recurrent":
        dq, dk, dv, dw, du, dS0 = _recurrent_backward(q, a.k, a.v, a.w, a.u, a.state, do, dstate)
    else:
        C = a.shapes["T"] if form == "parallel" else check_chunk_size(chunk_size, a.shapes["T"])
        dq, dk, dv, dw, du, dS0 = _chunked_backward(q, a.k, a.v, a.w, a.u, a.state, do, dstate, C)
    dq *= check_scale(scale, a.shapes["K"])  # a fresh array
    return SIGNATURE.gradients("rwkv6")(dq, dk, dv, dw, du, dS0)


def recurrent_backward(r, k, v, w, u, *, do, dstate=None, scale=None, initial_state=None):
    """Gradients of L = <do, o> + <dstate, final state> (dstate None = zeros) by the recurrence run
    backwards. do [B, T, H, V], dstate [B, H, K, V]. Returns (dr, dk, dv, dw, du, dinitial_state),
    named; dinitial_state is None when no initial_state was given."""
    return _backward("recurrent", r, k, v, w, u, scale, initial_state, do, dstate)


def chunked_backward(r, k, v, w, u, *, do, dstate=None, scale=None, initial_state=None, chunk_size=64):
    """The same gradients as `recurrent_backward`, chunk-parallel and finite for any gate."""
    return _backward("chunked", r, k, v, w, u, scale, initial_state, do, dstate, chunk_size)


def parallel_backward(r, k, v, w, u, *, do, dstate=None, scale=None, initial_state=None):
    """The same gradients, through the quadratic form (the chunked backward with one chunk)."""
    return _backward("parallel", r, k, v, w, u, scale, initial_state, do, dstate)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    r = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    w = examples.log_gates(rng, (B, T, H, K), dtype, xp)
    u = examples.normal(rng, (H, K), dtype, xp)
    return (r, k, v, w, u), {}


def _recurrent_backward(q, k, v, w, u, S0, do, dS):
    """The definition run backwards on checked inputs (q = scale * r): (dq, dk, dv, dw, du, dS0).

    The read comes before the write: o_t = S_{t-1}^T q_t + (q_t . (u * k_t)) v_t, then
    S_t = Diag(exp(w_t)) S_{t-1} + k_t v_t^T. With Sbar_t = dL/dS_t (Sbar_T = dS), backwards:
        dk_t = Sbar_t v_t + (u * q_t) (v_t . do_t)                the write, then the bonus
        dv_t = Sbar_t^T k_t + (q_t . (u * k_t)) do_t
        dw_t = sum_v Sbar_t * exp(w_t) S_{t-1}                    per key channel
        dq_t = S_{t-1} do_t + (u * k_t) (v_t . do_t)              the read, then the bonus
        Sbar_{t-1} = Diag(exp(w_t)) Sbar_t + q_t do_t^T           the transition, then the read of S_{t-1}
        du = sum_{b, t} (q_t * k_t) (v_t . do_t)                  one bonus per head and channel
    and dS0 = Sbar_0. Unlike GLA, token t's read adds to the adjoint of the state *before* it. The
    states come from `_gated_linear.states_backwards` (sqrt(T) checkpoints).
    """
    xp = array_module(q)
    dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v)
    dw = xp.empty_like(w)
    du = xp.zeros_like(u)
    Sbar = xp.zeros(q.shape[:1] + q.shape[2:] + v.shape[-1:], q.dtype) if dS is None else dS
    for t, S_prev, _ in states_backwards(k, v, w, S0):
        q_t, k_t, v_t, do_t = q[:, t], k[:, t], v[:, t], do[:, t]
        d_bonus = (v_t * do_t).sum(-1, keepdims=True)                   # v_t . do_t, [B, H, 1]
        dk[:, t] = (Sbar @ v_t[..., None])[..., 0] + u * q_t * d_bonus
        dv[:, t] = (k_t[..., None, :] @ Sbar)[..., 0, :] + (q_t * u * k_t).sum(-1, keepdims=True) * do_t
        dw[:, t] = (Sbar * decay_state(S_prev, w[:, t])).sum(-1)
        dq[:, t] = (S_prev @ do_t[..., None])[..., 0] + u * k_t * d_bonus
        du += (q_t * k_t * d_bonus).sum(0)
        Sbar = decay_state(Sbar, w[:, t]) + q_t[..., :, None] * do_t[..., None, :]
    return dq, dk, dv, dw, du, (None if S0 is None else Sbar)


def _chunked_backward(q, k, v, w, u, S0, do, dS, chunk_size):
    """The chunked form's backward on checked inputs, chunk-parallel like `_chunked`: (dq, dk, dv, dw, du, dS0).

    The forward per chunk (G the chunk-local cumulative gate, G' = G_{i-1} the exclusive one, S_n the
    state entering the chunk):
        A  = gram_before_decay(q, k, G)     A_ij = sum_k q_ik k_jk exp(G'_ik - G_jk), j < i
        b_i = q_i . (u * k_i)               the bonus
        o  = A v + b * v + Q' S_n,          Q' = q * exp(G')
        S_{n+1} = exp(G_C) S_n + Kd^T v,    Kd = k * exp(G_C - G)
    Backward, as GLA's (`_gated_linear.chunked_backward`) with the two differences:
        dA = do v^T,  dv = A^T do + b * do + Kd dW,   dQ' = do S_n^T,   dS_n|read = Q'^T do
        state pass backwards (`chunking.pass_states_backward`): dW_n = Sbar_{n+1}, dS0
        dk = dKd * exp(G_C - G) + (A's share, `chunking.gram_before_decay_backward`),  dKd = v dW^T
        dq = dQ' * exp(G') + (A's share)
    The bonus, no gate in it: with db_i = v_i . do_i,
        dq_i += db_i u * k_i,    dk_i += db_i u * q_i,    du = sum over tokens of db_i q_i * k_i.
    The gate, by `chunking.gate_terms`: q_i enters (through A and Q') scaled by exp(+G_{i-1}) and k_j
    (through A and Kd) by exp(-G_j), so with the gated shares dq~, dk~ (before the bonus):
        dG_i = q_{i+1} dq~_{i+1} - k_i dk~_i   (+ sum_v Sbar_{n+1} S_{n+1} at the chunk's end, i = C)
    and dw_j = sum_{i >= j in the chunk} dG_i.
    dA = do v^T needs nothing of the forward, so one sweep of the halving (`chunking.channel_gram_backward`
    with the Gram) gives A, the decays exp(G') and exp(G_C - G) per channel and A's share of dq and dk at once;
    the decayed rows' cotangents dQ', dKd then go back through those decays.
    """
    xp = array_module(q)
    T = q.shape[1]
    qc, kc, wc, doc = (chunk_view(x, chunk_size) for x in (q, k, w, do))  # [B, H, N, C, .], views
    v_T = to_chunks_transposed(v, chunk_size)                              # [B, H, N, V, C]: see the GLA engine
    (dq_out, dq), (dk_out, dk), (dv_out, dv), (dw_out, dG) = (chunked_output(x, chunk_size)
                                                              for x in (q, k, v, w))

    # Recompute the scores with their backward, the chunk-boundary states, the bonus.
    through_A = channel_gram_backward(doc @ v_T, qc, kc, wc, before_decay=True, with_gram=True, out=(dq, dk))
    from_start, to_end, chunk_decay = through_A.from_start, through_A.to_end, through_A.chunk_decay
    q_before, k_to_end = qc * from_start, kc * to_end                       # Q', Kd
    S_after = states_after_chunks((v_T @ k_to_end).swapaxes(-1, -2), chunk_decay, S0)   # S_{n+1}, in place
    u_c = u[:, None, None]                                                 # [H, 1, 1, K]
    bonus = (qc * u_c * kc).sum(-1, keepdims=True)                         # b_i, [B, H, N, C, 1]

    # The output and the state pass.
    dS_read = q_before.swapaxes(-1, -2) @ doc                              # Q'^T do
    dq_before = q_before                                                   # (its memory) dQ' = do S_n^T
    xp.matmul(doc[:, :, 1:], S_after[:, :, :-1].swapaxes(-1, -2), out=dq_before[:, :, 1:])
    dq_before[:, :, 0] = 0 if S0 is None else doc[:, :, 0] @ S0.swapaxes(-1, -2)
    dq_before *= from_start
    dq += dq_before
    del dq_before, q_before
    dW, dS0 = pass_states_backward(dS_read, None, dS, chunk_decay=chunk_decay, in_place=True)
    del dS_read
    xp.matmul(k_to_end, dW, out=dv)
    dv += through_A.A.swapaxes(-1, -2) @ doc
    dv += bonus * doc
    del through_A
    dk_to_end = k_to_end                                                   # (its memory) dKd = v dW^T
    xp.matmul(dW, v_T, out=dk_to_end.swapaxes(-1, -2))
    dk_to_end *= to_end
    dk += dk_to_end
    del dk_to_end, k_to_end

    # The gate, from the gated shares: q_{i+1} dq~_{i+1} belongs to G_i.
    q_terms = xp.multiply(qc, dq, out=from_start)
    dG[..., :-1, :] = q_terms[..., 1:, :]
    dG[..., -1, :] = 0
    dG -= xp.multiply(kc, dk, out=to_end)
    del q_terms
    dG[:, :, :, -1] += row_dot(dW, S_after)
    reverse_cumsum(dG, 3, in_place=True)

    # The bonus.
    d_bonus = xp.einsum("...v,...v->...", doc, xp.moveaxis(v_T, -1, -2))[..., None]   # db_i = v_i . do_i
    dq += d_bonus * u_c * kc
    dk += d_bonus * u_c * qc
    du = (d_bonus * qc * kc).sum(axis=(0, 2, 3))
    return (output_rows(dq_out, T), output_rows(dk_out, T), output_rows(dv_out, T), output_rows(dw_out, T), du,
            None if S0 is None else dS0)

