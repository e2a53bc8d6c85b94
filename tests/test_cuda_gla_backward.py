"""GLA's and HGRN2's CUDA backward (csrc/gla_bwd/, `minilin.cuda.gla_backward`, `hgrn2_backward`) against the
float64 NumPy backward (minilin.mixers.gla, whose gradients tests/test_gradients.py checks against finite
differences).

On the CPU: the front's call into the extension (argument order, the per-channel dg's shape, HGRN2's chain rule
through its tied key, grouped heads and packed sequences) through a stand-in extension that computes the NumPy
backward from the arrays at the addresses it is given, as the BackwardProblem contract says. On the GPU: the
kernel at awkward shapes in float32 and bf16, gates down to -20, with outputs NaN-poisoned; skipped with the reason
elsewhere.
"""
from __future__ import annotations

import numpy as np
import pytest

from minilin import cuda as mcuda
from minilin.cuda import backward as mbackward
from minilin.cuda import bf16
from minilin.cuda import front
from minilin.cuda.mixers import hgrn2_key
from minilin.mixers import gla, hgrn2
from conftest import TENSOR_CORE_SHAPE, TOKEN_LOOP_SHAPE, rel_err
from test_cuda_backward import (as_host, at, device_inputs, expected_dtype, host_extension,  # noqa: F401 (a fixture)
                                 on_host_gpu)

OK, REASON = mcuda.available()
gpu = pytest.mark.skipif(not OK, reason=REASON or "CUDA extension unavailable")
if OK:
    import cupy


def inputs(B, T, H, K, V, seed, *, with_state=True, strong=False):
    """Random float64 inputs of GLA: q, k, v, per-channel log-gates g [B, T, H, K] in [-1, -0.01] (with strong, a
    quarter of the channels in [-20, -5] and some at -1e-8, the range CONVENTIONS.md asks forms to keep exact),
    the initial state, do and dS."""
    rng = np.random.default_rng(seed)
    g = rng.uniform(-1.0, -0.01, (B, T, H, K))
    if strong:
        g[..., ::4] = rng.uniform(-20.0, -5.0, g[..., ::4].shape)
        g[..., 1::8] = -1e-8
    return dict(q=rng.standard_normal((B, T, H, K)), k=rng.standard_normal((B, T, H, K)),
                v=rng.standard_normal((B, T, H, V)), g=g,
                S0=0.5 * rng.standard_normal((B, H, K, V)) if with_state else None,
                do=rng.standard_normal((B, T, H, V)),
                dS=rng.standard_normal((B, H, K, V)) if with_state else None)


def numpy_gradients(x, scale, form="recurrent", **kwargs):
    """GLA's float64 NumPy backward of x, by name."""
    return getattr(gla, f"{form}_backward")(x["q"], x["k"], x["v"], x["g"], do=x["do"], dstate=x["dS"], scale=scale,
                                            initial_state=x["S0"], **kwargs)._asdict()


# ---- the front's call into the extension, on the CPU -------------------------------------------------------
def channel_contract(op: str, gradients, with_beta: bool):
    """A stand-in for minilin._cuda.backward of a per-channel op (g [B, T, H, K]: gla_bwd, kda_bwd) on host
    memory: the NumPy backward `gradients(x, scale)` (by name) written through the addresses, as the
    BackwardProblem contract says; dbeta where the op has a beta."""
    def backward(called_op, version, q, k, v, g, beta, h0, do, dht, dq, dk, dv, dg, dbeta, dh0, workspace,
                 workspace_size, B, T, H, K, V, scale, dtype, stream):
        assert called_op == op and dtype == 0 and workspace_size == 0 and g and dg
        assert bool(beta) == bool(dbeta) == with_beta
        read = lambda address, shape: None if not address else at(address, shape).astype(np.float64)  # noqa: E731
        x = dict(q=read(q, (B, T, H, K)), k=read(k, (B, T, H, K)), v=read(v, (B, T, H, V)),
                 g=read(g, (B, T, H, K)), beta=read(beta, (B, T, H)), S0=read(h0, (B, H, K, V)),
                 do=read(do, (B, T, H, V)), dS=read(dht, (B, H, K, V)))
        grads = gradients(x, scale)
        for address, name, shape in ((dq, "dq", (B, T, H, K)), (dk, "dk", (B, T, H, K)), (dv, "dv", (B, T, H, V)),
                                     (dg, "dg", (B, T, H, K)), (dbeta, "dbeta", (B, T, H)),
                                     (dh0, "dinitial_state", (B, H, K, V))):
            if address:
                at(address, shape)[...] = grads[name]

    return backward


