"""The decode kernel (csrc/decode/) against the NumPy `step` forms in float64, on the GPU; its C++ checks anywhere the
extension is built.

GPU tests are skipped, with the reason, where CuPy, a GPU or the built extension is missing. Every CuPy allocation
made during them is filled with NaN bytes first (0xFF..), so an output or state row the kernel forgets to write
fails the comparison. States start from fresh random values, never zeros (a kernel that ignored its input state
would pass on zeros).
"""
from __future__ import annotations

import numpy as np
import pytest

from minilin import catalog
from minilin import cuda as mcuda
from conftest import rel_err

OK, REASON = mcuda.available()
gpu = pytest.mark.skipif(not OK, reason=REASON or "CUDA extension unavailable")
pytestmark = pytest.mark.usefixtures("poisoned_allocations")  # conftest.py: unwritten outputs read NaN
if OK:
    import cupy

TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2}
MIXERS = ["linear_attention", "simple_gla", "gla", "retnet", "lightning", "mamba2", "deltanet", "gated_deltanet", "kda",
          "hgrn2"]
DELTA = {"deltanet", "gated_deltanet", "kda"}
# (N, H, K, V): one sequence and head; K != V both ways; K = 40 (not a multiple of 16: a partial row group) with
# V = 36 (a partial 32-column tile); K = 256, the largest; the benchmark's head size.
SHAPES = [(1, 1, 128, 128), (3, 2, 64, 32), (2, 3, 32, 96), (3, 2, 40, 36), (2, 1, 256, 64), (4, 2, 128, 128)]




# ---- inputs ----------------------------------------------------------------------------------------------
SEQUENCE = {"mamba2": (0, 3, 4), "hgrn2": (0, 1)}  # positions of the arrays that are bf16 when the dtype is (q, k, v by default)


def one_token(mixer, N, H, K, V, seed, T=1):
    """(host args in float64 with T tokens, kwargs): the mixer's own example inputs, T = 1 unless asked."""
    return catalog.module(mixer).example_inputs(N, T, H, K, V, seed=seed)


def per_token(arg) -> bool:
    return arg.ndim >= 3  # [B, T, ...] inputs; [H] parameters (A, D) are not


def to_device(args, dtype, mixer):
    """Host float64 args -> (GPU args: the sequence tensors in `dtype`, the rest float32; the float64 values the
    reference must see, after rounding to bfloat16 where that applies). The delta rule's keys are scaled by
    bf16.UNIT_KEY_SCALE first."""
    sequence = SEQUENCE.get(mixer, (0, 1, 2))
    gpu_args, host = [], []
    for i, a in enumerate(args):
        if mixer in DELTA and i == 1:  # unit keys that stay within |k| <= 1 once rounded (the reference checks)
            a = a * mcuda.bf16.UNIT_KEY_SCALE
        x = cupy.asarray(a, dtype=cupy.float32)
        if dtype == "bfloat16" and i in sequence:
            x = mcuda.to_bf16(x)
            host.append(cupy.asnumpy(mcuda.from_bf16(x)).astype(np.float64))
        else:
            host.append(cupy.asnumpy(x).astype(np.float64))
        gpu_args.append(x)
    return gpu_args, host


def token_slice(args, t):
    return [a[:, t] if per_token(a) else a for a in args]


def as_float32(o):
    return mcuda.from_bf16(o) if mcuda.bf16.is_bf16(o.dtype) else o


def random_states(P, H, K, V, seed):
    return np.random.default_rng(seed).standard_normal((P, H, K, V)).astype(np.float32) * 0.5


def reference_step(mixer, host_token, state64):
    o, S = catalog.module(mixer).step(*host_token, state=state64)
    return o, S


def gpu_step(mixer, gpu_token, **kwargs):
    return mcuda.STEPS[mixer](*gpu_token, **kwargs)


