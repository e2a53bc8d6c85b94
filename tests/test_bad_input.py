"""Bad input raises ValueError / TypeError before any work, naming the argument, expected and given.
One test per case (CONVENTIONS.md, "Errors")."""
from __future__ import annotations

import re

import numpy as np
import pytest

from minilin import catalog
from minilin.mixers import attention, deltanet, gated_deltanet, gla, kda, linear_attention, mamba2, retnet

B, T, H, K, V = 2, 10, 3, 4, 5


@pytest.fixture
def inputs():
    """Valid Gated DeltaNet inputs; each test breaks exactly one thing."""
    args, _ = gated_deltanet.example_inputs(B, T, H, K, V, seed=0)
    return dict(zip(["q", "k", "v", "g", "beta"], args))


def call(mod, inputs, **options):
    return mod.chunked(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], **options)


def test_wrong_rank(inputs):
    inputs["k"] = inputs["k"][:, :, 0]
    with pytest.raises(ValueError, match=re.escape("k: expected shape [B, T, H, K] = [2, 10, 3, 4], got [2, 10, 4]")):
        call(gated_deltanet, inputs)


def test_wrong_rank_of_the_first_input(inputs):
    """Nothing is bound yet when q is read: the message gives the dims and their count, not the letters twice."""
    inputs["q"] = inputs["q"][0]
    with pytest.raises(ValueError, match=re.escape("q: expected shape [B, T, H, K] (4 dims), got [10, 3, 4]")):
        call(gated_deltanet, inputs)


def test_a_missing_array_is_named(inputs):
    inputs["g"] = None
    with pytest.raises(TypeError, match=re.escape("g: expected an array of shape [B, T, HV], got None")):
        call(gated_deltanet, inputs)


def test_mismatched_batch(inputs):
    inputs["v"] = inputs["v"][:1]
    with pytest.raises(ValueError, match=re.escape("v: expected shape [B, T, HV, V] = [2, 10, HV, V], got [1, 10, 3, 5]")):
        call(gated_deltanet, inputs)


def test_mismatched_length(inputs):
    inputs["g"] = inputs["g"][:, :9]
    with pytest.raises(ValueError, match=re.escape("g: expected shape [B, T, HV] = [2, 10, 3], got [2, 9, 3]")):
        call(gated_deltanet, inputs)


def test_mismatched_heads(inputs):
    inputs["beta"] = inputs["beta"][:, :, :2]
    with pytest.raises(ValueError, match=re.escape("beta: expected shape [B, T, HV] = [2, 10, 3], got [2, 10, 2]")):
        call(gated_deltanet, inputs)


def test_mismatched_key_dim(inputs):
    inputs["q"] = inputs["q"][..., :3]
    with pytest.raises(ValueError, match=re.escape("k: expected shape [B, T, H, K] = [2, 10, 3, 3], got [2, 10, 3, 4]")):
        call(gated_deltanet, inputs)


def test_positive_gate(inputs):
    inputs["g"] = inputs["g"].copy()
    inputs["g"][1, 4, 2] = 0.25
    with pytest.raises(ValueError, match=r"g: expected log-space decay g <= 0 .*got max 0\.25"):
        call(gated_deltanet, inputs)


def test_positive_per_channel_gate():
    q, k, v, g = gla.example_inputs(B, T, H, K, V)[0]
    g[0, 0, 0, 0] = 1e-3
    with pytest.raises(ValueError, match=r"g: expected log-space decay g <= 0 .*got max 0\.001"):
        gla.recurrent(q, k, v, g)


def test_beta_above_one(inputs):
    inputs["beta"] = inputs["beta"] + 0.5
    with pytest.raises(ValueError, match=r"beta: expected values in \[0, 1\] \(allow_neg_eigval=False\), got max 1\.4"):
        call(gated_deltanet, inputs)


