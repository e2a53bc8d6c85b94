"""Long sequences with strong decay and beta near 1: no inf or NaN, and the float32 chunked form
matches the float64 recurrence (CONVENTIONS.md: gates stay in log space; only non-positive numbers are
exponentiated)."""
from __future__ import annotations

import numpy as np
import pytest

from minilin import examples
from minilin.mixers import gated_deltanet, gla, kda, mamba2, simple_gla
from conftest import rel_err

B, T, H, K, V = 1, 16384, 1, 16, 16


def strong_gates(rng, shape):
    """Log-decays in [-20, 0]: most mild, some wiping the memory almost completely (exp(-20) ~ 2e-9)."""
    return -20.0 * rng.uniform(0, 1, shape) ** 3


def inputs(rng, per_channel: bool, delta: bool):
    q = examples.normal(rng, (B, T, H, K))
    k = examples.unit_vectors(rng, (B, T, H, K)) if delta else examples.normal(rng, (B, T, H, K))
    v = examples.normal(rng, (B, T, H, V))
    g = strong_gates(rng, (B, T, H, K) if per_channel else (B, T, H))
    args = [q, k, v, g]
    if delta:
        args.append(rng.uniform(0.95, 1.0, (B, T, H)))  # beta near 1
    return args


CASES = {
    "simple_gla": (simple_gla, False, False),
    "gla": (gla, True, False),
    "gated_deltanet": (gated_deltanet, False, True),
    "kda": (kda, True, True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_long_strong_decay_float32_chunked_matches_float64(name):
    mod, per_channel, delta = CASES[name]
    args = inputs(np.random.default_rng(42), per_channel, delta)
    ref, ref_state = mod.recurrent(*args)
    out, state = mod.chunked(*(a.astype(np.float32) for a in args))
    assert np.isfinite(out).all() and np.isfinite(state).all()
    assert rel_err(out, ref) < 1e-4
    assert rel_err(state, ref_state) < 1e-4


def test_gates_beyond_float_range_stay_finite():
    """g = -1000 per token: exp(+cumsum) would overflow float64 within a chunk; the chunked forms don't."""
    rng = np.random.default_rng(0)
    q, k, v = (examples.normal(rng, (1, 200, 2, 8)) for _ in range(3))
    g = -rng.uniform(500, 1000, (1, 200, 2, 8))
    ref, _ = gla.recurrent(q, k, v, g)
    out, _ = gla.chunked(q, k, v, g, chunk_size=64)
    assert np.isfinite(out).all() and rel_err(out, ref) < 1e-10


def test_mamba2_long_strong_decay():
    rng = np.random.default_rng(1)
    x = examples.normal(rng, (B, T, H, V))
    dt = rng.uniform(0, 1, (B, T, H))
    A = np.array([-20.0])
    Bm, Cm = examples.normal(rng, (B, T, H, K)), examples.normal(rng, (B, T, H, K))
    ref, _ = mamba2.recurrent(x, dt, A, Bm, Cm)
    out, _ = mamba2.chunked(*(a.astype(np.float32) for a in (x, dt, A, Bm, Cm)))
    assert np.isfinite(out).all() and rel_err(out, ref) < 1e-4


def test_gates_near_the_float64_limit_stay_finite_in_every_form():
    """Two valid gates of -1e308 summed to -inf, and -inf - (-inf) put NaN in the chunked and parallel forms'
    decays; the sums take gates clipped where exp is 0 already (chunking.LOG_GATE_FLOOR)."""
    from minilin.mixers import gated_deltanet, simple_gla

    for mod in (simple_gla, gated_deltanet):
        args, kwargs = mod.example_inputs(1, 6, 1, 3, 2, seed=4)
        args = list(args)
        args[3] = args[3].copy()
        args[3][0, 2:4, 0] = -1e308
        ref, ref_state = mod.recurrent(*args, **kwargs)
        for out, state in (mod.chunked(*args, **kwargs, chunk_size=4), mod.parallel(*args, **kwargs)):
            assert np.abs(out - ref).max() <= 1e-12 * np.abs(ref).max()
            assert np.abs(state - ref_state).max() <= 1e-12 * np.abs(ref_state).max()
