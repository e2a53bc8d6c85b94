"""The checking helpers every exercise test uses, written once.

A check runs the learner's function and minilin's reference on the same fresh, seeded random inputs and
compares them with `assert_close`. When they differ the failure says how, in this order:
1. the wrong kind of thing (None, a tuple, a list) or the wrong shape or dtype, in plain words;
2. otherwise the worst element, with its index named by axis (b, t, h, v), expected and got, the max
   absolute and the relative error, and for sequences the first time step that differs;
3. then a likely cause, where one is found: every value a constant multiple of the expected one (a scale
   missing, doubled or wrong, named as `scale` or `K ** -0.5` where it matches), the sequence shifted by
   one token, or all zeros.
NaN never passes.

`check_form` does that for a learner's sequence form and adds what only calling it again can tell: a leak
from the future (outputs that move when only later inputs change) and a read of the state before (or after)
the token's own write. `assert_no_token_loop` fails a chunked or parallel form whose Python work grows with
the tokens instead of the chunks (it counts the lines of the learner's file that run). Arguments changed in
place and calls into minilin's own code are caught around every call by minilin/course/guard.py.

`check_gradients` does it for the gradients a learner's backward pass returns: each against minilin's
backward, then against central finite differences of the loss they are the gradients of (one random
direction per input, `directional_derivative`), so that a failure says which input's gradient is wrong, the
first and the last time step that differ (a backward pass runs from the last token to the first), and a
likely cause: a constant factor, a sign, a one-step shift, a per-token factor such as exp(g_t), another
input's gradient in its place; with the finite differences' verdict beside minilin's.

Failures raise `CheckFailure` (an AssertionError), so pytest and `minilin check` both report them.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import itertools
import numbers
import subprocess
import sys

import numpy as np

from ..backend import to_numpy

# The shapes most sequence checks run over: T not a multiple of the chunk, K != V, B, H > 1 first (where a
# wrong answer shows the most: which step, which chunk, a shift, a leak), then T = 1, then T = 64 with K = V.
SEQUENCE_CASES = (
    dict(B=2, T=37, H=3, K=8, V=5),
    dict(B=1, T=1, H=1, K=4, V=3),
    dict(B=1, T=64, H=2, K=16, V=16),
)

RTOL = {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-4}


class CheckFailure(AssertionError):
    """A check found a difference; the message explains it."""


def fail(message: str):
    __tracebackhide__ = True
    raise CheckFailure(message)


def without_overflow(name: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) with NumPy's overflow, division by zero and invalid operations raised, not warned: for the
    checks whose inputs are extreme on purpose (exp of 800, A = 0 exactly), where code that computes a branch
    np.where then discards still gets the right numbers, with a RuntimeWarning the learner may not read."""
    __tracebackhide__ = True
    try:
        with np.errstate(over="raise", divide="raise", invalid="raise"):
            return fn(*args, **kwargs)
    except FloatingPointError as error:
        fail(f"{name}: NumPy reported {error} (np.where computes both branches before it picks one: give exp only "
             f"numbers <= 0 and never divide by 0, on the branch that is discarded too)")


def label(case: dict, **extra) -> str:
    """'B=2 T=37 H=3 K=8 V=5, chunk_size=16': the case a result belongs to, for messages."""
    text = " ".join(f"{k}={v}" for k, v in case.items())
    more = ", ".join(f"{k}={v}" for k, v in extra.items())
    return f"{text}, {more}" if text and more else text or more


def _describe(x) -> str:
    if x is None:
        return "None (did the function forget to `return`?)"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} items"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array of shape {list(x.shape)} ({x.dtype})"
    return f"{type(x).__name__} {x!r}"[:120]


def _shape_text(shape, dims) -> str:
    if dims and len(dims.split()) == len(shape):
        return f"[{', '.join(dims.split())}] = {list(shape)}"
    return str(list(shape))


def _index_text(index, dims) -> str:
    letters = dims.split() if dims else []
    if len(letters) == len(index):
        return "(" + ", ".join(f"{d.lower()}={i}" for d, i in zip(letters, index)) + ")"
    return str(tuple(int(i) for i in index))


def unpack(name: str, result, count: int, what: str):
    """Check that a function returned a tuple of `count` items (`what` names them) and return it."""
    __tracebackhide__ = True
    if not isinstance(result, (tuple, list)) or len(result) != count:
        fail(f"{name}: expected a tuple {what} of {count} items, got {_describe(result)}")
    return tuple(result)


