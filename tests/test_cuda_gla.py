"""The CUDA kernels with a decay per key channel (ops "gla" and "kda": minilin.cuda.gla, minilin.cuda.kda) against
the float64 NumPy reference, every version, on the GPU; their registration and argument checks wherever the
extension is built; the front's checks anywhere (a stand-in for CuPy, tests/test_cuda_front.py).

The GPU tests are skipped, with the reason, where CuPy, a GPU or the built extension is missing. Inside them every
CuPy allocation is filled with NaN bytes first (0xFF..: NaN in float32 and bfloat16), so an output element a kernel
forgets to write fails the comparison (NaN never passes).
"""
from __future__ import annotations

import numpy as np
import pytest

from minilin import cuda as mcuda
from minilin.cuda import front
from minilin.mixers import gla, kda
from conftest import cuda_version_cases, rel_err
from test_cuda_front import FakeArray, fake_cupy  # noqa: F401 - fake_cupy is a fixture used below

OK, REASON = mcuda.available()
gpu = pytest.mark.skipif(not OK, reason=REASON or "CUDA extension unavailable")
if OK:
    import cupy

TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2}
MIXERS = {"gla": gla, "kda": kda}
# (B, T, H, K, V): T % 64 != 0 and % 32 != 0, T = 1 with B * H = 1, K != V both ways, V not a multiple of the
# 32-column value blocks, several chunks and token tiles, K = 32 (one key row per lane) and K = 40 (a second row
# on 8 lanes only).
# K = 256 with whole 64-column value blocks (gla v6's shape) and a last partial chunk.
SHAPES = [(2, 100, 3, 64, 64), (1, 1, 1, 128, 128), (1, 64, 2, 128, 64), (2, 130, 2, 64, 128), (1, 300, 2, 32, 48),
          (1, 70, 1, 40, 56), (1, 1000, 1, 128, 128), (2, 130, 2, 256, 64)]
WIDE = (1, 70, 2, 256, 32)  # K = 256: the recurrent kernels' largest (8 key rows per lane); chunked refuses it


CASES = [(op, v, d) for op in MIXERS for v, d in cuda_version_cases(op)]


def takes(op, version, shape) -> bool:
    """Whether a version runs at this shape, by its shape rule (`versions`): the tensor-core versions (bfloat16 only)
    take K = 64 or 128 (gla v6: 256) and whole 64-column value blocks; the chunked CUDA-core ones (gla v2, kda v2)
    K <= 128; the recurrent ones K <= 256."""
    info = next(v for v in mcuda.versions(op) if v["version"] == version)
    return front.takes_shape(info, shape[3], shape[4])


def key_width(op, version, K) -> int:
    """K where the version takes it, else 256 (the K = 256 versions'), for tests that run every version."""
    return K if takes(op, version, (1, 1, 1, K, 64)) else 256


def check_case(op, version, dtype, shape, what="", **kwargs):
    """run_case within the dtype's tolerance; at a shape the version does not take, the refusal (ValueError naming
    the size) instead, so that no case passes by being skipped."""
    if not takes(op, version, shape):
        with pytest.raises(ValueError, match=r"K must be|V must be a multiple"):
            run_case(op, shape, version, dtype, **kwargs)
        return
    assert_within(op, version, dtype, shape, run_case(op, shape, version, dtype, **kwargs), what)




def inputs(op, shape, seed, *, strong=False, unit_keys=True):
    """Host float64 (q, k, v, g[, beta]) for `op`. strong: gates down to -20 on half of the key channels (drawn per
    channel and head), the rest in [-0.1, 0], so that strong and weak decays meet in one chunk; else the examples'
    [-1, -0.01]. unit_keys: keys of norm UNIT_KEY_SCALE for kda (within beta |k|^2 <= 1 once rounded to bf16)."""
    B, T, H, K, V = shape
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, K))
    v = rng.standard_normal((B, T, H, V))
    if strong:
        strong_channel = rng.random((1, 1, H, K)) < 0.5
        g = np.where(strong_channel, rng.uniform(-20.0, 0.0, (B, T, H, K)), rng.uniform(-0.1, 0.0, (B, T, H, K)))
    else:
        g = rng.uniform(-1.0, -0.01, (B, T, H, K))
    if op == "gla":
        return [q, k, v, g]
    if unit_keys:
        k *= mcuda.bf16.UNIT_KEY_SCALE / np.linalg.norm(k, axis=-1, keepdims=True)
    return [q, k, v, g, rng.uniform(0.0, 1.0, (B, T, H))]


def to_device(args, dtype):
    """Host float64 args -> (GPU args: q, k, v in `dtype`, the rest float32; the float64 values the reference must
    see, i.e. after rounding to float32 and, for q, k, v, to bfloat16 where that applies)."""
    on_gpu, host = [], []
    for i, a in enumerate(args):
        x = cupy.asarray(a, dtype=cupy.float32)
        if dtype == "bfloat16" and i < 3:
            x = mcuda.to_bf16(x)
            host.append(cupy.asnumpy(mcuda.from_bf16(x)).astype(np.float64))
        else:
            host.append(cupy.asnumpy(x).astype(np.float64))
        on_gpu.append(x)
    return on_gpu, host


def as_float32(o):
    return mcuda.from_bf16(o) if mcuda.bf16.is_bf16(o.dtype) else o


def run_case(op, shape, version, dtype, *, with_state, seed=0, strong=False, scale=None, **kwargs):
    """(o, the reference's o, the final state, the reference's) of one kernel call against the float64 recurrent
    form, as float64 NumPy arrays."""
    B, T, H, K, V = shape
    on_gpu, host = to_device(inputs(op, shape, seed, strong=strong, unit_keys=not kwargs.get("normalize_qk")), dtype)
    state0 = np.random.default_rng(seed + 1).standard_normal((B, H, K, V)).astype(np.float32) * 0.5 if with_state else None
    ref_o, ref_state = MIXERS[op].recurrent(*host, scale=scale, **kwargs,
                                            initial_state=None if state0 is None else state0.astype(np.float64))
    o, state = getattr(mcuda, op)(*on_gpu, scale=scale, **kwargs, version=version,
                                  initial_state=None if state0 is None else cupy.asarray(state0))
    assert isinstance(o, cupy.ndarray) and isinstance(state, cupy.ndarray)
    assert o.shape == ref_o.shape and state.shape == ref_state.shape
    assert o.dtype == on_gpu[0].dtype and state.dtype == cupy.float32
    return (cupy.asnumpy(as_float32(o)).astype(np.float64), ref_o, cupy.asnumpy(state).astype(np.float64), ref_state)