def test_beta_negative(inputs):
    inputs["beta"] = inputs["beta"] - 1.0
    with pytest.raises(ValueError, match=r"beta: expected values in \[0, 1\] .*got min -"):
        call(gated_deltanet, inputs)


def test_beta_up_to_two_needs_allow_neg_eigval(inputs):
    inputs["beta"] = inputs["beta"] * 2
    call(gated_deltanet, inputs, allow_neg_eigval=True)  # fine: beta in [0, 2]
    inputs["beta"] = inputs["beta"] + 0.5
    with pytest.raises(ValueError, match=r"beta: expected values in \[0, 2\] \(allow_neg_eigval=True\)"):
        call(gated_deltanet, inputs, allow_neg_eigval=True)


def test_kda_beta_above_one():
    q, k, v, g, beta = kda.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(ValueError, match=r"beta: expected values in \[0, 1\]"):
        kda.chunked(q, k, v, g, beta + 1.0)


def test_integer_dtype(inputs):
    inputs["v"] = np.ones((B, T, H, V), dtype=np.int64)
    with pytest.raises(TypeError, match=r"v: expected a floating-point array \(float32 or float64\), got int64"):
        call(gated_deltanet, inputs)


def test_not_an_array(inputs):
    inputs["q"] = inputs["q"].tolist()
    with pytest.raises(TypeError, match=r"q: expected a NumPy or CuPy array, got list"):
        call(gated_deltanet, inputs)


def test_nan_in_input(inputs):
    inputs["k"] = inputs["k"].copy()
    inputs["k"][1, 3, 0, 2] = np.nan
    with pytest.raises(ValueError, match=re.escape("k: expected finite values, got nan at index (1, 3, 0, 2)")):
        call(gated_deltanet, inputs)


def test_inf_in_gate(inputs):
    inputs["g"] = inputs["g"].copy()
    inputs["g"][0, 0, 0] = -np.inf
    with pytest.raises(ValueError, match=r"g: expected finite values, got -inf at index \(0, 0, 0\)"):
        call(gated_deltanet, inputs)


@pytest.mark.parametrize("chunk_size", [0, -16])
def test_chunk_size_not_positive(inputs, chunk_size):
    with pytest.raises(ValueError, match=rf"chunk_size: expected a positive integer, got {chunk_size}"):
        call(gated_deltanet, inputs, chunk_size=chunk_size)


def test_chunk_size_not_an_integer(inputs):
    with pytest.raises(TypeError, match=r"chunk_size: expected a positive integer, got 16\.0"):
        call(gated_deltanet, inputs, chunk_size=16.0)


@pytest.mark.parametrize("name", [n for n in catalog.names() if hasattr(catalog.module(n), "chunked_backward")])
def test_chunked_backward_names_a_missing_chunk_size(name):
    """chunk_size=None is bad input to every chunked backward, as to the chunked forward (not an error from
    inside the engine)."""
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(B=1, T=6, H=2, K=4, V=4, seed=0)
    do = np.random.default_rng(1).standard_normal(np.shape(mod.chunked(*args, **kwargs)[0]))
    with pytest.raises(TypeError, match=r"chunk_size: expected a positive integer, got None"):
        mod.chunked_backward(*args, do=do, chunk_size=None, **kwargs)


def test_empty_sequence():
    q, k, v = retnet.example_inputs(B, 1, H, K, V)[0]
    with pytest.raises(ValueError, match=r"q: expected at least one token \(T >= 1\), got T = 0"):
        retnet.recurrent(q[:, :0], k[:, :0], v[:, :0])


def test_initial_state_shape(inputs):
    with pytest.raises(ValueError, match=re.escape("initial_state: expected shape [B, HV, K, V] = [2, 3, 4, 5], got [2, 3, 5, 4]")):
        call(gated_deltanet, inputs, initial_state=np.zeros((B, H, V, K)))


