"""A diagonal linear time-invariant state-space model, S4D style (Gu, Gupta, Goel & Re 2022, "On the
Parameterization and Initialization of Diagonal State Space Models"; the S4 line began with Gu, Goel &
Re 2022, "Efficiently Modeling Long Sequences with Structured State Spaces").

Each of the H channels is its own single-input single-output SSM with N states. Continuous time:
    h'(t) = A h(t) + B u(t),   y(t) = Re(C h(t)) + D u(t),        A = diag(A_1 .. A_N)
discretized with step dt by zero-order hold (u held constant over each step):
    A_bar = exp(dt A),   B_bar = (exp(dt A) - 1) / A * B = dt * phi(dt A) * B,   phi(z) = (e^z - 1) / z
and then, token by token,
    h_t = A_bar * h_{t-1} + B_bar u_t            h: [N] per channel (elementwise: A is diagonal)
    y_t = Re(sum_n C_n h_t[n]) + D u_t
phi(0) = 1, so A -> 0 gives B_bar -> dt B (an integrator); phi is computed with expm1 so that a tiny
|dt A| loses no digits, and A = 0 exactly is handled without dividing by zero.

Paper symbols -> code: u = input, x (the paper's state) -> h, A, B, C, D as in the paper, Delta -> dt
(one per channel, > 0; S4D draws log dt uniformly in [log 0.001, log 0.1]), N = state size, H = number
of channels (the paper's H too). A, B, C may be real (S4D-Real: A_n = -(n + 1)) or complex (S4D-Lin:
A_n = -1/2 + i pi n); the output takes the real part. S4D keeps N/2 states of each complex conjugate
pair and doubles the real part: put that 2 into C. Re(A) <= 0 is required (a stable, non-growing
state, |A_bar| <= 1).

Because the system is time-invariant, unrolling the recurrence gives a convolution:
    y_t = sum_{l=0}^{t} K_l u_{t-l} + Re(C A_bar^{t+1} h_{-1}) + D u_t,     K_l = Re(C A_bar^l B_bar)
Forms (all equal):
- `recurrent`: the token loop (the definition).
- `convolution`: the kernel K (length T) applied by FFT, O(T log T), S4's parallel form. The kernel is
  a Vandermonde product; it is evaluated with powers split as l = m M + i (M ~ sqrt(T)), so that it costs
  one [sqrt(T), N] x [N, sqrt(T)] product per channel instead of an [T, N] matrix.
- `chunked`: inside each chunk of C tokens the same convolution as a dense [C, C] Toeplitz matrix of
  K_0 .. K_{C-1} (one matrix for all chunks: the system is time-invariant), plus the read of the state
  entering the chunk, Re(C A_bar^{i+1} h_in); the state passes as
  h <- A_bar^C h + sum_j A_bar^{C-1-j} B_bar u_j.
  Every power A_bar^l = exp(l dt A) has Re(l dt A) <= 0: nothing overflows.
- `step`: one token, for decoding.
There is no separate quadratic `parallel` form: it would be the [T, T] Toeplitz matrix per channel,
which the convolution applies in O(T log T) without building it.

Shapes: u [B, T, H] (one number per channel and token: S4 mixes along time, channel by channel, so a
channel is a head of width 1 and the CONVENTIONS.md [B, T, H, ...] layout loses its last axis);
dt [H]; A, B, C [H, N]; D [H] or None; y [B, T, H]; state [B, H, N] (complex when A, B are).
Every form returns (y, final_state).
"""
from __future__ import annotations

import numpy as np

from .. import examples
from ..backend import array_module
from ..chunking import from_chunks, pass_states, to_chunks
from ..signature import Signature, Tensor
from ..validation import check_chunk_size, check_max, check_min

SIGNATURE = Signature(
    inputs=(Tensor("u", "B T H"), Tensor("dt", "H"), Tensor("A", "H N"), Tensor("B", "H N"), Tensor("C", "H N"),
            Tensor("D", "H", optional=True)),
    output="B T H", state="B H N")  # A, B, C and the state may be complex (S4D-Lin)

