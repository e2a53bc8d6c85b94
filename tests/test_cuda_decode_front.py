"""The decode steps' checks (minilin/cuda/decode.py, steps.py) and the delta front's new checks, run anywhere.

A stand-in for CuPy: NumPy arrays of a subclass whose type lives in a module named `cupy` (so minilin takes them
for CuPy arrays) with a chosen device, and a `cupy` module that hands every function to NumPy. The value checks
(g <= 0, beta, beta |k|^2, the state indices) then run on the CPU exactly as they run on CuPy; the launch itself
is replaced by a recorder.
"""
from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest

from minilin import cuda as mcuda
from minilin.cuda import bf16, decode, front, mixers
from minilin.activations import L2_EPS as L2_NORM_EPS, l2_normalize
from conftest import TOKEN_LOOP_SHAPE


class FakeDevice:
    """cupy.cuda.Device: an id, and a context that changes nothing."""

    def __init__(self, device=0):
        self.id = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture(autouse=True)
def no_fake_arrays_left_behind():
    """The default gammas and slopes are cached per device: arrays made under a fake CuPy must not outlive it."""
    mixers._default_per_head.cache_clear()
    yield
    mixers._default_per_head.cache_clear()


class FakeDeviceArray(np.ndarray):
    """NumPy data that minilin takes for a CuPy array on device `device.id` (0 unless set)."""

    def __array_finalize__(self, obj):
        self._device = getattr(obj, "_device", 0)

    @property
    def device(self):
        return types.SimpleNamespace(id=self._device)


FakeDeviceArray.__module__ = "cupy"  # what minilin.backend.is_cupy_array looks at


def on_gpu(x, device=0):
    y = np.ascontiguousarray(x).view(FakeDeviceArray)
    y._device = device
    return y


def _numpy_on_the_fake_gpu(name):
    """NumPy's `name`, its array results on the fake GPU (as CuPy's results are on the real one)."""
    function = getattr(np, name)
    if not callable(function) or isinstance(function, type):
        return function

    def on_device(*args, **kwargs):
        result = function(*args, **kwargs)
        return result.view(FakeDeviceArray) if type(result) is np.ndarray else result

    return on_device


