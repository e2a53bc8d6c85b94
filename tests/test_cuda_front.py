"""minilin.cuda's checks, run anywhere: they happen before any launch and need no GPU.

A small stand-in for CuPy (arrays of NumPy data whose type lives in a module named `cupy`, on a chosen
device) lets the dtype / shape / contiguity / device checks run on a machine without CuPy or a GPU.
"""
from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest

from minilin import cuda as mcuda
from minilin.cuda import bf16, front
from conftest import TENSOR_CORE_SHAPE, TOKEN_LOOP_SHAPE

UNPATCHED_LAUNCH = front._launch  # the fixture below records launches instead; one test needs the real loop


def test_import_needs_neither_cupy_nor_the_extension():
    ok, reason = mcuda.available()
    assert isinstance(ok, bool) and (ok or reason)


def test_numpy_arrays_are_rejected_before_cupy_is_needed():
    q = np.zeros((1, 4, 1, 8), np.float32)
    with pytest.raises(TypeError, match=r"q: expected a CuPy array on the GPU, got numpy.ndarray"):
        mcuda.simple_gla(q, q, q, np.zeros((1, 4, 1), np.float32))
    with pytest.raises(TypeError, match=r"q: expected a CuPy array"):
        mcuda.gated_deltanet([1.0], q, q, None, None)


def test_to_bf16_refuses_bits_and_integers_before_anything_runs():
    """uint16 is read as bfloat16 bits everywhere else, so converting it again (16256, the bits of 1.0, as the
    number 16256.0) would be garbage; integers likewise. Both are refused before CuPy is needed."""
    with pytest.raises(TypeError, match=re.escape("to_bf16: x is already bfloat16 (uint16 bits)")):
        mcuda.to_bf16(np.array([16256], np.uint16))
    with pytest.raises(TypeError, match=re.escape("to_bf16: expected a float16, float32 or float64 array, got int64")):
        mcuda.to_bf16(np.arange(3))


def test_uint16_is_taken_as_bf16_bits():
    assert bf16.is_bf16(np.uint16) and not bf16.is_bf16(np.float16) and not bf16.is_bf16(np.float32)


# ---- a stand-in for CuPy ---------------------------------------------------------------------------------
class FakeArray:
    """Just what the checks read: dtype, shape, strides, flags, device.id, size."""

    def __init__(self, data, device=0):
        self._data = data
        self.dtype, self.shape, self.strides, self.flags, self.size = data.dtype, data.shape, data.strides, data.flags, data.size
        self.device = types.SimpleNamespace(id=device)

    def __getitem__(self, index):
        return FakeArray(self._data[index], self.device.id)


FakeArray.__module__ = "cupy"  # what minilin.backend.is_cupy_array looks at


@pytest.fixture
def fake_cupy(monkeypatch):
    module = types.ModuleType("cupy")
    module.ndarray = FakeArray
    module.float32 = np.float32
    module.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))
    monkeypatch.setitem(sys.modules, "cupy", module)
    bf16.native_dtype.cache_clear()
    launched = []
    def record(op, q, k, v, g, beta, initial_state, scale, version, cu_seqlens):  # q and k with their own heads
        launched.append((op, dict(zip("BTHK", q.shape), V=v.shape[-1])))
        return "launched"

    module.repeat = lambda x, repeats, axis: FakeArray(np.repeat(x._data, repeats, axis=axis), x.device.id)
    module.empty = lambda shape, dtype: FakeArray(np.full(shape, np.nan, dtype))
    module.concatenate = lambda parts, axis: FakeArray(np.concatenate([p._data for p in parts], axis=axis))
    monkeypatch.setattr(front, "_launch", record)
    yield launched
    bf16.native_dtype.cache_clear()


def arrays(B=2, T=10, H=3, K=16, V=8, dtype=np.float32):
    rng = np.random.default_rng(0)
    q, k = (FakeArray(rng.standard_normal((B, T, H, K)).astype(dtype)) for _ in range(2))
    v = FakeArray(rng.standard_normal((B, T, H, V)).astype(dtype))
    g = FakeArray(-rng.uniform(0.01, 1, (B, T, H)).astype(np.float32))
    beta = FakeArray(rng.uniform(0, 1, (B, T, H)).astype(np.float32))
    return q, k, v, g, beta


