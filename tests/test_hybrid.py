"""Hybrid stacks: prefill (chunked forms) and decode (step forms) agree in float64, for every mixer a
stack can hold; the cache accounting matches the arrays a stack really holds; bad input."""
from __future__ import annotations

import re

import numpy as np
import pytest

from minilin import cache
from minilin.hybrid import HybridStack, cache_nbytes, supported_mixers
from conftest import rel_err, state_err

TOL = 1e-10
B, T, D_MODEL = 2, 40, 32


@pytest.fixture
def x():
    return np.random.default_rng(0).standard_normal((B, T, D_MODEL))


def small_stack(mixer="gated_deltanet", pattern="LWLA", seed=1):
    return HybridStack.from_pattern(pattern, d_model=D_MODEL, heads=2, head_dim=8, mixer=mixer, window=7, seed=seed)


@pytest.mark.parametrize("mixer", supported_mixers())
def test_prefill_then_decode_equals_prefill_of_the_whole(mixer, x):
    """Prefill [0, t), decode t .. T-1 token by token: same outputs and same cache as prefilling [0, T)."""
    stack = small_stack(mixer)
    full, full_cache = stack.prefill(x, chunk_size=16)
    assert np.isfinite(full).all()
    t = 13
    head, state = stack.prefill(x[:, :t], chunk_size=16)
    outputs = []
    for i in range(t, T):
        y_i, state = stack.decode(x[:, i], state)
        outputs.append(y_i)
    assert rel_err(np.concatenate([head, np.stack(outputs, axis=1)], axis=1), full) < TOL
    assert state_err(state, full_cache) < TOL


@pytest.mark.parametrize("mixer", supported_mixers())
def test_prefill_continues_from_its_cache(mixer, x):
    stack = small_stack(mixer)
    full, full_cache = stack.prefill(x)
    head, state = stack.prefill(x[:, :17], chunk_size=5)
    tail, state = stack.prefill(x[:, 17:], state, chunk_size=5)
    assert rel_err(np.concatenate([head, tail], axis=1), full) < TOL
    assert state_err(state, full_cache) < TOL


def test_decode_from_an_empty_cache_equals_prefill(x):
    """The 1:7 pattern, decoded from nothing: every layer's step form from a None state."""
    stack = HybridStack.from_pattern("LLLLLLLA", d_model=D_MODEL, heads=4, mixer="kda", seed=2)
    full, _ = stack.prefill(x[:, :12], chunk_size=4)
    state, outputs = None, []
    for i in range(12):
        y_i, state = stack.decode(x[:, i], state)
        outputs.append(y_i)
    assert rel_err(np.stack(outputs, axis=1), full) < TOL


def test_every_layer_contributes(x):
    """Zeroing one layer's output projection changes the result: a passing comparison above is not the
    residual stream alone."""
    stack = small_stack()
    full, _ = stack.prefill(x)
    for layer in stack.layers:
        saved = layer.out
        layer.out = np.zeros_like(saved)
        changed, _ = stack.prefill(x)
        layer.out = saved
        assert rel_err(changed, full) > 1e-3, layer.mixer


def test_pattern_letters():
    stack = HybridStack.from_pattern("LLLWLLLA", d_model=16, heads=2, mixer="mamba2", window=4)
    assert stack.mixers == ["mamba2"] * 3 + ["sliding_window"] + ["mamba2"] * 3 + ["attention"]
    assert stack.layers[0].head_dim == 8  # d_model // heads


def test_same_seed_same_weights():
    a, b = small_stack(seed=5), small_stack(seed=5)
    assert all(np.array_equal(la.out, lb.out) for la, lb in zip(a.layers, b.layers))


@pytest.mark.parametrize("tokens", [3, 7, 30])
def test_accounting_matches_the_arrays_held(x, tokens):
    """minilin.cache's formulas (8 bytes per number, batch B) equal the bytes of the real cache, per layer,
    before the window is full, when it is just full, and after it wrapped."""
    stack = small_stack("rwkv6" if "rwkv6" in supported_mixers() else "gla", pattern="LWLLA")
    _, state = stack.prefill(x[:, :tokens])
    accounted = cache.stack_bytes(stack.cache_specs(), tokens, bytes_per_element=8, batch=B)
    assert cache_nbytes(state) == accounted["per_layer"]
    assert sum(cache_nbytes(state)) == accounted["total"]


# --- bad input: one test per case ------------------------------------------------------------------------

def test_unknown_pattern_letter():
    with pytest.raises(ValueError, match=r"pattern: expected a non-empty string of the letters \['A', 'L', 'W'\].*got 'LLX'"):
        HybridStack.from_pattern("LLX", d_model=16, heads=2)


def test_unknown_mixer():
    with pytest.raises(ValueError, match=r"mixer: expected one of \[.*'gated_deltanet'.*\].*got 'gdn'"):
        HybridStack.from_pattern("LA", d_model=16, heads=2, mixer="gdn")


