"""Exercise 03: feature maps. Put a kernel back where the softmax was, and keep the bracket move.

Linear attention replaces the softmax weight exp(q . k) by a kernel phi(q) . phi(k), so that
    o_i = sum_{j <= i} (phi(q_i) . phi(k_j)) v_j / sum_{j <= i} phi(q_i) . phi(k_j)
          = phi(q_i)^T S_i / phi(q_i)^T z_i,   S_i = sum_{j <= i} phi(k_j) v_j^T,  z_i = sum_{j <= i} phi(k_j)
(Katharopoulos et al. 2020). The denominator normalizes the weights to sum to 1, as the softmax does;
it needs phi(q) . phi(k) > 0, so phi should be positive. Two choices:

- elu+1 (Katharopoulos et al.): phi(x) = elu(x) + 1 = x + 1 for x > 0, exp(x) for x <= 0. Positive,
  cheap, F = K features; it does not approximate the softmax, it replaces it.
- FAVOR+ (Performer, Choromanski et al. 2021): positive random features whose dot product estimates
  the softmax kernel itself, without bias:
      phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m),     x' = x / K^(1/4),     W: [m, K] random
  For a Gaussian row w, E[exp(w.a - |a|^2/2) exp(w.b - |b|^2/2)] = exp(a . b), so
  E[phi(q) . phi(k)] = exp(q . k / sqrt(K)): softmax attention's weight. More features m, less noise.
  (minilin draws W's rows orthogonal in blocks, which lowers the variance further.)

Shapes: x [..., K] -> phi(x) [..., F] (F = K for elu+1, m for FAVOR+); q, k [B, T, H, K]; v [B, T, H, V].
Check: `minilin check 3` (compares with minilin.feature_maps and minilin.mixers.linear_attention).
"""
import numpy as np


def elu_plus_one(x):
    """phi(x) = elu(x) + 1, elementwise: x + 1 where x > 0, exp(x) elsewhere. [..., K] -> [..., K].

    Careful: np.where evaluates both branches everywhere, and exp of a large positive x overflows (with
    a warning) even where the other branch is chosen; exp(min(x, 0)) avoids that.
    """
    raise NotImplementedError("TODO: the two branches, joined with np.where (about 1 line)")


def favor_plus(x, W):
    """FAVOR+ features: phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m), x' = x / K^(1/4).

    x: [..., K]; W: [m, K] (the random projection, given). Returns phi(x): [..., m], all positive.
    """
    raise NotImplementedError(
        "TODO: scale x, project with W, subtract |x'|^2 / 2, exponentiate, divide by sqrt(m) (about 3 lines)")


def normalized_linear_attention(q, k, v, phi):
    """o_i = sum_{j <= i} (phi(q_i) . phi(k_j)) v_j / sum_{j <= i} phi(q_i) . phi(k_j).

    q, k: [B, T, H, K]; v: [B, T, H, V]; phi: a feature map, [..., K] -> [..., F] (call it on q and k).
    Returns o: [B, T, H, V]. Either form works: the masked [T, T] matrix of weights, or prefix sums of
    phi(k_j) v_j^T and phi(k_j). (A scale on q would cancel between numerator and denominator.)
    """
    raise NotImplementedError(
        "TODO: features, causal weights phi(q_i) . phi(k_j), weighted sum over the sum of weights (about 6 lines)")
