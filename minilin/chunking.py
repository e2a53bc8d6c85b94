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
The chunked backward engines take their decays the same way: a scalar gate summed in float64 per chunk, a
per-channel gate only through `channel_gram` and its backward, `channel_gram_backward`.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .backend import array_module


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
    rest = tuple(range(4, x.ndim + 1))                     # (moveaxis does the same, ten times slower)
    return x.reshape(B, N, chunk_size, H, *x.shape[3:]).transpose(0, 3, 1, 2, *rest)


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
    return _running_sum(g, 3, reverse=False, in_place=False)


def chunk_gate_sums(g, chunk_size: int):
    """A scalar log-gate's chunk-local cumulative sums in float64: g [B, T, H] -> G [B, H, N, C], G_i =
    g_1 + ... + g_i from each chunk's start (zero gates past T, as `chunk_view` pads).

    In float64 so that each later difference G_i - G_j is exact before its one rounding (the module's note
    on numerics). The gates are copied into a fresh contiguous float64 array first and summed there in
    place: NumPy's cumsum straight over the strided chunk view of float32 gates (rows H apart, a cast per
    element) took about twice as long (21 against 11 us per 512 tokens of 4 heads at C = 16, on the 2-core
    development machine). Always a copy, never g itself, since the sum overwrites it.

    Each gate is raised to LOG_GATE_FLOOR first: a valid gate can be as low as -1.8e308, and two of them sum to
    -inf, whose difference with itself is NaN; at the floor exp is already 0 in float64, so no decay changes.
    """
    xp = array_module(g)
    G = xp.array(chunk_view(g, chunk_size), dtype=xp.float64, order="C", copy=True)
    xp.maximum(G, LOG_GATE_FLOOR, out=G)
    return xp.cumsum(G, axis=-1, out=G)


# A per-token log-gate at or below this decays to exactly 0 in float64 (exp(-746) is 0 already), so the sums take
# gates clipped to it (`chunk_gate_sums`): sums of thousands of them stay finite.
LOG_GATE_FLOOR = -1000.0


def _running_sum(x, axis: int, *, reverse: bool, in_place: bool):
    """The inclusive running sum of x along `axis`, from its start (reverse: from its end); in x itself
    when in_place. Along the last axis NumPy's cumsum; along any other, a loop of row additions over that
    axis (NumPy's cumsum along a middle axis of [B, H, N, C, K] runs about 15 times slower than the C adds
    of [B, H, N, K] rows, measured on the 2-core development machine)."""
    xp = array_module(x)
    axis %= x.ndim
    if axis == x.ndim - 1:
        flipped = (lambda a: xp.flip(a, axis)) if reverse else (lambda a: a)
        summed = flipped(xp.cumsum(flipped(x), axis))
        if in_place:
            x[...] = summed
            return x
        return summed
    out = x if in_place else x.copy()
    rows = xp.moveaxis(out, axis, 0)
    order = range(rows.shape[0] - 2, -1, -1) if reverse else range(1, rows.shape[0])
    step = 1 if reverse else -1
    for i in order:
        xp.add(rows[i], rows[i + step], out=rows[i])
    return out


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


def states_after_chunks(dS, decay, S0):
    """Inter-chunk state passing, in place: dS_n <- S_n = decay_n S_{n-1} + dS_n (S_{-1} = S0), returns dS.

    dS: [B, H, N, K, V], what chunk n writes, already decayed to the chunk's end; overwritten by the state
    after each chunk (the state entering chunk n is then dS[:, :, n - 1], or S0 for n = 0).
    decay: None, [B, H, N] or [B, H, N, K], the decay factor exp(G_C) over each whole chunk (not its log).
    S0: [B, H, K, V] or None (zeros).

    What the chunked backward passes recompute (the forward passes states with `read_and_pass`, which also
    reads each chunk's output): one or two array operations per chunk, none per token, and no array of N
    states besides dS itself.
    """
    xp = array_module(dS)
    N = dS.shape[2]
    if decay is not None:  # [B, H, N, 1, 1] (scalar) or [B, H, N, K, 1]: scales the rows of each state
        decay = decay[..., None, None] if decay.ndim == 3 else decay[..., None]
    if S0 is not None:
        dS[:, :, 0] += S0 if decay is None else decay[:, :, 0] * S0
    carried = None if decay is None else xp.empty_like(dS[:, :, 0])
    for n in range(1, N):
        if decay is None:
            xp.add(dS[:, :, n], dS[:, :, n - 1], out=dS[:, :, n])
        else:
            xp.multiply(dS[:, :, n - 1], decay[:, :, n], out=carried)
            xp.add(dS[:, :, n], carried, out=dS[:, :, n])
    return dS


