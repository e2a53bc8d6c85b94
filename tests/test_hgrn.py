"""HGRN and HGRN2: every form equals the recurrence (float64, 1e-10) from any initial state; each equals an
independent reference (HGRN: GLA with one-channel heads; HGRN2: the paper's update written out); strong
gates stay finite; bad input is named."""
from __future__ import annotations

import re

import numpy as np
import pytest

from minilin.mixers import gla, hgrn, hgrn2
from conftest import rel_err

TOL = 1e-10
SHAPES = [(1, 1, 1, 4, 4, 16), (2, 37, 3, 8, 5, 16), (1, 64, 2, 16, 16, 64), (2, 130, 2, 8, 12, 64),
          (1, 33, 1, 3, 2, 1), (1, 40, 2, 3, 2, 3)]


def run(mod, form, args, chunk_size=16, **kwargs):
    if form == "chunked":
        kwargs["chunk_size"] = chunk_size
    return getattr(mod, form)(*args, **kwargs)


@pytest.mark.parametrize("B, T, H, K, V, chunk_size", SHAPES)
def test_forms_agree_from_an_initial_state(rng, B, T, H, K, V, chunk_size):
    for mod, forms, state_shape in ((hgrn, ("chunked", "scan"), (B, H * K)),
                                    (hgrn2, ("chunked", "parallel"), (B, H, K, V))):
        args, _ = mod.example_inputs(B, T, H, K, V, seed=T)
        h0 = rng.standard_normal(state_shape)
        ref, ref_state = mod.recurrent(*args, initial_state=h0)
        for form in forms:
            out, state = run(mod, form, args, chunk_size, initial_state=h0)
            assert rel_err(out, ref) < TOL and rel_err(state, ref_state) < TOL, f"{mod.__name__}.{form}"


def test_hgrn_is_gla_with_one_channel_heads(rng):
    """h_t = exp(g_t) h_{t-1} + x_t per channel is GLA with H = D heads, K = V = 1, q = k = 1, v = x."""
    B, T, D = 2, 45, 6
    x, g = rng.standard_normal((B, T, D)), -rng.uniform(0.01, 2, (B, T, D))
    h0 = rng.standard_normal((B, D))
    o, h = hgrn.recurrent(x, g, initial_state=h0)
    ones = np.ones((B, T, D, 1))
    o_gla, S = gla.recurrent(ones, ones, x[..., None], g[..., None], scale=1.0, initial_state=h0[..., None, None])
    assert rel_err(o, o_gla[..., 0]) < TOL and rel_err(h, S[..., 0, 0]) < TOL


def test_hgrn2_is_the_papers_update(rng):
    """S_t = Diag(f_t) S_{t-1} + (1 - f_t) i_t^T, o_t = scale S_t^T q_t, written out token by token."""
    q, v, g = hgrn2.example_inputs(2, 30, 2, 5, 3, seed=9)[0]
    f = np.exp(g)
    S = np.zeros((2, 2, 5, 3))
    expected = np.empty((2, 30, 2, 3))
    for t in range(30):
        S = f[:, t, :, :, None] * S + (1 - f[:, t])[..., :, None] * v[:, t, :, None, :]
        expected[:, t] = np.einsum("bhk,bhkv->bhv", q[:, t] * 5 ** -0.5, S)
    o, state = hgrn2.recurrent(q, v, g)
    assert rel_err(o, expected) < TOL and rel_err(state, S) < TOL


def test_continuation_and_step(rng):
    for mod, forms in ((hgrn, ("recurrent", "chunked", "scan")), (hgrn2, ("recurrent", "chunked", "parallel"))):
        args, _ = mod.example_inputs(2, 50, 2, 5, 3, seed=4)
        ref, ref_state = mod.recurrent(*args)
        t = 19
        for form in forms:
            o1, s1 = run(mod, form, tuple(a[:, :t] for a in args))
            o2, s2 = run(mod, form, tuple(a[:, t:] for a in args), initial_state=s1)
            assert rel_err(np.concatenate([o1, o2], axis=1), ref) < TOL and rel_err(s2, ref_state) < TOL, form
        state, outs = None, []
        for t in range(50):
            o_t, state = mod.step(*(a[:, t] for a in args), state=state)
            outs.append(o_t)
        assert rel_err(np.stack(outs, axis=1), ref) < TOL and rel_err(state, ref_state) < TOL


