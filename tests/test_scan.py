"""minilin.scan on its own: the associative and chunked scans equal the loop of h_t = a_t h_{t-1} + b_t
(float64 to 1e-12) for any length, axis, initial state and chunk size; the loop itself equals the
closed form; bad input is named."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minilin import scan
from conftest import rel_err

TOL = 1e-12


def random_steps(rng, shape, low=0.0, high=1.0):
    """a in [low, high] (decays), b standard normal."""
    return rng.uniform(low, high, shape), rng.standard_normal(shape)


def closed_form(a, b, initial):
    """h_t = (a_t ... a_0) h_{-1} + sum_{j <= t} (a_t ... a_{j+1}) b_j, along axis 0, by explicit products."""
    T = a.shape[0]
    h = np.empty_like(b)
    for t in range(T):
        total = np.prod(a[:t + 1], axis=0) * initial
        for j in range(t + 1):
            total = total + np.prod(a[j + 1:t + 1], axis=0) * b[j]
        h[t] = total
    return h


@pytest.mark.parametrize("T", [1, 2, 3, 7])
def test_loop_equals_closed_form(rng, T):
    a, b = random_steps(rng, (T, 3, 2))
    h0 = rng.standard_normal((3, 2))
    assert rel_err(scan.sequential_scan(a, b, axis=0, initial=h0), closed_form(a, b, h0)) < TOL


def test_combine_is_associative_and_composes_steps(rng):
    steps = [random_steps(rng, (4,)) for _ in range(3)]
    left = scan.combine(scan.combine(steps[0], steps[1]), steps[2])
    right = scan.combine(steps[0], scan.combine(steps[1], steps[2]))
    assert all(rel_err(x, y) < TOL for x, y in zip(left, right))
    h = rng.standard_normal(4)
    a, b = left
    expected = h
    for a_t, b_t in steps:
        expected = a_t * expected + b_t
    assert rel_err(a * h + b, expected) < TOL


@pytest.mark.parametrize("T", [1, 2, 3, 5, 16, 33, 100, 257])
@pytest.mark.parametrize("with_initial", [False, True])
def test_associative_and_chunked_equal_loop(rng, T, with_initial):
    a, b = random_steps(rng, (2, T, 3, 4))
    h0 = rng.standard_normal((2, 3, 4)) if with_initial else None
    ref = scan.sequential_scan(a, b, initial=h0)
    assert rel_err(scan.associative_scan(a, b, initial=h0), ref) < TOL
    for chunk_size in (1, 3, 16, 64):
        assert rel_err(scan.chunked_scan(a, b, initial=h0, chunk_size=chunk_size), ref) < TOL


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), data=st.data(),
       with_initial=st.booleans(), chunk_size=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_any_axis_any_shape(shape, data, with_initial, chunk_size, seed):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    a, b = random_steps(rng, tuple(shape), low=-1.0)  # negative and zero a too: the algebra is the same
    rest = tuple(s for i, s in enumerate(shape) if i != axis % len(shape))
    h0 = rng.standard_normal(rest) if with_initial else None
    ref = scan.sequential_scan(a, b, axis=axis, initial=h0)
    assert ref.shape == b.shape
    assert rel_err(scan.associative_scan(a, b, axis=axis, initial=h0), ref) < TOL
    assert rel_err(scan.chunked_scan(a, b, axis=axis, initial=h0, chunk_size=chunk_size), ref) < TOL


def test_last_state_continues(rng):
    """Scanning [0, T) equals scanning [0, t) then [t, T) from the last h."""
    a, b = random_steps(rng, (2, 50, 5))
    full = scan.associative_scan(a, b)
    head = scan.associative_scan(a[:, :20], b[:, :20])
    tail = scan.associative_scan(a[:, 20:], b[:, 20:], initial=head[:, -1])
    assert rel_err(np.concatenate([head, tail], axis=1), full) < TOL


def test_float32_close_to_float64(rng):
    a, b = random_steps(rng, (1, 4096, 8), low=0.9)  # slow decay: long memory, long sums
    ref = scan.sequential_scan(a, b)
    for fn in (scan.associative_scan, scan.chunked_scan):
        out = fn(a.astype(np.float32), b.astype(np.float32))
        assert out.dtype == np.float32
        assert rel_err(out, ref) < 1e-5


def test_decays_that_underflow_stay_finite(rng):
    """Products of tiny a underflow to 0 (a reset); nothing overflows."""
    a = np.exp(-rng.uniform(300, 700, (1, 300, 4)))
    b = rng.standard_normal((1, 300, 4))
    ref = scan.sequential_scan(a, b)
    for fn in (scan.associative_scan, scan.chunked_scan):
        out = fn(a, b)
        assert np.isfinite(out).all() and rel_err(out, ref) < TOL


# --- bad input ------------------------------------------------------------------------------------


def test_mismatched_shapes(rng):
    a, b = random_steps(rng, (2, 5, 3))
    with pytest.raises(ValueError, match=re.escape("b: expected shape [n0, T, n2] = [2, 5, 3], got [2, 4, 3]")):
        scan.associative_scan(a, b[:, :4])


def test_initial_shape(rng):
    a, b = random_steps(rng, (2, 5, 3))
    with pytest.raises(ValueError, match=re.escape("initial: expected shape [n0, n2] = [2, 3], got [2, 5]")):
        scan.chunked_scan(a, b, initial=np.zeros((2, 5)))


def test_axis_out_of_range(rng):
    a, b = random_steps(rng, (2, 5))
    with pytest.raises(ValueError, match=r"axis: expected an axis of a \(ndim 2\), got 2"):
        scan.sequential_scan(a, b, axis=2)


def test_integer_dtype(rng):
    a, _ = random_steps(rng, (2, 5))
    with pytest.raises(TypeError, match=r"b: expected a floating-point array \(float32 or float64\), got int64"):
        scan.associative_scan(a, np.ones((2, 5), dtype=np.int64))


def test_nan(rng):
    a, b = random_steps(rng, (2, 5))
    a[1, 3] = np.nan
    with pytest.raises(ValueError, match=re.escape("a: expected finite values, got nan at index (1, 3)")):
        scan.associative_scan(a, b)


def test_empty_sequence(rng):
    a, b = random_steps(rng, (2, 0))
    with pytest.raises(ValueError, match=r"a: expected at least one step \(T >= 1\)"):
        scan.associative_scan(a, b)


@pytest.mark.parametrize("chunk_size", [0, -4])
def test_chunk_size_not_positive(rng, chunk_size):
    a, b = random_steps(rng, (2, 5))
    with pytest.raises(ValueError, match=rf"chunk_size: expected a positive integer, got {chunk_size}"):
        scan.chunked_scan(a, b, chunk_size=chunk_size)


def test_scan_backward_checks_h_and_names_the_cotangents(rng):
    """A given h of another shape broadcast into wrong gradients (da all zero for h[:, -1:]); dh's and dfinal's
    errors named b and initial; an unknown method was a KeyError."""
    a, b, dh = rng.uniform(0, 1, (2, 5, 3)), rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 3))
    h = scan.sequential_scan(a, b, axis=1)
    with pytest.raises(ValueError, match=re.escape("h: expected the forward's states, of b's shape [2, 5, 3], got "
                                                   "[2, 1, 3]")):
        scan.scan_backward(a, b, dh, h=h[:, -1:])
    with pytest.raises(ValueError, match=re.escape("dh: expected shape [n0, T, n2] = [2, 5, 3], got [2, 4, 3]")):
        scan.scan_backward(a, b, dh[:, :4])
    with pytest.raises(ValueError, match=re.escape("dfinal: expected shape [n0, n2] = [2, 3], got [2, 5]")):
        scan.adjoint_scan(a, dh, dfinal=np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"method: expected one of \['associative', 'chunked', 'sequential'\]"):
        scan.scan_backward(a, b, dh, method="foo")