def test_step_state_shape():
    q, k, v, beta = (a[:, 0] for a in deltanet.example_inputs(B, T, H, K, V)[0])
    with pytest.raises(ValueError, match=re.escape("state: expected shape [B, HV, K, V] = [2, 3, 4, 5], got [2, 3, 4]")):
        deltanet.step(q, k, v, beta, state=np.zeros((B, H, K)))


def test_normalized_state_carries_one_more_column():
    q, k, v = linear_attention.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(ValueError, match=re.escape("initial_state: expected shape [B, HV, K, V+1] = [2, 3, 4, 6], got [2, 3, 4, 5]")):
        linear_attention.chunked(q, k, v, feature_map="elu+1", normalize=True, initial_state=np.zeros((B, H, K, V)))


def test_unknown_feature_map():
    q, k, v = linear_attention.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(ValueError, match=r"feature_map: expected None, a callable, or one of .*got 'softmax'"):
        linear_attention.recurrent(q, k, v, feature_map="softmax")


def test_scale_not_a_number(inputs):
    with pytest.raises(TypeError, match=r"scale: expected a finite real number or None, got 'big'"):
        call(gated_deltanet, inputs, scale="big")


def test_flag_not_a_bool(inputs):
    with pytest.raises(TypeError, match=r"allow_neg_eigval: expected True or False, got 'yes'"):
        call(gated_deltanet, inputs, allow_neg_eigval="yes")


def test_retnet_gamma_out_of_range():
    q, k, v = retnet.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(ValueError, match=r"gamma: expected decays gamma in \(0, 1\], got max 1\.5"):
        retnet.chunked(q, k, v, gamma=np.array([0.9, 0.95, 1.5]))


def test_retnet_gamma_wrong_length():
    q, k, v = retnet.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(ValueError, match=re.escape("gamma: expected shape [H] = [3], got [2]")):
        retnet.chunked(q, k, v, gamma=np.array([0.9, 0.95]))


def test_mamba2_positive_A():
    x, dt, A, B_in, C_out, D = mamba2.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(ValueError, match=r"A: expected A <= 0 .*got max 0\.5"):
        mamba2.chunked(x, dt, np.full_like(A, 0.5), B_in, C_out, D)


def test_mamba2_negative_dt():
    x, dt, A, B_in, C_out, D = mamba2.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(ValueError, match=r"dt: expected step sizes dt >= 0, got min -"):
        mamba2.recurrent(x, -dt, A, B_in, C_out, D)


def test_attention_cache_must_be_a_pair():
    q, k, v = attention.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(TypeError, match=r"initial_state: expected a KVCache\(k, v\) or None, got ndarray"):
        attention.chunked(q, k, v, initial_state=np.zeros((B, 3, H, K)))


def test_attention_cache_shape():
    q, k, v = attention.example_inputs(B, T, H, K, V)[0]
    cache = attention.KVCache(np.zeros((B, 3, H, K)), np.zeros((B, 4, H, V)))
    with pytest.raises(ValueError, match=re.escape("initial_state.v: expected shape [B, P, H, V] = [2, 3, 3, 5], got [2, 4, 3, 5]")):
        attention.parallel(q, k, v, initial_state=cache)


def test_float32_and_float64_mix_computes_in_float64(inputs):
    inputs["q"] = inputs["q"].astype(np.float32)
    o, S = call(gated_deltanet, inputs)
    assert o.dtype == np.float64 and S.dtype == np.float64


# --- edge cases: refused by name (or, a chunk longer than T, clamped), never garbage or an unrelated error ---


