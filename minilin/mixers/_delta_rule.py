"""Engine: the gated delta rule, behind deltanet, gated_deltanet and kda. The public modules check
their inputs and map their paper's symbols onto this; here the inputs are already checked, cast to one
dtype, and `q` already carries `scale`.

    S'  = Diag(exp(g_t)) S_{t-1}                        decay first (no gate: S' = S_{t-1})
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T             then correct what S' predicts for k_t
    o_t = S_t^T q_t

`g` is None (DeltaNet), scalar [B, T, H] (Gated DeltaNet) or per key channel [B, T, H, K] (KDA).
Shapes: q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; state [B, H, K, V]; o [B, T, H, V].
"""
from __future__ import annotations

from .. import heads, varlen
from ..activations import l2_normalize
from ..backend import array_module
from ..chunking import (causal_mask, channel_gram, channel_gram_backward, chunk_gate_sums, chunk_view, chunked_output,
                        decay_matrix, decay_state, from_chunks, num_chunks, reverse_cumsum, segments, state_or_zeros,
                        to_chunks, transposed, unit_lower_inverse, unit_lower_solve)
from ..validation import check_chunk_size, check_delta_keys, check_scale


def qk_forward(a, scale, normalize_qk: bool, allow_neg_eigval: bool, scaled: bool = True):
    """The public modules' mapping of their checked q and k onto the engine's (undone by `qk_backward`):
    q -> scale * l2_normalize(q), k -> l2_normalize(k) when normalize_qk, else q -> scale * q, k -> k, and
    each q/k head repeated over its group of value heads (`heads.expand`). Unnormalized keys are checked
    against the beta of each value head that reads them: beta_t |k_t|^2 <= 1 (<= 2 with allow_neg_eigval,
    `validation.check_delta_keys`). a: the mixer's `Checked` inputs (q, k [B, T, H, K], beta [B, T, HV]);
    normalize_qk and allow_neg_eigval already checked flags. Returns (q', k') [B, T, HV, K]. scaled=False
    leaves out the scale (still checked), for `chunked`, which takes it apart and folds it into the rows
    and scores it multiplies anyway: one pass over q fewer."""
    q, k = a.q, a.k
    if normalize_qk:
        q, k = l2_normalize(q), l2_normalize(k)
    q, k = heads.expand(q, a.group), heads.expand(k, a.group)
    if not normalize_qk:
        check_delta_keys(k, a.beta, allow_neg_eigval)
    scale = check_scale(scale, a.shapes["K"])
    return (q * scale if scaled else q), k


def qk_backward(q, k, dq, dk, scale, normalize_qk):
    """The public modules' chain rule for their own mapping of q and k onto the engine's (`qk_forward`):
    q -> scale * l2_normalize(q), k -> l2_normalize(k) when normalize_qk, else q -> scale * q, k -> k
    (`activations.l2_normalize` and its backward). q, k: the raw inputs [B, T, H, K]; dq, dk: the engine's
    gradients. Returns the raw inputs' (dq, dk)."""
    dq = dq * scale
    if normalize_qk:
        return l2_normalize.backward(q, dq), l2_normalize.backward(k, dk)
    return dq, dk


def module_backward(signature, mixer: str, form: str, a, q, k, g, do, dstate, scale, normalize_qk: bool,
                    chunk_size=None):
    """A public module's `<form>_backward` after its own check (deltanet, gated_deltanet, kda): the cotangents
    checked (`signature.check_cotangents`), the engine's backward (per sequence with cu_seqlens:
    `varlen.backward`), each q/k head's gradient summed over its group of value heads (`heads.reduce`), then the
    chain rule of q and k's mapping (`qk_backward`). a: the mixer's `Checked` inputs; q, k: `qk_forward`'s;
    g: a.g, or None (DeltaNet, whose gradients have no dg). Returns `signature.gradients(mixer)`."""
    do, dstate = signature.check_cotangents(a, do, dstate)
    C = check_chunk_size(chunk_size, a.shapes["T"]) if form == "chunked" else None
    run = varlen.chunked(lambda *x: backward(form, *x), C)
    dq, dk, dv, dg, dbeta, dS0 = varlen.backward(run, (q, k, a.v, g, a.beta), a.state, do, dstate, a.cu_seqlens)
    dq, dk = heads.reduce(dq, a.group), heads.reduce(dk, a.group)  # each q/k head: the sum over its group
    dq, dk = qk_backward(a.q, a.k, dq, dk, check_scale(scale, a.shapes["K"]), normalize_qk)
    gates = (dbeta,) if g is None else (dg, dbeta)
    return signature.gradients(mixer)(dq, dk, dv, *gates, dS0)


