"""Bad input raises ValueError / TypeError before any work, naming the argument, expected and given.
One test per case (CONVENTIONS.md, "Errors")."""
from __future__ import annotations

import re

import numpy as np
import pytest

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


def test_mismatched_batch(inputs):
    inputs["v"] = inputs["v"][:1]
    with pytest.raises(ValueError, match=re.escape("v: expected shape [B, T, H, V] = [2, 10, 3, V], got [1, 10, 3, 5]")):
        call(gated_deltanet, inputs)


def test_mismatched_length(inputs):
    inputs["g"] = inputs["g"][:, :9]
    with pytest.raises(ValueError, match=re.escape("g: expected shape [B, T, H] = [2, 10, 3], got [2, 9, 3]")):
        call(gated_deltanet, inputs)


def test_mismatched_heads(inputs):
    inputs["beta"] = inputs["beta"][:, :, :2]
    with pytest.raises(ValueError, match=re.escape("beta: expected shape [B, T, H] = [2, 10, 3], got [2, 10, 2]")):
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


def test_empty_sequence():
    q, k, v = retnet.example_inputs(B, 1, H, K, V)[0]
    with pytest.raises(ValueError, match=r"q: expected at least one token \(T >= 1\), got T = 0"):
        retnet.recurrent(q[:, :0], k[:, :0], v[:, :0])


def test_initial_state_shape(inputs):
    with pytest.raises(ValueError, match=re.escape("initial_state: expected shape [B, H, K, V] = [2, 3, 4, 5], got [2, 3, 5, 4]")):
        call(gated_deltanet, inputs, initial_state=np.zeros((B, H, V, K)))


def test_step_state_shape():
    q, k, v, beta = (a[:, 0] for a in deltanet.example_inputs(B, T, H, K, V)[0])
    with pytest.raises(ValueError, match=re.escape("state: expected shape [B, H, K, V] = [2, 3, 4, 5], got [2, 3, 4]")):
        deltanet.step(q, k, v, beta, state=np.zeros((B, H, K)))


def test_normalized_state_carries_one_more_column():
    q, k, v = linear_attention.example_inputs(B, T, H, K, V)[0]
    with pytest.raises(ValueError, match=re.escape("initial_state: expected shape [B, H, K, V+1] = [2, 3, 4, 6], got [2, 3, 4, 5]")):
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
