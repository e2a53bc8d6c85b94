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
Each of `recurrent`, `convolution`, `chunked` has its backward (`<form>_backward`), through the
zero-order hold down to dt, A, B; complex gradients are packed as dL/dRe + i dL/dIm (the backward
section below says why and how).

Shapes: u [B, T, H] (one number per channel and token: S4 mixes along time, channel by channel, so a
channel is a head of width 1 and the CONVENTIONS.md [B, T, H, ...] layout loses its last axis);
dt [H]; A, B, C [H, N]; D [H] or None; y [B, T, H]; state [B, H, N] (complex when A, B are).
Every form returns (y, final_state).
"""
from __future__ import annotations

import math

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


def _prepare(u, dt, A, B, C, D, state, step=False, *, cotangents=None):
    """Check every input; A, B, C and the state may be complex. Returns them cast: u, dt, D in the real
    working precision, A, B, C and the state in the complex one if any of them is complex.
    cotangents=(do, dstate) (a backward): also checks those and returns (arrays, do, dstate), dstate in
    the state's working dtype (complex when the state is)."""
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
    arrays = (a.u, a.dt, A, B, C, a.D, state)
    if cotangents is None:
        return arrays
    do, dstate = cotangents
    if _is_complex(dstate) and not any_complex:
        raise TypeError(f"dstate: expected a real array (A, B, C and the state are real), got {dstate.dtype}")
    do, _ = SIGNATURE.check_cotangents(a, do, real(dstate))
    return arrays, do, (None if dstate is None else dstate.astype(work, copy=False))


# --- backward ------------------------------------------------------------------------------------------
#
# The gradients of L = <dy, y> + Re<dstate, h_{T-1}> (dy: the `do` argument).
#
# Complex parameters. A, B, C and the state may be complex; L is real. The gradient of L with respect to
# a complex w = a + ib is packed as one complex number, dL/dw := dL/da + i dL/db (the numbers PyTorch's
# autograd gives for a real loss: L = |w|^2 gives 2w), so that a step -lr * dL/dw descends, and
# <dL/dw, dw> = Re(sum conj(dL/dw) dw) is L's first-order change. Two rules follow from the chain rule in a and b:
#     v = f(w) holomorphic (a product, exp, phi):   dL/dw = conj(f'(w)) dL/dv
#     y = Re(v):                                    dL/dv = dL/dy (a real number)
# and for a real argument r of a holomorphic v = f(r) (dt, u): dL/dr = Re(conj(f'(r)) dL/dv).
# For real A, B, C every conj is the identity and these are the ordinary gradients. A real argument passed
# next to complex ones gets the real part of its packed gradient (its imaginary part is not a direction).
#
# The recurrence backwards (lambda_t = dL/dh_t, packed):
#     lambda_{T-1} = dstate + dy_{T-1} conj(C),   lambda_t = dy_t conj(C) + conj(A_bar) lambda_{t+1}
#     du_t     = Re(sum_n conj(B_bar) lambda_t) + D dy_t
#     dB_bar   = sum_t u_t lambda_t,        dA_bar = sum_t conj(h_{t-1}) lambda_t
#     dC       = sum_t dy_t conj(h_t),      dD = sum_t dy_t u_t,      dh_{-1} = conj(A_bar) lambda_0
# (sums over the batch too). Then the zero-order hold, z = dt A (`_zoh_backward`):
#     A_bar = e^z:                  dz = conj(A_bar) dA_bar
#     B_bar = dt phi(z) B = (e^z - 1) / A * B, whose derivatives are
#         d B_bar / dB  = dt phi(z)
#         d B_bar / dA  = dt^2 phi'(z) B,   phi'(z) = (e^z - phi(z)) / z = phi(z) - psi(z),
#         d B_bar / ddt = e^z B             (from (e^{dt A} - 1) / A: no division, fine at A = 0)
#     with psi(z) = (e^z - 1 - z) / z^2 = (phi(z) - 1) / z = sum_k z^k / (k + 2)!, psi(0) = 1/2:
#     (e^z - phi) / z cancels for small z, phi - psi does not. psi itself is summed as its series for
#     |z| < 1 (18 terms: the first left out is below 1 / 20! < 1e-18) and as (expm1(z) - z) / z^2 beyond,
#     where expm1 has no cancellation and, for Re(z) <= 0 as here, the subtraction loses little:
#     (|expm1(z)| + |z|) / |expm1(z) - z| stays below 4.5 (checked on |z| in [1, 20], every angle).
#     Chaining z = dt A:  dA = dt dz + ...,   ddt = Re(sum_n conj(A) dz) + ...


