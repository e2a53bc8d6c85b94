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
    return q * check_scale(scale, shapes["K"]), k, v, landmarks, a


def parallel(q, k, v, *, landmarks, pinv="iterative", iterations=6, scale=None, initial_state=None):
    """o = F~ A~^+ (B~ V) with `landmarks` = m segment means (1 <= m <= T). Returns (o [B, T, H, V], None).

    pinv: "iterative" (the paper's, `iterations` steps) or "exact" (SVD).
    """
    q, k, v, m, _ = _prepare(q, k, v, landmarks, pinv, iterations, scale, initial_state)
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


# --- backward ------------------------------------------------------------------------------------------


def parallel_backward(q, k, v, *, do, dstate=None, landmarks, pinv="iterative", iterations=6, scale=None,
                      initial_state=None):
    """Gradients of <do, o> for `parallel` (`_parallel_backward`), through the same pseudo-inverse.
    Returns NystromformerGradients(dq, dk, dv, dinitial_state=None). do [B, T, H, V]; dstate must be None.
    With pinv="exact" the gradient is that of the SVD pseudo-inverse at a fixed rank (Golub-Pereyra); it
    is only meaningful where A~'s rank does not change under small perturbations (A~ well-conditioned)."""
    _noncausal.check_no_dstate(dstate, "nystromformer")
    q_scaled, k, v, m, a = _prepare(q, k, v, landmarks, pinv, iterations, scale, initial_state)
    do, _ = SIGNATURE.check_cotangents(a, do, None)
    dq, dk, dv = _parallel_backward(q_scaled, k, v, m, pinv, iterations, do)
    return SIGNATURE.gradients("nystromformer")(dq * check_scale(scale, a.shapes["K"]), dk, dv)


def _iterative_pinv_backward(A, dZ, iterations):
    """The gradient with respect to A of <dZ, iterative_pinv(A, iterations)>, the iteration run backwards.
    Forward, per iteration: AZ = A Z, W1 = 7I - AZ, W2 = 15I - AZ W1, W3 = 13I - AZ W2, Z' = 1/4 Z W3.
    Backwards, given dZ' (the gradient of the iteration's output):
        dZ  = 1/4 dZ' W3^T,   dW3 = 1/4 Z^T dZ'
        dAZ = -dW3 W2^T,      dW2 = -AZ^T dW3
        dAZ -= dW2 W1^T,      dW1 = -AZ^T dW2
        dAZ -= dW1
        dA += dAZ Z^T,        dZ += A^T dAZ
    and at the start Z_0 = A^T / s, s = ||A||_1 ||A||_inf (largest column sum times largest row sum of |A|):
        dA += dZ_0^T / s,     ds = -<dZ_0, Z_0> / s,
        the column (row) attaining the max gets ds ||A||_inf sign(A) (ds ||A||_1 sign(A)).
    A row-sum maximum of a softmax is a tie (every row sums to 1), but the rows' sums do not change either,
    so whichever row is taken, its term vanishes through the softmax's backward. Stores every Z_j (m x m).
    A, dZ [..., m, m] -> dA."""
    xp = array_module(A)
    eye = xp.eye(A.shape[-1], dtype=A.dtype)
    col_sums, row_sums = xp.abs(A).sum(-2), xp.abs(A).sum(-1)          # [..., m]
    norm_1, norm_inf = col_sums.max(-1)[..., None, None], row_sums.max(-1)[..., None, None]
    Zs = [A.swapaxes(-1, -2) / (norm_1 * norm_inf)]
    for _ in range(iterations):
        AZ = A @ Zs[-1]
        Zs.append(0.25 * Zs[-1] @ (13 * eye - AZ @ (15 * eye - AZ @ (7 * eye - AZ))))
    dA = xp.zeros_like(A)
    for Z in reversed(Zs[:-1]):
        AZ = A @ Z
        W1 = 7 * eye - AZ
        W2 = 15 * eye - AZ @ W1
        W3 = 13 * eye - AZ @ W2
        dW3 = 0.25 * Z.swapaxes(-1, -2) @ dZ
        dZ = 0.25 * dZ @ W3.swapaxes(-1, -2)
        dAZ = -dW3 @ W2.swapaxes(-1, -2)
        dW2 = -AZ.swapaxes(-1, -2) @ dW3
        dAZ -= dW2 @ W1.swapaxes(-1, -2)
        dAZ -= -AZ.swapaxes(-1, -2) @ dW2                               # dW1 = -AZ^T dW2; dAZ -= dW1
        dA += dAZ @ Z.swapaxes(-1, -2)
        dZ = dZ + A.swapaxes(-1, -2) @ dAZ
    s = norm_1 * norm_inf
    dA += dZ.swapaxes(-1, -2) / s
    ds = -(dZ * Zs[0]).sum((-1, -2), keepdims=True) / s
    m = A.shape[-1]
    widest_col = xp.arange(m) == col_sums.argmax(-1)[..., None]        # [..., m], one True per matrix
    widest_row = xp.arange(m) == row_sums.argmax(-1)[..., None]
    dA += ds * norm_inf * xp.sign(A) * widest_col[..., None, :]
    dA += ds * norm_1 * xp.sign(A) * widest_row[..., :, None]
    return dA


