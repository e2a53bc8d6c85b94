"""Central finite differences along random directions: how a hand-written gradient is proven.

For a loss L(inputs) and its claimed gradients g, along a random direction d (one input, or all at once):
    (L(x + eps d) - L(x - eps d)) / (2 eps)  ==  <g, d>   up to O(eps^2) and rounding,
with <g, d> = sum Re(conj(g) d): for a complex input the gradient is packed as dL/dRe + i dL/dIm, so a
real direction tests the real part and an imaginary one the imaginary part. Inputs may be arrays, None
(not given), or tuples of arrays such as a KV cache (non-array entries, a position, are kept as they are).
"""
from __future__ import annotations

import numpy as np

EPS = 1e-6
TOL = 1e-6   # |fd - <g, d>| <= TOL * max(|<g, d>|, 1); float64, losses of order 1 - 100


def is_array(x) -> bool:
    return isinstance(x, np.ndarray) and x.ndim >= 1


def direction(rng, x, part="both"):
    """A random direction shaped like x: normal entries; complex x: real + imaginary ("both"), or one part."""
    if x is None:
        return None
    if isinstance(x, tuple):
        return tuple(direction(rng, y, part) if is_array(y) else None for y in x)
    d = rng.standard_normal(x.shape)
    if np.iscomplexobj(x):
        d = {"both": d + 1j * rng.standard_normal(x.shape), "real": d + 0j, "imag": 1j * d}[part]
    return d


def moved(x, d, eps):
    if d is None:
        return x
    if isinstance(x, tuple):
        return type(x)(*(moved(y, e, eps) for y, e in zip(x, d)))
    return x + eps * d


def inner(g, d) -> float:
    if d is None:
        return 0.0
    if isinstance(d, tuple):
        return sum(inner(h, e) for h, e in zip(g, d))
    assert g is not None and g.shape == d.shape, f"gradient shape {None if g is None else g.shape} != {d.shape}"
    return float(np.real(np.conj(g) * d).sum())


def check(loss, inputs: dict, grads: dict, directions: dict, eps=EPS, tol=TOL):
    """Assert the central difference of loss(**inputs) along `directions` (name -> direction; names left
    out are held fixed) matches sum <grads[name], direction>; returns (fd, claimed)."""
    plus = {n: moved(x, directions.get(n), eps) for n, x in inputs.items()}
    minus = {n: moved(x, directions.get(n), -eps) for n, x in inputs.items()}
    fd = (loss(**plus) - loss(**minus)) / (2 * eps)
    claimed = sum(inner(grads[n], d) for n, d in directions.items())
    assert abs(fd - claimed) <= tol * max(abs(claimed), 1.0), (
        f"directions {sorted(directions)}: finite difference {fd!r}, gradient says {claimed!r}")
    return fd, claimed


def check_all_and_each(rng, loss, inputs: dict, grads: dict, part="both"):
    """All inputs at once, then each alone (every input that is not None)."""
    given = {n: x for n, x in inputs.items() if x is not None}
    check(loss, inputs, grads, {n: direction(rng, x, part) for n, x in given.items()})
    for n, x in given.items():
        check(loss, inputs, grads, {n: direction(rng, x, part)})
