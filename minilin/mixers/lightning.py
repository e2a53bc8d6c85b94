"""Lightning Attention (Qin et al. 2024, "Lightning Attention-2"; the linear layers of MiniMax-01):
linear attention with a fixed per-head decay lambda = exp(-s), computed block by block.

    S_t = lambda S_{t-1} + k_t v_t^T,   o_t = scale * S_t^T q_t          (KV = S in the paper)

Lightning Attention-2 tiles the sequence into blocks of C tokens and splits each block's output in two:
    O_intra = [(Q_b K_b^T) * M] V_b,     M_ij = lambda^(i - j) for i >= j, else 0
    O_inter = (Lambda Q_b) KV,           Lambda = diag(lambda^1, ..., lambda^C)
    KV <- lambda^C KV + (lambda^C Lambda^-1 K_b)^T V_b
Because the decay is fixed, M, Lambda and lambda^C are the same for every block and are built once;
lambda^C Lambda^-1 = lambda^(C - j) only ever raises lambda to non-negative powers.

Paper symbols: lambda = decay rate, s = slope (MiniMax-01 uses ALiBi's slopes s_h = 2^(-8 (h + 1) / H),
h = 0..H-1, the default here; its per-layer rescaling of s is left to the caller), M = decay mask,
KV = the state. Normalization and output gating of the full layer are left out.

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; slope [H] >= 0; o [B, T, H, V]; state [B, H, K, V].
Forms: recurrent, chunked (the block algorithm above), parallel, step; each returns (o, final_state).
Gradients: recurrent_backward, chunked_backward, parallel_backward, and dslope through g = -s. The chunked
backward is the gated-linear engine's (`_gated_linear.chunked_backward`) with the constant gate g = -s:
the same chunks, states and products as the block algorithm above, in the engine's general form.
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..chunking import causal_mask, from_chunks, num_chunks, pass_states, to_chunks, transposed
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_min, check_scale
from . import _gated_linear

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V")),
    keywords=(Tensor("slope", "H", optional=True),),
    output="B T H V", state="B H K V", gpu="linear")


def default_slope(H: int, xp=np):
    """ALiBi / MiniMax-01 slopes s_h = 2^(-8 (h + 1) / H): head 0 decays fastest."""
    return 2.0 ** (-8.0 * (xp.arange(H, dtype=xp.float64) + 1) / H)


def _checked(q, k, v, slope, scale, state, step=False):
    """Checked inputs, the scale, and the slopes s [H] (the defaults when none are given)."""
    a = SIGNATURE.check(q, k, v, state=state, step=step, slope=slope)
    slope = default_slope(a.shapes["H"], a.xp).astype(a.dtype) if a.slope is None else a.slope
    check_min("slope", slope, 0.0, "slopes s >= 0 (the decay is exp(-s))")
    return a, check_scale(scale, a.shapes["K"]), slope


def _log_gate(q, slope):
    """The per-token log-decay g = -s, broadcast to [B, T, H] (or [B, H] for one token)."""
    return array_module(q).broadcast_to(-slope, q.shape[:-1])


def recurrent(q, k, v, *, slope=None, scale=None, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, H, V], final state [B, H, K, V])."""
    a, scale, slope = _checked(q, k, v, slope, scale, initial_state)
    return _gated_linear.recurrent(a.q * scale, a.k, a.v, _log_gate(a.q, slope), a.state)


def parallel(q, k, v, *, slope=None, scale=None, initial_state=None):
    """Quadratic form o = ((Q K^T) * M) V over the whole sequence, M_ij = lambda^(i - j)."""
    a, scale, slope = _checked(q, k, v, slope, scale, initial_state)
    return _gated_linear.parallel(a.q * scale, a.k, a.v, _log_gate(a.q, slope), a.state)


def step(q, k, v, *, state=None, slope=None, scale=None):
    """One decoding step: q, k [B, H, K], v [B, H, V] -> (o_t [B, H, V], new state)."""
    a, scale, slope = _checked(q, k, v, slope, scale, state, step=True)
    return _gated_linear.step(a.q * scale, a.k, a.v, _log_gate(a.q, slope), a.state)


