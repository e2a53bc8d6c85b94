"""Backward passes of the diagonal recurrences: S4D (recurrent, chunked, convolution; real and complex
A, B, C), Mamba-1's selective SSM and HGRN (recurrent, chunked, scan). Every form against central finite
differences in float64 (all inputs at once and each alone; a complex input's real and imaginary parts
separately), with and without an initial state and a final-state cotangent, at T = 1 and T not a multiple
of the chunk; the forms against each other to 1e-10 over several chunk sizes; the final state's gradient
alone (do = 0); the zero-order hold's derivative near z = 0; float32 at T = 4096 with decays down to
exp(-20) finite; bad cotangents named."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from minilin import scan
from minilin.mixers import hgrn, mamba, s4
from conftest import rel_err
import directional

TOL = 1e-10


def case(rng, mixer, B, T, *, init="real", with_state=True):
    """(module, forms, args {name: array} in positional order, initial state or None)."""
    if mixer == "s4":
        (u, dt, A, B_, C, D), _ = s4.example_inputs(B, T, 2, 3, 2, seed=T, init=init)
        state = (rng.standard_normal((B, 4, 3)) + (1j * rng.standard_normal((B, 4, 3)) if init == "lin" else 0))
        return s4, ("recurrent", "chunked", "convolution"), dict(u=u, dt=dt, A=A, B=B_, C=C, D=D), \
            (state if with_state else None)
    if mixer == "mamba":
        (x, dt, A, B_, C, D), _ = mamba.example_inputs(B, T, 2, 3, 2, seed=T)
        return mamba, ("recurrent", "chunked", "scan"), dict(x=x, dt=dt, A=A, B=B_, C=C, D=D), \
            (rng.standard_normal((B, 4, 3)) if with_state else None)
    (x, g), _ = hgrn.example_inputs(B, T, 2, 3, 2, seed=T)
    return hgrn, ("recurrent", "chunked", "scan"), dict(x=x, g=g), (rng.standard_normal((B, 6)) if with_state else None)


def like(rng, x):
    return None if x is None else directional.direction(rng, x)


def run_backward(mod, form, args, h0, do, dstate, chunk_size=4):
    kw = {"chunk_size": chunk_size} if form == "chunked" else {}
    return getattr(mod, f"{form}_backward")(*args.values(), do=do, dstate=dstate, initial_state=h0, **kw)


def loss_of(mod, form, names, do, dstate, chunk_size=4):
    kw = {"chunk_size": chunk_size} if form == "chunked" else {}

    def loss(initial_state, **args):
        y, h = getattr(mod, form)(*(args[n] for n in names), initial_state=initial_state, **kw)
        value = float((do * y).sum())
        return value if dstate is None else value + float(np.real(np.conj(dstate) * h).sum())
    return loss


def by_name(grads) -> dict:
    return {name[1:]: g for name, g in grads._asdict().items()}


MIXERS = [("s4", "real"), ("s4", "lin"), ("mamba", None), ("hgrn", None)]
# (B, T, with an initial state, with dstate)
SHAPES = [(1, 1, False, False), (1, 1, True, True), (2, 11, True, False), (2, 11, False, True), (1, 9, True, True)]


@pytest.mark.parametrize("mixer, init", MIXERS)
@pytest.mark.parametrize("B, T, with_state, with_dstate", SHAPES)
def test_gradients_match_finite_differences(rng, mixer, init, B, T, with_state, with_dstate):
    mod, forms, args, h0 = case(rng, mixer, B, T, init=init or "real", with_state=with_state)
    y, h = mod.recurrent(*args.values(), initial_state=h0)
    do = rng.standard_normal(y.shape)
    dstate = like(rng, h) if with_dstate else None
    inputs = dict(args, initial_state=h0)
    for form in forms:
        grads = run_backward(mod, form, args, h0, do, dstate)
        assert (grads.dinitial_state is None) == (h0 is None)
        loss = loss_of(mod, form, list(args), do, dstate)
        parts = ("real", "imag") if init == "lin" else ("both",)
        for part in parts:
            directional.check_all_and_each(rng, loss, inputs, by_name(grads), part=part)


@pytest.mark.parametrize("mixer, init", MIXERS)
@pytest.mark.parametrize("T", [1, 37, 64])
def test_forms_agree(rng, mixer, init, T):
    mod, forms, args, h0 = case(rng, mixer, 2, T, init=init or "real")
    y, h = mod.recurrent(*args.values(), initial_state=h0)
    do, dstate = rng.standard_normal(y.shape), like(rng, h)
    ref = run_backward(mod, "recurrent", args, h0, do, dstate)
    others = [run_backward(mod, "chunked", args, h0, do, dstate, chunk_size=C) for C in (1, 3, 16, 64)]
    others += [run_backward(mod, form, args, h0, do, dstate) for form in forms[2:]]
    for grads in others:
        for name, g in grads._asdict().items():
            assert rel_err(g, getattr(ref, name)) < TOL, name


@pytest.mark.parametrize("mixer, init", MIXERS)
def test_final_state_alone(rng, mixer, init):
    """do = 0: the gradients of <dstate, h_{T-1}> only, still matching finite differences."""
    mod, forms, args, h0 = case(rng, mixer, 2, 10, init=init or "real")
    y, h = mod.recurrent(*args.values(), initial_state=h0)
    do, dstate = np.zeros_like(y), like(rng, h)
    for form in forms:
        grads = run_backward(mod, form, args, h0, do, dstate)
        assert np.abs(grads.dinitial_state).max() > 0
        directional.check_all_and_each(rng, loss_of(mod, form, list(args), do, dstate), dict(args, initial_state=h0),
                                       by_name(grads), part="real" if init == "lin" else "both")


@pytest.mark.parametrize("mixer", ["s4", "mamba"])
def test_without_skip(rng, mixer):
    mod, forms, args, h0 = case(rng, mixer, 1, 7)
    args["D"] = None
    y, _ = mod.recurrent(*args.values(), initial_state=h0)
    do = rng.standard_normal(y.shape)
    for form in forms:
        grads = run_backward(mod, form, args, h0, do, None)
        assert grads.dD is None
        directional.check_all_and_each(rng, loss_of(mod, form, list(args), do, None), dict(args, initial_state=h0),
                                       by_name(grads))


def test_s4_gradient_dtypes_follow_the_arguments(rng):
    """Complex B, C with a real A: A's gradient is real (the real part of the packed one), B's complex."""
    (u, dt, A, B, C, D), _ = s4.example_inputs(1, 12, 1, 3, 2, seed=3, init="lin")
    A = A.real.copy()
    do = rng.standard_normal(u.shape)
    for form in ("recurrent", "chunked", "convolution"):
        grads = getattr(s4, f"{form}_backward")(u, dt, A, B, C, D, do=do)
        assert grads.dA.dtype == np.float64 and grads.dB.dtype == np.complex128 and grads.du.dtype == np.float64
        directional.check_all_and_each(rng, loss_of(s4, form, ["u", "dt", "A", "B", "C", "D"], do, None),
                                       dict(u=u, dt=dt, A=A, B=B, C=C, D=D, initial_state=None), by_name(grads))


def test_psi_is_accurate_on_both_sides_of_the_switch():
    """psi(z) = (e^z - 1 - z) / z^2, summed as a series for |z| < 1 and in closed form beyond: both
    branches against a 40-term Taylor sum (whose terms never cancel badly for |z| <= 2) around the unit
    circle, and near 0 against 1/2 + z/6 + z^2/24, where the closed form would have no digits left."""
    z = np.concatenate([r * np.exp(1j * np.linspace(0, 2 * np.pi, 13)) for r in (0.5, 0.999, 1.001, 1.5, 2.0)])
    taylor = sum(z ** k / math.factorial(k + 2) for k in range(40))
    assert np.abs(s4._psi(z) / taylor - 1).max() < 2e-15
    z = np.array([0, 1e-9, -3e-7, 2e-8j, -1e-6 + 1e-6j])
    assert np.abs(s4._psi(z) - (0.5 + z / 6 + z ** 2 / 24)).max() < 2e-16


@pytest.mark.parametrize("A", [0.0, -1e-12, -1e-9 + 1e-9j, -0.3 + 2j, -40.0])
def test_zero_order_hold_derivative_near_zero(rng, A):
    """The gradients of <a, A_bar> + <b, B_bar> through the zero-order hold, including z = dt A -> 0,
    against central differences of `discretize` itself (which accepts the neighbourhood of A = 0)."""
    A = np.array([[A, -0.7 + 0.1j]], dtype=complex)
    dt, B = np.array([0.3]), np.array([[0.4 - 1.1j, 2.0 + 0.5j]])
    a, b = rng.standard_normal(A.shape) + 1j * rng.standard_normal(A.shape), rng.standard_normal(A.shape) + 0j

    def loss(dt, A, B):
        A_bar, B_bar = s4.discretize(dt, A, B)
        return float(np.real(np.conj(a) * A_bar + np.conj(b) * B_bar).sum())
    A_bar, _ = s4.discretize(dt, A, B)
    ddt, dA, dB = s4._zoh_backward(dt, A, B, np.conj(A_bar) * a, b)
    for part in ("real", "imag"):
        directional.check_all_and_each(rng, loss, {"dt": dt, "A": A, "B": B}, {"dt": ddt, "A": dA, "B": dB}, part=part)


@pytest.mark.parametrize("mixer", ["s4", "mamba", "hgrn"])
def test_float32_long_sequence_with_strong_decays_is_finite(mixer):
    rng = np.random.default_rng(0)
    T = 4096
    if mixer == "s4":
        (u, dt, A, B, C, D), _ = s4.example_inputs(1, T, 1, 8, 4, dtype=np.float32, seed=1, init="lin")
        A = (A * np.float32(20 / np.abs(A.real).max())).astype(np.complex64)   # dt A down to -20 for the largest dt
        dt = np.full_like(dt, 1.0)
        args = (u, dt, A, B, C, D)
    elif mixer == "mamba":
        (x, dt, A, B, C, D), _ = mamba.example_inputs(1, T, 2, 8, 4, dtype=np.float32, seed=1)
        dt = rng.uniform(0.0, 1.0, dt.shape).astype(np.float32)
        args = (x, dt, (A * np.float32(20 / np.abs(A).max())).astype(np.float32), B, C, D)
    else:
        x = rng.standard_normal((1, T, 16)).astype(np.float32)
        args = (x, rng.uniform(-20, 0, x.shape).astype(np.float32))
    mod = {"s4": s4, "mamba": mamba, "hgrn": hgrn}[mixer]
    y, h = mod.chunked(*args)
    do, dstate = rng.standard_normal(y.shape).astype(np.float32), np.ones_like(h)
    grads = mod.chunked_backward(*args, do=do, dstate=dstate, initial_state=np.ones_like(h))
    for name, g in grads._asdict().items():
        if g is not None:
            assert np.isfinite(g).all(), name
            assert g.dtype in (np.float32, np.complex64), name


@pytest.mark.parametrize("mixer", ["s4", "mamba", "hgrn"])
def test_bad_cotangents_are_named(rng, mixer):
    mod, forms, args, h0 = case(rng, mixer, 2, 5)
    y, h = mod.recurrent(*args.values())
    with pytest.raises(ValueError, match=r"do: expected shape \[B, T, [DH]\] = \[2, 5, \d+\], got \[2, 5\]"):
        mod.chunked_backward(*args.values(), do=y[..., 0])
    with pytest.raises(ValueError, match=r"dstate: expected shape"):
        mod.recurrent_backward(*args.values(), do=y, dstate=h[..., :1])
    with pytest.raises(TypeError, match=r"do: expected an array"):
        mod.recurrent_backward(*args.values(), do=None)
    if mixer == "s4":  # a real state has a real cotangent
        with pytest.raises(TypeError, match=r"dstate: expected a real array .*got complex128"):
            mod.convolution_backward(*args.values(), do=y, dstate=h + 1j)


@pytest.mark.parametrize("method", ["sequential", "associative", "chunked"])
@pytest.mark.parametrize("T, axis", [(1, 1), (2, 1), (13, 1), (13, 2)])
def test_scan_gradients(rng, method, T, axis):
    """`scan.scan_backward` (the adjoint scan) against finite differences of the scan, along either axis."""
    shape = (2, T, 3) if axis == 1 else (2, 3, T)
    a, b, dh = rng.uniform(0.1, 1.0, shape), rng.standard_normal(shape), rng.standard_normal(shape)
    h0, dfinal = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))

    def loss(a, b, initial):
        h = scan.sequential_scan(a, b, axis=axis, initial=initial)
        return float((dh * h).sum() + (dfinal * np.take(h, -1, axis=axis)).sum())
    da, db, dh0 = scan.scan_backward(a, b, dh, axis=axis, initial=h0, dfinal=dfinal, method=method, chunk_size=4)
    directional.check_all_and_each(rng, loss, {"a": a, "b": b, "initial": h0}, {"a": da, "b": db, "initial": dh0})
    lam = scan.adjoint_scan(a, dh, axis=axis, dfinal=dfinal, method=method, chunk_size=4)
    assert rel_err(lam, db) < TOL
