"""The CUDA kernels against the float64 NumPy reference, every version, on the GPU.

Skipped, with the reason, where CuPy, a GPU or the built extension is missing. Every CuPy allocation made
during these tests is filled with NaN bytes first (0xFF..: NaN in float32 and bfloat16), so an output
element a kernel forgets to write fails the comparison (NaN never passes).
"""
from __future__ import annotations

import numpy as np
import pytest

from minilin import catalog
from minilin import cuda as mcuda
from conftest import cuda_version_cases, rel_err

OK, REASON = mcuda.available()
pytestmark = [pytest.mark.skipif(not OK, reason=REASON or "CUDA extension unavailable"),
              pytest.mark.usefixtures("poisoned_allocations")]  # conftest.py: unwritten outputs read NaN
if OK:
    import cupy

TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2}
# (B, T, H, K, V): T % 64 != 0, T = 1 with B * H = 1, K != V both ways, many chunks and token tiles, and enough
# chunks for the producer kernels' 3-stage ring to wrap at K = 64 as well as at K = 128; at K = 256 (the 2-stage
# rings of linear v9 and delta v11, and the token loops), T = 1, a partial chunk with several heads and value blocks, K != V, and a
# ring that wraps many times.
SHAPES = [(2, 100, 3, 64, 64), (1, 1, 1, 128, 128), (1, 64, 2, 128, 64), (2, 130, 2, 64, 128), (1, 1000, 2, 128, 128),
          (1, 300, 2, 64, 64), (1, 1, 1, 256, 256), (2, 100, 3, 256, 128), (1, 1000, 2, 256, 64)]
CORE_MIXERS = ["linear_attention", "simple_gla", "deltanet", "gated_deltanet"]


def version_cases(mixer):
    """(version, dtype) for every kernel version of the mixer's op that this GPU runs (`cuda_version_cases`)."""
    return cuda_version_cases(mcuda.OPS[mixer])


def takes(mixer, version, shape) -> bool:
    """Whether `version` of the mixer's op takes the shape's K and V (its shape rule, `versions`)."""
    info = next(v for v in mcuda.versions(mcuda.OPS[mixer]) if v["version"] == version)
    return mcuda.front.takes_shape(info, shape[3], shape[4])




def to_device(args, dtype: str, sequence_names):
    """Host float64 args -> (GPU args in `dtype` for the tensors in sequence_names, float32 otherwise;
    the float64 values the reference must see, i.e. after rounding to bfloat16 where that applies)."""
    gpu, host = [], []
    for i, a in enumerate(args):
        x = cupy.asarray(a, dtype=cupy.float32)
        if dtype == "bfloat16" and i in sequence_names:
            x = mcuda.to_bf16(x)
            host.append(cupy.asnumpy(mcuda.from_bf16(x)).astype(np.float64))
        else:
            host.append(cupy.asnumpy(x).astype(np.float64))
        gpu.append(x)
    return gpu, host


def as_float32(o):
    return mcuda.from_bf16(o) if mcuda.bf16.is_bf16(o.dtype) else o


def run_case(mixer, shape, version, dtype, with_state, seed=0, group=1):
    """Errors of one version's output and final state against the float64 recurrent form; H is the value heads,
    and group > 1 gives q and k H / group heads, each shared by `group` value heads."""
    B, T, H, K, V = shape
    mod = catalog.module(mixer)
    args, kwargs = mod.example_inputs(B, T, H, K, V, seed=seed)
    if group > 1:
        names = list(mod.SIGNATURE.names)
        args = tuple(np.ascontiguousarray(a[:, :, ::group]) if n in ("q", "k") else a for n, a in zip(names, args))
    if mcuda.OPS[mixer] == "delta":  # unit keys that stay within |k| <= 1 once rounded to bf16 (the reference checks)
        args = (args[0], args[1] * mcuda.bf16.UNIT_KEY_SCALE, *args[2:])
    sequence = {0, 1, 2} if mixer != "mamba2" else {0, 3, 4}  # the tensors that are bf16 when dtype is
    gpu, host = to_device(args, dtype, sequence)
    state_shape = (B, H, K, V)
    state0 = np.random.default_rng(seed + 1).standard_normal(state_shape).astype(np.float32) * 0.5 if with_state else None
    ref_o, ref_state = mod.recurrent(*host, **kwargs, initial_state=None if state0 is None else state0.astype(np.float64))
    o, state = getattr(mcuda, mixer)(*gpu, **kwargs, version=version,
                                     initial_state=None if state0 is None else cupy.asarray(state0))
    assert isinstance(o, cupy.ndarray) and isinstance(state, cupy.ndarray)
    assert o.shape == ref_o.shape and state.shape == ref_state.shape
    assert o.dtype == gpu[0].dtype and state.dtype == cupy.float32
    return rel_err(cupy.asnumpy(as_float32(o)), ref_o), rel_err(cupy.asnumpy(state), ref_state)