def test_delta_rule_refuses_keys_that_make_it_unstable():
    """beta |k|^2 > 1 makes the transition I - beta k k^T expansive: unchecked, |k| = 3 gives outputs near 1e102."""
    q, k, v, beta = deltanet.example_inputs(B, 64, H, K, V)[0]
    with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 1 .*normalize_qk=True"):
        deltanet.chunked(q, 3 * k, v, beta)
    with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 2 \(allow_neg_eigval=True"):
        gated_deltanet.recurrent(q, 3 * k, v, np.full(beta.shape, -0.1), 2 * beta, allow_neg_eigval=True)
    with pytest.raises(ValueError, match=r"k, beta"):
        kda.step(q[:, 0], 10 * k[:, 0], v[:, 0], -np.ones(q[:, 0].shape), beta[:, 0])


@pytest.mark.parametrize("mod", [deltanet, gated_deltanet, kda])
def test_normalize_qk_equals_normalizing_first(mod):
    args, _ = mod.example_inputs(B, 37, H, K, V, seed=3)
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal(args[0].shape) * 3 for _ in range(2))
    unit = lambda x: x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)  # noqa: E731
    for form in ("recurrent", "chunked"):
        o, S = getattr(mod, form)(q, k, *args[2:], normalize_qk=True)
        o_ref, S_ref = getattr(mod, form)(unit(q), unit(k), *args[2:])
        np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(S, S_ref, rtol=1e-12, atol=1e-12)


def test_normalized_linear_attention_is_defined_where_the_normalizer_is_zero():
    """relu features can all be zero (and scale = 0 zeroes every weight): the output is 0 there, not NaN."""
    q, k, v = linear_attention.example_inputs(B, T, H, K, V)[0]
    q = -np.abs(q)                      # relu(q) = 0 everywhere: every weight is 0
    for form in ("recurrent", "chunked", "parallel"):
        o, _ = getattr(linear_attention, form)(q, k, v, feature_map="relu", normalize=True)
        assert np.isfinite(o).all() and not o.any()
    o, _ = linear_attention.chunked(np.abs(q), k, v, feature_map="elu+1", normalize=True, scale=0.0)
    assert np.isfinite(o).all() and not o.any()


def test_normalized_linear_attention_needs_non_negative_features():
    q, k, v = linear_attention.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(ValueError, match=r"feature_map: expected a non-negative feature map with normalize=True"):
        linear_attention.chunked(q, k, v, normalize=True)           # the identity map
    with pytest.raises(ValueError, match=r"scale: expected scale >= 0 with normalize=True"):
        linear_attention.chunked(q, k, v, feature_map="elu+1", normalize=True, scale=-1.0)


def test_linear_attention_promotes_a_float64_state():
    q, k, v = (x.astype(np.float32) for x in linear_attention.example_inputs(B, T, H, K, V)[0])
    S0 = np.random.default_rng(1).standard_normal((B, H, K, V))
    o, S = linear_attention.chunked(q, k, v, initial_state=S0)
    assert o.dtype == np.float64 and S.dtype == np.float64
    o_ref, _ = linear_attention.chunked(*(x.astype(np.float64) for x in (q, k, v)), initial_state=S0)
    np.testing.assert_allclose(o, o_ref, rtol=1e-12)


@pytest.mark.parametrize("name", ["s4", "rwkv7", "gated_deltanet", "kda", "attention"])
def test_a_chunk_longer_than_the_sequence_is_clamped(name):
    """chunk_size > T runs as one chunk of T (unclamped, s4 at T = 10 with chunk_size = 2048 takes 2.3 s and
    1.1 GB), and gives the definition's output."""
    import tracemalloc

    from minilin import catalog

    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(1, 10, 2, 8, 8, seed=2)
    ref, _ = catalog.reference(name)(*args, **kwargs)
    tracemalloc.start()
    out, _ = mod.chunked(*args, **kwargs, chunk_size=2048)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_allclose(out, ref, rtol=1e-13, atol=1e-13)
    assert peak < 4 * 2**20, f"{name}.chunked(T=10, chunk_size=2048) allocated {peak / 2**20:.1f} MiB at its peak"