# --- discretization ----------------------------------------------------------------------------------


def discretize(dt, A, B):
    """Zero-order hold: (A_bar, B_bar) = (exp(dt A), (exp(dt A) - 1) / A * B). dt [H]; A, B [H, N]."""
    z = dt[:, None] * A
    return array_module(z).exp(z), dt[:, None] * _phi(z) * B


def _phi(z):
    """(e^z - 1) / z, with phi(0) = 1; accurate for tiny |z| (expm1), real or complex z."""
    xp = array_module(z)
    zero = z == 0
    return xp.where(zero, 1, _expm1(z) / xp.where(zero, 1, z))


def _expm1(z):
    """e^z - 1 without cancellation, also for complex z = x + iy:
    e^z - 1 = (expm1(x) cos y - 2 sin^2(y / 2)) + i e^x sin y."""
    xp = array_module(z)
    if z.dtype.kind != "c":
        return xp.expm1(z)
    x, y = z.real, z.imag
    return (xp.expm1(x) * xp.cos(y) - 2 * xp.sin(y / 2) ** 2) + 1j * (xp.exp(x) * xp.sin(y))


# --- the forms -----------------------------------------------------------------------------------------


def step(u, dt, A, B, C, D=None, *, state=None):
    """One decoding step: u [B, H] -> (y_t [B, H], new state [B, H, N])."""
    u, dt, A, B, C, D, h = _prepare(u, dt, A, B, C, D, state, step=True)
    A_bar, B_bar = discretize(dt, A, B)
    h = B_bar * u[..., None] if h is None else A_bar * h + B_bar * u[..., None]
    return _read(h, C, u, D), h


def recurrent(u, dt, A, B, C, D=None, *, initial_state=None):
    """Token loop (the definition). Returns (y [B, T, H], final state [B, H, N])."""
    u, dt, A, B, C, D, h = _prepare(u, dt, A, B, C, D, initial_state)
    A_bar, B_bar = discretize(dt, A, B)
    y = array_module(u).empty_like(u)
    for t in range(u.shape[1]):
        write = B_bar * u[:, t, :, None]
        h = write if h is None else A_bar * h + write
        y[:, t] = _read(h, C, u[:, t], D)
    return y, h


def convolution(u, dt, A, B, C, D=None, *, initial_state=None):
    """y = K * u by FFT (+ the initial state's read, + D u). Returns (y [B, T, H], final state [B, H, N])."""
    u, dt, A, B, C, D, h0 = _prepare(u, dt, A, B, C, D, initial_state)
    xp = array_module(u)
    T = u.shape[1]
    A_bar, B_bar = discretize(dt, A, B)
    dtA = dt[:, None] * A
    kernel = _power_sums(C * B_bar, dtA, T)                       # K_l = Re(C A_bar^l B_bar): [H, T]

    u_ht = xp.moveaxis(u, 1, 2)                                    # [B, H, T]
    n_fft = 1 << (2 * T - 1).bit_length()                          # >= 2T - 1: no circular wrap-around
    y = xp.fft.irfft(xp.fft.rfft(u_ht, n_fft) * xp.fft.rfft(kernel, n_fft), n_fft)[..., :T]
    # The final state h_{T-1} = A_bar^T h_{-1} + B_bar * sum_l A_bar^l u_{T-1-l}: the same powers, summed
    # against the reversed input instead of C.
    h = B_bar * _weighted_power_sums(u_ht[..., ::-1], dtA)
    if h0 is not None:
        y = y + _power_sums(C * A_bar * h0, dtA, T)                # Re(C A_bar^{t+1} h_{-1})
        h = h + xp.exp(T * dtA) * h0
    y = xp.moveaxis(y, 2, 1).astype(u.dtype, copy=False)
    return (y if D is None else y + D * u), h


