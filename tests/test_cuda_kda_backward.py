"""Kimi Delta Attention's CUDA backward (csrc/kda_bwd/, `minilin.cuda.kda_backward`) against the float64 NumPy
backward (minilin.mixers.kda, whose gradients tests/test_gradients.py checks against finite differences).

On the CPU: the front's call into the extension (argument order, the per-channel dg's shape, dbeta, grouped heads,
packed sequences, normalize_qk's chain rule) through a stand-in extension that computes the NumPy backward from the
arrays at the addresses it is given, as the BackwardProblem contract says. On the GPU: kda_bwd v1 at awkward shapes
in float32 and bf16 and the chunked v2 wherever it takes the shape, gates down to -20, at FLA's test shapes and
tolerances, with outputs NaN-poisoned; skipped with the reason elsewhere.
"""
from __future__ import annotations

import numpy as np
import pytest

from minilin import cuda as mcuda
from minilin.cuda import bf16
from minilin.mixers import kda
from conftest import rel_err
from test_cuda_backward import as_host, device_inputs, host_extension, on_host_gpu  # noqa: F401 (a fixture)
from test_cuda_gla_backward import (FLA_KV, FLA_LENGTHS, FLA_TOLERANCE, TOLERANCE, assert_gradients,
                                    channel_contract, use_host_backward, use_two_rungs)

OK, REASON = mcuda.available()
gpu = pytest.mark.skipif(not OK, reason=REASON or "CUDA extension unavailable")
if OK:
    import cupy

NAMES = ("q", "k", "v", "g", "beta")


def inputs(B, T, H, K, V, seed, *, with_state=True, strong=False):
    """Random float64 inputs of KDA: keys of norm 0.9 (beta |k|^2 < 1), per-channel log-gates g [B, T, H, K] in
    [-1, -0.01] (with strong, a quarter of the channels in [-20, -5], some at -1e-8 and some at 0, the range
    CONVENTIONS.md asks forms to keep exact), beta in [0.1, 0.9], the initial state, do and dS."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T, H, K))
    k *= 0.9 / np.linalg.norm(k, axis=-1, keepdims=True)
    g = rng.uniform(-1.0, -0.01, (B, T, H, K))
    if strong:
        g[..., ::4] = rng.uniform(-20.0, -5.0, g[..., ::4].shape)
        g[..., 1::8] = -1e-8
        g[..., 3::16] = 0.0  # no decay at all, as FLA's KDA test sets some gates
    return dict(q=rng.standard_normal((B, T, H, K)), k=k, v=rng.standard_normal((B, T, H, V)), g=g,
                beta=rng.uniform(0.1, 0.9, (B, T, H)),
                S0=0.5 * rng.standard_normal((B, H, K, V)) if with_state else None,
                do=rng.standard_normal((B, T, H, V)),
                dS=rng.standard_normal((B, H, K, V)) if with_state else None)


def numpy_gradients(x, scale, form="recurrent", **kwargs):
    """KDA's float64 NumPy backward of x, by name."""
    return getattr(kda, f"{form}_backward")(*(x[n] for n in NAMES), do=x["do"], dstate=x["dS"], scale=scale,
                                            initial_state=x["S0"], **kwargs)._asdict()


def float32_values(x):
    return {n: None if a is None else a.astype(np.float32).astype(np.float64) for n, a in x.items()}


# ---- the front's call into the extension, on the CPU -------------------------------------------------------
@pytest.fixture
def kda_host(host_extension, monkeypatch):  # noqa: F811 (the imported fixture)
    use_host_backward(monkeypatch, "kda_bwd", channel_contract("kda_bwd", numpy_gradients, with_beta=True))


def test_the_default_kda_backward_is_v2_where_it_takes_the_shape(host_extension, monkeypatch):  # noqa: F811
    """version=None: kda_bwd v2 for bf16 at K = 64 / 128 and V a multiple of 64; v1 for
    float32 and for the shapes v2's rule leaves out (K = 32, K = 256, V = 40); version=1 runs v1."""
    chosen = use_two_rungs(monkeypatch, "kda_bwd", "chunked_wy_mma", 90)
    shapes = [(64, 64), (128, 128), (64, 192), (32, 64), (256, 64), (128, 40)]
    assert [chosen(None, True, K, V) for K, V in shapes] == [2, 2, 2, 1, 1, 1]
    assert chosen(None, False, 64, 64) == 1 and chosen(1, True, 64, 64) == 1


