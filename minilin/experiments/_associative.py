"""Shared pieces of the associative-memory experiments (capacity, interference, softmax amplification,
write rules, fact update, recall): making keys and values, writing pairs into a mixer's state with the
mixer itself, and reading them back.

Layout: independent trials ride on the batch axis and there is one head, so
    keys, queries [B, n, 1, d]    values [B, n, 1, V]    state S [B, 1, d, V]    reads [B, n, 1, V]
and every read is `S^T q` with `scale = 1` (the mixers' default `d ** -0.5` would only rescale it).
"""
from __future__ import annotations

import numpy as np

from ..mixers import attention, deltanet, gated_deltanet, linear_attention


# ---- keys and values ------------------------------------------------------------------------------

def unit_vectors(rng, trials: int, n: int, d: int) -> np.ndarray:
    """Random directions [trials, n, 1, d], each of unit L2 norm (uniform on the sphere)."""
    x = rng.standard_normal((trials, n, 1, d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def orthogonal_keys(rng, trials: int, n: int, d: int) -> np.ndarray:
    """Unit keys [trials, n, 1, d] in blocks of d mutually orthogonal ones (rows of a random rotation).

    Keys 0..d-1 are exactly orthonormal, so n <= d pairs never interfere. No d-dimensional space holds
    more than d orthogonal directions, so key d onwards starts a fresh random orthonormal block: the
    least-coherent continuation there is, and where the interference has to begin.
    """
    blocks = -(-n // d)
    rotations = np.linalg.qr(rng.standard_normal((trials, blocks, d, d)))[0]  # [trials, blocks, d, d]
    keys = rotations.swapaxes(-1, -2).reshape(trials, blocks * d, d)[:, :n]
    return keys[:, :, None, :]


def one_hot(ids: np.ndarray, vocab: int) -> np.ndarray:
    """Token ids [...] -> one-hot rows [..., vocab] (float64): values "as token ids"."""
    return np.eye(vocab)[ids]


def slot_values(trials: int, n: int) -> np.ndarray:
    """Value e_j (one-hot) for pair j: [trials, n, 1, n]. A memory written with these values reads
    back, at any query, the weight it gives each stored pair (its attention weights, made visible)."""
    return np.broadcast_to(np.eye(n)[None, :, None, :], (trials, n, 1, n))


# ---- writing: each returns the final state [B, 1, d, V] -------------------------------------------

def write_additive(keys, values, *, feature_map=None, initial_state=None):
    """Linear attention's additive write, S = sum_i phi(k_i) v_i^T (phi: identity unless `feature_map`
    is given; see `minilin.feature_maps`), run by the mixer. State [B, 1, F, V], F = phi's width."""
    _, state = linear_attention.chunked(keys, keys, values, feature_map=feature_map, scale=1.0,
                                        initial_state=initial_state)
    return state


def write_delta(keys, values, beta: float, *, log_decay: float | None = None, initial_state=None):
    """Delta-rule writes S <- S + beta k (v - S^T k)^T, run by DeltaNet (or by Gated DeltaNet, which
    first decays S by exp(log_decay), when `log_decay` is given). beta is one number for every write."""
    betas = np.full(keys.shape[:3], float(beta))
    if log_decay is None:
        _, state = deltanet.chunked(keys, keys, values, betas, scale=1.0, initial_state=initial_state)
    else:
        g = np.full(keys.shape[:3], float(log_decay))
        _, state = gated_deltanet.chunked(keys, keys, values, g, betas, scale=1.0, initial_state=initial_state)
    return state


# ---- reading ---------------------------------------------------------------------------------------

def read(state, queries, *, feature_map=None):
    """Read the memory S [B, 1, d, V] at each query [B, m, 1, d] -> S^T q [B, m, 1, V]
    (S^T phi(q) with a feature map, for a memory written with the same one).

    Run as linear attention continuing from S with query tokens that write nothing (zero keys and
    values), so every read sees the same S. The additive, delta and gated-delta memories share this
    state layout and this read: they differ only in how they write.
    """
    B, m, H, d = queries.shape
    V = state.shape[-1]
    out, _ = linear_attention.chunked(queries, np.zeros_like(queries), np.zeros((B, m, H, V)),
                                      feature_map=feature_map, scale=1.0, initial_state=state)
    return out


def softmax_read(keys, values, queries, scale: float):
    """Softmax attention of each query [B, m, 1, d] over the n stored pairs, as if placed after them.

        read(q) = sum_j w_j v_j,   w_j = exp(scale q . k_j) / sum_i exp(scale q . k_i)   (j, i over stored pairs)

    Run by `attention.parallel` continuing from the KV cache of the n pairs. A softmax query token is
    itself a token and appends its own key and value; it gets a zero key and zero value, a slot with
    logit 0 that holds nothing. That slot only adds to the normalizer, so the values carry an extra
    column of ones (their total weight) and the read is divided by it: the weights over the stored
    pairs come out exactly, whatever the number of query tokens before.
    Returns [B, m, 1, V].
    """
    B, m, H, d = queries.shape
    stored = np.concatenate([values, np.ones(values.shape[:-1] + (1,))], axis=-1)
    cache = attention.KVCache(keys, stored)
    out, _ = attention.parallel(queries, np.zeros_like(queries), np.zeros((B, m, H, stored.shape[-1])),
                                scale=float(scale), initial_state=cache)
    return out[..., :-1] / out[..., -1:]


def relative_errors(reads, values) -> np.ndarray:
    """||read_i - v_i|| / ||v_i|| for every stored pair: [B, n]."""
    return np.linalg.norm(reads - values, axis=-1)[..., 0] / np.linalg.norm(values, axis=-1)[..., 0]


def rms(x) -> float:
    """Root mean square: the right average of errors whose squares add (cross-talk)."""
    return float(np.sqrt(np.mean(np.square(x))))