def use_host_backward(monkeypatch, op: str, backward):
    """The front sees one built version of `op`, v1 (the token loop's shape rule), run by `backward`."""
    ladder = ({"op": op, "version": 1, "name": "recurrent", "float32": True, "bfloat16": True,
               "min_compute_capability": 80, "max_compute_capability": 0, **TOKEN_LOOP_SHAPE},)
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    monkeypatch.setattr(mbackward, "extension", lambda: __import__("types").SimpleNamespace(
        backward=backward, workspace_bytes=lambda *args: 0))


@pytest.fixture
def gla_host(host_extension, monkeypatch):  # noqa: F811 (the imported fixture)
    use_host_backward(monkeypatch, "gla_bwd", channel_contract("gla_bwd", numpy_gradients, with_beta=False))


def use_two_rungs(monkeypatch, op: str, chunked_name: str, chunked_min_capability: int):
    """The front sees `op`'s v1 (the token loops' shape rule, float32 and bf16) and a chunked bf16 v2 (the
    tensor-core rule); returns chosen(version, is_bf16, K, V), the version number the front picks."""
    v1 = {"op": op, "version": 1, "name": "recurrent", "float32": True, "bfloat16": True,
          "min_compute_capability": 80, "max_compute_capability": 0, **TOKEN_LOOP_SHAPE}
    v2 = {"op": op, "version": 2, "name": chunked_name, "float32": False, "bfloat16": True,
          "min_compute_capability": chunked_min_capability, "max_compute_capability": 0, **TENSOR_CORE_SHAPE}
    monkeypatch.setattr(front, "_built_versions", lambda: (v1, v2))
    return lambda version, bf, K, V: front.runnable_version(op, version, bf, K, V)["version"]


def test_the_default_gla_backward_is_v2_where_it_takes_the_shape(host_extension, monkeypatch):
    """version=None: gla_bwd v2 for bf16 at K = 64 / 128 and V a multiple of 64; v1 for float32 and for the
    shapes v2's rule leaves out (K = 32, V = 40); version=1 runs v1 by number."""
    chosen = use_two_rungs(monkeypatch, "gla_bwd", "chunked_mma", 80)
    shapes = [(64, 64), (128, 128), (64, 192), (32, 64), (128, 40)]
    assert [chosen(None, True, K, V) for K, V in shapes] == [2, 2, 2, 1, 1]
    assert chosen(None, False, 64, 64) == 1 and chosen(1, True, 64, 64) == 1


def float32_values(x):
    return {n: None if a is None else a.astype(np.float32).astype(np.float64) for n, a in x.items()}


@pytest.mark.parametrize("with_state", [True, False])
def test_the_front_returns_glas_gradients_by_name(gla_host, with_state):
    x = float32_values(inputs(2, 7, 3, 8, 4, seed=11, with_state=with_state))
    want = numpy_gradients(x, 8 ** -0.5)
    grads = mcuda.gla_backward(*(on_host_gpu(x[n]) for n in ("q", "k", "v", "g")), do=on_host_gpu(x["do"]),
                               dstate=on_host_gpu(x["dS"]), initial_state=on_host_gpu(x["S0"]))
    assert type(grads).__name__ == "GlaGradients" and grads._fields == tuple(want)
    for name in grads._fields:
        got = getattr(grads, name)
        if want[name] is None:
            assert got is None, name
            continue
        assert got.dtype == np.float32 and got.shape == want[name].shape, name
        assert rel_err(np.asarray(got, np.float64), want[name]) < 1e-5, name


def test_the_front_takes_grouped_heads_and_packed_sequences(gla_host):
    """HV = 2 H value heads and two packed sequences against GLA's NumPy chunked_backward given the same layout."""
    x = float32_values(inputs(1, 9, 4, 8, 4, seed=12, with_state=False))
    x["q"], x["k"] = (np.ascontiguousarray(x[n][:, :, ::2]) for n in ("q", "k"))  # H = 2 q/k heads for HV = 4
    rng = np.random.default_rng(13)
    x["S0"], x["dS"] = (rng.standard_normal((2, 4, 8, 4)).astype(np.float32).astype(np.float64) for _ in range(2))
    cu = np.array([0, 4, 9], np.int64)
    want = numpy_gradients(x, 8 ** -0.5, form="chunked", cu_seqlens=cu, chunk_size=4)
    grads = mcuda.gla_backward(*(on_host_gpu(x[n]) for n in ("q", "k", "v", "g")), do=on_host_gpu(x["do"]),
                               dstate=on_host_gpu(x["dS"]), initial_state=on_host_gpu(x["S0"]), cu_seqlens=cu)
    for name in grads._fields:
        assert getattr(grads, name).shape == want[name].shape, name
        assert rel_err(np.asarray(getattr(grads, name), np.float64), want[name]) < 1e-5, name