def host_call(x, **kwargs):
    return mcuda.kda_backward(*(on_host_gpu(x[n]) for n in NAMES), do=on_host_gpu(x["do"]),
                              dstate=on_host_gpu(x["dS"]), initial_state=on_host_gpu(x["S0"]), **kwargs)


def assert_host_gradients(grads, want):
    for name in grads._fields:
        got = getattr(grads, name)
        if want[name] is None:
            assert got is None, name
            continue
        assert got.dtype == np.float32 and got.shape == want[name].shape, name
        assert rel_err(np.asarray(got, np.float64), want[name]) < 1e-5, name


@pytest.mark.parametrize("with_state", [True, False])
def test_the_front_returns_kdas_gradients_by_name(kda_host, with_state):
    x = float32_values(inputs(2, 7, 3, 8, 4, seed=31, with_state=with_state))
    want = numpy_gradients(x, 8 ** -0.5)
    grads = host_call(x)
    assert type(grads).__name__ == "KdaGradients" and grads._fields == tuple(want)
    assert_host_gradients(grads, want)


def test_the_front_takes_grouped_heads_and_packed_sequences(kda_host):
    """HV = 2 H value heads and two packed sequences against KDA's NumPy chunked_backward given the same layout."""
    x = float32_values(inputs(1, 9, 4, 8, 4, seed=32, with_state=False))
    x["q"], x["k"] = (np.ascontiguousarray(x[n][:, :, ::2]) for n in ("q", "k"))  # H = 2 q/k heads for HV = 4
    rng = np.random.default_rng(33)
    x["S0"], x["dS"] = (rng.standard_normal((2, 4, 8, 4)).astype(np.float32).astype(np.float64) for _ in range(2))
    cu = np.array([0, 4, 9], np.int64)
    want = numpy_gradients(x, 8 ** -0.5, form="chunked", cu_seqlens=cu, chunk_size=4)
    assert_host_gradients(host_call(x, cu_seqlens=cu), want)


def test_normalize_qk_through_the_front(kda_host):
    """normalize_qk: the kernel's gradients of the normalized q and k carried back through the normalization,
    against the NumPy chunked_backward given normalize_qk (keys of any length: the normalization bounds them)."""
    x = float32_values(inputs(2, 7, 3, 8, 4, seed=34))
    x["k"] = x["k"] * np.random.default_rng(35).uniform(0.5, 3.0, x["k"].shape[:3] + (1,))  # not unit keys
    want = numpy_gradients(x, 8 ** -0.5, form="chunked", normalize_qk=True, chunk_size=4)
    assert_host_gradients(host_call(x, normalize_qk=True), want)


def test_bad_inputs_are_named(kda_host):
    x = float32_values(inputs(1, 5, 2, 8, 4, seed=36))
    q, k, v, g, beta, do = (on_host_gpu(x[n]) for n in (*NAMES, "do"))
    with pytest.raises(ValueError, match=r"^g: expected shape \[B, T, HV, K\]"):
        mcuda.kda_backward(q, k, v, g[..., 0], beta, do=do)
    with pytest.raises(TypeError, match=r"^g: expected a CuPy array"):
        mcuda.kda_backward(q, k, v, None, beta, do=do)
    with pytest.raises(ValueError, match=r"^g: .*<= 0"):
        mcuda.kda_backward(q, k, v, on_host_gpu(-x["g"]), beta, do=do)
    with pytest.raises(ValueError, match=r"^beta: .*\[0, 1\]"):
        mcuda.kda_backward(q, k, v, g, on_host_gpu(1.5 + x["beta"]), do=do)
    with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 1"):
        mcuda.kda_backward(q, on_host_gpu(3 * x["k"]), v, g, beta, do=do)
    with pytest.raises(ValueError, match=r"do: expected finite values"):
        mcuda.kda_backward(q, k, v, g, beta, do=on_host_gpu(np.full(x["do"].shape, np.nan)))


