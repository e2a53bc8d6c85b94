"""The checking helpers every exercise test uses, written once.

A check runs the learner's function and minilin's reference on the same fresh, seeded random inputs and
compares them with `assert_close`. When they differ the failure says how, in this order:
1. the wrong kind of thing (None, a tuple, a list) or the wrong shape or dtype, in plain words;
2. otherwise the worst element, with its index named by axis (b, t, h, v), expected and got, the max
   absolute and the relative error, and for sequences the first time step that differs.
NaN never passes.

Failures raise `CheckFailure` (an AssertionError), so pytest and `minilin check` both report them.
"""
from __future__ import annotations

import importlib.util
import numbers
import subprocess
import sys

import numpy as np

from ..backend import to_numpy

# The shapes most sequence checks run over: T = 1, T not a multiple of the chunk, K != V, B, H > 1.
SEQUENCE_CASES = (
    dict(B=1, T=1, H=1, K=4, V=3),
    dict(B=2, T=37, H=3, K=8, V=5),
    dict(B=1, T=64, H=2, K=16, V=16),
)

RTOL = {np.dtype(np.float64): 1e-8, np.dtype(np.float32): 1e-4}


class CheckFailure(AssertionError):
    """A check found a difference; the message explains it."""


def fail(message: str):
    __tracebackhide__ = True
    raise CheckFailure(message)


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
                 atol: float = 0.0, chunk_size: int | None = None):
    """Compare `got` with the reference `expected` (NumPy or CuPy arrays, or real numbers).

    Passes when max |got - expected| <= rtol * max |expected| + atol (rtol: 1e-8 in float64, 1e-4 in
    float32; atol: 0 unless the check says otherwise, for a quantity that is zero up to rounding), with the
    same shape and dtype and no NaN or inf where the reference is finite.
    dims: axis letters such as "B T H V", used to name the worst index and to find the time axis T.
    chunk_size: when given, the first differing time step is also located as (chunk, position).
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
    if "T" in letters and len(letters) == got.ndim and got.shape[letters.index("T")] > 1:
        axis = letters.index("T")
        per_step = bad.any(axis=tuple(a for a in range(bad.ndim) if a != axis))
        t = int(np.argmax(per_step))
        where = f" (chunk {t // chunk_size}, position {t % chunk_size} with chunk_size={chunk_size})" if chunk_size else ""
        before = "" if t == 0 else (" ; t=0 matches" if t == 1 else f"; t=0..{t - 1} match")
        lines.append(f"  first time step that differs: t={t}{where}{before}")
    fail("\n".join(lines))


def assert_output_and_state(name: str, result, expected, where: str, *, args: str = "",
                             chunk_size: int | None = None):
    """A mixer form's result checked as the pair (o, final_state) of CONVENTIONS.md against the reference pair
    `expected`: o [B, T, H, V] (its first wrong step located by chunk when chunk_size is given) and the state
    [B, H, K, V]. Messages name `name` + `args` (e.g. "(scale=0.25)") and say `where`."""
    __tracebackhide__ = True
    o, S = unpack(f"{name}(...)", result, 2, "(o, final_state)")
    assert_close(f"{name}{args}: o {where}", o, expected[0], dims="B T H V", chunk_size=chunk_size)
    assert_close(f"{name}{args}: final state {where}", S, expected[1], dims="B H K V")


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