@pytest.mark.parametrize("mixer,version,dtype,shape",
                         [(m, v, d, s) for m in CORE_MIXERS for v, d in version_cases(m) for s in SHAPES
                          if takes(m, v, s)],
                         ids=lambda x: "B{}T{}H{}K{}V{}".format(*x) if isinstance(x, tuple) else str(x))
def test_matches_reference(mixer, version, dtype, shape):
    with_state = shape[1] != 64  # initial state in for all but one shape; final state out always
    err_o, err_state = run_case(mixer, shape, version, dtype, with_state)
    tol = TOLERANCE[dtype]
    assert err_o < tol, f"{mixer} v{version} {dtype} {shape}: output error {err_o:.2e} >= {tol}"
    assert err_state < tol, f"{mixer} v{version} {dtype} {shape}: final state error {err_state:.2e} >= {tol}"


# (B, T, H, K, V) where linear v8 and v10 split each sequence (few blocks for the card; T / P >= 1024 tokens): P = 2 with
# 20-chunk segments (a short last run of the correction's 16 chunks), the most segments at K = 64 and K = 128, and
# V = 256 (two of the correction's 128-column blocks); at K = 256 (linear v9's split) P = 4 and 64 value columns, and
# P = 2 with 128-column correction blocks.
SPLIT_SHAPES = [(2, 2560, 1, 128, 64), (1, 4096, 2, 64, 64), (1, 8192, 2, 128, 128), (1, 4096, 1, 128, 256),
                (1, 4096, 1, 256, 64), (2, 2560, 1, 256, 128)]


@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("mixer", ["linear_attention", "simple_gla", "mamba2"])
@pytest.mark.parametrize("with_state", [False, True], ids=["no_h0", "h0"])
def test_split_sequence_matches_reference(mixer, shape, with_state):
    """linear v8 and v10 (v9 at K = 256) where they do split (a workspace for the segments' states), against
    float64, and the unsplit rung beside them (v7; the token loop v1 at K = 256)."""
    splits, unsplit = ((9,), 1) if shape[3] == 256 else ((8, 10), 7)
    splits = tuple(v for v in splits if (v, "bfloat16") in version_cases(mixer))
    if not splits:
        pytest.skip("linear v8 - v10 need compute capability 9.0")
    for split in splits:
        assert mcuda.extension().workspace_bytes("linear", split, *shape) > 0, f"v{split} does not split at {shape}"
    for version in (*splits, unsplit):
        err_o, err_state = run_case(mixer, shape, version, "bfloat16", with_state, seed=5)
        assert err_o < TOLERANCE["bfloat16"], f"{mixer} v{version} {shape}: output error {err_o:.2e}"
        assert err_state < TOLERANCE["bfloat16"], f"{mixer} v{version} {shape}: final state error {err_state:.2e}"


# (B, T, H, K, V, group) where delta v12 splits each sequence on an H100 or H200 (132 SMs): P = 8 (segments of 1024
# tokens), P = 4 at K = V = 128, K != V both ways (the identity's columns one or two value blocks, the values' the
# other), and grouped value heads (H value heads, H / group q/k heads).
DELTA_SPLIT_SHAPES = [(1, 8192, 1, 64, 64, 1), (1, 4096, 2, 128, 128, 1), (2, 4096, 1, 128, 64, 1),
                      (1, 4096, 1, 64, 128, 1), (1, 4096, 4, 128, 64, 2)]