def step(q, k, v, g, beta, S):
    """One token: q, k [B, H, K], v [B, H, V], g None / [B, H] / [B, H, K], beta [B, H], S or None."""
    S = state_or_zeros(S, q, v)
    S = decay_state(S, g)
    prediction = (k[..., None, :] @ S)[..., 0, :]  # S'^T k_t: what the memory holds for k_t
    S = S + (beta[..., None] * k)[..., :, None] * (v - prediction)[..., None, :]
    return (q[..., None, :] @ S)[..., 0, :], S


def recurrent(q, k, v, g, beta, S0):
    """The definition: one `step` per token, vectorized over batch and heads."""
    xp = array_module(q)
    S = state_or_zeros(S0, q[:, 0], v[:, 0])
    o = xp.empty(v.shape, q.dtype)
    for t in range(q.shape[1]):
        o[:, t], S = step(q[:, t], k[:, t], v[:, t], None if g is None else g[:, t], beta[:, t], S)
    return o, S


def chunked(q, k, v, g, beta, S0, chunk_size, scale=1.0):
    """Chunked form with the WY representation (DeltaNet: Yang et al. 2024; gated: Yang et al. 2025).

    Inside one chunk, with G the chunk-local cumulative gate and S the state entering the chunk,
    unroll the recurrence: S_t = exp(G_t) S + sum_{j <= t} exp(G_t - G_j) k_j delta_j^T, where the
    corrections delta_t = beta_t (v_t - S_{t-1}'^T k_t) solve the unit lower-triangular system
        (I + A) Delta = diag(beta) (V - (K * exp(G)) S),
        A_tj = beta_t k_t . exp(G_t - G_j) k_j   for j < t.
    With T = (I + A)^-1 for all chunks at once (`chunking.unit_lower_inverse`), Delta = T diag(beta) R with
    the residual R = V - K_e S, K_e = K * exp(G). Delta enters the chunk's output and the state it leaves
    only through products, so T diag(beta) is multiplied into their other factors, chunk-parallel, and the
    pass carries R itself. Then chunk after chunk (the only sequential part):
        R_n     = V_n - K_e,n S_n                                        what the memory mispredicts
        O_n     = [Q * exp(G) | P T diag(beta)]_n [S_n; R_n]             its output, P = (Q K^T) decayed, causal
        S_{n+1} = exp(G_C) S_n + ((K * exp(G_C - G))^T T diag(beta))_n R_n   the state it leaves
    (each product X Delta_n taken as (X T diag(beta)) R_n). The pass is then the state-dependent products
    alone, K_e S_n, O_n and the write, and no C x C x V product per chunk; P T diag(beta) and
    (K * exp(G_C - G))^T T diag(beta) cost C x C x (C + K) per chunk for all chunks at once (on the 2-core
    development machine 2-3% of the call less than T diag(beta) R_n inside the pass). FLA's order, W =
    T diag(beta) K_e and U = T diag(beta) V for all chunks first and Delta_n = U_n - W_n S_n in the pass,
    measured no faster. The output's two terms are one product against [S_n; R_n], the state and the
    residual side by side in one buffer, so neither the states nor the residuals of all chunks are stored.

    The chunks are taken a segment of about 512 tokens at a time (`chunking.segments`): the grams and T of
    all chunks of a segment at once, then its chunks in order, the state carried on into the next segment.
    The same arithmetic as all chunks at once, with temporaries that stay in the CPU's cache. One chunk
    holding the whole sequence (the parallel form) solves (I + A) Delta = diag(beta) R by blocks instead
    (`chunking.unit_lower_solve`): C^2 V work where the inverse would cost C^3; its output and state are then
    [Q * exp(G) | P] [S; Delta] and exp(G_C) S + (K * exp(G_C - G))^T Delta.

    Gates: scalar ones are summed in float64 per chunk and rounded once after each difference
    (`decay_matrix`); per-channel ones go through `chunking.channel_gram`, which builds A and P by halving
    the chunk and returns K * exp(G), Q * exp(G), K * exp(G_C - G) and exp(G_C) with them.

    scale: q's scale, for a q without it (`qk_forward(..., scaled=False)`; 1 for a q that carries it). It
    enters only O_n, through Q * exp(G) and P, so it is folded into the numbers that scale those anyway:
    scale * exp(G) on the rows of Q, scale * exp(G_t - G_j) (or the causal mask) on P, [C] and [C, C]
    numbers per chunk instead of a pass over q.
    """
    xp = array_module(q)
    B, T, H, K = q.shape
    V, C = v.shape[-1], chunk_size
    o, o_chunks = chunked_output(v, C)                               # [B, N * C, H, V], [B, H, N, C, V]
    state_and_residual = xp.empty((B, H, K + C, V), q.dtype)         # [S_n; R_n]
    state_and_residual[:, :, :K] = 0 if S0 is None else S0
    for seg in segments(T, C, xp):
        first = seg.start // C
        out = o_chunks[:, :, first:first + num_chunks(seg.stop - seg.start, C)]
        _chunked_segment(q[:, seg], k[:, seg], v[:, seg], None if g is None else g[:, seg], beta[:, seg],
                         state_and_residual, C, out, scale, solve=num_chunks(T, C) == 1)
    return (o if o.shape[1] == T else xp.ascontiguousarray(o[:, :T])), state_and_residual[:, :, :K].copy()


