"""HGRN's gated linear recurrence (Qin, Yang & Zhong 2023, "Hierarchically Gated Recurrent Neural
Network for Sequence Modeling"): an elementwise RNN with a data-dependent forget gate and a vector state.

    h_t = exp(g_t) * h_{t-1} + x_t          elementwise over the D channels; state h: [D]
    o_t = h_t

Paper symbols -> code: the paper's HGRU writes h_t = lambda_t * exp(i theta) * h_{t-1} + (1 - lambda_t) * c_t
with the forget gate lambda_t = gamma + (1 - gamma) mu_t bounded below by the layer's gamma. Here
g_t = log lambda_t <= 0 (log space, CONVENTIONS.md) and x_t = (1 - lambda_t) * c_t, the input already
scaled by its tied input gate; the lower bound, the output gate and the norm belong to the layer and are
left out. Like FLA's `hgrn` ops this is the real recurrence: the paper's phase theta (a complex-valued
state) is dropped.

There is no matrix product anywhere (the state is a vector), so the "attention matrix" view buys
nothing; the parallel forms parallelize the recurrence itself with `minilin.scan`, on
(a_t, b_t) = (exp(g_t), x_t):
- `recurrent`: the token loop (the definition).
- `chunked`: `scan.chunked_scan`: every chunk scanned at once, chunk ends chained, then fixed up.
- `scan`: `scan.associative_scan` over the whole sequence, log depth (HGRN's parallel form; the
  quadratic masked form o_i = sum_{j <= i} exp(G_i - G_j) x_j would cost T^2 D memory for nothing).
- `step`: one token.
Each of `recurrent`, `chunked`, `scan` has its backward (`<form>_backward`): the adjoint of the recurrence
is itself a linear recurrence, run backwards in time, computed the same way (the backward section below).

Shapes: x, g [B, T, D]; o [B, T, D]; state [B, D]. Every form returns (o, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..scan import associative_scan, chunked_scan, scan_backward as recurrence_gradients
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_log_gate

SIGNATURE = Signature(inputs=(Tensor("x", "B T D"), Tensor("g", "B T D", gate=True)), output="B T D", state="B D")


def _checked(x, g, state, step=False):
    a = SIGNATURE.check(x, g, state=state, step=step)
    check_log_gate("g", a.g)
    return a


def step(x, g, *, state=None):
    """One token: x, g [B, D] -> (o_t [B, D], new state [B, D]); h = exp(g) h + x. The output and the state
    hold the same numbers in two arrays, so that changing one in place leaves the other intact."""
    a = _checked(x, g, state, step=True)
    h = a.x.copy() if a.state is None else a.xp.exp(a.g) * a.state + a.x
    return h, h.copy()


def recurrent(x, g, *, initial_state=None):
    """Token loop (the definition). Returns (o [B, T, D], final state [B, D])."""
    a = _checked(x, g, initial_state)
    x, h = a.x, a.state
    decay = a.xp.exp(a.g)                  # g <= 0: every factor in (0, 1]
    o = a.xp.empty_like(x)
    for t in range(x.shape[1]):
        o[:, t] = x[:, t] if h is None else decay[:, t] * h + x[:, t]
        h = o[:, t]
    return o, h.copy()                     # the final state is its own array, not a view of the output


def chunked(x, g, *, initial_state=None, chunk_size=64):
    """Two-level scan (`scan.chunked_scan`); any T, chunk_size > 0 (clamped to T)."""
    a = _checked(x, g, initial_state)
    o = chunked_scan(a.xp.exp(a.g), a.x, axis=1, initial=a.state,
                     chunk_size=check_chunk_size(chunk_size, a.shapes["T"]))
    return o, o[:, -1].copy()


def scan(x, g, *, initial_state=None):
    """Log-depth associative scan over the whole sequence (`scan.associative_scan`)."""
    a = _checked(x, g, initial_state)
    o = associative_scan(a.xp.exp(a.g), a.x, axis=1, initial=a.state)
    return o, o[:, -1].copy()


# --- backward ------------------------------------------------------------------------------------------
#
# The gradients of L = <do, o> + <dstate, h_{T-1}> (o_t = h_t). With lambda_t = dL/dh_t, counting h_t's
# every later use, the recurrence run backwards (`scan.adjoint_scan`):
#     lambda_{T-1} = do_{T-1} + dstate,   lambda_t = do_t + exp(g_{t+1}) lambda_{t+1}
# and then, from h_t = exp(g_t) h_{t-1} + x_t, per token:
#     dx_t = lambda_t
#     dg_t = lambda_t exp(g_t) h_{t-1}          (d exp(g) / dg = exp(g); g <= 0, so exp(g) <= 1)
#     dh_{-1} = exp(g_0) lambda_0
# The gate's gradient is one product per token: the only exponential is exp(g_t) itself.


def _backward_inputs(x, g, initial_state, do, dstate):
    a = _checked(x, g, initial_state)
    do, dstate = SIGNATURE.check_cotangents(a, do, dstate)
    return a, do, dstate


def recurrent_backward(x, g, *, do, dstate=None, initial_state=None):
    """Gradients of <do, o> + <dstate, h_{T-1}> for `recurrent`, by its loop run backwards
    (`_recurrent_backward`). Returns HgrnGradients(dx, dg, dinitial_state), dinitial_state None without an
    initial state. do [B, T, D]; dstate [B, D] or None (zeros)."""
    a, do, dstate = _backward_inputs(x, g, initial_state, do, dstate)
    return SIGNATURE.gradients("hgrn")(*_recurrent_backward(a.x, a.g, a.state, do, dstate))


def chunked_backward(x, g, *, do, dstate=None, initial_state=None, chunk_size=64):
    """As `recurrent_backward`, the states and the adjoint each by the two-level `scan.chunked_scan`
    (the adjoint's chunks scanned from the end)."""
    a, do, dstate = _backward_inputs(x, g, initial_state, do, dstate)
    C = check_chunk_size(chunk_size, a.shapes["T"])
    return SIGNATURE.gradients("hgrn")(*_scan_backward(a.x, a.g, a.state, do, dstate, "chunked", C))


def scan_backward(x, g, *, do, dstate=None, initial_state=None):
    """As `recurrent_backward`, the states and the adjoint each by one log-depth `scan.associative_scan`."""
    a, do, dstate = _backward_inputs(x, g, initial_state, do, dstate)
    return SIGNATURE.gradients("hgrn")(*_scan_backward(a.x, a.g, a.state, do, dstate, "associative"))


def _recurrent_backward(x, g, h0, do, dstate):
    """The token loop run backwards: recompute and store the states h_t (the outputs), then carry lambda
    from t = T - 1 down to 0. x, g, do [B, T, D]; h0, dstate [B, D] or None -> (dx, dg, dh0)."""
    xp = array_module(x)
    decay = xp.exp(g)
    h_before = xp.empty_like(x)                                        # h_{t-1}, stored for every t
    h = xp.zeros_like(x[:, 0]) if h0 is None else h0
    for t in range(x.shape[1]):
        h_before[:, t] = h
        h = decay[:, t] * h + x[:, t]
    lam = xp.zeros_like(x[:, 0]) if dstate is None else dstate
    dx, dg = xp.empty_like(x), xp.empty_like(x)
    for t in range(x.shape[1] - 1, -1, -1):
        lam = lam + do[:, t]                                           # lambda_t
        dx[:, t] = lam
        dg[:, t] = lam * decay[:, t] * h_before[:, t]
        lam = decay[:, t] * lam                                        # reaches h_{t-1} through exp(g_t)
    return dx, dg, (None if h0 is None else lam)


def _scan_backward(x, g, h0, do, dstate, method, chunk_size=64):
    """The same gradients with the backward recurrence as a scan (`minilin.scan.scan_backward`, `method`
    "associative" or "chunked"), the states recomputed by the same scan; dg = da exp(g) turns the
    gradient of the step's a = exp(g) into the log gate's. -> (dx, dg, dh0)."""
    decay = array_module(x).exp(g)
    da, db, dh0 = recurrence_gradients(decay, x, do, axis=1, initial=h0, dfinal=dstate, method=method,
                                       chunk_size=chunk_size)
    return db, da * decay, dh0


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs with D = H * K channels (V is unused: the state is a vector).
    Returns (args, kwargs)."""
    rng = examples.generator(seed)
    x = examples.normal(rng, (B, T, H * K), dtype, xp)
    g = examples.log_gates(rng, (B, T, H * K), dtype, xp)
    return (x, g), {}