# ---- one step, every mixer, both dtypes, every state form ------------------------------------------------
@gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_one_step_in_place_on_a_pool_matches_the_numpy_step(mixer, dtype, shape):
    N, H, K, V = shape
    args, _ = one_token(mixer, N, H, K, V, seed=N + K)
    gpu_args, host = to_device(token_slice(args, 0), dtype, mixer)
    P = N + 3
    pool0 = random_states(P, H, K, V, seed=V)
    rows = np.random.default_rng(K).permutation(P)[:N]
    for index_dtype in (np.int32, np.int64):
        pool = cupy.asarray(pool0)
        o, returned = gpu_step(mixer, gpu_args, state=pool, state_indices=cupy.asarray(rows, dtype=index_dtype))
        ref_o, ref_S = reference_step(mixer, host, pool0[rows].astype(np.float64))
        assert returned is pool, "in place: the pool itself comes back"
        assert o.shape == ref_o.shape and o.dtype == gpu_args[0].dtype
        tol = TOLERANCE[dtype]
        err_o, err_S = rel_err(cupy.asnumpy(as_float32(o)), ref_o), rel_err(cupy.asnumpy(pool)[rows], ref_S)
        assert err_o < tol and err_S < tol, f"{mixer} {dtype} {shape} {index_dtype.__name__}: o {err_o:.2e}, " \
                                            f"state {err_S:.2e}"
        others = np.setdiff1d(np.arange(P), rows)
        assert np.array_equal(cupy.asnumpy(pool)[others], pool0[others]), "rows not indexed must stay bit for bit"


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_out_of_place_in_place_and_zero_states_agree_with_the_numpy_step(mixer, dtype):
    N, H, K, V = 3, 2, 64, 64
    args, _ = one_token(mixer, N, H, K, V, seed=5)
    gpu_args, host = to_device(token_slice(args, 0), dtype, mixer)
    tol = TOLERANCE[dtype]
    S0 = random_states(N, H, K, V, seed=6)
    ref_o, ref_S = reference_step(mixer, host, S0.astype(np.float64))

    state = cupy.asarray(S0)
    o, new = gpu_step(mixer, gpu_args, state=state, in_place=False)
    assert new is not state and np.array_equal(cupy.asnumpy(state), S0), "out of place: the input state is untouched"
    assert rel_err(cupy.asnumpy(as_float32(o)), ref_o) < tol and rel_err(cupy.asnumpy(new), ref_S) < tol

    out = cupy.empty(o.shape, o.dtype)
    o2, new2 = gpu_step(mixer, gpu_args, state=state, out=out)  # in place, into a given output
    assert o2 is out and new2 is state
    assert bool((o2 == o).all()) and bool((new2 == new).all()), "in place and out of place compute the same bits"

    o3, new3 = gpu_step(mixer, gpu_args, state=None)
    ref_o3, ref_S3 = reference_step(mixer, host, None)
    assert new3.shape == (N, H, K, V) and new3.dtype == cupy.float32
    assert rel_err(cupy.asnumpy(as_float32(o3)), ref_o3) < tol and rel_err(cupy.asnumpy(new3), ref_S3) < tol


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mixer", ["simple_gla", "gla", "mamba2", "gated_deltanet", "kda", "hgrn2"])
def test_many_steps_follow_the_recurrent_form(mixer, dtype):
    """T steps from an initial state equal the token loop over T tokens: the state carried from step to step is
    laid out as the next step reads it."""
    N, H, K, V, T = 2, 2, 64, 64, 24
    args, kwargs = one_token(mixer, N, H, K, V, seed=8, T=T)
    S0 = random_states(N, H, K, V, seed=9)
    gpu_all, host_all = to_device(args, dtype, mixer)
    ref_o, ref_S = catalog.module(mixer).recurrent(*host_all, **kwargs, initial_state=S0.astype(np.float64))
    state = cupy.asarray(S0)
    outputs = []
    for t in range(T):
        o, state = gpu_step(mixer, [cupy.ascontiguousarray(a) for a in token_slice(gpu_all, t)], state=state)
        outputs.append(cupy.asnumpy(as_float32(o)))
    tol = TOLERANCE[dtype]
    assert rel_err(np.stack(outputs, axis=1), ref_o) < tol
    assert rel_err(cupy.asnumpy(state), ref_S) < tol


