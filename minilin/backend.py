"""The array module behind a call: NumPy on the CPU, CuPy on the GPU.

Every mixer takes its array module from its inputs (`xp = array_module(q, k, v)`) and writes
`xp.exp`, `xp.matmul`, ... so the same reference code runs unchanged on CuPy arrays. CuPy is never
imported unless a CuPy array is passed in.
"""
from __future__ import annotations

import numpy as np


def is_cupy_array(x) -> bool:
    """True for a `cupy.ndarray`, decided without importing CuPy."""
    return type(x).__module__.split(".")[0] == "cupy"


def array_module(*arrays):
    """`cupy` if any argument is a CuPy array, else `numpy` (None arguments are skipped)."""
    for x in arrays:
        if x is not None and is_cupy_array(x):
            import cupy

            return cupy
    return np


def to_numpy(x):
    """A NumPy copy of a NumPy or CuPy array (for printing and comparing)."""
    return x.get() if is_cupy_array(x) else np.asarray(x)