def test_noncausal_mixer_refused():
    with pytest.raises(ValueError, match=r"mixer: expected one of .*causal.*got 'linformer'"):
        HybridStack.from_mixers(["linformer"], d_model=16, heads=2)


def test_window_missing_for_sliding_window_layer():
    with pytest.raises(TypeError, match=r"window: expected a positive integer, got None"):
        HybridStack.from_pattern("WA", d_model=16, heads=2)


def test_heads_zero():
    with pytest.raises(ValueError, match=r"heads: expected a positive integer, got 0"):
        HybridStack.from_pattern("LA", d_model=16, heads=0)


def test_hidden_size_mismatch(x):
    with pytest.raises(ValueError, match=re.escape("x: expected shape [B, T, D] = [B, T, 32], got [2, 40, 31]")):
        small_stack().prefill(x[..., :31])


def test_decode_wants_one_token(x):
    with pytest.raises(ValueError, match=re.escape("x_t: expected shape [B, D] = [B, 32], got [2, 1, 32]")):
        small_stack().decode(x[:, :1])


def test_cache_wrong_length(x):
    stack = small_stack()
    _, state = stack.prefill(x[:, :4])
    with pytest.raises(ValueError, match=r"cache: expected a list of 4 layer states \(or None\), got a list of 3"):
        stack.decode(x[:, 4], state[:3])


def test_chunk_size_zero(x):
    with pytest.raises(ValueError, match=r"chunk_size: expected a positive integer, got 0"):
        small_stack().prefill(x, chunk_size=0)


def test_hidden_not_an_array():
    with pytest.raises(TypeError, match=r"x: expected a NumPy or CuPy array, got list"):
        small_stack().prefill([[[0.0] * D_MODEL]])


def test_every_causal_mixer_can_join_a_stack():
    """Every causal mixer (one with a step form) can be a layer: its inputs come from its SIGNATURE."""
    from minilin import catalog

    causal = [name for name in catalog.names() if callable(getattr(catalog.module(name), "step", None))]
    assert sorted(supported_mixers()) == sorted(causal)


def test_to_keeps_the_stack_and_its_outputs(x):
    stack = small_stack("gated_deltanet")
    moved = stack.to(np, np.float32)
    assert all(layer.out.dtype == np.float32 for layer in moved.layers)
    y, _ = stack.prefill(x)
    y32, _ = moved.prefill(x.astype(np.float32))
    assert rel_err(y32, y) < 1e-5


@pytest.mark.parametrize("mixer", ["gated_deltanet", "simple_gla", "kda", "deltanet", "hgrn2"])
def test_decode_on_the_gpu_uses_the_decode_kernels(mixer, x):
    """With CuPy float32 arrays the linear layers decode through minilin.cuda's step kernels (softmax and
    window layers through the reference on CuPy); prefill then decode equals the float64 NumPy stack."""
    cupy = pytest.importorskip("cupy")
    from minilin import cuda

    ok, reason = cuda.available()
    if not ok:
        pytest.skip(reason)
    stack = small_stack(mixer)
    gpu = stack.to(cupy, np.float32)
    t = 25
    y_ref, cache_ref = stack.prefill(x[:, :t])
    y_gpu, cache_gpu = gpu.prefill(cupy.asarray(x[:, :t], dtype=cupy.float32))
    for i in range(t, T):
        y_ref_t, cache_ref = stack.decode(x[:, i], cache_ref)
        y_gpu_t, cache_gpu = gpu.decode(cupy.asarray(x[:, i], dtype=cupy.float32), cache_gpu)
        assert rel_err(cupy.asnumpy(y_gpu_t), y_ref_t) < 1e-3, f"token {i}"
    layer = next(l for l in gpu.layers if l.mixer == mixer)
    assert layer.step_form(cupy.zeros((2, D_MODEL), cupy.float32)) is not layer.module.step


def test_a_stack_refuses_an_integer_dtype_no_layers_and_no_tokens():
    """An integer dtype drew weights that were all zero; no mixers built a stack of the final norm alone; T = 0 was
    named as the first layer's q."""
    with pytest.raises(TypeError, match="dtype: expected float32 or float64, got int64"):
        HybridStack.from_pattern("L", d_model=16, heads=2, dtype=np.int64)
    for mixers in ([], "attention"):
        with pytest.raises(ValueError, match="mixers: expected a non-empty list of mixer names"):
            HybridStack.from_mixers(mixers, d_model=16, heads=2)
    stack = HybridStack.from_pattern("LA", d_model=16, heads=2)
    with pytest.raises(ValueError, match=r"^x: expected at least one token \(T >= 1\), got T = 0"):
        stack.prefill(np.zeros((2, 0, 16)))