def chunked(u, dt, A, B, C, D=None, *, initial_state=None, chunk_size=64):
    """Toeplitz blocks inside chunks, the state passed between them; any T, chunk_size > 0 (clamped to T)."""
    u, dt, A, B, C, D, h0 = _prepare(u, dt, A, B, C, D, initial_state)
    chunk_size = check_chunk_size(chunk_size, u.shape[1])
    xp = array_module(u)
    T, c = u.shape[1], chunk_size
    A_bar, B_bar = discretize(dt, A, B)
    dtA = dt[:, None] * A
    uc = to_chunks(u, c)                                           # [B, H, N_chunks, c]
    n_chunks = uc.shape[2]

    # Inside a chunk: y_i = sum_{j <= i} K_{i-j} u_j, one [c, c] lower-triangular Toeplitz matrix per channel.
    kernel = _power_sums(C * B_bar, dtA, c)                        # [H, c]
    lag = xp.arange(c)[:, None] - xp.arange(c)[None, :]            # i - j
    toeplitz = xp.where(lag >= 0, kernel[:, xp.maximum(lag, 0)], 0)  # [H, c, c]
    y = uc @ toeplitz.swapaxes(-1, -2)[None]                       # [B, H, N_chunks, c]

    # What chunk n writes into the state, measured at its last real token: sum_j A_bar^{L-1-j} B_bar u_j,
    # L = the chunk's length (c, or less for the last chunk; its zero padding must not decay the state).
    powers = xp.exp(_counts(c, dtA)[:, None, None] * dtA)             # A_bar^l for l < c: [c, H, N]
    to_end = xp.moveaxis(powers[::-1], 0, 1) * B_bar[:, None]      # A_bar^{c-1-j} B_bar: [H, c, N]
    dS = uc.astype(to_end.dtype) @ to_end[None]                    # [B, H, N_chunks, N]
    last = T - (n_chunks - 1) * c
    if last < c:
        dS[:, :, -1:] = uc[:, :, -1:, :last].astype(to_end.dtype) @ to_end[None, :, c - last:]
    lengths = xp.full(n_chunks, c, dtype=dtA.real.dtype)
    lengths[-1] = last
    log_decay = xp.broadcast_to(lengths[:, None, None] * dtA, (uc.shape[0], n_chunks, *dtA.shape))
    S_in, h = pass_states(dS[..., None], xp.moveaxis(log_decay, 1, 2), None if h0 is None else h0[..., None])

    # Reading the state entering the chunk at token i: Re(C A_bar^{i+1} h_in).
    read = C[:, None] * xp.moveaxis(powers, 0, 1) * A_bar[:, None]  # [H, c, N]
    y = y + (S_in[..., 0] @ read.swapaxes(-1, -2)[None]).real
    y = from_chunks(y[..., None], T)[..., 0].astype(u.dtype, copy=False)
    return (y if D is None else y + D * u), h[..., 0]


# --- pieces ----------------------------------------------------------------------------------------------


def _read(h, C, u, D):
    """y = Re(C . h) + D u: h [B, H, N], C [H, N], u [B, H] -> [B, H]."""
    y = (h * C).sum(-1).real.astype(u.dtype, copy=False)
    return y if D is None else y + D * u


def _counts(L, like):
    """0, 1, .., L-1 in the real precision of `like` (an int64 arange would promote float32 to float64)."""
    return array_module(like).arange(L, dtype=like.real.dtype)


