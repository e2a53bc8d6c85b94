"""Causal softmax attention (Vaswani et al. 2017), the baseline every other mixer is measured against.

    o_i = sum_{j <= i} softmax_j(scale * q_i . k_j) v_j

Its "state" is the KV cache: every key and value seen so far, [B, t, H, K] and [B, t, H, V], growing by
one entry per token; that growth is what linear attention and SSMs replace with a fixed-size memory.

Forms:
- parallel: the masked n x n score matrix, softmax, times V.
- chunked: FlashAttention-style tiling (Dao et al. 2022) with an online softmax. Queries and keys are cut
  into blocks of C; for each key block every query block keeps a running max m, a running sum l and an
  unnormalized output acc, rescaled by exp(m_old - m_new) whenever the max grows:
      m' = max(m, rowmax(S)),  P = exp(S - m'),  l' = exp(m - m') l + rowsum(P),  acc' = exp(m - m') acc + P V
  and o = acc / l at the end. Exact (not an approximation), and no n x n matrix is ever formed.
- step: one query against the cache, after appending its own key and value.
- recurrent: a loop of steps (the definition as a decoder runs it).
All return (o, KVCache); `initial_state` / `state` is a KVCache of earlier tokens (positions 0..P-1), so
running [0, t) then [t, T) from the returned cache equals running [0, T).

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]; KVCache.k [B, P, H, K], KVCache.v [B, P, H, V].
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import examples
from ..backend import array_module
from ..chunking import from_chunks, num_chunks, to_chunks, transposed
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_scale

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V")),
    output="B T H V", state=None)  # its memory is a KVCache of every past token, not one array


class KVCache(NamedTuple):
    """The softmax layer's memory: all keys [B, P, H, K] and values [B, P, H, V] seen so far."""

    k: object
    v: object


def _checked(q, k, v, scale, cache, step=False):
    """Checked inputs (the cache's arrays `cache.k`, `cache.v` among them) and the scale."""
    name = "state" if step else "initial_state"
    if cache is not None and not (isinstance(cache, tuple) and len(cache) == 2):
        raise TypeError(f"{name}: expected a KVCache(k, v) or None, got {type(cache).__name__}")
    cache_k, cache_v = (None, None) if cache is None else cache
    a = SIGNATURE.check(q, k, v, step=step, extra=((Tensor(f"{name}.k", "B P H K"), cache_k),
                                                   (Tensor(f"{name}.v", "B P H V"), cache_v)))
    return a, check_scale(scale, a.shapes["K"])


def _with_past(a, step=False):
    """The keys and values of the cache followed by the new ones (one token when `step`),
    [B, P + T, H, .], as new arrays: the returned cache never shares memory with the caller's inputs."""
    xp = a.xp
    k, v = (a.k[:, None], a.v[:, None]) if step else (a.k, a.v)
    name = "state" if step else "initial_state"
    cache_k, cache_v = a.arrays[f"{name}.k"], a.arrays[f"{name}.v"]
    if cache_k is None:
        return k.copy(), v.copy()
    return xp.concatenate([cache_k, k], axis=1), xp.concatenate([cache_v, v], axis=1)


def _masked_softmax_read(q, k, v):
    """q [B, T, H, K] at positions P..P+T-1 against all keys k [B, P+T, H, K]: the quadratic form."""
    xp = array_module(q)
    T, total = q.shape[1], k.shape[1]
    scores = q.transpose(0, 2, 1, 3) @ k.transpose(0, 2, 3, 1)        # [B, H, T, P + T]
    visible = xp.arange(total)[None, :] <= (total - T + xp.arange(T))[:, None]
    scores = xp.where(visible, scores, -xp.inf)
    weights = xp.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return xp.ascontiguousarray((weights @ v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3))


def parallel(q, k, v, *, scale=None, initial_state=None):
    """Masked n x n softmax. Returns (o [B, T, H, V], KVCache of all P + T tokens)."""
    a, scale = _checked(q, k, v, scale, initial_state)
    k, v = _with_past(a)
    return _masked_softmax_read(a.q * scale, k, v), KVCache(k, v)


def step(q, k, v, *, state=None, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V] -> (o_t [B, H, V], the cache one token longer)."""
    a, scale = _checked(q, k, v, scale, state, step=True)
    k, v = _with_past(a, step=True)
    return _masked_softmax_read(a.q[:, None] * scale, k, v)[:, 0], KVCache(k, v)


def recurrent(q, k, v, *, scale=None, initial_state=None):
    """One `step` per token, as a decoder runs: the cache grows by one entry each time."""
    a, _ = _checked(q, k, v, scale, initial_state)  # every argument checked once, under its own name
    cache = initial_state
    outputs = []
    for t in range(a.q.shape[1]):
        o_t, cache = step(a.q[:, t], a.k[:, t], a.v[:, t], state=cache, scale=scale)
        outputs.append(o_t)
    return a.xp.stack(outputs, axis=1), cache


def chunked(q, k, v, *, scale=None, initial_state=None, chunk_size=64):
    """FlashAttention-style tiling with an online softmax (see the module docstring); exact."""
    a, scale = _checked(q, k, v, scale, initial_state)
    C = check_chunk_size(chunk_size, a.shapes["T"])
    q = a.q * scale
    k, v = _with_past(a)
    xp = a.xp
    T, total = q.shape[1], k.shape[1]
    prefix = total - T
    qc, kc, vc = to_chunks(q, C), to_chunks(k, C), to_chunks(v, C)  # [B, H, Nq or Nk, C, .]
    kc_T = transposed(kc)                                           # [B, H, Nk, K, C]
    q_pos = prefix + xp.arange(qc.shape[2] * C).reshape(-1, C)     # absolute positions [Nq, C]
    k_pos = xp.arange(kc.shape[2] * C).reshape(-1, C)              # [Nk, C]; padding lies past every query

    B, H, Nq = qc.shape[:3]
    m = xp.full((B, H, Nq, C), -xp.inf, q.dtype)                    # running max of the scores
    l = xp.zeros((B, H, Nq, C), q.dtype)                            # running sum of exp(score - m)
    acc = xp.zeros((B, H, Nq, C, v.shape[-1]), q.dtype)             # running sum of exp(score - m) v
    for j in range(num_chunks(total, C)):
        first = max(0, (j * C - prefix) // C)                       # query blocks before it see none of block j
        visible = k_pos[j][None, None, :] <= q_pos[first:, :, None]  # [Nq', C, C]
        scores = qc[:, :, first:] @ kc_T[:, :, j, None]
        scores = xp.where(visible, scores, -xp.inf)
        m_new = xp.maximum(m[:, :, first:], scores.max(-1))
        # Key 0 is visible to every query and block 0 comes first, so m_new is finite from the start.
        p = xp.exp(scores - m_new[..., None])
        rescale = xp.exp(m[:, :, first:] - m_new)
        l[:, :, first:] = rescale * l[:, :, first:] + p.sum(-1)
        acc[:, :, first:] = rescale[..., None] * acc[:, :, first:] + p @ vc[:, :, j, None]
        m[:, :, first:] = m_new
    return from_chunks(acc / l[..., None], T), KVCache(k, v)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    return (q, k, v), {}