def _chunked_segment(q, k, v, g, beta, state_and_residual, C, out, scale=1.0, solve=False):
    """`chunked` on one stretch of whole chunks: O into out [B, H, N, C, V]; state_and_residual
    [B, H, K + C, V] holds the state entering the stretch in its first K rows and leaves there the state after
    it (its last C rows: scratch for each chunk's residual). scale: q's, folded into the rows and scores of
    Q. solve: one chunk, solved by blocks rather than inverted (the parallel form)."""
    xp = array_module(q)
    B, _, H, K = q.shape
    qc, kc, vc = (chunk_view(x, C) for x in (q, k, v))             # [B, H, N, C, .], views
    beta_c = chunk_view(beta, C)                                     # [B, H, N, C]
    N = qc.shape[2]
    reads = xp.empty((B, H, N, C, K + C), q.dtype)                   # [Q * exp(G) | P T diag(beta)], scaled
    q_from_start = reads[..., :K]
    if g is None or g.ndim == 3:
        keys_T = transposed(kc)                                      # [B, H, N, K, C]: K^T, for the grams first
        A = kc @ keys_T                                              # k_t . k_j
        P = qc @ keys_T                                              # q_t . k_j
        if g is None:
            P *= xp.asarray(scale * causal_mask(C, xp), q.dtype)     # (A needs no mask: the solve reads below it)
            xp.multiply(qc, scale, out=q_from_start)
            k_from_start, to_end, chunk_decay = kc, None, None
        else:
            G = chunk_gate_sums(g, C)                                # [B, H, N, C]
            L = decay_matrix(G, dtype=q.dtype)
            A *= L
            if scale != 1:
                L *= scale                                           # scale exp(G_t - G_j): [C, C] numbers per chunk
            P *= L
            from_start = xp.exp(G).astype(q.dtype)[..., None]
            xp.multiply(qc, from_start * scale, out=q_from_start)
            k_from_start = kc * from_start
            to_end = xp.exp(G[..., -1:] - G).astype(q.dtype)[..., None]   # exp(G_C - G_j), [B, H, N, C, 1]
            chunk_decay = xp.exp(G[..., -1]).astype(q.dtype)[..., None, None]   # [B, H, N, 1, 1]
    else:
        (A, P), (k_from_start, q_from_start_), k_to_end, chunk_decay = channel_gram((kc, qc), kc, chunk_view(g, C))
        P *= scale
        xp.multiply(q_from_start_, scale, out=q_from_start)
        keys_T, to_end = k_to_end.swapaxes(-1, -2), None            # (K * exp(G_C - G))^T, per channel
        chunk_decay = chunk_decay[..., None]                         # [B, H, N, K, 1]
    A *= beta_c[..., None]                                           # beta_t k_t . k_j, decayed
    S, residual = state_and_residual[:, :, :K], state_and_residual[:, :, K:]
    if solve:  # one chunk (the parallel form): solve rather than invert, C^2 V work instead of C^3
        xp.subtract(vc[:, :, 0], k_from_start[:, :, 0] @ S, out=residual)
        delta = unit_lower_solve(A[:, :, 0], residual * beta_c[:, :, 0, :, None])
        reads[..., K:] = P
        xp.matmul(reads[:, :, 0], xp.concatenate([S, delta], axis=-2), out=out[:, :, 0])
        if chunk_decay is not None:
            S *= chunk_decay[:, :, 0]
        S += keys_T[:, :, 0] @ (delta if to_end is None else delta * to_end[:, :, 0])
        return
    T_beta = unit_lower_inverse(A)
    T_beta *= beta_c[..., None, :]                                   # T diag(beta)
    xp.matmul(P, T_beta, out=reads[..., K:])                         # P T diag(beta)
    if to_end is not None:   # K^T diag(exp(G_C - G)) T: the decay on T's rows, [C, C] numbers, not K^T's [K, C]
        T_beta *= to_end
    writes = keys_T @ T_beta                                         # (K * exp(G_C - G))^T T diag(beta)
    del A, P, T_beta

    predicted, write = xp.empty(residual.shape, q.dtype), xp.empty(S.shape, q.dtype)
    for n in range(N):
        xp.matmul(k_from_start[:, :, n], S, out=predicted)           # K_e S_n: what the memory predicts
        xp.subtract(vc[:, :, n], predicted, out=residual)            # R_n
        xp.matmul(reads[:, :, n], state_and_residual, out=out[:, :, n])   # O_n
        xp.matmul(writes[:, :, n], residual, out=write)
        if chunk_decay is not None:
            S *= chunk_decay[:, :, n]
        S += write