def _backward(engine, arguments, initial_state, do, dstate, chunk_size=None):
    """Check, run `engine` (with the chunk size when one is given), and return S4Gradients with each
    gradient in its argument's dtype: the complex working dtype for a complex argument, the real one (and
    the real part of the packed gradient) for a real argument."""
    arrays, do, dstate = _prepare(*arguments, initial_state, cotangents=(do, dstate))
    options = (check_chunk_size(chunk_size, arrays[0].shape[1]),) if engine is _chunked_backward else ()
    grads = engine(*arrays, do, dstate, *options)
    real_dtype = arrays[0].dtype
    out = []
    for given, work, g in zip(arguments + (initial_state,), arrays, grads):
        if g is not None:
            g = g if _is_complex(given) else g.real
            g = g.astype(work.dtype if _is_complex(given) else real_dtype, copy=False)
        out.append(g)
    return SIGNATURE.gradients("s4")(*out)


def recurrent_backward(u, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None):
    """Gradients of L = <do, y> + Re<dstate, h_{T-1}> for `recurrent`, by its loop run backwards
    (`_recurrent_backward`). Returns S4Gradients(du, ddt, dA, dB, dC, dD, dinitial_state), complex ones
    packed as dL/dRe + i dL/dIm; dD None without D, dinitial_state None without an initial state.
    do [B, T, H]; dstate [B, H, N] (complex when the state is) or None."""
    return _backward(_recurrent_backward, (u, dt, A, B, C, D), initial_state, do, dstate)


def chunked_backward(u, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None, chunk_size=64):
    """As `recurrent_backward`, for `chunked`: every chunk at once, the states passed backwards between
    chunks (`_chunked_backward`)."""
    return _backward(_chunked_backward, (u, dt, A, B, C, D), initial_state, do, dstate, chunk_size)


def convolution_backward(u, dt, A, B, C, D=None, *, do, dstate=None, initial_state=None):
    """As `recurrent_backward`, for `convolution`: FFT correlations and power sums (`_convolution_backward`)."""
    return _backward(_convolution_backward, (u, dt, A, B, C, D), initial_state, do, dstate)


def _psi(z):
    """(e^z - 1 - z) / z^2 = sum_{k >= 0} z^k / (k + 2)!, psi(0) = 1/2; accurate for every z (see above)."""
    xp = array_module(z)
    small = xp.abs(z) < 1
    zs = xp.where(small, z, 0)
    series = xp.zeros_like(z) + _PSI_SERIES[-1]
    for coefficient in _PSI_SERIES[-2::-1]:        # Horner: 1/2! + z (1/3! + z (1/4! + ...))
        series = series * zs + coefficient
    zl = xp.where(small, -1, z)                    # a harmless stand-in where the series is used
    return xp.where(small, series, (_expm1(zl) - zl) / (zl * zl))


_PSI_SERIES = tuple(1.0 / math.factorial(k + 2) for k in range(18))   # psi's Taylor coefficients 1 / (k + 2)!


def _zoh_backward(dt, A, B, dz, dB_bar):
    """The discretization's gradients (above): dz [H, N] the packed gradient of L with respect to z = dt A
    through A_bar (and its powers), dB_bar [H, N] through B_bar. Returns (ddt [H], dA [H, N], dB [H, N])."""
    xp = array_module(A)
    z = dt[:, None] * A
    phi = _phi(z)
    dphi = phi - _psi(z)                                               # phi'(z)
    dB = dt[:, None] * xp.conj(phi) * dB_bar
    dA = dt[:, None] * dz + dt[:, None] ** 2 * xp.conj(dphi * B) * dB_bar
    ddt = (xp.conj(A) * dz + xp.conj(xp.exp(z) * B) * dB_bar).sum(-1).real
    return ddt, dA, dB


def _skip_backward(u, dy, D, du):
    """y += D u: du += D dy, dD = sum dy u (None without D)."""
    if D is None:
        return du, None
    return du + D * dy, (dy * u).reshape(-1, u.shape[-1]).sum(0)


