"""Which mixers minilin has and which forms each offers; the tour, the benchmarks and the tests read
this instead of keeping lists of their own."""
from __future__ import annotations

import importlib

import numpy as np

from . import mixers

# Whole-sequence forms, in the order they are listed. Not every mixer has every form: S4 adds its
# FFT convolution, Mamba its associative-scan form.
FORMS = ("recurrent", "chunked", "parallel", "convolution", "scan")

# Softmax attention's recurrent form is a decoder loop that copies a growing KV cache at every token
# (quadratic memory traffic), so its fair baseline is the parallel form.
BASELINE = {"attention": "parallel"}

# Non-causal approximations of softmax attention have one form (parallel): comparing it with itself checks
# nothing. They are measured against the function they approximate, `exact` in their own module (exact
# non-causal softmax attention, called with the same (args, kwargs)); the difference is approximation
# error, to be reported, not held to a rounding tolerance.
APPROXIMATES = {"linformer": "exact", "nystromformer": "exact"}


def names() -> list[str]:
    """Every mixer in `minilin.mixers`, in the order of the chapters."""
    return list(mixers.__all__)


def module(name: str):
    return importlib.import_module(f"minilin.mixers.{name}")


def signature(name: str):
    """The mixer's SIGNATURE (`minilin.signature`): its arrays, output and state, declared in its module."""
    return module(name).SIGNATURE


def forms(name: str) -> list[str]:
    """The whole-sequence forms a mixer offers (functions only: `mamba.scan` could be a module)."""
    mod = module(name)
    return [form for form in FORMS if callable(getattr(mod, form, None))]


def baseline_form(name: str) -> str:
    """The form every other form is compared with: the recurrence (the definition) where there is one."""
    return BASELINE.get(name) or ("recurrent" if "recurrent" in forms(name) else forms(name)[0])


def reference(name: str):
    """The function a mixer's forms are measured against: an approximation's exact function
    (`APPROXIMATES`), else the mixer's baseline form. Called like the forms: fn(*args, **kwargs)."""
    return getattr(module(name), APPROXIMATES.get(name) or baseline_form(name))


def nbytes(state) -> int:
    """Bytes held by a state: an array, or a tuple of arrays (a KV cache)."""
    if state is None:
        return 0
    if isinstance(state, (tuple, list)):
        return sum(nbytes(s) for s in state)
    return int(state.nbytes)


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in double precision (CONVENTIONS.md); NaN anywhere gives NaN.
    Complex states (S4D-Lin) are compared as complex numbers, never by their real parts alone."""
    from .backend import to_numpy

    out, ref = to_numpy(out), to_numpy(ref)
    wide = np.complex128 if np.iscomplexobj(out) or np.iscomplexobj(ref) else np.float64
    out, ref = out.astype(wide), ref.astype(wide)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), np.finfo(float).tiny))