def parallel(q, k, v, g, beta, S0):
    """The quadratic form: the chunked form with one chunk holding the whole sequence, so that
    O = (Q K^T, masked) (I + A)^-1 diag(beta) V when starting from an empty memory (DeltaNet's
    "attention" form)."""
    return chunked(q, k, v, g, beta, S0, max(q.shape[1], 1))


# ----------------------------------------------------------------------------------------------------------
# Backward passes: the gradients of L = <dO, O> + <dS, S_final> with respect to (q, k, v, g, beta, S0).
# Notation: a bar-free "dX" is the gradient of L with respect to X (same shape as X).
# ----------------------------------------------------------------------------------------------------------

# Tokens between two stored states in `recurrent_backward`.
CHECKPOINT_EVERY = 64


def _update(k, v, g, beta, S):
    """The state update alone (no output): S' = exp(g) S, S_new = S' + beta k (v - S'^T k)^T."""
    S = decay_state(S, g)
    prediction = (k[..., None, :] @ S)[..., 0, :]
    return S + (beta[..., None] * k)[..., :, None] * (v - prediction)[..., None, :]


def recurrent_backward(q, k, v, g, beta, S0, do, dS, checkpoint_every=CHECKPOINT_EVERY):
    """The definition run backwards in time. Returns (dq, dk, dv, dg, dbeta, dS0), shaped like the inputs;
    dg is None when g is None, dS0 None when S0 is None; dS None means zeros.

    One token of the forward, and the adjoint of each line (read bottom to top), for one (batch, head):

        S'  = D_t S_{t-1},  D_t = Diag(exp(g_t))     dS_{t-1} = D_t dS'
                                                     dg_t     = sum_v (dS' * S')_kv   (summed over k too
                                                                when the gate is one scalar per token)
        p   = S'^T k_t                               dS'     += k_t dp^T,   dk_t += S' dp
        r   = v_t - p                                dv_t     = dr,         dp    = -dr
        S_t = S' + beta_t k_t r^T                    dS'      = dS_t,       dr    = beta_t dS_t^T k_t
                                                     dbeta_t  = k_t^T dS_t r,  dk_t = beta_t dS_t r
        o_t = S_t^T q_t                              dS_t    += q_t do_t^T, dq_t  = S_t do_t

    `dS_t` on entry is the adjoint of S_t from the future (dS at t = T), so the loop runs t = T .. 1,
    each step needing S_{t-1}. Storing all T states costs T K V numbers per head (256 MB in float32 at
    T = 4096, 4 heads, K = V = 64); instead the forward pass stores one state every `checkpoint_every`
    tokens, and the backward pass recomputes the states of one segment at a time from its checkpoint
    (T / C + C states held, one extra forward pass of arithmetic). S' and r are recomputed from S_{t-1}.
    """
    xp = array_module(q)
    T = q.shape[1]
    C = max(1, int(checkpoint_every))

    def gate(t):
        return None if g is None else g[:, t]

    checkpoints = []
    S = state_or_zeros(S0, q[:, 0], v[:, 0])
    for t in range(T):
        if t % C == 0:
            checkpoints.append(S)
        S = _update(k[:, t], v[:, t], gate(t), beta[:, t], S)

    dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v)
    dbeta = xp.empty_like(beta)
    dg = None if g is None else xp.empty_like(g)
    dS_t = xp.zeros_like(S) if dS is None else dS.astype(S.dtype, copy=True)
    for segment in reversed(range(len(checkpoints))):
        start, stop = segment * C, min(T, (segment + 1) * C)
        before = [checkpoints[segment]]                      # before[i] = S_{start + i - 1}
        for t in range(start, stop - 1):
            before.append(_update(k[:, t], v[:, t], gate(t), beta[:, t], before[-1]))
        for t in reversed(range(start, stop)):
            q_t, k_t, v_t, b_t, do_t = q[:, t], k[:, t], v[:, t], beta[:, t], do[:, t]
            # Recompute the step's intermediates from S_{t-1}.
            S_decayed = decay_state(before[t - start], gate(t))              # S'
            residual = v_t - (k_t[..., None, :] @ S_decayed)[..., 0, :]      # r = v - S'^T k
            S_t = S_decayed + (b_t[..., None] * k_t)[..., :, None] * residual[..., None, :]
            # o_t = S_t^T q_t
            dS_t += q_t[..., :, None] * do_t[..., None, :]
            dq[:, t] = (S_t @ do_t[..., :, None])[..., 0]
            # S_t = S' + beta k r^T
            read = (k_t[..., None, :] @ dS_t)[..., 0, :]                      # dS_t^T k: [B, H, V]
            dbeta[:, t] = (residual * read).sum(-1)
            d_residual = b_t[..., None] * read
            dv[:, t] = d_residual
            # r = v - S'^T k: dp = -dr flows to k (through S') and to S' (through k).
            dk[:, t] = (b_t[..., None, None] * (dS_t @ residual[..., :, None]) -
                        S_decayed @ d_residual[..., :, None])[..., 0]
            dS_decayed = dS_t - k_t[..., :, None] * d_residual[..., None, :]
            # S' = D_t S_{t-1}
            if g is not None:
                per_row = (dS_decayed * S_decayed).sum(-1)                   # [B, H, K]
                dg[:, t] = per_row if g.ndim == 4 else per_row.sum(-1)
            dS_t = decay_state(dS_decayed, gate(t))
    return dq, dk, dv, dg, dbeta, (None if S0 is None else dS_t)