def _recurrent_backward(u, dt, A, B, C, D, h0, dy, dstate):
    """The token loop run backwards. Stores every state h_t ([B, T, H, N], recomputed by the forward loop),
    then carries lambda from t = T - 1 down to 0. A, B, C, h0, dstate in the working (possibly complex)
    dtype. Returns (du, ddt, dA, dB, dC, dD, dh0), packed complex where the working dtype is."""
    xp = array_module(u)
    Bsz, T, H = u.shape
    A_bar, B_bar = discretize(dt, A, B)
    h_all = xp.empty((Bsz, T + 1, H, A.shape[1]), A_bar.dtype)        # h_all[:, t + 1] = h_t
    h_all[:, 0] = 0 if h0 is None else h0
    for t in range(T):
        h_all[:, t + 1] = A_bar * h_all[:, t] + B_bar * u[:, t, :, None]
    lam = xp.zeros_like(h_all[:, 0]) if dstate is None else dstate.astype(A_bar.dtype)
    du = xp.empty_like(u)
    dA_bar, dB_bar, dC = xp.zeros_like(A_bar), xp.zeros_like(B_bar), xp.zeros_like(A_bar)
    for t in range(T - 1, -1, -1):
        lam = lam + dy[:, t, :, None] * xp.conj(C)                     # y_t = Re(C . h_t)
        dC += (dy[:, t, :, None] * xp.conj(h_all[:, t + 1])).sum(0)
        du[:, t] = (xp.conj(B_bar) * lam).sum(-1).real
        dB_bar += (u[:, t, :, None] * lam).sum(0)
        dA_bar += (xp.conj(h_all[:, t]) * lam).sum(0)
        lam = xp.conj(A_bar) * lam                                     # reaches h_{t-1} through A_bar
    ddt, dA, dB = _zoh_backward(dt, A, B, xp.conj(A_bar) * dA_bar, dB_bar)
    du, dD = _skip_backward(u, dy, D, du)
    return du, ddt, dA, dB, dC, dD, (None if h0 is None else lam)


def _over_batch_and_chunks(x):
    """[B, H, N_chunks, ...] -> [H, B * N_chunks, ...]: the rows a per-channel sum runs over."""
    x = array_module(x).moveaxis(x, 1, 0)
    return x.reshape(x.shape[0], -1, *x.shape[3:])


