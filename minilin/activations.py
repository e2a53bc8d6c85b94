"""The activations a layer puts between its projections and a mixer, so that each input lands in its valid
range (CONVENTIONS.md): log-space gates <= 0, write strengths beta in (0, 1), step sizes dt > 0, unit keys.
Each is a function with its hand-written backward beside it: `f(z)` and `f.backward(z, dy)` = dL/dz given
dy = dL/df(z), as the layers of `minilin.nn` need them.

    identity      z
    log_sigmoid   log sigmoid(z) = -log(1 + e^-z) <= 0          d/dz = sigmoid(-z) = 1 - sigmoid(z)
    sigmoid       1 / (1 + e^-z) in (0, 1)                       d/dz = s (1 - s)
    step_size     softplus(z - 2) > 0 (Mamba's dt, about 0.13 at z = 0)    d/dz = sigmoid(z - 2)
    rwkv7_decay   -e^{-1/2} sigmoid(z) in (-0.61, 0), RWKV-7's log-decay   d/dz = -e^{-1/2} s (1 - s)
    l2_normalize  z / sqrt(|z|^2 + eps) over the last axis        d/dz = (dy - y (y . dy)) / sqrt(|z|^2 + eps)
"""
from __future__ import annotations

import math

from .backend import array_module


class Activation:
    """A named elementwise (or last-axis) function with its backward."""

    def __init__(self, name: str, forward, backward):
        self.name, self._forward, self._backward = name, forward, backward

    def __call__(self, z):
        return self._forward(z)

    def backward(self, z, dy):
        """dL/dz for dy = dL/dy at y = self(z)."""
        return self._backward(z, dy)

    def __repr__(self) -> str:
        return f"Activation({self.name!r})"


def _sigmoid(z):
    """1 / (1 + e^-z) computed as exp(log_sigmoid(z)): no overflow for any z."""
    return array_module(z).exp(_log_sigmoid(z))


def _log_sigmoid(z):
    """log sigmoid(z) = -log(1 + exp(-z)) <= 0, without overflow (logaddexp)."""
    return -array_module(z).logaddexp(0, -z)


# The same epsilon as the delta-rule mixers' normalize_qk (FLA's l2norm).
L2_EPS = 1e-6


def _l2_normalize(z):
    return z / array_module(z).sqrt((z * z).sum(-1, keepdims=True) + L2_EPS)


def _l2_normalize_backward(z, dy):
    """y = z / r, r = sqrt(|z|^2 + eps): dz = dy / r - z (z . dy) / r^3 = (dy - y (y . dy)) / r."""
    r = array_module(z).sqrt((z * z).sum(-1, keepdims=True) + L2_EPS)
    y = z / r
    return (dy - y * (y * dy).sum(-1, keepdims=True)) / r


_RWKV7_DECAY = math.exp(-0.5)

identity = Activation("identity", lambda z: z, lambda z, dy: dy)
log_sigmoid = Activation("log_sigmoid", _log_sigmoid, lambda z, dy: dy * _sigmoid(-z))
sigmoid = Activation("sigmoid", _sigmoid, lambda z, dy: dy * _sigmoid(z) * _sigmoid(-z))
step_size = Activation("step_size", lambda z: array_module(z).logaddexp(0, z - 2), lambda z, dy: dy * _sigmoid(z - 2))
rwkv7_decay = Activation("rwkv7_decay", lambda z: -_RWKV7_DECAY * _sigmoid(z),
                         lambda z, dy: -_RWKV7_DECAY * dy * _sigmoid(z) * _sigmoid(-z))
l2_normalize = Activation("l2_normalize", _l2_normalize, _l2_normalize_backward)