@pytest.mark.parametrize("shape", DELTA_SPLIT_SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}G{}".format(*s))
@pytest.mark.parametrize("mixer", ["deltanet", "gated_deltanet"])
@pytest.mark.parametrize("with_state", [False, True], ids=["no_h0", "h0"])
def test_delta_split_sequence_matches_reference(mixer, shape, with_state):
    """delta v12 where it does split (a workspace beyond v10's WY tiles for the transitions and the starts),
    against float64, and v10 beside it."""
    if (12, "bfloat16") not in version_cases(mixer):
        pytest.skip("delta v12 needs sm_90a code and compute capability 9.0")
    *shape, group = shape
    ext = mcuda.extension()
    assert ext.workspace_bytes("delta", 12, *shape) > ext.workspace_bytes("delta", 10, *shape), \
        f"v12 does not split at {shape}"
    for version in (12, 10):
        err_o, err_state = run_case(mixer, tuple(shape), version, "bfloat16", with_state, seed=7, group=group)
        assert err_o < TOLERANCE["bfloat16"], f"{mixer} v{version} {shape}: output error {err_o:.2e}"
        assert err_state < TOLERANCE["bfloat16"], f"{mixer} v{version} {shape}: final state error {err_state:.2e}"


GROUPED_MIXERS = ["linear_attention", "simple_gla", "gla", "deltanet", "gated_deltanet", "kda"]


@pytest.mark.parametrize("mixer", GROUPED_MIXERS)
@pytest.mark.parametrize("layout", ["grouped", "packed", "grouped+packed"])
def test_grouped_heads_and_packed_sequences_match_reference(mixer, layout):
    """HV = 2 H value heads and / or three packed sequences (one of them 1 token, one past a chunk), the default
    bf16 kernel against the NumPy chunked form given the same layout, in float64."""
    B, T, HV, K, V = (1, 300, 4, 64, 64) if "packed" in layout else (2, 130, 4, 64, 64)
    group = 2 if "grouped" in layout else 1
    mod = catalog.module(mixer)
    args, kwargs = mod.example_inputs(B, T, HV, K, V, seed=11)
    names = list(mod.SIGNATURE.names)
    args = [np.ascontiguousarray(a[:, :, ::group]) if n in ("q", "k") else a for n, a in zip(names, args)]
    if mcuda.OPS[mixer] in ("delta", "kda"):
        args[1] = args[1] * mcuda.bf16.UNIT_KEY_SCALE
    gpu, host = to_device(args, "bfloat16", {0, 1, 2})
    cu = np.array([0, 1, 120, 300], np.int32) if "packed" in layout else None
    N = 3 if cu is not None else B
    state0 = np.random.default_rng(12).standard_normal((N, HV, K, V)).astype(np.float32) * 0.5
    ref_o, ref_state = mod.chunked(*host, **kwargs, initial_state=state0.astype(np.float64), cu_seqlens=cu)
    o, state = getattr(mcuda, mixer)(*gpu, **kwargs, initial_state=cupy.asarray(state0),
                                     cu_seqlens=None if cu is None else cupy.asarray(cu))
    assert o.shape == ref_o.shape and state.shape == ref_state.shape == (N, HV, K, V)
    err_o, err_state = rel_err(cupy.asnumpy(as_float32(o)), ref_o), rel_err(cupy.asnumpy(state), ref_state)
    assert err_o < TOLERANCE["bfloat16"] and err_state < TOLERANCE["bfloat16"], (layout, err_o, err_state)


def packed_version_cases(mixer):
    """(version, dtype) of every version of the mixer's op that reads packed sequences and grouped heads itself;
    [] where minilin.cuda cannot run (collected at import, so the extension's list is asked only where it is built)."""
    cases = version_cases(mixer)
    if not cases:
        return []
    packed = {v["version"] for v in mcuda.versions(mcuda.OPS[mixer]) if v["packed"]}
    return [(version, dtype) for version, dtype in cases if version in packed]