def assert_equal(name: str, got, expected):
    """Exact comparison, for counts and other integers."""
    __tracebackhide__ = True
    if isinstance(got, bool) or not isinstance(got, type(expected)) and not (
            isinstance(expected, numbers.Integral) and isinstance(got, numbers.Integral)):
        fail(f"{name}: expected {type(expected).__name__} {expected!r}, got {_describe(got)}")
    if got != expected:
        fail(f"{name}: expected {expected!r}, got {got!r}")


def assert_close(name: str, got, expected, *, dims: str | None = None, rtol: float | None = None,
                 atol: float = 0.0, chunk_size: int | None = None, scales: dict | None = None,
                 kind: str = "output", factors: dict | None = None):
    """Compare `got` with the reference `expected` (NumPy or CuPy arrays, or real numbers).

    Passes when max |got - expected| <= rtol * max |expected| + atol (rtol: 1e-8 in float64, 1e-4 in
    float32; atol: 0 unless the check says otherwise, for a quantity that is zero up to rounding), with the
    same shape and dtype and no NaN or inf where the reference is finite.
    dims: axis letters such as "B T H V", used to name the worst index and to find the time axis T.
    chunk_size: when given, the first differing time step is also located as (chunk, position).
    scales: named factors such as {"scale": 0.3, "K ** -0.5": 0.354}: a constant ratio between got and
    expected is then named in their terms ("= 1 / scale").

    Values that differ are also looked at for two common causes, named in the message when found: got is a
    constant multiple of expected (a missing, doubled or wrong scale; a wrong sign), or got is expected
    shifted by one step along T (o_t holding o_{t-1}: a read before the write, or the other way round).
    kind="gradient" words those causes for the gradient of a backward pass, and names the last time step
    that differs as well as the first (a backward pass runs from the last token to the first).
    factors: named arrays that broadcast against the leading axes of got, such as {"exp(g_t)": exp(g)}
    [B, T, H]: got equal to expected times one of them (or divided by it), entry by entry, is named
    (a decay applied once too often, or missing).
    """
    __tracebackhide__ = True
    expected = np.asarray(to_numpy(expected))
    if expected.ndim == 0 and isinstance(got, numbers.Real) and not isinstance(got, bool):
        got = np.asarray(got, dtype=expected.dtype)  # a Python or NumPy scalar is fine for a scalar
    if not (hasattr(got, "shape") and hasattr(got, "dtype")):
        fail(f"{name}: expected an array of shape {_shape_text(expected.shape, dims)}, got {_describe(got)}")
    got = np.asarray(to_numpy(got))
    if got.shape != expected.shape:
        message = f"{name}: wrong shape: expected {_shape_text(expected.shape, dims)}, got {list(got.shape)}"
        if got.ndim != expected.ndim:
            message += f"\n  ({got.ndim} axes instead of {expected.ndim})"
        elif sorted(got.shape) == sorted(expected.shape):
            message += "\n  (the same sizes in another order: check the order of the axes"
            message += f", {dims.replace(' ', ', ')})" if dims else ")"
        fail(message)
    if got.dtype != expected.dtype:
        fail(f"{name}: dtype {got.dtype}, expected {expected.dtype}: the check passes {expected.dtype} inputs, "
             f"keep the computation in {expected.dtype} (something converted it)")
    if expected.size == 0:
        return
    if rtol is None:
        rtol = RTOL.get(expected.dtype, 1e-8)
    exp64, got64 = expected.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(got64 - exp64)
        scale = float(np.max(np.abs(exp64[np.isfinite(exp64)]), initial=0.0))
        allowed = rtol * scale + atol if scale > 0 or atol > 0 else rtol
        same_nonfinite = (got64 == exp64) | (np.isnan(got64) & np.isnan(exp64))
        bad = ~((diff <= allowed) | same_nonfinite)
    if not bad.any():
        return
    lines = []
    nonfinite = bad & ~np.isfinite(got64)
    if nonfinite.any():
        first = tuple(np.argwhere(nonfinite)[0])
        lines.append(f"{name}: got {got64[first]} at {_index_text(first, dims)} where {exp64[first]:.6g} was "
                     f"expected ({int(nonfinite.sum())} non-finite values; NaN never passes)")
    else:
        worst = np.unravel_index(int(np.argmax(np.where(bad, diff, -1))), diff.shape)
        lines.append(f"{name}: values differ")
        lines.append(f"  worst at {_index_text(worst, dims)}: expected {exp64[worst]:.9g}, got {got64[worst]:.9g}")
        norm = float(np.linalg.norm(exp64))
        relative = float(np.linalg.norm(got64 - exp64)) / norm if norm > 0 else float("inf")
        lines.append(f"  max abs error {float(diff[bad].max()):.2e}, allowed {allowed:.1e} "
                     f"({rtol:.0e} x max|expected| {scale:.3g}{f' + {atol:.0e}' if atol else ''}); relative error "
                     f"||got - expected|| / ||expected|| = {relative:.2e}")
        wrong = int(bad.sum())
        lines.append(f"  {wrong} of {bad.size} values wrong")
    letters = dims.split() if dims else []
    first = None
    if "T" in letters and len(letters) == got.ndim and got.shape[letters.index("T")] > 1:
        axis = letters.index("T")
        per_step = bad.any(axis=tuple(a for a in range(bad.ndim) if a != axis))
        t = first = int(np.argmax(per_step))
        where = f" (chunk {t // chunk_size}, position {t % chunk_size} with chunk_size={chunk_size})" if chunk_size else ""
        before = "" if t == 0 else ("; t=0 matches" if t == 1 else f"; t=0..{t - 1} match")
        lines.append(f"  first time step that differs: t={t}{where}{before}")
        if kind == "gradient" and per_step.sum() > 1:
            last = int(len(per_step) - 1 - np.argmax(per_step[::-1]))
            T = len(per_step)
            after = "" if last == T - 1 else (f"; t={T - 1} matches" if last == T - 2 else f"; t={last + 1}..{T - 1} match")
            lines.append(f"  last time step that differs: t={last}{after} (a backward pass runs from t=T-1 down "
                         "to 0: a mistake made at step t shows at t and at the steps before it)")
    if not nonfinite.any():
        causes = _causes(got64, exp64, letters, rtol, scales, kind)
        lines += [f"  likely cause: {cause}" for cause in causes or _factor_causes(got64, exp64, factors, rtol)]
    failure = CheckFailure("\n".join(lines))
    failure.first_step = first
    raise failure