def where_wrong(out, ref, tol, axes: str) -> str:
    """Where `out` departs from `ref` (arrays of dims `axes`, e.g. "B T H V"), in words, for a failure message: the
    NaN / inf count and the first one's index; the first token over `tol` with its 64-token chunk and 16-token
    sub-chunk (o only); the error of each head and of each block of 32 value columns (the kernels' blocks); for the
    state, of each block of 32 key rows."""
    dims = axes.split()
    notes = []
    bad = ~np.isfinite(out)
    if bad.any():
        first = dict(zip(dims, (int(i) for i in np.argwhere(bad)[0])))
        notes.append(f"{int(bad.sum())} of {out.size} not finite, the first at {first}")
    diff = np.where(bad, np.inf, out - ref)

    def error_along(axis: int, size: int = 1) -> list:
        """The relative error of each slice of `size` along `axis`."""
        errors = []
        for start in range(0, out.shape[axis], size):
            part = range(start, min(start + size, out.shape[axis]))
            errors.append(float(np.linalg.norm(np.take(diff, part, axis))
                                / max(np.linalg.norm(np.take(ref, part, axis)), 1e-300)))
        return errors

    if "T" in dims:
        per_token = error_along(dims.index("T"))
        over = [t for t, e in enumerate(per_token) if not e < tol]
        if over:
            t = over[0]
            notes.append(f"{len(over)} of {len(per_token)} tokens over {tol:g}, the first t = {t} (chunk {t // 64}, "
                         f"sub-chunk {t % 64 // 16}, {t % 64} in its chunk; its error {per_token[t]:.2e})")
    notes.append("per head " + ", ".join(f"{e:.1e}" for e in error_along(dims.index("H"))))
    notes.append("per 32 value columns " + ", ".join(f"{e:.1e}" for e in error_along(dims.index("V"), 32)))
    if "K" in dims:
        notes.append("per 32 key rows " + ", ".join(f"{e:.1e}" for e in error_along(dims.index("K"), 32)))
    return "; ".join(notes)


def assert_within(op, version, dtype, shape, arrays, what=""):
    o, ref_o, state, ref_state = arrays
    tol = TOLERANCE[dtype]
    err_o, err_state = rel_err(o, ref_o), rel_err(state, ref_state)
    case = f"{op} v{version} {dtype} (B, T, H, K, V) = {shape}{what}"
    assert err_o < tol, f"{case}: output error {err_o:.2e} >= {tol}: {where_wrong(o, ref_o, tol, 'B T H V')}"
    assert err_state < tol, (f"{case}: final state error {err_state:.2e} >= {tol}: "
                             f"{where_wrong(state, ref_state, tol, 'B H K V')}")