def test_float32_matches_float64():
    for mod, forms in ((hgrn, ("chunked", "scan")), (hgrn2, ("chunked", "parallel"))):
        args, _ = mod.example_inputs(1, 1024, 2, 16, 16, dtype=np.float32, seed=2)
        ref, _ = mod.recurrent(*(a.astype(np.float64) for a in args))
        for form in forms:
            out, state = run(mod, form, args, 64)
            assert out.dtype == np.float32 and state.dtype == np.float32
            assert rel_err(out, ref) < 1e-4, f"{mod.__name__}.{form}"


def test_strong_gates_stay_finite(rng):
    """Gates down to -1000 per token: exp(+cumsum) would overflow float64 in one chunk; the forms don't."""
    for mod, forms in ((hgrn, ("chunked", "scan")), (hgrn2, ("chunked", "parallel"))):
        args, _ = mod.example_inputs(1, 200, 2, 8, 4, seed=3)
        g = -rng.uniform(0, 1000, args[-1].shape) * (rng.uniform(size=args[-1].shape) < 0.3)
        args = (*args[:-1], g)
        ref, _ = mod.recurrent(*args)
        for form in forms:
            out, state = run(mod, form, args, 64)
            assert np.isfinite(out).all() and np.isfinite(state).all()
            assert rel_err(out, ref) < TOL, f"{mod.__name__}.{form}"


# --- bad input ------------------------------------------------------------------------------------


def test_hgrn_positive_gate():
    x, g = hgrn.example_inputs(2, 10, 1, 4, 3)[0]
    g[1, 3, 2] = 0.5
    with pytest.raises(ValueError, match=r"g: expected log-space decay g <= 0 .*got max 0\.5"):
        hgrn.chunked(x, g)


def test_hgrn_mismatched_channels():
    x, g = hgrn.example_inputs(2, 10, 1, 4, 3)[0]
    with pytest.raises(ValueError, match=re.escape("g: expected shape [B, T, D] = [2, 10, 4], got [2, 10, 3]")):
        hgrn.scan(x, g[..., :3])


def test_hgrn_wrong_rank():
    x, g = hgrn.example_inputs(2, 10, 1, 4, 3)[0]
    with pytest.raises(ValueError, match=re.escape("x: expected shape [B, T, D] (3 dims), got [2, 10, 1, 4]")):
        hgrn.recurrent(x[:, :, None], g)


def test_hgrn_state_shape():
    x, g = hgrn.example_inputs(2, 10, 1, 4, 3)[0]
    with pytest.raises(ValueError, match=re.escape("state: expected shape [B, D] = [2, 4], got [2, 3]")):
        hgrn.step(x[:, 0], g[:, 0], state=np.zeros((2, 3)))


def test_hgrn2_positive_gate():
    q, v, g = hgrn2.example_inputs(2, 10, 1, 4, 3)[0]
    g[0, 0, 0, 1] = 1e-3
    with pytest.raises(ValueError, match=r"g: expected log-space decay g <= 0 .*got max 0\.001"):
        hgrn2.parallel(q, v, g)


def test_hgrn2_mismatched_key_dim():
    q, v, g = hgrn2.example_inputs(2, 10, 1, 4, 3)[0]
    with pytest.raises(ValueError, match=re.escape("g: expected shape [B, T, H, K] = [2, 10, 1, 4], got [2, 10, 1, 3]")):
        hgrn2.chunked(q, v, g[..., :3])


def test_integer_dtype():
    x, g = hgrn.example_inputs(2, 10, 1, 4, 3)[0]
    with pytest.raises(TypeError, match=r"x: expected a floating-point array \(float32 or float64\), got int64"):
        hgrn.chunked(np.ones(x.shape, dtype=np.int64), g)


def test_nan():
    q, v, g = hgrn2.example_inputs(2, 10, 1, 4, 3)[0]
    v[1, 2, 0, 1] = np.nan
    with pytest.raises(ValueError, match=re.escape("v: expected finite values, got nan at index (1, 2, 0, 1)")):
        hgrn2.chunked(q, v, g)


@pytest.mark.parametrize("mod", [hgrn, hgrn2])
def test_chunk_size_not_positive(mod):
    args, _ = mod.example_inputs(2, 10, 1, 4, 3)
    with pytest.raises(ValueError, match=r"chunk_size: expected a positive integer, got 0"):
        mod.chunked(*args, chunk_size=0)
