"""Kimi Delta Attention (Kimi Team 2025, "Kimi Linear"): Gated DeltaNet with a decay for every key
channel instead of one per head.

    S'  = Diag(alpha_t) S_{t-1},  alpha_t = exp(g_t) in (0, 1]^K
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
    o_t = scale * S_t^T q_t

Paper symbols: alpha_t = the channel-wise forget gate (log space here, g_t <= 0), beta_t = writing
strength. The chunked form is the gated WY form with per-channel decays, whose intra-chunk products
sum_k x_ik y_jk exp(G_ik - G_jk) are built as in GLA, finite for any gate (`chunking.gated_gram`).
Keys should be L2-normalized:
normalize_qk=True L2-normalizes q and k inside (`activations.l2_normalize`, FLA's
use_qk_l2norm_in_kernel); otherwise the keys must satisfy beta |k|^2 <= 1 (<= 2 with allow_neg_eigval),
which `validation.check_delta_keys` checks.

Shapes: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]; o [B, T, HV, V];
state [B, HV, K, V]. HV = H is the plain layout; HV a multiple of H groups the value heads (`minilin.heads`: value head j reads
q/k head j // (HV / H), as Qwen3-Next's Gated DeltaNet). cu_seqlens [N + 1] with B = 1 packs N sequences
along T (`minilin.varlen`): the states are then [N, HV, K, V], and the result is each sequence run alone.
Forms: recurrent (the definition), chunked, parallel, step; each returns (o, final_state).
Gradients: recurrent_backward, chunked_backward, parallel_backward, hand-written (`_delta_rule`), each
returning SIGNATURE.gradients: the gradients of <do, o> + <dstate, final_state>.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import examples, varlen
from ..signature import Signature, Tensor
from ..validation import check_beta, check_chunk_size, check_flag, check_log_gate, check_scale
from . import _delta_rule

SIGNATURE = Signature(
    inputs=(Tensor("q", "B T H K"), Tensor("k", "B T H K"), Tensor("v", "B T H V"),
            Tensor("g", "B T H K", gate=True), Tensor("beta", "B T H")),
    output="B T H V", state="B H K V", gpu="kda", grouped=("q", "k"))


def _checked(q, k, v, g, beta, scale, state, normalize_qk, cu_seqlens=None,
             step=False, scaled=True):
    """Checked inputs and the engine's q' = scale * q and k: L2-normalized when normalize_qk, each q/k head
    repeated over its group of value heads, the keys checked against the beta of each value head that reads
    them (`_delta_rule.qk_forward`). scaled=False: q without the scale (for `chunked`, which folds it in)."""
    a = SIGNATURE.check(q, k, v, g, beta, state=state, step=step, cu_seqlens=cu_seqlens)
    check_log_gate("g", a.g)
    check_beta(a.beta, False)
    normalize_qk = check_flag("normalize_qk", normalize_qk)
    return (a, *_delta_rule.qk_forward(a, scale, normalize_qk, False, scaled))


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, normalize_qk=False):
    """Token loop (the definition). Returns (o [B, T, HV, V], final state [B, HV, K, V]; [N, HV, K, V] with
    cu_seqlens, each sequence run alone: `varlen.forward`)."""
    a, q, k = _checked(q, k, v, g, beta, scale, initial_state, normalize_qk, cu_seqlens)
    return varlen.forward(_delta_rule.recurrent, (q, k, a.v, a.g, a.beta), a.state, a.cu_seqlens)


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, normalize_qk=False, chunk_size=64):
    """Chunked form (per-channel gated WY representation); any T, chunk_size > 0 (clamped to T)."""
    a, q, k = _checked(q, k, v, g, beta, scale, initial_state, normalize_qk, cu_seqlens, scaled=False)
    C = check_chunk_size(chunk_size, a.shapes["T"])
    run = functools.partial(_delta_rule.chunked, scale=check_scale(scale, a.shapes["K"]))   # q's scale folded in
    return varlen.forward(varlen.chunked(run, C), (q, k, a.v, a.g, a.beta), a.state, a.cu_seqlens)


def parallel(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, normalize_qk=False):
    """Quadratic form: the chunked form with one chunk holding the whole sequence."""
    a, q, k = _checked(q, k, v, g, beta, scale, initial_state, normalize_qk, cu_seqlens)
    return varlen.forward(_delta_rule.parallel, (q, k, a.v, a.g, a.beta), a.state, a.cu_seqlens)


def step(q, k, v, g, beta, *, state=None, scale=None, normalize_qk=False):
    """One decoding step: q, k [B, H, K], g [B, HV, K], v [B, HV, V], beta [B, HV] -> (o_t [B, HV, V], new state)."""
    a, q, k = _checked(q, k, v, g, beta, scale, state, normalize_qk, step=True)
    return _delta_rule.step(q, k, a.v, a.g, a.beta, a.state)



# Gradients (CONVENTIONS.md): the hand-written backward passes of `_delta_rule`, then the chain rule through
# this module's own mapping (scale on q, and normalize_qk's L2 normalization: `_delta_rule.qk_backward`).

def _backward(form, arrays, do, dstate, scale, state, normalize_qk, cu_seqlens, chunk_size=None):
    """Check, then `_delta_rule.module_backward`: the engine's backward per packed sequence, each q/k head's
    gradient summed over its group, the chain rule of q and k's mapping."""
    a, q, k = _checked(*arrays, scale, state, normalize_qk, cu_seqlens)
    return _delta_rule.module_backward(SIGNATURE, "kda", form, a, q, k, a.g, do, dstate, scale, normalize_qk,
                                       chunk_size)


def recurrent_backward(q, k, v, g, beta, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None, normalize_qk=False):
    """Gradients of L = <do, o> + <dstate, final_state> through `recurrent`: the definition run backwards in
    time (`_delta_rule.recurrent_backward`). do [B, T, HV, V]; dstate [B, HV, K, V] ([N, HV, K, V] with
    cu_seqlens) or None (zeros). Returns SIGNATURE.gradients("kda"): one d<name> per input (dq, dk summed
    over each q/k head's group of value heads), dinitial_state None when initial_state is None."""
    return _backward("recurrent", (q, k, v, g, beta), do, dstate, scale, initial_state, normalize_qk, cu_seqlens)


def chunked_backward(q, k, v, g, beta, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None, normalize_qk=False,
                     chunk_size=64):
    """Gradients through `chunked`, chunk-parallel through the WY form (`_delta_rule.chunked_backward`);
    arguments and result as `recurrent_backward`, plus chunk_size (clamped to T)."""
    return _backward("chunked", (q, k, v, g, beta), do, dstate, scale, initial_state, normalize_qk, cu_seqlens, chunk_size)


def parallel_backward(q, k, v, g, beta, *, do, dstate=None, scale=None, initial_state=None, cu_seqlens=None, normalize_qk=False):
    """Gradients through `parallel`: the chunked backward with one chunk holding the whole sequence."""
    return _backward("parallel", (q, k, v, g, beta), do, dstate, scale, initial_state, normalize_qk, cu_seqlens)


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs (see `minilin.examples`): returns (args, kwargs) for every form."""
    rng = examples.generator(seed)
    q = examples.normal(rng, (B, T, H, K), dtype, xp)
    k = examples.unit_vectors(rng, (B, T, H, K), dtype, xp)
    v = examples.normal(rng, (B, T, H, V), dtype, xp)
    g = examples.log_gates(rng, (B, T, H, K), dtype, xp)
    beta = examples.uniform(rng, 0, 1, (B, T, H), dtype, xp)
    return (q, k, v, g, beta), {}
