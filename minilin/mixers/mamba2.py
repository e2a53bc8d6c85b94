"""Mamba-2's state-space dual layer, SSD (Dao & Gu 2024, "Transformers are SSMs"), with a scalar A per head.

    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T        h: [N, P] per head
    y_t = h_t^T C_t + D x_t

Paper symbols: x = input [P channels per head], dt = step size Delta (after softplus, >= 0),
A = scalar state matrix per head (A <= 0), B = input matrix, C = output matrix, D = skip, N = state size.

SSD is the scalar-gate linear recurrence of `simple_gla` under the mapping (CONVENTIONS.md)
    q = C,  k = B,  v = dt * x,  g = dt * A,  scale = 1,
so its chunked form is `simple_gla`'s: the 1-semiseparable matrix L = exp(segsum(dt A)) inside each chunk
(Y_diag = (C B^T * L) (dt x)), chunk states, inter-chunk state passing, and the state read
(Y_off = C h * exp(cumsum dt A)), which is the paper's SSD algorithm step for step. Mamba-2's B and C
groups are taken per head here ([B, T, H, N]); repeat a group's B, C over its heads to get them.

Shapes: x [B, T, H, P]; dt [B, T, H]; A [H]; B, C [B, T, H, N]; D [H] or None; y [B, T, H, P];
state [B, H, N, P]. Forms: recurrent, chunked, parallel, step; each returns (y, final_state).
Gradients: recurrent_backward, chunked_backward, parallel_backward: the engine's (`_gated_linear`), then
the chain rule of the mapping (see `_backward`).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_max, check_min
from . import _gated_linear

SIGNATURE = Signature(
    inputs=(Tensor("x", "B T H P"), Tensor("dt", "B T H"), Tensor("A", "H"), Tensor("B", "B T H N"),
            Tensor("C", "B T H N"), Tensor("D", "H", optional=True)),
    output="B T H P", state="B H N P", gpu="linear")


def _checked(x, dt, A, B, C, D, state, step=False):
    """Checked inputs: dt >= 0, A <= 0."""
    a = SIGNATURE.check(x, dt, A, B, C, D, state=state, step=step)
    check_min("dt", a.dt, 0.0, "step sizes dt >= 0")
    check_max("A", a.A, 0.0, "A <= 0 (so the decay exp(dt A) is at most 1)")
    return a


def _mapped(a) -> dict:
    """The mapping onto the scalar-gate recurrence, as the engine's arguments (scale = 1)."""
    return dict(q=a.C, k=a.B, v=a.dt[..., None] * a.x, g=a.dt * a.A)


def _skip(y, x, D):
    """y + D x (D per head)."""
    return y if D is None else y + D[:, None] * x


def recurrent(x, dt, A, B, C, D=None, *, initial_state=None):
    """Token loop (the definition). Returns (y [B, T, H, P], final state [B, H, N, P])."""
    a = _checked(x, dt, A, B, C, D, initial_state)
    y, h = _gated_linear.recurrent(**_mapped(a), S0=a.state)
    return _skip(y, a.x, a.D), h


def chunked(x, dt, A, B, C, D=None, *, initial_state=None, chunk_size=64):
    """The SSD chunk algorithm; any T, chunk_size > 0 (clamped to T)."""
    a = _checked(x, dt, A, B, C, D, initial_state)
    y, h = _gated_linear.chunked(**_mapped(a), S0=a.state, chunk_size=check_chunk_size(chunk_size, a.shapes["T"]))
    return _skip(y, a.x, a.D), h


def parallel(x, dt, A, B, C, D=None, *, initial_state=None):
    """The quadratic (attention-like) form: y = (L * C B^T) (dt x) + D x, L the semiseparable mask."""
    a = _checked(x, dt, A, B, C, D, initial_state)
    y, h = _gated_linear.parallel(**_mapped(a), S0=a.state)
    return _skip(y, a.x, a.D), h


def step(x, dt, A, B, C, D=None, *, state=None):
    """One decoding step: x [B, H, P], dt [B, H], B, C [B, H, N] -> (y_t [B, H, P], new state)."""
    a = _checked(x, dt, A, B, C, D, state, step=True)
    y, h = _gated_linear.step(**_mapped(a), S=a.state)
    return _skip(y, a.x, a.D), h


def _backward(form, x, dt, A, B, C, D, initial_state, dy, dstate, chunk_size=None):
    """Check, run the engine's backward on the mapped inputs, then the chain rule of the mapping,
    y = y'(q = C, k = B, v = dt x, g = dt A) + D x:
        dC = dq,   dB = dk
        v = dt x   ->  dx = dt * dv (+ D dy),   ddt = sum_p dv_p x_p (+ the gate's share below)
        g = dt A   ->  ddt += A dg,              dA_h = sum_{b, t} dt dg
        y += D x   ->  dD_h = sum_{b, t, p} dy x
    dD is None when D was not given; dinitial_state when initial_state was not."""
    a = _checked(x, dt, A, B, C, D, initial_state)
    dy, dstate = SIGNATURE.check_cotangents(a, dy, dstate)
    chunk = check_chunk_size(chunk_size, a.shapes["T"]) if form == "chunked" else None
    m = _mapped(a)
    dq, dk, dv, dg, dS0 = _gated_linear.backward(form, m["q"], m["k"], m["v"], m["g"], a.state, dy, dstate, chunk)
    dx = a.dt[..., None] * dv
    if a.D is not None:
        dx += a.D[:, None] * dy
    ddt = (dv * a.x).sum(-1) + a.A * dg
    dA = (a.dt * dg).sum(axis=(0, 1))
    dD = None if a.D is None else (dy * a.x).sum(axis=(0, 1, 3))
    return SIGNATURE.gradients("mamba2")(dx, ddt, dA, dk, dq, dD, dS0)


def recurrent_backward(x, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None):
    """Gradients of L = <do, y> + <dstate, final state> (dstate None = zeros) by the recurrence run
    backwards. do [B, T, H, P], dstate [B, H, N, P]. Returns (dx, ddt, dA, dB, dC, dD, dinitial_state),
    named; dD / dinitial_state are None when D / initial_state were not given."""
    return _backward("recurrent", x, dt, A, B, C, D, initial_state, do, dstate)


def chunked_backward(x, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None, chunk_size=64):
    """The same gradients as `recurrent_backward`, chunk-parallel: the backward of the SSD algorithm."""
    return _backward("chunked", x, dt, A, B, C, D, initial_state, do, dstate, chunk_size)


def parallel_backward(x, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None):
    """The same gradients, through the quadratic form (the chunked backward with one chunk)."""
    return _backward("parallel", x, dt, A, B, C, D, initial_state, do, dstate)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs: x [B, T, H, P=V], B and C [B, T, H, N=K]. Returns (args, kwargs)."""
    rng = examples.generator(seed)
    x = examples.normal(rng, (B, T, H, V), dtype, xp)
    dt = examples.uniform(rng, 0.01, 0.5, (B, T, H), dtype, xp)
    A = -examples.uniform(rng, 0.5, 2.0, (H,), dtype, xp)
    B_in = examples.normal(rng, (B, T, H, K), dtype, xp)
    C_out = examples.normal(rng, (B, T, H, K), dtype, xp)
    D = examples.normal(rng, (H,), dtype, xp)
    return (x, dt, A, B_in, C_out, D), {}