def _proportional(got, expected, rtol):
    """c when got = c * expected to within rtol (expected not all zero), else None."""
    energy = float(np.sum(expected * expected))
    if energy == 0.0:
        return None
    c = float(np.sum(got * expected)) / energy
    residual = float(np.linalg.norm(got - c * expected))
    return c if residual <= max(rtol, 1e-12) * 10 * np.sqrt(energy) else None


def _name_ratio(c: float, scales: dict | None) -> str:
    """'(= 1 / scale)' when c matches a simple expression of the named factors, else ''."""
    candidates = {}
    for name, value in (scales or {}).items():
        if value:
            candidates.update({name: value, f"1 / {name}": 1 / value, f"{name} ** 2": value ** 2,
                               f"1 / {name} ** 2": value ** -2})
    for (n1, v1), (n2, v2) in itertools.permutations((scales or {}).items(), 2):
        if v1 and v2:
            candidates[f"{n1} / {n2}"] = v1 / v2
    for name, value in candidates.items():
        if abs(c - value) <= 1e-6 * abs(value):
            return f" (= {name})"
    return ""


def _factor_causes(got, expected, factors, rtol) -> list:
    """'got = expected * name' (or / name) for a named array of factors broadcast over the trailing axes."""
    for name, factor in (factors or {}).items():
        f = np.asarray(to_numpy(factor), dtype=np.float64)
        if f.ndim > got.ndim or f.shape != got.shape[:f.ndim]:
            continue
        f = f.reshape(f.shape + (1,) * (got.ndim - f.ndim))
        size = max(float(np.max(np.abs(expected), initial=0.0)), 1e-300)
        with np.errstate(all="ignore"):
            for how, value in (("times", expected * f), ("divided by", expected / f)):
                if np.all(np.isfinite(value)) and np.max(np.abs(got - value)) <= 1e3 * rtol * max(
                        size, float(np.max(np.abs(value), initial=0.0))):
                    return [f"every value is the expected one {how} {name}, token by token: that factor "
                            + ("applied once too often, or one step early?" if how == "times" else
                               "missing, or applied one step late?")]
    return []


