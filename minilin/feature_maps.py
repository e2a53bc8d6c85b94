"""Feature maps phi for linear attention: sim(q, k) = phi(q) . phi(k) replaces exp(q . k).

A feature map takes [..., K] and returns [..., F] (F = K except for random features). Any of these
names, or any callable with that contract, can be passed as `feature_map=` to `linear_attention`:

- "identity": phi(x) = x (plain linear attention; with normalize=True the sum q . z can reach zero).
- "elu+1": phi(x) = elu(x) + 1 > 0 (Katharopoulos et al. 2020, "Transformers are RNNs").
- "relu": phi(x) = max(x, 0).
- `FavorPlus(num_features, seed)`: Performer's positive orthogonal random features (Choromanski et
  al. 2021), an unbiased estimate of the softmax kernel exp(q . k / sqrt(K)).

Each has a backward, dphi -> dx (the vector-Jacobian product of phi at x; `backward_of` finds it), so that
linear attention's gradients reach q and k through phi. A user's callable can provide one as its
`backward(x, dphi)` attribute or method.
"""
from __future__ import annotations

import math

import numpy as np

from .backend import array_module
from .validation import check_count


def identity(x):
    """phi(x) = x."""
    return x


def identity_backward(x, dphi):
    """dx = dphi."""
    return dphi


def elu_plus_one(x):
    """phi(x) = elu(x) + 1: x + 1 for x > 0, exp(x) otherwise; always positive."""
    xp = array_module(x)
    return xp.where(x > 0, x + 1, xp.exp(xp.minimum(x, 0)))


def elu_plus_one_backward(x, dphi):
    """phi'(x) = 1 for x > 0, exp(x) otherwise (continuous at 0, where both are 1): dx = dphi * phi'(x)."""
    xp = array_module(x)
    return dphi * xp.where(x > 0, 1, xp.exp(xp.minimum(x, 0)))


def relu(x):
    """phi(x) = max(x, 0)."""
    return array_module(x).maximum(x, 0)


def relu_backward(x, dphi):
    """phi'(x) = 1 for x > 0, else 0 (0 at the kink x = 0, as autograd libraries take it)."""
    return dphi * (x > 0)


class FavorPlus:
    """FAVOR+ positive orthogonal random features (Performer).

        phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m),   x' = x / K^(1/4),   W: [m, K]

    For any Gaussian row w, E[exp(w.q' - |q'|^2/2) exp(w.k' - |k'|^2/2)] = exp(q'.k') = exp(q.k / sqrt(K)),
    so phi(q) . phi(k) is an unbiased, always positive estimate of the softmax kernel. Rows are drawn
    in blocks of K mutually orthogonal directions (QR of a Gaussian matrix) with lengths drawn like a
    Gaussian vector's (chi with K degrees of freedom): the same marginal law, lower variance.

    The projection is seeded: the same (num_features, seed, K) always gives the same W. No max is
    subtracted inside exp (some implementations do, for range); the estimate stays exact in expectation.
    """

    def __init__(self, num_features: int = 256, seed: int = 0):
        self.num_features = check_count("num_features", num_features)
        self.seed = int(seed)
        self._projections: dict[int, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"FavorPlus(num_features={self.num_features}, seed={self.seed})"

    def projection(self, K: int) -> np.ndarray:
        """W: [m, K], float64, made once per K."""
        if K not in self._projections:
            rng = np.random.default_rng(self.seed)
            blocks, rows = [], 0
            while rows < self.num_features:
                q, r = np.linalg.qr(rng.standard_normal((K, K)))
                # Without this sign fix QR's Q is not uniformly (Haar) distributed: its rows lean toward
                # a fixed orthant, which biases the estimate (measured: column means ~7 sigma off zero).
                q = q * np.sign(np.diag(r))
                blocks.append(q.T)  # K orthonormal rows
                rows += K
            directions = np.concatenate(blocks)[: self.num_features]
            lengths = np.linalg.norm(rng.standard_normal((self.num_features, K)), axis=1)
            self._projections[K] = directions * lengths[:, None]
        return self._projections[K]

    def __call__(self, x):
        xp = array_module(x)
        K = x.shape[-1]
        W = xp.asarray(self.projection(K), dtype=x.dtype)
        x = x / K ** 0.25
        log_features = x @ W.T - 0.5 * (x * x).sum(-1, keepdims=True)
        # A Python float, not np.sqrt's float64 scalar, so float32 inputs stay float32 (NEP 50).
        return xp.exp(log_features) / math.sqrt(self.num_features)

    def backward(self, x, dphi):
        """dx from dphi [..., m], with x' = x / K^(1/4) and phi_j = exp(w_j . x' - |x'|^2 / 2) / sqrt(m):
            d phi_j / d x' = phi_j (w_j - x')
            dx' = sum_j dphi_j phi_j (w_j - x') = (dphi * phi) W - (dphi . phi) x'
            dx  = dx' / K^(1/4)
        phi is recomputed from x (one product and one exp)."""
        xp = array_module(x)
        K = x.shape[-1]
        W = xp.asarray(self.projection(K), dtype=x.dtype)
        weighted = dphi * self(x)
        return (weighted @ W - weighted.sum(-1, keepdims=True) * (x / K ** 0.25)) / K ** 0.25


NAMED = {"identity": identity, "elu+1": elu_plus_one, "relu": relu, "favor+": FavorPlus()}
BACKWARD = {identity: identity_backward, elu_plus_one: elu_plus_one_backward, relu: relu_backward}
# The maps whose features are finite wherever their (checked) inputs are: nothing to check after them. FAVOR+'s
# exponentials and a user's callable can overflow.
KEEP_FINITE = frozenset(BACKWARD)


def resolve(feature_map):
    """None -> identity; a name in NAMED ("favor+" is FavorPlus(256, seed=0)); a callable -> itself."""
    if feature_map is None:
        return identity
    if callable(feature_map):
        return feature_map
    if isinstance(feature_map, str) and feature_map in NAMED:
        return NAMED[feature_map]
    raise ValueError(f"feature_map: expected None, a callable, or one of {sorted(NAMED)}, got {feature_map!r}")


def backward_of(feature_map):
    """The backward (x, dphi) -> dx of `resolve(feature_map)`: the named maps' (FavorPlus has its method),
    or a callable's own `backward` attribute. TypeError for a map without one, before any work starts."""
    phi = resolve(feature_map)
    named = next((backward for f, backward in BACKWARD.items() if f is phi), None)  # by identity: any callable
    if named is not None:
        return named
    backward = getattr(phi, "backward", None)
    if callable(backward):
        return backward
    raise TypeError(
        f"feature_map: expected a map with a backward to differentiate through (None, one of {sorted(NAMED)}, "
        f"FavorPlus, or a callable with a backward(x, dphi) -> dx attribute), got {feature_map!r}, which has none")
