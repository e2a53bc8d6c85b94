"""Sliding-window attention (Child et al. 2019's local band; Beltagy et al. 2020, "Longformer"; Mistral 7B):
causal softmax attention over the last W tokens only.

    o_i = sum_{i - W < j <= i} softmax_j(scale * q_i . k_j) v_j        (W = window, the query itself included)

The sparse road: instead of compressing the past into a fixed-size state (linear attention), keep the past
exact but drop everything older than W tokens. The memory is a ring buffer of the last W keys and values,
[B, W, H, K] and [B, W, H, V]: it grows like a KV cache until it holds W entries, then stays that size, so
cost per token and memory are O(W), not O(t). With W >= t it is full causal attention (`attention`).

State: a `WindowCache(k, v, position)`. `position` = P is the number of tokens seen so far; the key and
value of token p sit in slot p % W, and the buffer holds L = min(P, W) entries. Softmax does not depend on
the order of the keys it reads, so `step` reads the ring as it lies; the forms that need positions unroll
it (oldest first: slot P % W) before they read. Every form returns the same cache, so running [0, t) and
then [t, T) from the returned cache equals running [0, T).

Forms:
- parallel: the banded mask over the n x (L + n) score matrix (quadratic, the definition as one product).
- chunked: FlashAttention-style tiling of the band, never n x n. Query block n (C queries) can only see its
  own key block and the D = ceil((W - 1) / C) blocks before it, so a loop over those D + 1 offsets, each a
  batch of C x C tiles over all query blocks at once, with an online softmax (see `attention`):
      m' = max(m, rowmax(S)),  l' = exp(m - m') l + rowsum(exp(S - m')),  acc' = exp(m - m') acc + exp(S - m') V
  O(T (W + C)) work and O(T C) memory.
- step: write the token into slot P % W, then one softmax over the buffer.
- recurrent: a loop of steps (the definition as a decoder runs it).

Backward: `parallel_backward`, `recurrent_backward` (the ring buffer's adjoint, its writes undone one by
one) and `chunked_backward` (FlashAttention-2 over the band) return the gradients of <do, o> with respect
to q, k, v and the cached keys and values (the backward section below).

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; WindowCache.k [B, L, H, K], .v [B, L, H, V],
.position an integer (np.int64), L = min(position, window).
"""
from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from .. import examples
from ..backend import array_module
from ..chunking import from_chunks, num_chunks, to_chunks, transposed
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_count, check_scale, state_name
from . import attention

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V")),
    output="B T H V", state=None)  # its memory is a WindowCache (ring buffer of the last W tokens)


class WindowCache(NamedTuple):
    """The last min(position, window) keys [B, L, H, K] and values [B, L, H, V], token p in slot p % window."""

    k: object
    v: object
    position: np.int64


def _check_window(window) -> int:
    return check_count("window", window, what=" (tokens each query sees)")


def _check_position(name, position, window, stored) -> int:
    if isinstance(position, bool) or not isinstance(position, numbers.Integral) or position < 0:
        raise ValueError(f"{name}.position: expected a non-negative integer (tokens seen), got {position!r}")
    if stored != min(int(position), window):
        raise ValueError(f"{name}.k: expected min(position, window) = min({int(position)}, {window}) = "
                         f"{min(int(position), window)} entries, got {stored}")
    return int(position)


