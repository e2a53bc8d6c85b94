"""Engine: gated linear attention, the recurrence behind linear_attention, simple_gla, retnet,
lightning, mamba2, gla and hgrn2. The public modules check their inputs and map their paper's symbols onto
this; here the inputs are already checked, cast to one dtype, and `q` already carries `scale`.

    S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T          S: [K, V] per (batch, head)
    o_t = S_t^T q_t

`g` is None (no decay: plain linear attention), scalar ([B, T, H]: one decay per head and token,
RetNet / Lightning / Mamba-2 / simple GLA) or per key channel ([B, T, H, K]: GLA, HGRN2).

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; state [B, H, K, V]; o [B, T, H, V].

Backward (`recurrent_backward`, `chunked_backward`, `parallel_backward`): the gradients of
    L = sum_t <do_t, o_t> + <dS, S_T>        (dS None = zeros)
with respect to q, k, v, g and the initial state, derived by hand below, no autograd.
"""
from __future__ import annotations

import math

from ..backend import array_module
from ..chunking import (causal_mask, channel_gram, channel_gram_backward, chunk_gate_sums, chunk_view, chunked_output,
                        decay_matrix, decay_state, from_chunks, num_chunks, output_rows, pass_states_backward,
                        read_and_pass, reverse_cumsum, row_dot, segments, state_or_zeros, states_after_chunks,
                        to_chunks_transposed, transposed)


def step(q, k, v, g, S):
    """One token: q, k [B, H, K], v [B, H, V], g None / [B, H] / [B, H, K], S [B, H, K, V] or None."""
    S = state_or_zeros(S, q, v)
    S = decay_state(S, g) + k[..., :, None] * v[..., None, :]
    return (q[..., None, :] @ S)[..., 0, :], S


def recurrent(q, k, v, g, S0):
    """The definition: one `step` per token, vectorized over batch and heads."""
    xp = array_module(q)
    S = state_or_zeros(S0, q[:, 0], v[:, 0])
    o = xp.empty(v.shape, q.dtype)
    for t in range(q.shape[1]):
        o[:, t], S = step(q[:, t], k[:, t], v[:, t], None if g is None else g[:, t], S)
    return o, S


def chunked(q, k, v, g, S0, chunk_size):
    """Chunked form: dense work inside chunks of C tokens, the state passed between chunks.

    With G the chunk-local cumulative gate and S_n the state entering chunk n, for token i of chunk n:
        o_i = sum_{j <= i in chunk} (q_i . exp(G_i - G_j) k_j) v_j      intra-chunk, A V
            + (q_i * exp(G_i))^T S_n                                      inter-chunk
        S_{n+1} = exp(G_C) S_n + sum_j (k_j * exp(G_C - G_j)) v_j^T        state passing
    For a scalar gate this is Mamba-2's SSD algorithm (diagonal blocks, chunk states, state passing,
    state-to-output); without a gate it is chunked linear attention.

    The chunks are taken a segment of about 512 tokens at a time (`chunking.segments`), all chunks of a
    segment at once, the state carried from one segment to the next: the same arithmetic as all chunks
    at once, with temporaries that stay in the CPU's cache (`_chunked_segment` does one segment). The
    output is written in place, segment by segment, through a chunk view of o.
    """
    xp = array_module(q)
    T = q.shape[1]
    o, o_chunks = chunked_output(v, chunk_size)              # [B, N * C, H, V] and its [B, H, N, C, V] view
    S = S0
    for seg in segments(T, chunk_size, xp):
        first = seg.start // chunk_size
        out = o_chunks[:, :, first:first + num_chunks(seg.stop - seg.start, chunk_size)]
        S = _chunked_segment(q[:, seg], k[:, seg], v[:, seg], None if g is None else g[:, seg], S, chunk_size,
                             out)
    return (o if o.shape[1] == T else xp.ascontiguousarray(o[:, :T])), S