def _causes(got, expected, letters, rtol, scales, kind="output") -> list:
    causes = []
    c = _proportional(got, expected, rtol)
    if c is not None and abs(c - 1) > rtol and kind == "gradient":
        if abs(c) <= 1e-12:
            causes.append("every value is 0 where the expected ones are not: a gradient never accumulated, or "
                          "a contribution assigned where it should be added?")
        elif abs(c + 1) <= 1e-6:
            causes.append("every value has the wrong sign (got = -expected): a sign of the chain rule, or a "
                          "subtraction the wrong way round")
        else:
            causes.append(f"every value is {c:.6g} times the expected one{_name_ratio(c, scales)}: a constant factor "
                          "of the chain rule missing, applied twice, or the wrong one (the scale on q?)")
        return causes
    if c is not None and abs(c - 1) > rtol:
        if abs(c) <= 1e-12:
            causes.append("every value is 0 where the expected ones are not: an output never written, or a read "
                          "of a state before anything was written to it?")
        elif abs(c + 1) <= 1e-6:
            causes.append("every value has the wrong sign (got = -expected): a sign, or a subtraction the wrong way round")
        else:
            causes.append(f"every value is {c:.6g} times the expected one{_name_ratio(c, scales)}: a constant ratio, "
                          "so a scale factor is missing, applied twice, or the wrong one (the caller's `scale`?)")
        return causes
    if "T" in letters and len(letters) == got.ndim and got.shape[letters.index("T")] >= 3:
        axis = letters.index("T")
        late = np.take(got, range(1, got.shape[axis]), axis), np.take(expected, range(got.shape[axis] - 1), axis)
        early = np.take(got, range(got.shape[axis] - 1), axis), np.take(expected, range(1, got.shape[axis]), axis)
        if kind == "gradient":
            hows = ("late: the gradient at t is the one expected at t - 1 (stored at index t + 1, or made from "
                    "token t - 1's inputs and adjoint?)",
                    "early: the gradient at t is the one expected at t + 1 (stored at index t - 1, or made from "
                    "token t + 1's inputs and adjoint?)")
        else:
            hows = ("late: the value at t is the one expected at t - 1 (reading before the write of token t, or "
                    "an index t - 1?)",
                    "early: the value at t is the one expected at t + 1 (a write of the next token before the "
                    "read, or an index t + 1?)")
        for (g, e), how in ((late, hows[0]), (early, hows[1])):
            if np.max(np.abs(g - e), initial=0.0) <= 1e3 * rtol * max(float(np.max(np.abs(e), initial=0.0)), 1e-300):
                causes.append(f"shifted by one token, {how}")
    return causes


