"""HGRN2 (Qin, Yang, Sun, Shen, Li, Sun & Zhong 2024, "HGRN2: Gated Linear RNNs with State Expansion"):
HGRN's forget gate, its state expanded from a vector to a matrix by an outer product.

    S_t = Diag(f_t) S_{t-1} + (1 - f_t) i_t^T,  f_t = exp(g_t) in (0, 1]^K       S: [K, V]
    o_t = scale * S_t^T q_t

Paper symbols -> code: f_t = forget gate (here log-space g_t = log f_t <= 0), i_t = input -> v,
o_t = output gate read against the state -> q, the state H_t -> S, expansion ratio = K per head.
The tied input gate 1 - f_t takes the place of a key.

That is GLA (`gla`) with the key tied to one minus the forget gate:
    q = q,  k = 1 - exp(g) = -expm1(g),  v = v,  g = g
and every form below is the `_gated_linear` engine under this mapping, so HGRN2's chunked form is GLA's
(finite for any gate). FLA's HGRN2 layer calls its GLA kernels the same way, with the default
scale K ** -0.5 used here too. expm1 keeps the key exact when the gate is close to 1 (g near 0).

Shapes: q [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent (the definition), chunked, parallel, step. Each returns (o, final_state).
Gradients: recurrent_backward, chunked_backward, parallel_backward: GLA's, with the tied key's share
added to the gate's gradient.
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_log_gate, check_scale
from . import _gated_linear

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("v", "B T H V"), Tensor("g", "B T H K", gate=True)),
    output="B T H V", state="B H K V", gpu="gla")  # on the GPU through GLA's kernels (minilin.cuda.hgrn2)


def _checked(q, v, g, scale, state, step=False):
    """Checked inputs (`SIGNATURE.check`), the scale, and the key tied to the forget gate, k = 1 - f."""
    a = SIGNATURE.check(q, v, g, state=state, step=step)
    check_log_gate("g", a.g)
    return a, check_scale(scale, a.shapes["K"]), -a.xp.expm1(a.g)


def recurrent(q, v, g, *, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    a, scale, k = _checked(q, v, g, scale, initial_state)
    return _gated_linear.recurrent(a.q * scale, k, a.v, a.g, a.state)


def chunked(q, v, g, *, scale=None, initial_state=None, chunk_size=64):
    """GLA's chunked form under the mapping; any T, chunk_size > 0 (clamped to T)."""
    a, scale, k = _checked(q, v, g, scale, initial_state)
    return _gated_linear.chunked(a.q * scale, k, a.v, a.g, a.state, check_chunk_size(chunk_size, a.shapes["T"]))


def parallel(q, v, g, *, scale=None, initial_state=None):
    """Quadratic form: o_i = sum_{j <= i} (sum_k q_ik (1 - f_jk) exp(G_ik - G_jk)) v_j, G = cumsum(g)."""
    a, scale, k = _checked(q, v, g, scale, initial_state)
    return _gated_linear.parallel(a.q * scale, k, a.v, a.g, a.state)


def step(q, v, g, *, state=None, scale=None):
    """One decoding step: q, g [B, H, K], v [B, H, V] -> (o_t [B, H, V], new state)."""
    a, scale, k = _checked(q, v, g, scale, state, step=True)
    return _gated_linear.step(a.q * scale, k, a.v, a.g, a.state)


def _backward(form, q, v, g, scale, initial_state, do, dstate, chunk_size=None):
    """Check, run the engine's backward, then the chain rule of the mapping:
        q' = scale * q              ->  dq = scale * dq'
        k  = -expm1(g) = 1 - e^g    ->  dk/dg = -e^g, so  dg = dg' - dk * e^g
    (g reaches the loss twice: as the decay, dg' from the engine, and as the key). e^g <= 1."""
    a, scale, k = _checked(q, v, g, scale, initial_state)
    do, dstate = SIGNATURE.check_cotangents(a, do, dstate)
    C = check_chunk_size(chunk_size, a.shapes["T"]) if form == "chunked" else None
    dq, dk, dv, dg, dS0 = _gated_linear.backward(form, a.q * scale, k, a.v, a.g, a.state, do, dstate, C)
    dq *= scale  # the engine's dq and dg are fresh arrays
    dg -= dk * a.xp.exp(a.g)
    return SIGNATURE.gradients("hgrn2")(dq, dv, dg, dS0)


def recurrent_backward(q, v, g, *, do, dstate=None, scale=None, initial_state=None):
    """Gradients of L = <do, o> + <dstate, final state> (dstate None = zeros) by the recurrence run
    backwards. do [B, T, H, V], dstate [B, H, K, V]. Returns (dq, dv, dg, dinitial_state), named;
    dinitial_state is None when no initial_state was given."""
    return _backward("recurrent", q, v, g, scale, initial_state, do, dstate)


def chunked_backward(q, v, g, *, do, dstate=None, scale=None, initial_state=None, chunk_size=64):
    """The same gradients as `recurrent_backward`, chunk-parallel (GLA's chunked backward)."""
    return _backward("chunked", q, v, g, scale, initial_state, do, dstate, chunk_size)


def parallel_backward(q, v, g, *, do, dstate=None, scale=None, initial_state=None):
    """The same gradients, through the quadratic form (the chunked backward with one chunk)."""
    return _backward("parallel", q, v, g, scale, initial_state, do, dstate)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs: q and v standard normal, g a log forget gate. Returns (args, kwargs)."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    g = examples.log_gates(rng, (B, T, H, K), dtype, xp)
    return (q, v, g), {}