def _chunked_segment(q, k, v, g, S0, C, out):
    """`chunked` on one stretch of whole chunks: writes O into out [B, H, N, C, V], returns the state after.

    A per gate: none, (Q K^T) causally masked; scalar, (Q K^T) * `decay_matrix(G)` with G summed in float64
    (long chunks, the parallel form's one chunk of T included, keep float32's precision in every
    difference G_i - G_j); per channel, `chunking.channel_gram`, which builds A by halving the chunk and
    returns q * exp(G), k * exp(G_C - G) and exp(G_C) with it; then `chunking.read_and_pass`. q and k are
    read in place through chunk views, so the arrays made here are K^T, A and the states entering the
    chunks (the chunks' writes land in them directly).
    """
    xp = array_module(q)
    qc, kc = chunk_view(q, C), chunk_view(k, C)              # [B, H, N, C, K], views
    if g is None or g.ndim == 3:
        k_to_end_T = transposed(kc)                          # [B, H, N, K, C]: K^T for the scores first
        A = qc @ k_to_end_T
    if g is None:
        A *= causal_mask(C, xp)
        q_from_start, chunk_decay = qc, None
    elif g.ndim == 3:                                        # scalar gate [B, T, H]
        G = chunk_gate_sums(g, C)                                                # [B, H, N, C]
        A *= decay_matrix(G, dtype=q.dtype)
        G_last = G[..., -1:]
        q_from_start = qc * xp.exp(G).astype(q.dtype)[..., None]
        k_to_end_T *= xp.exp(G_last - G).astype(q.dtype)[..., None, :]            # then decayed to the end
        chunk_decay = xp.exp(G_last[..., 0]).astype(q.dtype)                        # [B, H, N]
    else:                                                    # per-channel gate [B, T, H, K]
        A, q_from_start, k_to_end, chunk_decay = channel_gram(qc, kc, chunk_view(g, C))
        k_to_end_T = k_to_end.swapaxes(-1, -2)
    return read_and_pass(A, q_from_start, k_to_end_T, chunk_decay, v, S0, C, out=out)[1]


def parallel(q, k, v, g, S0):
    """The quadratic form o = (Q K^T * D) V (+ the read of S0): the chunked form with one chunk of T."""
    return chunked(q, k, v, g, S0, max(q.shape[1], 1))