def read_and_pass(A, q_from_start, k_to_end_T, chunk_decay, v, S0, chunk_size: int, out=None):
    """The chunked form of a gated linear recurrence, given its chunk pieces: (o [B, T, H, V], final state).

    A [B, H, N, C, C]: the chunk's masked, decayed scores; q_from_start [B, H, N, C, K]: the queries decayed
    from the chunk's start; k_to_end_T [B, H, N, K, C]: the keys decayed to its end, transposed (a swapped
    view will do); chunk_decay: None, [B, H, N] or [B, H, N, K], the decay over each whole chunk (factors,
    not logs); v [B, T, H, V]; S0 or None. Then
        S_0 = S0,    S_{n+1} = chunk_decay_n S_n + (k_to_end)_n^T V_n,    O_n = (q_from_start)_n S_n + A_n V_n.
    The writes (k_to_end)_n^T V_n of chunks 0 .. N-2 are one batched product straight into the slots
    1 .. N-1 of the array of entering states S_n, which the pass then turns into the states in place
    (S_n += chunk_decay_{n-1} S_{n-1}): no array of writes besides the states. The states are laid out
    chunk first in memory, [B, N, H, K, V] (seen as [B, H, N, K, V] by the products), so that each step
    of the pass adds one contiguous block of all heads: with the heads outermost, each step strode over
    H blocks of K V numbers, about 1.5x as long (measured on the 2-core development machine). V is read
    where it lies (a chunk view): NumPy's products read its strided rows a little slower than a contiguous
    copy, but less slowly than the copy costs.
    out: None, or where to write O, [B, H, N, C, V] (a chunk view of the output, `chunk_view`); then the
    result is (out, final state), with no layout copy of O. The intra-chunk term A V then goes to a buffer
    laid out as the output is, [B, N * C, H, V] in memory, so that adding it to O is one pass over
    contiguous rows: added to the chunk view directly, NumPy steps through it V numbers at a time (the rows
    of different heads are not adjacent in the view's order), which took about 8x as long.
    """
    xp = array_module(v)
    T = v.shape[1]
    vc = chunk_view(v, chunk_size)                           # [B, H, N, C, V], a view
    B, H, N = A.shape[:3]
    K, V = k_to_end_T.shape[-2], v.shape[-1]
    if chunk_decay is not None:  # [B, H, N, 1, 1] (scalar) or [B, H, N, K, 1]: scales the rows of each state
        chunk_decay = chunk_decay[..., None, None] if chunk_decay.ndim == 3 else chunk_decay[..., None]
    states = xp.empty((B, N, H, K, V), v.dtype)              # S_n, the state entering chunk n, chunk first
    S_in = states.transpose(0, 2, 1, 3, 4)                   # ... seen as [B, H, N, K, V]
    states[:, 0] = 0 if S0 is None else S0
    xp.matmul(k_to_end_T[:, :, :-1], vc[:, :, :-1], out=S_in[:, :, 1:])   # the writes of chunks 0 .. N-2
    carried = None if chunk_decay is None else xp.empty((B, H, K, V), v.dtype)
    for n in range(1, N):                                    # the pass, in place: the only sequential part
        if chunk_decay is None:
            states[:, n] += states[:, n - 1]
        else:
            states[:, n] += xp.multiply(states[:, n - 1], chunk_decay[:, :, n - 1], out=carried)
    S_final = k_to_end_T[:, :, -1] @ vc[:, :, -1]
    S_final += S_in[:, :, -1] if chunk_decay is None else chunk_decay[:, :, -1] * S_in[:, :, -1]
    o = xp.matmul(q_from_start, S_in, out=out)               # inter-chunk: the state entering chunk n
    if out is None:
        o += A @ vc                                          # intra-chunk
        return from_chunks(o, T), S_final
    intra = chunked_output(v, chunk_size)[1]                 # [B, H, N, C, V], a view of [B, N * C, H, V]
    xp.matmul(A, vc, out=intra)                              # intra-chunk, laid out as the output
    xp.add(out, intra, out=out)                              # the same strides: NumPy adds whole rows
    return out, S_final


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
        [[I + A11, 0], [A21, I + A22]]^-1 = [[T1, 0], [-T2 A21 T1, T2]] = [[T1, 0], [T2 M21 T1, T2]]
    with M = -A, so the inverses of the 1 x 1 diagonal blocks (ones) give those of the 2 x 2 blocks, then
    4 x 4, ..., in log2(C) rounds of batched matrix products (C is padded to a power of two with an
    identity). The blocks are the aligned ones of `channel_gram`: at level s, each aligned block of 2s
    positions has its two diagonal s-blocks T1 (left) and T2 (right) already inverted, and its lower-left
    block is filled in place. The rounds read M, negated once here, so that no round negates its own
    blocks (bit for bit the same numbers: a negation is exact; 15-20% faster at C = 16 to 64 than a
    negation per round, measured on the 2-core development machine).

    Why not `scipy.linalg.solve_triangular`? It gives the same result to rounding (tests/test_chunking.py
    checks), but it solves a batch one matrix at a time in Python, about 40 us of overhead per 64 x 64
    system: at T = 4096 with 4 heads that is 256 systems and more time than all the arithmetic. This
    version is a handful of array operations, and runs unchanged on CuPy.
    """
    xp = array_module(A)
    *lead, C, _ = A.shape
    P = 1 << max(C - 1, 0).bit_length()
    M = xp.negative(A)                               # M = -A: the blocks T2 M21 T1 need no sign
    if P != C:
        M = xp.pad(M, [(0, 0)] * len(lead) + [(0, P - C), (0, P - C)])
    T = xp.zeros(M.shape, M.dtype)
    _diagonal_view(T)[...] = 1  # the inverses of the P diagonal blocks of size 1
    s = 1
    if P >= 4:
        _small_levels(T, M, xp)
        s = 4
    while s < P:
        T21, M21 = _lower_blocks(T, s), _lower_blocks(M, s)
        diagonal = _diagonal_blocks(T, s)            # [..., P / s, s, s], already inverted
        T1, T2 = diagonal[..., 0::2, :, :], diagonal[..., 1::2, :, :]
        xp.matmul(T2 @ M21, T1, out=T21)
        s *= 2
    return T[..., :C, :C]


def _small_levels(T, M, xp):
    """The first two levels of `unit_lower_inverse` (s = 1, 2) written out, in place in T [..., P, P], from
    M = -A.

    As batched products they would be P / 2 products of 1 x 1 and P / 4 of 2 x 2 matrices per chunk: tens
    of thousands of BLAS calls for a few multiplications each, the slowest rounds of the inverse. By hand:
    s = 1: T1 = T2 = 1, so T21 = M21, the single entry t_{2m+1, 2m} = m_{2m+1, 2m}.
    s = 2: T1 = [[1, 0], [x, 1]], T2 = [[1, 0], [y, 1]] (from s = 1), M21 = [[a, b], [c, d]]:
        T21 = T2 M21 T1 = [[a + b x, b], [(y a + c) + (y b + d) x, y b + d]],
    each entry computed where it is stored (no temporaries).
    """
    T1_entries = _lower_blocks(T, 1)[..., 0, 0]               # [..., P / 2]: t_{2m+1, 2m}
    T1_entries[...] = _lower_blocks(M, 1)[..., 0, 0]
    M21, T21 = _lower_blocks(M, 2), _lower_blocks(T, 2)       # [..., P / 4, 2, 2]
    x, y = T1_entries[..., 0::2], T1_entries[..., 1::2]       # the 2 x 2 diagonal blocks' lower entries
    a, b, c, d = M21[..., 0, 0], M21[..., 0, 1], M21[..., 1, 0], M21[..., 1, 1]
    upper_left, upper_right, lower_left, lower_right = T21[..., 0, 0], T21[..., 0, 1], T21[..., 1, 0], T21[..., 1, 1]
    xp.multiply(b, x, out=upper_left)
    upper_left += a                                           # a + b x
    upper_right[...] = b
    xp.multiply(y, b, out=lower_right)
    lower_right += d                                          # y b + d
    xp.multiply(y, a, out=lower_left)
    lower_left += c
    lower_left += lower_right * x                             # (y a + c) + (y b + d) x


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


def output_rows(out, T: int):
    """The first T positions of an output [B, N * C, H, ...] made by `chunked_output` (a backward writes its
    gradients through the chunk view), as a plain array: the array itself when C divides T."""
    return out if out.shape[1] == T else array_module(out).ascontiguousarray(out[:, :T])


def to_chunks_transposed(x, chunk_size: int):
    """[B, T, H, F] -> [B, H, N, F, C]: `transposed(to_chunks(x))` in one copy instead of two."""
    xp = array_module(x)
    B, T, H, F = x.shape
    N = num_chunks(T, chunk_size)
    pad = N * chunk_size - T
    if pad:
        x = xp.pad(x, [(0, 0), (0, pad), (0, 0), (0, 0)])
    return xp.ascontiguousarray(x.reshape(B, N, chunk_size, H, F).transpose(0, 3, 1, 4, 2))


def row_dot(a, b, axis: int = -1):
    """sum(a * b, axis), without the a * b temporary where the array module has `vecdot` (NumPy >= 2)."""
    xp = array_module(a)
    if hasattr(xp, "vecdot"):
        return xp.vecdot(a, b, axis=axis)
    return (a * b).sum(axis)


def sum_to_leading(x, ndim: int):
    """Sum away the extra leading axes that broadcasting added: [e..., *shape] -> [*shape] (ndim axes)."""
    extra = x.ndim - ndim
    return x.sum(axis=tuple(range(extra))) if extra > 0 else x


def reverse_cumsum(x, axis: int, *, in_place: bool = False):
    """y_i = sum_{j >= i} x_j along `axis`: the backward of a cumulative sum (of `local_cumsum` on axis 3).
    in_place: written into x (a scratch array of the caller's)."""
    return _running_sum(x, axis, reverse=True, in_place=in_place)


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
    and for a per-channel gate the same sums are taken by `channel_gram`'s halving, run backwards
    (`channel_gram_backward`, on the per-token gates of G).

    The gate: x_i enters as x_i exp(+G_i) and y_j as y_j exp(-G_j), so by `gate_terms`
        dG = gate_terms(x, dx, G) - gate_terms(y, dy, G)          (= x dx - y dy per channel)
    (with stacked x, sum gate_terms(x, dx, G) over the extra axes first).

    x may carry extra leading axes (several Grams sharing y and G): dx keeps them, dy sums them away.
    decay: P itself, [..., C, C], for no gate or a scalar one, when the caller has built it already
    (`gram_decay`); None builds it here.
    """
    xp = array_module(x)
    if G is not None and G.ndim == y.ndim:
        return channel_gram_backward(dA, x, y, gates_of(G), strict=strict)[:2]
    M = dA * (gram_decay(G, x.shape[-2], xp, strict=strict) if decay is None else decay)
    # M^T as the left operand: NumPy multiplies a swapped view on the left at nearly full speed.
    return M @ y, sum_to_leading(M.swapaxes(-1, -2) @ x, y.ndim)


def gram_decay(G, C: int, xp, *, strict: bool = False):
    """P_ij = m_ij exp(G_i - G_j), the mask and decay of `gated_gram` as one [..., C, C] matrix, for no gate
    (the causal mask alone, [C, C] boolean) or a scalar one (`decay_matrix`); so that with
    P = gram_decay(G, C, xp), gated_gram(x, y, G) = (x @ y^T) * P."""
    return causal_mask(C, xp, strict=strict) if G is None else decay_matrix(G, strict=strict)


class GramBackward(NamedTuple):
    """What `channel_gram_backward` returns (shapes for x, y [..., C, K] and gates g [..., C, K])."""

    dx: object            # [..., C, K] (a tuple's stacked [nx, ..., C, K]): the gradient of x
    dy: object            # likewise for y
    from_start: object    # [..., C, K]: exp(G_i) (exp(G_{i-1}) with before_decay), x_from_start = x * from_start
    to_end: object        # [..., C, K]: exp(G_C - G_j), y_to_end = y * to_end
    chunk_decay: object   # [..., K]: exp(G_C)
    A: object             # with_gram: channel_gram's A, built in the same sweep; else None


def channel_gram_backward(dA, x, y, g, *, strict: bool = False, before_decay: bool = False,
                          dx_from_start=None, dy_to_end=None, with_gram: bool = False, out=None) -> GramBackward:
    """The backward of `channel_gram`: dx, dy from the cotangents of what it returns, through the same
    halving. No exponential beyond the forward's exp(g_i) <= 1, no cumulative gate, no [C, C, K] tensor.

    Arguments as `channel_gram` (x, y [..., C, K] or tuples of them, g the per-token log-gates [..., C, K]),
    and the cotangents of its outputs: dA [..., C, C] (A's shape: [nx, ...], [ny, ...] or [nx, ny, ...] for
    tuples), dx_from_start of x_from_start and dy_to_end of y_to_end (x's and y's shapes, a tuple's stacked
    on a new leading axis; None = zeros). Entries of dA above the diagonal (on it too, when strict or
    before_decay) are never read, so the caller need not mask it. Returns a `GramBackward`: dx, dy in x's and
    y's shapes, and the decays the sweep has built on the way, from_start = exp(G_i) and to_end = exp(G_C - G_j)
    per channel (products of the per-token decays, as the forward's: a caller whose cotangents of the decayed
    rows come later adds dx += dx_from_start * from_start itself) and exp(G_C). with_gram: also the forward's
    A, from the same sweep (one more product per level), for a caller that knows dA before it needs A.
    out: (dx, dy) arrays to write the gradients into (plain x and y; views such as the chunk view of the
    caller's result will do), else fresh ones.
    The gate's gradient is left to the caller (`gate_terms`: x_i enters scaled by exp(+G_i) (exp(+G_{i-1})
    with before_decay), y_j by exp(-G_j), and chunk_decay by exp(+G_C)).

    The forward, level by level (s = 1, 2, ..., P/2; R, L the right and left halves of each aligned block of
    2s positions, d_s(L) = exp(sum of g over L)):
        A[R, L] = X_s[R] Y_s[L]^T,     X_2s[R] = X_s[R] d_s(L),     Y_2s[L] = Y_s[L] d_s(R),
    from X_1 = x exp(g) (x with before_decay) and Y_1 = y, ending at X_P = x_from_start, Y_P = y_to_end.
    So X_s = x F_s and Y_s = y H_s, with F_s(i) and H_s(j) the products of the decays that rows i and j
    have met below level s: F_1 = exp(g) (1 with before_decay), H_1 = 1, and at the end F_P(i) = exp(G_i)
    (exp(G_{i-1})), H_P(j) = exp(G_C - G_j). The decays carry the gate, whose gradient the caller reads off
    dx and dy, so here they are constants and A[R, L] is linear in x and y. Its backward, level by level in
    the forward's order and with the forward's multiplies (F and H updated as X and Y are there):
        dx[R] += (dA[R, L] Y_s[L]) F_s[R],         dy[L] += (dA[R, L]^T X_s[R]) H_s[L],
    plus what the decayed rows and the diagonal A_ii = x_i . y_i add:
        dx += dx_from_start F_P + dA_ii y_i,       dy += dy_to_end H_P + dA_ii x_i.

    Cost: two products per level, the transposes of the forward's one, and a few multiplies over half the
    rows per level. Memory, which costs as much as arithmetic here (a first touch of a fresh page is a page
    fault): x and y are read where they lie, and besides dx and dy there are F, H and scratch for one level's
    operands and products (half of x's rows each).
    """
    xp = array_module(g)
    C, K = g.shape[-2:]
    P = 1 << max(C - 1, 0).bit_length()
    both = _several(x) and _several(y)
    if P == C and not (_several(x) or _several(y)):
        x1, y1 = x, y                                        # read only: no copy needed
        d = xp.exp(g)                                        # d_1: each token's own decay
    else:
        x1, y1 = _fresh_rows(x, P), _fresh_rows(y, P)        # zero rows after C read and write nothing
        if both:
            x1 = x1[:, None]                                 # [nx, 1, ...] against [ny, ...], as the forward
        d = xp.ones(g.shape[:-2] + (P, K), x1.dtype)
        xp.exp(g, out=d[..., :C, :])
    lead = tuple(np.broadcast_shapes(x1.shape[:-2], y1.shape[:-2]))
    if P != C:
        dA = xp.pad(dA, [(0, 0)] * (dA.ndim - 2) + [(0, P - C), (0, P - C)])
    dA = xp.broadcast_to(dA, lead + (P, P))
    A = None
    if with_gram:
        A = xp.zeros(lead + (P, P), x1.dtype)                # above the diagonal: 0
        if not (strict or before_decay):
            _diagonal_view(A)[...] = xp.einsum("...k,...k->...", x1, y1)   # x_i . y_i
    F = xp.ones(d.shape, d.dtype) if before_decay else d     # F_1 (d_1 itself: read below before it changes)
    H = xp.ones(d.shape, d.dtype)
    if out is None or P != C:
        dX, dY = xp.zeros(x1.shape, x1.dtype), xp.zeros(y1.shape, y1.dtype)
    else:
        dX, dY = out
        dX[...], dY[...] = 0, 0
    # Scratch for each level's X_s[R], Y_s[L] and their products, [..., P / 2, K] seen as [..., n_blocks, s, K].
    X_right, Y_left = (xp.empty(a.shape[:-2] + (P // 2, K), a.dtype) for a in (x1, y1))
    by_Y = by_X = xp.empty(lead + (P // 2, K), x1.dtype)     # one after the other
    s = 1
    while s < P:
        n_blocks = P // (2 * s)

        def right(a):
            return a.reshape(*a.shape[:-2], n_blocks, 2, s, K)[..., 1, :, :]

        def left(a):
            return a.reshape(*a.shape[:-2], n_blocks, 2, s, K)[..., 0, :, :]

        def blocks(a):
            return a.reshape(*a.shape[:-2], n_blocks, s, K)

        d_halves = d.reshape(*d.shape[:-2], n_blocks, 2, 1, K)
        d_left, d_right = d_halves[..., 0, :, :], d_halves[..., 1, :, :]
        dA_block = _lower_blocks(dA, s)                      # [..., n_blocks, s(R), s(L)]
        X_s = xp.multiply(right(x1), right(F), out=blocks(X_right))
        Y_s = xp.multiply(left(y1), left(H), out=blocks(Y_left))
        # At s = 1 the blocks are 1 x 1: elementwise products instead of thousands of tiny matrix products.
        product = xp.multiply if s == 1 else xp.matmul
        if A is not None:
            if s == 1:
                _lower_blocks(A, s)[..., 0] = row_dot(X_s, Y_s)
            else:
                xp.matmul(X_s, Y_s.swapaxes(-1, -2), out=_lower_blocks(A, s))          # A[R, L]
        dX_s = _sum_to_shape(product(dA_block, Y_s, out=blocks(by_Y)), X_s.shape)      # dA[R, L] Y_s[L]
        dX_s *= right(F)
        xp.add(right(dX), dX_s, out=right(dX))
        dY_s = _sum_to_shape(product(dA_block.swapaxes(-1, -2), X_s, out=blocks(by_X)), Y_s.shape)   # dA^T X_s[R]
        dY_s *= left(H)
        xp.add(left(dY), dY_s, out=left(dY))
        d_next = d_left[..., 0, :] * d_right[..., 0, :]      # d_2s: [..., n_blocks, K]
        xp.multiply(left(H), d_right, out=left(H))           # (at s = 1, d_right may be right(F): first H)
        xp.multiply(right(F), d_left, out=right(F))
        d = d_next
        s *= 2
    del X_right, Y_left, by_Y, by_X
    # The decayed rows' cotangents and the diagonal.
    for rows, cotangent, factors in ((dX, dx_from_start, F), (dY, dy_to_end, H)):
        if cotangent is not None:
            rows += _cotangent_rows(cotangent, rows.shape, rows.dtype, xp) * factors
    if not (strict or before_decay):
        dA_ii = _diagonal_view(dA)[..., None]                # [..., P, 1]
        dX += _sum_to_shape(dA_ii * y1, x1.shape)
        dY += _sum_to_shape(dA_ii * x1, y1.shape)
    if both:
        dX = dX[:, 0]
    dX, dY = dX[..., :C, :], dY[..., :C, :]
    if out is not None and P != C:
        out[0][...], out[1][...] = dX, dY
        dX, dY = out
    if A is not None:
        A = A[..., :C, :C]
    return GramBackward(dX, dY, F[..., :C, :], H[..., :C, :], d[..., 0, :], A)


def _cotangent_rows(d, shape, dtype, xp):
    """A fresh accumulator of `shape` [..., P, K] holding the cotangent d [..., C, K] in its first C rows
    (a tuple of them stacked on the leading axis, as `_fresh_rows`; None: zeros), zeros after."""
    if not _several(d) and d.shape == tuple(shape):
        return d
    out = xp.zeros(shape, dtype)
    if d is not None:
        for i, part in enumerate(d) if _several(d) else ((None, d),):
            rows = out if i is None else out[i]
            rows[..., :part.shape[-2], :] = part
    return out


def _sum_to_shape(x, shape):
    """x summed over the axes that broadcasting added to reach its shape from `shape`."""
    extra = x.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape) if n == 1 and x.shape[extra + i] != 1)
    return x.sum(axis=axes).reshape(shape) if axes else x


def gram_before_decay_backward(dA, x, y, G):
    """The backward of `gram_before_decay`: (dx, dy) from dA [..., C, C].

    `channel_gram_backward(..., before_decay=True)` on the per-token gates of G. The gate: x_i enters as
    x_i exp(+G_{i-1}) and y_j as y_j exp(-G_j), so (`gate_terms`)
        dG_i = gate_terms(x, dx, G)_{i+1} - gate_terms(y, dy, G)_i.
    """
    return channel_gram_backward(dA, x, y, gates_of(G), before_decay=True)[:2]


def pass_states_backward(dS_in, G_total, dS_final=None, *, chunk_decay=None, in_place: bool = False):
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
    chunk_decay: the factors exp(G_total) instead of G_total (pass G_total=None), as `states_after_chunks`
    takes them. in_place: d(dS) overwrites dS_in (a scratch array of the caller's), which saves an array of
    N states.
    """
    xp = array_module(dS_in)
    d_writes = dS_in if in_place else xp.empty_like(dS_in)
    Sbar = xp.zeros_like(dS_in[:, :, 0]) if dS_final is None else dS_final
    if chunk_decay is not None:  # [B, H, N, 1, 1] (scalar) or [B, H, N, K, 1]: scales the rows of each state
        chunk_decay = chunk_decay[..., None, None] if chunk_decay.ndim == 3 else chunk_decay[..., None]
    read = xp.empty_like(Sbar)
    for n in reversed(range(dS_in.shape[2])):
        read[...] = dS_in[:, :, n]                                   # before d_writes[n] may overwrite it
        d_writes[:, :, n] = Sbar
        if chunk_decay is not None:
            Sbar = Sbar * chunk_decay[:, :, n]
        elif G_total is not None:
            Sbar = decay_state(Sbar, G_total[:, :, n])
        Sbar = Sbar + read
    return d_writes, Sbar
