"""Nystromformer (Xiong et al. 2021, "Nystromformer: A Nystrom-Based Algorithm for Approximating
Self-Attention"): non-causal softmax attention through m landmarks and the Nystrom approximation.

    Q~ = P Q,  K~ = P K                          landmarks: the means of m contiguous segments (P [m, T])
    F~ = softmax(scale Q  K~^T)                  [T, m]
    A~ = softmax(scale Q~ K~^T)                  [m, m]
    B~ = softmax(scale Q~ K^T)                   [m, T]
    o  = F~ A~^+ (B~ V)                          A~^+ the Moore-Penrose pseudo-inverse

Paper symbols: n = T, m = `landmarks`, Q~ and K~ = the landmarks, S-hat = F~ A~^+ B~ approximates
S = softmax(scale Q K^T). Cost O(T m) per head plus the m x m pseudo-inverse. The paper's extra
depthwise convolution of V (a skip connection added to o) is not part of the approximation and is left out.

Exactness: with m = T every segment is one token, so Q~ = Q, K~ = K and F~ = A~ = B~ = S; the
pseudo-inverse's defining identity S S^+ S = S then gives o = S V, exact softmax attention, for any S.
That holds for the exact pseudo-inverse (`pinv="exact"`, an SVD); the iterative one is exact only in the
limit of many iterations.

The pseudo-inverse (`pinv=`):
- "iterative" (default, the paper's): Z_0 = A^T / (||A||_1 ||A||_inf), then
  Z_{j+1} = 1/4 Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))), `iterations` = 6 times. On each singular
  direction x = sigma^2 / (||A||_1 ||A||_inf) -> f(x) = x (13 - 15 x + 7 x^2 - x^3) / 4, so
  1 - f(x) = (1 - x)^3 (4 - x) / 4: third-order convergence once x is near 1, but a tiny x only grows
  3.25x per iteration. Stopped after 6 iterations it leaves the smallest singular values uninverted,
  which acts as a regularizer.
- "exact": the SVD pseudo-inverse (`linalg.pinv`).
Measured (T = 64, B = 2, H = 4, tokens correlated over 16 positions, 100 seeds, m = 2 .. 32): with the
iterative form the error fell with every doubling of m on every seed; with the exact pseudo-inverse it
did so on only 16 seeds and reached 93 times the output's norm. A~ is nearly singular (neighbouring
landmarks are alike) and its rows are normalized differently from F~'s and B~'s, so inverting it
exactly amplifies their mismatch instead of cancelling it. The exact one is there for the m = T
identity (tests/test_approximations.py asserts both behaviours).

No recurrent, chunked or step form: every landmark is a mean over a whole segment and every output reads
all of B~ V, so output i depends on tokens after i (non-causal, an encoder's attention) and nothing can
be computed before the whole sequence is there. `parallel` is the only form; it returns (o, None) and
takes no `initial_state`.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V]. `exact` is the function it approximates.
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..signature import Signature, Tensor
from ..validation import check_count, check_scale
from . import _noncausal

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V")),
    output="B T H V", state=None)  # non-causal: no state

PSEUDO_INVERSES = ("iterative", "exact")


def iterative_pinv(A, iterations: int = 6):
    """The paper's iterative pseudo-inverse of A [..., m, m] (module docstring), batched over leading axes."""
    xp = array_module(A)
    eye = xp.eye(A.shape[-1], dtype=A.dtype)
    norm_1 = xp.abs(A).sum(-2).max(-1)[..., None, None]         # ||A||_1: largest column sum
    norm_inf = xp.abs(A).sum(-1).max(-1)[..., None, None]       # ||A||_inf: largest row sum (1 for a softmax)
    Z = A.swapaxes(-1, -2) / (norm_1 * norm_inf)
    for _ in range(iterations):
        AZ = A @ Z
        Z = 0.25 * Z @ (13 * eye - AZ @ (15 * eye - AZ @ (7 * eye - AZ)))
    return Z


def _prepare(q, k, v, landmarks, pinv, iterations, scale, initial_state):
    _noncausal.check_no_state(initial_state, "nystromformer")
    a = SIGNATURE.check(q, k, v)
    shapes, (q, k, v) = a.shapes, (a.q, a.k, a.v)
    landmarks = check_count("landmarks", landmarks, high=shapes["T"], what=" = T")
    if pinv not in PSEUDO_INVERSES:
        raise ValueError(f"pinv: expected one of {list(PSEUDO_INVERSES)}, got {pinv!r}")
    iterations = check_count("iterations", iterations)
    return q * check_scale(scale, shapes["K"]), k, v, landmarks


def parallel(q, k, v, *, landmarks, pinv="iterative", iterations=6, scale=None, initial_state=None):
    """o = F~ A~^+ (B~ V) with `landmarks` = m segment means (1 <= m <= T). Returns (o [B, T, H, V], None).

    pinv: "iterative" (the paper's, `iterations` steps) or "exact" (SVD).
    """
    q, k, v, m = _prepare(q, k, v, landmarks, pinv, iterations, scale, initial_state)
    xp = array_module(q)
    P = _noncausal.segment_means(q.shape[1], m, q.dtype, xp)
    Q, K, V = (_noncausal.heads_first(x) for x in (q, k, v))                      # [B, H, T, .]
    Q_land, K_land = (_noncausal.heads_first(_noncausal.along_sequence(P, x)) for x in (q, k))  # [B, H, m, K]
    F_tilde = _noncausal.softmax(Q @ K_land.swapaxes(-1, -2))                     # [B, H, T, m]
    A_tilde = _noncausal.softmax(Q_land @ K_land.swapaxes(-1, -2))                # [B, H, m, m]
    B_tilde = _noncausal.softmax(Q_land @ K.swapaxes(-1, -2))                     # [B, H, m, T]
    A_pinv = iterative_pinv(A_tilde, iterations) if pinv == "iterative" else xp.linalg.pinv(A_tilde)
    o = F_tilde @ (A_pinv @ (B_tilde @ V))                                        # right to left: O(T m)
    return _noncausal.tokens_first(o), None


def exact(q, k, v, *, scale=None, **nystromformer_options):
    """What Nystromformer approximates: exact non-causal softmax attention, softmax(scale Q K^T) V.
    Takes the same arguments as `parallel` (the Nystromformer options are accepted and ignored) so that a
    benchmark can call both with one (args, kwargs). Returns (o [B, T, H, V], None)."""
    _noncausal.check_option_names(nystromformer_options, ("landmarks", "pinv", "iterations", "initial_state"),
                                  "nystromformer.exact")
    _noncausal.check_no_state(nystromformer_options.get("initial_state"), "nystromformer")
    a = SIGNATURE.check(q, k, v)
    shapes, (q, k, v) = a.shapes, (a.q, a.k, a.v)
    return _noncausal.softmax_attention(q * check_scale(scale, shapes["K"]), k, v), None


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """q, k, v correlated along the sequence over T / 4 tokens (`_noncausal.correlated_normal`),
    landmarks = min(T // 8, 64) (at least 1), the iterative pseudo-inverse. Returns (args, kwargs)."""
    rng = examples.generator(seed)
    q, k, v = (_noncausal.correlated_normal(rng, (B, T, H, D), max(1.0, T / 4), dtype, xp) for D in (K, K, V))
    return (q, k, v), {"landmarks": max(1, min(T // 8, 64))}
