"""RetNet's retention (Sun et al. 2023, "Retentive Network"): linear attention with a fixed decay
gamma_h per head.

    S_t = gamma S_{t-1} + k_t v_t^T                 S: [K, V]
    o_t = scale * S_t^T q_t
    parallel: O = (Q K^T * D) V,  D_ij = gamma^(i - j) for i >= j, else 0

Paper symbols: gamma = decay (default gamma_h = 1 - 2^(-5 - h) for head h = 0..H-1, RetNet's
multi-scale retention), D = the decay mask, S = the recurrent state s_n. The paper's xPos rotation and
group norm belong to the layer around retention and are left out. Computed as `simple_gla` with the
constant log-gate g = log gamma; the parallel form's exp(G_i - G_j) is exactly gamma^(i - j).

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; gamma [H]; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent, chunked (RetNet's chunkwise recurrent form), parallel, step; each returns (o, final_state).
Gradients: recurrent_backward, chunked_backward, parallel_backward: simple GLA's, and dgamma through
g = log gamma.
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_max, check_min, check_scale
from . import _gated_linear

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V")),
    keywords=(Tensor("gamma", "H", optional=True),),
    output="B T H V", state="B H K V", gpu="linear")


def default_gamma(H: int, xp=np):
    """RetNet's per-head decays gamma_h = 1 - 2^(-5 - h), h = 0..H-1: head 0 forgets fastest
    (gamma = 0.96875, a memory of about 32 tokens), each next head twice as slowly."""
    return 1 - 2.0 ** (-5 - xp.arange(H, dtype=xp.float64))


def _checked(q, k, v, gamma, scale, state, step=False):
    """Checked inputs, the scale, and the log-gate g = log gamma at every token ([B, T, H], or [B, H])."""
    a = SIGNATURE.check(q, k, v, state=state, step=step, gamma=gamma)
    gamma = a.gamma
    if gamma is None:
        gamma = default_gamma(a.shapes["H"], a.xp).astype(a.dtype)
    else:
        check_min("gamma", gamma, 0.0, "decays gamma in (0, 1]", strict=True)
        check_max("gamma", gamma, 1.0, "decays gamma in (0, 1]")
    g = a.xp.broadcast_to(a.xp.log(gamma), a.q.shape[:-1])  # the same log-decay at every token
    return a, check_scale(scale, a.shapes["K"]), g


def recurrent(q, k, v, *, gamma=None, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    a, scale, g = _checked(q, k, v, gamma, scale, initial_state)
    return _gated_linear.recurrent(a.q * scale, a.k, a.v, g, a.state)


def chunked(q, k, v, *, gamma=None, scale=None, initial_state=None, chunk_size=64):
    """Chunkwise recurrent form: parallel inside chunks, recurrent across them (chunk_size clamped to T)."""
    a, scale, g = _checked(q, k, v, gamma, scale, initial_state)
    return _gated_linear.chunked(a.q * scale, a.k, a.v, g, a.state, check_chunk_size(chunk_size, a.shapes["T"]))


def parallel(q, k, v, *, gamma=None, scale=None, initial_state=None):
    """Parallel form O = (Q K^T * D) V with the decay mask D_ij = gamma^(i - j)."""
    a, scale, g = _checked(q, k, v, gamma, scale, initial_state)
    return _gated_linear.parallel(a.q * scale, a.k, a.v, g, a.state)


def step(q, k, v, *, state=None, gamma=None, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V] -> (o_t [B, H, V], new state)."""
    a, scale, g = _checked(q, k, v, gamma, scale, state, step=True)
    return _gated_linear.step(a.q * scale, a.k, a.v, g, a.state)


def _backward(form, q, k, v, gamma, scale, initial_state, do, dstate, chunk_size=None):
    """Check, run the engine's backward, then the chain rule of the mapping:
        q' = scale * q                    ->  dq = scale * dq'
        g_t = log gamma at every token    ->  dgamma_h = sum_{b, t} dg_{b,t,h} / gamma_h
    (one gamma per head is shared by every token, so its gradient sums theirs). dgamma is None when
    gamma was not given (the default decays are constants, not inputs)."""
    a, scale, g = _checked(q, k, v, gamma, scale, initial_state)
    do, dstate = SIGNATURE.check_cotangents(a, do, dstate)
    C = check_chunk_size(chunk_size, a.shapes["T"]) if form == "chunked" else None
    dq, dk, dv, dg, dS0 = _gated_linear.backward(form, a.q * scale, a.k, a.v, g, a.state, do, dstate, C)
    dgamma = None if a.gamma is None else dg.sum(axis=(0, 1)) / a.gamma
    dq *= scale  # the engine's dq is a fresh array
    return SIGNATURE.gradients("retnet")(dq, dk, dv, dgamma, dS0)


def recurrent_backward(q, k, v, *, do, dstate=None, gamma=None, scale=None, initial_state=None):
    """Gradients of L = <do, o> + <dstate, final state> (dstate None = zeros) by the recurrence run
    backwards. do [B, T, H, V], dstate [B, H, K, V]. Returns (dq, dk, dv, dgamma, dinitial_state),
    named; dgamma / dinitial_state are None when gamma / initial_state were not given."""
    return _backward("recurrent", q, k, v, gamma, scale, initial_state, do, dstate)


def chunked_backward(q, k, v, *, do, dstate=None, gamma=None, scale=None, initial_state=None, chunk_size=64):
    """The same gradients as `recurrent_backward`, chunk-parallel (`_gated_linear.chunked_backward`)."""
    return _backward("chunked", q, k, v, gamma, scale, initial_state, do, dstate, chunk_size)


def parallel_backward(q, k, v, *, do, dstate=None, gamma=None, scale=None, initial_state=None):
    """The same gradients, through the parallel form (the chunked backward with one chunk)."""
    return _backward("parallel", q, k, v, gamma, scale, initial_state, do, dstate)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    return (q, k, v), {}
