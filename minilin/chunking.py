"""The pieces every chunked form shares, written once.

A chunked form cuts the sequence into N chunks of C tokens, does the work inside each chunk as dense
matrix products (all chunks at once), and passes the fixed-size state from one chunk to the next.

Layouts used here:
- sequence tensors come in sequence-first, [B, T, H, ...] (CONVENTIONS.md);
- chunked tensors are [B, H, N, C, ...]: batch, head, chunk, position inside the chunk, features;
- a gate is either absent (None), scalar ([..., C], one decay per token and head) or per-channel
  ([..., C, K], one decay per key channel). `G` always means a chunk-local cumulative log-gate:
  `G_i = g_1 + ... + g_i` counted from the chunk's start, so `G` is non-increasing inside a chunk and
  `G_i - G_j <= 0` whenever `i >= j`.

Numerics: only non-positive numbers are ever exponentiated (differences `G_i - G_j` with `i >= j`),
never `exp(+cumsum)` or `exp(G_i) * exp(-G_j)`, so strong decays underflow to 0 and never overflow.
"""
from __future__ import annotations

from .backend import array_module

# Width of the sub-blocks inside a chunk for per-channel gates (see `gated_gram`).
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


def decay_matrix(G, *, strict: bool = False):
    """Scalar gate: L_ij = exp(G_i - G_j) for j <= i (j < i when strict), else 0. [..., C] -> [..., C, C].

    This is Mamba-2's 1-semiseparable mask (`exp(segsum(A))`) and, for a constant gate, RetNet's
    decay mask gamma^(i-j). Masked entries are set to -inf before exp, so nothing overflows.
    """
    xp = array_module(G)
    L = G[..., :, None] - G[..., None, :]
    xp.minimum(L, 0, out=L)  # above the diagonal G_i - G_j >= 0 may be large: clamp before exp ...
    xp.exp(L, out=L)
    L *= causal_mask(G.shape[-1], xp, strict=strict)  # ... and zero it after
    return L


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
    """
    return array_module(x).ascontiguousarray(x.swapaxes(-1, -2))


def gated_gram(x, y, G, *, strict: bool = False):
    """A_ij = sum_k x_ik y_jk exp(G_ik - G_jk) for j <= i (j < i when strict), else 0.

    x, y: [..., C, K]; G: None, scalar [..., C] or per-channel [..., C, K] -> A: [..., C, C].
    This is the intra-chunk "attention" matrix of every gated linear mixer: (Q K^T) masked and decayed.
    """
    xp = array_module(x)
    if G is None:
        A = x @ transposed(y)
        A *= causal_mask(x.shape[-2], xp, strict=strict)
        return A
    if G.ndim == y.ndim - 1:  # scalar gate (x may carry extra leading axes; y and G never do)
        A = x @ transposed(y)
        A *= decay_matrix(G, strict=strict)
        return A
    return _channel_gram(x, y, G, strict)


def gram_before_decay(x, y, G):
    """A_ij = sum_k x_ik y_jk exp(G_{i-1,k} - G_{j,k}) for j < i, else 0 (G_{-1} = 0).

    x, y: [..., C, K]; G: per-channel chunk-local cumulative gate [..., C, K] -> A: [..., C, C].
    Row i reads the memory as it was *before* token i's own decay and write: RWKV-6's S_{t-1}^T q_t,
    RWKV-7's a_t^T S_{t-1}. Built from `chunking.gated_gram` by shifting y one position later: with
    y'_{j+1} = y_j and G'_i = G_{i-1} (the exclusive cumulative gate),
        A_ij = sum_k x_ik y'_{j+1,k} exp(G'_ik - G'_{j+1,k}),   j + 1 <= i,
    the causal gram of (x, y') under G', read one column to the right. G' is non-increasing like G,
    so `gated_gram`'s stable sub-block evaluation applies unchanged.
    """
    xp = array_module(x)
    y_later = xp.concatenate([xp.zeros_like(y[..., :1, :]), y[..., :-1, :]], axis=-2)
    G_before = exclusive_cumsum(G)
    shifted = gated_gram(x, y_later, G_before)
    return xp.concatenate([shifted[..., 1:], xp.zeros_like(shifted[..., :1])], axis=-1)


def exclusive_cumsum(G):
    """G_{i-1} from the inclusive chunk-local G_i [..., C, K] (0 at the chunk's first position)."""
    xp = array_module(G)
    return xp.concatenate([xp.zeros_like(G[..., :1, :]), G[..., :-1, :]], axis=-2)


def _channel_gram(x, y, G, strict):
    """Per-channel `gated_gram`, finite for any gate, in sub-blocks of SUB_CHUNK positions.

    exp(G_i - G_j) differs per channel, so A cannot be one product of decayed x and y unless one side
    is multiplied by exp(-G), which overflows. Instead (as FLA's GLA kernels do):
    - inside a diagonal sub-block the [c, c, K] tensor exp(G_i - G_j) is formed outright (small);
    - for sub-block a below the diagonal, against an earlier sub-block b, both sides are measured
      from the reference r_a, the last position before block a:
          exp(G_i - G_j) = exp(G_i - G_{r_a}) * exp(G_{r_a} - G_j),
      and both factors have non-positive exponents because j <= r_a < i.
    """
    xp = array_module(x)
    C, K = x.shape[-2:]
    c = min(SUB_CHUNK, C)
    ns = -(-C // c)
    pad = ns * c - C
    if pad:
        def widths(a):
            return [(0, 0)] * (a.ndim - 2) + [(0, pad), (0, 0)]
        x, y = xp.pad(x, widths(x)), xp.pad(y, widths(y))
        G = xp.pad(G, widths(G), mode="edge")  # keeps G non-increasing; padded x, y are zero anyway
    # Each array keeps its own leading axes, so x may carry extra ones (several grams, one decay).
    xs, ys, Gs = (a.reshape(*a.shape[:-2], ns, c, K) for a in (x, y, G))

    # Diagonal sub-blocks: [..., ns, c(i), c(j), K].
    diff = Gs[..., :, None, :] - Gs[..., None, :, :]
    inside = causal_mask(c, xp, strict=strict)[..., None]
    decay = xp.exp(xp.where(inside, diff, -xp.inf))
    diagonal = (xs[..., :, None, :] * ys[..., None, :, :] * decay).sum(-1)

    # Sub-blocks below the diagonal: reference r_a is the last position of block a - 1 (G = 0 for a = 0).
    G_ref = xp.concatenate([xp.zeros_like(Gs[..., :1, -1, :]), Gs[..., :-1, -1, :]], axis=-2)
    x_from_ref = xs * xp.exp(Gs - G_ref[..., None, :])  # [..., a, c, K]
    earlier = (xp.arange(ns)[:, None] > xp.arange(ns)[None, :])[:, :, None, None]  # [a, b, 1, 1]
    ref_minus_j = G_ref[..., :, None, None, :] - Gs[..., None, :, :, :]  # [..., a, b, c, K]
    y_to_ref = ys[..., None, :, :, :] * xp.exp(xp.where(earlier, ref_minus_j, -xp.inf))
    blocks = x_from_ref[..., :, None, :, :] @ y_to_ref.swapaxes(-1, -2)  # [..., a, b, c(i), c(j)]

    a = xp.arange(ns)
    blocks[..., a, a, :, :] = diagonal
    A = xp.moveaxis(blocks, -3, -2).reshape(*blocks.shape[:-4], ns * c, ns * c)  # [..., a, i, b, j]
    return A[..., :C, :C]


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
    """(I + A)^-1 for strictly lower-triangular A [..., C, C], all matrices of the batch at once.

    This is the matrix T of the delta rule's WY representation. Doubling the block size: the inverse of a
    block lower-triangular matrix is
        [[I + A11, 0], [A21, I + A22]]^-1 = [[T1, 0], [-T2 A21 T1, T2]],
    so the inverses of the 1 x 1 diagonal blocks (ones) give those of the 2 x 2 blocks, then 4 x 4, ...,
    in log2(C) rounds of batched matrix products (C is padded to a power of two with an identity).

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
    T = xp.ones((*lead, P, 1, 1), A.dtype)  # inverses of the P diagonal blocks of size 1
    size = 1
    while size < P:
        blocks = A.reshape(*lead, P // (2 * size), 2 * size, P // (2 * size), 2 * size)
        diagonal = xp.moveaxis(xp.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)  # [..., nb, 2s, 2s]
        T1, T2 = T[..., 0::2, :, :], T[..., 1::2, :, :]
        merged = xp.zeros(diagonal.shape, A.dtype)
        merged[..., :size, :size] = T1
        merged[..., size:, size:] = T2
        merged[..., size:, :size] = -(T2 @ diagonal[..., size:, :size]) @ T1
        T, size = merged, 2 * size
    return T[..., 0, :C, :C]



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
    """dx, dy of the per-channel `gated_gram`: the chain rule through `_channel_gram`'s sub-blocks.

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
