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


def solve_unit_lower(A, rhs):
    """Solve `(I + A) X = rhs` for a strictly lower-triangular `A`, batched over leading axes.

    A: [..., C, C] (only the strictly lower part is read), rhs: [..., C, M] -> X: [..., C, M].
    This is the triangular solve behind the WY representation of the delta rule. On NumPy it is
    `scipy.linalg.solve_triangular` (unit diagonal, so the diagonal of `A` is never read). On CuPy it
    is a batched LU solve of the same system: cuSOLVER has no batched triangular solve, and the
    matrix is unit lower triangular, so the LU factorization is the matrix itself.
    """
    xp = array_module(A, rhs)
    if xp is np:
        from scipy.linalg import solve_triangular

        return solve_triangular(A, rhs, lower=True, unit_diagonal=True, check_finite=False)
    C = A.shape[-1]
    eye = xp.eye(C, dtype=A.dtype)
    return xp.linalg.solve(xp.tril(A, -1) + eye, rhs)