def chunked(q, k, v, *, slope=None, scale=None, initial_state=None, chunk_size=64):
    """Lightning Attention-2's block algorithm (see the module docstring); any T, block size C > 0
    (clamped to T)."""
    a, scale, slope = _checked(q, k, v, slope, scale, initial_state)
    C = check_chunk_size(chunk_size, a.shapes["T"])
    q, k, v, S0 = a.q * scale, a.k, a.v, a.state
    xp = array_module(q)
    T = q.shape[1]
    N = num_chunks(T, C)
    s = slope[:, None, None]                                       # [H, 1, 1]
    i = xp.arange(C, dtype=q.dtype)
    # Built once for all blocks: M_ij = lambda^(i - j) (i >= j), Lambda_i = lambda^(i + 1).
    M = xp.where(causal_mask(C, xp), xp.exp(-s * xp.maximum(i[:, None] - i[None, :], 0)), 0)  # [H, C, C]
    q_decay = xp.exp(-s[:, 0] * (i + 1))[:, :, None]                # [H, C, 1]
    # The last block may be shorter (length L): it decays by lambda^L and its keys by lambda^(L - 1 - j).
    block_len = xp.full((N,), C, dtype=q.dtype)
    block_len[-1] = T - (N - 1) * C
    to_end = block_len[:, None] - 1 - i                             # [N, C], negative only past the end
    k_decay = xp.where(to_end >= 0, xp.exp(-s * xp.maximum(to_end, 0)), 0)[..., None]  # [H, N, C, 1]

    qc, kc, vc = (to_chunks(x, C) for x in (q, k, v))               # [B, H, N, C, .]
    o = ((qc @ transposed(kc)) * M[:, None]) @ vc                    # O_intra, all blocks at once
    dKV = (kc * k_decay).swapaxes(-1, -2) @ vc                      # what each block writes into KV
    block_log_decay = xp.broadcast_to(-slope[:, None] * block_len, dKV.shape[:3])   # log lambda^L
    KV_in, KV = pass_states(dKV, block_log_decay, S0)
    o = o + (qc * q_decay[:, None]) @ KV_in                         # O_inter
    return from_chunks(o, T), KV


def _backward(form, q, k, v, slope, scale, initial_state, do, dstate, chunk_size=None):
    """Check, run the engine's backward with the constant gate, then the chain rule of the mapping:
        q' = scale * q              ->  dq = scale * dq'
        g_t = -s at every token     ->  dslope_h = -sum_{b, t} dg_{b,t,h}
    dslope is None when slope was not given (the default slopes are constants, not inputs)."""
    a, scale, slope = _checked(q, k, v, slope, scale, initial_state)
    do, dstate = SIGNATURE.check_cotangents(a, do, dstate)
    C = check_chunk_size(chunk_size, a.shapes["T"]) if form == "chunked" else None
    q = a.q * scale
    dq, dk, dv, dg, dS0 = _gated_linear.backward(form, q, a.k, a.v, _log_gate(q, slope), a.state, do, dstate, C)
    dslope = None if a.slope is None else -dg.sum(axis=(0, 1))
    dq *= scale  # the engine's dq is a fresh array
    return SIGNATURE.gradients("lightning")(dq, dk, dv, dslope, dS0)


def recurrent_backward(q, k, v, *, do, dstate=None, slope=None, scale=None, initial_state=None):
    """Gradients of L = <do, o> + <dstate, final state> (dstate None = zeros) by the recurrence run
    backwards. do [B, T, H, V], dstate [B, H, K, V]. Returns (dq, dk, dv, dslope, dinitial_state),
    named; dslope / dinitial_state are None when slope / initial_state were not given."""
    return _backward("recurrent", q, k, v, slope, scale, initial_state, do, dstate)


def chunked_backward(q, k, v, *, do, dstate=None, slope=None, scale=None, initial_state=None, chunk_size=64):
    """The same gradients as `recurrent_backward`, chunk-parallel: the engine's chunked backward with the
    constant gate g = -s (see the module docstring)."""
    return _backward("chunked", q, k, v, slope, scale, initial_state, do, dstate, chunk_size)


def parallel_backward(q, k, v, *, do, dstate=None, slope=None, scale=None, initial_state=None):
    """The same gradients, through the quadratic form (the chunked backward with one chunk)."""
    return _backward("parallel", q, k, v, slope, scale, initial_state, do, dstate)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.normal(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    return (q, k, v), {}