# Seven sequences over 500 tokens: three of one token, chunk boundaries crossed and met, and rows of the chunk-indexed
# scratch left between sequences (a sequence's chunks start at row offset // 64 + its index).
PACKED_OFFSETS = [0, 1, 64, 65, 200, 329, 330, 500]


@pytest.mark.parametrize("mixer,version,dtype,K,V",
                         [(m, v, d, K, V) for m in GROUPED_MIXERS for v, d in packed_version_cases(m)
                          for K, V in [(64, 64), (128, 64), (256, 64)] if takes(m, v, (1, 1, 1, K, V))])
def test_packed_versions_read_grouped_heads_and_packed_sequences(mixer, version, dtype, K, V):
    """Each version marked `packed`, called by number with HV = 2 H and seven packed sequences, in one launch,
    against the NumPy chunked form given the same layout, in float64."""
    T, HV, group = PACKED_OFFSETS[-1], 4, 2
    mod = catalog.module(mixer)
    args, kwargs = mod.example_inputs(1, T, HV, K, V, seed=21)
    names = list(mod.SIGNATURE.names)
    args = [np.ascontiguousarray(a[:, :, ::group]) if n in ("q", "k") else a for n, a in zip(names, args)]
    if mcuda.OPS[mixer] in ("delta", "kda"):
        args[1] = args[1] * mcuda.bf16.UNIT_KEY_SCALE
    gpu, host = to_device(args, dtype, {0, 1, 2})
    cu = np.array(PACKED_OFFSETS, np.int32)
    N = len(cu) - 1
    state0 = np.random.default_rng(22).standard_normal((N, HV, K, V)).astype(np.float32) * 0.5
    ref_o, ref_state = mod.chunked(*host, **kwargs, initial_state=state0.astype(np.float64), cu_seqlens=cu)
    o, state = getattr(mcuda, mixer)(*gpu, **kwargs, initial_state=cupy.asarray(state0), cu_seqlens=cupy.asarray(cu),
                                     version=version)
    assert o.shape == ref_o.shape and state.shape == ref_state.shape == (N, HV, K, V)
    err_o, err_state = rel_err(cupy.asnumpy(as_float32(o)), ref_o), rel_err(cupy.asnumpy(state), ref_state)
    assert err_o < TOLERANCE[dtype] and err_state < TOLERANCE[dtype], (err_o, err_state)


@pytest.mark.parametrize("mixer,version,dtype",
                         [(m, v, d) for m in ("retnet", "lightning", "mamba2") for v, d in version_cases(m)])
def test_wrappers_match_reference(mixer, version, dtype):
    shape = next(s for s in [(2, 150, 2, 64, 64), (2, 150, 2, 256, 64)] if takes(mixer, version, s))
    err_o, err_state = run_case(mixer, shape, version, dtype, with_state=True, seed=3)
    assert err_o < TOLERANCE[dtype] and err_state < TOLERANCE[dtype], (err_o, err_state)


@pytest.mark.parametrize("mixer,K", [("simple_gla", 128), ("simple_gla", 256), ("gated_deltanet", 128),
                                     ("gated_deltanet", 256)])
def test_repeated_runs_are_identical(mixer, K):
    """A race shows as outputs that differ between runs on the same inputs (the default bf16 version at K)."""
    mod = catalog.module(mixer)
    args, _ = mod.example_inputs(2, 300, 4, K, 128, seed=9)
    gpu, _ = to_device(args, "bfloat16", {0, 1, 2})
    version = mcuda.default_version(mcuda.OPS[mixer], True, K, 128)
    first = getattr(mcuda, mixer)(*gpu, version=version)
    for _ in range(3):
        again = getattr(mcuda, mixer)(*gpu, version=version)
        assert bool((again[0] == first[0]).all()) and bool((again[1] == first[1]).all())