def test_valid_inputs_reach_the_launch(fake_cupy):
    q, k, v, g, beta = arrays()
    assert front.gated_linear(q, k, v, g, check_values=False) == "launched"
    assert front.delta_rule(q, k, v, g, beta, check_values=False) == "launched"
    assert fake_cupy[0] == ("linear", {"B": 2, "T": 10, "H": 3, "K": 16, "V": 8})
    bits = [FakeArray(x._data.view(np.uint16)[..., ::2].copy()) for x in (q, k, v)]  # any uint16: bf16 bits
    assert front.gated_linear(*bits, g, check_values=False) == "launched"


@pytest.mark.parametrize("case, error, message", [
    ("q float64", TypeError, r"q: expected float32 or bfloat16 .*got float64"),
    ("k other dtype", TypeError, r"k: expected the dtype of q \(float32\), got uint16"),
    ("g bf16 bits", TypeError, r"g: expected float32 \(gates, beta and states are kept in float32\), got uint16"),
    ("v short", ValueError, r"v: expected shape \[B, T, HV, V\] = \[2, 10, HV, V\], got \[2, 9, 3, 8\]"),
    ("beta rank", ValueError, r"beta: expected shape \[B, T, HV\] = \[2, 10, 3\], got \[2, 10\]"),
    ("q strided", ValueError, r"q: expected a C-contiguous array"),
    ("k other device", ValueError, r"k: expected an array on the current device 0, got one on device 1"),
    ("state shape", ValueError, r"initial_state: expected shape \[B, HV, K, V\] = \[2, 3, 16, 8\], got \[2, 3, 8, 16\]"),
    ("empty sequence", ValueError, r"q: expected at least one token"),
    ("scale", TypeError, r"scale: expected a finite real number"),
    ("allow_neg_eigval", TypeError, r"allow_neg_eigval: expected True or False"),
])
def test_bad_inputs_name_the_argument(fake_cupy, case, error, message):
    q, k, v, g, beta = arrays()
    kwargs = {}
    if case == "q float64":
        q = FakeArray(q._data.astype(np.float64))
    elif case == "k other dtype":
        k = FakeArray(k._data.view(np.uint16)[..., ::2].copy())
    elif case == "g bf16 bits":
        g = FakeArray(np.zeros(g.shape, np.uint16))
    elif case == "v short":
        v = v[:, :9]
    elif case == "beta rank":
        beta = beta[:, :, 0]
    elif case == "q strided":
        q = FakeArray(np.concatenate([q._data, q._data], axis=1))[:, ::2]
    elif case == "k other device":
        k = FakeArray(k._data, device=1)
    elif case == "state shape":
        kwargs["initial_state"] = FakeArray(np.zeros((2, 3, 8, 16), np.float32))
    elif case == "empty sequence":
        q, k, v, g, beta = arrays(T=0)
    elif case == "scale":
        kwargs["scale"] = "big"
    elif case == "allow_neg_eigval":
        kwargs["allow_neg_eigval"] = "yes"
    with pytest.raises(error, match=message):
        front.delta_rule(q, k, v, g, beta, check_values=False, **kwargs)
    assert not fake_cupy, "nothing may launch after a failed check"


@pytest.mark.parametrize("dims, message", [((2, 10, 0, 16, 8), "q: expected H >= 1, got H = 0"),
                                           ((2, 10, 3, 0, 8), "q: expected K >= 1, got K = 0"),
                                           ((2, 10, 3, 16, 0), "v: expected V >= 1, got V = 0"),
                                           ((0, 10, 3, 16, 8), "q: expected B >= 1, got B = 0")])
def test_empty_dimensions_are_named_before_any_division(fake_cupy, dims, message):
    """H = 0 would divide HV by zero, K = 0 the default scale K ** -0.5."""
    q, k, v, g, beta = arrays(*dims)
    for call in (lambda: mcuda.simple_gla(q, k, v, g), lambda: mcuda.gated_deltanet(q, k, v, g, beta)):
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    assert not fake_cupy


