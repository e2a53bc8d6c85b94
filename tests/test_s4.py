"""S4D: zero-order hold matches the matrix exponential (also as A -> 0); recurrent, convolution, chunked
and step compute the same function for real and complex A (float64, 1e-10), from any initial state;
strong decays stay finite; bad input is named."""
from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.linalg import expm

from minilin.mixers import s4
from conftest import rel_err

TOL = 1e-10
SHAPES = [(1, 1, 1, 4, 4, 16), (2, 37, 3, 8, 5, 16), (1, 64, 2, 16, 16, 64), (2, 130, 2, 8, 12, 64),
          (1, 33, 1, 3, 2, 1)]


def random_state(rng, shape, complex_):
    h = rng.standard_normal(shape)
    return h + 1j * rng.standard_normal(shape) if complex_ else h


def run(form, args, chunk_size=16, **kwargs):
    if form == "chunked":
        kwargs["chunk_size"] = chunk_size
    return getattr(s4, form)(*args, **kwargs)


@pytest.mark.parametrize("init", ["real", "lin"])
@pytest.mark.parametrize("B, T, H, K, V, chunk_size", SHAPES)
def test_forms_agree_from_an_initial_state(rng, init, B, T, H, K, V, chunk_size):
    args, _ = s4.example_inputs(B, T, H, K, V, seed=T, init=init)
    h0 = random_state(rng, (B, H * V, K), init == "lin")
    ref, ref_state = s4.recurrent(*args, initial_state=h0)
    assert ref.dtype == np.float64 and ref_state.dtype == (np.complex128 if init == "lin" else np.float64)
    for form in ("convolution", "chunked"):
        out, state = run(form, args, chunk_size, initial_state=h0)
        assert rel_err(out, ref) < TOL, form
        assert np.linalg.norm(state - ref_state) / np.linalg.norm(ref_state) < TOL, form


def test_zero_order_hold_is_the_exact_solution_for_constant_input(rng):
    """[[A, B], [0, 0]] dt exponentiated is [[A_bar, B_bar], [0, 1]] (the ZOH identity), for every state,
    including A = 0 and |A| tiny, real and complex."""
    A = np.array([[-1.0, -1e-12, 0.0, -3.0 + 2.0j, -1e-13 + 1e-13j, 0.5j, -50.0]])
    B = (rng.standard_normal(A.shape) + 1j * rng.standard_normal(A.shape))
    dt = np.array([0.37])
    A_bar, B_bar = s4.discretize(dt, A, B)
    for n in range(A.shape[1]):
        M = expm(np.array([[A[0, n], B[0, n]], [0, 0]]) * dt[0])
        assert abs(A_bar[0, n] - M[0, 0]) <= 1e-14 * abs(M[0, 0]) + 1e-300
        assert abs(B_bar[0, n] - M[0, 1]) <= 1e-13 * abs(M[0, 1]), n


def test_small_A_has_no_cancellation():
    """phi(z) = (e^z - 1) / z against its series near 0: full precision, where (exp(z) - 1) / z has none."""
    z = np.array([1e-6, -1e-9, 1e-8j, -1e-7 + 3e-7j])
    series = 1 + z / 2 + z ** 2 / 6 + z ** 3 / 24
    dt = np.ones(1)
    _, B_bar = s4.discretize(dt, z[None], np.ones((1, 4)))
    assert np.abs(B_bar[0] - series).max() < 1e-15


def test_convolution_kernel_is_the_vandermonde_product(rng):
    """The blocked power sums equal the direct K_l = Re(sum_n C_n B_bar_n A_bar_n^l)."""
    args, _ = s4.example_inputs(1, 50, 1, 6, 3, init="lin")
    u, dt, A, B, C, D = args
    A_bar, B_bar = s4.discretize(dt, A, B)
    direct = np.stack([((C * B_bar) * A_bar ** l).sum(-1).real for l in range(50)], axis=-1)
    impulse = np.zeros_like(u)
    impulse[:, 0] = 1.0
    y, _ = s4.convolution(impulse, dt, A, B, C)  # the impulse response is the kernel
    assert rel_err(y[0].T, direct) < TOL


