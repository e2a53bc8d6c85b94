"""Gated Linear Attention (Yang et al. 2024, "Gated Linear Attention Transformers with
Hardware-Efficient Training"): a data-dependent decay for every key channel.

    S_t = Diag(alpha_t) S_{t-1} + k_t v_t^T,  alpha_t = exp(g_t) in (0, 1]^K     S: [K, V]
    o_t = scale * S_t^T q_t

Paper symbols: alpha_t = the forget gate (here kept in log space, g_t = log alpha_t <= 0), G_t = the
state S_t, b_t = cumulative product of alpha inside a chunk (here exp of the chunk-local cumsum G).

The chunked form never forms exp(+cumsum): the intra-chunk scores sum_k q_ik k_jk exp(G_ik - G_jk) are
built in sub-blocks whose factors all have non-positive exponents (`chunking.gated_gram`), so it stays
finite for any gate, however strong.

Shapes: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; o [B, T, HV, V]; state [B, HV, K, V].
HV = H is the plain layout; HV a multiple of H groups the value heads (`minilin.heads`: value head j reads
q/k head j // (HV / H), each value head with its own gate). cu_seqlens [N + 1] with B = 1 packs N sequences
along T (`minilin.varlen`): the states are then [N, HV, K, V], and the result is each sequence run alone.
Forms: recurrent (the definition), chunked, parallel, step. Each returns (o, final_state).
Gradients: recurrent_backward, chunked_backward, parallel_backward (the engine's, `_gated_linear`).
"""
from __future__ import annotations

import numpy as np

from .. import examples, heads, varlen
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_log_gate, check_scale
from . import _gated_linear

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V"),
            Tensor("g", "B T H K", gate=True)),
    output="B T H V", state="B H K V", gpu="gla", grouped=("q", "k"))


def _checked(q, k, v, g, scale, state, cu_seqlens=None, step=False):
    """Checked inputs (`SIGNATURE.check`), the scale, and the engine's arrays: q' = scale * q and k with
    each q/k head repeated over its group of value heads (`heads.expand`), v, g."""
    a = SIGNATURE.check(q, k, v, g, state=state, step=step, cu_seqlens=cu_seqlens)
    check_log_gate("g", a.g)
    scale = check_scale(scale, a.shapes["K"])
    return a, scale, (heads.expand(a.q * scale, a.group), heads.expand(a.k, a.group), a.v, a.g)


def recurrent(q, k, v, g, *, scale=None, initial_state=None, cu_seqlens=None):
    """Token loop (the definition). Returns (o [B, T, HV, V], final state [B, HV, K, V]; [N, HV, K, V] with
    cu_seqlens, each sequence run alone: `varlen.forward`)."""
    a, scale, arrays = _checked(q, k, v, g, scale, initial_state, cu_seqlens)
    return varlen.forward(_gated_linear.recurrent, arrays, a.state, a.cu_seqlens)


def chunked(q, k, v, g, *, scale=None, initial_state=None, cu_seqlens=None, chunk_size=64):
    """Chunked form, finite for any gate; any T, chunk_size > 0 (clamped to T)."""
    a, scale, arrays = _checked(q, k, v, g, scale, initial_state, cu_seqlens)
    C = check_chunk_size(chunk_size, a.shapes["T"])
    return varlen.forward(varlen.chunked(_gated_linear.chunked, C), arrays, a.state, a.cu_seqlens)


def parallel(q, k, v, g, *, scale=None, initial_state=None, cu_seqlens=None):
    """Quadratic form: o_i = sum_{j <= i} (sum_k q_ik k_jk exp(G_ik - G_jk)) v_j, G = cumsum(g)."""
    a, scale, arrays = _checked(q, k, v, g, scale, initial_state, cu_seqlens)
    return varlen.forward(_gated_linear.parallel, arrays, a.state, a.cu_seqlens)


def step(q, k, v, g, *, state=None, scale=None):
    """One decoding step: q, k [B, H, K], v [B, HV, V], g [B, HV, K] -> (o_t [B, HV, V], new state)."""
    a, scale, arrays = _checked(q, k, v, g, scale, state, step=True)
    return _gated_linear.step(*arrays, a.state)


def _backward(form, q, k, v, g, scale, initial_state, cu_seqlens, do, dstate, chunk_size=None):
    """Check, run the engine's backward (per sequence with cu_seqlens: `varlen.backward`), sum each q/k
    head's gradient over its group of value heads (`heads.reduce`), and undo the scale: the engine reads
    q' = scale * q, so dL/dq = scale * dL/dq'."""
    a, scale, arrays = _checked(q, k, v, g, scale, initial_state, cu_seqlens)
    do, dstate = SIGNATURE.check_cotangents(a, do, dstate)
    C = check_chunk_size(chunk_size, a.shapes["T"]) if form == "chunked" else None
    run = varlen.chunked(lambda *x: _gated_linear.backward(form, *x), C)
    dq, dk, dv, dg, dS0 = varlen.backward(run, arrays, a.state, do, dstate, a.cu_seqlens)
    dq = heads.reduce(dq, a.group) * scale
    return SIGNATURE.gradients("gla")(dq, heads.reduce(dk, a.group), dv, dg, dS0)


def recurrent_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None):
    """Gradients of L = <do, o> + <dstate, final state> (dstate None = zeros) by the recurrence run
    backwards. do [B, T, HV, V], dstate [B, HV, K, V] ([N, HV, K, V] with cu_seqlens). Returns
    (dq, dk, dv, dg, dinitial_state), named; dinitial_state is None when no initial_state was given."""
    return _backward("recurrent", q, k, v, g, scale, initial_state, cu_seqlens, do, dstate)


def chunked_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None,
                     chunk_size=64):
    """The same gradients as `recurrent_backward`, chunk-parallel and finite for any gate: the Gram
    matrix's backward runs the forward's halving backwards (`chunking.channel_gram_backward`)."""
    return _backward("chunked", q, k, v, g, scale, initial_state, cu_seqlens, do, dstate, chunk_size)


def parallel_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None):
    """The same gradients, through the quadratic form (the chunked backward with one chunk)."""
    return _backward("parallel", q, k, v, g, scale, initial_state, cu_seqlens, do, dstate)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    g = examples.log_gates(rng, (B, T, H, K), dtype, xp)
    return (q, k, v, g), {}