def test_where_wrong_names_the_place():
    """The failure messages' locator, on a made-up error: a NaN, and tokens 70.. of one head and 20 columns wrong."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 130, 2, 96))
    out = ref.copy()
    out[1, 70:, 1, 40:60] += 0.5
    out[0, 100, 0, 3] = np.nan
    text = where_wrong(out, ref, 1e-2, "B T H V")
    assert "1 of 49920 not finite, the first at {'B': 0, 'T': 100, 'H': 0, 'V': 3}" in text
    assert "60 of 130 tokens over 0.01, the first t = 70 (chunk 1, sub-chunk 0, 6 in its chunk" in text
    assert "per head inf, 1.1e-01" in text and "per 32 value columns inf, 1.3e-01, 0.0e+00" in text
    state = rng.standard_normal((2, 2, 64, 96))
    wrong = state.copy()
    wrong[:, :, 32:, :32] *= 1.1
    assert where_wrong(wrong, state, 1e-2, "B H K V").endswith("per 32 key rows 0.0e+00, 5.7e-02")


# ---- on the GPU: every version against the float64 reference ---------------------------------------------------
@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("op,version,dtype", CASES)
def test_matches_reference(op, version, dtype, shape):
    with_state = shape[1] != 64  # initial state in for all but one shape; final state out always
    check_case(op, version, dtype, shape, with_state=with_state)


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("shape", [(2, 200, 2, 64, 64), (1, 1, 1, 64, 32)], ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("op,version,dtype", CASES)
def test_gates_down_to_minus_20(op, version, dtype, shape):
    """Strong and weak per-channel decays side by side: every exponent the kernels take must stay <= 0 (an
    exp(-G) of a cumulative gate overflows to inf here, and inf * 0 is NaN)."""
    check_case(op, version, dtype, shape, " (gates down to -20)", with_state=True, seed=5, strong=True)


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("op,version,dtype", CASES)
def test_wide_keys(op, version, dtype):
    check_case(op, version, dtype, WIDE, with_state=True, seed=2)


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("op,version,dtype", CASES)
def test_scale_is_applied(op, version, dtype):
    check_case(op, version, dtype, (1, 90, 2, 64, 64), " (scale 0.3)", with_state=True, seed=6, scale=0.3)


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("version,dtype", cuda_version_cases("kda"))
def test_kda_normalize_qk(version, dtype):
    """Keys of any length, normalized by the front's pre-pass, against the reference's normalize_qk=True."""
    check_case("kda", version, dtype, (2, 100, 2, 64, 64), " (normalize_qk)", with_state=True, seed=7,
               normalize_qk=True)


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("op,version,dtype", CASES)
def test_repeated_runs_are_identical(op, version, dtype):
    """A race shows as outputs that differ between runs on the same inputs."""
    on_gpu, _ = to_device(inputs(op, (2, 300, 4, key_width(op, version, 128), 128), seed=9), dtype)
    first = getattr(mcuda, op)(*on_gpu, version=version)
    for _ in range(3):
        again = getattr(mcuda, op)(*on_gpu, version=version)
        assert bool((again[0] == first[0]).all()) and bool((again[1] == first[1]).all())


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
def test_gla_versions_agree():
    """v1 (the definition) and v2 (chunked) on one long float32 input: the same function within float32's tolerance;
    and every bfloat16 version against v1 on the same bfloat16 input."""
    on_gpu, _ = to_device(inputs("gla", (1, 2000, 2, 128, 128), seed=11), "float32")
    o1, s1 = mcuda.gla(*on_gpu, version=1)
    o2, s2 = mcuda.gla(*on_gpu, version=2)
    assert rel_err(cupy.asnumpy(o2), cupy.asnumpy(o1)) < TOLERANCE["float32"]
    assert rel_err(cupy.asnumpy(s2), cupy.asnumpy(s1)) < TOLERANCE["float32"]
    bf16_versions_agree_with_v1("gla", to_device(inputs("gla", (1, 2000, 2, 128, 128), seed=11), "bfloat16")[0])


def bf16_versions_agree_with_v1(op, on_gpu):
    """Every bfloat16 version of op ("gla" or "kda") that takes the inputs' shape within 1e-2 of v1, the
    definition, on the same inputs."""
    o1, s1 = getattr(mcuda, op)(*on_gpu, version=1)
    shape = (*on_gpu[0].shape, on_gpu[2].shape[3])
    for version, dtype in cuda_version_cases(op):
        if dtype == "bfloat16" and version > 1 and takes(op, version, shape):
            o, s = getattr(mcuda, op)(*on_gpu, version=version)
            assert rel_err(cupy.asnumpy(as_float32(o)), cupy.asnumpy(as_float32(o1))) < 1e-2, version
            assert rel_err(cupy.asnumpy(s), cupy.asnumpy(s1)) < 1e-2, version


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("layout", ["plain", "packed", "grouped"])
def test_gla_v4_computes_what_v3_does_bit_for_bit(layout, K):
    """v4 moves v3's chunk-local work into its own kernel with the same arithmetic and roundings (Qr, Ke and P
    rounded to bf16 once, the chunk decay in fp32), so its outputs and states equal v3's exactly: a difference is an
    indexing or pipeline defect. Strong gates, a last partial chunk, and packed sequences (one of a single token)
    or grouped heads."""
    B, T, H = (2, 230, 4) if layout != "packed" else (1, 500, 4)
    q, k, v, g = inputs("gla", (B, T, H, K, 128), seed=31, strong=True)
    kwargs = {}
    if layout == "grouped":
        q, k = q[:, :, ::2].copy(), k[:, :, ::2].copy()
    if layout == "packed":
        kwargs["cu_seqlens"] = cupy.asarray([0, 1, 64, 65, 200, 329, 330, 500], dtype=cupy.int32)
    on_gpu, _ = to_device([q, k, v, g], "bfloat16")
    N = B if layout != "packed" else 7
    state0 = cupy.asarray(np.random.default_rng(32).standard_normal((N, H, K, 128)).astype(np.float32))
    o3, s3 = mcuda.gla(*on_gpu, initial_state=state0, version=3, **kwargs)
    o4, s4 = mcuda.gla(*on_gpu, initial_state=state0, version=4, **kwargs)
    assert bool((o4 == o3).all()) and bool((s4 == s3).all())


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("T, H, K, V, grouped", [(4096, 2, 64, 128, False), (4096, 2, 128, 128, False),
                                                 (4096, 2, 128, 128, True), (32768, 1, 64, 64, False)])
def test_gla_v5_splits_one_long_sequence_and_matches_the_reference(T, H, K, V, grouped, with_state):
    """One sequence with 1 or 2 value heads leaves the card idle, so v5 splits it (its workspace holds the segments'
    states beyond v4's tiles; at T = 32768 its 16 segments of 32 chunks take two of the correction's runs of 16
    each); its outputs and final state against the float64 chunked form, strong gates, with and without an initial
    state (the correction of the first segment runs only with one), grouped heads too. The split adds two bf16
    roundings (Qr c_n, and o before the correction), so the bound is bf16's tolerance."""
    cuda = mcuda.extension()
    B = 1
    assert cuda.workspace_bytes("gla", 5, B, T, H, K, V) > cuda.workspace_bytes("gla", 4, B, T, H, K, V)
    q, k, v, g = inputs("gla", (B, T, H, K, V), seed=41, strong=True)
    if grouped:
        q, k = q[:, :, :H // 2].copy(), k[:, :, :H // 2].copy()
    on_gpu, host = to_device([q, k, v, g], "bfloat16")
    state0 = np.random.default_rng(42).standard_normal((B, H, K, V)).astype(np.float32) if with_state else None
    ref_o, ref_state = gla.chunked(*host, initial_state=None if state0 is None else state0.astype(np.float64))
    o, state = mcuda.gla(*on_gpu, initial_state=None if state0 is None else cupy.asarray(state0), version=5)
    err_o = rel_err(cupy.asnumpy(as_float32(o)).astype(np.float64), ref_o)
    err_state = rel_err(cupy.asnumpy(state).astype(np.float64), ref_state)
    assert err_o < TOLERANCE["bfloat16"] and err_state < TOLERANCE["bfloat16"], (err_o, err_state)


# The K = 256 versions, and how far their output error may exceed the token loop v1's on the same bf16 inputs: gla
# v6 rounds Qr, Ke, P and S's copy to bf16 as v4 does at K = 128 (~1.4x v1's there), kda v10 also T diag(beta), X
# and Delta as kda v8 does (~2x); an indexing defect in a half or a refill costs far more.
HEAD_DIM_256 = {"gla": (6, 2.0), "kda": (10, 2.5)}


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("layout, V", [("plain", 128), ("plain", 256), ("packed", 64), ("grouped", 128)])
@pytest.mark.parametrize("op", ["gla", "kda"])
def test_the_head_dim_256_versions_match_the_reference(op, layout, V):
    """gla v6 (v4's prepare on each half of the key channels, P the sum of the halves' P, the 16-warp pass) and kda
    v10 (v6's sliced prepare at K = 256, the 16-warp pass refilling its one stage of tiles in two halves) against
    the float64 recurrent form: strong gates beside weak ones, a last partial chunk, an initial state, several
    chunks (kda v10's refills wrap); packed sequences (one of a single token) and grouped heads. Within bf16's
    tolerance, and within HEAD_DIM_256's factor of v1's output error (v1's state stays fp32, 1e-7: only its output
    is comparable)."""
    version, factor = HEAD_DIM_256[op]
    if not any(v == version for v, _ in cuda_version_cases(op)):
        pytest.skip(f"{op} v{version} does not run on this GPU")
    B, T, H, K = (2, 330, 4, 256) if layout != "packed" else (1, 500, 4, 256)
    args = inputs(op, (B, T, H, K, V), seed=61, strong=True)
    kwargs = {}
    if layout == "grouped":
        args[0], args[1] = args[0][:, :, ::2].copy(), args[1][:, :, ::2].copy()
    if layout == "packed":
        kwargs["cu_seqlens"] = np.asarray([0, 1, 64, 65, 200, 329, 330, 500], dtype=np.int32)
    on_gpu, host = to_device(args, "bfloat16")
    N = B if layout != "packed" else 7
    state0 = (0.5 * np.random.default_rng(62).standard_normal((N, H, K, V))).astype(np.float32)
    ref_o, ref_state = MIXERS[op].recurrent(*host, initial_state=state0.astype(np.float64), **kwargs)
    gpu_kwargs = {name: cupy.asarray(x) for name, x in kwargs.items()}
    errors = {}
    for v in (version, 1):
        o, state = getattr(mcuda, op)(*on_gpu, initial_state=cupy.asarray(state0), version=v, **gpu_kwargs)
        errors[v] = (rel_err(cupy.asnumpy(as_float32(o)).astype(np.float64), ref_o),
                     rel_err(cupy.asnumpy(state).astype(np.float64), ref_state))
    assert max(errors[version]) < TOLERANCE["bfloat16"], errors
    assert errors[version][0] <= factor * errors[1][0], errors


# (B, T, H, K, V, group) where kda v9 splits each sequence on an H100 or H200 (132 SMs): P = 8 (segments of 1024
# tokens), P = 4 at K = V = 128, K != V both ways (the identity's columns two or four blocks of 32, the values'
# the rest), grouped value heads (H value heads, H / group q/k heads), and P = 8 with the transitions pass on blocks
# of 64 columns (its cost model's choice at (1, 8192, 4, 128, 128); every other shape here takes 32).
KDA_SPLIT_SHAPES = [(1, 8192, 1, 64, 64, 1), (1, 4096, 2, 128, 128, 1), (2, 4096, 1, 128, 64, 1),
                    (1, 4096, 1, 64, 128, 1), (1, 4096, 4, 128, 64, 2), (1, 8192, 4, 128, 128, 1)]


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("with_state", [False, True], ids=["no_h0", "h0"])
@pytest.mark.parametrize("shape", KDA_SPLIT_SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}G{}".format(*s))
def test_kda_v9_splits_one_long_sequence_and_matches_the_reference(shape, with_state):
    """kda v9 where it does split (its workspace holds the transitions and the segments' states beyond v8's tiles),
    against the float64 recurrent form, strong gates beside weak ones, with and without an initial state; v8 beside
    it on the same input, and v9 no less accurate than v8 (the split's combine is fp32, so the two should agree to
    within their bf16 roundings)."""
    if not any(version == 9 for version, _ in cuda_version_cases("kda")):
        pytest.skip("kda v9 does not run on this GPU")
    *dims, group = shape
    B, T, H, K, V = dims
    cuda = mcuda.extension()
    assert cuda.workspace_bytes("kda", 9, *dims) > cuda.workspace_bytes("kda", 8, *dims), f"v9 does not split at {dims}"
    args = inputs("kda", tuple(dims), seed=43, strong=True)
    args[0], args[1] = args[0][:, :, ::group].copy(), args[1][:, :, ::group].copy()
    on_gpu, host = to_device(args, "bfloat16")
    state0 = (0.5 * np.random.default_rng(44).standard_normal((B, H, K, V))).astype(np.float32) if with_state else None
    ref_o, ref_state = kda.recurrent(*host, initial_state=None if state0 is None else state0.astype(np.float64))
    errors = {}
    for version in (9, 8):
        o, state = mcuda.kda(*on_gpu, initial_state=None if state0 is None else cupy.asarray(state0), version=version)
        errors[version] = (rel_err(cupy.asnumpy(as_float32(o)).astype(np.float64), ref_o),
                           rel_err(cupy.asnumpy(state).astype(np.float64), ref_state))
        assert max(errors[version]) < TOLERANCE["bfloat16"], (version, errors[version])
    assert errors[9][0] <= 1.5 * errors[8][0] and errors[9][1] <= 1.5 * errors[8][1], errors


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
def test_kda_versions_agree():
    """v1 (the definition) and v2 (chunked WY) on one long float32 input, strong gates included; and every bfloat16
    version against v1 on the same bfloat16 input."""
    args = inputs("kda", (1, 2000, 2, 128, 128), seed=12, strong=True)
    on_gpu, _ = to_device(args, "float32")
    o1, s1 = mcuda.kda(*on_gpu, version=1)
    o2, s2 = mcuda.kda(*on_gpu, version=2)
    assert rel_err(cupy.asnumpy(o2), cupy.asnumpy(o1)) < TOLERANCE["float32"]
    assert rel_err(cupy.asnumpy(s2), cupy.asnumpy(s1)) < TOLERANCE["float32"]
    bf16_versions_agree_with_v1("kda", to_device(args, "bfloat16")[0])


# (layout, B, T, H, V) for kda's passes over chunks: three blocks of 64 value columns, packed sequences, and 4 x 16
# heads, where the 32-column blocks would not all be resident and the 64-column pass runs.
KDA_PASS_CASES = [("plain", 2, 300, 2, 192), ("packed", 1, 300, 2, 128), ("plain", 4, 130, 16, 128)]


def kda_errors_against_recurrent(versions, shape, packed, seed):
    """{version: (output error, final state error)} of kda `versions` against the float64 recurrent form on one
    bfloat16 input of `shape` (strong gates beside weak ones) with an initial state; packed: the B = 1 tokens as 3
    sequences of 70, 1 and T - 71 tokens."""
    B, T, H, K, V = shape
    on_gpu, host = to_device(inputs("kda", shape, seed=seed, strong=True), "bfloat16")
    N, extra = (3, dict(cu_seqlens=np.array([0, 70, 71, T]))) if packed else (B, {})
    state0 = (0.5 * np.random.default_rng(seed + 1).standard_normal((N, H, K, V))).astype(np.float32)
    ref_o, ref_s = kda.recurrent(*host, initial_state=state0.astype(np.float64), **extra)
    gpu_extra = {key: cupy.asarray(value, dtype=cupy.int32) for key, value in extra.items()}
    errors = {}
    for version in versions:
        o, s = mcuda.kda(*on_gpu, initial_state=cupy.asarray(state0), version=version, **gpu_extra)
        errors[version] = (rel_err(cupy.asnumpy(as_float32(o)).astype(np.float64), ref_o),
                           rel_err(cupy.asnumpy(s).astype(np.float64), ref_s))
    return errors


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("layout", ["plain", "packed"])
def test_kda_v6_is_as_accurate_as_v5(K, layout):
    """v6 takes each diagonal block's (8..15, 0..7) quarter as a product of rows rescaled to token 7 of the sub-chunk
    and rounded to bf16 (v5: fp32 sums of per-term exponentials), so its outputs differ from v5's by bf16 roundings:
    against the float64 reference, at gates down to -20 beside weak ones, its error stays within 1.2x of v5's and
    within the bf16 tolerance (a float64 model of both with their bf16 roundings put the ratio at ~1.03 on these
    inputs); a wrong quadrant, a missing beta or an unwritten entry would be 10-100x v5's error."""
    if not any(version == 6 for version, _ in cuda_version_cases("kda")):
        pytest.skip("kda v6 does not run on this GPU")
    B, V = (1, 128) if layout == "packed" else (2, 128)
    errors = kda_errors_against_recurrent((5, 6), (B, 300, 2, K, V), layout == "packed", seed=25)
    assert all(e < TOLERANCE["bfloat16"] for e in errors[6]), errors
    assert errors[6][0] <= 1.2 * errors[5][0] and errors[6][1] <= 1.2 * errors[5][1], errors


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("layout, B, T, H, V", KDA_PASS_CASES)
def test_kda_v7_and_v8_equal_v6(K, layout, B, T, H, V):
    """v7 runs v6's prepare and v6's pass over chunks with its products reordered (Qr S in Kg S's k loop, P Delta
    beside Ke^T Delta), each accumulator summing the same k-steps in the same order, and v8 v7's with two copies of
    S and one barrier fewer: both equal v6 bit for bit (a product read from the wrong stage or state copy, a dropped
    k-step or a P Delta cut short would not be; a race on the copy shows only when it strikes in this run), with an
    initial state, packed sequences, and at 4 x 16 heads, where 32-column blocks would not all be resident and the
    64-column pass runs."""
    if not any(version == 8 for version, _ in cuda_version_cases("kda")):
        pytest.skip("kda v7 and v8 do not run on this GPU")
    args = inputs("kda", (B, T, H, K, V), seed=27, strong=True)
    on_gpu, _ = to_device(args, "bfloat16")
    offsets = [0, 70, 71, T]
    N, extra = (3, dict(cu_seqlens=cupy.asarray(offsets, dtype=cupy.int32))) if layout == "packed" else (B, {})
    state0 = cupy.asarray(0.5 * np.random.default_rng(28).standard_normal((N, H, K, V)), dtype=cupy.float32)
    o6, s6 = mcuda.kda(*on_gpu, initial_state=state0, version=6, **extra)
    assert bool(cupy.all(cupy.isfinite(as_float32(o6))))
    for version in (7, 8):
        o, s = mcuda.kda(*on_gpu, initial_state=state0, version=version, **extra)
        assert bool(cupy.all(as_float32(o) == as_float32(o6))) and bool(cupy.all(s == s6)), version


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("layout", ["plain", "packed"])
def test_kda_v5_equals_v4(K, layout):
    """v5 runs v4's prepare and, at these few (sequence, head) pairs (at most 2 x 2 x 6 = 24 blocks of 32 columns,
    under any card's SM count), v4's pass over chunks on 32 value columns a block instead of 64: every output element
    the same products in the same order, so equal bit for bit (a wrong column offset, state slice or tile width
    would not be), with an initial state, packed sequences too. That the 32-column pass is the one that runs here
    is the cost rule's (v5_narrow_value_blocks.cu `value_columns`); the benchmark shows it as v5's time differing
    from v4's at one long sequence."""
    if not any(version == 5 for version, _ in cuda_version_cases("kda")):
        pytest.skip("kda v5 does not run on this GPU")
    B, V = (1, 128) if layout == "packed" else (2, 192)
    args = inputs("kda", (B, 300, 2, K, V), seed=23, strong=True)
    on_gpu, _ = to_device(args, "bfloat16")
    N, extra = (3, dict(cu_seqlens=cupy.asarray([0, 70, 71, 300], dtype=cupy.int32))) if layout == "packed" else (B, {})
    state0 = cupy.asarray(0.5 * np.random.default_rng(24).standard_normal((N, 2, K, V)), dtype=cupy.float32)
    o4, s4 = mcuda.kda(*on_gpu, initial_state=state0, version=4, **extra)
    o5, s5 = mcuda.kda(*on_gpu, initial_state=state0, version=5, **extra)
    assert bool(cupy.all(as_float32(o5) == as_float32(o4))) and bool(cupy.all(s5 == s4))


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("K", [64, 128])
def test_kda_v4_equals_v3_up_to_the_order_of_its_sums(K):
    """v4 computes v3's workspace through 64-channel slices: every per-channel tile the same arithmetic, the blocks
    below the diagonal the same products in the same order, only the diagonal blocks' fp32 sums taken in another
    order, so that a bf16 rounding of P or T diag(beta) flips rarely (a sum within ~1e-7 of a rounding boundary).
    A wrong slice offset, decay table or accumulator would show as a difference of the order of the outputs."""
    if not any(version == 4 for version, _ in cuda_version_cases("kda")):
        pytest.skip("kda v4 does not run on this GPU")
    args = inputs("kda", (2, 300, 2, K, 128), seed=21, strong=True)
    on_gpu, _ = to_device(args, "bfloat16")
    state0 = cupy.asarray(0.5 * np.random.default_rng(22).standard_normal((2, 2, K, 128)), dtype=cupy.float32)
    o3, s3 = mcuda.kda(*on_gpu, initial_state=state0, version=3)
    o4, s4 = mcuda.kda(*on_gpu, initial_state=state0, version=4)
    assert rel_err(cupy.asnumpy(as_float32(o4)), cupy.asnumpy(as_float32(o3))) < 1e-4
    assert rel_err(cupy.asnumpy(s4), cupy.asnumpy(s3)) < 1e-4


@gpu
@pytest.mark.usefixtures("poisoned_allocations")
@pytest.mark.parametrize("version, dtype", cuda_version_cases("gla"))
def test_hgrn2_runs_on_every_gla_version(version, dtype):
    """HGRN2 through GLA's kernels (the key 1 - exp(g) formed on the GPU, minilin.cuda.hgrn2) against the float64
    NumPy recurrent form: a last partial chunk, an initial state, strong gates (down to -20) beside weak ones."""
    from minilin.mixers import hgrn2

    B, T, H, K, V = 2, 130, 2, key_width("gla", version, 64), 64
    rng = np.random.default_rng(51)
    strong = rng.random((1, 1, H, K)) < 0.5
    g = np.where(strong, rng.uniform(-20.0, 0.0, (B, T, H, K)), rng.uniform(-0.1, 0.0, (B, T, H, K)))
    q, v = rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, V))
    q_gpu, v_gpu, g_gpu = (cupy.asarray(x, dtype=cupy.float32) for x in (q, v, g))
    if dtype == "bfloat16":
        q_gpu, v_gpu = mcuda.to_bf16(q_gpu), mcuda.to_bf16(v_gpu)
    host = [cupy.asnumpy(as_float32(x)).astype(np.float64) for x in (q_gpu, v_gpu, g_gpu)]
    state0 = 0.5 * rng.standard_normal((B, H, K, V)).astype(np.float32)
    ref_o, ref_state = hgrn2.recurrent(*host, initial_state=state0.astype(np.float64))
    o, state = mcuda.hgrn2(q_gpu, v_gpu, g_gpu, initial_state=cupy.asarray(state0), version=version)
    err_o = rel_err(cupy.asnumpy(as_float32(o)).astype(np.float64), ref_o)
    err_state = rel_err(cupy.asnumpy(state).astype(np.float64), ref_state)
    assert err_o < TOLERANCE[dtype] and err_state < TOLERANCE[dtype], (err_o, err_state)