def _checked(q, k, v, window, scale, cache, step=False):
    """Check everything before any work. Returns (q * scale, k, v, cache_k, cache_v, P, W, checked), the
    cached arrays cast to the inputs' dtype (None when there is no cache), P the tokens seen before these,
    `checked` the `Signature.check` result (for the backward's cotangents)."""
    window = _check_window(window)
    name = state_name(step)
    if cache is not None and not (isinstance(cache, tuple) and len(cache) == 3):
        raise TypeError(f"{name}: expected a WindowCache(k, v, position) or None, got {type(cache).__name__}")
    cache_k, cache_v, position = (None, None, 0) if cache is None else cache
    a = SIGNATURE.check(q, k, v, step=step, extra=((Tensor(f"{name}.k", "B L H K"), cache_k),
                                                   (Tensor(f"{name}.v", "B L H V"), cache_v)))
    P = _check_position(name, position, window, 0 if cache_k is None else cache_k.shape[1])
    return (a.q * check_scale(scale, a.shapes["K"]), a.k, a.v, a.arrays[f"{name}.k"], a.arrays[f"{name}.v"],
            P, window, a)


def _with_past(k, v, cache_k, cache_v, P, window):
    """The L = min(P, W) cached keys and values, oldest first, followed by the new ones [B, T, H, .]:
    returns (keys [B, L + T, H, K], values [B, L + T, H, V], L); new token i sits at index L + i."""
    if cache_k is None or P == 0:
        return k, v, 0
    xp = array_module(k)
    oldest_slot = P % window  # once the ring is full, slot P % W holds the oldest entry (else slot 0)
    k = xp.concatenate([xp.roll(cache_k, -oldest_slot, axis=1), k], axis=1)
    v = xp.concatenate([xp.roll(cache_v, -oldest_slot, axis=1), v], axis=1)
    return k, v, min(P, window)


def _ring(k, v, P_end, window):
    """The cache after P_end tokens, from keys/values [B, n, H, .] ordered oldest first, ending at token
    P_end - 1: keep the last min(P_end, W) and put token p in slot p % W."""
    xp = array_module(k)
    keep = min(P_end, window)
    shift = P_end % window if P_end >= window else 0  # tail[i] is token P_end - W + i -> slot (P_end + i) % W
    k, v = k[:, k.shape[1] - keep:], v[:, v.shape[1] - keep:]
    return WindowCache(xp.roll(k, shift, axis=1), xp.roll(v, shift, axis=1), np.int64(P_end))


def _softmax_rows(scores, v):
    """softmax over the last axis of scores [..., n, m] (-inf = not visible), times v [..., m, V]."""
    xp = array_module(scores)
    weights = xp.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def _band(T, L, window, xp):
    """[T, L + T] boolean: query i (index L + i) reads key index j when L + i - W < j <= L + i."""
    query_index = L + xp.arange(T)[:, None]
    key_index = xp.arange(L + T)[None, :]
    return (key_index <= query_index) & (key_index > query_index - window)


