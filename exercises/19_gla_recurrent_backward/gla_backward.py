"""Exercise 19: the backward pass of simple GLA (scalar-gated linear attention), recurrent.

The forward is exercise 16's recurrence (RetNet, Lightning and Mamba-2 are this with their own gates):

    S_t = exp(g_t) S_{t-1} + k_t v_t^T,      o_t = S_t^T q'_t,      q'_t = scale * q_t,      S_{-1} = S0

for t = 0 .. T-1, per batch and head (S: [K, V]), from the initial state S0 (zeros when None). The backward
pass gets the cotangents do_t = dL/do_t and dstate = dL/dS_{T-1} (None: zeros), i.e. the gradients of

    L = sum_t <do_t, o_t> + <dstate, S_{T-1}>,

and returns dL/dq, dL/dk, dL/dv, dL/dg and dL/dS0. No autograd: the chain rule by hand, one line of the
forward at a time.

1. The state's adjoint. Sbar_t = dL/dS_t collects everything S_t influences: its own read o_t, and through
   S_{t+1} = exp(g_{t+1}) S_t + ..., every later state. So it is computed backwards in time:

       Sbar_{T-1} = dstate + q'_{T-1} do_{T-1}^T
       Sbar_{t-1} = exp(g_t) Sbar_t + q'_{t-1} do_{t-1}^T           (`state_adjoints`)

   The decay runs backwards with the same factor exp(g_t) <= 1 as forwards: no exponential can overflow.

2. Each token's inputs, read off the two places where they appear:

       o_t = S_t^T q'_t                ->   dq_t = scale S_t do_t
       S_t = ... + k_t v_t^T           ->   dk_t = Sbar_t v_t,       dv_t = Sbar_t^T k_t
       S_0 = exp(g_0) S0 + ...         ->   dS0  = exp(g_0) Sbar_0

   dq needs the forward states S_t (run the forward first and keep them; minilin's recurrent_backward keeps
   one in every sqrt(T) and recomputes the rest, trading a second forward pass for memory).

3. The gate, as a reverse cumulative sum (`gate_gradient`). Unroll the recurrence with the cumulative gate
   G_t = g_0 + ... + g_t:

       S_t = exp(G_t) S0 + sum_{j <= t} exp(G_t - G_j) k_j v_j^T

   G_t enters L in three ways: as exp(+G_t) in every term of o_t (the terms that make up q_t's gradient),
   as exp(-G_t) in every term that holds k_t (k_t's gradient), and, for t = T-1, as exp(+G_{T-1}) in the
   final state. Differentiating exp(+-G) gives +-(the same term), so

       dL/dG_t = q_t . dq_t - k_t . dk_t          (+ <dstate, S_{T-1}> at t = T-1; dot products over K)

   and since g_s is a part of every G_t with t >= s,

       dg_s = sum_{t >= s} dL/dG_t               a reverse cumulative sum of per-token terms.

   It needs no exponential at all. (The direct route, dg_t = exp(g_t) <Sbar_t, S_{t-1}>, gives the same
   numbers; the reverse cumulative sum is what chunked backward passes use, exercise 20.)

Shapes: q, k [B, T, H, K]; v, do [B, T, H, V]; g [B, T, H] (log space, <= 0); states, adjoints and S0
[B, H, K, V] (all T of them: [B, T, H, K, V]); scale defaults to K ** -0.5.
Check: `minilin check 19` (compares with minilin.mixers.simple_gla's recurrent_backward and with central
finite differences of L, for each input, with and without an initial state and dstate).
"""
import numpy as np


def state_adjoints(q, do, g, *, scale=None, dstate=None):
    """Sbar_t = dL/dS_t for every t, backwards in time (module docstring, step 1).

    q: [B, T, H, K]; do: [B, T, H, V]; g: [B, T, H]; dstate: [B, H, K, V] or None (zeros).
    Returns Sbar: [B, T, H, K, V], Sbar[:, t] the adjoint of the state after token t.
    """
    raise NotImplementedError(
        "TODO: from Sbar = dstate (or zeros), for t = T-1 down to 0: Sbar += q'_t do_t^T, store it, then decay by exp(g_t) (about 9 lines)")


def gate_gradient(q, k, dq, dk, *, dstate=None, final_state=None):
    """dg_s = sum_{t >= s} (q_t . dq_t - k_t . dk_t), plus <dstate, final_state> for every s (step 3).

    q, k, dq, dk: [B, T, H, K] (dq, dk: the gradients of q, k); dstate, final_state: [B, H, K, V], or None
    when there is no dstate. Returns dg: [B, T, H].
    """
    raise NotImplementedError(
        "TODO: per-token terms q . dq - k . dk, the final state's term at the last token, then a reverse cumsum over t (about 4 lines)")


def recurrent_backward(q, k, v, g, *, do, dstate=None, scale=None, initial_state=None):
    """Gradients of L = sum_t <do_t, o_t> + <dstate, S_{T-1}> through the recurrence (module docstring).

    q, k: [B, T, H, K]; v, do: [B, T, H, V]; g: [B, T, H]; dstate, initial_state: [B, H, K, V] or None.
    Returns (dq, dk, dv, dg, dinitial_state), shaped like q, k, v, g and initial_state; dinitial_state is
    None when initial_state is None.
    """
    raise NotImplementedError(
        "TODO: the forward states S_t, the adjoints Sbar_t; then dq, dk, dv per token, dS0, and dg by gate_gradient (about 15 lines)")
