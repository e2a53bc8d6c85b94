"""Mamba-1's selective state-space model (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with
Selective State Spaces"), the S6 layer: an SSM whose step size dt and matrices B, C depend on the input.

For every channel d = 0..D-1 and state index n = 0..N-1 (a diagonal SSM per channel):

    h_t[d, n] = exp(dt_t[d] A[d, n]) h_{t-1}[d, n] + dt_t[d] B_t[n] x_t[d]
    y_t[d]    = sum_n C_t[n] h_t[d, n] + D[d] x_t[d]

that is h_t = A_bar_t * h_{t-1} + B_bar_t x_t with A_bar = exp(dt A) (zero-order hold) and
B_bar = dt B (the simplified discretization Mamba uses for B; see `s4` for the exact ZOH one).

Paper symbols -> code: x = input (the SSM sees D = E * d_model channels), Delta -> dt (after softplus,
dt >= 0, one per channel and token), A -> A (diagonal, A = -exp(A_log) <= 0, one row of N per
channel), B, C -> B, C (shared by all channels, one N-vector per token), D -> D (skip), h -> the state,
N = state size. The gate y * silu(z), the convolution and the projections belong to the Mamba block
around this layer and are left out.

Why Mamba-1 has no matmul chunked form (and Mamba-2 has one): the decay exp(dt_t[d] A[d, n]) differs
per channel *and* per state index, so the intra-chunk matrix exp(G_i - G_j) of `mamba2` / `gla` would be
a [C, C] matrix for every (d, n): C times the work of the recurrence. Mamba-2's scalar A per head is
what makes that matrix shared. Here the forms parallelize the recurrence itself instead, with the
associative scan of `minilin.scan` (h_t = a_t h_{t-1} + b_t, elementwise over [D, N]):
- `recurrent`: the token loop (the definition).
- `scan`: one log-depth associative scan over the whole sequence; holds all T states [T, D, N].
- `chunked`: chunks of C tokens one after another, each scanned in parallel from the state carried
  in, its states read by C_t at once and dropped. Only one chunk's states [C, D, N] are alive at a
  time: the structure of Mamba's fused CUDA kernel, which keeps a chunk's states in SRAM and never
  writes the [T, D, N] states to HBM (the paper's "hardware-aware" scan).
- `step`: one token, for decoding.

Shapes (the paper's, no heads: B and C are shared across channels):
x, dt [B, T, D]; A [D, N]; B, C [B, T, N]; D [D] or None; y [B, T, D]; state [B, D, N].
Every form returns (y, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..scan import associative_scan
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_max, check_min

SIGNATURE = Signature(
    inputs=(Tensor("x", "B T D"), Tensor("dt", "B T D"), Tensor("A", "D N"), Tensor("B", "B T N"),
            Tensor("C", "B T N"), Tensor("D", "D", optional=True)),
    output="B T D", state="B D N")


def _checked(x, dt, A, B, C, D, state, step=False):
    """Checked inputs: dt >= 0, A <= 0."""
    a = SIGNATURE.check(x, dt, A, B, C, D, state=state, step=step)
    check_min("dt", a.dt, 0.0, "step sizes dt >= 0")
    check_max("A", a.A, 0.0, "A <= 0 (so the decay exp(dt A) is at most 1)")
    return a


def _discretize(x, dt, A, B):
    """The per-token step h -> a h + b: a = exp(dt A), b = dt B x. [..., D] inputs -> [..., D, N].

    dt A <= 0, so a lies in (0, 1]: the only exponential taken, and of a non-positive number.
    """
    xp = array_module(x)
    a = xp.exp(dt[..., None] * A)
    b = (dt * x)[..., None] * B[..., None, :]
    return a, b


def _read(h, C, x, D):
    """y = h C + D x: h [..., D, N], C [..., N], x [..., D] -> [..., D]."""
    y = (h @ C[..., :, None])[..., 0]
    return y if D is None else y + D * x


def step(x, dt, A, B, C, D=None, *, state=None):
    """One decoding step: x, dt [B, D], B, C [B, N] -> (y_t [B, D], new state [B, D, N])."""
    c = _checked(x, dt, A, B, C, D, state, step=True)
    a, b = _discretize(c.x, c.dt, c.A, c.B)
    h = b if c.state is None else a * c.state + b
    return _read(h, c.C, c.x, c.D), h


def recurrent(x, dt, A, B, C, D=None, *, initial_state=None):
    """Token loop (the definition). Returns (y [B, T, D], final state [B, D, N])."""
    c = _checked(x, dt, A, B, C, D, initial_state)
    x, dt, A, B, C, D, h = c.x, c.dt, c.A, c.B, c.C, c.D, c.state
    y = c.xp.empty_like(x)
    for t in range(x.shape[1]):
        a, b = _discretize(x[:, t], dt[:, t], A, B[:, t])
        h = b if h is None else a * h + b
        y[:, t] = _read(h, C[:, t], x[:, t], D)
    return y, h


def scan(x, dt, A, B, C, D=None, *, initial_state=None):
    """All T states at once by the log-depth associative scan (`minilin.scan`), then y = h C + D x.

    Memory: the states of every token, B * T * D * N numbers (the price the fused kernel avoids).
    """
    c = _checked(x, dt, A, B, C, D, initial_state)
    a, b = _discretize(c.x, c.dt, c.A, c.B)             # [B, T, D, N]
    h = associative_scan(a, b, axis=1, initial=c.state)
    return _read(h, c.C, c.x, c.D), h[:, -1].copy()    # a copy: a view would keep all T states alive


def chunked(x, dt, A, B, C, D=None, *, initial_state=None, chunk_size=64):
    """Chunk after chunk, each scanned in parallel from the carried state; any T, chunk_size > 0 (clamped to T).

    For chunk [s, e): h_s .. h_{e-1} = associative scan of (a_t, b_t) from h_{s-1}; y_t = h_t C_t + D x_t;
    carry h_{e-1}. Only [B, chunk_size, D, N] states are held at a time.
    """
    c = _checked(x, dt, A, B, C, D, initial_state)
    chunk_size = check_chunk_size(chunk_size, c.shapes["T"])
    x, dt, A, B, C, D, h = c.x, c.dt, c.A, c.B, c.C, c.D, c.state
    y = c.xp.empty_like(x)
    for s in range(0, x.shape[1], chunk_size):
        e = min(s + chunk_size, x.shape[1])
        a, b = _discretize(x[:, s:e], dt[:, s:e], A, B[:, s:e])   # [B, e - s, D, N]
        states = associative_scan(a, b, axis=1, initial=h)
        y[:, s:e] = _read(states, C[:, s:e], x[:, s:e], D)
        h = states[:, -1]
    return y, h.copy()


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np):
    """Random valid inputs: D = H * V channels, N = K states per channel. Returns (args, kwargs).

    A follows S4D-Real's initialization A[d, n] = -(n + 1), jittered per channel, so the channels
    forget at many rates; dt in [0.01, 0.3] as after Mamba's softplus.
    """
    rng = examples.generator(seed)
    D, N = H * V, K
    x = examples.normal(rng, (B, T, D), dtype, xp)
    dt = examples.uniform(rng, 0.01, 0.3, (B, T, D), dtype, xp)
    A = xp.asarray(-rng.uniform(0.5, 1.5, (D, N)) * np.arange(1, N + 1), dtype=dtype)
    B_in = examples.normal(rng, (B, T, N), dtype, xp)
    C_out = examples.normal(rng, (B, T, N), dtype, xp)
    D_skip = examples.normal(rng, (D,), dtype, xp)
    return (x, dt, A, B_in, C_out, D_skip), {}