def test_hgrn2s_gradients_carry_the_tied_key_into_dg(gla_host):
    """HGRN2 runs GLA with k = 1 - exp(g): its dg is GLA's plus the key's chain rule, as minilin.mixers.hgrn2's."""
    x = float32_values(inputs(2, 6, 2, 8, 4, seed=14))
    want = hgrn2.recurrent_backward(x["q"], x["v"], x["g"], do=x["do"], dstate=x["dS"],
                                    initial_state=x["S0"])._asdict()
    grads = mcuda.hgrn2_backward(*(on_host_gpu(x[n]) for n in ("q", "v", "g")), do=on_host_gpu(x["do"]),
                                 dstate=on_host_gpu(x["dS"]), initial_state=on_host_gpu(x["S0"]))
    assert type(grads).__name__ == "Hgrn2Gradients" and grads._fields == tuple(want)
    for name in grads._fields:
        assert rel_err(np.asarray(getattr(grads, name), np.float64), want[name]) < 1e-5, name


def test_a_scalar_gate_is_named_as_g(gla_host):
    x = float32_values(inputs(1, 5, 2, 8, 4, seed=15))
    q, k, v, do = (on_host_gpu(x[n]) for n in ("q", "k", "v", "do"))
    with pytest.raises(ValueError, match=r"^g: "):
        mcuda.gla_backward(q, k, v, on_host_gpu(x["g"][..., 0]), do=do)
    with pytest.raises(TypeError, match=r"^g: expected a CuPy array"):
        mcuda.gla_backward(q, k, v, None, do=do)
    with pytest.raises(ValueError, match=r"^g: .*<= 0"):
        mcuda.gla_backward(q, k, v, on_host_gpu(-x["g"]), do=do)


# ---- the kernel (GPU) --------------------------------------------------------------------------------------
# (B, T, H, K, V): one token, T past several 32-token gate tiles, V = 48 (a partial 32-column value block), K = 40
# (a partial 32-channel group), K != V both ways, K = 256 (the largest).
SHAPES = [(2, 100, 3, 64, 64), (1, 1, 1, 128, 128), (1, 130, 2, 32, 96), (2, 70, 2, 40, 48), (1, 64, 1, 256, 64),
          (1, 300, 2, 128, 128)]
TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2}


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("strong", [False, True], ids=["gates to -1", "gates to -20"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kernel_matches_the_float64_backward(dtype, shape, strong):
    x = inputs(*shape, seed=sum(shape) + strong, with_state=shape[0] == 1, strong=strong)  # K = 256 with a state
    gx, host = device_inputs(x, dtype)
    grads = mcuda.gla_backward(gx["q"], gx["k"], gx["v"], gx["g"], do=gx["do"], dstate=gx["dS"],
                               initial_state=gx["S0"])
    assert_gradients(grads, numpy_gradients(host, shape[3] ** -0.5), gx, lambda name: TOLERANCE[dtype],
                     f"{dtype} {shape}")


def assert_gradients(grads, want, gx, tolerance, label):
    """Each kernel gradient against the float64 one: None where it is, else the same shape, its input's dtype
    (`expected_dtype`) and a relative error under tolerance(name)."""
    for name in grads._fields:
        got = getattr(grads, name)
        if want[name] is None:
            assert got is None, name
            continue
        assert got.shape == want[name].shape, name
        assert got.dtype == expected_dtype(name, gx), name
        err = rel_err(as_host(got), want[name])
        assert err < tolerance(name), f"{label} {name}: {err:.2e}"


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("dtype, version", [("float32", 1), ("bfloat16", 1), ("bfloat16", 2)])
def test_the_kernel_takes_grouped_heads_and_packed_sequences(dtype, version):
    """HV = 2 H and three packed sequences (one shorter than a chunk, one spanning two) through each version."""
    x = inputs(1, 150, 4, 64, 64, seed=21, with_state=False)
    x["q"], x["k"] = (np.ascontiguousarray(x[n][:, :, ::2]) for n in ("q", "k"))
    rng = np.random.default_rng(22)
    x["S0"], x["dS"] = (rng.standard_normal((3, 4, 64, 64)) for _ in range(2))
    cu = np.array([0, 37, 100, 150], np.int64)
    gx, host = device_inputs(x, dtype)
    grads = mcuda.gla_backward(gx["q"], gx["k"], gx["v"], gx["g"], do=gx["do"], dstate=gx["dS"],
                               initial_state=gx["S0"], cu_seqlens=cupy.asarray(cu), version=version)
    want = numpy_gradients(host, 64 ** -0.5, form="chunked", cu_seqlens=cu)
    for name in grads._fields:
        tolerance = 1e-4 if dtype == "float32" else FLA_TOLERANCE[name]
        assert rel_err(as_host(getattr(grads, name)), want[name]) < tolerance, f"{dtype} v{version} {name}"


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hgrn2_on_the_kernel(dtype):
    x = inputs(2, 90, 2, 64, 64, seed=23)
    x["g"] = np.log(np.random.default_rng(24).uniform(0.05, 0.99, x["g"].shape))  # forget gates in (0, 1)
    gx, host = device_inputs(x, dtype)
    grads = mcuda.hgrn2_backward(gx["q"], gx["v"], gx["g"], do=gx["do"], dstate=gx["dS"], initial_state=gx["S0"])
    # against GLA's float64 backward at the key the kernel read (1 - exp(g) in q's dtype), then HGRN2's chain rule
    key = as_host(hgrn2_key(gx["q"], gx["g"], "B T H")).astype(np.float64)
    want = numpy_gradients(dict(host, k=key), 64 ** -0.5)
    want["dg"] = want["dg"] - np.exp(host["g"]) * want["dk"]
    for name in grads._fields:
        err = rel_err(as_host(getattr(grads, name)), want[name])
        assert err < TOLERANCE[dtype], f"{dtype} {name}: {err:.2e}"


# FLA's test shapes for its chunk backward and its tolerances (relative RMS error), for the tensor-core version.
FLA_LENGTHS = (63, 500, 1000, 2048)
FLA_KV = [(64, 64), (128, 128), (64, 128), (128, 64)]
FLA_TOLERANCE = {"dq": 0.008, "dk": 0.008, "dv": 0.008, "dinitial_state": 0.008, "dg": 0.02}


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("with_state", [True, False], ids=["state", "no state"])
@pytest.mark.parametrize("K, V", FLA_KV, ids=lambda kv: f"{kv}")
@pytest.mark.parametrize("T", FLA_LENGTHS)
def test_the_chunked_backward_at_flas_test_shapes(T, K, V, with_state):
    """gla_bwd v2, bf16, against the float64 NumPy backward on the same bf16-rounded inputs; outputs start NaN;
    a quarter of the channels gated down to -20 at T = 500 (the sub-chunk references' exponents)."""
    x = inputs(2, T, 2, K, V, seed=T + K + 3 * V, with_state=with_state, strong=T == 500)
    gx, host = device_inputs(x, "bfloat16")
    grads = mcuda.gla_backward(gx["q"], gx["k"], gx["v"], gx["g"], do=gx["do"], dstate=gx["dS"],
                               initial_state=gx["S0"], version=2)
    assert_gradients(grads, numpy_gradients(host, K ** -0.5, form="chunked"), gx, FLA_TOLERANCE.get,
                     f"T={T} K={K} V={V}")


@gpu
def test_the_chunked_backward_repeats_bit_for_bit():
    """v2 twice more on the same inputs: the same bits (its sums are taken in a fixed order; a race would show)."""
    x = inputs(2, 200, 4, 128, 128, seed=26)
    gx, _ = device_inputs(x, "bfloat16")
    run = lambda: mcuda.gla_backward(gx["q"], gx["k"], gx["v"], gx["g"], do=gx["do"], dstate=gx["dS"],  # noqa: E731
                                     initial_state=gx["S0"], version=2)
    first = run()
    for _ in range(2):
        assert all(bool((a == b).all()) for a, b in zip(first, run()))


@gpu
def test_strong_gates_over_a_long_sequence_stay_finite():
    """T = 4096, every gate in [-20, 0): every gradient of the chunked backward finite."""
    x = inputs(1, 4096, 2, 64, 64, seed=27)
    x["g"] = np.random.default_rng(28).uniform(-20.0, 0.0, x["g"].shape)
    gx, _ = device_inputs(x, "bfloat16")
    grads = mcuda.gla_backward(gx["q"], gx["k"], gx["v"], gx["g"], do=gx["do"], dstate=gx["dS"],
                               initial_state=gx["S0"], version=2)
    for name in grads._fields:
        assert bool(cupy.isfinite(bf16.as_float32(getattr(grads, name))).all()), name


@gpu
def test_the_kernel_names_what_it_refuses():
    x = inputs(1, 8, 1, 64, 64, seed=25)
    gx, _ = device_inputs(x, "float32")
    with pytest.raises(ValueError, match=r"^version: expected one of \[1, 2\] for gla_bwd, got 3"):
        mcuda.gla_backward(gx["q"], gx["k"], gx["v"], gx["g"], do=gx["do"], version=3)
    with pytest.raises(TypeError, match=r"^version: gla_bwd version 2 \(chunked_mma\) takes bfloat16 inputs only"):
        mcuda.gla_backward(gx["q"], gx["k"], gx["v"], gx["g"], do=gx["do"], version=2)
    assert [v["version"] for v in mcuda.versions("gla_bwd")] == [1, 2]