def parallel(q, k, v, *, window, scale=None, initial_state=None):
    """The banded n x (L + n) softmax. Returns (o [B, T, H, V], WindowCache)."""
    q, k, v, cache_k, cache_v, P, window, _ = _checked(q, k, v, window, scale, initial_state)
    k, v, L = _with_past(k, v, cache_k, cache_v, P, window)
    xp = array_module(q)
    T = q.shape[1]
    scores = xp.where(_band(T, L, window, xp), q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1), -xp.inf)  # [B, H, T, L + T]
    o = _softmax_rows(scores, v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    return xp.ascontiguousarray(o), _ring(k, v, P + T, window)


def _band_grid(q, k, v, L, window, C):
    """The chunked form's layout. Query block n (C queries) can only see its own key block and the
    D = ceil((W - 1) / C) blocks before it. Lay the keys on the queries' block grid: with `front` = D C - L
    entries before key 0, the key of query i (index L + i) lands at D C + i, so query block n's own keys
    are key block n + D and the D blocks before it hold everything its window can reach. Keys before index
    L - D C are out of every query's window (D C >= W - 1) and are dropped (front < 0); the padding is
    masked out by `_band_tile_mask`. Returns (qc [B, H, N, C, K], kc [B, H, N + D, C, K],
    vc [B, H, N + D, C, V], front, D)."""
    xp = array_module(q)
    T = q.shape[1]
    N = num_chunks(T, C)
    D = -(-(window - 1) // C)
    front = D * C - L
    if front < 0:
        k, v = k[:, -front:], v[:, -front:]
    widths = [(0, 0), (max(front, 0), N * C - T), (0, 0), (0, 0)]
    return to_chunks(q, C), to_chunks(xp.pad(k, widths), C), to_chunks(xp.pad(v, widths), C), front, D


def _band_tile_mask(d, N, C, D, front, window, xp):
    """Which entries of the C x C tiles at block offset d are read: [N, C(query), C(key)]."""
    a = xp.arange(C)
    behind = d * C + a[:, None] - a[None, :]                           # query position - key position
    in_band = (behind >= 0) & (behind < window)
    key_start = (xp.arange(N) + D - d) * C                             # grid position of each key block
    real_key = (key_start[:, None] + a[None, :]) >= front              # not front padding
    return in_band[None] & real_key[:, None, :]


def _tiled_forward(q, k, v, L, window, C):
    """`chunked`'s online softmax over the band, also returning lse_i = log sum_j exp(s_ij) per query.
    Returns (o [B, H, N, C, V], lse [B, H, N, C])."""
    xp = array_module(q)
    qc, kc, vc, front, D = _band_grid(q, k, v, L, window, C)
    kc_T = transposed(kc)
    B, H, N = qc.shape[:3]
    m = xp.full((B, H, N, C), -xp.inf, q.dtype)                        # running max of the scores
    l = xp.zeros((B, H, N, C), q.dtype)                                # running sum of exp(score - m)
    acc = xp.zeros((B, H, N, C, v.shape[-1]), q.dtype)                 # running sum of exp(score - m) v
    # Offset d = 0 (the diagonal tile, which holds each query's own key) comes first, so m is finite
    # from the start and a fully hidden tile later on adds exp(-inf) = 0.
    for d in range(D + 1):
        blocks = slice(D - d, D - d + N)                               # key block n + D - d for query block n
        visible = _band_tile_mask(d, N, C, D, front, window, xp)
        scores = xp.where(visible, qc @ kc_T[:, :, blocks], -xp.inf)
        m_new = xp.maximum(m, scores.max(-1))
        p = xp.exp(scores - m_new[..., None])
        rescale = xp.exp(m - m_new)
        l = rescale * l + p.sum(-1)
        acc = rescale[..., None] * acc + p @ vc[:, :, blocks]
        m = m_new
    return acc / l[..., None], m + xp.log(l)


def chunked(q, k, v, *, window, scale=None, initial_state=None, chunk_size=64):
    """Tiled band with an online softmax (module docstring, `_band_grid`); never forms an n x n matrix."""
    q, k, v, cache_k, cache_v, P, window, _ = _checked(q, k, v, window, scale, initial_state)
    C = check_chunk_size(chunk_size, q.shape[1])
    k, v, L = _with_past(k, v, cache_k, cache_v, P, window)
    o, _ = _tiled_forward(q, k, v, L, window, C)
    return from_chunks(o, q.shape[1]), _ring(k, v, P + q.shape[1], window)


def step(q, k, v, *, state=None, window, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V] -> (o_t [B, H, V], the cache with this token in it)."""
    q, k, v, ring_k, ring_v, P, window, _ = _checked(q, k, v, window, scale, state, step=True)
    xp = array_module(q)
    if P < window:   # still filling up: token P goes to slot P, the end of the buffer
        ring_k = k[:, None].copy() if ring_k is None else xp.concatenate([ring_k, k[:, None]], axis=1)
        ring_v = v[:, None].copy() if ring_v is None else xp.concatenate([ring_v, v[:, None]], axis=1)
    else:            # full: overwrite the oldest entry, slot P % W (a copy: the caller's cache stays valid)
        ring_k, ring_v = ring_k.copy(), ring_v.copy()
        ring_k[:, P % window], ring_v[:, P % window] = k, v
    scores = (q[:, :, None, :] @ ring_k.transpose(0, 2, 3, 1))              # [B, H, 1, min(P + 1, W)]
    o = _softmax_rows(scores, ring_v.transpose(0, 2, 1, 3))[:, :, 0]       # [B, H, V]
    return o, WindowCache(ring_k, ring_v, np.int64(P + 1))


def recurrent(q, k, v, *, window, scale=None, initial_state=None):
    """One `step` per token, as a decoder runs: the ring buffer fills up to W entries, then wraps."""
    q, k, v, *_ = _checked(q, k, v, window, scale, initial_state)  # every argument checked once, by its name
    xp = array_module(q)
    cache = initial_state
    outputs = []
    for t in range(q.shape[1]):
        o_t, cache = step(q[:, t], k[:, t], v[:, t], state=cache, window=window, scale=1.0)
        outputs.append(o_t)
    return xp.stack(outputs, axis=1), cache


# --- backward ------------------------------------------------------------------------------------------
#
# The gradients of L = <do, o>: causal softmax attention's (`attention`, the backward section), with the
# band as the mask. The cache is the last keys and values themselves, so there is no state cotangent;
# the gradients with respect to the cached keys and values come back as a WindowCache laid out like the
# cache (token p's gradient in slot p % W). With q scaled and s_ij = q_i . k_j, W_ij = softmax_j(s_ij)
# over i - W < j <= i:
#     dv_j = sum_i W_ij do_i,   ds_ij = W_ij (do_i . v_j - D_i),   D_i = do_i . o_i,
#     dq_i = sum_j ds_ij k_j,   dk_j = sum_i ds_ij q_i.
# The engines take q scaled, and the keys and values oldest first: the L unrolled cached entries, then the
# T new ones (`_with_past`), query i at index L + i; they return (dq, dk, dv) for those.


def _backward_inputs(q, k, v, window, scale, initial_state, do, dstate):
    """Check the forward's arguments and the cotangents (dstate must be None: the cache is no state of its
    own). Returns (q * scale, k, v, cache_k, cache_v, P, W, scale, do)."""
    q, k, v, cache_k, cache_v, P, window, a = _checked(q, k, v, window, scale, initial_state)
    do, _ = SIGNATURE.check_cotangents(a, do, dstate)
    return q, k, v, cache_k, cache_v, P, window, check_scale(scale, a.shapes["K"]), do


def _gradients(scale, dq, dk, dv, dcache_k, dcache_v, P):
    """The named tuple: dq through the scale (the engines see scale * q); the cache's gradients, in its
    slot order, as a WindowCache (None without a cache)."""
    cache = None if dcache_k is None else WindowCache(dcache_k, dcache_v, np.int64(P))
    return SIGNATURE.gradients("sliding_window")(dq * scale, dk, dv, cache)


def _split_off_cache(scale, dq, dk, dv, L, cache_k, P, window):
    """Gradients over the L + T unrolled keys (oldest first) -> the new tokens' and the cache's (slot order)."""
    if cache_k is None:
        return _gradients(scale, dq, dk, dv, None, None, P)
    return _gradients(scale, dq, dk[:, L:].copy(), dv[:, L:].copy(), _to_slots(dk[:, :L], P, window),
                      _to_slots(dv[:, :L], P, window), P)


def parallel_backward(q, k, v, *, do, dstate=None, window, scale=None, initial_state=None):
    """Gradients of <do, o> for `parallel`, from the banded n x (L + n) matrices. Returns
    SlidingWindowGradients(dq, dk, dv, dinitial_state), dinitial_state a WindowCache(dk, dv, position) of
    the cached entries' gradients, slot for slot, when initial_state is given (else None). do [B, T, H, V];
    dstate must be None."""
    q, k, v, cache_k, cache_v, P, window, scale, do = _backward_inputs(q, k, v, window, scale, initial_state,
                                                                       do, dstate)
    keys, values, L = _with_past(k, v, cache_k, cache_v, P, window)
    return _split_off_cache(scale, *_parallel_backward(q, keys, values, do, L, window), L, cache_k, P, window)


def recurrent_backward(q, k, v, *, do, dstate=None, window, scale=None, initial_state=None):
    """Gradients of <do, o> for `recurrent`: its steps run backwards on the ring buffer
    (`_recurrent_backward`). Returns SlidingWindowGradients as `parallel_backward`."""
    q, k, v, cache_k, cache_v, P, window, scale, do = _backward_inputs(q, k, v, window, scale, initial_state,
                                                                       do, dstate)
    return _gradients(scale, *_recurrent_backward(q, k, v, do, cache_k, cache_v, P, window), P)


def chunked_backward(q, k, v, *, do, dstate=None, window, scale=None, initial_state=None, chunk_size=64):
    """Gradients of <do, o> for `chunked`: FlashAttention-2's backward over the band (`_chunked_backward`),
    never n x n. Returns SlidingWindowGradients as `parallel_backward`."""
    q, k, v, cache_k, cache_v, P, window, scale, do = _backward_inputs(q, k, v, window, scale, initial_state,
                                                                       do, dstate)
    C = check_chunk_size(chunk_size, q.shape[1])
    keys, values, L = _with_past(k, v, cache_k, cache_v, P, window)
    return _split_off_cache(scale, *_chunked_backward(q, keys, values, do, L, window, C), L, cache_k, P, window)


def _parallel_backward(q, k, v, do, L, window):
    """The banded n x (L + n) matrices written out (`attention._masked_backward`). -> (dq, dk, dv)."""
    return attention._masked_backward(q, k, v, do, _band(q.shape[1], L, window, array_module(q)))


def _chunked_backward(q, k, v, do, L, window, C):
    """FlashAttention-2's backward over the band (`attention._chunked_backward`), never n x n: recompute
    o and lse tile by tile, D_i = do_i . o_i, then for each block offset d = 0 .. D (query block n against
    key block n + D - d, all n at once):
        W = exp(Q K^T - lse)          masked outside the band: exp(-inf) = 0
        dS = W (dO V^T - D)
        dQ_n += dS K,   dK_{n+D-d} += dS^T Q_n,   dV_{n+D-d} += W^T dO_n
    then the keys' gradients taken off the grid (zeros for the keys dropped as out of every window).
    -> (dq, dk, dv), dk and dv over all L + T keys."""
    xp = array_module(q)
    T, total = q.shape[1], k.shape[1]
    o, lse = _tiled_forward(q, k, v, L, window, C)
    qc, kc, vc, front, D = _band_grid(q, k, v, L, window, C)
    doc = to_chunks(do, C)
    Dsum = (doc * o).sum(-1)[..., None]                                # D_i = do_i . o_i
    kc_T, vc_T = transposed(kc), transposed(vc)
    N = qc.shape[2]
    dqc, dkc, dvc = xp.zeros_like(qc), xp.zeros_like(kc), xp.zeros_like(vc)
    for d in range(D + 1):
        blocks = slice(D - d, D - d + N)
        visible = _band_tile_mask(d, N, C, D, front, window, xp)
        W = qc @ kc_T[:, :, blocks]                                     # s, then W in place
        W -= lse[..., None]
        xp.copyto(W, -xp.inf, where=~visible)                          # outside the band: exp(-inf) = 0
        xp.exp(W, out=W)
        dS = doc @ vc_T[:, :, blocks]                                  # dW, then dS in place
        dS -= Dsum
        dS *= W
        dqc += dS @ kc[:, :, blocks]
        dkc[:, :, blocks] += dS.swapaxes(-1, -2) @ qc                  # swapped views on the left: no copies
        dvc[:, :, blocks] += W.swapaxes(-1, -2) @ doc

    def off_grid(x):
        x = from_chunks(x, dkc.shape[2] * C)[:, max(front, 0):max(front, 0) + total - max(-front, 0)]
        return x if front >= 0 else xp.concatenate([xp.zeros((x.shape[0], -front, *x.shape[2:]), x.dtype), x], 1)

    return from_chunks(dqc, T), off_grid(dkc), off_grid(dvc)


def _recurrent_backward(q, k, v, do, cache_k, cache_v, P, window):
    """The loop of steps run backwards, on the ring buffer itself. Step t (token p = P + t) wrote k_t, v_t
    into slot p % W, overwriting token p - W, then read the min(p + 1, W) slots. Going back from the final
    ring, step t adds its read's gradient to the ring's adjoint, then undoes its write: the adjoint in slot
    p % W is k_t's (v_t's) gradient, and the slot gets back token p - W (k_{t-W}, or the cached entry when
    t < W) with a zero adjoint, since nothing read that token after it was overwritten. While the ring is
    still filling (p < W) undoing the write shrinks it instead. At t = 0 the ring's adjoint is the cache's.
    Stores the ring and its adjoint; recomputes each step's weights.
    q, do [B, T, H, .]; new k, v [B, T, H, .]; cache_k, cache_v [B, L, H, .] in slot order (or None).
    Returns (dq, dk, dv, dcache_k, dcache_v), the cache's in its slot order (None without a cache)."""
    xp = array_module(q)
    T = q.shape[1]
    keys, values, L = _with_past(k, v, cache_k, cache_v, P, window)
    final = _ring(keys, values, P + T, window)
    ring_k = xp.ascontiguousarray(final.k.transpose(0, 2, 1, 3))     # [B, H, min(P + T, W), K]
    ring_v = xp.ascontiguousarray(final.v.transpose(0, 2, 1, 3))
    dring_k, dring_v = xp.zeros_like(ring_k), xp.zeros_like(ring_v)  # the ring's adjoint
    dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v)
    for t in range(T - 1, -1, -1):
        p = P + t
        n, slot = min(p + 1, window), p % window
        q_t, do_t = q[:, t, :, :, None], do[:, t, :, :, None]          # [B, H, ., 1]
        s = (ring_k[:, :, :n] @ q_t)[..., 0]                           # [B, H, n]
        w = xp.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        dw = (ring_v[:, :, :n] @ do_t)[..., 0]
        ds = (w * (dw - (w * dw).sum(-1, keepdims=True)))[..., None]
        dq[:, t] = (ds * ring_k[:, :, :n]).sum(-2)
        dring_k[:, :, :n] += ds * q_t.swapaxes(-1, -2)
        dring_v[:, :, :n] += w[..., None] * do_t.swapaxes(-1, -2)
        dk[:, t], dv[:, t] = dring_k[:, :, slot], dring_v[:, :, slot]  # undo the write of token p
        dring_k[:, :, slot] = 0
        dring_v[:, :, slot] = 0
        if p >= window:                                                # the slot held token p - W before
            older_k, older_v = (k[:, t - window], v[:, t - window]) if t >= window else (cache_k[:, slot], cache_v[:, slot])
            ring_k[:, :, slot], ring_v[:, :, slot] = older_k, older_v
    if cache_k is None:
        return dq, dk, dv, None, None
    dcache_k, dcache_v = (xp.ascontiguousarray(x[:, :, :L].transpose(0, 2, 1, 3)) for x in (dring_k, dring_v))
    return dq, dk, dv, dcache_k, dcache_v


def _to_slots(d_oldest_first, P, window):
    """Gradients of the L unrolled cached entries (oldest first) -> the cache's slot order (undoes the roll
    of `_with_past`)."""
    return array_module(d_oldest_first).roll(d_oldest_first, P % window, axis=1)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`), window = max(1, T // 4). Returns (args, kwargs)."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    return (q, k, v), {"window": max(1, T // 4)}
