"""Input checks shared by every mixer: bad input raises before any work starts.

Each message names the argument, what was expected and what was given, for example
`beta: expected shape [B, T, H] = [2, 100, 4], got [2, 100]`.

Shapes are written as dimension letters (`"B T H K"`). A `Shapes` object binds each letter to a size
the first time it sees it and checks every later argument against the sizes bound so far, so the
first argument that disagrees is the one named.
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from .backend import array_module, is_cupy_array


class Shapes:
    """Sizes of the dimension letters seen so far in one call, e.g. {'B': 2, 'T': 100, 'H': 4}."""

    def __init__(self, **sizes: int):
        self.sizes = dict(sizes)

    def __getitem__(self, letter: str) -> int:
        return self.sizes[letter]

    def bind(self, name: str, shape, dims: str) -> None:
        """Check `shape` against the letters in `dims` and bind the letters not seen before."""
        # Plain loops, no generators: every GPU call runs this five times before its launch (minilin.cuda).
        letters = _letters(dims)
        sizes = self.sizes
        if len(shape) == len(letters):
            for letter, size in zip(letters, shape):
                known = sizes.get(letter)
                if known is not None and known != size:
                    break
            else:
                for letter, size in zip(letters, shape):
                    if letter not in sizes:
                        sizes[letter] = int(size)
                return
        known = [sizes.get(letter) for letter in letters]
        expected = ", ".join(str(k) if k is not None else letter for k, letter in zip(known, letters))
        bound = f" = [{expected}]" if any(k is not None for k in known) else f" ({len(letters)} dims)"
        raise ValueError(f"{name}: expected shape [{', '.join(letters)}]{bound}, got {[int(s) for s in shape]}")


@functools.lru_cache(maxsize=None)
def _letters(dims: str) -> tuple[str, ...]:
    """'B T H K' -> ('B', 'T', 'H', 'K'), split once per distinct string."""
    return tuple(dims.split())


def _type_name(x) -> str:
    t = type(x)
    return f"{t.__module__.split('.')[0]}.{t.__name__}" if t.__module__ != "builtins" else t.__name__


def check_array(name: str, x, dims: str, shapes: Shapes, xp):
    """Check one tensor argument: an array of module `xp`, floating point, of shape `dims`, finite."""
    if not (isinstance(x, np.ndarray) or is_cupy_array(x)):
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {_type_name(x)}")
    if array_module(x) is not xp:
        raise TypeError(
            f"{name}: expected a {xp.__name__} array like the other inputs, got {_type_name(x)}"
        )
    if x.dtype.kind != "f":
        raise TypeError(f"{name}: expected a floating-point array (float32 or float64), got {x.dtype}")
    shapes.bind(name, x.shape, dims)
    if not all_finite(x, xp):
        bad = ~xp.isfinite(x) if xp is np else (~xp.isfinite(x)).get()
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}: expected finite values, got {x[first]} at index {first}")
    return x


def all_finite(x, xp) -> bool:
    """Whether every element of the floating-point array x is finite, exactly.

    x . x = sum_i x_i^2, and an inf or a NaN anywhere makes it inf or NaN (inf^2 = inf, NaN propagates, and
    no 0 * inf arises: each element multiplies itself), so a finite x . x proves every element finite. The
    converse fails only where finite squares or their sum overflow (|x_i| above about 1.8e19 in float32):
    then the elementwise test decides, as it does for arrays that are not contiguous (a flat view of them
    would be a copy) or not float32 / float64 (BLAS's dot takes those). The dot product reads x once and
    writes nothing, where `isfinite(x).all()` also writes and reads a boolean array of x's size: on the CPU
    bench's inputs (1M float32 numbers each) 0.18 against 0.28 ms per array out of cache, 0.05 against 0.08
    in cache, on the 2-core development machine (the sum of x, the same argument, ran slower than either in
    cache).
    """
    if x.flags.c_contiguous and x.dtype in (xp.float32, xp.float64):
        flat = x.reshape(-1)
        with np.errstate(over="ignore"):              # an overflow here only sends x to the elementwise test
            if bool(xp.isfinite(xp.dot(flat, flat))):
                return True
    return bool(xp.isfinite(x).all())


def check_max(name: str, x, bound: float, what: str) -> None:
    """Raise unless every element of `x` is <= bound."""
    top = float(x.max()) if x.size else bound
    if not top <= bound:  # NaN fails too
        raise ValueError(f"{name}: expected {what}, got max {top:.6g}")


def check_min(name: str, x, bound: float, what: str, *, strict: bool = False) -> None:
    """Raise unless every element of `x` is >= bound (> bound when `strict`)."""
    if x.size == 0:
        return
    low = float(x.min())
    if not (low > bound if strict else low >= bound):  # NaN fails too
        raise ValueError(f"{name}: expected {what}, got min {low:.6g}")


def check_log_gate(name: str, g) -> None:
    """A gate in log space must be <= 0, so its decay factor exp(g) lies in (0, 1]."""
    check_max(name, g, 0.0, f"log-space decay {name} <= 0 (the decay factor is exp({name}))")


def check_beta(beta, allow_neg_eigval: bool) -> None:
    """beta in [0, 1]; in [0, 2] with allow_neg_eigval (the transition I - beta k k^T may then flip sign)."""
    top = 2.0 if allow_neg_eigval else 1.0
    what = f"values in [0, {top:g}] (allow_neg_eigval={allow_neg_eigval})"
    check_min("beta", beta, 0.0, what)
    check_max("beta", beta, top, what)


def check_count(name: str, value, *, high=None, what: str = "") -> int:
    """A positive integer (a size, a count, a chunk length), at most `high` when given; `what` says in words
    what it counts. Not an integer (bools included): TypeError; out of range: ValueError."""
    expected = f"an integer 1 <= {name} <= {high}{what}" if high is not None else f"a positive integer{what}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected {expected}, got {value!r}")
    if value < 1 or (high is not None and value > high):
        raise ValueError(f"{name}: expected {expected}, got {value}")
    return int(value)


def check_real(name: str, value, low: float, *, strict: bool) -> float:
    """A finite real number >= low (> low when strict), such as a learning rate or a bound. Not a real number
    (bools included): TypeError; not finite or out of range: ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {value!r}")
    if not math.isfinite(value) or value < low or (strict and value == low):
        raise ValueError(f"{name}: expected a finite number {'>' if strict else '>='} {low:g}, got {value!r}")
    return float(value)


def check_chunk_size(chunk_size, T: int | None = None) -> int:
    """A positive integer. Given the sequence length T, a chunk longer than T is clamped to T: one chunk then
    holds the whole sequence, and no work or memory is spent on padding it out to `chunk_size`."""
    chunk_size = check_count("chunk_size", chunk_size)
    return chunk_size if T is None else min(chunk_size, max(int(T), 1))


def check_scale(scale, K: int) -> float:
    """`scale` defaults to K ** -0.5; given, it must be a real number (TypeError otherwise) and finite
    (ValueError otherwise)."""
    if scale is None:
        return K ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a finite real number or None, got {scale!r}")
    if not np.isfinite(scale):
        raise ValueError(f"scale: expected a finite real number or None, got {scale!r}")
    return float(scale)


# Rounding slack of check_delta_keys: a unit key stored in float32 has |k|^2 = 1 within a few 1e-7.
KEY_NORM_SLACK = 1e-5


def check_delta_keys(k, beta, allow_neg_eigval: bool) -> None:
    """The delta rule's transition I - beta_t k_t k_t^T has the eigenvalue 1 - beta_t |k_t|^2 along k_t (and 1
    elsewhere). The state stays bounded only while that eigenvalue lies in [-1, 1]: beta |k|^2 <= 2, and in
    [0, 1] without allow_neg_eigval: beta |k|^2 <= 1. Past it every write amplifies what the memory holds,
    and a long sequence overflows. k [..., K], beta [...] with the same leading axes."""
    if k.size == 0:
        return
    top = 2.0 if allow_neg_eigval else 1.0
    strength = beta * array_module(k).einsum("...k,...k->...", k, k)  # |k|^2 without a [.., K] temporary
    worst = float(strength.max())
    if worst > top * (1 + KEY_NORM_SLACK):
        flat = int(array_module(strength).argmax(strength))
        where = tuple(int(i) for i in np.unravel_index(flat, strength.shape))
        raise ValueError(
            f"k, beta: expected beta |k|^2 <= {top:g} (allow_neg_eigval={allow_neg_eigval}; the transition "
            f"I - beta k k^T is stable only then): L2-normalize the keys, or pass normalize_qk=True to have "
            f"the mixer do it; got beta |k|^2 = {worst:.6g} at index {where}")


def check_flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return bool(value)


def common_dtype(xp, *arrays):
    """The floating dtype all inputs are computed in (float16 is promoted to float32)."""
    dtype = xp.result_type(*[a for a in arrays if a is not None])
    return xp.dtype(xp.float32) if dtype.itemsize < 4 else dtype


def state_name(step: bool) -> str:
    """What the state argument is called: `state` in step(), `initial_state` elsewhere."""
    return "state" if step else "initial_state"


# Dimension letters that may be 0: a cache may hold no entries yet.
EMPTY_ALLOWED = frozenset("PL")


def check_nonempty(shapes: Shapes, named_dims, empty_allowed=EMPTY_ALLOWED) -> None:
    """Every size bound in `shapes` is >= 1 (but for the `empty_allowed` letters); named_dims: (name, dims) in
    order, to name the first argument holding an empty dimension. T = 0 gets its own message."""
    for letter, size in shapes.sizes.items():
        if size >= 1 or letter in empty_allowed:
            continue
        first = next(name for name, dims in named_dims if letter in dims.split())
        if letter == "T":
            raise ValueError(f"{first}: expected at least one token (T >= 1), got T = 0")
        raise ValueError(f"{first}: expected {letter} >= 1, got {letter} = 0")


def check_tensors(*specs, step: bool = False):
    """Check the tensor arguments of one call and cast them to one floating dtype.

    specs: (name, array or None, dims) in signature order; None means an optional argument left out.
    With step=True the inputs hold one token: the letter T is dropped from every dims.
    Returns (xp, shapes, [arrays cast to the common dtype, None kept]).
    """
    given = [(name, x) for name, x, _ in specs if x is not None]
    xp = array_module(given[0][1])
    shapes = Shapes()
    for name, x, dims in specs:
        if x is not None:
            check_array(name, x, " ".join(d for d in dims.split() if not (step and d == "T")), shapes, xp)
    check_nonempty(shapes, [(name, dims) for name, x, dims in specs if x is not None])
    dtype = common_dtype(xp, *[x for _, x in given])
    return xp, shapes, [None if x is None else x.astype(dtype, copy=False) for _, x, _ in specs]