@pytest.fixture
def fake_cupy(monkeypatch):
    """A `cupy` module backed by NumPy; decode._launch and front._launch record their calls instead."""
    module = types.ModuleType("cupy")
    module.ndarray = FakeDeviceArray
    module.cuda = types.SimpleNamespace(Device=FakeDevice)
    module.__getattr__ = _numpy_on_the_fake_gpu  # isfinite, sort, argmax, sqrt, broadcast_to, ...
    monkeypatch.setitem(sys.modules, "cupy", module)
    bf16.native_dtype.cache_clear()
    launched = []

    def record_step(delta, q, k, v, g, gate, beta, state, state_indices, in_place, out, scale, normalize_qk, version,
                    shapes):
        launched.append(dict(delta=delta, k=k, g=g, gate=gate, beta=beta, state=state, state_indices=state_indices,
                             in_place=in_place, out=out, scale=scale, normalize_qk=normalize_qk, sizes=shapes.sizes))
        return "launched", "new states"

    def record_forward(op, q, k, v, g, beta, initial_state, scale, version, cu_seqlens):
        sizes = dict(zip("BTHK", q.shape), V=v.shape[-1])  # q and k as launched: with v's heads
        launched.append(dict(op=op, q=q, k=k, g=g, beta=beta, sizes=sizes, cu_seqlens=cu_seqlens))
        return "launched"

    monkeypatch.setattr(decode, "_launch", record_step)
    monkeypatch.setattr(front, "_launch", record_forward)
    import minilin.cuda.steps as steps
    monkeypatch.setattr(steps, "_launch", record_step)
    yield launched
    bf16.native_dtype.cache_clear()


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def token(N=3, H=2, K=16, V=8, P=None, seed=0):
    """One valid token per sequence: q, k (unit), v, g scalar, g per channel, beta, a state pool and indices."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((N, H, K)).astype(np.float32)
    k = unit(rng.standard_normal((N, H, K))).astype(np.float32)
    v = rng.standard_normal((N, H, V)).astype(np.float32)
    g = -rng.uniform(0.01, 1, (N, H)).astype(np.float32)
    gk = -rng.uniform(0.01, 1, (N, H, K)).astype(np.float32)
    beta = rng.uniform(0, 1, (N, H)).astype(np.float32)
    P = P or N + 2
    pool = rng.standard_normal((P, H, K, V)).astype(np.float32)
    indices = rng.permutation(P)[:N].astype(np.int32)
    return {name: on_gpu(x) for name, x in dict(q=q, k=k, v=v, g=g, gk=gk, beta=beta, pool=pool,
                                                  indices=indices).items()}


# ---- every step reaches the launch with its gate and rule ------------------------------------------------
def test_every_mixer_has_a_step_and_the_steps_reach_the_launch(fake_cupy):
    t = token()
    q, k, v, g, gk, beta = (t[n] for n in ("q", "k", "v", "g", "gk", "beta"))
    calls = {"linear_attention": ((q, k, v), (False, None)), "simple_gla": ((q, k, v, g), (False, "scalar")),
             "gla": ((q, k, v, gk), (False, "channel")), "retnet": ((q, k, v), (False, "scalar")),
             "lightning": ((q, k, v), (False, "scalar")), "deltanet": ((q, k, v, beta), (True, None)),
             "gated_deltanet": ((q, k, v, g, beta), (True, "scalar")),
             "kda": ((q, k, v, gk, beta), (True, "channel")), "hgrn2": ((q, v, gk), (False, "channel"))}
    gamma = on_gpu(np.full(2, 0.9, np.float32))
    for mixer, (args, (delta, gate)) in calls.items():
        fake_cupy.clear()
        kwargs = {"gamma": gamma} if mixer == "retnet" else {"slope": on_gpu(np.full(2, 0.5, np.float32))} \
            if mixer == "lightning" else {}
        assert mcuda.STEPS[mixer](*args, state=t["pool"][:3], check_values=True, **kwargs) == ("launched", "new states")
        (call,) = fake_cupy
        assert (call["delta"], call["gate"]) == (delta, gate), mixer
        assert call["sizes"] == {"N": 3, "H": 2, "K": 16, "V": 8}
        assert call["in_place"] and call["scale"] == 16 ** -0.5
    assert set(mcuda.STEPS) == set(calls) | {"mamba2"}


def test_hgrn2_runs_glas_kernels_with_the_key_tied_to_the_forget_gate(fake_cupy):
    """HGRN2's forward and step hand the GLA op and GLA's step k = 1 - exp(g) (computed as -expm1(g)), with q, v, g
    as given; a g of the wrong shape is named as g, before any key is made from it."""
    t = token()
    q, v, gk = t["q"], t["v"], t["gk"]
    assert mcuda.hgrn2_step(q, v, gk, state=t["pool"][:3]) == ("launched", "new states")
    (call,) = fake_cupy
    assert call["gate"] == "channel" and not call["delta"] and np.array_equal(call["k"], -np.expm1(np.asarray(gk)))
    fake_cupy.clear()
    seq = lambda x: on_gpu(np.repeat(np.asarray(x)[:, None], 5, axis=1))  # noqa: E731 - [N, 5, H, .]: 5 tokens
    assert mcuda.hgrn2(seq(q), seq(v), seq(gk)) == "launched"
    (call,) = fake_cupy
    assert call["op"] == "gla" and call["sizes"] == {"B": 3, "T": 5, "H": 2, "K": 16, "V": 8}
    assert np.array_equal(call["k"], -np.expm1(np.asarray(seq(gk))))
    with pytest.raises(ValueError, match=r"g: expected shape \[B, T, H, K\] = \[3, 5, 2, 16\], got \[3, 5, 2\]"):
        mcuda.hgrn2(seq(q), seq(v), seq(t["g"]))
    with pytest.raises(ValueError, match=r"g: expected log-space decay"):
        mcuda.hgrn2(seq(q), seq(v), on_gpu(-np.asarray(seq(gk))))


def test_retnet_and_lightning_steps_pass_their_log_gates_per_sequence_and_head(fake_cupy):
    t = token()
    gamma = on_gpu(np.array([0.5, 0.25], np.float32))
    mcuda.retnet_step(t["q"], t["k"], t["v"], gamma=gamma)
    mcuda.lightning_step(t["q"], t["k"], t["v"], slope=on_gpu(np.array([0.5, 2.0], np.float32)))
    retnet, lightning = fake_cupy
    np.testing.assert_allclose(np.asarray(retnet["g"]), np.log([[0.5, 0.25]] * 3), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(lightning["g"]), [[-0.5, -2.0]] * 3)
    assert retnet["g"].shape == (3, 2) and retnet["g"].flags.c_contiguous


def test_mamba2_step_maps_onto_the_linear_step(fake_cupy):
    rng = np.random.default_rng(1)
    x, B, C = (on_gpu(rng.standard_normal(s).astype(np.float32)) for s in ((3, 2, 8), (3, 2, 16), (3, 2, 16)))
    dt = on_gpu(rng.uniform(0.01, 0.5, (3, 2)).astype(np.float32))
    A = on_gpu(-rng.uniform(0.5, 2, 2).astype(np.float32))
    pool = on_gpu(rng.standard_normal((5, 2, 16, 8)).astype(np.float32))
    slots = on_gpu(np.array([4, 0, 2], np.int64))
    assert mcuda.mamba2_step(x, dt, A, B, C, state=pool, state_indices=slots)[0] == "launched"
    (call,) = fake_cupy
    assert call["sizes"] == {"N": 3, "H": 2, "K": 16, "V": 8} and call["scale"] == 1.0 and call["gate"] == "scalar"
    np.testing.assert_allclose(np.asarray(call["g"]), np.asarray(dt) * np.asarray(A))
    with pytest.raises(ValueError, match=r"state: expected shape \[S, H, N, P\] = \[S, 2, 16, 8\], got \[5, 2, 8, 16\]"):
        mcuda.mamba2_step(x, dt, A, B, C, state=on_gpu(np.zeros((5, 2, 8, 16), np.float32)), state_indices=slots)
    with pytest.raises(ValueError, match=re.escape("(state is [S, H, N, P], S = 5), got min 0, max 5")):
        mcuda.mamba2_step(x, dt, A, B, C, state=pool, state_indices=on_gpu(np.array([5, 0, 2], np.int64)))
    with pytest.raises(ValueError, match=r"dt: expected step sizes dt >= 0"):
        mcuda.mamba2_step(x, on_gpu(-np.asarray(dt)), A, B, C)
    with pytest.raises(TypeError, match=r"B: expected the dtype of x \(float32\), got uint16"):
        mcuda.mamba2_step(x, dt, A, on_gpu(np.zeros((3, 2, 16), np.uint16)), C)


# ---- bad input names the argument, before any launch -----------------------------------------------------
@pytest.mark.parametrize("case, error, message", [
    ("q float64", TypeError, r"q: expected float32 or bfloat16 .*got float64"),
    ("q numpy", TypeError, r"q: expected a CuPy array on the GPU, got numpy.ndarray"),
    ("v short", ValueError, r"v: expected shape \[N, H, V\] = \[3, 2, V\], got \[2, 2, 8\]"),
    ("g per channel", ValueError, r"g: expected shape \[N, H\] = \[3, 2\], got \[3, 2, 16\]"),
    ("beta bf16", TypeError, r"beta: expected float32 \(gates, beta and states are kept in float32\), got uint16"),
    ("state layout", ValueError, r"state: expected shape \[N, H, K, V\] = \[3, 2, 16, 8\], got \[3, 2, 8, 16\]"),
    ("pool layout", ValueError, r"state: expected shape \[P, H, K, V\] = \[P, 2, 16, 8\], got \[5, 2, 8, 16\]"),
    ("indices float", TypeError, r"state_indices: expected int32 or int64 \(rows of the state pool\), got float32"),
    ("indices short", ValueError, r"state_indices: expected shape \[N\] = \[3\], got \[2\]"),
    ("indices strided", ValueError, r"state_indices: expected a C-contiguous array"),
    ("indices other device", ValueError, r"state_indices: expected an array on the current device 0, got one on "
                                         r"device 1"),
    ("indices numpy", TypeError, r"state_indices: expected a CuPy integer array on the GPU, got numpy.ndarray"),
    ("indices without a pool", TypeError, r"state: expected the pool \[P, H, K, V\] that state_indices index, got None"),
    ("out dtype", TypeError, r"out: expected the dtype of v \(float32\), got uint16"),
    ("out shape", ValueError, r"out: expected shape \[N, H, V\] = \[3, 2, 8\], got \[3, 8\]"),
    ("in_place", TypeError, r"in_place: expected True or False, got 1"),
    ("normalize_qk", TypeError, r"normalize_qk: expected True or False, got 'yes'"),
    ("scale", TypeError, r"scale: expected a finite real number"),
])
def test_bad_step_inputs_name_the_argument(fake_cupy, case, error, message):
    t = token()
    args = dict(q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"])
    kwargs = dict(state=t["pool"][:3])
    if case == "q float64":
        args["q"] = on_gpu(np.asarray(t["q"], np.float64))
    elif case == "q numpy":
        args["q"] = np.asarray(t["q"])
    elif case == "v short":
        args["v"] = t["v"][:2]
    elif case == "g per channel":
        args["g"] = t["gk"]
    elif case == "beta bf16":
        args["beta"] = on_gpu(np.zeros((3, 2), np.uint16))
    elif case == "state layout":
        kwargs["state"] = on_gpu(np.zeros((3, 2, 8, 16), np.float32))
    elif case == "pool layout":
        kwargs.update(state=on_gpu(np.zeros((5, 2, 8, 16), np.float32)), state_indices=t["indices"])
    elif case == "indices float":
        kwargs.update(state=t["pool"], state_indices=on_gpu(np.asarray(t["indices"], np.float32)))
    elif case == "indices short":
        kwargs.update(state=t["pool"], state_indices=t["indices"][:2])
    elif case == "indices strided":
        kwargs.update(state=t["pool"], state_indices=on_gpu(np.arange(6, dtype=np.int32))[::2])
    elif case == "indices other device":
        kwargs.update(state=t["pool"], state_indices=on_gpu(t["indices"], device=1))
    elif case == "indices numpy":
        kwargs.update(state=t["pool"], state_indices=np.asarray(t["indices"]))
    elif case == "indices without a pool":
        kwargs.update(state=None, state_indices=t["indices"])
    elif case == "out dtype":
        kwargs["out"] = on_gpu(np.zeros((3, 2, 8), np.uint16))
    elif case == "out shape":
        kwargs["out"] = on_gpu(np.zeros((3, 8), np.float32))
    elif case == "in_place":
        kwargs["in_place"] = 1
    elif case == "normalize_qk":
        kwargs["normalize_qk"] = "yes"
    elif case == "scale":
        kwargs["scale"] = "big"
    with pytest.raises(error, match=message):
        mcuda.gated_deltanet_step(*args.values(), check_values=False, **kwargs)
    assert not fake_cupy, "nothing may launch after a failed check"


def test_a_step_with_no_key_channels_is_named_before_the_default_scale(fake_cupy):
    t = token()
    empty = on_gpu(np.zeros((3, 2, 0), np.float32))
    with pytest.raises(ValueError, match=re.escape("q: expected K >= 1, got K = 0")):
        mcuda.simple_gla_step(empty, empty, t["v"], t["g"])
    assert not fake_cupy


def test_gated_steps_refuse_g_none(fake_cupy):
    """The decode kernel reads g = None as no decay: a gated mixer's step names the missing gate instead."""
    t = token()
    q, k, v, beta = (t[n] for n in ("q", "k", "v", "beta"))
    for mixer, args, dims in [("simple_gla", (q, k, v, None), "N, H"), ("gated_deltanet", (q, k, v, None, beta), "N, H"),
                              ("gla", (q, k, v, None), "N, H, K"), ("kda", (q, k, v, None, beta), "N, H, K")]:
        with pytest.raises(TypeError, match=re.escape(f"g: expected a CuPy array [{dims}], got None")):
            mcuda.STEPS[mixer](*args)
    assert not fake_cupy