@gpu
def test_default_versions():
    """The last tensor-core rungs in bfloat16 (gla v5, kda v9 at K = 64 and 128; gla v6, kda v10 at K = 256, and
    with no shape given) and the
    recurrent ones in float32 (the chunked CUDA-core v2s are slower: front.SLOWER_RUNGS, csrc/NOTES.md)."""
    assert front.default_version("gla", True, 64, 64) == 5 and front.default_version("gla", False) == 1
    assert front.default_version("gla", True, 128, 128) == 5 and front.default_version("gla", True, 256, 128) == 6
    assert front.default_version("gla", True) == 6  # no shape given: the last rung (its checks refuse K != 256)
    assert front.default_version("kda", True) == 10 and front.default_version("kda", False) == 1
    assert front.default_version("kda", True, 128, 128) == 9 and front.default_version("kda", True, 256, 128) == 10
    assert front.default_version("kda", True, 64, 64) == 9  # v8's prepare and pass, faster than v3's there


@gpu
def test_runs_on_the_current_stream():
    on_gpu, host = to_device(inputs("gla", (1, 70, 2, 64, 64), seed=4), "float32")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        o, _ = mcuda.gla(*on_gpu, version=2)
    stream.synchronize()
    ref, _ = gla.recurrent(*host)
    assert rel_err(cupy.asnumpy(o), ref) < 1e-4