def test_a_gated_mixer_refuses_g_none_rather_than_running_the_ungated_one(fake_cupy):
    """The ops read g = None as no decay (linear attention, DeltaNet); simple GLA and Gated DeltaNet require their
    gate, forward and backward, and GLA and KDA say None plainly."""
    q, k, v, g, beta = arrays()
    do = FakeArray(np.ones(v.shape, np.float32))
    calls = [lambda: mcuda.simple_gla(q, k, v, None), lambda: mcuda.gated_deltanet(q, k, v, None, beta),
             lambda: mcuda.simple_gla_backward(q, k, v, None, do=do),
             lambda: mcuda.gated_deltanet_backward(q, k, v, None, beta, do=do)]
    for call in calls:
        with pytest.raises(TypeError, match=re.escape("g: expected a CuPy array [B, T, HV], got None")):
            call()
    for call in (lambda: mcuda.gla(q, k, v, None), lambda: mcuda.kda(q, k, v, None, beta)):
        with pytest.raises(TypeError, match=re.escape("g: expected a CuPy array [B, T, HV, K], got None")):
            call()
    assert not fake_cupy, "nothing may launch after a failed check"


def test_the_default_version_is_the_last_one_this_gpu_runs(monkeypatch):
    ladder = ({"op": "linear", "version": 1, "name": "recurrent", "float32": True, "bfloat16": True,
               "min_compute_capability": 80, **TOKEN_LOOP_SHAPE},
              {"op": "linear", "version": 2, "name": "hopper_only", "float32": False, "bfloat16": True,
               "min_compute_capability": 90, **TENSOR_CORE_SHAPE})
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    assert front._version_info("linear", None, True, 90)["version"] == 2
    assert front._version_info("linear", None, True, 80)["version"] == 1  # an A100 falls back to what it runs
    assert front._version_info("linear", None, False, 90)["version"] == 1
    assert front._version_info("linear", 2, True, 80)["version"] == 2  # asked for by number: _launch refuses it
    with pytest.raises(RuntimeError, match=r"version: no linear version runs on compute capability 7.5"):
        front._version_info("linear", None, True, 75)
    monkeypatch.setattr(front, "_compute_capability", lambda device: 80)
    monkeypatch.setattr(front, "cupy_module", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))))
    assert front.default_version("linear") == 1 and front.default_version("linear", False) == 1


def test_the_default_passes_over_a_rung_measured_slower(monkeypatch):
    """kda's ladder: v2 (the WY form on CUDA cores) measured slower than v1, so version=None never picks it; the last
    tensor-core rung is the default where it runs and takes the shape, at K = 64 too (there v4, and v5 with its
    prepare, are passed over: a ladder that ends at v5 falls back to v3); v1 where no tensor-core rung runs."""
    ladder = ({"op": "kda", "version": 1, "name": "recurrent", "float32": True, "bfloat16": True,
               "min_compute_capability": 80, **TOKEN_LOOP_SHAPE},
              {"op": "kda", "version": 2, "name": "chunked", "float32": True, "bfloat16": True,
               "min_compute_capability": 80, **TOKEN_LOOP_SHAPE},
              *({"op": "kda", "version": n, "name": name, "float32": False, "bfloat16": True,
                 "min_compute_capability": 90, **TENSOR_CORE_SHAPE}
                for n, name in ((3, "prepared_chunks"), (4, "sliced_prepare"), (5, "narrow_value_blocks"),
                                (6, "half_sub_chunks"))))
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    assert front.SLOWER_RUNGS[("kda", True)][2] is None and front.SLOWER_RUNGS[("kda", False)][2] is None
    assert front._version_info("kda", None, True, 90)["version"] == 6  # K not known: the K = 128 measurement
    assert front._version_info("kda", None, True, 90, 128, 128)["version"] == 6
    assert front._version_info("kda", None, True, 90, 64, 64)["version"] == 6  # v6 measured faster than v3 there
    monkeypatch.setattr(front, "_built_versions", lambda: ladder[:-1])
    assert front._version_info("kda", None, True, 90, 64, 64)["version"] == 3  # v4, v5 passed over at K = 64 only
    assert front._version_info("kda", None, True, 90, 128, 128)["version"] == 5
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    assert front._version_info("kda", None, True, 90, 256, 128)["version"] == 1  # v3, v4 take K 64 or 128 only
    assert front._version_info("kda", None, True, 80)["version"] == 1  # v3, v4 do not run: v1, not the slower v2
    assert front._version_info("kda", None, True, 80, 64, 64)["version"] == 1
    assert front._version_info("kda", None, False, 90)["version"] == 1  # v3, v4 are bf16 only
    assert front._version_info("kda", 2, True, 90)["version"] == 2  # still callable by number
    assert front._version_info("kda", 4, True, 90, 64, 64)["version"] == 4
    assert front._version_info("kda", 5, True, 90, 64, 64)["version"] == 5