def test_per_channel_steps_want_a_gate_per_key_channel(fake_cupy):
    t = token()
    with pytest.raises(ValueError, match=r"g: expected shape \[N, H, K\] = \[3, 2, 16\], got \[3, 2\]"):
        mcuda.kda_step(t["q"], t["k"], t["v"], t["g"], t["beta"])
    with pytest.raises(ValueError, match=r"g: expected shape \[N, H, K\] = \[3, 2, 16\], got \[3, 2\]"):
        mcuda.gla_step(t["q"], t["k"], t["v"], t["g"])
    assert not fake_cupy


# ---- value checks ----------------------------------------------------------------------------------------
def test_value_checks_run_before_the_launch(fake_cupy):
    t = token()
    q, k, v, g, beta = (t[n] for n in ("q", "k", "v", "g", "beta"))
    with pytest.raises(ValueError, match=r"g: expected log-space decay g <= 0"):
        mcuda.gated_deltanet_step(q, k, v, on_gpu(-np.asarray(g)), beta)
    with pytest.raises(ValueError, match=r"g: expected finite values"):
        mcuda.gla_step(q, k, v, on_gpu(np.full((3, 2, 16), np.nan, np.float32)))
    with pytest.raises(ValueError, match=r"beta: expected values in \[0, 1\]"):
        mcuda.gated_deltanet_step(q, k, v, g, on_gpu(np.asarray(beta) + 1.5))
    with pytest.raises(ValueError, match=r"beta: expected values in \[0, 2\]"):
        mcuda.deltanet_step(q, k, v, on_gpu(np.asarray(beta) + 2.5), allow_neg_eigval=True)
    assert not fake_cupy
    # unchecked, the same calls launch
    mcuda.gated_deltanet_step(q, k, v, on_gpu(-np.asarray(g)), on_gpu(np.asarray(beta) + 1.5), check_values=False)
    assert len(fake_cupy) == 1