def _chunked_backward(u, dt, A, B, C, D, h0, dy, dstate, chunk_size):
    """`chunked` backwards, every chunk at once except the state passing (a loop over chunks, as forward).

    The forward is a few linear maps of u, all built from the powers P_l = A_bar^l = exp(l z), l = 0 .. c:
        y_i   = sum_{j <= i} K_{i-j} u_j + Re(sum_n read[i, n] S_in[n])    K_l = Re(sum_n C B_bar P_l)
                                                                           read[i, n] = C_n P_{i+1}[n]
        S_out = P_L S_in + sum_j to_end[j] u_j                              to_end[j] = P_{c-1-j} B_bar
    (L the chunk's length; the last, shorter chunk is right-aligned for `to_end`, so its u_j ends at c-1).
    Backwards, step by step:
    1. Toeplitz: du = dy Toeplitz (its transpose applied), dK_l = sum_{i - j = l} dy_i u_j.
    2. Read: dread[i, n] = sum dy_i conj(S_in[n]),  dS_in[n] (read part) = sum_i dy_i conj(read[i, n]).
    3. State passing, chunk by chunk from the last, with G = dL/dS_out (dstate for the last chunk):
           dwrites_k = G,   dP_L += conj(S_in) G,   then G <- dS_in(read) + conj(P_L) G;   at the end dh0 = G.
    4. Writes, writes_k = sum_j to_end[j] u_j:
           du_j += Re(sum_n conj(to_end[j, n]) dwrites_k[n]),   dto_end[j] = sum u_j dwrites_k.
    5. Everything onto (C, B_bar, P): with w = C B_bar,
           dw = sum_l dK_l conj(P_l),  dP_l += dK_l conj(w)        (from K)
           dC += sum_i dread[i] conj(P_{i+1}),  dP_{i+1} += dread[i] conj(C)
           dB_bar += sum_j dto_end[j] conj(P_{c-1-j}),  dP_{c-1-j} += dto_end[j] conj(B_bar)
       and P_l = exp(l z): dz = sum_l l conj(P_l) dP_l; then `_zoh_backward`. Every sum runs over the batch
       and the chunks as one matrix product. Returns (du, ddt, dA, dB, dC, dD, dh0)."""
    xp = array_module(u)
    T, c = u.shape[1], chunk_size
    A_bar, B_bar = discretize(dt, A, B)
    dtA = dt[:, None] * A
    uc, dyc = to_chunks(u, c), to_chunks(dy, c)                       # [B, H, N_chunks, c]
    Bsz, H, n_chunks = uc.shape[:3]
    last = T - (n_chunks - 1) * c
    P = xp.moveaxis(xp.exp(_counts(c + 1, dtA)[:, None, None] * dtA), 0, 1)   # P_l: [H, c + 1, N]

    # The forward's pieces, recomputed (as in `chunked`).
    w = C * B_bar
    kernel = (P[:, :c] @ w[:, :, None])[..., 0].real                  # K_l, l < c: [H, c]
    lag = xp.arange(c)[:, None] - xp.arange(c)[None, :]
    toeplitz = xp.where(lag >= 0, kernel[:, xp.maximum(lag, 0)], 0)  # [H, c, c]
    to_end = P[:, c - 1::-1] * B_bar[:, None]                         # P_{c-1-j} B_bar: [H, c, N]
    read = C[:, None] * P[:, 1:]                                      # C P_{i+1}: [H, c, N]
    u_end = uc.copy()
    u_end[:, :, -1] = xp.roll(uc[:, :, -1], c - last, axis=-1)        # the last chunk right-aligned
    writes = u_end.astype(P.dtype) @ to_end[None]                     # [B, H, N_chunks, N]
    decay = xp.broadcast_to(P[:, c, None], (H, n_chunks, P.shape[-1])).copy()
    decay[:, -1] = P[:, last]
    S_in = xp.empty_like(writes)
    S = xp.zeros_like(writes[:, :, 0]) if h0 is None else h0
    for k in range(n_chunks):
        S_in[:, :, k] = S
        S = decay[:, k] * S + writes[:, :, k]

    # 1. Toeplitz.
    du = dyc @ toeplitz[None]
    dtoeplitz = _over_batch_and_chunks(dyc).swapaxes(-1, -2) @ _over_batch_and_chunks(uc)   # [H, c(i), c(j)]
    by_lag = (lag[:, :, None] == xp.arange(c)[None, None, :]).reshape(c * c, c).astype(u.dtype)
    dkernel = dtoeplitz.reshape(H, c * c) @ by_lag                    # dK_l = sum_{i-j=l}: [H, c]
    # 2. Read.
    dread = _over_batch_and_chunks(dyc).swapaxes(-1, -2) @ xp.conj(_over_batch_and_chunks(S_in))  # [H, c, N]
    dS_in_read = dyc.astype(P.dtype) @ xp.conj(read)[None]            # [B, H, N_chunks, N]
    # 3. State passing, backwards.
    G = xp.zeros_like(S) if dstate is None else dstate.astype(P.dtype)
    dwrites, ddecay = xp.empty_like(writes), xp.empty_like(decay)
    for k in range(n_chunks - 1, -1, -1):
        dwrites[:, :, k] = G
        ddecay[:, k] = (xp.conj(S_in[:, :, k]) * G).sum(0)
        G = dS_in_read[:, :, k] + xp.conj(decay[:, k]) * G
    # 4. Writes.
    du_end = (dwrites @ xp.conj(to_end).swapaxes(-1, -2)[None]).real  # [B, H, N_chunks, c]
    du_end[:, :, -1] = xp.roll(du_end[:, :, -1], last - c, axis=-1)   # back to the left-aligned layout
    du = du + du_end
    dto_end = _over_batch_and_chunks(u_end).swapaxes(-1, -2).astype(P.dtype) @ _over_batch_and_chunks(dwrites)
    # 5. Onto C, B_bar and the powers.
    dP = xp.zeros_like(P)
    dw = (dkernel[:, None, :] @ xp.conj(P[:, :c]))[:, 0]              # sum_l dK_l conj(P_l): [H, N]
    dP[:, :c] += dkernel[..., None] * xp.conj(w)[:, None]
    dC = dw * xp.conj(B_bar) + (dread * xp.conj(P[:, 1:])).sum(1)
    dP[:, 1:] += dread * xp.conj(C)[:, None]
    dB_bar = dw * xp.conj(C) + (dto_end * xp.conj(P[:, c - 1::-1])).sum(1)
    dP[:, :c] += dto_end[:, ::-1] * xp.conj(B_bar)[:, None]
    dP[:, c] += ddecay[:, :-1].sum(1)
    dP[:, last] += ddecay[:, -1]
    dz = (_counts(c + 1, dtA)[None, :, None] * xp.conj(P) * dP).sum(1)
    ddt, dA, dB = _zoh_backward(dt, A, B, dz, dB_bar)
    du, dD = _skip_backward(u, dy, D, from_chunks(du[..., None], T)[..., 0])
    return du, ddt, dA, dB, dC, dD, (None if h0 is None else G)