def causality_probe(function, args: tuple, kwargs: dict, output, T: int, *, pick=lambda result: result,
                    at=None, seed: int = 0):
    """Whether output[:, :t0 + 1] changes when only the per-token inputs after t0 change: a leak from the
    future. The per-token inputs are the array arguments of shape [B, T, ...] (three axes or more); they are
    scaled by random factors in [0.5, 1.5] (signs, and so gates <= 0, are kept) after t0 = `at` (default the
    middle). Returns a sentence naming the leak, or None (no leak, or the call failed).
    `output`: the output [B, T, ...] of the unchanged call; `pick`: takes it from the function's result."""
    t0 = (T // 2 - 1) if at is None else at
    if T < 2 or not 0 <= t0 < T - 1:
        return None
    rng = np.random.default_rng(seed)
    changed = []
    for x in args:
        if hasattr(x, "ndim") and x.ndim >= 3 and x.shape[1] == T and np.asarray(x).dtype.kind == "f":
            y = np.array(x, copy=True)
            y[:, t0 + 1:] *= rng.uniform(0.5, 1.5, y[:, t0 + 1:].shape)
            changed.append(y)
        else:
            changed.append(x)
    try:
        with np.errstate(all="ignore"):
            again = np.asarray(to_numpy(pick(function(*changed, **kwargs))))
    except Exception:
        return None
    before, after = np.asarray(to_numpy(output))[:, :t0 + 1], again[:, :t0 + 1]
    if before.shape != after.shape:
        return None
    size = float(np.max(np.abs(before), initial=0.0))
    moved = np.abs(after.astype(np.float64) - before.astype(np.float64)) > 1e-9 * max(size, 1e-300)
    if not moved.any():
        return None
    steps = moved.any(axis=tuple(a for a in range(moved.ndim) if a != 1))
    t = int(np.argmax(steps))
    return (f"the output reads the future: o at t={t} changed when only the inputs after t={t0} changed "
            f"(a causal form lets token i see tokens j <= i only: the mask, or a slice that reaches past i?)")


def _keywords_text(kwargs: dict) -> str:
    shown = [f"{key}={value}" for key, value in kwargs.items() if not hasattr(value, "shape")]
    hidden = [key for key, value in kwargs.items() if hasattr(value, "shape")]
    return "(" + ", ".join(shown + [f"{key}=..." for key in hidden]) + ")" if kwargs else ""


def check_form(name: str, function, args: tuple, expected, *, kwargs: dict | None = None, where: str = "",
               outputs=("o", "final state"), dims=("B T H V", "B H K V"), chunk_size: int | None = None,
               scales: dict | None = None, reference=None, read: int = 0, causal: bool = True):
    """Call a learner's sequence form, `function(*args, **kwargs)`, and compare its result with `expected`
    (one array, or a tuple with one item per name in `outputs`, of the axes in `dims`).

    On top of assert_close's account of a difference (a constant ratio, a one-token shift), an output whose
    axes start with B T that differs is probed for a leak from the future (causality_probe: the inputs after
    the first wrong step are changed, and the outputs up to it must not move), and the message names it.
    `scales` defaults to {"scale": the scale passed, "K ** -0.5": the default scale of q [B, T, H, K]}, so
    that a constant ratio is named in their terms. `reference(*args, **kwargs)`, when given, computes the
    expected result from the same arguments: the output that differs is then compared with it on the
    per-token inputs other than args[read] (the query) delayed by one token, and advanced by one, which is
    what a read of the state before the token's own write (o_t = S_{t-1}^T q_t), or after the next token's,
    gives. causal=False turns the probe for a leak off, for results that may depend on later tokens (the
    gradients of a backward pass: dq_t depends on every do_s with s >= t). Returns the function's result.
    """
    __tracebackhide__ = True
    kwargs = dict(kwargs or {})
    if scales is None:
        scales = {}
        if isinstance(kwargs.get("scale"), numbers.Real):
            scales["scale"] = float(kwargs["scale"])
        if args and getattr(args[0], "ndim", 0) == 4:
            scales["K ** -0.5"] = args[0].shape[-1] ** -0.5
    call = f"{name}{_keywords_text(kwargs)}"
    result = function(*args, **kwargs)
    several = isinstance(outputs, (tuple, list)) and len(outputs) > 1
    outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    parts = unpack(f"{name}(...)", result, len(outputs), f"({', '.join(outputs)})") if several else (result,)
    wanted = tuple(expected) if several else (expected,)
    for i, (what, got, want, letters) in enumerate(zip(outputs, parts, wanted, dims)):
        try:
            assert_close(f"{call}: {what} {where}".rstrip(), got, want, dims=letters, chunk_size=chunk_size,
                         scales=scales)
        except CheckFailure as failure:
            if causal and letters and letters.split()[:2] == ["B", "T"] and hasattr(got, "shape") and got.ndim >= 2:
                T = got.shape[1]
                first = getattr(failure, "first_step", None)
                leak = causality_probe(function, args, kwargs, got, T, at=first if first is not None and
                                       first < T - 1 else None, pick=(lambda r, i=i: r[i]) if several else (lambda r: r))
                if leak:
                    raise CheckFailure(f"{failure}\n  likely cause: {leak}") from None
                if reference is not None and i == 0 and "likely cause" not in str(failure):
                    shift = _shifted_read(reference, args, kwargs, read, got, T, several)
                    if shift:
                        raise CheckFailure(f"{failure}\n  likely cause: {shift}") from None
            raise
    return result


def _shifted_read(reference, args, kwargs, read, got, T, several):
    """'reads the state before ...' when got is the reference with the per-token inputs other than
    args[read] delayed (or advanced) by one token; else None."""
    if T < 2:
        return None
    got = np.asarray(to_numpy(got)).astype(np.float64)
    for how, move in (("before", 1), ("after", -1)):
        moved = []
        for i, x in enumerate(args):
            if i != read and hasattr(x, "ndim") and x.ndim >= 3 and x.shape[1] == T:
                x = np.asarray(x)
                pad = np.zeros_like(x[:, :1])
                x = np.concatenate([pad, x[:, :-1]], axis=1) if move > 0 else np.concatenate([x[:, 1:], pad], axis=1)
            moved.append(x)
        try:
            with np.errstate(all="ignore"):
                hypothesis = reference(*moved, **kwargs)
        except Exception:
            continue
        hypothesis = np.asarray(to_numpy(hypothesis[0] if several else hypothesis)).astype(np.float64)
        if hypothesis.shape == got.shape and np.max(np.abs(got - hypothesis), initial=0.0) <= \
                1e-6 * max(float(np.max(np.abs(hypothesis), initial=0.0)), 1e-300):
            if move > 0:
                return ("shifted by one token: each output reads the state before its own token is written "
                        "(o_t = S_{t-1}^T q_t); write token t into the state first, then read it with q_t")
            return ("shifted by one token: each output reads the state after the next token is written "
                    "(o_t = S_{t+1}^T q_t); read right after token t's own write")
    return None


def directional_derivative(loss, inputs: tuple, index: int, direction, step: float | None = None,
                           with_rounding: bool = False):
    """Central finite difference of the scalar loss(*inputs) along `direction` in input number `index`:
        (L(x + h d) - L(x - h d)) / 2h = <dL/dx, d> + O(h^2).
    h defaults to 1e-6 * max(1, max |x|) / max |d|: small enough for the O(h^2) term to vanish in float64,
    large enough for rounding (about 1e-16 |L| / h) to stay far below the checks' tolerance.
    with_rounding=True returns (the derivative, a bound on its rounding error, 1e-13 (|L+| + |L-|) / 2h):
    a gradient much smaller than that bound is beyond what finite differences can resolve."""
    x = np.asarray(inputs[index], dtype=np.float64)
    d = np.asarray(direction, dtype=np.float64)
    if step is None:
        step = 1e-6 * max(1.0, float(np.max(np.abs(x), initial=0.0))) / max(float(np.max(np.abs(d), initial=0.0)), 1e-300)

    def at(sign):
        moved = list(inputs)
        moved[index] = x + sign * step * d
        with np.errstate(all="ignore"):
            return float(loss(*moved))

    plus, minus = at(+1), at(-1)
    derivative = (plus - minus) / (2 * step)
    return (derivative, 1e-13 * (abs(plus) + abs(minus)) / (2 * step)) if with_rounding else derivative


FD_RTOL = 1e-6   # finite differences against <gradient, direction>, relative to sum |gradient * direction|


def _fd_verdict(loss, inputs, index, got, expected, label_, direction):
    """(agrees, sentence): whether <got, d> matches the finite difference along d; the sentence gives both
    (and minilin's <expected, d>, when given)."""
    fd, rounding = directional_derivative(loss, inputs, index, direction, with_rounding=True)
    got64 = np.asarray(to_numpy(got), dtype=np.float64)
    predicted = float(np.sum(got64 * direction))
    size = float(np.sum(np.abs(got64 * direction)))
    if expected is not None:
        size = max(size, float(np.sum(np.abs(np.asarray(to_numpy(expected), dtype=np.float64) * direction))))
    agrees = bool(np.isfinite(predicted)) and abs(predicted - fd) <= FD_RTOL * size + rounding
    text = f"central finite differences along a random direction d of {label_}: (L(x + h d) - L(x - h d)) / 2h = {fd:.9g}"
    if expected is not None:
        text += f"; minilin's gradient gives <d{label_}, d> = {float(np.sum(np.asarray(to_numpy(expected), dtype=np.float64) * direction)):.9g}"
    text += f", yours {predicted:.9g}"
    return agrees, text


def check_gradients(name: str, got, expected, *, names, dims, where: str = "", chunk_size: int | None = None,
                    scales: dict | None = None, factors: dict | None = None, loss=None, inputs=None, seed: int = 0):
    """Compare the gradients a learner's backward pass returned with minilin's, one input at a time, and
    with central finite differences of the loss they are the gradients of.

    got: what the learner's function returned, a tuple (or named tuple) with one item per name in `names`
    (such as ("dq", "dk", "dv", "dg", "dinitial_state")); expected: minilin's, in the same order, None where
    no gradient is expected (dinitial_state without an initial state). dims: the axes of each item
    ("B T H K", ...), so that a difference is located by time step: the first and the last that differ.
    A difference is explained as assert_close explains one, worded for gradients (a constant factor, a sign,
    a one-step shift; every value 0; a per-token factor named in `factors`, see assert_close), and also
    when the gradient is another input's (dk returned where dq belongs: the order of the tuple?). Each is
    compared to rtol 1e-8 of its own largest value, plus 1e-12 of the largest of all the gradients (the
    rounding of a gradient that is 0 in exact arithmetic).

    loss, inputs: when given, L = loss(*inputs) is the scalar these are the gradients of (for a mixer
    <do, o> + <dstate, S_T>, from minilin's forward), inputs[i] the array names[i] belongs to (None: not
    checked this way). Then a gradient that differs from minilin's is reported with the verdict of central
    finite differences along a random direction (they side with minilin: the reference is the derivative
    of L), and gradients that match minilin's are also checked against them, one input at a time.
    Returns the gradients as a tuple.
    """
    __tracebackhide__ = True
    names, dims = tuple(names), tuple(dims)
    parts = unpack(f"{name}", got, len(names), f"({', '.join(names)})")
    expected = tuple(expected)
    rng = np.random.default_rng(seed)
    directions = [None if inputs is None or inputs[i] is None else rng.standard_normal(np.shape(inputs[i]))
                  for i in range(len(names))]
    prefix = f"{name}: " if name else ""
    # Rounding floor: a gradient that is 0 in exact arithmetic (dg of a single token from an empty state) comes
    # out of minilin as rounding noise of the size of its terms; 1e-12 of the largest gradient covers it.
    floor = 1e-12 * max((float(np.max(np.abs(np.asarray(to_numpy(e), dtype=np.float64)), initial=0.0))
                         for e in expected if e is not None), default=0.0)
    for i, (what, part, want, letters) in enumerate(zip(names, parts, expected, dims)):
        title = f"{prefix}{what} {where}".rstrip()
        if want is None:
            if part is not None:
                fail(f"{title}: expected None (there is no such input in this call: {what} is None when the "
                     f"input was not given), got {_describe(part)}")
            continue
        try:
            assert_close(title, part, want, dims=letters, chunk_size=chunk_size, scales=scales, kind="gradient",
                         factors=factors, atol=floor)
        except CheckFailure as failure:
            extra = []
            if hasattr(part, "shape") and "likely cause" not in str(failure):
                got64 = np.asarray(to_numpy(part), dtype=np.float64)
                for j, (other, other_want) in enumerate(zip(names, expected)):
                    if j != i and other_want is not None and np.shape(other_want) == got64.shape:
                        o64 = np.asarray(to_numpy(other_want), dtype=np.float64)
                        if np.max(np.abs(got64 - o64), initial=0.0) <= 1e-6 * max(float(np.max(np.abs(o64), initial=0.0)), 1e-300):
                            extra.append(f"  likely cause: this is the expected {other}: the gradients returned in "
                                         f"the wrong order? (expected the order {', '.join(names)})")
                            break
            if loss is not None and directions[i] is not None and hasattr(part, "shape") and \
                    np.shape(part) == np.shape(want):
                _, text = _fd_verdict(loss, inputs, i, part, want, what[1:] if what.startswith("d") else what,
                                      directions[i])
                extra.append(f"  {text}: the finite differences side with minilin's")
            if extra:
                raise CheckFailure("\n".join([str(failure), *extra])) from None
            raise
    if loss is not None:
        for i, (what, part) in enumerate(zip(names, parts)):
            if directions[i] is None or expected[i] is None:
                continue
            agrees, text = _fd_verdict(loss, inputs, i, part, None, what[1:] if what.startswith("d") else what,
                                       directions[i])
            if not agrees:
                fail(f"{prefix}{what} {where}: matches minilin's gradient but not the finite differences of the "
                     f"loss (a bug in the check, not in your code):\n  {text}")
    return parts


def count_lines(function, args: tuple = (), kwargs: dict | None = None, *, exempt=()) -> int:
    """How many lines of the learner's file run during function(*args, **kwargs): every line executed in a
    frame of that file (its functions, comprehensions, lambdas), except inside the functions named in
    `exempt` (and what they call). Counted with sys.settrace, which is restored afterwards."""
    target = inspect.unwrap(function).__code__.co_filename
    exempt = set(exempt)
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame, event, arg):
        if frame.f_code.co_filename != target:
            return None
        f = frame
        while f is not None:
            if f.f_code.co_filename == target and f.f_code.co_name in exempt:
                return None
            f = f.f_back
        return local

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        function(*args, **(kwargs or {}))
    finally:
        sys.settrace(previous)
    return count