def test_state_indices_inside_the_pool_and_distinct_in_place(fake_cupy):
    t = token(P=5)
    q, k, v, g = (t[n] for n in ("q", "k", "v", "g"))
    for bad, shown in (([0, 5, 1], "max 5"), ([0, -1, 1], "min -1")):
        with pytest.raises(ValueError, match=rf"state_indices: expected rows of the state pool, in \[0, 5\) .*{shown}"):
            mcuda.simple_gla_step(q, k, v, g, state=t["pool"], state_indices=on_gpu(np.array(bad, np.int64)))
    twice = on_gpu(np.array([3, 1, 3], np.int32))
    with pytest.raises(ValueError, match=r"state_indices: expected distinct rows in place .*got row 3 more than once"):
        mcuda.simple_gla_step(q, k, v, g, state=t["pool"], state_indices=twice)
    assert not fake_cupy
    # a fork: out of place, two sequences may read one state
    mcuda.simple_gla_step(q, k, v, g, state=t["pool"], state_indices=twice, in_place=False)
    (call,) = fake_cupy
    assert not call["in_place"] and call["state_indices"] is twice
    # unchecked, the kernel's own guard answers for a bad row (NaN outputs, no write): the launch happens
    mcuda.simple_gla_step(q, k, v, g, state=t["pool"], state_indices=on_gpu(np.array([0, 9, 1], np.int32)),
                          check_values=False)
    assert len(fake_cupy) == 2


