"""The CUDA backward kernels (csrc/linear_bwd/, csrc/delta_bwd/) against the float64 NumPy backward.

The GPU tests compare with the mixers' own `recurrent_backward` (or, at FLA's longer test shapes,
`chunked_backward`) in float64. This file also keeps a small float64
reference of its own, the definition run backwards with every state kept, written from the same derivation as the
kernels (csrc/delta_bwd/recurrent_passes.cuh): it is proved on the CPU against central finite differences of minilin's
recurrent forms and against the mixers' recurrent_backward, and it drives the CPU test of the front's call into the
extension (argument order, which outputs are asked for) through a stand-in extension that follows the
BackwardProblem contract. GPU tests skip, with the reason, where CuPy, a GPU or the extension is
missing.
"""
from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from minilin import cuda as mcuda
from minilin.cuda import backward as mbackward
from minilin.cuda import bf16, front
from minilin.mixers import deltanet, gated_deltanet, linear_attention, simple_gla
from minilin.mixers.lightning import default_slope as lightning_default_slope
from minilin.mixers.retnet import default_gamma as retnet_default_gamma
from conftest import TENSOR_CORE_SHAPE, TOKEN_LOOP_SHAPE, rel_err

OK, REASON = mcuda.available()
gpu = pytest.mark.skipif(not OK, reason=REASON or "CUDA extension unavailable")
if OK:
    import cupy


# ---- the float64 reference: the definition run backwards, every state kept --------------------------------
def _decays(g, shape):
    return np.ones(shape) if g is None else np.exp(g)


def linear_backward_reference(q, k, v, g, S0, do, dS, scale):
    """Gradients (dq, dk, dv, dg, dS0) of L = <do, o> + <dS, S_T> for S_t = a_t S_{t-1} + k_t v_t^T, o_t = S_t^T
    (scale q_t), a_t = exp(g_t). Shapes as CONVENTIONS.md; g, S0, dS may be None (dg, dS0 None then)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    a = _decays(g, (B, T, H))
    qs = scale * q
    S = np.zeros((B, H, K, V)) if S0 is None else S0.copy()
    states = [S]
    for t in range(T):
        S = a[:, t, :, None, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        states.append(S)
    D = np.zeros((B, H, K, V)) if dS is None else dS.copy()
    dq, dk, dv, dg = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape), np.zeros((B, T, H))
    for t in range(T - 1, -1, -1):
        D = D + qs[:, t, :, :, None] * do[:, t, :, None, :]           # D_t
        dq[:, t] = scale * np.einsum("bhkv,bhv->bhk", states[t + 1], do[:, t])
        dk[:, t] = np.einsum("bhkv,bhv->bhk", D, v[:, t])
        dv[:, t] = np.einsum("bhkv,bhk->bhv", D, k[:, t])
        dg[:, t] = a[:, t] * (D * states[t]).sum((-2, -1))            # d/dg of a_t S_{t-1}
        D = a[:, t, :, None, None] * D
    return dq, dk, dv, None if g is None else dg, None if S0 is None else D


def delta_backward_reference(q, k, v, g, beta, S0, do, dS, scale):
    """Gradients (dq, dk, dv, dg, dbeta, dS0) of L = <do, o> + <dS, S_T> for the gated delta rule
    S' = a_t S_{t-1}, S_t = S' + beta_t k_t (v_t - S'^T k_t)^T, o_t = S_t^T (scale q_t)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    a = _decays(g, (B, T, H))
    qs = scale * q
    S = np.zeros((B, H, K, V)) if S0 is None else S0.copy()
    states = [S]
    for t in range(T):
        Sp = a[:, t, :, None, None] * S
        u = beta[:, t, :, None] * (v[:, t] - np.einsum("bhkv,bhk->bhv", Sp, k[:, t]))
        S = Sp + k[:, t, :, :, None] * u[:, :, None, :]
        states.append(S)
    D = np.zeros((B, H, K, V)) if dS is None else dS.copy()
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    dg, dbeta = np.zeros((B, T, H)), np.zeros((B, T, H))
    for t in range(T - 1, -1, -1):
        kt, b_t = k[:, t], beta[:, t, :, None]
        Sp = a[:, t, :, None, None] * states[t]
        p = np.einsum("bhkv,bhk->bhv", Sp, kt)
        u = b_t * (v[:, t] - p)
        D = D + qs[:, t, :, :, None] * do[:, t, :, None, :]
        du = np.einsum("bhkv,bhk->bhv", D, kt)
        dq[:, t] = scale * np.einsum("bhkv,bhv->bhk", states[t + 1], do[:, t])
        dv[:, t] = b_t * du
        dbeta[:, t] = (du * (v[:, t] - p)).sum(-1)
        dk[:, t] = np.einsum("bhkv,bhv->bhk", D, u) - b_t * np.einsum("bhkv,bhv->bhk", Sp, du)
        D = D - b_t[..., None] * kt[..., :, None] * du[..., None, :]    # dL/dS'
        dg[:, t] = (D * Sp).sum((-2, -1))
        D = a[:, t, :, None, None] * D
    return dq, dk, dv, None if g is None else dg, dbeta, None if S0 is None else D


# ---- inputs ----------------------------------------------------------------------------------------------
def inputs(B, T, H, K, V, seed, *, gated=True, delta=False, with_state=True):
    """Random float64 inputs: keys of norm 0.9 (beta |k|^2 < 1 with room to perturb them), gates in [-1, -0.05],
    beta in [0.1, 0.9], a random initial state, do and dS."""
    rng = np.random.default_rng(seed)
    q, v = rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, V))
    k = rng.standard_normal((B, T, H, K))
    k *= 0.9 / np.linalg.norm(k, axis=-1, keepdims=True)
    g = rng.uniform(-1.0, -0.05, (B, T, H)) if gated else None
    beta = rng.uniform(0.1, 0.9, (B, T, H)) if delta else None
    S0 = 0.5 * rng.standard_normal((B, H, K, V)) if with_state else None
    do = rng.standard_normal((B, T, H, V))
    dS = rng.standard_normal((B, H, K, V)) if with_state else None
    return dict(q=q, k=k, v=v, g=g, beta=beta, S0=S0, do=do, dS=dS)