def assert_no_token_loop(name: str, function, make_call, *, chunked: bool, exempt=()):
    """Fail when a chunked (or parallel) form does work in Python once per token: a token loop in disguise.

    How: count the lines of the learner's file that run (count_lines) for a short and a long input with the
    same number of chunks: T = 32 with chunk_size 8, and T = 128 with chunk_size 32 (4 chunks both times);
    for a parallel form, T = 32 and T = 128. A chunked form loops over chunks, so its count stays put while
    the chunks get longer; a loop over tokens (for t in range(T), a comprehension over tokens, a mask built
    row by row) runs four times the lines. Passes when the long run takes at most 1.5 times the lines of the
    short one, plus 8. Counting lines, not time, makes the verdict the same on every machine, every run.
    Loops allowed per token sit in the functions named in `exempt` (exercise 12's wy_representation may
    solve its triangular system row by row). `make_call(T, chunk_size)` returns (args, kwargs) of fresh
    inputs, chunk_size None for a parallel form.
    """
    __tracebackhide__ = True
    sizes = ((32, 8), (128, 32)) if chunked else ((32, None), (128, None))
    counts = []
    for T, C in sizes:
        args, kwargs = make_call(T, C)
        with np.errstate(all="ignore"):
            counts.append(count_lines(function, args, kwargs, exempt=exempt))
    (T0, C0), (T1, C1) = sizes
    if counts[1] > 1.5 * counts[0] + 8:
        if chunked:
            fail(f"{name}: a loop over tokens?\n"
                 f"  {counts[1]} lines of your file ran for T={T1} (chunk_size={C1}) against {counts[0]} for T={T0} "
                 f"(chunk_size={C0}):\n  4 chunks both times, but the work in Python grew with the tokens.\n"
                 "  The chunked form loops over the T / C chunks only; inside a chunk, matrix products (and masks\n"
                 "  from np.tril) do the work for all its tokens at once"
                 + (f" (a loop over the tokens of a chunk may live in {', '.join(exempt)})" if exempt else ""))
        fail(f"{name}: a loop over tokens?\n"
             f"  {counts[1]} lines of your file ran for T={T1} against {counts[0]} for T={T0}.\n"
             "  The parallel form computes every token at once: matrix products, and the causal mask from\n"
             "  np.tril / np.triu, with no Python loop over t")