def test_keys_too_long_for_beta_are_refused_naming_k_and_beta(fake_cupy):
    t = token()
    q, v, g, beta = (t[n] for n in ("q", "v", "g", "beta"))
    long_keys = on_gpu(3.0 * np.asarray(t["k"]))
    full = on_gpu(np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 1 \(allow_neg_eigval=False; \+1e-05 "
                                         r"for float32 rounding\) .*eigenvalues in \[0, 1\]: L2-normalize the keys, "
                                         r"or pass normalize_qk=True .*got beta \|k\|\^2 = 9 at index \(\d, \d\)"):
        mcuda.gated_deltanet_step(q, long_keys, v, g, full)
    with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 2 .*eigenvalues in \[-1, 1\].* = 18 "):
        mcuda.deltanet_step(q, long_keys, v, on_gpu(2 * np.ones((3, 2), np.float32)), allow_neg_eigval=True)
    with pytest.raises(ValueError, match=r"k, beta"):
        mcuda.kda_step(q, long_keys, v, t["gk"], full)
    assert not fake_cupy
    mcuda.gated_deltanet_step(q, long_keys, v, g, full, normalize_qk=True)  # normalized in the kernel: |k| < 1
    mcuda.deltanet_step(q, t["k"], v, on_gpu(2 * np.ones((3, 2), np.float32)), allow_neg_eigval=True)
    assert [c["normalize_qk"] for c in fake_cupy] == [True, False]


def float32_to_bf16_bits(x):
    """Round to nearest even, as minilin.cuda.to_bf16 does on the GPU."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def test_the_key_check_leaves_room_for_bf16_rounding_and_no_more():
    rng = np.random.default_rng(3)
    k = unit(rng.standard_normal((64, 4, 128)))
    bits = float32_to_bf16_bits(k)
    rounded = bf16.as_float32(bits).astype(np.float64)
    norms = (rounded ** 2).sum(-1)
    assert norms.max() > 1.0  # rounded unit keys do exceed 1 ...
    front.check_key_strength(bits, np.ones(norms.shape, np.float32), False)  # ... and pass
    front.check_key_strength(k.astype(np.float32), np.ones(norms.shape, np.float32), False)
    longer = float32_to_bf16_bits(k * np.sqrt(1 + 2 ** -5))  # 3% too long: more than rounding explains
    with pytest.raises(ValueError, match=r"k, beta: .*\+0.015625 for bfloat16 rounding"):
        front.check_key_strength(longer, np.ones(norms.shape, np.float32), False)
    with pytest.raises(ValueError, match=r"got beta \|k\|\^2 = nan"):
        front.check_key_strength(np.full((2, 3, 4), np.nan, np.float32), np.ones((2, 3), np.float32), False)


def test_bf16_bits_widen_exactly():
    x = np.array([1.0, -2.5, 3.140625, 1e-30, np.inf], np.float32)
    bits = float32_to_bf16_bits(x)
    np.testing.assert_array_equal(bf16.as_float32(bits), [1.0, -2.5, 3.140625, np.float32(1e-30).view(np.uint32)
                                                          .__and__(0xFFFF0000).view(np.float32), np.inf])
    assert bf16.as_float32(x) is x


# ---- the forward's delta front: (g, beta), normalize_qk, the key check -----------------------------------
def forward_inputs(B=2, T=5, H=3, K=16, V=8, seed=0):
    rng = np.random.default_rng(seed)
    q = on_gpu(rng.standard_normal((B, T, H, K)).astype(np.float32))
    k = on_gpu(unit(rng.standard_normal((B, T, H, K))).astype(np.float32))
    v = on_gpu(rng.standard_normal((B, T, H, V)).astype(np.float32))
    g = on_gpu(-rng.uniform(0.01, 1, (B, T, H)).astype(np.float32))
    beta = on_gpu(rng.uniform(0, 1, (B, T, H)).astype(np.float32))
    return q, k, v, g, beta


def _with_nan(x):
    y = np.array(x)
    y.flat[y.size // 2] = np.nan
    return on_gpu(y)


def test_a_nan_in_any_input_is_named_before_the_launch(fake_cupy):
    """check_values checks q, k, v and the initial state as the NumPy forms do, not only the gates: forward,
    backward and step, float32 and bfloat16 bits (an exponent of all ones)."""
    q, k, v, g, beta = forward_inputs()
    h0 = on_gpu(np.zeros((2, 3, 16, 8), np.float32))
    inputs = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0)
    for name in inputs:
        bad = {**inputs, name: _with_nan(inputs[name])}
        with pytest.raises(ValueError, match=rf"^{name}: expected finite values"):
            front.delta_rule(bad["q"], bad["k"], bad["v"], bad["g"], bad["beta"], initial_state=bad["initial_state"])
        if name != "beta":
            with pytest.raises(ValueError, match=rf"^{name}: expected finite values"):
                front.gated_linear(bad["q"], bad["k"], bad["v"], bad["g"], initial_state=bad["initial_state"])
    do = on_gpu(np.ones(v.shape, np.float32))
    with pytest.raises(ValueError, match=r"^v: expected finite values"):
        mcuda.gated_deltanet_backward(q, k, _with_nan(v), g, beta, do=do)
    with pytest.raises(ValueError, match=r"^do: expected finite values"):
        mcuda.simple_gla_backward(q, k, v, g, do=_with_nan(do))
    bits = [on_gpu(np.asarray(x).view(np.uint32) >> 16).astype(np.uint16) for x in (q, k, v)]  # bf16 bits
    inf_key = np.array(bits[1])
    inf_key.flat[7] = 0x7F80  # +inf in bfloat16
    front.gated_linear(*bits, g)  # finite bits pass
    with pytest.raises(ValueError, match=r"^k: expected finite values"):
        front.gated_linear(bits[0], on_gpu(inf_key), bits[2], g)
    assert len(fake_cupy) == 1
    t = token()
    pool = np.array(t["pool"])
    unused = sorted(set(range(pool.shape[0])) - set(np.asarray(t["indices"]).tolist()))[0]
    pool[unused] = np.nan  # a row no sequence reads: not checked
    mcuda.simple_gla_step(t["q"], t["k"], t["v"], t["g"], state=on_gpu(pool), state_indices=t["indices"])
    pool[int(np.asarray(t["indices"])[1])] = np.nan
    with pytest.raises(ValueError, match=r"^state: expected finite values"):
        mcuda.simple_gla_step(t["q"], t["k"], t["v"], t["g"], state=on_gpu(pool), state_indices=t["indices"])


def test_delta_rule_takes_g_before_beta(fake_cupy):
    q, k, v, g, beta = forward_inputs()
    front.delta_rule(q, k, v, g, beta)
    mcuda.gated_deltanet(q, k, v, g, beta)
    mcuda.deltanet(q, k, v, beta)
    first, second, third = fake_cupy
    assert first["g"] is g and first["beta"] is beta and second["g"] is g and second["beta"] is beta
    assert third["g"] is None and third["beta"] is beta
    with pytest.raises(ValueError, match=r"beta: expected shape \[B, T, HV\] = \[2, 5, 3\], got \[2, 5, 3, 16\]"):
        front.delta_rule(q, k, v, g, k)  # beta and g swapped: a shape error, not a silent swap


def test_channel_fronts_launch_their_ops_and_require_a_key_channel_gate(fake_cupy):
    q, k, v, g, beta = forward_inputs()
    g_channel = on_gpu(-np.random.default_rng(1).uniform(0.01, 1, (2, 5, 3, 16)).astype(np.float32))
    front.channel_gated_linear(q, k, v, g_channel)
    front.channel_delta_rule(q, k, v, g_channel, beta)
    gla, kda = fake_cupy
    assert gla["op"] == "gla" and gla["g"] is g_channel and gla["beta"] is None
    assert kda["op"] == "kda" and kda["g"] is g_channel and kda["beta"] is beta
    for call in (lambda gate: front.channel_gated_linear(q, k, v, gate),
                 lambda gate: front.channel_delta_rule(q, k, v, gate, beta)):
        with pytest.raises(ValueError, match=r"g: expected shape \[B, T, HV, K\] = \[2, 5, 3, 16\], got \[2, 5, 3\]"):
            call(g)
        with pytest.raises(TypeError, match=re.escape("g: expected a CuPy array [B, T, HV, K], got None")):
            call(None)
        with pytest.raises(ValueError, match=r"g: expected log-space"):
            call(on_gpu(-np.asarray(g_channel)))
    assert len(fake_cupy) == 2


def test_forward_normalize_qk_and_key_check(fake_cupy):
    q, k, v, g, beta = forward_inputs()
    long_keys = on_gpu(4.0 * np.asarray(k))
    with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 1"):
        mcuda.gated_deltanet(q, long_keys, v, g, on_gpu(np.ones((2, 5, 3), np.float32)))
    assert not fake_cupy
    mcuda.gated_deltanet(3.0 * q, long_keys, v, g, beta, normalize_qk=True)
    (call,) = fake_cupy
    q64, k64 = (np.asarray(x, np.float64) for x in (3.0 * q, long_keys))
    expected_q, expected_k = l2_normalize(q64), l2_normalize(k64)
    np.testing.assert_allclose(np.asarray(call["q"]), expected_q, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(call["k"]), expected_k, rtol=1e-6)
    assert call["q"].dtype == np.float32
    with pytest.raises(TypeError, match=r"normalize_qk: expected True or False"):
        mcuda.deltanet(q, k, v, beta, normalize_qk=None)


# ---- the front's call into the extension, end to end on the CPU ------------------------------------------
# The fake arrays live in host memory, so a stand-in for minilin._cuda.decode can read and write them through the
# raw addresses the front passes, as the kernel does: it follows the DecodeProblem contract of csrc/minilin_cuda.h
# (in float64), and the results must equal the NumPy step. What this proves is the plumbing (argument order, which
# array is read and which written, pool sizes, index width, gate and dtype codes, scale, normalize_qk); the kernel
# itself is proved on the GPU (tests/test_cuda_decode.py).
import ctypes

CTYPES = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.uint16): ctypes.c_uint16,
          np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64}


def at(address, shape, dtype):
    """The host array of `shape` and `dtype` at `address` (shared memory, not a copy)."""
    pointer = ctypes.cast(address, ctypes.POINTER(CTYPES[np.dtype(dtype)]))
    return np.ctypeslib.as_array(pointer, shape=tuple(shape))


def contract_decode(version, q, k, v, g, gate, beta, state_in, in_indices, pool_in, state_out, out_indices, pool_out,
                    indices_int64, o, N, H, K, V, scale, delta, normalize_qk, dtype, stream):
    elem = np.float32 if dtype == 0 else np.uint16
    widen = (lambda x: x.astype(np.float64)) if dtype == 0 else (lambda x: bf16.as_float32(x).astype(np.float64))
    qh, kh, vh = widen(at(q, (N, H, K), elem)), widen(at(k, (N, H, K), elem)), widen(at(v, (N, H, V), elem))
    if normalize_qk:
        qh = qh / np.sqrt((qh * qh).sum(-1, keepdims=True) + L2_NORM_EPS)  # the kernel's kNormEps
        kh = kh / np.sqrt((kh * kh).sum(-1, keepdims=True) + L2_NORM_EPS)
    a = np.ones((N, H, K))
    if gate == 1:
        a = np.exp(at(g, (N, H), np.float32).astype(np.float64))[..., None] * a
    elif gate == 2:
        a = np.exp(at(g, (N, H, K), np.float32).astype(np.float64))
    index = np.int64 if indices_int64 else np.int32
    src = at(in_indices, (N,), index) if in_indices else np.arange(N)
    dst = at(out_indices, (N,), index) if out_indices else np.arange(N)
    S = at(state_in, (pool_in, H, K, V), np.float32)[src].astype(np.float64) if state_in else np.zeros((N, H, K, V))
    S = a[..., None] * S
    u = vh
    if delta:
        u = at(beta, (N, H), np.float32)[..., None] * (vh - np.einsum("nhk,nhkv->nhv", kh, S))
    S = S + kh[..., None] * u[..., None, :]
    out = np.einsum("nhk,nhkv->nhv", scale * qh, S)
    at(state_out, (pool_out, H, K, V), np.float32)[dst] = S
    out_view = at(o, (N, H, V), elem)
    out_view[...] = out if dtype == 0 else float32_to_bf16_bits(out.astype(np.float32))


class HostDeviceArray(FakeDeviceArray):
    """A fake GPU array whose `.data.ptr` is its host address, as CuPy's is its device address."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


HostDeviceArray.__module__ = "cupy"


def on_host_gpu(x):
    return np.ascontiguousarray(x).view(HostDeviceArray)


@pytest.fixture
def host_extension(monkeypatch):
    """The fake `cupy` of fake_cupy's kind, but with HostDeviceArray results and the launch kept: the extension is
    contract_decode, the GPU a compute capability 9.0 one."""
    module = types.ModuleType("cupy")
    module.ndarray = HostDeviceArray

    def on_device(name):
        function = getattr(np, name)
        if not callable(function) or isinstance(function, type):
            return function
        return lambda *args, **kwargs: _as_host_gpu(function(*args, **kwargs))

    module.__getattr__ = on_device
    module.cuda = types.SimpleNamespace(Device=FakeDevice, get_current_stream=lambda: types.SimpleNamespace(ptr=0))
    monkeypatch.setitem(sys.modules, "cupy", module)
    bf16.native_dtype.cache_clear()
    ladder = ({"op": "decode", "version": 1, "name": "register_tiles", "float32": True, "bfloat16": True,
               "min_compute_capability": 80, "max_compute_capability": 0, **TOKEN_LOOP_SHAPE},)
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    monkeypatch.setattr(front, "_compute_capability", lambda device: 90)
    monkeypatch.setattr(decode, "extension", lambda: types.SimpleNamespace(decode=contract_decode))
    yield
    bf16.native_dtype.cache_clear()


def _as_host_gpu(result):
    return result.view(HostDeviceArray) if isinstance(result, np.ndarray) and result.ndim else result


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mixer", ["linear_attention", "simple_gla", "gla", "deltanet", "gated_deltanet", "kda",
                                   "retnet", "lightning", "mamba2"])
