"""Mamba-1's selective SSM: recurrent, scan, chunked and step compute the same function (float64, 1e-10),
from any initial state; it reduces to Mamba-2 when A is one number per channel; strong decays stay
finite; bad input is named."""
from __future__ import annotations

import re

import numpy as np
import pytest

from minilin.mixers import mamba, mamba2
from conftest import rel_err

TOL = 1e-10
FORMS = ("scan", "chunked")


def run(form, args, chunk_size=16, **kwargs):
    if form == "chunked":
        kwargs["chunk_size"] = chunk_size
    return getattr(mamba, form)(*args, **kwargs)


@pytest.mark.parametrize("B, T, H, K, V, chunk_size", [
    (1, 1, 1, 4, 4, 16), (2, 37, 3, 8, 5, 16), (1, 64, 2, 16, 16, 64), (2, 130, 2, 8, 12, 64), (1, 33, 1, 3, 2, 1)])
def test_forms_agree_from_an_initial_state(rng, B, T, H, K, V, chunk_size):
    args, _ = mamba.example_inputs(B, T, H, K, V, seed=T)
    h0 = rng.standard_normal((B, H * V, K))
    ref, ref_state = mamba.recurrent(*args, initial_state=h0)
    for form in FORMS:
        out, state = run(form, args, chunk_size, initial_state=h0)
        assert rel_err(out, ref) < TOL and rel_err(state, ref_state) < TOL, form


def test_without_skip(rng):
    args, _ = mamba.example_inputs(2, 20, 2, 4, 3)
    ref, _ = mamba.recurrent(*args[:5])
    with_skip, _ = mamba.recurrent(*args)
    assert rel_err(with_skip - args[5] * args[0], ref) < TOL
    for form in FORMS:
        assert rel_err(run(form, args[:5])[0], ref) < TOL


def test_scalar_A_per_channel_is_mamba2_with_one_channel_heads(rng):
    """With A[d, n] = A_d for all n, channel d is a Mamba-2 head of width P = 1 reading the shared B, C."""
    B, T, D, N = 2, 45, 5, 6
    x, dt = rng.standard_normal((B, T, D)), rng.uniform(0.01, 0.5, (B, T, D))
    A_head = -rng.uniform(0.5, 2.0, D)
    Bm, Cm, Dskip = rng.standard_normal((B, T, N)), rng.standard_normal((B, T, N)), rng.standard_normal(D)
    y, h = mamba.recurrent(x, dt, np.repeat(A_head[:, None], N, axis=1), Bm, Cm, Dskip)
    per_head = (np.broadcast_to(Bm[:, :, None], (B, T, D, N)), np.broadcast_to(Cm[:, :, None], (B, T, D, N)))
    y2, h2 = mamba2.recurrent(x[..., None], dt, A_head, *per_head, Dskip)
    assert rel_err(y, y2[..., 0]) < TOL
    assert rel_err(h, h2[..., 0]) < TOL  # mamba2's state [B, H, N, P] with P = 1


def test_continuation_and_step(rng):
    args, _ = mamba.example_inputs(2, 50, 2, 5, 3, seed=4)
    ref, ref_state = mamba.recurrent(*args)
    t = 19
    head = tuple(a[:, :t] if a.ndim == 3 else a for a in args)
    tail = tuple(a[:, t:] if a.ndim == 3 else a for a in args)
    for form in ("recurrent",) + FORMS:
        o1, s1 = run(form, head)
        o2, s2 = run(form, tail, initial_state=s1)
        assert rel_err(np.concatenate([o1, o2], axis=1), ref) < TOL and rel_err(s2, ref_state) < TOL, form
    state, outs = None, []
    for t in range(50):
        o_t, state = mamba.step(*(a[:, t] if a.ndim == 3 else a for a in args), state=state)
        outs.append(o_t)
    assert rel_err(np.stack(outs, axis=1), ref) < TOL and rel_err(state, ref_state) < TOL