def three_rung_ladder(op: str) -> tuple:
    """A stand-in build of `op`: the token loop v1, the CUDA-core chunked v2 (K <= 128) and a tensor-core v3."""
    return ({"op": op, "version": 1, "name": "recurrent", "float32": True, "bfloat16": True,
             "min_compute_capability": 80, **TOKEN_LOOP_SHAPE},
            {"op": op, "version": 2, "name": "chunked", "float32": True, "bfloat16": True,
             "min_compute_capability": 80, "max_k": 128, "keys": None, "value_multiple": 8},
            {"op": op, "version": 3, "name": "chunked_mma", "float32": False, "bfloat16": True,
             "min_compute_capability": 80, **TENSOR_CORE_SHAPE})


def test_the_default_version_is_the_last_one_that_takes_the_shape(monkeypatch):
    """version=None with K and V: the last rung whose shape rule takes them (a chunked CUDA-core rung takes
    K <= 128, the tensor-core one K = 64 or 128 and V a multiple of 64), the last rung when none does (its checks
    then say why); a version asked for by number is kept."""
    ladder = three_rung_ladder("delta")
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    chosen = lambda bf, K, V, version=None: front._version_info("delta", version, bf, 90, K, V)["version"]  # noqa: E731
    assert [chosen(True, K, V) for K, V in [(64, 64), (128, 192), (96, 64), (128, 96), (256, 64), (32, 256)]] == \
        [3, 3, 2, 2, 1, 2]
    assert [chosen(False, K, V) for K, V in [(64, 64), (256, 128)]] == [2, 1]
    assert chosen(True, 512, 64) == 3  # nothing takes K = 512: the last rung, whose checks refuse it
    assert chosen(True, 256, 64, version=3) == 3
    assert front._version_info("delta", None, True, 90)["version"] == 3  # no shape given: the last rung
    assert [chosen(True, K, None) for K in (64, 96, 256)] == [3, 2, 1]  # K alone: its rule on the key width
    assert front.takes_shape(ladder[2], 128, 64) and not front.takes_shape(ladder[2], 128, 32)
    with pytest.raises(ValueError, match=re.escape("op: expected one of ['delta'], got 'nonsense'")):
        front._version_info("nonsense", None, True, 90)


def test_gla_passes_over_its_cuda_core_v2_in_both_dtypes(monkeypatch):
    """gla v2 (chunked on CUDA cores) measured 5x slower than the token loop v1: where no tensor-core rung takes
    the shape (K = 32, V = 96) or runs, the default is v1 for bfloat16 as for float32."""
    ladder = three_rung_ladder("gla")
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    chosen = lambda bf, K, V: front._version_info("gla", None, bf, 90, K, V)["version"]  # noqa: E731
    assert [chosen(True, K, V) for K, V in [(128, 128), (32, 64), (64, 96)]] == [3, 1, 1]
    assert [chosen(False, K, V) for K, V in [(128, 128), (32, 64)]] == [1, 1]
    assert front._version_info("gla", 2, True, 90, 32, 64)["version"] == 2  # still callable by number