def _exact_pinv_backward(A, X, dX):
    """The gradient with respect to A of <dX, X>, X = pinv(A), where the rank of A does not change
    (Golub & Pereyra 1973, the derivative of the pseudo-inverse):
        dX = -X dA X + X X^T dA^T (I - A X) + (I - X A) dA^T X^T X
    whose adjoint is
        dA = -X^T dX X^T + (I - A X) dX^T X X^T + X^T X dX^T (I - X A).
    For an invertible A only the first term remains: the inverse's -A^-T dX A^-T.
    A [..., p, n]; X, dX [..., n, p] -> dA [..., p, n]."""
    xp = array_module(A)
    Xt, dXt = X.swapaxes(-1, -2), dX.swapaxes(-1, -2)
    off_range = xp.eye(A.shape[-2], dtype=A.dtype) - A @ X            # I - A X: onto the complement of A's range
    off_rows = xp.eye(A.shape[-1], dtype=A.dtype) - X @ A             # I - X A: onto A's null space
    return -Xt @ dX @ Xt + off_range @ dXt @ X @ Xt + Xt @ X @ dXt @ off_rows


def _parallel_backward(q, k, v, m, pinv, iterations, do):
    """The gradients of L = <do, o>, o = F~ A~^+ (B~ V), q already scaled; the forward recomputed, then
    back through it right to left. With Y = B~ V [m, V], Z = A~^+, R = Z Y, o = F~ R:
        dF~ = do R^T,   dR = F~^T do,   dZ = dR Y^T,   dY = Z^T dR,   dB~ = dY V^T,   dV = B~^T dY
        dA~ from dZ through the pseudo-inverse (`_iterative_pinv_backward` / `_exact_pinv_backward`)
        the three softmaxes (`_noncausal.softmax_backward`) give dS_F, dS_A, dS_B, and their products:
        F~ = softmax(Q K~^T):   dQ += dS_F K~,    dK~ += dS_F^T Q
        A~ = softmax(Q~ K~^T):  dQ~ += dS_A K~,   dK~ += dS_A^T Q~
        B~ = softmax(Q~ K^T):   dQ~ += dS_B K,    dK  += dS_B^T Q~
        Q~ = P Q, K~ = P K:     dQ += P^T dQ~,    dK += P^T dK~
    q, k [B, T, H, K]; v, do [B, T, H, V] -> (dq, dk, dv)."""
    xp = array_module(q)
    hf, tf = _noncausal.heads_first, _noncausal.tokens_first
    P = _noncausal.segment_means(q.shape[1], m, q.dtype, xp)
    Q, K, V, dO = (hf(x) for x in (q, k, v, do))                       # [B, H, T, .]
    Q_land, K_land = (hf(_noncausal.along_sequence(P, x)) for x in (q, k))   # [B, H, m, K]
    F_tilde = _noncausal.softmax(Q @ K_land.swapaxes(-1, -2))
    A_tilde = _noncausal.softmax(Q_land @ K_land.swapaxes(-1, -2))
    B_tilde = _noncausal.softmax(Q_land @ K.swapaxes(-1, -2))
    Z = iterative_pinv(A_tilde, iterations) if pinv == "iterative" else xp.linalg.pinv(A_tilde)
    Y = B_tilde @ V
    R = Z @ Y
    dF = dO @ R.swapaxes(-1, -2)
    dR = F_tilde.swapaxes(-1, -2) @ dO
    dZ = dR @ Y.swapaxes(-1, -2)
    dY = Z.swapaxes(-1, -2) @ dR
    dB = dY @ V.swapaxes(-1, -2)
    dV = B_tilde.swapaxes(-1, -2) @ dY
    dA = (_iterative_pinv_backward(A_tilde, dZ, iterations) if pinv == "iterative"
          else _exact_pinv_backward(A_tilde, Z, dZ))
    dS_F = _noncausal.softmax_backward(F_tilde, dF)
    dS_A = _noncausal.softmax_backward(A_tilde, dA)
    dS_B = _noncausal.softmax_backward(B_tilde, dB)
    dQ = dS_F @ K_land
    dK = dS_B.swapaxes(-1, -2) @ Q_land
    dQ_land = dS_A @ K_land + dS_B @ K
    dK_land = dS_F.swapaxes(-1, -2) @ Q + dS_A.swapaxes(-1, -2) @ Q_land
    dq = tf(dQ) + _noncausal.along_sequence_transposed(P, tf(dQ_land))
    dk = tf(dK) + _noncausal.along_sequence_transposed(P, tf(dK_land))
    return dq, dk, tf(dV)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """q, k, v correlated along the sequence over T / 4 tokens (`_noncausal.correlated_normal`),
    landmarks = min(T // 8, 64) (at least 1), the iterative pseudo-inverse. Returns (args, kwargs)."""
    rng = examples.generator(seed)
    q, k, v = (_noncausal.correlated_normal(rng, (B, T, H, D), max(1.0, T / 4), dtype, xp) for D in (K, K, V))
    return (q, k, v), {"landmarks": max(1, min(T // 8, 64))}