def _rowdot(a, b, axis=-1):
    """sum(a * b, axis) in one pass where the array module has `vecdot` (NumPy >= 2), else two."""
    xp = array_module(a)
    if hasattr(xp, "vecdot"):
        return xp.vecdot(a, b, axis=axis)
    return (a * b).sum(axis)


def _fill_chunks(out, x):
    """`chunking.to_chunks(x)` written into `out` [B, H, N, C, ...] (which may be a view), no copy between."""
    B, H, N, C = out.shape[:4]
    T = x.shape[1]
    full = T // C
    if full:
        out[:, :, :full] = array_module(x).moveaxis(x[:, :full * C].reshape(B, full, C, H, *x.shape[3:]), 3, 1)
    if full < N:
        out[:, :, full:] = 0
        out[:, :, full, :T - full * C] = array_module(x).moveaxis(x[:, full * C:], 2, 1)


def chunked_backward(q, k, v, g, beta, S0, do, dS, chunk_size):
    """The chunked form's backward, chunk-parallel like the forward (the structure of FLA's
    chunk_gated_delta_rule_bwd). Returns (dq, dk, dv, dg, dbeta, dS0) as `recurrent_backward`.

    Per chunk (all chunks at once unless said otherwise), with the forward's names (see `chunked`):
    Q, K [C, K], V [C, V], beta [C], G the chunk-local cumulative gate, S the state entering the chunk,
    S+ the state leaving it, E = exp(G) and E_end = exp(G_C - G) scaling rows:

        (1) A = gram(beta K, K) strict,   P = gram(Q, K)   (decayed: exp(G_t - G_j) in entry (t, j))
        (2) T = (I + A)^-1
        (3) Delta = T rhs,  rhs = beta V - (beta K * E) S                } sequential over chunks
        (4) S+ = exp(G_C) S + (K * E_end)^T Delta                        }
        (5) O = (Q * E) S + P Delta

    (3) is the forward's Delta = U - W S with W = T (beta K * E) and U = T (beta V) left unformed: the
    backward needs neither, and one more product per chunk inside the loop costs less than two products
    over all chunks and two more arrays.

    Step 0, recompute (1)-(4), keeping S (the state entering each chunk) and Delta; O is not needed.
    Nothing from the forward call is stored: the backward recomputes the grams, T and the state pass
    (one forward's work), then holds S at every chunk boundary (N K V numbers per head) and Delta, R per
    chunk (T V each); dS+ lives one chunk at a time, so the terms of step 2 that need it are taken in
    step 1's loop.

    Step 1, the state adjoint, chunk by chunk backwards from dS+ = dS for the last chunk. Delta feeds (4)
    and (5); S feeds (3), (4) and (5):
        dDelta = P^T dO + (K * E_end) dS+
        R      = T^T dDelta         (the adjoint of a triangular solve is the transposed solve: drhs = R)
        dS     = exp(G_C) dS+ + (Q * E)^T dO - (beta K * E)^T R
               = exp(G_C) dS+ + [Q * E; beta K * E]^T [dO; -R]       (one product with a 2C contraction)
    and dS of chunk n is dS+ of chunk n - 1 (of chunk 0: dS0). P^T dO is one product over all chunks,
    before the loop.

    Step 2, everything else at once (the products with dS+ below taken chunk by chunk in step 1):
        from (5):  d(Q * E) = dO S^T,          dP = dO Delta^T (causal)
        from (4):  d(K * E_end) = Delta dS+^T, and exp(G_C) S gives dG_C += sum_v dS+ * exp(G_C) S
        from (3):  d(beta V) = R,              d(beta K * E) = -R S^T,   dT = dDelta rhs^T
        from (2):  T (I + A) = I gives, as differentials, dT = -T dA T, so <Tbar, dT> = <-T^T Tbar T^T, dA>:
                       dA = -T^T (dDelta rhs^T) T^T = -R (T rhs)^T = -R Delta^T,
                   kept strictly lower: only those entries of A are inputs.
        from (1):  the grams' backward (`chunking.channel_gram_backward` for a per-channel gate):
                   dQ, dK from dP;  d(beta K), dK from dA.
    Then beta K and beta V give dK += beta d(beta K), dbeta = sum_c K d(beta K) + sum_v V d(beta V),
    dV = beta d(beta V).

    The gate. G enters as exp(+G_t) on a row of token t (Q * E, beta K * E, x in the grams) and as
    exp(-G_j) on a row of token j (y in the grams, K * E_end); a row X scaled by exp(+-G) contributes
    +-X * dX to dG, so, with dQ, d(beta K) the totals and dK' the gradient of K's own rows (the grams
    and K * E_end, before the beta K path is added):
        dG_t = Q_t * dQ_t + beta_t K_t * d(beta K)_t - K_t * dK'_t          (summed over channels
    plus at the chunk's last position C                                       for a scalar gate)
        dG_C += sum_t (K * E_end)_t * d(K * E_end)_t + sum_v dS+ * exp(G_C) S.
    Since G_t = g_1 + ... + g_t inside the chunk, dg_s = sum_{t >= s} dG_t: a reverse cumulative sum of
    per-token terms, and every exponential above has a non-positive argument.

    Layout. Q and beta K both multiply K^T from the left, and dO and -R both multiply S^T and Delta^T,
    so each pair is stacked along the position axis: rows = [Q; beta K] [B, H, N, 2C, K] and
    left = [dO; -R] [B, H, N, 2C, V], and [P; A], [dP; dA] likewise. Each product of a pair is then one
    product with 2C rows (or a 2C-long contraction), and the buffers are written in place: on a 2-core
    CPU box, first touches of fresh memory (page faults) cost about as much as the arithmetic, so the
    backward allocates few large arrays.
    """
    xp = array_module(q)
    T, C = q.shape[1], chunk_size
    Bn, _, H, K = q.shape
    V, N, dtype = v.shape[-1], num_chunks(T, C), q.dtype
    gated, per_channel = g is not None, g is not None and g.ndim == 4

    kc = to_chunks(k, C)                                                 # [B, H, N, C, K]
    vc = to_chunks(v, C)                                                 # [B, H, N, C, V]
    beta_c = to_chunks(beta, C)[..., None]                               # [B, H, N, C, 1]
    rows = xp.empty((Bn, H, N, 2 * C, K), dtype)                         # [Q; beta K]
    qc, k_beta = rows[..., :C, :], rows[..., C:, :]
    _fill_chunks(qc, q)
    xp.multiply(kc, beta_c, out=k_beta)
    left = xp.empty((Bn, H, N, 2 * C, V), dtype)                         # [dO; -R], -R filled in step 1
    doc = left[..., :C, :]
    _fill_chunks(doc, do)
    G = L = E_both = None
    if not gated:
        k_to_end = kc
    elif per_channel:
        # Every decay comes from `channel_gram` in step 0 (products of per-token exp(g) <= 1, as the forward
        # takes them): K * E_end, [Q * E; beta K * E], exp(G_C); no cumulative gate is formed at all.
        gc = to_chunks(g, C)
    else:
        # A scalar gate as the forward takes it: G summed in float64 per chunk, each exponent rounded once.
        G = xp.cumsum(to_chunks(g, C), axis=-1, dtype=xp.float64)         # [B, H, N, C]
        G_last = G[:, :, :, -1]
        to_end = G_last[:, :, :, None] - G                               # G_C - G <= 0
        # Row factors [..., C, 1] and the state's [..., 1, 1].
        E, E_end = (xp.exp(x).astype(dtype)[..., None] for x in (G, to_end))   # exp(G), exp(G_C - G)
        decay_end = xp.exp(G_last).astype(dtype)[..., None, None]        # exp(G_C) on the state
        E_both = xp.concatenate([E, E], axis=-2)                         # exp(G) on [Q; beta K]
        k_to_end = kc * E_end                                            # K * E_end
        L = decay_matrix(G, dtype=dtype)                                 # exp(G_t - G_j), j <= t
    strict = causal_mask(C, xp, strict=True)

    def mask_grams(M):
        """M [B, H, N, 2C, C], shaped like [P; A], times exp(G_t - G_j) for a scalar gate (a per-channel
        decay is applied inside the gram) and the masks j <= t (top half), j < t (bottom half); in place."""
        if L is not None:
            halves = M.reshape(Bn, H, N, 2, C, C)
            halves *= L[:, :, :, None]
        else:
            M[..., :C, :] *= causal_mask(C, xp)
        M[..., C:, :] *= strict
        return M

    # Step 0: recompute (1)-(4).
    if per_channel:
        forward = channel_gram((qc, k_beta), kc, gc)
        grams = xp.moveaxis(forward.A, 0, 3).reshape(Bn, H, N, 2 * C, C)     # [P; A] before the masks
        q_from_start, k_beta_from_start = forward.x_from_start           # Q * E, beta K * E
        k_to_end, decay_end = forward.y_to_end, forward.chunk_decay[..., None]   # K * E_end; [..., K, 1]
        del forward
    else:
        grams = rows @ transposed(kc)                                    # [Q; beta K] K^T
    mask_grams(grams)                                                    # [P; A]
    P_T_do = grams[..., :C, :].swapaxes(-1, -2) @ doc                    # P^T dO
    T_inv = unit_lower_inverse(grams[..., C:, :])                        # (I + A)^-1
    del grams
    v_beta = vc * beta_c
    S_in = xp.empty((Bn, H, N + 1, K, V), dtype)                        # S entering chunk n; n = N: final
    S_in[:, :, 0] = 0 if S0 is None else S0
    delta = xp.empty((Bn, H, N, C, V), dtype)
    # The loops write into scratch buffers: on a batch of B H small matrices, each NumPy call's fixed cost
    # is a large part of its time, and a fresh temporary adds to it. [Q * E; beta K * E] is formed chunk
    # by chunk inside the loops rather than once for all chunks: on a small CPU box a fresh array of that
    # size costs more in first-touch page faults than the 2N small products (measured on 2 cores).
    rhs, decayed = xp.empty((Bn, H, C, V), dtype), xp.empty((Bn, H, K, V), dtype)
    rows_decayed = rows[:, :, 0].copy()                                  # [Q * E; beta K * E] of one chunk
    k_beta_decayed = rows_decayed[..., C:, :]
    for n in range(N):
        S = S_in[:, :, n]
        if not gated:
            xp.matmul(k_beta[:, :, n], S, out=rhs)
        elif per_channel:
            xp.matmul(k_beta_from_start[:, :, n], S, out=rhs)
        else:
            xp.multiply(k_beta[:, :, n], E[:, :, n], out=k_beta_decayed)
            xp.matmul(k_beta_decayed, S, out=rhs)
        xp.subtract(v_beta[:, :, n], rhs, out=rhs)                       # beta V - (beta K * E) S
        xp.matmul(T_inv[:, :, n], rhs, out=delta[:, :, n])              # Delta = T rhs
        S_next = S_in[:, :, n + 1]
        xp.matmul(k_to_end[:, :, n].swapaxes(-1, -2), delta[:, :, n], out=S_next)
        S_next += S if not gated else xp.multiply(S, decay_end[:, :, n], out=decayed)
    del v_beta

    # Step 1: the state adjoint, backwards over chunks. dS_out[:, :, n + 1] = dS+ of chunk n; [:, :, 0] = dS0.
    # The products with dS+ that step 2 needs are taken here, chunk by chunk, while it is at hand: the
    # adjoints of all N states are never stored, and dS+^T is never copied (an array of N states less, which
    # on a small CPU box costs more in first-touch page faults than the N small products).
    d_k_to_end = xp.empty((Bn, H, N, C, K), dtype)                       # d(K * E_end) = Delta dS+^T
    at_end = xp.empty((Bn, H, N, K), dtype) if gated else None          # sum_v dS+ * exp(G_C) S
    dS_next = xp.zeros_like(S_in[:, :, 0]) if dS is None else dS.astype(dtype, copy=True)
    dS_here = xp.empty_like(dS_next)
    minus_T_inv_T = xp.negative(T_inv, out=T_inv).swapaxes(-1, -2)      # -T^T, in place (T is done with)
    d_delta = rhs
    for n in reversed(range(N)):
        S = S_in[:, :, n]
        xp.matmul(delta[:, :, n], dS_next.swapaxes(-1, -2), out=d_k_to_end[:, :, n])
        if gated:
            at_end[:, :, n] = _rowdot(dS_next, xp.multiply(S, decay_end[:, :, n], out=decayed))
        xp.matmul(k_to_end[:, :, n], dS_next, out=d_delta)
        d_delta += P_T_do[:, :, n]                                       # dDelta
        xp.matmul(minus_T_inv_T[:, :, n], d_delta, out=left[:, :, n, C:])   # -R = -T^T dDelta
        if per_channel:                                                  # [Q * E; beta K * E]^T [dO; -R]
            xp.matmul(q_from_start[:, :, n].swapaxes(-1, -2), left[:, :, n, :C], out=dS_here)
            dS_here += xp.matmul(k_beta_from_start[:, :, n].swapaxes(-1, -2), left[:, :, n, C:], out=decayed)
        else:
            if gated:
                xp.multiply(rows[:, :, n], E_both[:, :, n], out=rows_decayed)
            xp.matmul((rows_decayed if gated else rows[:, :, n]).swapaxes(-1, -2), left[:, :, n], out=dS_here)
        dS_here += dS_next if not gated else xp.multiply(dS_next, decay_end[:, :, n], out=decayed)
        dS_next, dS_here = dS_here, dS_next                              # dS of chunk n is dS+ of chunk n - 1
    del P_T_do, T_inv, minus_T_inv_T, rows_decayed, k_beta_decayed, rhs, decayed, d_delta, E_both, dS_here
    dS0 = None if S0 is None else dS_next

    # Step 2: the intra-chunk gradients, all chunks at once.
    minus_R = left[..., C:, :]
    dvc = minus_R * -beta_c                                              # dV = beta d(beta V) = beta R
    dbeta_c = -_rowdot(vc, minus_R)
    by_state = left @ transposed(S_in[:, :, :N])                         # [d(Q * E); d(beta K * E)] = [dO; -R] S^T
    del S_in
    d_grams = left @ transposed(delta)                                   # [dP; dA], not yet masked
    del left, minus_R, delta
    if gated:                                                            # dG_C's terms, [B, H, N, K]
        at_end += _rowdot(k_to_end, d_k_to_end, axis=-2)
    mask_grams(d_grams)                                                  # scalar gate: dM = d[P; A] * decay
    if per_channel:
        # The grams' backward, with the decayed rows' cotangents carried back through the same decays.
        d_stacked = xp.moveaxis(d_grams.reshape(Bn, H, N, 2, C, C), 3, 0)
        halves = by_state.reshape(Bn, H, N, 2, C, K)
        d_rows_stacked, dkc = channel_gram_backward(d_stacked, (qc, k_beta), kc, gc, dy_to_end=d_k_to_end,
                                                    dx_from_start=(halves[:, :, :, 0], halves[:, :, :, 1]))[:2]
        d_rows = xp.moveaxis(d_rows_stacked, 0, 3).reshape(Bn, H, N, 2 * C, K)   # dK' in dkc: K's own rows
        del d_stacked, d_rows_stacked, halves
    else:
        d_rows = d_grams @ kc                                            # [dQ; d(beta K)] from the grams
        dkc = d_grams.swapaxes(-1, -2) @ rows                            # dK from both grams at once
        if gated:                                                        # back through exp(G) on rows
            halves = by_state.reshape(Bn, H, N, 2, C, K)
            halves *= E[:, :, :, None]
            d_k_to_end *= E_end
        d_rows += by_state
        dkc += d_k_to_end                                                # dK', K's own rows
    del d_grams, by_state, d_k_to_end
    dk_beta = d_rows[..., C:, :]

    dg = None
    if gated:
        # dG = Q * dQ + beta K * d(beta K) - K * dK', then the chunk-end terms at position C.
        if per_channel:
            dG = (rows * d_rows).reshape(Bn, H, N, 2, C, K).sum(3) - kc * dkc
        else:
            dG = _rowdot(rows, d_rows).reshape(Bn, H, N, 2, C).sum(3) - _rowdot(kc, dkc)
            at_end = at_end.sum(-1)
        dG[:, :, :, -1] += at_end
        dg = from_chunks(reverse_cumsum(dG, 3), T)                       # dg_s = sum_{t >= s} dG_t
    dbeta_c += _rowdot(kc, dk_beta)
    dk_beta *= beta_c
    dkc += dk_beta
    return (from_chunks(d_rows[..., :C, :], T), from_chunks(dkc, T), from_chunks(dvc, T), dg,
            from_chunks(dbeta_c, T), dS0)


def parallel_backward(q, k, v, g, beta, S0, do, dS):
    """The backward of `parallel`: `chunked_backward` with one chunk holding the whole sequence."""
    return chunked_backward(q, k, v, g, beta, S0, do, dS, max(q.shape[1], 1))


def backward(form: str, q, k, v, g, beta, S0, do, dS, chunk_size: int | None = None):
    """The backward of one form by name, for the public modules: "recurrent", "chunked" (with chunk_size)
    or "parallel". All three return the same gradients; they differ in how (see each)."""
    if form == "recurrent":
        return recurrent_backward(q, k, v, g, beta, S0, do, dS)
    if form == "parallel":
        return parallel_backward(q, k, v, g, beta, S0, do, dS)
    return chunked_backward(q, k, v, g, beta, S0, do, dS, chunk_size)