def _power_blocks(dtA, L):
    """exp(l dt A) for l = m M + i split as (outer [H, L_M, N] = exp(m M dtA), inner [H, M, N] = exp(i dtA)),
    M = ceil(sqrt(L)), L_M = ceil(L / M). Every exponent has a non-positive real part."""
    xp = array_module(dtA)
    M = max(int(np.ceil(np.sqrt(L))), 1)
    L_M = -(-L // M)
    inner = xp.exp(_counts(M, dtA)[None, :, None] * dtA[:, None, :])
    outer = xp.exp((M * _counts(L_M, dtA))[None, :, None] * dtA[:, None, :])
    return outer, inner, M


def _power_sums(coef, dtA, L):
    """Re(sum_n coef_n exp(l dtA_n)) for l = 0 .. L-1: coef [..., H, N] -> [..., H, L].

    With l = m M + i the sum is (outer * coef) @ inner^T, an [L_M, N] x [N, M] product per channel.
    """
    outer, inner, M = _power_blocks(dtA, L)
    sums = (outer * coef[..., None, :]) @ inner.swapaxes(-1, -2)     # [..., H, L_M, M]
    return sums.reshape(*sums.shape[:-2], -1)[..., :L].real


def _weighted_power_sums(w, dtA):
    """sum_l w_l exp(l dtA_n) for every n: w [B, H, L] -> [B, H, N], by the same split of l."""
    xp = array_module(w)
    L = w.shape[-1]
    outer, inner, M = _power_blocks(dtA, L)
    padded = xp.zeros((*w.shape[:-1], outer.shape[1] * M), w.dtype)
    padded[..., :L] = w
    blocks = padded.reshape(*w.shape[:-1], outer.shape[1], M)         # [B, H, L_M, M]
    return ((blocks.astype(inner.dtype) @ inner) * outer).sum(-2)     # [B, H, N]


# --- checks ----------------------------------------------------------------------------------------------


def _is_complex(x) -> bool:
    return x is not None and getattr(getattr(x, "dtype", None), "kind", None) == "c"


def _prepare(u, dt, A, B, C, D, state, step=False):
    """Check every input; A, B, C and the state may be complex. Returns them cast: u, dt, D in the real
    working precision, A, B, C and the state in the complex one if any of them is complex."""
    xp = array_module(u, dt, A, B, C, D, state)
    any_complex = any(_is_complex(x) for x in (A, B, C, state))

    def real(x):
        """A complex argument is checked through |x|: same shape, finite exactly where x is."""
        return xp.abs(x) if _is_complex(x) else x

    a = SIGNATURE.check(u, dt, real(A), real(B), real(C), D, state=real(state), step=step)
    check_min("dt", a.dt, 0.0, "step sizes dt > 0", strict=True)
    check_max("A", A.real, 0.0, "Re(A) <= 0 (a stable state: |exp(dt A)| <= 1)")
    work = xp.result_type(a.u.dtype, xp.complex64) if any_complex else a.u.dtype
    A, B, C, state = (None if x is None else x.astype(work, copy=False) for x in (A, B, C, state))
    return a.u, a.dt, A, B, C, a.D, state


def example_inputs(B=2, T=64, H=4, K=16, V=16, *, dtype=np.float64, seed=0, xp=np, init="real"):
    """Random valid inputs: H * V channels with N = K states each (the same state size H K V as the
    matrix-state mixers). Returns (args, kwargs).

    init="real" (the default, real arrays of `dtype`): S4D-Real's A_n = -(n + 1), jittered per channel.
    init="lin": S4D-Lin's complex A_n = -1/2 + i pi n (jittered), with complex B and C.
    """
    rng = examples.generator(seed)
    channels, N = H * V, K
    u = examples.normal(rng, (B, T, channels), dtype, xp)
    dt = xp.asarray(np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), channels)), dtype=dtype)
    jitter = rng.uniform(0.5, 1.5, (channels, N))
    D = examples.normal(rng, (channels,), dtype, xp)
    if init == "real":
        A = xp.asarray(-jitter * np.arange(1, N + 1), dtype=dtype)
        B_in, C_out = (examples.normal(rng, (channels, N), dtype, xp) for _ in range(2))
        return (u, dt, A, B_in, C_out, D), {}
    if init == "lin":
        cdtype = np.result_type(dtype, np.complex64)
        A = -0.5 * jitter + 1j * np.pi * np.arange(N) * rng.uniform(0.9, 1.1, (channels, N))
        B_in, C_out = (rng.standard_normal((channels, N)) + 1j * rng.standard_normal((channels, N))
                       for _ in range(2))
        return (u, dt, *(xp.asarray(x, dtype=cdtype) for x in (A, B_in, C_out)), D), {}
    raise ValueError(f"init: expected 'real' or 'lin', got {init!r}")