# ---- on the GPU: bad inputs raise before any launch, naming the argument ----------------------------------------
def good(op, dtype="float32", shape=(2, 100, 3, 64, 64)):
    on_gpu, _ = to_device(inputs(op, shape, seed=0), dtype)
    return on_gpu


@gpu
@pytest.mark.parametrize("op", ["gla", "kda"])
def test_bad_inputs_raise(op):
    args = good(op)
    call = getattr(mcuda, op)

    def replaced(i, x):
        return [x if j == i else a for j, a in enumerate(args)]

    q, k, v, g = args[:4]
    with pytest.raises(ValueError, match=r"g: expected shape \[B, T, HV, K\] = \[2, 100, 3, 64\], got \[2, 100, 3\]"):
        call(*replaced(3, cupy.ascontiguousarray(g[..., 0])))
    with pytest.raises(TypeError, match="g: expected float32"):
        call(*replaced(3, g.astype(cupy.float16)))
    with pytest.raises(ValueError, match="g: expected log-space decay"):
        call(*replaced(3, -g))
    with pytest.raises(ValueError, match="g: expected finite values"):
        call(*replaced(3, cupy.where(g < -0.5, cupy.float32(np.nan), g)))
    with pytest.raises(TypeError, match="k: expected the dtype of q"):
        call(*replaced(1, mcuda.to_bf16(k)))
    with pytest.raises(ValueError, match=r"v: expected shape \[B, T, HV, V\] = \[2, 100, HV, V\]"):
        call(*replaced(2, v[:, :50]))
    with pytest.raises(ValueError, match="initial_state: expected shape"):
        call(*args, initial_state=cupy.zeros((2, 3, 64, 32), cupy.float32))
    with pytest.raises(ValueError, match="version: expected one of"):
        call(*args, version=42)
    with pytest.raises(TypeError, match="version: expected an integer"):
        call(*args, version="1")
    q12, k12, g12 = (cupy.ascontiguousarray(x[..., :12]) for x in (q, k, g))
    with pytest.raises(ValueError, match="K and V must be multiples of 8"):
        call(*[q12, k12, v, g12, *args[4:]], check_values=False)
    if op == "gla":
        wide = good("gla", shape=(1, 10, 1, 256, 32))
        with pytest.raises(ValueError, match=r"gla_v2_chunked: K must be <= 128"):
            mcuda.gla(*wide, version=2)
        with pytest.raises(TypeError, match=r"version: gla version 3 \(chunked_mma\) takes bfloat16 inputs only"):
            call(*args, version=3)
        narrow = good("gla", "bfloat16", shape=(1, 10, 1, 64, 32))
        with pytest.raises(ValueError, match=r"gla_v3_chunked_mma: V must be a multiple of 64, got V=32"):
            mcuda.gla(*narrow, version=3)
    else:
        beta = args[4]
        with pytest.raises(ValueError, match="beta: expected values in"):
            call(*replaced(4, beta + 1.5))
        with pytest.raises(ValueError, match=r"beta: expected shape \[B, T, HV\]"):
            call(*replaced(4, cupy.ascontiguousarray(beta[:, :, :2])))
        with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 1"):
            call(*replaced(1, 3 * k))
        with pytest.raises(TypeError, match="normalize_qk: expected True or False"):
            call(*args, normalize_qk="yes")


