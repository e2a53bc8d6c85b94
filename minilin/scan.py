"""The scan of the first-order linear recurrence h_t = a_t h_{t-1} + b_t, three ways.

Every diagonal recurrence in this package (Mamba's selective SSM, HGRN, the per-channel decays of GLA
and RWKV read one channel at a time) is, element by element, the recurrence

    h_t = a_t * h_{t-1} + b_t,        t = 0 .. T-1,   h_{-1} = initial (zeros when None)

and its outputs h_0 .. h_{T-1} are a *scan* (a prefix "sum") under the operator that composes two
steps. Step t is the affine map h -> a_t h + b_t; doing (a1, b1) first and then (a2, b2) is

    (a1, b1) . (a2, b2) = (a2 a1, a2 b1 + b2)                                     (`combine`)

which is associative, though not commutative. Associativity is all a parallel scan needs: the T steps
can be grouped in any order, so a log-depth tree replaces the T-step loop (Blelloch 1990, "Prefix Sums
and Their Applications"; for this recurrence in particular, Martin & Cundy 2018, "Parallelizing Linear
Recurrent Neural Nets Over Sequence Length", and Mamba's hardware-aware scan, Gu & Dao 2023).

The three ways, all computing the same h:
- `sequential_scan`: the loop, T steps. The definition, and the test reference.
- `associative_scan`: log depth, O(T) work (Blelloch's up-sweep / down-sweep, written recursively):
  combine neighbours pairwise (T/2 combines, all at once), scan the half-length sequence of pairs
  (recursion), then fill in the even positions from the odd ones (T/2 combines). Depth 2 log2(T).
- `chunked_scan`: two levels, the way a GPU scans a sequence longer than one thread block: scan every
  chunk of C steps from zero (all chunks at once), run the short sequential scan over the N = T / C
  chunk ends, then add each chunk's incoming state, decayed by the running product of a.

The gradient (`adjoint_scan`, `scan_backward`): the adjoint of the recurrence is the same kind of
recurrence run backwards in time, lambda_t = dh_t + a_{t+1} lambda_{t+1}, so any of the three scans
computes it on the time-reversed sequence.

Shapes: a and b are arrays of one shape [..., T, ...], the scanned axis given by `axis` (default 1,
the T of minilin's sequence-first [B, T, ...] tensors); every other axis is independent and handled
in the same vectorized call. initial: a's shape without the scanned axis. Returns h, b's shape.
The same code runs on NumPy and CuPy arrays (`backend.array_module`).

Numerics: no exponentials here. The callers pass a = exp(g) with g <= 0, so every product of a's lies
in [0, 1] and can underflow to 0 but never overflow.
"""
from __future__ import annotations

import numbers

from .backend import array_module
from .validation import Shapes, check_array, check_chunk_size, common_dtype


def combine(first, second):
    """Compose two steps, `first` applied first: (a1, b1) . (a2, b2) = (a2 a1, a2 b1 + b2).

    first, second: (a, b) pairs of arrays of one shape (broadcastable). The scan's operator, kept
    here as the one place the algebra is written; the vectorized scans below inline it.
    """
    (a1, b1), (a2, b2) = first, second
    return a2 * a1, a2 * b1 + b2


def sequential_scan(a, b, *, axis=1, initial=None):
    """The loop (the definition): h_t = a_t h_{t-1} + b_t along `axis`. Returns h, b's shape."""
    xp, a, b, initial, axis = _prepare(a, b, initial, axis)
    h = _sequential_first_axis(xp.moveaxis(a, axis, 0), xp.moveaxis(b, axis, 0), initial)
    return xp.moveaxis(h, 0, axis)


def associative_scan(a, b, *, axis=1, initial=None):
    """Log-depth parallel scan of h_t = a_t h_{t-1} + b_t along `axis`; any T >= 1. Returns h."""
    xp, a, b, initial, axis = _prepare(a, b, initial, axis)
    h = _associative_first_axis(xp.moveaxis(a, axis, 0), xp.moveaxis(b, axis, 0), initial)
    return xp.moveaxis(h, 0, axis)