def test_float32_matches_float64():
    args, _ = mamba.example_inputs(1, 1024, 2, 16, 16, dtype=np.float32, seed=2)
    ref, _ = mamba.recurrent(*(a.astype(np.float64) for a in args))
    for form in ("recurrent",) + FORMS:
        out, state = run(form, args, 64)
        assert out.dtype == np.float32 and state.dtype == np.float32
        assert rel_err(out, ref) < 1e-4, form


def test_strong_decays_stay_finite(rng):
    """exp(dt A) down to exp(-5000): underflows to 0 (the channel forgets everything); nothing overflows."""
    args, _ = mamba.example_inputs(1, 300, 2, 8, 4, seed=5)
    x, dt, A, Bm, Cm, D = args
    A = -rng.uniform(1, 5000, A.shape)
    dt = rng.uniform(0, 1, dt.shape)
    ref, _ = mamba.recurrent(x, dt, A, Bm, Cm, D)
    for form in FORMS:
        out, state = run(form, (x, dt, A, Bm, Cm, D), 64)
        assert np.isfinite(out).all() and np.isfinite(state).all()
        assert rel_err(out, ref) < TOL, form


# --- bad input ------------------------------------------------------------------------------------


@pytest.fixture
def inputs():
    args, _ = mamba.example_inputs(2, 10, 1, 4, 3)  # D = 3 channels, N = 4 states
    return dict(zip(["x", "dt", "A", "B", "C", "D"], args))


def call(form="chunked", **kwargs):
    return lambda i: getattr(mamba, form)(i["x"], i["dt"], i["A"], i["B"], i["C"], i["D"], **kwargs)


def test_wrong_rank(inputs):
    inputs["x"] = inputs["x"][..., None]
    with pytest.raises(ValueError, match=re.escape("x: expected shape [B, T, D] (3 dims), got [2, 10, 3, 1]")):
        call()(inputs)


def test_mismatched_state_size(inputs):
    inputs["C"] = inputs["C"][..., :3]
    with pytest.raises(ValueError, match=re.escape("C: expected shape [B, T, N] = [2, 10, 4], got [2, 10, 3]")):
        call("scan")(inputs)


def test_mismatched_channels(inputs):
    inputs["A"] = inputs["A"][:2]
    with pytest.raises(ValueError, match=re.escape("A: expected shape [D, N] = [3, N], got [2, 4]")):
        call("recurrent")(inputs)


def test_positive_A(inputs):
    inputs["A"][1, 2] = 0.5
    with pytest.raises(ValueError, match=r"A: expected A <= 0 .*got max 0\.5"):
        call()(inputs)


def test_negative_dt(inputs):
    inputs["dt"] = -inputs["dt"]
    with pytest.raises(ValueError, match=r"dt: expected step sizes dt >= 0, got min -"):
        call("scan")(inputs)


def test_integer_dtype(inputs):
    inputs["B"] = np.ones((2, 10, 4), dtype=np.int32)
    with pytest.raises(TypeError, match=r"B: expected a floating-point array \(float32 or float64\), got int32"):
        call()(inputs)


def test_nan(inputs):
    inputs["dt"][0, 5, 1] = np.nan
    with pytest.raises(ValueError, match=re.escape("dt: expected finite values, got nan at index (0, 5, 1)")):
        call()(inputs)


def test_state_shape(inputs):
    with pytest.raises(ValueError, match=re.escape("initial_state: expected shape [B, D, N] = [2, 3, 4], got [2, 4, 3]")):
        call(initial_state=np.zeros((2, 4, 3)))(inputs)


@pytest.mark.parametrize("chunk_size", [0, -1])
def test_chunk_size_not_positive(inputs, chunk_size):
    with pytest.raises(ValueError, match=rf"chunk_size: expected a positive integer, got {chunk_size}"):
        call(chunk_size=chunk_size)(inputs)