@pytest.mark.parametrize("op, version, changes, message", [
    ("linear", 9, dict(dtype=0), r"linear_v9_head_dim_256: bfloat16 inputs only"),
    ("linear", 9, dict(K=128), r"linear_v9_head_dim_256: K must be 256 \(v7 and v8 take 64 and 128\), got K=128"),
    ("linear", 9, dict(V=96), r"linear_v9_head_dim_256: V must be a multiple of 64, got V=96"),
    ("delta", 11, dict(dtype=0), r"delta_v11_head_dim_256: bfloat16 inputs only"),
    ("delta", 11, dict(K=128), r"delta_v11_head_dim_256: K must be 256 \(v3 to v10 and v12 take 64 and 128\), got K=128"),
    ("delta", 11, dict(V=96), r"delta_v11_head_dim_256: V must be a multiple of 64, got V=96"),
    ("delta", 11, {}, r"delta_v11_head_dim_256: workspace must hold \d+ bytes, got 0"),
    ("gla", 6, dict(dtype=0), r"gla_v6_head_dim_256: bfloat16 inputs only"),
    ("gla", 6, dict(K=128), r"gla_v6_head_dim_256: K must be 256 \(v3 to v5 take 64 and 128\), got K=128"),
    ("gla", 6, dict(V=96), r"gla_v6_head_dim_256: V must be a multiple of 64, got V=96"),
    ("gla", 6, dict(g=0), r"gla_v6_head_dim_256: g must be a device pointer"),
    ("gla", 6, {}, r"gla_v6_head_dim_256: needs a workspace of \d+ bytes, got 0"),
    ("kda", 10, dict(dtype=0), r"kda_v10_head_dim_256: bfloat16 inputs only"),
    ("kda", 10, dict(K=128), r"kda_v10_head_dim_256: K must be 256 \(v3 to v9 take 64 and 128\), got K=128"),
    ("kda", 10, dict(V=96), r"kda_v10_head_dim_256: V must be a multiple of 64, got V=96"),
    ("kda", 10, dict(g=0), r"kda_v10_head_dim_256: g must be a device pointer"),
    ("kda", 10, {}, r"kda_v10_head_dim_256: needs a workspace of \d+ bytes, got 0"),
])
def test_the_head_dim_256_versions_refuse_other_shapes_before_any_launch(op, version, changes, message):
    """linear v9, delta v11, gla v6 and kda v10, called by number outside their shape rule (or without their
    workspace), with fake pointers: their checks stop the call first (wherever the extension is built)."""
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    changes = dict(changes)
    g = changes.pop("g", 1 if op in ("gla", "kda") else 0)
    sizes = dict(dict(B=2, T=100, H=3, K=256, V=64, scale=1.0, dtype=1, stream=0), **changes)
    beta = 1 if op in ("delta", "kda") else 0
    with pytest.raises(ValueError, match=message):
        cuda.forward(op, version, 1, 1, 1, g, beta, 0, 1, 1, 0, 0, **sizes)


def test_versions_that_do_not_read_packed_layouts_refuse_them():
    """The extension itself refuses cu_seqlens or qk_heads for a version without `packed`, before any launch
    (fake pointers; wherever the extension is built)."""
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    unpacked = next(v for v in cuda.versions() if v["op"] == "delta" and not v["packed"])
    sizes = dict(B=2, T=100, H=4, K=64, V=64, scale=1.0, dtype=1, stream=0)
    with pytest.raises(ValueError, match=rf"delta v{unpacked['version']} reads neither packed sequences"):
        cuda.forward("delta", unpacked["version"], *([0] * 10), **sizes, cu_seqlens=1)
    with pytest.raises(ValueError, match=r"qk_heads must divide H = 4, got 3"):
        cuda.forward("delta", 1, *([0] * 10), **sizes, qk_heads=3)