def chunked_scan(a, b, *, axis=1, initial=None, chunk_size=64):
    """Two-level scan: chunks of `chunk_size` steps scanned in parallel, then chained. Returns h.

    Inside chunk n, with h_in the state entering it, A_i = a_i a_{i-1} ... a_0 (the chunk-local
    running product) and l_i the chunk's own scan started from zero,
        h_i = l_i + A_i h_in                       (unrolling the recurrence over the chunk)
    and the chunk ends chain as h_in(n+1) = A_last(n) h_in(n) + l_last(n): the same recurrence, N steps.
    """
    chunk_size = check_chunk_size(chunk_size)
    xp, a, b, initial, axis = _prepare(a, b, initial, axis)
    a, b = xp.moveaxis(a, axis, 0), xp.moveaxis(b, axis, 0)
    T, rest = a.shape[0], a.shape[1:]
    N = -(-T // chunk_size)
    pad = N * chunk_size - T
    if pad:  # padding with the identity step (a = 1, b = 0) leaves every h, and the chunk ends, unchanged
        a = xp.concatenate([a, xp.ones((pad, *rest), a.dtype)])
        b = xp.concatenate([b, xp.zeros((pad, *rest), b.dtype)])
    a, b = a.reshape(N, chunk_size, *rest), b.reshape(N, chunk_size, *rest)

    local = _associative_first_axis(xp.moveaxis(a, 1, 0), xp.moveaxis(b, 1, 0), None)  # [C, N, ...]
    running = xp.cumprod(a, axis=1)                                                       # [N, C, ...]
    ends = _sequential_first_axis(running[:, -1], local[-1], initial)                     # [N, ...]
    first = xp.zeros(rest, b.dtype) if initial is None else initial
    h_in = xp.concatenate([first[None], ends[:-1]])                                       # [N, ...]
    h = xp.moveaxis(local, 0, 1) + running * h_in[:, None]
    return xp.moveaxis(h.reshape(N * chunk_size, *rest)[:T], 0, axis)


# --- the scans along axis 0, inputs already checked ----------------------------------------------


def _sequential_first_axis(a, b, initial):
    xp = array_module(a, b)
    h = xp.empty_like(b)
    state = initial
    for t in range(a.shape[0]):
        state = b[t] if state is None else a[t] * state + b[t]
        h[t] = state
    return h


def _associative_first_axis(a, b, initial):
    """h along axis 0. The initial state is folded into the first step: b_0 <- a_0 h_{-1} + b_0."""
    if initial is not None:
        b = b.copy()
        b[0] = a[0] * initial + b[0]
    return _blelloch(a, b)


def _blelloch(a, b):
    """Inclusive scan along axis 0 by recursive pairing; returns h (the b-part of each prefix).

    Up-sweep: pair i = steps (2i, 2i+1) combined, for the T // 2 complete pairs. Its scan, computed
    recursively, is the prefix ending at every odd position 1, 3, 5, ...
    Down-sweep: the prefix ending at an even position 2i (i >= 1) is the one ending at 2i - 1 followed
    by step 2i; position 0 is step 0 alone.
    """
    xp = array_module(a, b)
    T = a.shape[0]
    if T == 1:
        return b
    pairs = T // 2
    a_even, b_even = a[0:2 * pairs:2], b[0:2 * pairs:2]
    a_odd, b_odd = a[1:2 * pairs:2], b[1:2 * pairs:2]
    # combine((a_even, b_even), (a_odd, b_odd)), inlined:
    h_odd = _blelloch(a_odd * a_even, a_odd * b_even + b_odd)   # prefixes ending at 1, 3, 5, ...
    h = xp.empty_like(b)
    h[1::2] = h_odd
    h[0] = b[0]
    later_even = (T - 1) // 2                                    # positions 2, 4, ... <= T - 1
    h[2::2] = a[2::2] * h_odd[:later_even] + b[2::2]
    return h


# --- checks ---------------------------------------------------------------------------------------


def _prepare(a, b, initial, axis, names=("a", "b", "initial")):
    """Check a, b (same shape, float, finite), axis and initial; cast to one dtype. names: what the caller calls
    the three (the adjoint's are a, dh and dfinal)."""
    xp = array_module(a, b, initial)
    ndim = getattr(a, "ndim", None)
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis: expected an integer, got {axis!r}")
    if ndim is not None and not -ndim <= axis < ndim:
        raise ValueError(f"axis: expected an axis of a (ndim {ndim}), got {axis}")
    axis = int(axis) % ndim if ndim else 0
    letters = " ".join("T" if i == axis else f"n{i}" for i in range(ndim or 1))
    shapes = Shapes()
    check_array(names[0], a, letters, shapes, xp)
    check_array(names[1], b, letters, shapes, xp)
    if shapes["T"] < 1:
        raise ValueError(f"{names[0]}: expected at least one step (T >= 1) along the scanned axis, got T = 0")
    if initial is not None:
        check_array(names[2], initial, " ".join(d for d in letters.split() if d != "T"), shapes, xp)
    dtype = common_dtype(xp, a, b, initial)
    cast = (x if x is None else x.astype(dtype, copy=False) for x in (a, b, initial))
    return (xp, *cast, axis)


# --- the scan's gradient --------------------------------------------------------------------------------


SCANS = {"sequential": sequential_scan, "associative": associative_scan, "chunked": chunked_scan}


def adjoint_scan(a, dh, *, axis=1, dfinal=None, method="associative", chunk_size=64):
    """The adjoint of h_t = a_t h_{t-1} + b_t: lambda_t = dL/dh_t, counting every later use of h_t,
    given dh_t (h_t's direct cotangent) and dfinal (the final state's, None = zeros):

        lambda_{T-1} = dh_{T-1} + dfinal
        lambda_t     = dh_t + a_{t+1} lambda_{t+1}          (h_t reaches h_{t+1} through a_{t+1})

    itself a first-order linear recurrence, run backwards in time. Reversing the time axis, with
    s = T - 1 - t, turns it into a forward one, mu_s = a'_s mu_{s-1} + dh'_s with a'_s = a_{T-s} (a'_0 = 1,
    the step that brings in dfinal), so any of the three scans above computes it (`method`: "sequential",
    "associative" or "chunked" with `chunk_size`). a, dh: [..., T, ...] along `axis`; dfinal: a's shape
    without the axis. Returns lambda, dh's shape.
    """
    if method not in SCANS:
        raise ValueError(f"method: expected one of {sorted(SCANS)}, got {method!r}")
    xp, a, dh, dfinal, axis = _prepare(a, dh, dfinal, axis, names=("a", "dh", "dfinal"))
    a_next = xp.concatenate([xp.moveaxis(a, axis, 0)[1:], xp.ones_like(xp.moveaxis(a, axis, 0)[:1])])
    reverse = (slice(None, None, -1),)
    kwargs = {"chunk_size": chunk_size} if method == "chunked" else {}
    mu = SCANS[method](a_next[reverse], xp.moveaxis(dh, axis, 0)[reverse], axis=0, initial=dfinal, **kwargs)
    return xp.moveaxis(mu[reverse], 0, axis)


def scan_backward(a, b, dh, *, axis=1, initial=None, dfinal=None, h=None, method="associative", chunk_size=64):
    """Gradients of L = <dh, h> + <dfinal, h_{T-1}> for h = scan(a, b, initial), by the adjoint scan:

        lambda = adjoint_scan(a, dh, dfinal)            lambda_t = dL/dh_t
        db_t = lambda_t                                 b_t enters h_t with coefficient 1
        da_t = lambda_t h_{t-1}                         h_{-1} = initial (zeros when None)
        dinitial = a_0 lambda_0                         None when initial is None

    h: the forward's states when the caller has them (else recomputed with `method`). Shapes as the scans;
    returns (da, db, dinitial)."""
    if method not in SCANS:
        raise ValueError(f"method: expected one of {sorted(SCANS)}, got {method!r}")
    xp = array_module(a, b, dh)
    if h is not None:  # b is read only here then (without h, the scan below checks a, b and initial itself)
        b = _prepare(a, b, initial, axis)[2]
        if getattr(h, "shape", None) != b.shape:  # it would broadcast into wrong gradients
            raise ValueError(f"h: expected the forward's states, of b's shape {list(b.shape)}, got "
                             f"{list(getattr(h, 'shape', [type(h).__name__]))}")
    else:
        kwargs = {"chunk_size": chunk_size} if method == "chunked" else {}
        h = SCANS[method](a, b, axis=axis, initial=initial, **kwargs)
    lam = adjoint_scan(a, dh, axis=axis, dfinal=dfinal, method=method, chunk_size=chunk_size)
    h = xp.moveaxis(h, axis, 0)
    first = xp.zeros_like(h[:1]) if initial is None else initial[None].astype(h.dtype, copy=False)
    h_before = xp.moveaxis(xp.concatenate([first, h[:-1]]), 0, axis)
    da = lam * h_before
    dinitial = None if initial is None else xp.take(a, 0, axis=axis) * xp.take(lam, 0, axis=axis)
    return da, lam, dinitial