# ---- the kernel (GPU) --------------------------------------------------------------------------------------
# (B, T, H, K, V): several 64-token checkpoint chunks and a partial one, one token, V = 96 and 48 (partial 32-column
# value blocks), K = 40 (a partial 32-row lane group), K != V both ways, K = 256 (the largest).
SHAPES = [(2, 100, 3, 64, 64), (1, 1, 1, 128, 128), (1, 130, 2, 32, 96), (2, 70, 2, 40, 48), (1, 64, 1, 256, 64),
          (1, 300, 2, 128, 128)]


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("strong", [False, True], ids=["gates to -1", "gates to -20"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kernel_matches_the_float64_backward(dtype, shape, strong):
    # a state where B = 1 and at K = 40, whose rows past K must stay zero
    x = inputs(*shape, seed=sum(shape) + strong, with_state=shape[0] == 1 or shape[3] % 32 != 0, strong=strong)
    gx, host = device_inputs(x, dtype)
    grads = mcuda.kda_backward(*(gx[n] for n in NAMES), do=gx["do"], dstate=gx["dS"], initial_state=gx["S0"])
    assert_gradients(grads, numpy_gradients(host, shape[3] ** -0.5), gx, lambda name: TOLERANCE[dtype],
                     f"{dtype} {shape}")


# The shapes the chunked v2 takes (bf16, K = 64 or 128, V a multiple of 64): a partial last chunk, one token, one
# whole chunk, K != V both ways, and several chunks and value blocks; each with and without a state. Tolerances:
# FLA's (the backward's stated target), since v2 stores the chunk-boundary states in bf16 (at T = 1 dbeta is one
# number per head, R . (v - Kg S0), and read 1.6e-2 on an H100 against 0.02).
CHUNKED_SHAPES = [(2, 100, 3, 64, 64), (1, 1, 1, 128, 128), (1, 64, 2, 64, 128), (2, 200, 2, 128, 64),
                  (1, 300, 2, 128, 128)]


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("with_state", [True, False], ids=["state", "no state"])
@pytest.mark.parametrize("strong", [False, True], ids=["gates to -1", "gates to -20"])
@pytest.mark.parametrize("shape", CHUNKED_SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("version", [1, 2])
def test_each_bf16_version_matches_the_float64_backward(version, shape, strong, with_state):
    x = inputs(*shape, seed=sum(shape) + 2 * strong + with_state, with_state=with_state, strong=strong)
    gx, host = device_inputs(x, "bfloat16")
    grads = mcuda.kda_backward(*(gx[n] for n in NAMES), do=gx["do"], dstate=gx["dS"], initial_state=gx["S0"],
                               version=version)
    assert_gradients(grads, numpy_gradients(host, shape[3] ** -0.5), gx, lambda name: FLA_TOLERANCE.get(name, 0.02),
                     f"v{version} {shape}")


# FLA's chunk-backward test shapes (GLA's grid above) and the head dims of FLA's own KDA test (60, 64, 100, 128).
KDA_KV = FLA_KV + [(60, 60), (100, 100)]


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("with_state", [True, False], ids=["state", "no state"])
@pytest.mark.parametrize("K, V", KDA_KV, ids=lambda kv: f"{kv}")
@pytest.mark.parametrize("T", FLA_LENGTHS)
def test_the_backward_at_flas_test_shapes(T, K, V, with_state):
    """bf16 inputs against the float64 NumPy backward on the same bf16-rounded inputs, FLA's tolerances (relative
    RMS error: 0.008, dg and dbeta 0.02); outputs start NaN; at T = 500 a quarter of the channels gated down to
    -20, some at -1e-8 and some at exactly 0."""
    x = inputs(2, T, 2, K, V, seed=T + K + 3 * V, with_state=with_state, strong=T == 500)
    gx, host = device_inputs(x, "bfloat16")
    grads = mcuda.kda_backward(*(gx[n] for n in NAMES), do=gx["do"], dstate=gx["dS"], initial_state=gx["S0"])
    tolerance = lambda name: FLA_TOLERANCE.get(name, 0.02)  # noqa: E731 (dbeta: FLA's 0.02)
    assert_gradients(grads, numpy_gradients(host, K ** -0.5, form="chunked"), gx, tolerance, f"T={T} K={K} V={V}")


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("dtype, version", [("float32", 1), ("bfloat16", 1), ("bfloat16", 2)])
def test_the_kernel_takes_grouped_heads_and_packed_sequences(dtype, version):
    """HV = 2 H and three packed sequences (one shorter than a checkpoint chunk, one spanning two), each version."""
    x = inputs(1, 150, 4, 64, 64, seed=37, with_state=False)
    x["q"], x["k"] = (np.ascontiguousarray(x[n][:, :, ::2]) for n in ("q", "k"))
    rng = np.random.default_rng(38)
    x["S0"], x["dS"] = (rng.standard_normal((3, 4, 64, 64)) for _ in range(2))
    cu = np.array([0, 37, 100, 150], np.int64)
    gx, host = device_inputs(x, dtype)
    grads = mcuda.kda_backward(*(gx[n] for n in NAMES), do=gx["do"], dstate=gx["dS"], initial_state=gx["S0"],
                               cu_seqlens=cupy.asarray(cu), version=version)
    want = numpy_gradients(host, 64 ** -0.5, form="chunked", cu_seqlens=cu)
    for name in grads._fields:
        err = rel_err(as_host(getattr(grads, name)), want[name])
        assert err < TOLERANCE[dtype], f"{dtype} v{version} {name}: {err:.2e}"


@gpu
def test_the_kernel_with_normalize_qk():
    """Keys of any length, normalized inside (FLA's use_qk_l2norm_in_kernel), in bf16."""
    x = inputs(2, 90, 2, 64, 64, seed=39)
    x["k"] = x["k"] * np.random.default_rng(40).uniform(0.5, 3.0, x["k"].shape[:3] + (1,))
    gx, host = device_inputs(x, "bfloat16")
    grads = mcuda.kda_backward(*(gx[n] for n in NAMES), do=gx["do"], dstate=gx["dS"], initial_state=gx["S0"],
                               normalize_qk=True)
    want = numpy_gradients(host, 64 ** -0.5, normalize_qk=True)
    for name in grads._fields:
        err = rel_err(as_host(getattr(grads, name)), want[name])
        assert err < TOLERANCE["bfloat16"], f"{name}: {err:.2e}"


@gpu
@pytest.mark.parametrize("version", [1, 2])
def test_the_kernel_repeats_bit_for_bit(version):
    """Twice more on the same inputs: the same bits (its sums are taken in a fixed order; a race would show)."""
    x = inputs(2, 200, 4, 128, 128, seed=41)
    gx, _ = device_inputs(x, "bfloat16")
    run = lambda: mcuda.kda_backward(*(gx[n] for n in NAMES), do=gx["do"], dstate=gx["dS"],  # noqa: E731
                                     initial_state=gx["S0"], version=version)
    first = run()
    for _ in range(2):
        assert all(bool((a == b).all()) for a, b in zip(first, run()))


@gpu
@pytest.mark.parametrize("version", [1, 2])
def test_strong_gates_over_a_long_sequence_stay_finite(version):
    """T = 4096, every gate in [-20, 0): every gradient finite."""
    x = inputs(1, 4096, 2, 64, 64, seed=42)
    x["g"] = np.random.default_rng(43).uniform(-20.0, 0.0, x["g"].shape)
    gx, _ = device_inputs(x, "bfloat16")
    grads = mcuda.kda_backward(*(gx[n] for n in NAMES), do=gx["do"], dstate=gx["dS"], initial_state=gx["S0"],
                               version=version)
    for name in grads._fields:
        assert bool(cupy.isfinite(bf16.as_float32(getattr(grads, name))).all()), name


@gpu
def test_the_kernel_names_what_it_refuses():
    x = inputs(1, 8, 1, 64, 64, seed=44)
    gx, _ = device_inputs(x, "float32")
    with pytest.raises(ValueError, match=r"^version: expected one of \[1, 2\] for kda_bwd, got 3"):
        mcuda.kda_backward(*(gx[n] for n in NAMES), do=gx["do"], version=3)
    with pytest.raises(TypeError, match=r"^version: kda_bwd version 2 \(chunked_wy_mma\) takes bfloat16 inputs only"):
        mcuda.kda_backward(*(gx[n] for n in NAMES), do=gx["do"], version=2)
    assert [v["version"] for v in mcuda.versions("kda_bwd")] == [1, 2]