# ---- wherever the extension is built (no GPU needed): the ladder and the kernels' own checks --------------------
def test_the_extension_lists_the_channel_ops():
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    ladder = {(v["op"], v["version"]): v for v in cuda.versions() if v["op"] in ("gla", "kda")}
    assert sorted(ladder) == [("gla", 1), ("gla", 2), ("gla", 3), ("gla", 4), ("gla", 5), ("gla", 6), ("kda", 1),
                              ("kda", 2), ("kda", 3), ("kda", 4), ("kda", 5), ("kda", 6), ("kda", 7),
                              ("kda", 8), ("kda", 9), ("kda", 10)]
    assert [ladder[key]["name"] for key in sorted(ladder)] == ["recurrent", "chunked", "chunked_mma", "prepared_chunks",
                                                               "split_sequence", "head_dim_256", "recurrent", "chunked",
                                                               "prepared_chunks", "sliced_prepare",
                                                               "narrow_value_blocks", "half_sub_chunks",
                                                               "output_with_memory", "two_state_copies",
                                                               "split_sequence", "head_dim_256"]
    assert all(v["bfloat16"] and v["max_compute_capability"] == 0 for v in ladder.values())
    # v3's chunk kernel's 193 KB of shared memory, which v4 to v9 run too (v8's and v9's 211 KB); gla v6's 224 KB,
    # kda v10's 181 KB
    assert all(ladder[("kda", n)]["min_compute_capability"] == 90 for n in (3, 4, 5, 6, 7, 8, 9, 10))
    assert ladder[("gla", 6)]["min_compute_capability"] == 90 and ladder[("gla", 5)]["min_compute_capability"] == 80
    tensor_cores = [("gla", 3), ("gla", 4), ("gla", 5), ("gla", 6), ("kda", 3), ("kda", 4), ("kda", 5), ("kda", 6), ("kda", 7),
                    ("kda", 8), ("kda", 9), ("kda", 10)]
    assert [key for key, v in sorted(ladder.items()) if not v["float32"]] == tensor_cores  # bf16 only
    assert all(cuda.workspace_bytes(op, n, 2, 100, 3, 64, 64) == 0 for op, n in ladder if (op, n) not in tensor_cores[1:])
    # gla v4's prepared tiles, per chunk row and head: Qr and Ke [64, K] and P [64, 64] in bf16, the decay [K] in
    # fp32; 2 sequences of 100 tokens take 2 chunk rows each, packed into 200 tokens 200 // 64 + 2 rows
    per_row = 64 * 64 * 2 * 2 + 64 * 64 * 2 + 64 * 4
    assert cuda.workspace_bytes("gla", 4, 2, 100, 3, 64, 64) == 3 * 4 * per_row
    assert cuda.workspace_bytes("gla", 4, 2, 200, 3, 64, 64, packed=True) == 3 * 5 * per_row
    # v5 splits no sequence shorter than two segments of 1024 tokens: there it needs v4's tiles only
    assert cuda.workspace_bytes("gla", 5, 2, 100, 3, 64, 64) == 3 * 4 * per_row
    # v6 at K = 256: v4's tiles at K = 128 for each half of the key channels, as 2 H heads
    half_row = 64 * 128 * 2 * 2 + 64 * 64 * 2 + 128 * 4
    assert cuda.workspace_bytes("gla", 6, 2, 100, 3, 256, 64) == 2 * 3 * 4 * half_row
    # kda v3's: Qr, Kg, Ke [64, K] and P, T diag(beta) [64, 64] in bf16, the decay [K] in fp32
    assert cuda.workspace_bytes("kda", 3, 2, 100, 3, 64, 64) == 3 * 4 * (3 * 64 * 64 * 2 + 2 * 64 * 64 * 2 + 64 * 4)
    assert cuda.workspace_bytes("kda", 4, 2, 100, 3, 64, 64) == cuda.workspace_bytes("kda", 3, 2, 100, 3, 64, 64)
    assert cuda.workspace_bytes("kda", 5, 2, 100, 3, 64, 64) == cuda.workspace_bytes("kda", 3, 2, 100, 3, 64, 64)
    assert cuda.workspace_bytes("kda", 6, 2, 100, 3, 64, 64) == cuda.workspace_bytes("kda", 3, 2, 100, 3, 64, 64)
    assert cuda.workspace_bytes("kda", 7, 2, 100, 3, 64, 64) == cuda.workspace_bytes("kda", 3, 2, 100, 3, 64, 64)
    assert cuda.workspace_bytes("kda", 8, 2, 100, 3, 64, 64) == cuda.workspace_bytes("kda", 3, 2, 100, 3, 64, 64)
    # the registry keeps op order: the channel ops before decode, which has one version
    ops = [v["op"] for v in cuda.versions()]
    assert ops.index("kda") < ops.index("decode") and [v["version"] for v in cuda.versions() if v["op"] == "decode"] == [1]