def test_runs_on_the_current_stream():
    mod = catalog.module("simple_gla")
    args, _ = mod.example_inputs(1, 70, 2, 64, 64, seed=4)
    gpu, host = to_device(args, "float32", {0, 1, 2})
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        o, _ = mcuda.simple_gla(*gpu, version=2)
    stream.synchronize()
    ref, _ = mod.recurrent(*host)
    assert rel_err(cupy.asnumpy(o), ref) < 1e-4


def test_bf16_helpers_round_to_nearest_even():
    # 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1); 1 + 3 * 2^-8 lies
    # halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
    x = cupy.asarray([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, np.inf, np.nan], dtype=cupy.float32)
    expected = [1.0, 1.0, 1.0 + 2**-6, -2.5, np.inf, np.nan]
    for bits in (True, None):
        y = mcuda.to_bf16(x, bits=bits)
        assert y.dtype == (np.uint16 if bits else (mcuda.native_dtype() or np.uint16))
        np.testing.assert_array_equal(cupy.asnumpy(mcuda.from_bf16(y)), expected)


# ---- bad inputs raise before any launch, naming the argument ---------------------------------------------
def good_inputs(dtype="float32", B=2, T=100, H=3, K=64, V=64):
    rng = cupy.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, T, H, d), dtype=cupy.float32) for d in (K, K, V))
    k /= cupy.linalg.norm(k, axis=-1, keepdims=True)  # unit keys: beta |k|^2 <= 1 (front.check_key_strength)
    g = rng.uniform(-1, -0.01, (B, T, H), dtype=cupy.float32)
    beta = rng.uniform(0, 1, (B, T, H), dtype=cupy.float32)
    if dtype == "bfloat16":
        q, k, v = (mcuda.to_bf16(x) for x in (q, k, v))
    return q, k, v, g, beta


@pytest.mark.parametrize("fn", ["simple_gla", "gated_deltanet"])
def test_bad_inputs_raise(fn):
    q, k, v, g, beta = good_inputs()
    call = (lambda *a, **kw: mcuda.simple_gla(*a[:4], **kw)) if fn == "simple_gla" else mcuda.gated_deltanet

    def args(**replace):
        base = dict(q=q, k=k, v=v, g=g, beta=beta)
        base.update(replace)
        return [base[n] for n in ("q", "k", "v", "g", "beta")]

    with pytest.raises(TypeError, match="q: expected float32 or bfloat16"):
        call(*args(q=q.astype(cupy.float64)))
    with pytest.raises(TypeError, match="q: expected a CuPy array"):
        call(*args(q=cupy.asnumpy(q)))
    with pytest.raises(TypeError, match="k: expected the dtype of q"):
        call(*args(k=mcuda.to_bf16(k)))
    with pytest.raises(ValueError, match="q: expected a C-contiguous"):
        call(*args(q=cupy.concatenate([q, q], axis=1)[:, ::2]))
    with pytest.raises(ValueError, match=r"v: expected shape \[B, T, HV, V\] = \[2, 100, HV, V\]"):
        call(*args(v=v[:, :50]))
    with pytest.raises(TypeError, match="g: expected float32"):
        call(*args(g=g.astype(cupy.float16)))
    with pytest.raises(ValueError, match="g: expected log-space decay"):
        call(*args(g=-g))
    with pytest.raises(ValueError, match="initial_state: expected shape"):
        call(*args(), initial_state=cupy.zeros((2, 3, 64, 32), cupy.float32))
    with pytest.raises(TypeError, match="takes bfloat16 inputs only"):
        call(*args(), version=3)
    with pytest.raises(ValueError, match="version: expected one of"):
        call(*args(), version=42)
    if fn == "gated_deltanet":
        with pytest.raises(ValueError, match="beta: expected values in"):
            call(*args(beta=beta + 1.5))
        with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 1"):
            call(*args(k=3 * k))
    q12, k12 = q[..., :12].copy(), k[..., :12].copy()
    with pytest.raises(ValueError, match="K and V must be multiples of 8"):
        call(*args(q=q12, k=k12))