def test_the_built_versions_carry_the_shape_rules_their_checks_enforce():
    # Runs wherever the extension is built, GPU or not (CI compiles it): each entry's rule is what its file's
    # checks take (the token loops K <= 256, the chunked CUDA-core versions K <= 128, every bf16-only version the
    # tensor-core shape, K = 64 or 128, but linear v9, delta v11, gla v6 and kda v10, K = 256), so that version=None at K = 256 or
    # K = 96 runs a rung that takes it.
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    for v in cuda.versions():
        rule = (v["max_k"], v["keys"], v["value_multiple"])
        if v["op"] == "decode":
            assert rule == (256, None, 4), v
        elif v["op"].endswith("_bwd") and v["version"] == 1:  # its columns are bound-checked: any V
            assert rule == (256, None, 1), v
        elif (v["op"], v["version"]) in (("linear", 9), ("delta", 11), ("gla", 6), ("kda", 10)):
            assert rule == (256, [256], 64), v
        elif not v["float32"]:
            assert rule == (128, [64, 128], 64), v
        elif v["version"] == 1:
            assert rule == (256, None, 8), v
        else:
            assert rule == (128, None, 8), v
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(front, "_built_versions", lambda: [dict(v) for v in cuda.versions()])
        assert front._version_info("delta", None, True, 90, 256, 256)["version"] == 11
        assert front._version_info("delta", None, False, 90, 256, 256)["version"] == 1  # float32: the token loop
        assert front._version_info("linear", None, True, 90, 256, 256)["version"] == 9
        wgmma = any((v["op"], v["version"]) == ("linear", 10) for v in cuda.versions())  # an sm_90a build
        assert front._version_info("linear", None, True, 90, 128, 128)["version"] == (10 if wgmma else 8)
        assert front._version_info("linear", None, False, 90, 256, 256)["version"] == 1  # float32: the token loop
        assert front._version_info("gla", None, True, 90, 256, 128)["version"] == 6
        assert front._version_info("gla", None, True, 90, 128, 128)["version"] == 5
        assert front._version_info("gla", None, True, 80, 256, 128)["version"] == 1  # v6's 224 KB: 9.0 and up
        assert front._version_info("kda", None, True, 90, 256, 256)["version"] == 10
        assert front._version_info("kda", None, True, 90, 128, 128)["version"] == 9
        assert front._version_info("delta", None, True, 90, 96, 128)["version"] == 2
        assert front._version_info("linear_bwd", None, True, 90, 256, 128)["version"] == 1
        assert front._version_info("delta_bwd", None, True, 90, 128, 128)["version"] == 2
        assert front._version_info("delta_bwd", None, True, 90, 128, 100)["version"] == 1


# A delta ladder of a recurrent version that runs from 8.0 up and an sm_90a-only one (as v10).
WGMMA_LADDER = ({"op": "delta", "version": 1, "name": "recurrent", "float32": True, "bfloat16": True,
                 "min_compute_capability": 80, "max_compute_capability": 0, **TOKEN_LOOP_SHAPE},
                {"op": "delta", "version": 2, "name": "wgmma", "float32": False, "bfloat16": True,
                 "min_compute_capability": 90, "max_compute_capability": 90, **TENSOR_CORE_SHAPE})


def test_an_sm90a_version_runs_on_compute_capability_9_0_only(monkeypatch):
    ladder = WGMMA_LADDER
    monkeypatch.setattr(front, "_built_versions", lambda: ladder)
    assert front._version_info("delta", None, True, 90)["version"] == 2
    assert front._version_info("delta", None, True, 100)["version"] == 1  # sm_90a code does not run on 10.0
    assert front._runs_on(ladder[1], 90) and not front._runs_on(ladder[1], 100) and not front._runs_on(ladder[1], 80)
    assert front._runs_on(ladder[0], 100)


def test_launch_refuses_a_version_this_gpu_cannot_run_with_its_range(monkeypatch):
    monkeypatch.setattr(front, "_built_versions", lambda: WGMMA_LADDER)
    monkeypatch.setattr(front, "_compute_capability", lambda device: 100)
    monkeypatch.setattr(front, "extension", lambda: types.SimpleNamespace(cuda_arch="sm_90a,compute_90"))
    monkeypatch.setattr(front, "cupy_module", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))))
    q = np.zeros((1, 1, 1, 8), np.uint16)  # bf16 bits; nothing is allocated before the refusal
    with pytest.raises(RuntimeError, match=r"version: delta version 2 \(wgmma\) needs compute capability exactly 9\.0 "
                                           r"\(.*sm_90a.*\), this GPU has 10\.0"):
        front._launch("delta", q, q, q, None, None, None, 1.0, 2, None)
    monkeypatch.setattr(front, "_compute_capability", lambda device: 75)
    with pytest.raises(RuntimeError, match=r"delta version 1 \(recurrent\) needs compute capability 8\.0 or newer, "
                                           r"this GPU has 7\.5"):
        front._launch("delta", q, q, q, None, None, None, 1.0, 1, None)


def test_an_unknown_version_names_what_this_build_has(monkeypatch):
    monkeypatch.setattr(front, "_built_versions", lambda: WGMMA_LADDER[:1])
    monkeypatch.setattr(front, "extension", lambda: types.SimpleNamespace(cuda_arch="sm_90,compute_90"))
    with pytest.raises(ValueError, match=r"version: expected one of \[1\] for delta, got 10 \(the wgmma .*90a"):
        front._version_info("delta", 10, True, 90)
    monkeypatch.setattr(front, "extension", lambda: types.SimpleNamespace(cuda_arch="sm_90a,compute_90"))
    with pytest.raises(ValueError, match=r"version: expected one of \[1\] for delta, got 10$"):
        front._version_info("delta", 10, True, 90)


