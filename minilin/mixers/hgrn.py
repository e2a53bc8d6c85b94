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

Shapes: x, g [B, T, D]; o [B, T, D]; state [B, D]. Every form returns (o, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..scan import associative_scan, chunked_scan
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


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs with D = H * K channels (V is unused: the state is a vector).
    Returns (args, kwargs)."""
    rng = examples.generator(seed)
    x = examples.normal(rng, (B, T, H * K), dtype, xp)
    g = examples.log_gates(rng, (B, T, H * K), dtype, xp)
    return (x, g), {}