# ---- continuous batching: forks, bad rows ----------------------------------------------------------------
@gpu
def test_a_fork_reads_one_state_for_several_sequences_out_of_place():
    N, H, K, V = 4, 2, 64, 64
    args, _ = one_token("gated_deltanet", N, H, K, V, seed=11)
    gpu_args, host = to_device(token_slice(args, 0), "float32", "gated_deltanet")
    pool0 = random_states(3, H, K, V, seed=12)
    rows = np.array([2, 2, 0, 2])
    pool = cupy.asarray(pool0)
    o, new = mcuda.gated_deltanet_step(*gpu_args, state=pool, state_indices=cupy.asarray(rows, dtype=cupy.int32),
                                       in_place=False)
    ref_o, ref_S = reference_step("gated_deltanet", host, pool0[rows].astype(np.float64))
    assert rel_err(cupy.asnumpy(o), ref_o) < 1e-4 and rel_err(cupy.asnumpy(new), ref_S) < 1e-4
    assert np.array_equal(cupy.asnumpy(pool), pool0)
    with pytest.raises(ValueError, match=r"state_indices: expected distinct rows in place"):
        mcuda.gated_deltanet_step(*gpu_args, state=pool, state_indices=cupy.asarray(rows, dtype=cupy.int32))
    assert np.array_equal(cupy.asnumpy(pool), pool0), "a refused call writes nothing"


@gpu
def test_a_row_outside_the_pool_is_refused_and_unchecked_touches_nothing():
    N, H, K, V = 3, 2, 64, 64
    args, _ = one_token("kda", N, H, K, V, seed=13)
    gpu_args, host = to_device(token_slice(args, 0), "float32", "kda")
    pool0 = random_states(4, H, K, V, seed=14)
    pool = cupy.asarray(pool0)
    bad = cupy.asarray([1, 4, 3], dtype=cupy.int64)
    with pytest.raises(ValueError, match=r"state_indices: expected rows of the state pool, in \[0, 4\)"):
        mcuda.kda_step(*gpu_args, state=pool, state_indices=bad)
    o, _ = mcuda.kda_step(*gpu_args, state=pool, state_indices=bad, check_values=False)
    o = cupy.asnumpy(o)
    after = cupy.asnumpy(pool)
    assert np.isnan(o[1]).all(), "the sequence with a bad row gets NaN outputs"
    assert np.array_equal(after[[0, 2]], pool0[[0, 2]]), "and no row is written for it (nor are unindexed rows)"
    ref_o, ref_S = reference_step("kda", [a[[0, 2]] for a in host], pool0[[1, 3]].astype(np.float64))
    assert rel_err(o[[0, 2]], ref_o) < 1e-4 and rel_err(after[[1, 3]], ref_S) < 1e-4, "the others are right"


# ---- normalize_qk and the key check ----------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mixer", sorted(DELTA))
def test_step_normalize_qk_equals_the_step_on_normalized_keys(mixer, dtype):
    N, H, K, V = 3, 2, 128, 64
    args, _ = one_token(mixer, N, H, K, V, seed=15)
    args = [3.0 * a if i in (0, 1) else a for i, a in enumerate(args)]  # |q|, |k| = 3 |unit|: not normalized
    gpu_args, host = to_device(token_slice(args, 0), dtype, mixer)
    S0 = random_states(N, H, K, V, seed=16)
    with pytest.raises(ValueError, match=r"k, beta: expected beta \|k\|\^2 <= 1"):
        mcuda.STEPS[mixer](*gpu_args, state=cupy.asarray(S0))
    o, S = mcuda.STEPS[mixer](*gpu_args, state=cupy.asarray(S0), normalize_qk=True)
    ref_o, ref_S = catalog.module(mixer).step(*host, state=S0.astype(np.float64), normalize_qk=True)
    tol = TOLERANCE[dtype]
    assert rel_err(cupy.asnumpy(as_float32(o)), ref_o) < tol and rel_err(cupy.asnumpy(S), ref_S) < tol