def loss(x, delta, scale):
    """L = <do, o> + <dS, S_T> through minilin's recurrent forms (float64)."""
    if delta:
        mod = gated_deltanet if x["g"] is not None else deltanet
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"]) if x["g"] is not None else (x["q"], x["k"], x["v"], x["beta"])
    else:
        mod = simple_gla if x["g"] is not None else linear_attention
        args = (x["q"], x["k"], x["v"], x["g"]) if x["g"] is not None else (x["q"], x["k"], x["v"])
    o, S = mod.recurrent(*args, scale=scale, initial_state=x["S0"])
    return (x["do"] * o).sum() + (0.0 if x["dS"] is None else (x["dS"] * S).sum())


def reference(x, delta, scale):
    if delta:
        return delta_backward_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], x["S0"], x["do"], x["dS"], scale)
    return linear_backward_reference(x["q"], x["k"], x["v"], x["g"], x["S0"], x["do"], x["dS"], scale)


# ---- the reference against finite differences (CPU) ------------------------------------------------------
@pytest.mark.parametrize("delta, gated", [(False, True), (False, False), (True, True), (True, False)])
@pytest.mark.parametrize("with_state", [True, False])
def test_the_reference_matches_central_differences(delta, gated, with_state):
    x = inputs(2, 5, 2, 4, 3, seed=1, gated=gated, delta=delta, with_state=with_state)
    scale = 0.7
    grads = reference(x, delta, scale)
    names = ["q", "k", "v", "g"] + (["beta"] if delta else []) + ["S0"]
    grad_of = dict(zip(names, grads))
    rng = np.random.default_rng(2)
    present = [n for n in names if x[n] is not None]
    directions = {n: rng.standard_normal(x[n].shape) for n in present}
    eps = 1e-6

    def directional(only=None):
        plus, minus = dict(x), dict(x)
        for n in present if only is None else [only]:
            plus[n] = x[n] + eps * directions[n]
            minus[n] = x[n] - eps * directions[n]
        return (loss(plus, delta, scale) - loss(minus, delta, scale)) / (2 * eps)

    predicted = sum((grad_of[n] * directions[n]).sum() for n in present)
    assert abs(directional() - predicted) <= 1e-6 * max(1.0, abs(predicted)), "all inputs at once"
    for n in present:
        alone = (grad_of[n] * directions[n]).sum()
        assert abs(directional(n) - alone) <= 1e-6 * max(1.0, abs(alone)), n
    if not gated:
        assert grad_of["g"] is None
    if not with_state:
        assert grad_of["S0"] is None


def numpy_backward(mixer, x, scale, form="recurrent"):
    """The mixer's own <form>_backward (float64), as (dq, dk, dv, [dg,] [dbeta,] dinitial_state) by name."""
    args = [x["q"], x["k"], x["v"]]
    if mixer in ("simple_gla", "gated_deltanet"):
        args.append(x["g"])
    if mixer in ("deltanet", "gated_deltanet"):
        args.append(x["beta"])
    mod = {"simple_gla": simple_gla, "linear_attention": linear_attention, "gated_deltanet": gated_deltanet,
           "deltanet": deltanet}[mixer]
    backward = getattr(mod, f"{form}_backward")
    return backward(*args, do=x["do"], dstate=x["dS"], scale=scale, initial_state=x["S0"])._asdict()


@pytest.mark.parametrize("mixer", ["simple_gla", "linear_attention", "gated_deltanet", "deltanet"])
@pytest.mark.parametrize("with_state", [True, False])
def test_the_reference_equals_the_mixers_recurrent_backward(mixer, with_state):
    delta, gated = mixer in ("gated_deltanet", "deltanet"), mixer in ("simple_gla", "gated_deltanet")
    x = inputs(2, 9, 2, 6, 5, seed=5, gated=gated, delta=delta, with_state=with_state)
    ours = dict(zip(["dq", "dk", "dv", "dg"] + (["dbeta"] if delta else []) + ["dinitial_state"],
                    reference(x, delta, 0.6)))
    for name, theirs in numpy_backward(mixer, x, 0.6).items():
        if theirs is None:
            assert ours[name] is None, name
        else:
            assert rel_err(ours[name], theirs) < 1e-10, name


# ---- the front's call into the extension, on the CPU -------------------------------------------------------
# The fake arrays live in host memory, so a stand-in for minilin._cuda.backward writes the reference's gradients
# through the addresses the front passes, as the BackwardProblem contract says: dq, dk, dv, dg when g is given,
# dbeta for delta_bwd, dh0 when asked. The front must then return the reference's gradients by name.
class HostArray(np.ndarray):
    def __array_finalize__(self, obj):
        self._device = getattr(obj, "_device", 0)

    @property
    def device(self):
        return types.SimpleNamespace(id=self._device)

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


HostArray.__module__ = "cupy"


def on_host_gpu(x):
    return None if x is None else np.ascontiguousarray(x, np.float32).view(HostArray)


def at(address, shape):
    return np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), shape=tuple(shape))


def contract_backward(op, version, q, k, v, g, beta, h0, do, dht, dq, dk, dv, dg, dbeta, dh0, workspace,
                      workspace_size, B, T, H, K, V, scale, dtype, stream):
    assert dtype == 0 and workspace_size == 0
    read = lambda address, shape: None if not address else at(address, shape).astype(np.float64)  # noqa: E731
    x = dict(q=read(q, (B, T, H, K)), k=read(k, (B, T, H, K)), v=read(v, (B, T, H, V)), g=read(g, (B, T, H)),
             beta=read(beta, (B, T, H)), S0=read(h0, (B, H, K, V)), do=read(do, (B, T, H, V)),
             dS=read(dht, (B, H, K, V)))
    delta = op == "delta_bwd"
    grads = reference(x, delta, scale)
    at(dq, (B, T, H, K))[...] = grads[0]
    at(dk, (B, T, H, K))[...] = grads[1]
    at(dv, (B, T, H, V))[...] = grads[2]
    assert bool(dg) == (x["g"] is not None) and bool(dbeta) == delta
    if dg:
        at(dg, (B, T, H))[...] = grads[3]
    if delta:
        at(dbeta, (B, T, H))[...] = grads[4]
    if dh0:
        at(dh0, (B, H, K, V))[...] = grads[-1]