def states_backwards(k, v, g, S0):
    """The states of S_t = D_t S_{t-1} + k_t v_t^T in reverse: yields (t, S_{t-1}, S_t) for t = T-1, ..., 0
    (0-based t; S_{-1} = S0, zeros when None). k [B, T, H, K], v [B, T, H, V], g None / [B, T, H] /
    [B, T, H, K]. The yielded arrays are views into a buffer that the next segment overwrites.

    What it stores and recomputes. A backward pass needs the forward states while walking backwards,
    and S_{t-1} cannot be recovered from S_t: undoing the decay divides by exp(g_t), which overflows for
    strong gates. Storing every S_t costs T K V numbers per head (268 MB at B=1, H=4, T=4096, K=V=64 in
    float32). Instead a first forward pass keeps the state at the start of every segment of
    c = ceil(sqrt(T)) tokens (checkpoints); walking backwards, each segment's c states are recomputed
    from its checkpoint, used, and dropped. Memory is O(sqrt(T) K V), at the price of one extra forward
    pass: the classic sqrt(T) checkpointing of backpropagation through time.
    """
    xp = array_module(k)
    B, T, H, K = k.shape
    V = v.shape[-1]
    segment = math.isqrt(T - 1) + 1 if T > 1 else 1          # ceil(sqrt(T))
    n_segments = -(-T // segment)

    def advance(S, t):
        return decay_state(S, None if g is None else g[:, t]) + k[:, t, :, :, None] * v[:, t, :, None, :]

    checkpoints = xp.empty((n_segments, B, H, K, V), k.dtype)  # the state entering each segment
    S = state_or_zeros(S0, k[:, 0], v[:, 0])
    for t in range(T):
        if t % segment == 0:
            checkpoints[t // segment] = S
        S = advance(S, t)
    states = xp.empty((segment + 1, B, H, K, V), k.dtype)      # states[i] = S_{t0 + i - 1}
    for s in reversed(range(n_segments)):
        t0, t1 = s * segment, min(T, (s + 1) * segment)
        states[0] = checkpoints[s]
        for t in range(t0, t1):
            states[t - t0 + 1] = advance(states[t - t0], t)
        for t in reversed(range(t0, t1)):
            yield t, states[t - t0], states[t - t0 + 1]


def recurrent_backward(q, k, v, g, S0, do, dS):
    """The definition run backwards: (dq, dk, dv, dg, dS0) of L = sum_t <do_t, o_t> + <dS, S_T>.

    do [B, T, H, V]; dS [B, H, K, V] or None (zeros). dg is None without a gate, dS0 None without S0.

    Step 1, the state's adjoint. Write Sbar_t = dL/dS_t, everything S_t influences: its own read
    o_t = S_t^T q_t and, through S_{t+1} = D_{t+1} S_t + k_{t+1} v_{t+1}^T (D = Diag(exp(g)) or exp(g)),
    all later ones. Backwards from the end:
        Sbar_T     = dS + q_T do_T^T
        Sbar_{t-1} = D_t Sbar_t + q_{t-1} do_{t-1}^T           (dS_t carried back through the transition)
    D_t is symmetric (diagonal), so carrying back is the same decay as the forward's, exponent g_t <= 0.

    Step 2, each token's inputs, read off the two places they appear:
        o_t = S_t^T q_t                     ->  dq_t = S_t do_t
        S_t = ... + k_t v_t^T               ->  dk_t = Sbar_t v_t,    dv_t = Sbar_t^T k_t
        S_t = exp(g_t) * S_{t-1} + ...      ->  dg_t = sum_v Sbar_t * exp(g_t) S_{t-1}   (over K too, scalar g)
        S_0 = S0                            ->  dS0  = D_1 Sbar_1
    The gate's gradient needs no exponential beyond the forward's exp(g_t) <= 1.

    The forward states come from `states_backwards`: sqrt(T) checkpoints, each segment recomputed once.
    """
    xp = array_module(q)
    per_channel = g is not None and g.ndim == 4
    dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v)
    dg = None if g is None else xp.empty(g.shape, q.dtype)
    Sbar = xp.zeros(q.shape[:1] + q.shape[2:] + v.shape[-1:], q.dtype) if dS is None else dS
    for t, S_prev, S_t in states_backwards(k, v, g, S0):
        Sbar = Sbar + q[:, t, :, :, None] * do[:, t, :, None, :]       # + q_t do_t^T: Sbar is now dL/dS_t
        dq[:, t] = (S_t @ do[:, t, :, :, None])[..., 0]                # S_t do_t
        dk[:, t] = (Sbar @ v[:, t, :, :, None])[..., 0]                # Sbar_t v_t
        dv[:, t] = (k[:, t, :, None, :] @ Sbar)[..., 0, :]             # Sbar_t^T k_t
        if g is not None:
            per_key = (Sbar * decay_state(S_prev, g[:, t])).sum(-1)    # sum_v Sbar_t * exp(g_t) S_{t-1}
            dg[:, t] = per_key if per_channel else per_key.sum(-1)
            Sbar = decay_state(Sbar, g[:, t])                          # D_t Sbar_t
    return dq, dk, dv, dg, (None if S0 is None else Sbar)


def segment_final_state(k, v, g, S0):
    """The state after a stretch of L tokens, from the state S0 entering it (None: zeros), in one product:
        S_end = Diag(exp(G_L)) S0 + sum_t Diag(exp(G_L - G_t)) k_t v_t^T
              = Diag(exp(G_L)) S0 + (k * exp(G_L - G))^T v
    with G the stretch's cumulative gate (summed in float64; G_L its last entry, so every exponent is <= 0).
    k [B, L, H, K], v [B, L, H, V], g None / [B, L, H] / [B, L, H, K]; returns [B, H, K, V]."""
    xp = array_module(k)
    keys = k
    if g is not None:
        G = xp.cumsum(g, axis=1, dtype=xp.float64)
        G_L = G[:, -1:]
        to_end = xp.exp(G_L - G).astype(k.dtype)
        keys = k * (to_end[..., None] if g.ndim == 3 else to_end)
    S = keys.transpose(0, 2, 3, 1) @ v.transpose(0, 2, 1, 3)             # [B, H, K, L] @ [B, H, L, V]
    if S0 is not None:
        S += decay_state(S0, None if g is None else G_L[:, 0].astype(k.dtype))
    return S


def chunked_backward(q, k, v, g, S0, do, dS, chunk_size):
    """The chunked form's backward: (dq, dk, dv, dg, dS0), taken a segment at a time as `chunked` is.

    The backward of one segment (`_chunked_backward_segment`, chunk-parallel) makes temporaries as large as
    the segment; over the whole sequence at once they would be tens of MB and stream from main memory. The
    chain rule across segments: first the state entering every segment, forwards (`segment_final_state`, one
    product per segment), then the segments last to first, each one's backward given the state entering it
    and the adjoint of the state leaving it (dS for the last segment); the adjoint of its entering state
    that it returns is the adjoint leaving the segment before, and the first segment's is dS0. With CuPy, or
    a sequence of one segment, this is one call of the segment's backward.
    """
    xp = array_module(q)
    spans = segments(q.shape[1], chunk_size, xp)
    if len(spans) == 1:
        return _chunked_backward_segment(q, k, v, g, S0, do, dS, chunk_size)
    entering = [S0]
    for span in spans[:-1]:
        entering.append(segment_final_state(k[:, span], v[:, span], None if g is None else g[:, span], entering[-1]))
    dq, dk, dv = xp.empty(q.shape, q.dtype), xp.empty(k.shape, k.dtype), xp.empty(v.shape, v.dtype)
    dg = None if g is None else xp.empty(g.shape, q.dtype)
    adjoint = dS
    for span, S_in in zip(reversed(spans), reversed(entering)):
        cut = (lambda x: None if x is None else x[:, span])  # noqa: E731
        dq[:, span], dk[:, span], dv[:, span], dg_span, adjoint = _chunked_backward_segment(
            q[:, span], k[:, span], v[:, span], cut(g), S_in, do[:, span], adjoint, chunk_size)
        if dg is not None:
            dg[:, span] = dg_span
    return dq, dk, dv, dg, adjoint


def _chunked_backward_segment(q, k, v, g, S0, do, dS, chunk_size):
    """The chunked form's backward on one stretch of tokens, chunk-parallel like `chunked`: (dq, dk, dv, dg, dS0).

    The forward, per chunk n (C tokens, G the chunk-local cumulative gate, G_C its last entry, S_n the
    state entering the chunk):
        Kd      = k * exp(G_C - G)               the keys decayed to the chunk's end
        S_{n+1} = exp(G_C) S_n + Kd^T v          (`pass_states`; W_n = Kd^T v is what the chunk writes)
        Qd      = q * exp(G)                     the queries decayed from the chunk's start
        A       = gated_gram(q, k, G)            A_ij = sum_k q_ik k_jk exp(G_ik - G_jk), j <= i
        o       = Qd S_n + A v
    Each step below is the chain rule through one of these lines, using for a product Y = X Z that
    dX = dY Z^T and dZ = X^T dY, and for a row decay y = x * exp(G) that dx = dy * exp(G).

    Step 0, recompute the chunk-boundary states S_n (N steps, summed in place over the writes,
    `states_after_chunks`). Nothing of size T x K x V is stored by the forward or kept here. A scalar
    gate's decays are taken as the forward takes them: G summed in float64 per chunk ([C] numbers), each
    exponent rounded once.

    Step 1, the state read o = Qd S_n + ...:
        dQd = do S_n^T,  dq = dQd * exp(G),      dS_n|read = Qd^T do   (what reading S_n adds to its adjoint)

    Step 2, the state pass backwards (`pass_states_backward`), the only sequential part:
        Sbar_N = dS,    Sbar_n = dS_n|read + exp(G_C) Sbar_{n+1},    dS0 = Sbar_0,
    and the cotangent of what chunk n writes is dW_n = Sbar_{n+1}.

    Step 3, the write W_n = Kd^T v:
        dKd = v dW_n^T,  dk = dKd * exp(G_C - G),      dv = Kd dW_n

    Step 4, the intra-chunk part o = ... + A v (A recomputed):
        dv += A^T do,    dA = do v^T,    then A's backward (`chunking.gated_gram_backward`):
        dq += (dA * P) k,  dk += (dA * P)^T q   with P_ij = exp(G_i - G_j), j <= i (a per-channel gate:
        `chunking.channel_gram_backward`, the halving of `channel_gram` run backwards)

    Step 5, the gate, without one exponential more. By the rule of `chunking.gate_terms`, each use of
    G_i is a row scaled by exp(+G_i) (q_i, in Qd and in A) or by exp(-G_i) (k_i, in Kd and in A), and
    contributes +-(row . its cotangent); the total cotangents dq, dk of steps 1-4 sum all the uses:
        dG_i = q_i dq_i - k_i dk_i        (per channel; summed over K for a scalar gate)
    The chunk's total decay G_C enters once more, as a factor of every term of
    S_{n+1} = exp(G_C) S_n + sum_j exp(G_C - G_j) k_j v_j^T, so d S_{n+1} / d G_C = S_{n+1} and
        dG_C += sum_v Sbar_{n+1} * S_{n+1}          (summed over K too for a scalar gate).
    Finally G_i = g_1 + ... + g_i inside the chunk, so g_j reaches every G_i with i >= j:
        dg_j = sum_{i >= j in the chunk} dG_i,
    a reverse cumulative sum of per-token terms, never a difference of large exponentials.

    Cost: 10 batched matrix products against the forward's 4 (the recomputed W and A included), and a
    loop of N, not T, steps each way. q, k and do are read in place through chunk views, dq and dk are
    written into their own layout, and the states and their adjoints overwrite the writes and the reads:
    on a small CPU box a fresh array costs about as much in first-touch page faults as a product.
    """
    if g is not None and g.ndim == 4:
        return _chunked_backward_per_channel(q, k, v, g, S0, do, dS, chunk_size)
    T, C = q.shape[1], chunk_size
    xp = array_module(q)
    qc, kc, doc = (chunk_view(x, C) for x in (q, k, do))                 # [B, H, N, C, .], views
    # Orientation, for speed only. NumPy multiplies a swapped view at nearly full speed on the left of @
    # but about ten times slower on the right, so every product X Y^T wants Y^T as a contiguous array.
    # v is only ever needed as v^T (in W^T = v^T Kd, dA = do v^T, dKd^T = dW v^T): chunk it transposed.
    v_T = to_chunks_transposed(v, C)                                       # [B, H, N, V, C]
    (dq_out, dq), (dk_out, dk), (dv_out, dv) = (chunked_output(x, C) for x in (q, k, v))
    if g is None:
        P, from_start, to_end, chunk_decay, k_to_end = causal_mask(C, xp), None, None, None, kc
    else:
        G = chunk_gate_sums(g, C)                                          # [B, H, N, C]
        P = decay_matrix(G, dtype=q.dtype)                                 # exp(G_i - G_j), j <= i
        from_start = xp.exp(G).astype(q.dtype)[..., None]                  # exp(G_i), [B, H, N, C, 1]
        to_end = xp.exp(G[..., -1:] - G).astype(q.dtype)[..., None]        # exp(G_C - G_i)
        chunk_decay = xp.exp(G[..., -1]).astype(q.dtype)                   # exp(G_C), [B, H, N]
        k_to_end = kc * to_end

    # Step 0: the states after each chunk, S_after[n] = S_{n+1}, summed in place over the writes. They
    # come out of the product as W^T, so S_after^T, needed in step 1, is contiguous as it is.
    S_after = states_after_chunks((v_T @ k_to_end).swapaxes(-1, -2), chunk_decay, S0)

    # Step 1, the state read Qd S_n (the intra-chunk part A v follows in step 4). One decay per row
    # commutes with the products: exp(G_i) (do_i S_n^T) = (exp(G_i) do_i) S_n^T and Qd^T do = q^T (exp(G) do),
    # so both take do decayed once.
    do_decayed = doc if g is None else doc * from_start
    xp.matmul(do_decayed[:, :, 1:], S_after[:, :, :-1].swapaxes(-1, -2), out=dq[:, :, 1:])   # dQd * exp(G)
    dq[:, :, 0] = 0 if S0 is None else do_decayed[:, :, 0] @ S0.swapaxes(-1, -2)
    dS_read = qc.swapaxes(-1, -2) @ do_decayed                             # Qd^T do
    del do_decayed

    # Step 2: the state pass, backwards; dW overwrites dS_read.
    dW, dS0 = pass_states_backward(dS_read, None, dS, chunk_decay=chunk_decay, in_place=True)
    del dS_read

    # Step 3: the write Kd^T v. dKd = v dW^T is formed transposed, dKd^T = dW v^T, straight into dk.
    xp.matmul(dW, v_T, out=dk.swapaxes(-1, -2))
    if to_end is not None:
        dk *= to_end                                                       # dKd * exp(G_C - G)
    xp.matmul(k_to_end, dW, out=dv)
    del k_to_end

    # Step 4: the intra-chunk part A v: recompute A = (q k^T) * P; dv += A^T do; then A's backward
    # with M = dA * P, dA = do v^T: dq += M k, dk += M^T q (`chunking.gated_gram_backward`, inline).
    A = qc @ transposed(kc)
    A *= P
    dv += A.swapaxes(-1, -2) @ doc
    M = xp.matmul(doc, v_T, out=A)                                         # (A's memory)
    M *= P
    dq += M @ kc
    dk += M.swapaxes(-1, -2) @ qc                                          # M^T on the left: near full speed
    del A, M, P

    # Step 5: the gate; at the chunk's end, sum_kv Sbar_{n+1} * S_{n+1}.
    dg = None
    if g is not None:
        dG = row_dot(qc, dq)
        dG -= row_dot(kc, dk)
        dG[..., -1] += row_dot(dW, S_after).sum(-1)
        dg = from_chunks(reverse_cumsum(dG, 3, in_place=True), T)
    return (output_rows(dq_out, T), output_rows(dk_out, T), output_rows(dv_out, T), dg,
            None if S0 is None else dS0)


def _chunked_backward_per_channel(q, k, v, g, S0, do, dS, chunk_size):
    """`chunked_backward` for a per-channel gate g [B, T, H, K]: the same five steps, with every decay
    taken from `chunking.channel_gram` (the forward's A, Qd = q * exp(G), Kd = k * exp(G_C - G) and exp(G_C))
    and undone by its backward, `chunking.channel_gram_backward`:
        dQd = do S_n^T,  dKd = v dW_n^T,  dA = do v^T   ->   (dq, dk) = channel_gram_backward(dA, ..., dQd, dKd)
    which carries dQd and dKd back through the same products of decays that built Qd and Kd, so no
    exp(G) of a cumulative sum is formed here at all. Then dG_i = q_i * dq_i - k_i * dk_i per channel and
    the chunk-end term, as above.
    """
    T = q.shape[1]
    xp = array_module(q)
    qc, kc, gc, doc = (chunk_view(x, chunk_size) for x in (q, k, g, do))  # [B, H, N, C, .], views
    v_T = to_chunks_transposed(v, chunk_size)                              # [B, H, N, V, C]: see above
    # The gradients are written into their own layout [B, T, H, .] through chunk views: no copy at the end.
    (dq_out, dq), (dk_out, dk), (dv_out, dv), (dg_out, dG) = (chunked_output(x, chunk_size)
                                                              for x in (q, k, v, g))

    # Step 0 and A's backward at once (dA = do v^T needs nothing of the forward): one sweep of the halving
    # gives A, the decays exp(G) and exp(G_C - G) per channel, and dq, dk through A.
    through_A = channel_gram_backward(doc @ v_T, qc, kc, gc, with_gram=True, out=(dq, dk))
    from_start, to_end = through_A.from_start, through_A.to_end
    q_from_start, k_to_end = qc * from_start, kc * to_end                  # Qd, Kd
    # The states after each chunk, S_{n+1}, summed in place over the writes (`states_after_chunks`); the
    # state entering chunk n is then S_after[n - 1] (S0 for n = 0). The writes come out of the product as
    # W^T, so S_after^T, needed in step 1, is contiguous as it is.
    S_after = states_after_chunks((v_T @ k_to_end).swapaxes(-1, -2), through_A.chunk_decay, S0)

    # Steps 1-3: the state read, the state pass backwards, the write; dQd, dKd back through their decays.
    dS_read = q_from_start.swapaxes(-1, -2) @ doc                          # Qd^T do
    dq_from_start = q_from_start                                           # (its memory) dQd = do S_n^T
    xp.matmul(doc[:, :, 1:], S_after[:, :, :-1].swapaxes(-1, -2), out=dq_from_start[:, :, 1:])
    dq_from_start[:, :, 0] = 0 if S0 is None else doc[:, :, 0] @ S0.swapaxes(-1, -2)
    dq_from_start *= from_start
    dq += dq_from_start
    del dq_from_start, q_from_start
    dW, dS0 = pass_states_backward(dS_read, None, dS, chunk_decay=through_A.chunk_decay, in_place=True)
    del dS_read
    xp.matmul(k_to_end, dW, out=dv)
    dk_to_end = k_to_end                                                   # (its memory) dKd = v dW^T
    xp.matmul(dW, v_T, out=dk_to_end.swapaxes(-1, -2))
    dk_to_end *= to_end
    dk += dk_to_end
    del dk_to_end, k_to_end

    # Step 4: the intra-chunk part A v (A's own backward is done).
    dv += through_A.A.swapaxes(-1, -2) @ doc
    del through_A

    # Step 5: the gate; at the chunk's end, sum_v Sbar_{n+1} * S_{n+1}.
    xp.multiply(qc, dq, out=dG)
    dG -= xp.multiply(kc, dk, out=from_start)
    dG[:, :, :, -1] += row_dot(dW, S_after)
    reverse_cumsum(dG, 3, in_place=True)
    return (output_rows(dq_out, T), output_rows(dk_out, T), output_rows(dv_out, T), output_rows(dg_out, T),
            None if S0 is None else dS0)


def parallel_backward(q, k, v, g, S0, do, dS):
    """The backward of `parallel`: the chunked backward with one chunk of T tokens."""
    return chunked_backward(q, k, v, g, S0, do, dS, max(q.shape[1], 1))


def backward(form: str, q, k, v, g, S0, do, dS, chunk_size: int | None = None):
    """The backward of one form by name, for the public modules: "recurrent", "chunked" (with chunk_size)
    or "parallel". All three return the same gradients; they differ in how (see each)."""
    if form == "recurrent":
        return recurrent_backward(q, k, v, g, S0, do, dS)
    if form == "parallel":
        return parallel_backward(q, k, v, g, S0, do, dS)
    return chunked_backward(q, k, v, g, S0, do, dS, chunk_size)
