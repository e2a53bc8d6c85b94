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
Each of `recurrent`, `scan`, `chunked` has its backward (`<form>_backward`): the state's adjoint is a
linear recurrence run backwards in time, by the same loop, scans or chunks (the backward section below).

Shapes (the paper's, no heads: B and C are shared across channels):
x, dt [B, T, D]; A [D, N]; B, C [B, T, N]; D [D] or None; y [B, T, D]; state [B, D, N].
Every form returns (y, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..scan import associative_scan, scan_backward as recurrence_gradients
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


# --- backward ------------------------------------------------------------------------------------------
#
# The gradients of L = <dy, y> + <dstate, h_{T-1}> (dy: the `do` argument). Per channel d and state index n,
# the step is
# h_t = a_t h_{t-1} + b_t with a_t = exp(dt_t A), b_t = dt_t x_t B_t, read as y_t = h_t C_t + D x_t:
# 1. The read: dh_t (direct) = dy_t C_t^T  (dy_t[d] C_t[n]),  dC_t = h_t^T dy_t,  dD = sum_t dy_t x_t,
#    dx_t += D dy_t.
# 2. The state's adjoint lambda_t = dL/dh_t, the recurrence run backwards (`scan.adjoint_scan`):
#    lambda_{T-1} = dh_{T-1} + dstate,  lambda_t = dh_t + a_{t+1} lambda_{t+1};  dh_{-1} = a_0 lambda_0.
# 3. The step's coefficients (`scan.scan_backward`): da_t = lambda_t h_{t-1}, db_t = lambda_t.
# 4. The discretization (`_discretization_backward`), with dlog_t = da_t a_t the gradient of the log
#    decay dt_t A (a per-token product; the only exponential is a_t = exp(dt_t A) <= 1 itself):
#    dA    = sum_t dt_t dlog_t
#    ddt_t = sum_n (A dlog_t + x_t B_t db_t)[., n]
#    dx_t += dt_t (db_t B_t)          (sum over n)
#    dB_t  = sum_d dt_t[d] x_t[d] db_t[d, .]


def _backward_inputs(x, dt, A, B, C, D, initial_state, do, dstate):
    a = _checked(x, dt, A, B, C, D, initial_state)
    do, dstate = SIGNATURE.check_cotangents(a, do, dstate)
    return (a.x, a.dt, a.A, a.B, a.C, a.D, a.state, do, dstate), a


def recurrent_backward(x, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None):
    """Gradients of <do, y> + <dstate, h_{T-1}> for `recurrent`, by its loop run backwards
    (`_recurrent_backward`). Returns MambaGradients(dx, ddt, dA, dB, dC, dD, dinitial_state); dD None
    without D, dinitial_state None without an initial state. do [B, T, D]; dstate [B, D, N] or None."""
    arrays, _ = _backward_inputs(x, dt, A, B, C, D, initial_state, do, dstate)
    return SIGNATURE.gradients("mamba")(*_recurrent_backward(*arrays))


def chunked_backward(x, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None, chunk_size=64):
    """As `recurrent_backward`, chunk by chunk from the last (`_chunked_backward`): one chunk's states
    alive at a time, as in `chunked`."""
    arrays, a = _backward_inputs(x, dt, A, B, C, D, initial_state, do, dstate)
    C_ = check_chunk_size(chunk_size, a.shapes["T"])
    return SIGNATURE.gradients("mamba")(*_chunked_backward(*arrays, C_))


def scan_backward(x, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None):
    """As `recurrent_backward`, by two log-depth scans over the whole sequence (`_scan_backward`): all T
    states held, as in `scan`."""
    arrays, _ = _backward_inputs(x, dt, A, B, C, D, initial_state, do, dstate)
    return SIGNATURE.gradients("mamba")(*_scan_backward(*arrays))


def _discretization_backward(x, dt, A, B, da, db):
    """Step 4: (da, db) [..., D, N] of the steps (a, b) = (exp(dt A), dt x B) -> (dx, ddt, dA, dB).
    x, dt [..., D]; A [D, N]; B [..., N]; dA summed over the leading axes."""
    dlog = da * array_module(x).exp(dt[..., None] * A)                 # gradient of the log decay dt A
    db_B = (db @ B[..., :, None])[..., 0]                              # sum_n db[d, n] B[n]: [..., D]
    dx = dt * db_B
    ddt = (dlog * A).sum(-1) + x * db_B
    dA = (dlog * dt[..., None]).reshape(-1, *A.shape).sum(0)
    dB = ((dt * x)[..., None, :] @ db)[..., 0, :]
    return dx, ddt, dA, dB


def _read_backward(h, dy):
    """Step 1's dC_t = h_t^T dy_t (sum over the channels d of dy_t[d] h_t[d, .]). h [..., D, N], dy [..., D]
    -> [..., N]."""
    return (dy[..., None, :] @ h)[..., 0, :]


def _recurrent_backward(x, dt, A, B, C, D, h0, dy, dstate):
    """The token loop run backwards. Stores every state h_t ([B, T, D, N], recomputed by the forward loop,
    as autograd through `recurrent` would), then carries lambda from t = T - 1 down to 0, token by token.
    Returns (dx, ddt, dA, dB, dC, dD, dh0); dD None when D is None, dh0 None when h0 is None."""
    xp = array_module(x)
    Bsz, T, Dch = x.shape
    h_all = xp.empty((Bsz, T + 1, Dch, A.shape[1]), x.dtype)           # h_all[:, t + 1] = h_t, h_all[:, 0] = h_{-1}
    h_all[:, 0] = 0 if h0 is None else h0
    for t in range(T):
        a, b = _discretize(x[:, t], dt[:, t], A, B[:, t])
        h_all[:, t + 1] = a * h_all[:, t] + b
    dx, ddt, dB, dC = xp.empty_like(x), xp.empty_like(dt), xp.empty_like(B), xp.empty_like(C)
    dA = xp.zeros_like(A)
    lam = xp.zeros_like(h_all[:, 0]) if dstate is None else dstate
    for t in range(T - 1, -1, -1):
        lam = lam + dy[:, t, :, None] * C[:, t, None, :]                # lambda_t = dh_t + (later uses)
        dC[:, t] = _read_backward(h_all[:, t + 1], dy[:, t])
        a = xp.exp(dt[:, t, :, None] * A)
        dx[:, t], ddt[:, t], dA_t, dB[:, t] = _discretization_backward(
            x[:, t], dt[:, t], A, B[:, t], lam * h_all[:, t], lam)
        dA += dA_t
        lam = a * lam                                                   # reaches h_{t-1} through a_t
    return _with_skip(x, dy, D, dx, ddt, dA, dB, dC, None if h0 is None else lam)


def _span_backward(x, dt, A, B, C, h_in, dy, carry):
    """Steps 1-4 over a span of tokens by associative scans: the states from h_in (zeros when None), then
    the adjoint by `scan.scan_backward` with dfinal = carry (the adjoint arriving from after the span).
    Returns (dx without D dy, ddt, dA, dB, dC, the adjoint of h_in)."""
    xp = array_module(x)
    a, b = _discretize(x, dt, A, B)                                     # [B, t, D, N]
    h_in = xp.zeros_like(a[:, 0]) if h_in is None else h_in
    h = associative_scan(a, b, axis=1, initial=h_in)
    da, db, dh_in = recurrence_gradients(a, b, dy[..., None] * C[:, :, None, :], axis=1, initial=h_in,
                                         dfinal=carry, h=h, method="associative")
    dx, ddt, dA, dB = _discretization_backward(x, dt, A, B, da, db)
    return dx, ddt, dA, dB, _read_backward(h, dy), dh_in


def _scan_backward(x, dt, A, B, C, D, h0, dy, dstate):
    """One span: the whole sequence, all T states held ([B, T, D, N]), as `scan`."""
    dx, ddt, dA, dB, dC, dh0 = _span_backward(x, dt, A, B, C, h0, dy, dstate)
    return _with_skip(x, dy, D, dx, ddt, dA, dB, dC, dh0 if h0 is not None else None)


def _chunked_backward(x, dt, A, B, C, D, h0, dy, dstate, chunk_size):
    """As `chunked`, chunk by chunk: a forward pass keeps only the state entering each chunk
    ([B, N_chunks, D, N]); then from the last chunk to the first, recompute the chunk's states from its
    entering state, scan its adjoint backwards from the carry, and pass the adjoint of the entering state
    (a_s lambda_s) on as the previous chunk's carry. Only one chunk's [B, C, D, N] states are alive at a
    time. -> (dx, ddt, dA, dB, dC, dD, dh0)."""
    xp = array_module(x)
    T = x.shape[1]
    starts = list(range(0, T, chunk_size))
    h_in, h = [], h0
    for s in starts:                                                    # the entering states, as `chunked`
        h_in.append(h)
        e = min(s + chunk_size, T)
        a, b = _discretize(x[:, s:e], dt[:, s:e], A, B[:, s:e])
        h = associative_scan(a, b, axis=1, initial=h)[:, -1]
    dx, ddt, dB, dC = xp.empty_like(x), xp.empty_like(dt), xp.empty_like(B), xp.empty_like(C)
    dA = xp.zeros_like(A)
    carry = dstate
    for s, h_s in zip(reversed(starts), reversed(h_in)):
        e = min(s + chunk_size, T)
        dx[:, s:e], ddt[:, s:e], dA_c, dB[:, s:e], dC[:, s:e], carry = _span_backward(
            x[:, s:e], dt[:, s:e], A, B[:, s:e], C[:, s:e], h_s, dy[:, s:e], carry)
        dA += dA_c
    return _with_skip(x, dy, D, dx, ddt, dA, dB, dC, carry if h0 is not None else None)


def _with_skip(x, dy, D, dx, ddt, dA, dB, dC, dh0):
    """Step 1's skip term: dx += D dy, dD = sum over batch and tokens of dy x. -> the seven gradients."""
    if D is None:
        return dx, ddt, dA, dB, dC, None, dh0
    return dx + D * dy, ddt, dA, dB, dC, (dy * x).reshape(-1, x.shape[-1]).sum(0), dh0


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