@pytest.fixture
def host_extension(monkeypatch):
    module = types.ModuleType("cupy")
    module.ndarray = HostArray

    def on_device(name):
        function = getattr(np, name)
        if not callable(function) or isinstance(function, type):
            return function

        def call(*args, **kwargs):
            result = function(*args, **kwargs)
            return result.view(HostArray) if isinstance(result, np.ndarray) and result.ndim else result

        return call

    module.__getattr__ = on_device
    module.cuda = types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(id=0),
                                        get_current_stream=lambda: types.SimpleNamespace(ptr=0), alloc=None)
    monkeypatch.setitem(sys.modules, "cupy", module)
    bf16.native_dtype.cache_clear()
    ladder = tuple({"op": op, "version": 1, "name": "recurrent", "float32": True, "bfloat16": True,
                    "min_compute_capability": 80, "max_compute_capability": 0, **TOKEN_LOOP_SHAPE}
                   for op in ("linear_bwd", "delta_bwd", "gla_bwd", "kda_bwd"))
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    monkeypatch.setattr(front, "_compute_capability", lambda device: 90)
    monkeypatch.setattr(mbackward, "extension", lambda: types.SimpleNamespace(
        backward=contract_backward, workspace_bytes=lambda *args: 0))
    yield
    bf16.native_dtype.cache_clear()


def test_the_default_backward_version_is_the_chunked_one_where_the_shape_fits(host_extension, monkeypatch):
    """version=None: linear_bwd v2 (bf16, K 64 or 128, V a multiple of 64) where it takes the shape, v1 elsewhere
    and for float32; a version asked for by number is kept (its own checks say what it takes)."""
    v2 = {"op": "linear_bwd", "version": 2, "name": "chunked_mma", "float32": False, "bfloat16": True,
          "min_compute_capability": 80, "max_compute_capability": 0, **TENSOR_CORE_SHAPE}
    ladder = ({"op": "linear_bwd", "version": 1, "name": "recurrent", "float32": True, "bfloat16": True,
               "min_compute_capability": 80, "max_compute_capability": 0, **TOKEN_LOOP_SHAPE}, v2)
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    chosen = lambda version, bf, K, V: front.runnable_version("linear_bwd", version, bf, K, V)["version"]  # noqa: E731
    assert [chosen(None, True, K, V) for K, V in [(64, 64), (128, 128), (64, 128), (128, 192)]] == [2, 2, 2, 2]
    assert [chosen(None, True, K, V) for K, V in [(32, 64), (256, 64), (64, 96), (128, 32)]] == [1, 1, 1, 1]
    assert chosen(None, False, 64, 64) == 1
    assert chosen(2, True, 32, 64) == 2 and chosen(1, True, 64, 64) == 1


@pytest.mark.parametrize("mixer", ["simple_gla", "linear_attention", "gated_deltanet", "deltanet"])
@pytest.mark.parametrize("with_state", [True, False])
def test_the_front_returns_the_reference_gradients_by_name(host_extension, mixer, with_state):
    delta, gated = mixer in ("gated_deltanet", "deltanet"), mixer in ("simple_gla", "gated_deltanet")
    x = inputs(2, 7, 3, 8, 4, seed=3, gated=gated, delta=delta, with_state=with_state)
    x = {n: None if a is None else a.astype(np.float32).astype(np.float64) for n, a in x.items()}  # float32 values
    scale = 8 ** -0.5
    ref = dict(zip(["dq", "dk", "dv", "dg"] + (["dbeta"] if delta else []) + ["dinitial_state"], reference(x, delta,
                                                                                                            scale)))
    args = [on_host_gpu(x[n]) for n in ("q", "k", "v")]
    if gated:
        args.append(on_host_gpu(x["g"]))
    if delta:
        args.append(on_host_gpu(x["beta"]))
    grads = getattr(mcuda, f"{mixer}_backward")(*args, do=on_host_gpu(x["do"]), dstate=on_host_gpu(x["dS"]),
                                                initial_state=on_host_gpu(x["S0"]))
    assert type(grads).__name__.endswith("Gradients")
    assert grads._fields == tuple(n for n in ref if n != "dg" or gated)
    for name in grads._fields:
        got = getattr(grads, name)
        if ref[name] is None:
            assert got is None, name
            continue
        assert got.dtype == np.float32 and got.shape == ref[name].shape, name
        assert rel_err(np.asarray(got, np.float64), ref[name]) < 1e-5, name  # dg: the kernel's (here the stand-in's)


@pytest.mark.parametrize("mixer", ["simple_gla", "linear_attention", "gated_deltanet", "deltanet"])
def test_the_front_takes_grouped_heads_and_packed_sequences(host_extension, mixer):
    """HV = 2 H value heads and two packed sequences, through the front and the stand-in extension, against the
    mixer's NumPy chunked_backward given the same layout (minilin.heads, minilin.varlen)."""
    delta, gated = mixer in ("gated_deltanet", "deltanet"), mixer in ("simple_gla", "gated_deltanet")
    x = inputs(1, 9, 4, 8, 4, seed=6, gated=gated, delta=delta, with_state=False)
    x = {n: None if a is None else a.astype(np.float32).astype(np.float64) for n, a in x.items()}
    x["q"], x["k"] = (np.ascontiguousarray(x[n][:, :, ::2]) for n in ("q", "k"))  # H = 2 q/k heads for HV = 4
    rng = np.random.default_rng(7)
    S0, dS = (rng.standard_normal((2, 4, 8, 4)).astype(np.float32).astype(np.float64) for _ in range(2))
    cu = np.array([0, 4, 9], np.int64)
    names = ["q", "k", "v"] + (["g"] if gated else []) + (["beta"] if delta else [])
    mod = {"simple_gla": simple_gla, "linear_attention": linear_attention, "gated_deltanet": gated_deltanet,
           "deltanet": deltanet}[mixer]
    ref = mod.chunked_backward(*(x[n] for n in names), do=x["do"], dstate=dS, initial_state=S0, cu_seqlens=cu,
                               chunk_size=4)
    grads = getattr(mcuda, f"{mixer}_backward")(*(on_host_gpu(x[n]) for n in names), do=on_host_gpu(x["do"]),
                                                dstate=on_host_gpu(dS), initial_state=on_host_gpu(S0), cu_seqlens=cu)
    assert grads._fields == ref._fields
    for name in grads._fields:
        want, got = getattr(ref, name), getattr(grads, name)
        assert got.shape == want.shape, name
        assert rel_err(np.asarray(got, np.float64), want) < 1e-5, name


