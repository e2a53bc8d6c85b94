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

Backward: `parallel_backward`, `recurrent_backward`, `chunked_backward` (FlashAttention-2's: the forward's
log-sum-exp per query recomputed, D_i = do_i . o_i, tiles recomputed) return the gradients of <do, o>
with respect to q, k, v and the cached keys and values (the backward section below).

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


def _tiles(q, k, v, C):
    """The block layout of the tiled forms: q, k, v in blocks of C (`to_chunks`), the keys' blocks also
    transposed, and the absolute positions of every query and key (padding lies past every real query)."""
    xp = array_module(q)
    prefix = k.shape[1] - q.shape[1]
    qc, kc, vc = to_chunks(q, C), to_chunks(k, C), to_chunks(v, C)     # [B, H, Nq or Nk, C, .]
    q_pos = prefix + xp.arange(qc.shape[2] * C).reshape(-1, C)         # [Nq, C]
    k_pos = xp.arange(kc.shape[2] * C).reshape(-1, C)                  # [Nk, C]
    return qc, kc, vc, q_pos, k_pos, prefix


def _visible_tiles(j, q_pos, k_pos, prefix, C):
    """Key block j against the query blocks that can see any of it: (first query block, mask [Nq', C, C])."""
    first = max(0, (j * C - prefix) // C)                              # earlier query blocks see none of block j
    return first, k_pos[j][None, None, :] <= q_pos[first:, :, None]


def _tiled_forward(q, k, v, C):
    """The chunked form's online softmax (module docstring), also returning each query's log-sum-exp
    lse_i = m_i + log l_i = log sum_j exp(s_ij), which is all the backward needs to rebuild any tile of
    W exactly: W_ij = exp(s_ij - lse_i). Returns (o [B, H, Nq, C, V], lse [B, H, Nq, C])."""
    xp = array_module(q)
    qc, kc, vc, q_pos, k_pos, prefix = _tiles(q, k, v, C)
    kc_T = transposed(kc)
    B, H, Nq = qc.shape[:3]
    m = xp.full((B, H, Nq, C), -xp.inf, q.dtype)                      # running max of the scores
    l = xp.zeros((B, H, Nq, C), q.dtype)                               # running sum of exp(score - m)
    acc = xp.zeros((B, H, Nq, C, v.shape[-1]), q.dtype)                # running sum of exp(score - m) v
    for j in range(kc.shape[2]):
        first, visible = _visible_tiles(j, q_pos, k_pos, prefix, C)
        scores = xp.where(visible, qc[:, :, first:] @ kc_T[:, :, j, None], -xp.inf)
        m_new = xp.maximum(m[:, :, first:], scores.max(-1))
        # Key 0 is visible to every query and block 0 comes first, so m_new is finite from the start.
        p = xp.exp(scores - m_new[..., None])
        rescale = xp.exp(m[:, :, first:] - m_new)
        l[:, :, first:] = rescale * l[:, :, first:] + p.sum(-1)
        acc[:, :, first:] = rescale[..., None] * acc[:, :, first:] + p @ vc[:, :, j, None]
        m[:, :, first:] = m_new
    return acc / l[..., None], m + xp.log(l)


def chunked(q, k, v, *, scale=None, initial_state=None, chunk_size=64):
    """FlashAttention-style tiling with an online softmax (see the module docstring); exact."""
    a, scale = _checked(q, k, v, scale, initial_state)
    C = check_chunk_size(chunk_size, a.shapes["T"])
    k, v = _with_past(a)
    o, _ = _tiled_forward(a.q * scale, k, v, C)
    return from_chunks(o, a.shapes["T"]), KVCache(k, v)


# --- backward ------------------------------------------------------------------------------------------
#
# The gradients of L = <do, o>. The cache is the keys and values themselves, so there is no state cotangent:
# a gradient with respect to a cached key is a gradient with respect to that key. Every form recomputes the
# softmax weights from q and k (nothing n x n is kept from the forward). With q already scaled,
#     s_ij = q_i . k_j,   W_ij = softmax_j(s_ij) over the keys j visible to query i,   o_i = sum_j W_ij v_j
# the chain rule, step by step, for every query i and visible key j:
#     dv_j  = sum_i W_ij do_i                              o is linear in v
#     dW_ij = do_i . v_j
#     ds_ij = W_ij (dW_ij - D_i),   D_i = sum_l W_il dW_il = do_i . o_i        the softmax's Jacobian
#     dq_i  = sum_j ds_ij k_j,      dk_j = sum_i ds_ij q_i
# D_i is one dot product of two V-vectors per query: the row sum of W * dW never has to be formed.
# The engines below take q scaled and k, v holding all P + T keys (the cache's P first) and return
# (dq, dk, dv) for those; the public forms split off the cache's part and apply the scale to dq.


def _backward_inputs(q, k, v, scale, initial_state, do, dstate):
    """Check the forward's arguments and the cotangents (dstate must be None: the cache is no state of its
    own). Returns (checked inputs, scale, the keys and values of all P + T tokens, do)."""
    a, scale = _checked(q, k, v, scale, initial_state)
    do, _ = SIGNATURE.check_cotangents(a, do, dstate)
    keys, values = _with_past(a)
    return a, scale, keys, values, do


def _gradients(a, scale, dq, dk, dv):
    """The named tuple: dq through the scale (the engines see scale * q), the keys' and values' gradients
    split into the new tokens' (the last T) and the cache's (the first P, a KVCache; None without one)."""
    P = dk.shape[1] - dq.shape[1]
    cache = None if a.arrays["initial_state.k"] is None else KVCache(dk[:, :P].copy(), dv[:, :P].copy())
    return SIGNATURE.gradients("attention")(dq * scale, dk[:, P:].copy(), dv[:, P:].copy(), cache)


def parallel_backward(q, k, v, *, do, dstate=None, scale=None, initial_state=None):
    """Gradients of <do, o> for `parallel`, from the n x (P + n) matrices. Returns AttentionGradients(dq,
    dk, dv, dinitial_state), dinitial_state a KVCache of the cached keys' and values' gradients when
    initial_state is given (else None). do [B, T, H, V]; dstate must be None."""
    a, scale, keys, values, do = _backward_inputs(q, k, v, scale, initial_state, do, dstate)
    return _gradients(a, scale, *_parallel_backward(a.q * scale, keys, values, do))


def recurrent_backward(q, k, v, *, do, dstate=None, scale=None, initial_state=None):
    """Gradients of <do, o> for `recurrent`: its loop of steps run backwards (`_recurrent_backward`).
    Returns AttentionGradients(dq, dk, dv, dinitial_state) as `parallel_backward`."""
    a, scale, keys, values, do = _backward_inputs(q, k, v, scale, initial_state, do, dstate)
    return _gradients(a, scale, *_recurrent_backward(a.q * scale, keys, values, do))


def chunked_backward(q, k, v, *, do, dstate=None, scale=None, initial_state=None, chunk_size=64):
    """Gradients of <do, o> for `chunked`: FlashAttention-2's tiled backward (`_chunked_backward`), never
    n x n. Returns AttentionGradients(dq, dk, dv, dinitial_state) as `parallel_backward`."""
    a, scale, keys, values, do = _backward_inputs(q, k, v, scale, initial_state, do, dstate)
    C = check_chunk_size(chunk_size, a.shapes["T"])
    return _gradients(a, scale, *_chunked_backward(a.q * scale, keys, values, do, C))


def _parallel_backward(q, k, v, do):
    """The n x (P + n) matrices written out. q, do [B, T, H, .]; k, v [B, P + T, H, .] -> (dq, dk, dv)."""
    xp = array_module(q)
    T, total = q.shape[1], k.shape[1]
    return _masked_backward(q, k, v, do, xp.arange(total)[None, :] <= (total - T + xp.arange(T))[:, None])


def _masked_backward(q, k, v, do, visible):
    """The gradients above, with the whole [T, P + T] matrix at once; `visible` [T, P + T] says which
    keys each query reads (causal here, banded in `sliding_window`). Returns (dq, dk, dv)."""
    xp = array_module(q)
    Q, K_, V_, dO = (x.transpose(0, 2, 1, 3) for x in (q, k, v, do))      # [B, H, ., .]
    scores = xp.where(visible, Q @ K_.swapaxes(-1, -2), -xp.inf)         # s: [B, H, T, P + T]
    W = xp.exp(scores - scores.max(-1, keepdims=True))
    W /= W.sum(-1, keepdims=True)                                        # W = softmax(s)
    O = W @ V_
    dW = dO @ V_.swapaxes(-1, -2)                                        # dW_ij = do_i . v_j
    D = (dO * O).sum(-1, keepdims=True)                                  # D_i = do_i . o_i
    dS = W * (dW - D)                                                    # ds = W (dW - D)
    dq, dk, dv = dS @ K_, dS.swapaxes(-1, -2) @ Q, W.swapaxes(-1, -2) @ dO
    return tuple(xp.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (dq, dk, dv))


def _recurrent_backward(q, k, v, do):
    """The loop of steps run backwards. Step t appended (k_t, v_t) to the cache and read the P + t + 1
    entries it then held; going back from t = T - 1, each step adds its read's gradient to the adjoint of
    every cache entry, and the entry it appended is complete once its own step is undone (no earlier step
    saw it): dk_t, dv_t are that entry's adjoint. Stores the cache's adjoint (dk, dv: [B, H, P + T, .],
    completed from the last entry to the first); recomputes each step's weights W_t from q_t and the cache.
    q, do [B, T, H, .]; k, v [B, P + T, H, .] -> (dq, dk, dv)."""
    xp = array_module(q)
    T, total = q.shape[1], k.shape[1]
    keys = xp.ascontiguousarray(k.transpose(0, 2, 1, 3))               # the final cache [B, H, P + T, K]
    values = xp.ascontiguousarray(v.transpose(0, 2, 1, 3))             # [B, H, P + T, V]
    dkeys, dvalues = xp.zeros_like(keys), xp.zeros_like(values)        # the cache's adjoint
    dq = xp.empty_like(q)
    for t in range(T - 1, -1, -1):
        n = total - T + t + 1                                          # entries the cache held at step t
        q_t, do_t = q[:, t, :, :, None], do[:, t, :, :, None]         # [B, H, ., 1]
        s = (keys[:, :, :n] @ q_t)[..., 0]                             # s_j = q_t . k_j: [B, H, n]
        w = xp.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        dw = (values[:, :, :n] @ do_t)[..., 0]                         # dW_j = do_t . v_j
        D = (w * dw).sum(-1, keepdims=True)                            # D = do_t . o_t
        ds = (w * (dw - D))[..., None]                                 # [B, H, n, 1]
        dq[:, t] = (ds * keys[:, :, :n]).sum(-2)
        dkeys[:, :, :n] += ds * q_t.swapaxes(-1, -2)
        dvalues[:, :, :n] += w[..., None] * do_t.swapaxes(-1, -2)
    return dq, *(xp.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (dkeys, dvalues))


def _chunked_backward(q, k, v, do, C):
    """FlashAttention-2's backward (Dao 2023, Algorithm 2), tile by tile, never n x n.

    1. Recompute the forward tile by tile, keeping only o and lse_i (one number per query).
    2. D_i = do_i . o_i for every query at once.
    3. For each key block j, against every query block that can see it (all at once, [Nq', C, C] tiles):
           s = Q_blk K_j^T                  recomputed
           W = exp(s - lse)                 exact weights: s - lse <= 0, masked entries exp(-inf) = 0
           dV_j = sum_blocks W^T dO_blk     dW = dO_blk V_j^T
           dS = W (dW - D)
           dQ_blk += dS K_j                 dK_j = sum_blocks dS^T Q_blk
    Padded queries have do = 0, hence D = 0, dS = 0: they add nothing. Memory O(T C).
    q, do [B, T, H, .]; k, v [B, P + T, H, .] -> (dq, dk, dv)."""
    xp = array_module(q)
    T, total = q.shape[1], k.shape[1]
    o, lse = _tiled_forward(q, k, v, C)
    qc, kc, vc, q_pos, k_pos, prefix = _tiles(q, k, v, C)
    doc = to_chunks(do, C)                                             # [B, H, Nq, C, V], zero padding
    D = (doc * o).sum(-1)                                              # D_i = do_i . o_i: [B, H, Nq, C]
    kc_T, vc_T = transposed(kc), transposed(vc)
    dqc = xp.zeros_like(qc)
    dkc, dvc = xp.zeros_like(kc), xp.zeros_like(vc)
    # Each tile in place: s, then W over its memory; dW, then dS over its. W^T and dS^T as the left operands
    # of their products are swapped views (NumPy multiplies those at nearly full speed: no copy needed).
    for j in range(kc.shape[2]):
        first, visible = _visible_tiles(j, q_pos, k_pos, prefix, C)
        W = qc[:, :, first:] @ kc_T[:, :, j, None]                   # s: [B, H, Nq', C, C]
        W -= lse[:, :, first:, :, None]
        xp.copyto(W, -xp.inf, where=~visible)                         # masked: exp(-inf) = 0 (s - lse may be > 0)
        xp.exp(W, out=W)                                              # W = exp(s - lse)
        dS = doc[:, :, first:] @ vc_T[:, :, j, None]                  # dW
        dS -= D[:, :, first:, :, None]
        dS *= W                                                       # dS = W (dW - D)
        dqc[:, :, first:] += dS @ kc[:, :, j, None]
        # Tile by tile, then summed over the query blocks. (As one [C, Nq' C] x [Nq' C, V] product NumPy
        # took 75 ms instead of 3 at C = 64, Nq' = 64, V = 8, float32, on the 2-core dev box.)
        dvc[:, :, j] = (W.swapaxes(-1, -2) @ doc[:, :, first:]).sum(2)
        dkc[:, :, j] = (dS.swapaxes(-1, -2) @ qc[:, :, first:]).sum(2)
    return from_chunks(dqc, T), from_chunks(dkc, total), from_chunks(dvc, total)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    return (q, k, v), {}