def _convolution_backward(u, dt, A, B, C, D, h0, dy, dstate):
    """`convolution` backwards, O(T log T): the transposes of its FFT products, and the power sums
    again for everything that reaches the parameters.
        y = K * u (+ Re(sum_n C A_bar h0 P_t) + D u),   h_{T-1} = B_bar sum_l P_l u_{T-1-l} + P_T h0
    1. du_j = sum_t dy_t K_{t-j}  (a correlation, by FFT);  dK_l = sum_t dy_t u_{t-l}  (likewise).
    2. K_l = Re(sum_n w_n P_l), w = C B_bar:  dw = conj(sum_l dK_l P_l),  dz += conj(w sum_l l dK_l P_l).
    3. The initial state's read, v = C A_bar h0 per batch row:  dv = conj(sum_t dy_t P_t),
       dz += conj(v sum_t t dy_t P_t),  then v's factors: dC, dh0, and dz += conj(A_bar) (A_bar's part).
    4. The final state, S = sum_l P_l u_{T-1-l}:  dB_bar += conj(S) dstate,  dS = conj(B_bar) dstate,
       du_{T-1-l} += Re(sum_n conj(P_l) dS),  dz += conj(sum_l l u_{T-1-l} P_l) dS;
       P_T h0:  dh0 += conj(P_T) dstate,  dz += T conj(P_T h0) dstate.
    Sums over the batch where the parameter is shared. Returns (du, ddt, dA, dB, dC, dD, dh0)."""
    xp = array_module(u)
    T = u.shape[1]
    A_bar, B_bar = discretize(dt, A, B)
    dtA = dt[:, None] * A
    w = C * B_bar
    kernel = _power_sums(w, dtA, T)                                   # [H, T]
    u_ht, dy_ht = xp.moveaxis(u, 1, 2), xp.moveaxis(dy, 1, 2)         # [B, H, T]
    n_fft = 1 << (2 * T - 1).bit_length()
    dy_f = xp.fft.rfft(dy_ht, n_fft)
    # 1. Correlations: sum_t dy_t x_{t-l} = irfft(rfft(dy) conj(rfft(x)))[l] for 0 <= l < T.
    du = xp.fft.irfft(dy_f * xp.conj(xp.fft.rfft(kernel, n_fft)), n_fft)[..., :T]
    dkernel = xp.fft.irfft(dy_f * xp.conj(xp.fft.rfft(u_ht, n_fft)), n_fft)[..., :T].sum(0)   # [H, T]
    steps = _counts(T, dtA)
    # 2. The kernel's parameters.
    dw = xp.conj(_weighted_power_sums(dkernel[None], dtA)[0])
    dz = xp.conj(w * _weighted_power_sums((steps * dkernel)[None], dtA)[0])
    dC, dB_bar = dw * xp.conj(B_bar), dw * xp.conj(C)
    dh0 = None
    if h0 is not None:
        # 3. The read of the initial state: y_t += Re(sum_n v_n P_t), v = C A_bar h0.
        v = C * A_bar * h0
        dv = xp.conj(_weighted_power_sums(dy_ht, dtA))                # [B, H, N]
        dz = dz + xp.conj(v * _weighted_power_sums(steps * dy_ht, dtA)).sum(0)
        dC = dC + (dv * xp.conj(A_bar * h0)).sum(0)
        dz = dz + (dv * xp.conj(C * A_bar * h0)).sum(0)                # A_bar = e^z: dz = conj(A_bar) dA_bar
        dh0 = dv * xp.conj(C * A_bar)
    if dstate is not None:
        # 4. The final state.
        dstate = dstate.astype(A_bar.dtype)
        reversed_u = u_ht[..., ::-1]
        dB_bar = dB_bar + (xp.conj(_weighted_power_sums(reversed_u, dtA)) * dstate).sum(0)
        dS = xp.conj(B_bar) * dstate                                  # [B, H, N]
        du = du + _power_sums(xp.conj(dS), dtA, T)[..., ::-1]         # Re(sum_n conj(P_l) dS_n) at t = T-1-l
        dz = dz + (xp.conj(_weighted_power_sums(steps * reversed_u, dtA)) * dS).sum(0)
        if h0 is not None:
            P_T = xp.exp(T * dtA)
            dh0 = dh0 + xp.conj(P_T) * dstate
            dz = dz + (T * xp.conj(P_T * h0) * dstate).sum(0)
    ddt, dA, dB = _zoh_backward(dt, A, B, dz, dB_bar)
    du, dD = _skip_backward(u, dy, D, xp.moveaxis(du, 2, 1).astype(u.dtype, copy=False))
    return du, ddt, dA, dB, dC, dD, dh0


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