_OPENBLAS_PREFIXES = ("openblas_", "scipy_openblas_")
_OPENBLAS_SUFFIXES = ("", "64_")


def _openblas_threads():
    """(get, set) for the thread count of the OpenBLAS that NumPy loaded, found among the shared libraries
    of this process (Linux: /proc/self/maps), or None where there is none to find (another BLAS, macOS)."""
    import ctypes
    import re

    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps.read())))
    except OSError:
        return None
    for path in paths:
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _OPENBLAS_PREFIXES:
            for suffix in _OPENBLAS_SUFFIXES:
                get = getattr(library, f"{prefix}get_num_threads{suffix}", None)
                put = getattr(library, f"{prefix}set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                    return get, put
    return None


@contextlib.contextmanager
def blas_threads(count: int = 1):
    """Run the block with NumPy's OpenBLAS on `count` threads, then restore its thread count (a no-op where
    no OpenBLAS is found). For checks that make many small matrix products, such as exercise 22's training:
    on a busy machine with few cores the threads of one small product mostly wait for each other (measured
    on a shared 2-core machine: one thread was ten times faster than two)."""
    found = _openblas_threads()
    if found is None:
        yield
        return
    get, put = found
    before = get()
    put(count)
    try:
        yield
    finally:
        put(before)


_GPU_PROBE = "import cupy; print(cupy.cuda.runtime.getDeviceCount())"
_gpu_answer: list = []


def gpu_status() -> tuple[bool, str]:
    """(True, device name) when CuPy imports and sees a GPU, else (False, why not); asked once per process.

    The question is put to a short-lived child Python unless CuPy is imported here already: asking it here
    would start CUDA in this process, and a process forked from one that started CUDA cannot use the GPU
    (the runner forks one per check)."""
    if _gpu_answer:
        return _gpu_answer[0]
    if "cupy" in sys.modules:
        answer = _gpu_status_here()
    elif importlib.util.find_spec("cupy") is None:
        answer = (False, "needs a GPU: CuPy is not available (No module named 'cupy')")
    else:
        try:
            done = subprocess.run([sys.executable, "-c", _GPU_PROBE], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as error:
            answer = (False, f"needs a GPU: asking CuPy for one failed ({error})")
        else:
            lines = done.stdout.split()
            if done.returncode != 0 or not lines or not lines[-1].isdigit():
                why = (done.stderr.strip().splitlines() or ["no answer"])[-1]
                answer = (False, f"needs a GPU: CuPy is not available or sees none ({why})")
            else:
                count = int(lines[-1])
                answer = (True, f"GPU 0 of {count}") if count > 0 else (False, "needs a GPU: CuPy sees none")
    _gpu_answer.append(answer)
    return answer


def _gpu_status_here() -> tuple[bool, str]:
    try:
        import cupy
    except Exception as error:  # ImportError, or a CUDA library that fails to load
        return False, f"needs a GPU: CuPy is not available ({error})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:
        return False, f"needs a GPU: CuPy sees none ({error})"
    if count < 1:
        return False, "needs a GPU: CuPy sees none"
    return True, f"GPU 0 of {count}"
