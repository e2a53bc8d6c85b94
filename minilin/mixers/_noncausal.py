"""Pieces shared by the non-causal approximations of softmax attention (`linformer`, `nystromformer`): the
exact function they approximate, the segment-mean matrix, their input checks, and the input distribution
on which they are meant to work.

Exact non-causal (bidirectional, encoder) softmax attention, the reference both are measured against:

    o_i = sum_j softmax_j(scale * q_i . k_j) v_j          every query reads every key, j = 0 .. T-1

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; o [B, T, H, V].
"""
from __future__ import annotations


import numpy as np

from ..backend import array_module


def softmax(scores):
    """Row softmax over the last axis, shifted by the row max so that exp never overflows."""
    xp = array_module(scores)
    weights = xp.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


def heads_first(x):
    """[B, T, H, D] -> [B, H, T, D], so that matmul works per (batch, head)."""
    return x.transpose(0, 2, 1, 3)


def tokens_first(x):
    """[B, H, T, D] -> [B, T, H, D], contiguous."""
    return array_module(x).ascontiguousarray(x.transpose(0, 2, 1, 3))


def softmax_attention(q, k, v):
    """Exact non-causal softmax attention for checked inputs, q already scaled: softmax(Q K^T) V.
    q, k [B, T, H, K]; v [B, T, H, V] -> o [B, T, H, V]."""
    scores = heads_first(q) @ heads_first(k).swapaxes(-1, -2)          # [B, H, T, T]
    return tokens_first(softmax(scores) @ heads_first(v))


def segment_means(T: int, m: int, dtype, xp):
    """P [m, T]: row i averages the tokens of segment i, the sequence cut into m contiguous segments
    whose lengths differ by at most one (boundaries at round(i T / m), halves to even: T = 10, m = 4 gives
    lengths 2, 3, 3, 2). P X gives the
    m segment means of X [.., T, D]; with m = T, P is the identity."""
    bounds = np.linspace(0, T, m + 1).round().astype(int)   # segment i holds tokens bounds[i] .. bounds[i+1]-1
    P = np.zeros((m, T))
    for i in range(m):
        P[i, bounds[i]:bounds[i + 1]] = 1.0 / (bounds[i + 1] - bounds[i])
    return xp.asarray(P, dtype=dtype)


def along_sequence(P, x):
    """P [r, T] applied along the sequence axis of x [B, T, H, D] -> [B, r, H, D] (sum_t P_it x_t),
    as one matrix product per batch element over the flattened heads and features."""
    B, T, H, D = x.shape
    return (P @ x.reshape(B, T, H * D)).reshape(B, P.shape[0], H, D)


def check_no_state(initial_state, mixer: str) -> None:
    """The approximations are non-causal: there is no state to continue from."""
    if initial_state is not None:
        raise ValueError(f"initial_state: expected None ({mixer} is non-causal: every output reads the whole "
                         f"sequence, so there is no state to continue from), got {type(initial_state).__name__}")


def check_no_dstate(dstate, mixer: str) -> None:
    """No state is returned, so a backward has no state cotangent to take."""
    if dstate is not None:
        raise ValueError(f"dstate: expected None ({mixer} is non-causal and returns no state, so there is no "
                         f"state cotangent), got {type(dstate).__name__}")


def check_option_names(options: dict, allowed: tuple, function: str) -> None:
    """`exact` accepts the approximation's own options (and ignores them), nothing else."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"{function}: unexpected keyword argument(s) {unknown}; expected among {sorted(allowed)}")


def correlated_normal(rng, shape, correlation_length: float, dtype=np.float64, xp=np):
    """Standard normal entries that are correlated along axis 1 (the sequence): a stationary AR(1) process

        x_0 = e_0,   x_t = rho x_{t-1} + sqrt(1 - rho^2) e_t,   rho = exp(-1 / correlation_length),

    so every x_t is N(0, 1) and corr(x_t, x_{t+s}) = rho^s = exp(-s / correlation_length). Neighbouring
    tokens are alike, as in real sequences, and unlike i.i.d. noise: this is the input on which a
    segment mean is a good summary of its segment (Nystromformer's landmarks, Linformer's pooling).
    """
    e = rng.standard_normal(shape)
    rho = float(np.exp(-1.0 / correlation_length))
    x = np.empty(shape)
    x[:, 0] = e[:, 0]
    for t in range(1, shape[1]):
        x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho * rho) * e[:, t]
    return xp.asarray(x, dtype=dtype)


# --- pieces of the backward passes ----------------------------------------------------------------------


def softmax_backward(W, dW):
    """The gradient of the scores from that of W = softmax(scores) (rows over the last axis):
    ds_ij = W_ij (dW_ij - sum_l W_il dW_il), the softmax's Jacobian applied row by row."""
    return W * (dW - (W * dW).sum(-1, keepdims=True))


def along_sequence_transposed(P, dy):
    """The adjoint of `along_sequence(P, x)` in x: P^T applied along the sequence axis, dy [B, r, H, D]
    -> dx [B, T, H, D] (dx_t = sum_i P_it dy_i)."""
    return along_sequence(P.T, dy)


def projection_gradient(dy, x):
    """The gradient of `along_sequence(P, x)` in P: dP_it = sum over batch, heads and features of
    dy[b, i, h, d] x[b, t, h, d]. dy [B, r, H, D], x [B, T, H, D] -> [r, T]."""
    B, r = dy.shape[:2]
    return (dy.reshape(B, r, -1) @ x.reshape(B, x.shape[1], -1).swapaxes(-1, -2)).sum(0)
