"""Scalar-gated linear attention ("simple GLA"): one data-dependent decay per head and token.

    S_t = exp(g_t) S_{t-1} + k_t v_t^T          g_t <= 0 (log space), S: [K, V]
    o_t = scale * S_t^T q_t

The common form of RetNet (constant g = log gamma), Lightning Attention (constant g = -slope) and
Mamba-2's SSD (g = dt * A, see `mamba2`); FLA calls it `simple_gla`. Its chunked form is the SSD
algorithm: intra-chunk 1-semiseparable mask exp(G_i - G_j), chunk states, state passing, state read.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent (the definition), chunked, parallel, step. Each returns (o, final_state).
Gradients: recurrent_backward, chunked_backward, parallel_backward (the engine's, `_gated_linear`).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_log_gate, check_scale
from . import _gated_linear

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V"), Tensor("g", "B T H", gate=True)),
    output="B T H V", state="B H K V", gpu="linear")


def _checked(q, k, v, g, scale, state, step=False):
    """Checked inputs (`SIGNATURE.check`) and the scale."""
    a = SIGNATURE.check(q, k, v, g, state=state, step=step)
    check_log_gate("g", a.g)
    return a, check_scale(scale, a.shapes["K"])


def recurrent(q, k, v, g, *, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    a, scale = _checked(q, k, v, g, scale, initial_state)
    return _gated_linear.recurrent(a.q * scale, a.k, a.v, a.g, a.state)


def chunked(q, k, v, g, *, scale=None, initial_state=None, chunk_size=64):
    """Chunked (SSD) form; any T, chunk_size C > 0 (clamped to T)."""
    a, scale = _checked(q, k, v, g, scale, initial_state)
    return _gated_linear.chunked(a.q * scale, a.k, a.v, a.g, a.state, check_chunk_size(chunk_size, a.shapes["T"]))


def parallel(q, k, v, g, *, scale=None, initial_state=None):
    """Quadratic form: o = ((Q K^T) * L) V with L_ij = exp(G_i - G_j) for j <= i, G = cumsum(g)."""
    a, scale = _checked(q, k, v, g, scale, initial_state)
    return _gated_linear.parallel(a.q * scale, a.k, a.v, a.g, a.state)


def step(q, k, v, g, *, state=None, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V], g [B, H] -> (o_t [B, H, V], new state)."""
    a, scale = _checked(q, k, v, g, scale, state, step=True)
    return _gated_linear.step(a.q * scale, a.k, a.v, a.g, a.state)


def _backward(form, q, k, v, g, scale, initial_state, do, dstate, chunk_size=None):
    """Check, run the engine's backward, and undo the scale: the engine reads q' = scale * q, so
    dL/dq = scale * dL/dq'."""
    a, scale = _checked(q, k, v, g, scale, initial_state)
    do, dstate = SIGNATURE.check_cotangents(a, do, dstate)
    C = None if chunk_size is None else check_chunk_size(chunk_size, a.shapes["T"])
    dq, dk, dv, dg, dS0 = _gated_linear.backward(form, a.q * scale, a.k, a.v, a.g, a.state, do, dstate, C)
    dq *= scale  # the engine's dq is a fresh array
    return SIGNATURE.gradients("simple_gla")(dq, dk, dv, dg, dS0)


def recurrent_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None):
    """Gradients of L = <do, o> + <dstate, final state> (dstate None = zeros) by the recurrence run
    backwards. do [B, T, H, V], dstate [B, H, K, V]. Returns (dq, dk, dv, dg, dinitial_state), named;
    dinitial_state is None when no initial_state was given."""
    return _backward("recurrent", q, k, v, g, scale, initial_state, do, dstate)


def chunked_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None, chunk_size=64):
    """The same gradients as `recurrent_backward`, chunk-parallel (`_gated_linear.chunked_backward`)."""
    return _backward("chunked", q, k, v, g, scale, initial_state, do, dstate, chunk_size)


def parallel_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None):
    """The same gradients, through the quadratic form (the chunked backward with one chunk)."""
    return _backward("parallel", q, k, v, g, scale, initial_state, do, dstate)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    g = examples.log_gates(rng, (B, T, H), dtype, xp)
    return (q, k, v, g), {}
