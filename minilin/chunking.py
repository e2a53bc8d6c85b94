"""The pieces every chunked form shares, written once.

A chunked form cuts the sequence into N chunks of C tokens, does the work inside each chunk as dense
matrix products (all chunks at once), and passes the fixed-size state from one chunk to the next.

Layouts used here:
- sequence tensors come in sequence-first, [B, T, H, ...] (CONVENTIONS.md);
- chunked tensors are [B, H, N, C, ...]: batch, head, chunk, position inside the chunk, features, either
  copies (`to_chunks`) or views of the sequence tensors themselves (`chunk_view`: no copy; BLAS reads each
  chunk's rows where they lie);
- a gate is either absent (None), scalar ([..., C], one decay per token and head) or per-channel
  ([..., C, K], one decay per key channel). `G` always means a chunk-local cumulative log-gate:
  `G_i = g_1 + ... + g_i` counted from the chunk's start, so `G` is non-increasing inside a chunk and
  `G_i - G_j <= 0` whenever `i >= j`.

Numerics: only non-positive numbers are ever exponentiated (differences `G_i - G_j` with `i >= j`),
never `exp(+cumsum)` or `exp(G_i) * exp(-G_j)`, so strong decays underflow to 0 and never overflow.
A difference of two cumulative sums is only as good as the sums: in float32, G over a chunk of 512 or
4096 tokens reaches -1000 or less and carries an absolute rounding error of about 1e-4, which a nearby
difference G_i - G_j (close to 0, a decay close to 1) inherits whole. So the forward engines never take such
a difference in the working precision: a scalar gate is summed in float64 per chunk and rounded once,
after the difference (`decay_matrix`, [C] numbers per chunk: cheap); a per-channel gate is never summed
at all (`channel_gram` multiplies decays of blocks of tokens together instead). float32 outputs then stay
within a few 1e-7 of the float64 recurrence at any length and chunk size; what remains is the rounding
of the products themselves and of exp of an exponent rounded once (relative error |G_i - G_j| * 2^-24).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .backend import array_module

# Width of the sub-blocks inside a chunk for per-channel gates in the sub-block evaluation of `gated_gram`'s
# gradient (the forward builds the same Gram matrix by halving, `channel_gram`).
SUB_CHUNK = 16


def num_chunks(T: int, chunk_size: int) -> int:
    return -(-T // chunk_size)


def to_chunks(x, chunk_size: int):
    """[B, T, H, ...] -> [B, H, N, C, ...], zero-padded at the end so that N * C >= T.

    Zero padding is harmless for every mixer here: a zero key or beta writes nothing, a zero log-gate
    decays nothing, and the outputs of padded queries are dropped by `from_chunks`.
    """
    xp = array_module(x)
    B, T, H = x.shape[:3]
    N = num_chunks(T, chunk_size)
    x = xp.moveaxis(x, 1, 2)
    pad = N * chunk_size - T
    if pad:
        x = xp.pad(x, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 3))
    # Contiguous, so that every per-chunk matrix product below runs as a plain BLAS call.
    return xp.ascontiguousarray(x.reshape(B, H, N, chunk_size, *x.shape[3:]))


def chunk_view(x, chunk_size: int):
    """[B, T, H, ...] -> [B, H, N, C, ...] as a view of x: no copy, unless C does not divide T (then of
    x zero-padded at the end, as `to_chunks`).

    Each [C, F] matrix of the view has rows of F contiguous numbers, H * F apart: BLAS multiplies such a
    matrix where it lies (its leading dimension is H * F), so a chunked form needs no layout copy of its
    inputs, and a matrix product can write its result into the output's own layout (`out=` a chunk view
    of o [B, N * C, H, V]).
    """
    xp = array_module(x)
    B, T, H = x.shape[:3]
    N = num_chunks(T, chunk_size)
    pad = N * chunk_size - T
    if pad:
        x = xp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return xp.moveaxis(x.reshape(B, N, chunk_size, H, *x.shape[3:]), 3, 1)


def chunked_output(v, chunk_size: int):
    """(o, o_chunks): an empty output [B, N * C, H, V] shaped like v [B, T, H, V], and its chunk view
    [B, H, N, C, V]; `o[:, :T]` is the result once the chunk view has been written."""
    xp = array_module(v)
    B, T, H, V = v.shape
    o = xp.empty((B, num_chunks(T, chunk_size) * chunk_size, H, V), v.dtype)
    return o, chunk_view(o, chunk_size)


def from_chunks(x, T: int):
    """[B, H, N, C, ...] -> [B, T, H, ...], dropping the padding."""
    xp = array_module(x)
    B, H, N, C = x.shape[:4]
    x = x.reshape(B, H, N * C, *x.shape[4:])[:, :, :T]
    return xp.ascontiguousarray(xp.moveaxis(x, 2, 1))


def local_cumsum(g):
    """Chunk-local cumulative log-gate G: [B, H, N, C(, K)] -> same shape, G_i = sum_{j<=i} g_j."""
    return array_module(g).cumsum(g, axis=3)


def causal_mask(C: int, xp, *, strict: bool = False):
    """[C, C] boolean, True where key j may be read by query i: j <= i (j < i when strict)."""
    i = xp.arange(C)
    return (i[:, None] > i[None, :]) if strict else (i[:, None] >= i[None, :])


def decay_matrix(G, *, strict: bool = False, dtype=None):
    """Scalar gate: L_ij = exp(G_i - G_j) for j <= i (j < i when strict), else 0. [..., C] -> [..., C, C].

    This is Mamba-2's 1-semiseparable mask (`exp(segsum(A))`) and, for a constant gate, RetNet's
    decay mask gamma^(i-j). Entries above the diagonal become -inf before exp, so nothing overflows.
    dtype: L's dtype (default G's). The forward engines pass G in float64 and dtype float32: the
    differences G_i - G_j are then taken in float64 and rounded once, so a long chunk (cumulative sums of
    thousands of gates, whose float32 rounding would be larger than a nearby difference) loses nothing.
    """
    xp = array_module(G)
    L = xp.empty(G.shape + G.shape[-1:], dtype or G.dtype)
    xp.subtract(G[..., :, None], G[..., None, :], out=L)
    L += _minus_inf_above(G.shape[-1], L.dtype, xp, strict)  # G_i - G_j >= 0 above the diagonal: -inf there ...
    return xp.exp(L, out=L)                                 # ... so that exp gives 0, never overflows


def _minus_inf_above(C: int, dtype, xp, strict: bool):
    """[C, C]: 0 where j <= i (j < i when strict), -inf elsewhere."""
    out = xp.zeros((C, C), dtype)
    out[~causal_mask(C, xp, strict=strict)] = -xp.inf
    return out


def decay_rows(x, G):
    """x_i * exp(G_i): each row of x [..., C, K] decayed by its gate (scalar [..., C] or [..., C, K]).

    The caller passes non-positive G (a cumulative gate, or a difference like G_last - G_i).
    """
    if G is None:
        return x
    xp = array_module(x)
    decay = xp.exp(G)
    return x * (decay[..., None] if G.ndim == x.ndim - 1 else decay)


def state_or_zeros(S, q, v):
    """S itself, or the empty memory [B, H, K, V] for one-token q [B, H, K] and v [B, H, V]."""
    if S is not None:
        return S
    return array_module(q).zeros((*q.shape[:-1], q.shape[-1], v.shape[-1]), q.dtype)


def decay_state(S, g):
    """exp(g) S for a state S [..., K, V] and a log-gate g: scalar [...] or per-channel [..., K]."""
    if g is None:
        return S
    xp = array_module(S)
    decay = xp.exp(g)
    return S * (decay[..., None, None] if g.ndim == S.ndim - 2 else decay[..., None])


def transposed(x):
    """x with its last two axes swapped, as a contiguous copy: [..., C, K] -> [..., K, C].

    For `a @ transposed(b)` rather than `a @ b.swapaxes(-1, -2)`: on a batch of small matrices NumPy
    multiplies by a swapped view at about half the speed of a plain product (256 products of 64 x 64
    in float32 on the 2-core dev box: 3.4 ms against 1.4 ms), and the copy costs less than the difference.
    Always a fresh array (even where the swapped view is contiguous, as for a single column): the chunked
    forms scale it in place.
    """
    return array_module(x).array(x.swapaxes(-1, -2), order="C", copy=True)


def gated_gram(x, y, G, *, strict: bool = False):
    """A_ij = sum_k x_ik y_jk exp(G_ik - G_jk) for j <= i (j < i when strict), else 0.

    x, y: [..., C, K]; G: None, scalar [..., C] or per-channel [..., C, K] -> A: [..., C, C].
    This is the intra-chunk "attention" matrix of every gated linear mixer: (Q K^T) masked and decayed.
    (The forward engines call `channel_gram` with the per-token gates instead, which also returns the
    decayed rows they need next; this form takes the cumulative gate G.)
    """
    xp = array_module(x)
    if G is None:
        A = x @ transposed(y)
        A *= causal_mask(x.shape[-2], xp, strict=strict)
        return A
    if G.ndim == y.ndim - 1:  # scalar gate (x may carry extra leading axes; y and G never do)
        A = x @ transposed(y)
        A *= decay_matrix(G, strict=strict, dtype=A.dtype)
        return A
    return channel_gram(x, y, gates_of(G), strict=strict).A


def gram_before_decay(x, y, G):
    """A_ij = sum_k x_ik y_jk exp(G_{i-1,k} - G_{j,k}) for j < i, else 0 (G_{-1} = 0).

    x, y: [..., C, K]; G: per-channel chunk-local cumulative gate [..., C, K] -> A: [..., C, C].
    Row i reads the memory as it was *before* token i's own decay and write: RWKV-6's S_{t-1}^T q_t,
    RWKV-7's a_t^T S_{t-1}. `channel_gram(..., before_decay=True)` on the per-token gates.
    """
    return channel_gram(x, y, gates_of(G), before_decay=True).A


def exclusive_cumsum(G):
    """G_{i-1} from the inclusive chunk-local G_i [..., C, K] (0 at the chunk's first position)."""
    xp = array_module(G)
    return xp.concatenate([xp.zeros_like(G[..., :1, :]), G[..., :-1, :]], axis=-2)


def gates_of(G):
    """The per-token gates g_i = G_i - G_{i-1} of a chunk-local cumulative gate G [..., C, K]."""
    return G - exclusive_cumsum(G)


class ChannelGram(NamedTuple):
    """What `channel_gram` returns (shapes for x, y [..., C, K] and per-channel gates g [..., C, K])."""

    A: object            # [..., C, C]: sum_k x_ik y_jk exp(G_ik - G_jk), j <= i (see channel_gram)
    x_from_start: object  # [..., C, K]: x_i * exp(G_i), row i decayed from the chunk's start (G_{i-1}: before_decay)
    y_to_end: object      # [..., C, K]: y_j * exp(G_C - G_j), row j decayed to the chunk's end
    chunk_decay: object   # [..., K]: exp(G_C), the decay over the whole chunk


def channel_gram(x, y, g, *, strict: bool = False, before_decay: bool = False) -> ChannelGram:
    """The per-channel gated Gram matrix of a chunk from its per-token gates, finite for any gate.

    x, y: [..., C, K] (x and y may carry different extra leading axes: they broadcast). x or y may also be a
    tuple of such arrays, for several Grams sharing one decay: stacked on a new leading axis of A, [nx, ...]
    or [ny, ...], or [nx, ny, ...] when both are tuples (every x against every y). g: the per-token
    log-gates [..., C, K], g <= 0, and G_i = g_1 + ... + g_i their chunk-local cumulative sum. Returns
        A_ij = sum_k x_ik y_jk exp(G_ik - G_jk)       for j <= i (j < i when strict), else 0,
    or with before_decay=True, for RWKV's reads of the memory before token i's own decay,
        A_ij = sum_k x_ik y_jk exp(G_{i-1,k} - G_jk)   for j < i, else 0        (G_{-1} = 0),
    together with the rows the chunked forms need next: x_i exp(G_i) (x_i exp(G_{i-1}) with before_decay),
    y_j exp(G_C - G_j) and exp(G_C).

    The decay differs per channel, so A is no product of two decayed matrices unless one side is multiplied
    by exp(-G), which overflows. But it factors through any position r between j and i:
        exp(G_i - G_j) = exp(G_i - G_r) * exp(G_r - G_j),     j <= r < i,  both exponents <= 0.
    So A is built by halving (C padded to a power of two P with zero gates and zero rows). At level
    s = 1, 2, 4, ..., P/2, every aligned block of 2s positions splits into a left half L and a right half R,
    and the entries (i in R, j in L) are one ordinary matrix product through r = the last position of L:
        A[R, L] = X_s[R] Y_s[L]^T,   X_s(i) = x_i exp(G_i - G_{rho_s(i)}),   Y_s(j) = y_j exp(G_{eta_s(j)} - G_j),
    rho_s(i) = the last position before i's aligned block of s (so rho_s(i) = r for i in R), eta_s(j) = the
    last position of j's aligned block of s (= r for j in L). Every entry below the diagonal lies in exactly
    one such (R, L) pair; the diagonal is x_i . y_i (exp(0)); above it, 0.
    No exponential of a cumulative sum is needed. Start from X_1(i) = x_i exp(g_i) (rho_1(i) = i - 1) and
    Y_1 = y, then after each level move the references one block out:
        X_2s(i) = X_s(i) d_s(L)  for i in R  (X_2s = X_s in L),   d_s(block) = exp(sum of g over the block),
        Y_2s(j) = Y_s(j) d_s(R)  for j in L  (Y_2s = Y_s in R),   d_2s = d_s(L) d_s(R),
    products of decays <= 1, each the exponential of a sum of a few gates: no cumulative sum over a long span
    is ever subtracted from another, so float32 keeps its full precision however long the chunk and however
    strong the gates. After the last level, X_P(i) = x_i exp(G_i), Y_P(j) = y_j exp(G_C - G_j), d_P = exp(G_C):
    the decays of the reads from and the writes to the chunk's state. With before_decay, X_1 = x (the row
    reads G_{i-1}, so rho_1(i) = i - 1 asks for no decay) and the diagonal is 0.

    Cost: one multiply per level over half the rows of X and of Y, and one product per level; the work of
    a chunk is that of a few elementwise passes over [C, K] per level, never a [C, C, K] tensor.
    """
    xp = array_module(g)
    C, K = g.shape[-2:]
    P = 1 << max(C - 1, 0).bit_length()  # zero rows read and write nothing, zero gates decay nothing
    # X, Y and d are updated in place level by level: fresh C-ordered arrays (x, y, g may be strided views).
    X, Y = _fresh_rows(x, P), _fresh_rows(y, P)
    if _several(x) and _several(y):
        X = X[:, None]                                       # [nx, 1, ...] against [ny, ...]: A [nx, ny, ...]
    d = xp.ones(g.shape[:-2] + (P, K), X.dtype)
    xp.exp(g, out=d[..., :C, :])                             # d_1: each token's own decay
    A = xp.empty(tuple(np.broadcast_shapes(X.shape[:-2], Y.shape[:-2])) + (P, P), X.dtype)
    A.fill(0)                                                # above the diagonal (one contiguous fill)
    if not (strict or before_decay):
        _diagonal_view(A)[...] = xp.einsum("...k,...k->...", X, Y)   # x_i . y_i
    if not before_decay:
        X *= d                                               # X_1 = x exp(g)  (before_decay: X_1 = x)
    s = 1
    while s < P:
        n_blocks = P // (2 * s)
        X_right = X.reshape(*X.shape[:-2], n_blocks, 2, s, K)[..., 1, :, :]   # [..., n_blocks, s, K]
        Y_left = Y.reshape(*Y.shape[:-2], n_blocks, 2, s, K)[..., 0, :, :]
        xp.matmul(X_right, Y_left.swapaxes(-1, -2), out=_lower_blocks(A, s))
        d_halves = d.reshape(*d.shape[:-2], n_blocks, 2, 1, K)
        X_right *= d_halves[..., 0, :, :]                    # R's rows now measured from before L
        Y_left *= d_halves[..., 1, :, :]                     # L's rows now measured to the end of R
        d = d_halves[..., 0, 0, :] * d_halves[..., 1, 0, :]  # d_2s: [..., n_blocks, K]
        s *= 2
    if _several(x) and _several(y):
        X = X[:, 0]
    return ChannelGram(A[..., :C, :C], X[..., :C, :], Y[..., :C, :], d[..., 0, :])


def _several(a) -> bool:
    return isinstance(a, (tuple, list))


def _fresh_rows(a, P: int):
    """A fresh C-ordered copy [..., P, K] of a [..., C, K], zero rows after C; of a tuple of such arrays,
    their copies stacked on a new leading axis [n, ..., P, K]."""
    parts = tuple(a) if _several(a) else (a,)
    xp = array_module(*parts)
    C, K = parts[0].shape[-2:]
    lead = tuple(np.broadcast_shapes(*(part.shape[:-2] for part in parts)))
    out = xp.empty(((len(parts),) if _several(a) else ()) + lead + (P, K), parts[0].dtype)
    for i, part in enumerate(parts):
        rows = out[i] if _several(a) else out
        rows[..., :C, :] = part
        rows[..., C:, :] = 0
    return out


def _diagonal_view(A):
    """The diagonals of a batch of square matrices A [..., P, P] as a writable view [..., P]."""
    rows, columns = A.strides[-2:]
    return array_module(A).lib.stride_tricks.as_strided(A, A.shape[:-1], A.strides[:-2] + (rows + columns,))


def _lower_blocks(A, s: int):
    """A writable view [..., P / 2s, s, s] of A [..., P, P]: for each aligned block of 2s positions, its
    lower-left s x s block (the rows of its right half against the columns of its left half)."""
    P, (rows, columns) = A.shape[-1], A.strides[-2:]
    strides = A.strides[:-2] + (2 * s * (rows + columns), rows, columns)
    return array_module(A).lib.stride_tricks.as_strided(A[..., s:, :], A.shape[:-2] + (P // (2 * s), s, s), strides)


def read_and_pass(A, q_from_start, k_to_end_T, chunk_decay, v, S0, chunk_size: int, out=None):
    """The chunked form of a gated linear recurrence, given its chunk pieces: (o [B, T, H, V], final state).

    A [B, H, N, C, C]: the chunk's masked, decayed scores; q_from_start [B, H, N, C, K]: the queries decayed
    from the chunk's start; k_to_end_T [B, H, N, K, C]: the keys decayed to its end, transposed (a swapped
    view will do); chunk_decay: None, [B, H, N] or [B, H, N, K], the decay over each whole chunk (factors,
    not logs); v [B, T, H, V]; S0 or None. Then
        S_0 = S0,    S_{n+1} = chunk_decay_n S_n + (k_to_end)_n^T V_n,    O_n = (q_from_start)_n S_n + A_n V_n.
    The writes (k_to_end)_n^T V_n of chunks 0 .. N-2 are one batched product straight into the slots
    1 .. N-1 of the array of entering states S_n, which the pass then turns into the states in place
    (S_n += chunk_decay_{n-1} S_{n-1}): no array of writes besides the states. V is read where it lies
    (a chunk view): NumPy's products read its strided rows a little slower than a contiguous copy, but
    less slowly than the copy costs.
    out: None, or where to write O, [B, H, N, C, V] (a chunk view of the output, `chunk_view`); then the
    result is (out, final state), with no layout copy of O.
    """
    xp = array_module(v)
    T = v.shape[1]
    vc = chunk_view(v, chunk_size)                           # [B, H, N, C, V], a view
    B, H, N = A.shape[:3]
    K, V = k_to_end_T.shape[-2], v.shape[-1]
    if chunk_decay is not None:  # [B, H, N, 1, 1] (scalar) or [B, H, N, K, 1]: scales the rows of each state
        chunk_decay = chunk_decay[..., None, None] if chunk_decay.ndim == 3 else chunk_decay[..., None]
    S_in = xp.empty((B, H, N, K, V), v.dtype)                # S_n, the state entering chunk n
    S_in[:, :, 0] = 0 if S0 is None else S0
    xp.matmul(k_to_end_T[:, :, :-1], vc[:, :, :-1], out=S_in[:, :, 1:])   # the writes of chunks 0 .. N-2
    carried = None if chunk_decay is None else xp.empty((B, H, K, V), v.dtype)
    for n in range(1, N):                                    # the pass, in place: the only sequential part
        if chunk_decay is None:
            S_in[:, :, n] += S_in[:, :, n - 1]
        else:
            S_in[:, :, n] += xp.multiply(S_in[:, :, n - 1], chunk_decay[:, :, n - 1], out=carried)
    S_final = k_to_end_T[:, :, -1] @ vc[:, :, -1]
    S_final += S_in[:, :, -1] if chunk_decay is None else chunk_decay[:, :, -1] * S_in[:, :, -1]
    o = xp.matmul(q_from_start, S_in, out=out)               # inter-chunk: the state entering chunk n
    o += A @ vc                                              # intra-chunk
    return (o if out is not None else from_chunks(o, T)), S_final


# Tokens per segment of the forward chunked forms (`segments`), measured on the 2-core development machine:
# linear attention's chunked form at C = 32 took about the same time with segments of 256, 512 and 1024 tokens,
# 15% more with 2048 tokens or with the whole sequence of 4096 at once (temporaries of tens of MB).
SEGMENT_TOKENS = 512


def segments(T: int, chunk_size: int, xp=np, tokens: int | None = None):
    """Slices of [0, T) of a whole number of chunks each, about `tokens` long (at least one chunk): the
    stretches of the sequence that a chunked forward processes one after another, all chunks of a stretch
    at once, carrying the state from one to the next (tokens: default SEGMENT_TOKENS).

    Why: chunk-parallel work over the whole sequence makes every temporary (scores, states, decayed keys)
    as large as the inputs, tens of MB at T = 4096, so each batched product streams it from main memory
    and each fresh array costs first-touch page faults. Segment by segment they are a few hundred kB,
    stay in the cache and reuse the memory the previous segment freed; the arithmetic is the same, and
    the extra cost is one round of NumPy calls per segment. With CuPy (xp not NumPy) the whole sequence is
    one segment: there each call is a kernel launch, and a few hundred tokens would leave the GPU idle.
    """
    if xp is not np:
        return [slice(0, T)]
    span = chunk_size * max(1, (tokens or SEGMENT_TOKENS) // chunk_size)
    return [slice(t0, min(T, t0 + span)) for t0 in range(0, T, span)]


def pass_states(dS, G_total, S0):
    """Inter-chunk state passing: S_n = exp(G_total_n) S_{n-1} + dS_n, with S_0 = S0.

    dS: [B, H, N, K, V], what chunk n writes, already decayed to the chunk's end.
    G_total: None, [B, H, N] or [B, H, N, K], the log-decay over the whole chunk.
    S0: [B, H, K, V] or None (zeros).
    Returns (S_in [B, H, N, K, V], the state entering each chunk; S_final [B, H, K, V]).

    The only sequential part of a chunked form: a loop over the N chunks, not over the T tokens.
    (Without a gate it is an exclusive prefix sum; the loop of N adds is faster in NumPy than
    `cumsum` along a middle axis.)
    """
    xp = array_module(dS)
    S = xp.zeros_like(dS[:, :, 0]) if S0 is None else S0
    S_in = xp.empty_like(dS)
    for n in range(dS.shape[2]):
        S_in[:, :, n] = S
        S = decay_state(S, None if G_total is None else G_total[:, :, n]) + dS[:, :, n]
    return S_in, S


def unit_lower_inverse(A):
    """(I + A)^-1 for the strictly lower-triangular part of A [..., C, C], all matrices of the batch at once
    (A's diagonal and upper triangle are never read, so the caller need not mask them).

    This is the matrix T of the delta rule's WY representation. Doubling the block size: the inverse of a
    block lower-triangular matrix is
        [[I + A11, 0], [A21, I + A22]]^-1 = [[T1, 0], [-T2 A21 T1, T2]],
    so the inverses of the 1 x 1 diagonal blocks (ones) give those of the 2 x 2 blocks, then 4 x 4, ...,
    in log2(C) rounds of batched matrix products (C is padded to a power of two with an identity). The
    blocks are the aligned ones of `channel_gram`: at level s, each aligned block of 2s positions has its
    two diagonal s-blocks T1 (left) and T2 (right) already inverted, and its lower-left block is filled in
    place.

    Why not `scipy.linalg.solve_triangular`? It gives the same result to rounding (tests/test_chunking.py
    checks), but it solves a batch one matrix at a time in Python, about 40 us of overhead per 64 x 64
    system: at T = 4096 with 4 heads that is 256 systems and more time than all the arithmetic. This
    version is a handful of array operations, and runs unchanged on CuPy.
    """
    xp = array_module(A)
    *lead, C, _ = A.shape
    P = 1 << max(C - 1, 0).bit_length()
    if P != C:
        A = xp.pad(A, [(0, 0)] * len(lead) + [(0, P - C), (0, P - C)])
    T = xp.empty(A.shape, A.dtype)
    T.fill(0)
    _diagonal_view(T)[...] = 1  # the inverses of the P diagonal blocks of size 1
    s = 1
    if P >= 4:
        _small_levels(T, A, xp)
        s = 4
    while s < P:
        T21, A21 = _lower_blocks(T, s), _lower_blocks(A, s)
        diagonal = _diagonal_blocks(T, s)            # [..., P / s, s, s], already inverted
        T1, T2 = diagonal[..., 0::2, :, :], diagonal[..., 1::2, :, :]
        xp.matmul(T2 @ A21, T1, out=T21)
        xp.negative(T21, out=T21)
        s *= 2
    return T[..., :C, :C]


def _small_levels(T, A, xp):
    """The first two levels of `unit_lower_inverse` (s = 1, 2) written out, in place in T [..., P, P].

    As batched products they would be P / 2 products of 1 x 1 and P / 4 of 2 x 2 matrices per chunk: tens
    of thousands of BLAS calls for a few multiplications each, the slowest rounds of the inverse. By hand:
    s = 1: T1 = T2 = 1, so T21 = -A21, the single entry t_{2m+1, 2m} = -a_{2m+1, 2m}.
    s = 2: T1 = [[1, 0], [x, 1]], T2 = [[1, 0], [y, 1]] (from s = 1), A21 = [[a, b], [c, d]]:
        T2 A21 T1 = [[a + b x, b], [(y a + c) + (y b + d) x, y b + d]],   T21 = -(T2 A21 T1).
    """
    T1_entries = _lower_blocks(T, 1)[..., 0, 0]               # [..., P / 2]: t_{2m+1, 2m}
    xp.negative(_lower_blocks(A, 1)[..., 0, 0], out=T1_entries)
    A21, T21 = _lower_blocks(A, 2), _lower_blocks(T, 2)       # [..., P / 4, 2, 2]
    x, y = T1_entries[..., 0::2], T1_entries[..., 1::2]       # the 2 x 2 diagonal blocks' lower entries
    a, b, c, d = A21[..., 0, 0], A21[..., 0, 1], A21[..., 1, 0], A21[..., 1, 1]
    lower_right = y * b + d
    T21[..., 0, 0] = -(a + b * x)
    T21[..., 0, 1] = -b
    T21[..., 1, 0] = -(y * a + c + lower_right * x)
    T21[..., 1, 1] = -lower_right


def unit_lower_solve(A, X):
    """Y = (I + A)^-1 X for the strictly lower-triangular part of A [..., C, C] and X [..., C, V], without
    forming the inverse: forward substitution by halves,
        Y_1 = (I + A_11)^-1 X_1,    Y_2 = (I + A_22)^-1 (X_2 - A_21 Y_1),
    down to blocks of 64, which `unit_lower_inverse` inverts. About C^2 V / 2 multiply-adds against the
    inverse's C^3 / 3: for one chunk holding a whole long sequence (the delta rule's parallel form), where
    C is in the thousands and V is 64, that is the difference between milliseconds and seconds.
    """
    xp = array_module(A)
    C = A.shape[-1]
    if C <= 64:
        return unit_lower_inverse(A) @ X
    h = 1 << ((C - 1).bit_length() - 1)  # the largest power of two below C
    Y1 = unit_lower_solve(A[..., :h, :h], X[..., :h, :])
    Y2 = unit_lower_solve(A[..., h:, h:], X[..., h:, :] - A[..., h:, :h] @ Y1)
    return xp.concatenate([Y1, Y2], axis=-2)


def _diagonal_blocks(A, s: int):
    """A view [..., P / s, s, s] of the aligned diagonal s x s blocks of A [..., P, P]."""
    P, (rows, columns) = A.shape[-1], A.strides[-2:]
    strides = A.strides[:-2] + (s * (rows + columns), rows, columns)
    return array_module(A).lib.stride_tricks.as_strided(A, A.shape[:-2] + (P // s, s, s), strides)



# ---------------------------------------------------------------------------------------------------------
# Backward twins of the pieces above.
#
# Each takes the cotangent of its forward twin's output (the gradient of a scalar loss with respect to it,
# same shape) and returns the cotangents of the forward's inputs. Gates stay in log space: a gate's
# gradient is read off products already computed (`gate_terms`), never from exp(-G).
# ---------------------------------------------------------------------------------------------------------


def to_chunks_transposed(x, chunk_size: int):
    """[B, T, H, F] -> [B, H, N, F, C]: `transposed(to_chunks(x))` in one copy instead of two."""
    xp = array_module(x)
    B, T, H, F = x.shape
    N = num_chunks(T, chunk_size)
    pad = N * chunk_size - T
    if pad:
        x = xp.pad(x, [(0, 0), (0, pad), (0, 0), (0, 0)])
    return xp.ascontiguousarray(x.reshape(B, N, chunk_size, H, F).transpose(0, 3, 1, 4, 2))


def sum_to_leading(x, ndim: int):
    """Sum away the extra leading axes that broadcasting added: [e..., *shape] -> [*shape] (ndim axes)."""
    extra = x.ndim - ndim
    return x.sum(axis=tuple(range(extra))) if extra > 0 else x


def reverse_cumsum(x, axis: int):
    """y_i = sum_{j >= i} x_j along `axis`: the backward of a cumulative sum (of `local_cumsum` on axis 3)."""
    xp = array_module(x)
    return xp.flip(xp.cumsum(xp.flip(x, axis), axis), axis)


def gate_terms(x, dx, G):
    """The per-token terms of a log-gate's gradient: x * dx in G's shape (x, dx [..., C, K]; G [..., C, K]
    per channel or [..., C] scalar, with x's leading axes).

    The rule behind every gate gradient here. If a row x_i enters the forward only as y_i = x_i exp(s G_i)
    (s = +1 or -1), then dx_i = dy_i exp(s G_i) and, since d/du (x e^u) = x e^u,
        dL/dG_i |through x_i = s * (dy_i . y_i) = s * (x_i . dx_i):
    the row times its own cotangent, with no exponential of its own. A per-channel gate keeps the product
    per channel; a scalar gate sums it over K.
    """
    if G.ndim == x.ndim:
        return x * dx
    return array_module(x).einsum("...k,...k->...", x, dx)  # the row dot products, without an x * dx temporary


def gated_gram_backward(dA, x, y, G, *, strict: bool = False, decay=None):
    """The backward of `gated_gram`: (dx, dy) from dA [..., C, C], the cotangent of A.

    Forward, with m_ij = 1 where j <= i (j < i when strict), else 0:
        A_ij = m_ij sum_k x_ik y_jk exp(G_ik - G_jk).
    Write P_ijk = m_ij exp(G_ik - G_jk), mask and decay together; P only holds exponentials of
    non-positive numbers (G is non-increasing and j <= i). A is linear in x and in y:
        dx_ik = sum_j dA_ij P_ijk y_jk          row i of dA, against the keys it decayed
        dy_jk = sum_i dA_ij P_ijk x_ik          column j of dA, against the queries.
    With no gate or a scalar one, P is one [C, C] matrix for all k, so with M = dA * P:
        dx = M y,    dy = M^T x                  (two batched matrix products)
    and for a per-channel gate the same sums are taken sub-block by sub-block (`_channel_gram_backward`).

    The gate: x_i enters as x_i exp(+G_i) and y_j as y_j exp(-G_j), so by `gate_terms`
        dG = gate_terms(x, dx, G) - gate_terms(y, dy, G)          (= x dx - y dy per channel)
    (with stacked x, sum gate_terms(x, dx, G) over the extra axes first).

    x may carry extra leading axes (several Grams sharing y and G): dx keeps them, dy sums them away.
    decay: P itself, [..., C, C], for no gate or a scalar one, when the caller has built it already
    (`gram_decay`); None builds it here.
    """
    xp = array_module(x)
    if G is not None and G.ndim == y.ndim:
        return _channel_gram_backward(dA, x, y, G, strict)
    M = dA * (gram_decay(G, x.shape[-2], xp, strict=strict) if decay is None else decay)
    # M^T as the left operand: NumPy multiplies a swapped view on the left at nearly full speed.
    return M @ y, sum_to_leading(M.swapaxes(-1, -2) @ x, y.ndim)


def gram_decay(G, C: int, xp, *, strict: bool = False):
    """P_ij = m_ij exp(G_i - G_j), the mask and decay of `gated_gram` as one [..., C, C] matrix, for no gate
    (the causal mask alone, [C, C] boolean) or a scalar one (`decay_matrix`); so that with
    P = gram_decay(G, C, xp), gated_gram(x, y, G) = (x @ y^T) * P."""
    return causal_mask(C, xp, strict=strict) if G is None else decay_matrix(G, strict=strict)


def _channel_gram_backward(dA, x, y, G, strict):
    """dx, dy of the per-channel `gated_gram`: the chain rule through `channel_gram`'s sub-blocks.

    The forward cut A into sub-blocks of c = SUB_CHUNK positions, (a, b) = (block of i, block of j):
    - diagonal blocks (a = b): A_ij = sum_k x_ik y_jk D_ijk with D_ijk = m_ij exp(G_ik - G_jk) formed
      outright, [c, c, K]. Backward, with dA restricted to the block:
          dx_ik = sum_j dA_ij D_ijk y_jk,      dy_jk = sum_i dA_ij D_ijk x_ik;
    - blocks below the diagonal (a > b): A_ab = X_a Y_ab^T with X_a = x_a * exp(G_a - G_ref_a) and
      Y_ab = y_b * exp(G_ref_a - G_b), r_a the last position before block a. A product's backward:
          dX_a = sum_b dA_ab Y_ab,       dY_ab = dA_ab^T X_a,
      then through the two decays (elementwise): dx_a += dX_a * exp(G_a - G_ref_a),
      dy_b += sum_{a > b} dY_ab * exp(G_ref_a - G_b).
    Every exponential is one the forward takes, of a non-positive number. Blocks with a <= b have
    Y_ab = 0 (the diagonal blocks' products are the ones replaced by D), so the full [ns, ns] products
    need no extra mask.
    """
    xp = array_module(x)
    C, K = x.shape[-2:]
    c = min(SUB_CHUNK, C)
    ns = -(-C // c)
    pad = ns * c - C
    if pad:
        def widths(a, last=(0, 0)):
            return [(0, 0)] * (a.ndim - 2) + [(0, pad), last]
        x, y = xp.pad(x, widths(x)), xp.pad(y, widths(y))
        G = xp.pad(G, widths(G), mode="edge")
        dA = xp.pad(dA, widths(dA, (0, pad)))
    xs, ys, Gs = (a.reshape(*a.shape[:-2], ns, c, K) for a in (x, y, G))
    dblocks = xp.moveaxis(dA.reshape(*dA.shape[:-2], ns, c, ns, c), -3, -2)  # [..., a, b, c(i), c(j)]

    # Diagonal sub-blocks: exp(G_i - G_j) [..., s, c(i), c(j), K] as in the forward, built in place; above
    # the diagonal G_i - G_j >= 0 is clamped to 0 before exp, and the mask goes on dA's blocks instead.
    decay = Gs[..., :, None, :] - Gs[..., None, :, :]
    xp.minimum(decay, 0, out=decay)
    xp.exp(decay, out=decay)
    s = xp.arange(ns)
    dA_diag = dblocks[..., s, s, :, :] * causal_mask(c, xp, strict=strict)   # dA_ij m_ij, [..., s, c, c]
    dxs = xp.einsum("...ij,...ijk,...jk->...ik", dA_diag, decay, ys)        # sum over j
    dys = sum_to_leading(xp.einsum("...ij,...ijk,...ik->...jk", dA_diag, decay, xs), ys.ndim)  # over i

    # Sub-blocks below the diagonal, through the reference r_a.
    G_ref = xp.concatenate([xp.zeros_like(Gs[..., :1, -1, :]), Gs[..., :-1, -1, :]], axis=-2)
    x_decay = xp.exp(Gs - G_ref[..., None, :])                               # [..., a, c, K]
    earlier = (xp.arange(ns)[:, None] > xp.arange(ns)[None, :])[:, :, None, None]
    y_decay = xp.exp(xp.where(earlier, G_ref[..., :, None, None, :] - Gs[..., None, :, :, :], -xp.inf))
    X = xs * x_decay                                                          # [..., a, c, K]
    Y = ys[..., None, :, :, :] * y_decay                                      # [..., a, b, c, K]
    dX = (dblocks @ Y).sum(-3)                                                # sum over b
    dY = dblocks.swapaxes(-1, -2) @ X[..., :, None, :, :]                     # [..., a, b, c(j), K]
    dxs += dX * x_decay
    dys += sum_to_leading(xp.einsum("...abjk,...abjk->...bjk", dY, y_decay), ys.ndim)   # sum over a

    dx = dxs.reshape(*dxs.shape[:-3], ns * c, K)[..., :C, :]
    dy = dys.reshape(*dys.shape[:-3], ns * c, K)[..., :C, :]
    return dx, dy


def gram_before_decay_backward(dA, x, y, G):
    """The backward of `gram_before_decay`: (dx, dy) from dA [..., C, C].

    The forward is `gated_gram(x, y', G')` with y'_{j+1} = y_j and G'_i = G_{i-1} (G'_0 = 0), read one
    column to the right: A_ij = A'_{i, j+1}. Its backward undoes each shift in turn:
        dA'_{i, j+1} = dA_ij (dA'_{i, 0} = 0),   (dx, dy') = gated_gram_backward(dA', x, y', G'),
        dy_j = dy'_{j+1}                          (the last position's y is read by no one: 0).
    The gate: x_i enters as x_i exp(+G_{i-1}) and y_j as y_j exp(-G_j), so (`gate_terms`)
        dG_i = gate_terms(x, dx, G)_{i+1} - gate_terms(y, dy, G)_i.
    """
    xp = array_module(x)
    y_later = xp.concatenate([xp.zeros_like(y[..., :1, :]), y[..., :-1, :]], axis=-2)
    dshifted = xp.concatenate([xp.zeros_like(dA[..., :1]), dA[..., :-1]], axis=-1)
    dx, dy_later = gated_gram_backward(dshifted, x, y_later, exclusive_cumsum(G))
    return dx, xp.concatenate([dy_later[..., 1:, :], xp.zeros_like(dy_later[..., :1, :])], axis=-2)


def pass_states_backward(dS_in, G_total, dS_final=None):
    """The backward of `pass_states`: the adjoint of the state pass, chunk by chunk from the last.

    Forward: S_{n+1} = exp(G_total_n) S_n + dS_n for n = 0..N-1, S_0 = S0; it returns S_in[n] = S_n
    and S_final = S_N. Given the cotangents dS_in [B, H, N, K, V] (of S_in: what reading S_n
    contributes) and dS_final [B, H, K, V] (None = zeros), let Sbar_n be the total cotangent of S_n:
        Sbar_N = dS_final
        Sbar_n = dS_in[n] + exp(G_total_n) Sbar_{n+1}            the pass run backwards; exponent <= 0
    and read the inputs' cotangents off the forward's terms:
        d(dS_n) = Sbar_{n+1}     (what chunk n writes enters S_{n+1} as it is)
        dS0     = Sbar_0
    Returns (d(dS) [B, H, N, K, V], dS0 [B, H, K, V]).

    The gate's part is left to the caller, who knows where else its gate enters: through this pass alone,
        dG_total_n = sum_v Sbar_{n+1} * exp(G_total_n) S_n        (summed over K too for a scalar gate)
    (`_gated_linear.chunked_backward` folds it with the writes' own decay into one chunk-end term).
    Like the forward, the only sequential part: a loop over N chunks, not T tokens.
    """
    xp = array_module(dS_in)
    d_writes = xp.empty_like(dS_in)
    Sbar = xp.zeros_like(dS_in[:, :, 0]) if dS_final is None else dS_final
    for n in reversed(range(dS_in.shape[2])):
        d_writes[:, :, n] = Sbar
        Sbar = decay_state(Sbar, None if G_total is None else G_total[:, :, n]) + dS_in[:, :, n]
    return d_writes, Sbar