@pytest.mark.parametrize("mixer", ["retnet", "lightning", "mamba2"])
@pytest.mark.parametrize("given", [True, False], ids=["parameters given", "defaults"])
def test_the_mapped_mixers_gradients_through_the_front(host_extension, monkeypatch, mixer, given):
    """RetNet, Lightning and Mamba-2 map onto the scalar-gated recurrence; their GPU backward is the kernel's plus
    the chain rule of the mapping. Through the stand-in extension, against the NumPy chunked_backward (float64 on
    float32 values), with the per-head parameter (gamma, slope; Mamba-2's D) given or left to its default."""
    from minilin import catalog
    from minilin.cuda import mixers as cuda_mixers

    monkeypatch.setattr(cuda_mixers, "_default_per_head", lambda name, H, device: on_host_gpu(
        (retnet_default_gamma if name == "gamma" else lightning_default_slope)(H)))
    mod = catalog.module(mixer)
    args, kwargs = mod.example_inputs(2, 9, 3, 8, 4, seed=13)
    args = [a.astype(np.float32).astype(np.float64) for a in args]
    rng = np.random.default_rng(14)
    if mixer == "mamba2":
        x, dt, A, B, C, D = args
        P, N = x.shape[-1], B.shape[-1]
        args = [x, dt, A, B, C, D if given else None]
        S0 = rng.standard_normal((2, 3, N, P)).astype(np.float32).astype(np.float64)
        options = {}
    else:
        S0 = rng.standard_normal((2, 3, 8, 4)).astype(np.float32).astype(np.float64)
        name = "gamma" if mixer == "retnet" else "slope"
        value = rng.uniform(0.5, 0.99, 3) if mixer == "retnet" else rng.uniform(0.01, 0.5, 3)
        options = {name: value.astype(np.float32).astype(np.float64)} if given else {}
    do = rng.standard_normal(args[0].shape[:3] + (args[2].shape[-1] if mixer != "mamba2" else args[0].shape[-1],))
    dS = rng.standard_normal(S0.shape)
    ref = mod.chunked_backward(*args, do=do, dstate=dS, initial_state=S0, **options, chunk_size=4)
    grads = getattr(mcuda, f"{mixer}_backward")(*(None if a is None else on_host_gpu(a) for a in args),
                                                do=on_host_gpu(do), dstate=on_host_gpu(dS),
                                                initial_state=on_host_gpu(S0),
                                                **{n: on_host_gpu(v) for n, v in options.items()})
    assert grads._fields == ref._fields
    for field in grads._fields:
        want, got = getattr(ref, field), getattr(grads, field)
        if want is None:
            assert got is None, field
            continue
        assert got.shape == want.shape and rel_err(np.asarray(got, np.float64), want) < 1e-5, field


def test_the_mapped_mixers_name_their_own_arguments(host_extension):
    """RetNet's and Lightning's decay is one per head of q, so v must have q's heads (as in NumPy); Mamba-2's
    cotangents and states are checked in its own names ([B, H, N, P], x's dtype), not the recurrence's."""
    rng = np.random.default_rng(15)
    q, k = (on_host_gpu(rng.standard_normal((1, 5, 2, 4))) for _ in range(2))
    v_grouped, do_grouped = (on_host_gpu(rng.standard_normal((1, 5, 4, 3))) for _ in range(2))
    for mixer in ("retnet", "lightning"):
        with pytest.raises(ValueError, match=r"v: expected shape \[B, T, H, V\] = \[1, 5, 2, V\], got \[1, 5, 4, 3\]"):
            getattr(mcuda, f"{mixer}_backward")(q, k, v_grouped, do=do_grouped)
        with pytest.raises(ValueError, match=r"v: expected shape \[B, T, H, V\]"):
            getattr(mcuda, mixer)(q, k, v_grouped)
    from minilin.mixers import mamba2

    args = [on_host_gpu(a) for a in mamba2.example_inputs(1, 6, 2, 4, 3, seed=16)[0]]
    do = on_host_gpu(rng.standard_normal((1, 6, 2, 3)))
    with pytest.raises(ValueError, match=r"initial_state: expected shape \[B, H, N, P\] = \[1, 2, 4, 3\], got \[1, 2, 3, 4\]"):
        mcuda.mamba2_backward(*args, do=do, initial_state=on_host_gpu(np.zeros((1, 2, 3, 4))))
    with pytest.raises(ValueError, match=r"dstate: expected shape \[B, H, N, P\]"):
        mcuda.mamba2_backward(*args, do=do, dstate=on_host_gpu(np.zeros((1, 2, 3, 4))))
    with pytest.raises(TypeError, match=r"do: expected the dtype of x \(float32\), got uint16"):
        mcuda.mamba2_backward(*args, do=np.zeros(do.shape, np.uint16).view(HostArray))