def forward_call(op, version, *, K=64, V=64, g=1, beta=1, dtype=0):
    """cuda.forward's arguments with fake non-null pointers: every call here must fail its checks before any CUDA
    call (a launch would read these addresses)."""
    return (op, version, 1, 1, 1, g, beta, 0, 1, 1, 0, 0, 2, 100, 3, K, V, 1.0, dtype, 0)


@pytest.mark.parametrize("op, version, changes, message", [
    ("gla", 1, dict(g=0), r"gla_v1_recurrent: g must be a device pointer"),
    ("gla", 2, dict(g=0), r"gla_v2_chunked: g must be a device pointer"),
    ("kda", 1, dict(g=0), r"kda_v1_recurrent: g must be a device pointer"),
    ("kda", 1, dict(beta=0), r"kda_v1_recurrent: beta must be a device pointer"),
    ("gla", 1, dict(K=12), r"gla_v1_recurrent: K and V must be multiples of 8"),
    ("kda", 1, dict(V=20), r"kda_v1_recurrent: K and V must be multiples of 8"),
    ("gla", 1, dict(K=264), r"gla_v1_recurrent: K must be <= 256"),
    ("kda", 1, dict(K=264), r"kda_v1_recurrent: K must be <= 256"),
    ("gla", 2, dict(K=136), r"gla_v2_chunked: K must be <= 128"),
    ("gla", 2, dict(dtype=7), r"gla_v2_chunked: dtype code must be 0"),
    ("gla", 3, dict(dtype=0), r"gla_v3_chunked_mma: bfloat16 inputs only"),
    ("gla", 3, dict(dtype=1, K=96), r"gla_v3_chunked_mma: K must be 64 or 128, got K=96"),
    ("gla", 3, dict(dtype=1, V=96), r"gla_v3_chunked_mma: V must be a multiple of 64, got V=96"),
    ("gla", 3, dict(dtype=1, g=0), r"gla_v3_chunked_mma: g must be a device pointer"),
    ("gla", 4, dict(dtype=0), r"gla_v4_prepared_chunks: bfloat16 inputs only"),
    ("gla", 4, dict(dtype=1, K=96), r"gla_v4_prepared_chunks: K must be 64 or 128, got K=96"),
    ("gla", 4, dict(dtype=1, V=96), r"gla_v4_prepared_chunks: V must be a multiple of 64, got V=96"),
    ("gla", 4, dict(dtype=1, g=0), r"gla_v4_prepared_chunks: g must be a device pointer"),
    ("gla", 4, dict(dtype=1), r"gla_v4_prepared_chunks: needs a workspace of 297984 bytes, got 0"),
    ("gla", 5, dict(dtype=0), r"gla_v5_split_sequence: bfloat16 inputs only"),
    ("gla", 5, dict(dtype=1, K=96), r"gla_v5_split_sequence: K must be 64 or 128, got K=96"),
    ("gla", 5, dict(dtype=1, g=0), r"gla_v5_split_sequence: g must be a device pointer"),
    ("gla", 5, dict(dtype=1), r"gla_v5_split_sequence: needs a workspace of 297984 bytes, got 0"),
    ("gla", 7, {}, r"gla has versions 1, 2, 3, 4, 5, 6, got 7"),
    ("kda", 2, dict(g=0), r"kda_v2_chunked: g must be a device pointer"),
    ("kda", 2, dict(beta=0), r"kda_v2_chunked: beta must be a device pointer"),
    ("kda", 2, dict(K=136), r"kda_v2_chunked: K must be <= 128"),
    ("kda", 3, dict(dtype=0), r"kda_v3_prepared_chunks: bfloat16 inputs only"),
    ("kda", 3, dict(dtype=1, K=96), r"kda_v3_prepared_chunks: K must be 64 or 128, got K=96"),
    ("kda", 3, dict(dtype=1, V=96), r"kda_v3_prepared_chunks: V must be a multiple of 64, got V=96"),
    ("kda", 3, dict(dtype=1, g=0), r"kda_v3_prepared_chunks: g must be a device pointer"),
    ("kda", 3, dict(dtype=1, beta=0), r"kda_v3_prepared_chunks: beta must be a device pointer"),
    ("kda", 3, dict(dtype=1), r"kda_v3_prepared_chunks: needs a workspace of 494592 bytes, got 0"),
    ("kda", 4, dict(dtype=0), r"kda_v4_sliced_prepare: bfloat16 inputs only"),
    ("kda", 4, dict(dtype=1, K=96), r"kda_v4_sliced_prepare: K must be 64 or 128, got K=96"),
    ("kda", 4, dict(dtype=1, g=0), r"kda_v4_sliced_prepare: g must be a device pointer"),
    ("kda", 4, dict(dtype=1), r"kda_v4_sliced_prepare: needs a workspace of 494592 bytes, got 0"),
    ("kda", 5, dict(dtype=0), r"kda_v5_narrow_value_blocks: bfloat16 inputs only"),
    ("kda", 5, dict(dtype=1, V=96), r"kda_v5_narrow_value_blocks: V must be a multiple of 64, got V=96"),
    ("kda", 5, dict(dtype=1), r"kda_v5_narrow_value_blocks: needs a workspace of 494592 bytes, got 0"),
    ("kda", 6, dict(dtype=0), r"kda_v6_half_sub_chunks: bfloat16 inputs only"),
    ("kda", 6, dict(dtype=1, K=96), r"kda_v6_half_sub_chunks: K must be 64 or 128, got K=96"),
    ("kda", 6, dict(dtype=1), r"kda_v6_half_sub_chunks: needs a workspace of 494592 bytes, got 0"),
    ("kda", 7, dict(dtype=0), r"kda_v7_output_with_memory: bfloat16 inputs only"),
    ("kda", 7, dict(dtype=1, V=96), r"kda_v7_output_with_memory: V must be a multiple of 64, got V=96"),
    ("kda", 7, dict(dtype=1), r"kda_v7_output_with_memory: needs a workspace of 494592 bytes, got 0"),
    ("kda", 8, dict(dtype=0), r"kda_v8_two_state_copies: bfloat16 inputs only"),
    ("kda", 8, dict(dtype=1), r"kda_v8_two_state_copies: needs a workspace of 494592 bytes, got 0"),
    ("kda", 9, dict(dtype=0), r"kda_v9_split_sequence: bfloat16 inputs only"),
    ("kda", 9, dict(dtype=1), r"kda_v9_split_sequence: needs a workspace of 494592 bytes, got 0"),
    ("kda", 11, {}, r"kda has versions 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, got 11"),
])
def test_the_extension_checks_a_channel_call_before_any_cuda_call(op, version, changes, message):
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    with pytest.raises(ValueError, match=message):
        cuda.forward(*forward_call(op, version, **changes))