def test_the_front_hands_the_extension_what_the_numpy_step_computes(host_extension, mixer, dtype):
    from minilin import catalog

    if dtype == "bfloat16" and mixer == "mamba2":
        pytest.skip("Mamba-2's mapping rounds dt x to bf16 with minilin.cuda.to_bf16, a CuPy kernel")
    N, H, K, V, P = 3, 2, 16, 8, 6
    args, _ = catalog.module(mixer).example_inputs(N, 1, H, K, V, seed=4)
    args = [a[:, 0] if a.ndim >= 3 else a for a in args]
    if mixer in ("deltanet", "gated_deltanet", "kda"):  # keys that stay within |k| <= 1 once rounded to bf16
        args[1] = args[1] * bf16.UNIT_KEY_SCALE
    sequence = (0, 3, 4) if mixer == "mamba2" else (0, 1, 2)
    gpu_args, host = [], []
    for i, a in enumerate(args):
        x = a.astype(np.float32)
        if dtype == "bfloat16" and i in sequence:
            bits = float32_to_bf16_bits(x)
            gpu_args.append(on_host_gpu(bits))
            host.append(bf16.as_float32(bits).astype(np.float64))
        else:
            gpu_args.append(on_host_gpu(x))
            host.append(x.astype(np.float64))
    pool0 = np.random.default_rng(5).standard_normal((P, H, K, V)).astype(np.float32)
    rows = np.array([4, 0, 2])
    tol = 1e-5 if dtype == "float32" else 1e-2
    ref_o, ref_S = catalog.module(mixer).step(*host, state=pool0[rows].astype(np.float64))

    def widen(o):
        return np.asarray(bf16.as_float32(np.asarray(o)), np.float64)

    for index_dtype in (np.int32, np.int64):  # in place on the pool
        pool = on_host_gpu(pool0.copy())
        o, new = mcuda.STEPS[mixer](*gpu_args, state=pool, state_indices=on_host_gpu(rows.astype(index_dtype)))
        assert new is pool
        assert np.abs(widen(o) - ref_o).max() <= tol * np.abs(ref_o).max()
        np.testing.assert_allclose(np.asarray(pool)[rows], ref_S, rtol=1e-5, atol=1e-5)
        others = [1, 3, 5]
        assert np.array_equal(np.asarray(pool)[others], pool0[others])
    pool = on_host_gpu(pool0.copy())  # out of place: the pool stays, new states come back in sequence order
    o, new = mcuda.STEPS[mixer](*gpu_args, state=pool, state_indices=on_host_gpu(rows.astype(np.int32)),
                                in_place=False)
    assert new is not pool and new.shape == (N, H, K, V) and np.array_equal(np.asarray(pool), pool0)
    np.testing.assert_allclose(np.asarray(new), ref_S, rtol=1e-5, atol=1e-5)
    o, new = mcuda.STEPS[mixer](*gpu_args, state=None)  # zeros
    ref_o0, ref_S0 = catalog.module(mixer).step(*host, state=None)
    np.testing.assert_allclose(np.asarray(new), ref_S0, rtol=1e-5, atol=1e-5)
    out = on_host_gpu(np.zeros(o.shape, o.dtype))
    o2, _ = mcuda.STEPS[mixer](*gpu_args, state=on_host_gpu(pool0[:3].copy()), out=out)
    assert o2 is out


def test_normalize_qk_reaches_the_extension(host_extension):
    from minilin.mixers import gated_deltanet

    rng = np.random.default_rng(6)
    q, k = (3.0 * rng.standard_normal((2, 2, 16)) for _ in range(2))
    v = rng.standard_normal((2, 2, 8))
    g, beta = -rng.uniform(0.01, 1, (2, 2)), rng.uniform(0, 1, (2, 2))
    S0 = rng.standard_normal((2, 2, 16, 8))
    o, S = mcuda.gated_deltanet_step(*(on_host_gpu(x.astype(np.float32)) for x in (q, k, v, g, beta)),
                                     state=on_host_gpu(S0.astype(np.float32)), normalize_qk=True)
    ref_o, ref_S = gated_deltanet.step(*(x.astype(np.float32).astype(np.float64) for x in (q, k, v, g, beta)),
                                       state=S0.astype(np.float32).astype(np.float64), normalize_qk=True)
    np.testing.assert_allclose(np.asarray(o), ref_o, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(S), ref_S, rtol=1e-4, atol=1e-5)
