"""bfloat16 on the GPU: what the kernels read when their inputs are bf16.

CuPy may or may not have a bfloat16 dtype (CuPy 14 accepts `ml_dtypes.bfloat16` arrays where its build
supports it). The kernels accept either form and read the same 16 bits:

- native: CuPy arrays of dtype `ml_dtypes.bfloat16`, where CuPy supports them;
- bits: `uint16` CuPy arrays holding bfloat16 bit patterns (the upper half of a float32).

`to_bf16` and `from_bf16` convert explicitly, rounding to nearest even; nothing in minilin.cuda casts
silently, so a float64 or float16 array passed as q is an error, not a conversion. Outputs come back in
the form the inputs came in (native in, native out; bits in, bits out).
"""
from __future__ import annotations

import functools

import numpy as np

BITS = np.dtype(np.uint16)

# Rounding to bfloat16 moves each element by at most 2^-9 of itself, so a unit key can come out up to 2^-9 longer
# and fail a check of beta |k|^2 <= 1 made on the rounded values (validation.check_delta_keys, in the float64
# references). A unit key scaled by 1 - 2^-7 first rounds to |k| <= (1 - 2^-7)(1 + 2^-9) < 1: what the benchmarks and
# tests do to the keys they round.
UNIT_KEY_SCALE = 1.0 - 2.0 ** -7


@functools.lru_cache(maxsize=None)
def native_dtype():
    """The NumPy dtype CuPy accepts as bfloat16 (`ml_dtypes.bfloat16`), or None where it has none."""
    try:
        import cupy
        import ml_dtypes

        dtype = np.dtype(ml_dtypes.bfloat16)
        probe = cupy.asarray(np.ones(2, dtype=np.float32)).astype(dtype)
        if float(probe.astype(cupy.float32).sum()) != 2.0:
            return None
        return dtype
    except Exception:  # noqa: BLE001 - no CuPy, no ml_dtypes, or a CuPy without bfloat16
        return None


def is_bf16(dtype) -> bool:
    """True for a native bfloat16 dtype or uint16 bit patterns."""
    dtype = np.dtype(dtype)
    return dtype == BITS or (native_dtype() is not None and dtype == native_dtype())


@functools.lru_cache(maxsize=None)
def _kernels():
    import cupy

    round_to_bits = cupy.ElementwiseKernel(
        "float32 x", "uint16 y",
        """
        unsigned int u = __float_as_uint(x);
        if ((u & 0x7fffffffu) > 0x7f800000u) y = (unsigned short)((u >> 16) | 0x40u);  // NaN stays NaN
        else y = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);             // nearest, ties to even
        """, "minilin_float32_to_bf16_bits")
    widen_bits = cupy.ElementwiseKernel(
        "uint16 x", "float32 y", "y = __uint_as_float(((unsigned int)x) << 16);", "minilin_bf16_bits_to_float32")
    return round_to_bits, widen_bits


def to_bf16(x, *, bits: bool | None = None):
    """A float array (NumPy or CuPy) as a bfloat16 CuPy array, rounded to nearest even.

    bits=None: the native dtype where CuPy has one, else uint16 bit patterns; bits=True forces uint16.
    x: any shape, floating point (float16, float32, float64; bfloat16 bits or an integer array are refused: read
    as numbers, bits would become garbage); returns the same shape.
    """
    dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
    if dtype == BITS:
        raise TypeError("to_bf16: x is already bfloat16 (uint16 bits); from_bf16 gives its float32 values")
    if dtype.kind != "f" or is_bf16(dtype):
        raise TypeError(f"to_bf16: expected a float16, float32 or float64 array, got {dtype}")
    import cupy

    x32 = cupy.asarray(x, dtype=cupy.float32)
    if bits is None:
        bits = native_dtype() is None
    if not bits:
        if native_dtype() is None:
            raise TypeError("to_bf16(bits=False): this CuPy has no bfloat16 dtype; use bits=True (uint16)")
        return x32.astype(native_dtype())
    return _kernels()[0](x32)


def as_float32(x):
    """float32 values of a float32 or bfloat16 (native or uint16 bits) array, CuPy or NumPy, for elementwise work
    and checks; float32 comes back as it is. The bits widen exactly: a bf16 is the upper half of a float32."""
    dtype = np.dtype(x.dtype)
    if dtype == np.float32:
        return x
    if dtype == BITS:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def like(x32, template):
    """float32 values `x32` in `template`'s dtype: float32 as they are, bfloat16 rounded to nearest even (native or
    uint16 bits, as the template)."""
    if np.dtype(template.dtype) == np.float32:
        return x32
    return to_bf16(x32, bits=np.dtype(template.dtype) == BITS)


def from_bf16(x):
    """A bfloat16 CuPy array (native or uint16 bits) as float32 (exact: every bf16 is a float32)."""
    import cupy

    if not isinstance(x, cupy.ndarray) or not is_bf16(x.dtype):
        raise TypeError(f"from_bf16: expected a CuPy bfloat16 or uint16 (bf16 bits) array, got "
                        f"{type(x).__module__.split('.')[0]}.{type(x).__name__} of dtype {getattr(x, 'dtype', None)}")
    if x.dtype == BITS:
        return _kernels()[1](x)
    return x.astype(cupy.float32)