@gpu
@pytest.mark.parametrize("mixer", ["deltanet", "gated_deltanet"])
def test_forward_normalize_qk_equals_the_recurrent_form_on_normalized_keys(mixer):
    B, T, H, K, V = 2, 100, 2, 64, 64
    args, _ = one_token(mixer, B, H, K, V, seed=17, T=T)
    args = [2.5 * a if i in (0, 1) else a for i, a in enumerate(args)]
    gpu_args, host = to_device(args, "bfloat16", mixer)
    o, S = getattr(mcuda, mixer)(*gpu_args, normalize_qk=True)
    ref_o, ref_S = catalog.module(mixer).recurrent(*host, normalize_qk=True)
    assert rel_err(cupy.asnumpy(as_float32(o)), ref_o) < 1e-2 and rel_err(cupy.asnumpy(S), ref_S) < 1e-2


@gpu
def test_allow_neg_eigval_takes_beta_up_to_two_with_unit_keys():
    N, H, K, V = 3, 2, 64, 64
    args, _ = one_token("gated_deltanet", N, H, K, V, seed=18)
    args = list(args)
    args[4] = 2.0 * args[4]  # beta in [0, 2]
    gpu_args, host = to_device(token_slice(args, 0), "float32", "gated_deltanet")
    S0 = random_states(N, H, K, V, seed=19)
    with pytest.raises(ValueError, match=r"beta: expected values in \[0, 1\]"):
        mcuda.gated_deltanet_step(*gpu_args, state=cupy.asarray(S0))
    o, S = mcuda.gated_deltanet_step(*gpu_args, state=cupy.asarray(S0), allow_neg_eigval=True)
    ref_o, ref_S = catalog.module("gated_deltanet").step(*host, state=S0.astype(np.float64), allow_neg_eigval=True)
    assert rel_err(cupy.asnumpy(o), ref_o) < 1e-4 and rel_err(cupy.asnumpy(S), ref_S) < 1e-4


# ---- races, streams --------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("mixer", ["gated_deltanet", "kda", "simple_gla"])
def test_repeated_steps_are_bit_identical(mixer):
    """A race shows as outputs that differ between runs on the same inputs (64 sequences, 16 heads)."""
    args, _ = one_token(mixer, 64, 16, 128, 128, seed=20)
    gpu_args, _ = to_device(token_slice(args, 0), "bfloat16", mixer)
    state = cupy.asarray(random_states(64, 16, 128, 128, seed=21))
    first = gpu_step(mixer, gpu_args, state=state, in_place=False)
    for _ in range(3):
        again = gpu_step(mixer, gpu_args, state=state, in_place=False)
        assert bool((again[0] == first[0]).all()) and bool((again[1] == first[1]).all())


@gpu
def test_a_step_runs_on_the_current_stream():
    args, _ = one_token("simple_gla", 2, 2, 64, 64, seed=22)
    gpu_args, host = to_device(token_slice(args, 0), "float32", "simple_gla")
    S0 = random_states(2, 2, 64, 64, seed=23)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        state = cupy.asarray(S0)
        o, state = mcuda.simple_gla_step(*gpu_args, state=state)
    stream.synchronize()
    ref_o, ref_S = reference_step("simple_gla", host, S0.astype(np.float64))
    assert rel_err(cupy.asnumpy(o), ref_o) < 1e-4 and rel_err(cupy.asnumpy(state), ref_S) < 1e-4