# ---- grouped value heads and packed sequences ----------------------------------------------------------------
def grouped_launches(monkeypatch, packed: bool):
    """front._launch over q, k with H = 2 heads and v with HV = 4, with a version that does or does not read grouped
    heads: what each launch was given."""
    q, k, _, _, _ = arrays(H=2)
    _, _, v, g, _ = arrays(H=4)
    calls = []
    monkeypatch.setattr(front, "_launch_one", lambda op, info, q, k, *rest: calls.append((q, k, rest[-1])))
    monkeypatch.setattr(front, "runnable_version", lambda op, version, is_bf16, K, V: {"version": 7, "packed": packed})
    UNPATCHED_LAUNCH("linear", q, k, v, g, None, None, 0.25, None)
    return q, k, calls


def test_grouped_value_heads_reach_a_packed_version_as_they_are(fake_cupy, monkeypatch):
    """A version that reads grouped heads in the kernel gets q and k with their own H heads, no copy."""
    q, k, calls = grouped_launches(monkeypatch, packed=True)
    assert len(calls) == 1 and calls[0][0] is q and calls[0][1] is k and calls[0][2] is None


def test_grouped_value_heads_reach_other_versions_repeated(fake_cupy, monkeypatch):
    """Any other version sees q and k with each head repeated HV / H = 2 times (heads.expand)."""
    q, k, calls = grouped_launches(monkeypatch, packed=False)
    (q_seen, k_seen, _), = calls
    assert q_seen.shape == (2, 10, 4, 16)
    np.testing.assert_array_equal(q_seen._data[:, :, 2], q._data[:, :, 1])
    np.testing.assert_array_equal(k_seen._data, np.repeat(k._data, 2, axis=2))


def test_value_heads_must_be_a_multiple_of_the_query_heads(fake_cupy):
    q, k, _, _, _ = arrays(H=2)
    _, _, v, g, _ = arrays(H=3)
    with pytest.raises(ValueError, match=r"v: expected a number of heads HV that is a multiple of q's and k's "
                                         r"H = 2 \(grouped value heads\), got HV = 3"):
        front.gated_linear(q, k, v, g, check_values=False)


def test_packed_sequences_are_checked_and_reach_the_launch(fake_cupy, monkeypatch):
    q, k, v, g, beta = arrays(B=1)
    cu = np.array([0, 4, 10], np.int32)
    seen = []
    monkeypatch.setattr(front, "_launch", lambda *args: seen.append(args[-1]) or "launched")
    state = FakeArray(np.zeros((2, 3, 16, 8), np.float32))
    assert front.delta_rule(q, k, v, g, beta, initial_state=state, cu_seqlens=cu, check_values=False) == "launched"
    assert seen == [(0, 4, 10)]
    with pytest.raises(ValueError, match=r"initial_state: expected shape \[N, HV, K, V\] = \[2, 3, 16, 8\], got "
                                         r"\[1, 3, 16, 8\]"):
        front.gated_linear(q, k, v, g, initial_state=FakeArray(np.zeros((1, 3, 16, 8), np.float32)), cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"cu_seqlens: expected cu_seqlens\[-1\] = T = 10"):
        front.gated_linear(q, k, v, g, cu_seqlens=np.array([0, 4, 9]))
    q2, k2, v2, g2, _ = arrays(B=2)
    with pytest.raises(ValueError, match=r"cu_seqlens: expected B = 1"):
        front.gated_linear(q2, k2, v2, g2, cu_seqlens=cu)