@pytest.mark.parametrize("mixer", ["deltanet", "gated_deltanet"])
def test_normalize_qk_through_the_front(host_extension, mixer):
    """normalize_qk: the kernel's gradients of the normalized q and k carried back through the normalization,
    against the NumPy chunked_backward given normalize_qk (keys of any length: the normalization bounds them)."""
    x = inputs(2, 7, 3, 8, 4, seed=17, gated=mixer == "gated_deltanet", delta=True, with_state=True)
    x = {n: None if a is None else a.astype(np.float32).astype(np.float64) for n, a in x.items()}
    x["k"] = x["k"] * np.random.default_rng(18).uniform(0.5, 3.0, x["k"].shape[:3] + (1,))  # not unit keys
    names = ["q", "k", "v"] + (["g"] if mixer == "gated_deltanet" else []) + ["beta"]
    mod = {"deltanet": deltanet, "gated_deltanet": gated_deltanet}[mixer]
    ref = mod.chunked_backward(*(x[n] for n in names), do=x["do"], dstate=x["dS"], initial_state=x["S0"],
                               normalize_qk=True, chunk_size=4)
    grads = getattr(mcuda, f"{mixer}_backward")(*(on_host_gpu(x[n]) for n in names), do=on_host_gpu(x["do"]),
                                                dstate=on_host_gpu(x["dS"]), initial_state=on_host_gpu(x["S0"]),
                                                normalize_qk=True)
    for name in grads._fields:
        want, got = getattr(ref, name), getattr(grads, name)
        assert rel_err(np.asarray(got, np.float64), want) < 1e-5, name


def test_bad_cotangents_name_do_and_dstate(host_extension):
    x = inputs(2, 5, 2, 8, 4, seed=4, delta=True)
    q, k, v, g, beta = (on_host_gpu(x[n]) for n in ("q", "k", "v", "g", "beta"))
    do, dS = on_host_gpu(x["do"]), on_host_gpu(x["dS"])
    with pytest.raises(ValueError, match=r"do: expected shape \[B, T, HV, V\] = \[2, 5, 2, 4\], got \[2, 5, 2\]"):
        mcuda.gated_deltanet_backward(q, k, v, g, beta, do=do[..., 0])
    with pytest.raises(TypeError, match=r"do: expected the dtype of v \(float32\), got uint16"):
        mcuda.gated_deltanet_backward(q, k, v, g, beta, do=np.zeros(do.shape, np.uint16).view(HostArray))
    with pytest.raises(ValueError, match=r"dstate: expected shape \[B, HV, K, V\] = \[2, 2, 8, 4\], got \[2, 2, 4, 8\]"):
        mcuda.simple_gla_backward(q, k, v, g, do=do, dstate=on_host_gpu(np.zeros((2, 2, 4, 8))))
    with pytest.raises(ValueError, match=r"do: expected finite values"):
        mcuda.simple_gla_backward(q, k, v, g, do=on_host_gpu(np.full(do.shape, np.nan)))
    with pytest.raises(ValueError, match=r"dstate: expected finite values"):
        mcuda.gated_deltanet_backward(q, k, v, g, beta, do=do, dstate=on_host_gpu(np.full(dS.shape, np.inf)))
    with pytest.raises(TypeError, match=r"do: expected a CuPy array on the GPU"):
        mcuda.gated_deltanet_backward(q, k, v, g, beta, do=x["do"])
    with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 1"):
        mcuda.gated_deltanet_backward(q, on_host_gpu(3 * x["k"]), v, g, beta, do=do)
    with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'do'"):
        mcuda.simple_gla_backward(q, k, v, g)


# ---- the kernels (GPU) -------------------------------------------------------------------------------------
# (B, T, H, K, V): T not a multiple of the 64-token checkpoint chunk, T = 1, K != V both ways, V = 48 (a partial
# 32-column value block), K = 40 (a partial 32-row lane group), K = 256 (the largest), several chunks.
SHAPES = [(2, 100, 3, 64, 64), (1, 1, 1, 128, 128), (1, 130, 2, 32, 96), (2, 70, 2, 40, 48), (1, 64, 1, 256, 64),
          (1, 300, 2, 128, 128)]
TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2}


def on_gpu(a, in_bf16: bool):
    """(a on the GPU, in bf16 or float32, and the float64 values it holds)."""
    d = cupy.asarray(a, dtype=cupy.float32)
    if in_bf16:
        d = mcuda.to_bf16(d)
    return d, cupy.asnumpy(bf16.as_float32(d)).astype(np.float64)


def device_inputs(x, dtype):
    """x's arrays on the GPU (q, k, v, do in `dtype`, the rest float32) and the float64 values they hold."""
    gpu_x, host = {}, {}
    for name, a in x.items():
        if a is None:
            gpu_x[name] = host[name] = None
        else:
            gpu_x[name], host[name] = on_gpu(a, dtype == "bfloat16" and name in ("q", "k", "v", "do"))
    return gpu_x, host


def as_host(x):
    """A gradient's values on the host as float32 (bf16 ones widened exactly)."""
    return cupy.asnumpy(bf16.as_float32(x))


def expected_dtype(name, gx):
    """dq, dk, dv come back in their inputs' dtype; dg, dbeta and dinitial_state in float32."""
    return gx[name[1:]].dtype if name in ("dq", "dk", "dv") else cupy.float32


def run_backward(mixer, gx, **kwargs):
    args = [gx["q"], gx["k"], gx["v"]]
    if mixer in ("simple_gla", "gated_deltanet"):
        args.append(gx["g"])
    if mixer in ("deltanet", "gated_deltanet"):
        args.append(gx["beta"])
    return getattr(mcuda, f"{mixer}_backward")(*args, do=gx["do"], dstate=gx["dS"], initial_state=gx["S0"], **kwargs)


@gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mixer", ["simple_gla", "linear_attention", "gated_deltanet", "deltanet"])
def test_kernels_match_the_float64_backward(mixer, dtype, shape):
    delta, gated = mixer in ("gated_deltanet", "deltanet"), mixer in ("simple_gla", "gated_deltanet")
    x = inputs(*shape, seed=sum(shape), gated=gated, delta=delta, with_state=shape[1] != 64)
    gx, host = device_inputs(x, dtype)
    grads = run_backward(mixer, gx)
    ref = numpy_backward(mixer, host, shape[3] ** -0.5)
    tol = TOLERANCE[dtype]
    for name in grads._fields:
        got = getattr(grads, name)
        if ref[name] is None:
            assert got is None, name
            continue
        assert got.dtype == expected_dtype(name, gx) and got.shape == ref[name].shape, name
        err = rel_err(as_host(got), ref[name])
        assert err < tol, f"{mixer} {dtype} {shape} {name}: {err:.2e} >= {tol}"