def test_continuation_and_step_complex(rng):
    args, _ = s4.example_inputs(2, 50, 2, 5, 3, seed=4, init="lin")
    ref, ref_state = s4.recurrent(*args)
    t = 19
    head = tuple(a[:, :t] if a.ndim == 3 else a for a in args)
    tail = tuple(a[:, t:] if a.ndim == 3 else a for a in args)
    for form in ("recurrent", "convolution", "chunked"):
        o1, s1 = run(form, head)
        o2, s2 = run(form, tail, initial_state=s1)
        assert rel_err(np.concatenate([o1, o2], axis=1), ref) < TOL, form
        assert np.linalg.norm(s2 - ref_state) / np.linalg.norm(ref_state) < TOL, form
    state, outs = None, []
    for t in range(50):
        o_t, state = s4.step(args[0][:, t], *args[1:], state=state)
        outs.append(o_t)
    assert rel_err(np.stack(outs, axis=1), ref) < TOL
    assert np.linalg.norm(state - ref_state) / np.linalg.norm(ref_state) < TOL


@pytest.mark.parametrize("init, state_dtype", [("real", np.float32), ("lin", np.complex64)])
def test_float32_matches_float64(init, state_dtype):
    args, _ = s4.example_inputs(1, 1024, 2, 16, 8, dtype=np.float32, init=init)
    ref, _ = s4.recurrent(*(a.astype(np.complex128 if a.dtype.kind == "c" else np.float64) for a in args))
    for form in ("recurrent", "convolution", "chunked"):
        out, state = run(form, args, 64)
        assert out.dtype == np.float32 and state.dtype == state_dtype, form
        assert rel_err(out, ref) < 1e-4, form


def test_strong_decays_stay_finite(rng):
    """exp(dt A) down to exp(-1000) per step: the chunk's powers underflow to 0, nothing overflows."""
    args, _ = s4.example_inputs(1, 300, 1, 8, 4)
    u, dt, A, B, C, D = args
    A = -rng.uniform(1, 1e4, A.shape) + 1j * rng.uniform(-100, 100, A.shape)
    dt = np.full_like(dt, 0.1)
    ref, _ = s4.recurrent(u, dt, A, B, C, D)
    for form in ("convolution", "chunked"):
        out, state = run(form, (u, dt, A, B, C, D), 64)
        assert np.isfinite(out).all() and np.isfinite(state).all()
        assert rel_err(out, ref) < TOL, form


# --- bad input ------------------------------------------------------------------------------------


@pytest.fixture
def inputs():
    args, _ = s4.example_inputs(2, 10, 1, 4, 3, init="lin")  # H = 3 channels, N = 4 states
    return dict(zip(["u", "dt", "A", "B", "C", "D"], args))


def call(form="chunked", **kwargs):
    return lambda i: getattr(s4, form)(i["u"], i["dt"], i["A"], i["B"], i["C"], i["D"], **kwargs)


def test_wrong_rank(inputs):
    inputs["u"] = inputs["u"][..., None]
    with pytest.raises(ValueError, match=re.escape("u: expected shape [B, T, H] (3 dims), got [2, 10, 3, 1]")):
        call()(inputs)


def test_mismatched_state_size(inputs):
    inputs["C"] = inputs["C"][:, :3]
    with pytest.raises(ValueError, match=re.escape("C: expected shape [H, N] = [3, 4], got [3, 3]")):
        call("convolution")(inputs)


def test_unstable_A(inputs):
    inputs["A"][2, 1] = 0.25 + 3j
    with pytest.raises(ValueError, match=r"A: expected Re\(A\) <= 0 .*got max 0\.25"):
        call("recurrent")(inputs)


def test_dt_not_positive(inputs):
    inputs["dt"][0] = 0.0
    with pytest.raises(ValueError, match=r"dt: expected step sizes dt > 0, got min 0"):
        call()(inputs)


def test_integer_dtype(inputs):
    inputs["u"] = np.ones((2, 10, 3), dtype=np.int64)
    with pytest.raises(TypeError, match=r"u: expected a floating-point array \(float32 or float64\), got int64"):
        call()(inputs)


def test_nan_in_imaginary_part(inputs):
    inputs["B"][1, 2] = complex(0.5, np.nan)
    with pytest.raises(ValueError, match=re.escape("B: expected finite values, got nan at index (1, 2)")):
        call("convolution")(inputs)


def test_state_shape(inputs):
    with pytest.raises(ValueError, match=re.escape("initial_state: expected shape [B, H, N] = [2, 3, 4], got [2, 4, 3]")):
        call(initial_state=np.zeros((2, 4, 3), complex))(inputs)


@pytest.mark.parametrize("chunk_size", [0, -8])
def test_chunk_size_not_positive(inputs, chunk_size):
    with pytest.raises(ValueError, match=rf"chunk_size: expected a positive integer, got {chunk_size}"):
        call(chunk_size=chunk_size)(inputs)


def test_unknown_init():
    with pytest.raises(ValueError, match=r"init: expected 'real' or 'lin', got 'inv'"):
        s4.example_inputs(init="inv")