def test_a_packed_call_to_a_packed_version_is_one_launch_with_int32_offsets(fake_cupy, monkeypatch):
    """front._launch with offsets and a version that reads packed sequences: one launch over the whole arrays, the
    offsets on the device as int32, the states one row per sequence."""
    q, k, v, g, _ = arrays(B=1)
    calls = []
    monkeypatch.setattr(front.cupy_module(), "asarray", lambda x: FakeArray(np.asarray(x)), raising=False)
    monkeypatch.setattr(front, "_launch_one", lambda *args: calls.append(args))
    monkeypatch.setattr(front, "runnable_version", lambda op, version, is_bf16, K, V: {"version": 7, "packed": True})
    o, state = UNPATCHED_LAUNCH("linear", q, k, v, g, None, None, 0.25, None, (0, 4, 10))
    (call,) = calls
    assert call[2] is q and call[4] is v and call[10] is state and state.shape == (2, 3, 16, 8)
    offsets = call[-1]
    assert offsets._data.dtype == np.int32 and offsets._data.tolist() == [0, 4, 10]


def test_more_sequences_than_the_grid_holds_launch_one_by_one(fake_cupy, monkeypatch):
    """Past MAX_PACKED_SEQUENCES (the grid's z extent) a packed version runs one launch per sequence too."""
    q, k, v, g, _ = arrays(B=1)
    calls = []
    monkeypatch.setattr(front, "MAX_PACKED_SEQUENCES", 1)
    monkeypatch.setattr(front, "_launch_one", lambda *args: calls.append(args))
    monkeypatch.setattr(front, "runnable_version", lambda op, version, is_bf16, K, V: {"version": 7, "packed": True})
    UNPATCHED_LAUNCH("linear", q, k, v, g, None, None, 0.25, None, (0, 4, 10))
    assert [call[2].shape[1] for call in calls] == [4, 6] and all(len(call) == 11 for call in calls)


def test_a_packed_call_launches_once_per_sequence_on_its_slices(fake_cupy, monkeypatch):
    """front._launch with offsets and a version that does not read them: one launch per sequence, each writing its
    slice of o and its row of the states."""
    q, k, v, g, _ = arrays(B=1)
    calls = []

    def launch_one(op, info, q, k, v, g, beta, initial_state, scale, o, final_state):
        calls.append((q.shape[1], g.shape[1], initial_state.shape, o.shape, final_state.shape))
        seen.append(tuple(np.array(x._data) for x in (q, k, v, g, initial_state)))
        o._data[...] = q.shape[1]  # each sequence's slice of the one output array, written in place
        final_state._data[...] = q.shape[1]

    seen = []
    monkeypatch.setattr(front, "_launch_one", launch_one)
    monkeypatch.setattr(front, "runnable_version", lambda op, version, is_bf16, K, V: {"version": 8})
    h0 = FakeArray(np.random.default_rng(1).standard_normal((2, 3, 16, 8)).astype(np.float32))  # a row each
    o, state = UNPATCHED_LAUNCH("linear", q, k, v, g, None, h0, 0.25, None, (0, 4, 10))
    assert calls == [(4, 4, (1, 3, 16, 8), (1, 4, 3, 8), (1, 3, 16, 8)), (6, 6, (1, 3, 16, 8), (1, 6, 3, 8), (1, 3, 16, 8))]
    for n, (start, end) in enumerate([(0, 4), (4, 10)]):  # sequence n read its own tokens and its own start state
        tokens = [x._data[:, start:end] for x in (q, k, v, g)]
        assert all(np.array_equal(got, want) for got, want in zip(seen[n], tokens + [h0._data[n:n + 1]]))
    assert (o._data[:, :4] == 4).all() and (o._data[:, 4:] == 6).all()
    assert (state._data[0] == 4).all() and (state._data[1] == 6).all()


def test_backward_of_packed_sequences_joins_each_sequences_gradients():
    """The GPU backward joins its per-sequence launches with `varlen.backward`, as the NumPy backward does."""
    from minilin import varlen

    offsets = (0, 3, 7)
    arrays_ = (np.arange(7.0).reshape(1, 7, 1), None)
    state = np.array([[10.0], [20.0]])

    def run(x, absent, initial_state, do, dstate):
        assert absent is None and do.shape[1] == x.shape[1] and initial_state.shape == (1, 1)
        return 2 * x, None, initial_state + dstate

    dx, dabsent, dstate0 = varlen.backward(run, arrays_, state, np.ones((1, 7, 1)), np.ones((2, 1)), offsets)
    np.testing.assert_array_equal(dx, 2 * arrays_[0])
    assert dabsent is None
    np.testing.assert_array_equal(dstate0, [[11.0], [21.0]])