# FLA's test shapes for its chunk backward (T in 63, 500, 1000, 2048; K = V and K != V; with and without an initial
# state) and its tolerances (relative RMS error), for the tensor-core versions.
FLA_LENGTHS = (63, 500, 1000, 2048)
FLA_KV = [(64, 64), (128, 128), (64, 128), (128, 64)]
FLA_TOLERANCE = {"dq": 0.008, "dk": 0.008, "dv": 0.008, "dinitial_state": 0.008, "dg": 0.02, "dbeta": 0.02}
CHUNKED_VERSIONS = {"linear_bwd": (2,), "delta_bwd": (2,)}  # the tensor-core versions; a new rung joins here
CHUNKED_CASES = [(mixer, version) for mixer in ("simple_gla", "linear_attention", "gated_deltanet", "deltanet")
                 for version in CHUNKED_VERSIONS["delta_bwd" if "delta" in mixer else "linear_bwd"]]


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("with_state", [True, False], ids=["state", "no state"])
@pytest.mark.parametrize("K, V", FLA_KV, ids=lambda kv: f"{kv}")
@pytest.mark.parametrize("T", FLA_LENGTHS)
@pytest.mark.parametrize("mixer, version", CHUNKED_CASES, ids=lambda x: str(x))
def test_the_chunked_backward_at_flas_test_shapes(mixer, version, T, K, V, with_state):
    """The tensor-core backward versions, bf16, against the float64 NumPy backward on the same bf16-rounded
    inputs; outputs start NaN."""
    delta, gated = "delta" in mixer, mixer in ("simple_gla", "gated_deltanet")
    x = inputs(2, T, 2, K, V, seed=T + K + 3 * V, gated=gated, delta=delta, with_state=with_state)
    gx, host = device_inputs(x, "bfloat16")
    grads = run_backward(mixer, gx, version=version)
    ref = numpy_backward(mixer, host, K ** -0.5, form="chunked")
    for name in grads._fields:
        got = getattr(grads, name)
        if ref[name] is None:
            assert got is None, name
            continue
        assert got.dtype == expected_dtype(name, gx), name
        err = rel_err(as_host(got), ref[name])
        assert err < FLA_TOLERANCE[name], f"v{version} {mixer} T={T} K={K} V={V} {name}: {err:.2e}"


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("mixer", ["gated_deltanet", "deltanet"])
@pytest.mark.parametrize("K, V", [(128, 128), (64, 64), (128, 192)])
def test_the_chunked_delta_backward_when_its_passes_outnumber_the_sms(mixer, K, V):
    """delta_bwd v2 runs both passes of a value block in one 16-warp block (the states copying one chunk at a
    time, the adjoints two) when their 2 (V / 64) H B separate blocks are more than the card's SMs (here 160 to
    480), and each pass in a block of its own otherwise (the FLA-shape test's grids); T = 200 ends in a partial
    chunk."""
    x = inputs(2, 200, 40, K, V, seed=11, gated=mixer == "gated_deltanet", delta=True, with_state=True)
    assert 2 * (V // 64) * 40 * 2 > cupy.cuda.Device().attributes["MultiProcessorCount"]
    gx, host = device_inputs(x, "bfloat16")
    grads = run_backward(mixer, gx, version=2)
    ref = numpy_backward(mixer, host, K ** -0.5, form="chunked")
    for name in grads._fields:
        if ref[name] is not None:
            err = rel_err(as_host(getattr(grads, name)), ref[name])
            assert err < FLA_TOLERANCE[name], f"{mixer} {name}: {err:.2e}"


@gpu
@pytest.mark.parametrize("mixer", ["simple_gla", "gated_deltanet"])
def test_kernels_take_grouped_heads_and_packed_sequences(mixer):
    """HV = 2 H and three packed sequences through the backward kernels, float32, against the NumPy backward."""
    delta, mod = mixer == "gated_deltanet", {"simple_gla": simple_gla, "gated_deltanet": gated_deltanet}[mixer]
    x = inputs(1, 150, 4, 32, 32, seed=8, gated=True, delta=delta, with_state=False)
    x["q"], x["k"] = (np.ascontiguousarray(x[n][:, :, ::2]) for n in ("q", "k"))
    rng = np.random.default_rng(9)
    S0, dS = (rng.standard_normal((3, 4, 32, 32)) for _ in range(2))
    cu = np.array([0, 1, 70, 150], np.int64)
    names = ["q", "k", "v", "g"] + (["beta"] if delta else [])
    ref = mod.chunked_backward(*(x[n] for n in names), do=x["do"], dstate=dS, initial_state=S0, cu_seqlens=cu)
    f32 = lambda a: cupy.asarray(a, dtype=cupy.float32)  # noqa: E731
    grads = getattr(mcuda, f"{mixer}_backward")(*(f32(x[n]) for n in names), do=f32(x["do"]), dstate=f32(dS),
                                                initial_state=f32(S0), cu_seqlens=cupy.asarray(cu))
    for name in grads._fields:
        want, got = getattr(ref, name), as_host(getattr(grads, name))
        assert got.shape == want.shape and rel_err(got, want) < TOLERANCE["float32"], name


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("case", ["simple_gla grouped packed", "gated_deltanet grouped normalize_qk", "mamba2"])
def test_the_fronts_arithmetic_after_the_kernels_in_bfloat16(case):
    """bf16 inputs through what the front computes after the kernels (a q/k head's sum over its value heads, the
    per-sequence join, normalize_qk's chain rule, Mamba-2's mapping), at K = V = 64 where the linear family runs
    linear_bwd v2: gradients in the inputs' dtype, within bf16 tolerance of the float64 NumPy backward on the same
    bf16-rounded inputs."""
    from minilin import catalog

    rng = np.random.default_rng(40)
    mixer = case.split()[0]
    mod = catalog.module(mixer)
    options, gpu_options = {}, {}
    if mixer == "mamba2":
        args, _ = mod.example_inputs(2, 130, 3, 64, 64, seed=41)
        in_bf16 = (True, False, False, True, True, False)  # x, dt, A, B, C, D
        S0 = rng.standard_normal((2, 3, 64, 64))
    else:
        delta = mixer == "gated_deltanet"
        x = inputs(1, 200, 4, 64, 64, seed=42, gated=True, delta=delta, with_state=False)
        q, k = (np.ascontiguousarray(x[n][:, :, ::2]) for n in ("q", "k"))  # H = 2 q/k heads, HV = 4
        args = [q, k, x["v"], x["g"]] + ([x["beta"]] if delta else [])
        in_bf16 = (True, True, True, False, False)[:len(args)]
        if delta:
            args[1] = args[1] * rng.uniform(0.5, 3.0, args[1].shape[:3] + (1,))  # keys of any length
            options["normalize_qk"] = gpu_options["normalize_qk"] = True
            S0 = rng.standard_normal((1, 4, 64, 64))
        else:
            cu = np.array([0, 70, 200], np.int64)
            options["cu_seqlens"], gpu_options["cu_seqlens"] = cu, cupy.asarray(cu)
            S0 = rng.standard_normal((2, 4, 64, 64))
    pairs = [on_gpu(a, bf) for a, bf in zip(args, in_bf16)]
    do_shape = args[0].shape if mixer == "mamba2" else args[2].shape
    do_gpu, do_host = on_gpu(rng.standard_normal(do_shape), True)
    dS = rng.standard_normal(S0.shape).astype(np.float32).astype(np.float64)
    S0 = S0.astype(np.float32).astype(np.float64)
    ref = mod.chunked_backward(*(h for _, h in pairs), do=do_host, dstate=dS, initial_state=S0, **options)
    grads = getattr(mcuda, f"{mixer}_backward")(*(d for d, _ in pairs), do=do_gpu, dstate=cupy.asarray(dS, np.float32),
                                                initial_state=cupy.asarray(S0, np.float32), **gpu_options)
    for position, field in enumerate(grads._fields):
        want, got = getattr(ref, field), getattr(grads, field)
        if want is None:
            assert got is None, field
            continue
        expected = pairs[position][0].dtype if position < len(pairs) else cupy.float32
        assert got.dtype == expected and got.shape == want.shape, (case, field, got.dtype, expected)
        err = rel_err(as_host(got), want)
        assert err < TOLERANCE["bfloat16"], f"{case} {field}: {err:.2e}"


@gpu
@pytest.mark.parametrize("mixer", ["simple_gla", "gated_deltanet"])
def test_gradients_of_the_final_state_alone(mixer):
    """do = 0: only <dstate, S_T> is differentiated (the state's adjoint from the last token back)."""
    delta = mixer == "gated_deltanet"
    x = inputs(2, 90, 2, 64, 64, seed=30, delta=delta)
    x["do"] = np.zeros_like(x["do"])
    gx, host = device_inputs(x, "float32")
    grads = run_backward(mixer, gx)
    ref = numpy_backward(mixer, host, 64 ** -0.5)
    for name in grads._fields:
        assert rel_err(as_host(getattr(grads, name)), ref[name]) < 1e-4, name


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_strong_gates_over_a_long_sequence_stay_finite(dtype):
    """T = 4096 with gates down to -20: every gradient finite (bf16: linear_bwd v2, the chunked one)."""
    x = inputs(1, 4096, 2, 64, 64, seed=31, delta=True)
    x["g"] = np.random.default_rng(32).uniform(-20.0, 0.0, x["g"].shape)
    gx, _ = device_inputs(x, dtype)
    for mixer in ("gated_deltanet", "simple_gla"):
        for grad in run_backward(mixer, gx):
            assert bool(cupy.isfinite(bf16.as_float32(grad)).all()), mixer


@gpu
@pytest.mark.parametrize("mixer", ["simple_gla", "gated_deltanet"])
def test_repeated_backward_runs_are_bit_identical(mixer):
    """The value blocks' parts are added in a fixed order: the same bits every run (a race would show here)."""
    x = inputs(2, 200, 4, 128, 128, seed=33, delta=mixer == "gated_deltanet")
    gx, _ = device_inputs(x, "bfloat16")
    first = run_backward(mixer, gx)
    for _ in range(2):
        again = run_backward(mixer, gx)
        assert all(bool((a == b).all()) for a, b in zip(first, again))


# ---- the extension's own checks (no GPU needed, only the built module) ------------------------------------
def backward_call(op="delta_bwd", **changes):
    args = dict(op=op, version=1, q=256, k=256, v=256, g=0, beta=256, h0=0, do=256, dht=0, dq=256, dk=256, dv=256,
                dg=0, dbeta=256, dh0=0, workspace=256, workspace_size=1 << 40, B=1, T=4, H=1, K=8, V=8,
                scale=1.0, dtype=0, stream=0)
    args.update(changes)
    return list(args.values())


@pytest.mark.parametrize("op, changes, message", [
    ("delta_bwd", dict(K=300), r"delta_bwd_v1_recurrent: K must be <= 256"),
    ("linear_bwd", dict(K=257), r"linear_bwd_v1_recurrent: K must be <= 256"),
    ("delta_bwd", dict(T=0), r"sizes must be positive, got B=1 T=0"),
    ("delta_bwd", dict(do=0), r"q, k, v, do, dq, dk and dv must be device pointers"),
    ("delta_bwd", dict(dbeta=0), r"beta and dbeta must be device pointers"),
    ("delta_bwd", dict(g=256), r"dg must be a device pointer when g is given"),
    ("linear_bwd", dict(g=256), r"linear_bwd_v1_recurrent: dg must be a device pointer when g is given"),
    ("delta_bwd", dict(workspace_size=16), r"workspace must hold \d+ bytes, got 16"),
    ("linear_bwd", dict(workspace=0), r"workspace must hold \d+ bytes"),
    ("delta_bwd", dict(dtype=5), r"dtype code must be 0 \(float32\) or 1 \(bfloat16\), got 5"),
    ("delta_bwd", dict(version=3), r"delta_bwd has versions 1, 2, got 3"),
    ("delta_bwd", dict(version=2, dtype=1, K=32, V=64), r"delta_bwd_v2_chunked_wy_mma: K must be 64 or 128, got K=32"),
    ("delta_bwd", dict(version=2, dtype=0, K=64, V=64), r"delta_bwd_v2_chunked_wy_mma: bfloat16 inputs only"),
    ("linear_bwd", dict(version=2, dtype=1, K=96, V=64), r"linear_bwd_v2_chunked_mma: K must be 64 or 128, got K=96"),
    ("linear_bwd", dict(version=2, dtype=1, K=64, V=96), r"linear_bwd_v2_chunked_mma: V must be a multiple of 64"),
    ("linear_bwd", dict(version=2, dtype=0, K=64, V=64), r"linear_bwd_v2_chunked_mma: bfloat16 inputs only"),
    ("kda_bwd", {}, r"kda_bwd_v1_recurrent: g must be a device pointer \(the per-channel log-decays"),
    ("kda_bwd", dict(g=256, dg=256, K=300), r"kda_bwd_v1_recurrent: K must be <= 256"),
    ("kda_bwd", dict(g=256, dg=256, dbeta=0), r"kda_bwd_v1_recurrent: beta and dbeta must be device pointers"),
    ("kda_bwd", dict(g=256, dg=256, version=3), r"kda_bwd has versions 1, 2, got 3"),
    ("kda_bwd", dict(g=256, dg=256, version=2, dtype=1, K=96, V=64), r"kda_bwd_v2_chunked_wy_mma: K must be 64 or 128"),
    ("kda_bwd", dict(g=256, dg=256, version=2, dtype=0, K=64, V=64), r"kda_bwd_v2_chunked_wy_mma: bfloat16 inputs only"),
    ("kda_bwd", dict(version=2, dtype=1, K=64, V=64), r"kda_bwd_v2_chunked_wy_mma: g must be a device pointer"),
    ("linear", {}, r"linear is not a backward op"),
    ("decode", {}, r"decode is not a backward op"),
])
def test_the_extension_checks_a_backward_call_before_any_cuda_call(op, changes, message):
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    with pytest.raises(ValueError, match=message):
        cuda.backward(*backward_call(op, **changes))


def test_the_extension_lists_the_backward_ops_with_their_workspace():
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    ladder = {(v["op"], v["version"]): v for v in cuda.versions() if v["op"].endswith("_bwd")}
    assert set(ladder) == {("linear_bwd", 1), ("linear_bwd", 2), ("delta_bwd", 1), ("delta_bwd", 2), ("gla_bwd", 1),
                          ("gla_bwd", 2), ("kda_bwd", 1), ("kda_bwd", 2)}
    assert all(v["float32"] and v["bfloat16"] for (_, n), v in ladder.items() if n == 1)
    assert all(ladder[op, 2]["bfloat16"] and not ladder[op, 2]["float32"]
               for op in ("linear_bwd", "delta_bwd", "gla_bwd", "kda_bwd"))
    # linear v1: dq's and dk's parts per 32-column value block and <dstate, S_T>'s; delta adds checkpoints, recomputed states, dbeta, dg
    assert cuda.workspace_bytes("linear_bwd", 1, 2, 100, 3, 64, 64) == (2 * 2 * (2 * 100 * 3 * 64) + 2 * 2 * 3) * 4
    # gla_bwd v1: the same parts, <dstate, S_T>'s per key row
    assert cuda.workspace_bytes("gla_bwd", 1, 2, 100, 3, 64, 64) == (2 * 2 * (2 * 100 * 3 * 64) + 2 * 2 * 3 * 64) * 4
    # gla_bwd v2: gla v4's tiles per chunk and head (Qr, Ke [64, K], P [64, 64] bf16, d [K] fp32), then the states
    # and their adjoints as linear v2's
    tiles = 2 * 2 * 3
    assert cuda.workspace_bytes("gla_bwd", 2, 2, 100, 3, 64, 64) == (tiles * (3 * 64 * 64 * 2 + 64 * 4)
                                                                     + 2 * (2 * 3 * 2 * 64 * 64) * 2)
    # linear v2: the states entering each 64-token chunk and their adjoints, bf16
    assert cuda.workspace_bytes("linear_bwd", 2, 2, 100, 3, 64, 128) == 2 * (2 * 3 * 2 * 64 * 128) * 2
    chunks, blocks, tokens = 2, 2 * 3 * 2, 2 * 100 * 3
    expected = (2 * 3 * chunks * 64 * 64 + blocks * 64 * 2 * 8 * 128 + 2 * 2 * tokens * 64 + 2 * 2 * tokens) * 4
    assert cuda.workspace_bytes("delta_bwd", 1, 2, 100, 3, 64, 64) == expected
    # kda_bwd v1: delta v1's, with dg's parts per key row
    assert cuda.workspace_bytes("kda_bwd", 1, 2, 100, 3, 64, 64) == expected + 2 * tokens * (64 - 1) * 4
    # delta v2: T per chunk, then per chunk the state, its adjoint [K, V] and the corrections, their adjoint [64, V], bf16
    matrices = 2 * 3 * chunks
    assert cuda.workspace_bytes("delta_bwd", 2, 2, 100, 3, 64, 128) == matrices * (64 * 64 + 2 * (64 * 128 + 64 * 128)) * 2
    # kda_bwd v2: kda's prepared tiles per chunk and head (Qr, Kg, Ke [64, K], P, T [64, 64] bf16, d [K] fp32), then
    # delta v2's per-chunk matrices (the states, their adjoints, the corrections and theirs), each section 256-aligned
    aligned = lambda n: -(-n // 256) * 256  # noqa: E731
    assert cuda.workspace_bytes("kda_bwd", 2, 2, 100, 3, 64, 128) == (
        3 * aligned(matrices * 64 * 64 * 2) + 2 * aligned(matrices * 64 * 64 * 2) + aligned(matrices * 64 * 4)
        + 2 * aligned(matrices * 64 * 128 * 2) + 2 * aligned(matrices * 64 * 128 * 2))