@gpu
def test_the_kernel_refuses_what_the_front_does_not_check():
    """Sizes the front lets through but the kernel cannot take: ValueError from the extension, nothing written."""
    args, _ = one_token("simple_gla", 2, 2, 64, 30, seed=24)  # V = 30: not a multiple of 4
    gpu_args, _ = to_device(token_slice(args, 0), "float32", "simple_gla")
    with pytest.raises(ValueError, match=r"decode_v1_register_tiles: V must be a multiple of 4"):
        mcuda.simple_gla_step(*gpu_args, state=cupy.asarray(random_states(2, 2, 64, 30, seed=25)))
    args, _ = one_token("simple_gla", 1, 1, 264, 32, seed=26)
    gpu_args, _ = to_device(token_slice(args, 0), "float32", "simple_gla")
    with pytest.raises(ValueError, match=r"K must be <= 256"):
        mcuda.simple_gla_step(*gpu_args)
    args, _ = one_token("simple_gla", 2, 2, 64, 32, seed=27)
    gpu_args, _ = to_device(token_slice(args, 0), "float32", "simple_gla")
    backing = cupy.asarray(random_states(1, 1, 1, 2 * 2 * 64 * 32 + 1, seed=28)).ravel()
    shifted = backing[1:].reshape(2, 2, 64, 32)  # C-contiguous, but 4 bytes into its allocation
    assert shifted.flags.c_contiguous
    before = cupy.asnumpy(shifted)
    with pytest.raises(ValueError, match=r"the states must be 16-byte aligned"):
        mcuda.simple_gla_step(*gpu_args, state=shifted)
    assert np.array_equal(cupy.asnumpy(shifted), before)


# ---- the extension's own checks (no GPU needed, only the built module) ------------------------------------
def decode_call(**changes):
    args = dict(version=1, q=256, k=256, v=256, g=0, gate=0, beta=0, state_in=0, in_indices=0, pool_in=0,
                state_out=256, out_indices=0, pool_out=1, indices_int64=False, o=256, N=1, H=1, K=8, V=8, scale=1.0,
                delta=False, normalize_qk=False, dtype=0, stream=0)
    args.update(changes)
    return args


@pytest.mark.parametrize("changes, message", [
    (dict(K=300), r"K must be <= 256"),
    (dict(V=6), r"V must be a multiple of 4"),
    (dict(N=0), r"sizes must be positive, got N=0"),
    (dict(delta=True), r"beta must be a device pointer for the delta rule"),
    (dict(gate=1), r"g must be null exactly when the gate code is 0, got gate 1 with null"),
    (dict(g=256), r"got gate 0 with a pointer"),
    (dict(gate=3, g=256), r"gate code must be 0 \(none\), 1 \(scalar\) or 2 \(per channel\), got 3"),
    (dict(state_out=264), r"the states must be 16-byte aligned"),
    (dict(o=260), r"v, o 16-byte aligned"),
    (dict(in_indices=256), r"in_indices index state_in, which is null"),
    (dict(state_in=256, in_indices=512, pool_in=2), r"in place \(state_out == state_in\) the rows read and written"),
    (dict(pool_out=0), r"state pools must hold at least one row"),
    (dict(dtype=2), r"dtype code must be 0 \(float32\) or 1 \(bfloat16\), got 2"),
    (dict(N=2 ** 30, H=4), r"must be below 2\^31 blocks"),
    (dict(version=7), r"decode has versions 1, got 7"),
])
def test_the_extension_checks_a_decode_step_before_any_cuda_call(changes, message):
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    with pytest.raises(ValueError, match=message):
        cuda.decode(*decode_call(**changes).values())


def test_the_extension_lists_the_decode_op_and_forward_refuses_it():
    cuda = pytest.importorskip("minilin._cuda", reason="the extension is not built here")
    decode = [v for v in cuda.versions() if v["op"] == "decode"]
    assert [v["version"] for v in decode] == [1] and decode[0]["float32"] and decode[0]["bfloat16"]
    assert decode[0]["summary"].startswith("One token per sequence")
    with pytest.raises(ValueError, match=r"decode is not a forward op"):
        cuda.forward("decode", 1, *([0] * 10), 1, 1, 1, 8, 8, 1.0, 0, 0)
