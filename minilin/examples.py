"""Random inputs in each mixer's valid range, for tests, the tour and the benchmarks.

Each mixer module has `example_inputs(B, T, H, K, V, *, dtype, seed, xp)` returning `(args, kwargs)`
for its forms, built from these pieces. Always fresh random data: zeros and constants hide unwritten
outputs and wrong indexing.
"""
from __future__ import annotations

import numpy as np


def generator(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(rng, shape, dtype=np.float64, xp=np):
    """Standard normal entries."""
    return xp.asarray(rng.standard_normal(shape), dtype=dtype)


def uniform(rng, low, high, shape, dtype=np.float64, xp=np):
    return xp.asarray(rng.uniform(low, high, shape), dtype=dtype)


def unit_vectors(rng, shape, dtype=np.float64, xp=np):
    """Random directions, L2-normalized over the last axis (keys for the delta rule)."""
    x = rng.standard_normal(shape)
    return xp.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True), dtype=dtype)


def log_gates(rng, shape, dtype=np.float64, xp=np, low=-1.0, high=-0.01):
    """Log-space decays g in [low, high], high <= 0: decay factors exp(g) between about 0.37 and 0.99."""
    return uniform(rng, low, high, shape, dtype, xp)
