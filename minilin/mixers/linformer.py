"""Linformer (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity"): non-causal softmax
attention over r projected keys and values instead of all T.

    o = softmax(scale * Q (E K)^T) (F V)          E, F: [r, T] projections along the sequence

Paper symbols: n = T (sequence length), k = r = `rank`, d = K, E_i and F_i = `E` and `F` (here one pair
shared by every batch and head: the paper's head-wise sharing), P-bar = the [T, r] score matrix.
Cost O(T r) per head instead of O(T^2): the T x T matrix softmax(Q K^T) is replaced by a T x r one.

No recurrent, chunked or step form: each of the r projected keys E K = sum_t E_it k_t mixes *all* T
positions, future ones included, so output i depends on tokens after i (the method is non-causal, an
encoder's attention) and nothing can be computed before the whole sequence is there; E is also tied to
one sequence length T. So `parallel` is the only form, it returns (o, None), and it takes no
`initial_state`.

The projections. In the paper E and F are learned. Untrained, what they must do is keep the softmax
weights meaningful, and which random matrix does that is not obvious:
- "sample" (default): E = F = r rows of the identity at positions chosen at random (seeded, without
  replacement). Then o_i = sum_{j in S} exp(s_ij) v_j / sum_{j in S} exp(s_ij), a self-normalized
  estimate of softmax attention from the r sampled keys: its error shrinks as r grows, and at r = T
  (every position, in order) it is exact.
- "pool": E = F = the mean of each of r contiguous segments (the paper's Section 4 "mean pooling with
  kernel and stride n/k" projection; the identity at r = T). Good when neighbouring tokens are alike.
- "gaussian": E = F = R with R_it ~ N(0, 1/r), the Johnson-Lindenstrauss matrix of the paper's Theorem 1.
  That theorem bounds P R^T R V - P V with P = softmax(Q K^T) already formed; Linformer computes
  softmax(Q (R K)^T) (R V) instead, a different function, and with E = F = R it does *not* approach
  softmax attention: the projected scores (R s)_i have variance ||s||^2 / r -> 0, so the weights tend to
  1/r and o -> (1/r) 1^T R V, whose size is O(1/sqrt(r)) -> 0 (relative error -> 1). (The paper's
  Theorem 2 uses rescaled copies E = delta R, F = exp(-delta) R, and its models learn E and F.) Kept to
  show exactly that (tests/test_approximations.py).
- explicit `E` (and `F`, default `F = E`): any [r, T] arrays, e.g. trained ones or the identity.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; E, F [r, T]; o [B, T, H, V]. `exact` is the function it approximates.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import examples
from ..signature import Signature, Tensor
from ..validation import Shapes, check_array, check_count, check_scale
from . import _noncausal

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V")),
    keywords=(Tensor("E", "R T", optional=True), Tensor("F", "R T", optional=True)),  # checked in _prepare
    output="B T H V", state=None)  # non-causal: no state

PROJECTIONS = ("sample", "pool", "gaussian")


def make_projection(T: int, rank: int, kind: str = "sample", *, seed: int = 0, dtype=np.float64, xp=np):
    """The [rank, T] projection `kind` (module docstring), seeded where random; used for both E and F."""
    if kind not in PROJECTIONS:
        raise ValueError(f"projection: expected one of {list(PROJECTIONS)}, got {kind!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed: expected an integer, got {seed!r}")
    rank = check_count("rank", rank, high=None if kind == "gaussian" else T,
                                  what="" if kind == "gaussian" else f" = T ({kind} picks r of the T positions)")
    rng = np.random.default_rng(seed)
    if kind == "sample":
        chosen = np.sort(rng.choice(T, size=rank, replace=False))   # sorted: at rank = T, E = identity
        E = np.zeros((rank, T))
        E[np.arange(rank), chosen] = 1.0                             # row i picks position chosen[i]
        return xp.asarray(E, dtype=dtype)
    if kind == "pool":
        return _noncausal.segment_means(T, rank, dtype, xp)
    return xp.asarray(rng.standard_normal((rank, T)) / np.sqrt(rank), dtype=dtype)


def _prepare(q, k, v, rank, kind, seed, E, F, scale, initial_state):
    """Checked inputs: (q * scale, k, v, E, F, checked), E and F built when not given (F = E by default)."""
    _noncausal.check_no_state(initial_state, "linformer")
    a = SIGNATURE.check(q, k, v)
    xp, shapes, (q, k, v) = a.xp, a.shapes, (a.q, a.k, a.v)
    T = shapes["T"]
    if E is None:
        if F is not None:
            raise ValueError("F: expected None when E is None (built-in projections set E = F), got an array")
        if rank is None:
            raise TypeError("rank: expected a positive integer (the number of projected keys r), got None")
        E = F = make_projection(T, rank, kind, seed=seed, dtype=q.dtype, xp=xp)
    else:
        dims = Shapes(T=T, **({} if rank is None else {"R": check_count("rank", rank)}))
        E = check_array("E", E, "R T", dims, xp)
        F = E if F is None else check_array("F", F, "R T", dims, xp)
        dtype = xp.result_type(q.dtype, E.dtype, F.dtype)  # given projections join the working dtype (CONVENTIONS)
        q, k, v, E, F = (x.astype(dtype, copy=False) for x in (q, k, v, E, F))
    return q * check_scale(scale, shapes["K"]), k, v, E, F, a


def parallel(q, k, v, *, rank=None, projection="sample", seed=0, E=None, F=None, scale=None, initial_state=None):
    """o = softmax(scale Q (E K)^T) (F V). Returns (o [B, T, H, V], None): no state (non-causal).

    rank: r, the number of projected keys (1 <= r <= T for "sample" and "pool"); projection: "sample",
    "pool" or "gaussian" with `seed`; or E [r, T] (and F [r, T], default E) given outright.
    """
    q, k, v, E, F, _ = _prepare(q, k, v, rank, projection, seed, E, F, scale, initial_state)
    keys = _noncausal.along_sequence(E, k)                          # E K: [B, r, H, K]
    values = _noncausal.along_sequence(F, v)                        # F V: [B, r, H, V]
    scores = _noncausal.heads_first(q) @ _noncausal.heads_first(keys).swapaxes(-1, -2)   # [B, H, T, r]
    o = _noncausal.softmax(scores) @ _noncausal.heads_first(values)
    return _noncausal.tokens_first(o), None


def exact(q, k, v, *, scale=None, **linformer_options):
    """What Linformer approximates: exact non-causal softmax attention, softmax(scale Q K^T) V.
    Takes the same arguments as `parallel` (the Linformer options are accepted and ignored) so that a
    benchmark can call both with one (args, kwargs). Returns (o [B, T, H, V], None)."""
    _noncausal.check_option_names(linformer_options, ("rank", "projection", "seed", "E", "F", "initial_state"),
                                  "linformer.exact")
    _noncausal.check_no_state(linformer_options.get("initial_state"), "linformer")
    a = SIGNATURE.check(q, k, v)
    shapes, (q, k, v) = a.shapes, (a.q, a.k, a.v)
    return _noncausal.softmax_attention(q * check_scale(scale, shapes["K"]), k, v), None


# --- backward ------------------------------------------------------------------------------------------


def parallel_backward(q, k, v, *, do, dstate=None, rank=None, projection="sample", seed=0, E=None, F=None,
                      scale=None, initial_state=None):
    """Gradients of <do, o> for `parallel` (`_parallel_backward`). Returns LinformerGradients(dq, dk, dv,
    dE, dF, dinitial_state): dE and dF when E (and F) were given, None for the built-in projections (no
    input to differentiate); with E given and F left out (F = E) the one matrix's gradient is dE, the sum
    of its two uses, and dF is None. dinitial_state is None. do [B, T, H, V]; dstate must be None."""
    _noncausal.check_no_dstate(dstate, "linformer")
    q_scaled, k, v, E_used, F_used, a = _prepare(q, k, v, rank, projection, seed, E, F, scale, initial_state)
    do, _ = SIGNATURE.check_cotangents(a, do, None)
    dq, dk, dv, dE, dF = _parallel_backward(q_scaled, k, v, E_used, F_used, do)
    if E is None:
        dE = dF = None
    elif F is None:
        dE, dF = dE + dF, None
    return SIGNATURE.gradients("linformer")(dq * check_scale(scale, a.shapes["K"]), dk, dv, dE, dF)


def _parallel_backward(q, k, v, E, F, do):
    """The gradients of L = <do, o>, o = softmax(Q (E K)^T) (F V), q already scaled. Step by step, with
    K' = E K and V' = F V the r projected keys and values, S = Q K'^T, W = softmax(S), o = W V':
        dV' = W^T do,       dW = do V'^T,       dS = W (dW - rowsum(W dW))    (`_noncausal.softmax_backward`)
        dQ  = dS K',        dK' = dS^T Q
        dK  = E^T dK',      dV  = F^T dV'                                      (along the sequence)
        dE  = sum dK' K^T,  dF  = sum dV' V^T                                  (over batch, heads, features)
    q, k [B, T, H, K]; v, do [B, T, H, V]; E, F [r, T]. Returns (dq, dk, dv, dE, dF); with E = F the
    caller adds dE and dF."""
    hf, tf = _noncausal.heads_first, _noncausal.tokens_first
    keys = _noncausal.along_sequence(E, k)                             # K' = E K: [B, r, H, K]
    values = _noncausal.along_sequence(F, v)                           # V' = F V: [B, r, H, V]
    W = _noncausal.softmax(hf(q) @ hf(keys).swapaxes(-1, -2))          # [B, H, T, r]
    dO = hf(do)
    dvalues = W.swapaxes(-1, -2) @ dO                                  # [B, H, r, V]
    dS = _noncausal.softmax_backward(W, dO @ hf(values).swapaxes(-1, -2))
    dq = dS @ hf(keys)
    dkeys = dS.swapaxes(-1, -2) @ hf(q)                                # [B, H, r, K]
    dkeys, dvalues = tf(dkeys), tf(dvalues)                            # [B, r, H, .]
    dk = _noncausal.along_sequence_transposed(E, dkeys)
    dv = _noncausal.along_sequence_transposed(F, dvalues)
    dE = _noncausal.projection_gradient(dkeys, k)
    dF = _noncausal.projection_gradient(dvalues, v)
    return tf(dq), dk, dv, dE, dF


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """q, k, v correlated along the sequence over T / 4 tokens (`_noncausal.correlated_normal`), rank
    min(T // 4, 256) (at least 1), the seeded "sample" projection. Returns (args, kwargs)."""
    rng = examples.generator(seed)
    q, k, v = (_noncausal.correlated_normal(rng, (B, T, H, D), max(1.0, T / 4), dtype, xp) for D in (K, K, V))
    return (q, k, v), {"rank": max(1, min(T // 4, 256)), "seed": seed}