# ---- anywhere: the front's checks, with a stand-in for CuPy --------------------------------------------------------
def fake_arrays(B=2, T=10, H=3, K=16, V=8):
    rng = np.random.default_rng(0)
    q, k = (FakeArray(rng.standard_normal((B, T, H, K)).astype(np.float32)) for _ in range(2))
    v = FakeArray(rng.standard_normal((B, T, H, V)).astype(np.float32))
    g = FakeArray(-rng.uniform(0.01, 1, (B, T, H, K)).astype(np.float32))
    beta = FakeArray(rng.uniform(0, 1, (B, T, H)).astype(np.float32))
    return q, k, v, g, beta


def test_the_channel_ops_reach_their_launch(fake_cupy):  # noqa: F811 - the fixture
    q, k, v, g, beta = fake_arrays()
    assert mcuda.gla(q, k, v, g, check_values=False) == "launched"
    assert mcuda.kda(q, k, v, g, beta, check_values=False) == "launched"
    sizes = {"B": 2, "T": 10, "H": 3, "K": 16, "V": 8}
    assert fake_cupy == [("gla", sizes), ("kda", sizes)]


@pytest.mark.parametrize("op, case, error, message", [
    ("gla", "g per head", ValueError, r"g: expected shape \[B, T, HV, K\] = \[2, 10, 3, 16\], got \[2, 10, 3\]"),
    ("kda", "g per head", ValueError, r"g: expected shape \[B, T, HV, K\] = \[2, 10, 3, 16\], got \[2, 10, 3\]"),
    ("gla", "g bf16 bits", TypeError, r"g: expected float32 \(gates, beta and states are kept in float32\)"),
    ("kda", "beta per channel", ValueError, r"beta: expected shape \[B, T, HV\] = \[2, 10, 3\], got \[2, 10, 3, 16\]"),
    ("gla", "empty sequence", ValueError, r"q: expected at least one token"),
    ("kda", "state shape", ValueError, r"initial_state: expected shape \[B, HV, K, V\] = \[2, 3, 16, 8\]"),
])
def test_the_channel_ops_name_the_bad_argument(fake_cupy, op, case, error, message):  # noqa: F811 - the fixture
    q, k, v, g, beta = fake_arrays(T=0 if case == "empty sequence" else 10)
    kwargs = {}
    if case == "g per head":
        g = FakeArray(g._data[..., 0].copy())
    elif case == "g bf16 bits":
        g = FakeArray(np.zeros(g.shape, np.uint16))
    elif case == "beta per channel":
        beta = FakeArray(np.broadcast_to(beta._data[..., None], g.shape).copy())
    elif case == "state shape":
        kwargs["initial_state"] = FakeArray(np.zeros((2, 3, 8, 16), np.float32))
    args = (q, k, v, g) if op == "gla" else (q, k, v, g, beta)
    with pytest.raises(error, match=message):
        getattr(mcuda, op)(*args, check_values=False, **kwargs)
    assert fake_cupy == []


def test_the_catalog_serves_gla_and_kda_on_their_ops():
    assert mcuda.OPS["gla"] == "gla" and mcuda.OPS["kda"] == "kda"
    assert mcuda.STEPS["gla"] is mcuda.gla_step and mcuda.STEPS["kda"] is mcuda.kda_step  # decode unchanged
    from minilin.bench import gpu as bench_gpu

    assert bench_gpu.TENSORS["gla"] == ("q", "k", "v", "g") and bench_gpu.TENSORS["kda"] == ("q", "k", "v", "g", "beta")
