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