@pytest.mark.parametrize("dims, name", [((B, T, H, 0, V), "q"), ((B, T, H, K, 0), "v"), ((B, T, 0, K, V), "q")])
def test_empty_dimensions_are_named(dims, name):
    """K = 0 is named before the default scale K ** -0.5 would divide by zero."""
    b, t, h, kk, vv = dims
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((b, t, h, kk)), rng.standard_normal((b, t, h, kk)), rng.standard_normal((b, t, h, vv))
    with pytest.raises(ValueError, match=rf"{name}: expected [KVH] >= 1, got [KVH] = 0"):
        retnet.chunked(q, k, v)


@pytest.mark.parametrize("H_, V_", [(0, 4), (3, 0)])
def test_s4_with_no_channels_is_named(H_, V_):
    """s4 with V = 0 or H = 0 (no channels) is named before any reshape."""
    from minilin.mixers import s4

    args, _ = s4.example_inputs(1, 5, H_, 4, V_)
    with pytest.raises(ValueError, match=r"u: expected H >= 1, got H = 0"):
        s4.chunked(*args)


def test_nan_scale_is_a_value_error(inputs):
    with pytest.raises(ValueError, match=r"scale: expected a finite real number or None, got nan"):
        call(gated_deltanet, inputs, scale=float("nan"))
    with pytest.raises(TypeError, match=r"scale: expected a finite real number or None, got '2'"):
        call(gated_deltanet, inputs, scale="2")


def test_attention_recurrent_names_its_initial_state():
    q, k, v = attention.example_inputs(B, T, H, K, V)[0]
    bad = attention.KVCache(k[:, :3, :, :2], v[:, :3])
    with pytest.raises(ValueError, match=re.escape("initial_state.k: expected shape")):
        attention.recurrent(q, k, v, initial_state=bad)


def test_a_users_feature_map_must_keep_the_shape_and_give_finite_features():
    """phi's output is checked as an input would be: a map that drops tokens gave uninitialized rows (recurrent) or
    a shorter output (chunked), and NaN features came back as NaN outputs."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 4, 2, 3)), rng.standard_normal((1, 4, 2, 3)), rng.standard_normal((1, 4, 2, 2))
    for form in (linear_attention.recurrent, linear_attention.chunked, linear_attention.parallel):
        with pytest.raises(ValueError, match=re.escape("feature_map: expected phi(q) of shape [1, 4, 2, F] (F >= 1), "
                                                       "got [1, 1, 2, 3]")):
            form(q, k, v, feature_map=lambda x: x[:, :1])
        with pytest.raises(ValueError, match=re.escape("feature_map: expected finite features, got NaN or inf in "
                                                       "phi(q)")):
            form(q, k, v, feature_map=lambda x: np.where(x < 0, np.nan, x), normalize=True)


def test_a_normalized_state_needs_a_non_negative_normalizer():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((1, 4, 2, 3)), rng.standard_normal((1, 4, 2, 3)), rng.standard_normal((1, 4, 2, 2))
    S0 = rng.uniform(0, 1, (1, 2, 3, 3))
    S0[0, 1, 2, -1] = -0.5
    with pytest.raises(ValueError, match=r"initial_state: expected a normalizer column .* >= 0 with normalize=True"):
        linear_attention.chunked(q, k, v, feature_map="elu+1", normalize=True, initial_state=S0)


def test_range_checks_refuse_nan():
    from minilin.validation import check_max, check_min

    with pytest.raises(ValueError, match="got min nan"):
        check_min("x", np.array([1.0, np.nan]), 0.0, "x >= 0")
    with pytest.raises(ValueError, match="got max nan"):
        check_max("x", np.array([-1.0, np.nan]), 0.0, "x <= 0")


def test_mamba2_with_no_channels_is_named():
    """P = 0 may be an empty KV cache's length, never Mamba-2's channels per head (x [B, T, H, P])."""
    from minilin.mixers import mamba2

    args, _ = mamba2.example_inputs(1, 5, 2, 3, 4)
    with pytest.raises(ValueError, match=re.escape("x: expected P >= 1, got P = 0")):
        mamba2.chunked(args[0][..., :0], *args[1:])
