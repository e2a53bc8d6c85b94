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

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; WindowCache.k [B, L, H, K], .v [B, L, H, V],
.position an integer (np.int64), L = min(position, window).
"""
from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from .. import examples
from ..backend import array_module
from ..chunking import from_chunks, num_chunks, to_chunks
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_count, check_scale, state_name

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
    """Check everything before any work. Returns (q * scale, k, v, cache_k, cache_v, P, W), the cached
    arrays cast to the inputs' dtype (None when there is no cache), P the tokens seen before these."""
    window = _check_window(window)
    name = state_name(step)
    if cache is not None and not (isinstance(cache, tuple) and len(cache) == 3):
        raise TypeError(f"{name}: expected a WindowCache(k, v, position) or None, got {type(cache).__name__}")
    cache_k, cache_v, position = (None, None, 0) if cache is None else cache
    a = SIGNATURE.check(q, k, v, step=step, extra=((Tensor(f"{name}.k", "B L H K"), cache_k),
                                                   (Tensor(f"{name}.v", "B L H V"), cache_v)))
    P = _check_position(name, position, window, 0 if cache_k is None else cache_k.shape[1])
    return (a.q * check_scale(scale, a.shapes["K"]), a.k, a.v, a.arrays[f"{name}.k"], a.arrays[f"{name}.v"],
            P, window)


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


def parallel(q, k, v, *, window, scale=None, initial_state=None):
    """The banded n x (L + n) softmax. Returns (o [B, T, H, V], WindowCache)."""
    q, k, v, cache_k, cache_v, P, window = _checked(q, k, v, window, scale, initial_state)
    k, v, L = _with_past(k, v, cache_k, cache_v, P, window)
    xp = array_module(q)
    T = q.shape[1]
    query_index = L + xp.arange(T)[:, None]           # where query i sits among the keys
    key_index = xp.arange(L + T)[None, :]
    visible = (key_index <= query_index) & (key_index > query_index - window)   # [T, L + T]
    scores = xp.where(visible, q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1), -xp.inf)  # [B, H, T, L + T]
    o = _softmax_rows(scores, v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    return xp.ascontiguousarray(o), _ring(k, v, P + T, window)


def chunked(q, k, v, *, window, scale=None, initial_state=None, chunk_size=64):
    """Tiled band with an online softmax (module docstring); never forms an n x n matrix."""
    q, k, v, cache_k, cache_v, P, window = _checked(q, k, v, window, scale, initial_state)
    C = check_chunk_size(chunk_size, q.shape[1])
    k, v, L = _with_past(k, v, cache_k, cache_v, P, window)
    xp = array_module(q)
    T = q.shape[1]
    N = num_chunks(T, C)
    D = -(-(window - 1) // C)  # key blocks before the diagonal one that some query in a block can see

    # Lay the keys on the queries' block grid: with `front` entries before key 0, the key of query i
    # (index L + i) lands at D * C + i, so query block n's own keys are key block n + D and the D blocks
    # before it hold everything its window can reach. Keys before index L - D * C are out of every
    # query's window (D * C >= W - 1) and are dropped; the padding is masked out below.
    front = D * C - L
    if front < 0:
        k, v = k[:, -front:], v[:, -front:]
    qc = to_chunks(q, C)                                                # [B, H, N, C, K]
    widths = [(0, 0), (max(front, 0), N * C - T), (0, 0), (0, 0)]
    kc_T = xp.ascontiguousarray(to_chunks(xp.pad(k, widths), C).swapaxes(-1, -2))  # [B, H, N + D, K, C]
    vc = to_chunks(xp.pad(v, widths), C)

    B, H = qc.shape[:2]
    a = xp.arange(C)
    m = xp.full((B, H, N, C), -xp.inf, q.dtype)                         # running max of the scores
    l = xp.zeros((B, H, N, C), q.dtype)                                 # running sum of exp(score - m)
    acc = xp.zeros((B, H, N, C, v.shape[-1]), q.dtype)                  # running sum of exp(score - m) v
    # Offset d = 0 (the diagonal tile, which holds each query's own key) comes first, so m is finite
    # from the start and a fully hidden tile later on adds exp(-inf) = 0.
    for d in range(D + 1):
        blocks = slice(D - d, D - d + N)                                # key block n + D - d for query block n
        behind = d * C + a[:, None] - a[None, :]                        # query position - key position [C, C]
        in_band = (behind >= 0) & (behind < window)
        key_start = (xp.arange(N) + D - d) * C                          # grid position of each key block
        real_key = (key_start[:, None] + a[None, :]) >= front           # not front padding [N, C]
        visible = in_band[None] & real_key[:, None, :]                  # [N, C, C]
        scores = xp.where(visible, qc @ kc_T[:, :, blocks], -xp.inf)
        m_new = xp.maximum(m, scores.max(-1))
        p = xp.exp(scores - m_new[..., None])
        rescale = xp.exp(m - m_new)
        l = rescale * l + p.sum(-1)
        acc = rescale[..., None] * acc + p @ vc[:, :, blocks]
        m = m_new
    return from_chunks(acc / l[..., None], T), _ring(k, v, P + T, window)


def step(q, k, v, *, state=None, window, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V] -> (o_t [B, H, V], the cache with this token in it)."""
    q, k, v, ring_k, ring_v, P, window = _checked(q, k, v, window, scale, state, step=True)
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


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`), window = max(1, T // 4). Returns (args, kwargs)."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    return (q, k, v), {"window": max(1, T // 4)}
