"""Check for exercise 16 (you do not need to edit this file; runs where CuPy sees a GPU): the kernel
compiles, and recurrent_forward in float32 matches minilin.mixers.simple_gla's float64 recurrence to
1e-4 of the largest output, for T = 1, odd sizes, K != V and the largest K, the default scale and another,
and for float64 inputs that are not contiguous in memory."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_close, fail, label, unpack
from minilin.mixers import simple_gla

CASES = SEQUENCE_CASES + (dict(B=1, T=300, H=2, K=128, V=64),)


def _compile(cupy, source, name):
    if not isinstance(source, str):
        fail(f"kernel_source(): expected the CUDA C++ source as a str, got {type(source).__name__}")
    kernel = cupy.RawKernel(source, name)
    try:
        kernel.compile() if hasattr(kernel, "compile") else kernel.attributes
    except Exception as error:
        fail(f"kernel_source() does not compile as `{name}`:\n{error}")
    return kernel


def test_kernel_compiles(learner):
    import cupy

    _compile(cupy, learner.kernel_source(), "recurrent_fwd")


def test_recurrent_forward(learner):
    import cupy

    for seed, case in enumerate(CASES, 240):
        (q, k, v, g), _ = simple_gla.example_inputs(**case, seed=seed)
        for scale in (None, 0.5):
            expected_o, expected_S = simple_gla.recurrent(q, k, v, g, scale=scale)   # float64
            inputs = [cupy.asarray(x, dtype=cupy.float32) for x in (q, k, v, g)]
            o, S = unpack("recurrent_forward(...)", learner.recurrent_forward(*inputs, scale=scale), 2,
                          "(o, state)")
            where = f"(scale={scale}) [{label(case)}, float32]"
            assert_close(f"recurrent_forward: o {where}", o, expected_o.astype(np.float32), dims="B T H V")
            assert_close(f"recurrent_forward: state {where}", S, expected_S.astype(np.float32), dims="B H K V")


def test_recurrent_forward_takes_any_layout(learner):
    """float64 inputs, and views that are not contiguous in memory: the launcher makes contiguous float32
    copies before it hands raw pointers to the kernel."""
    import cupy

    case = SEQUENCE_CASES[0]
    (q, k, v, g), _ = simple_gla.example_inputs(**case, seed=247)
    expected_o, expected_S = simple_gla.recurrent(q, k, v, g)
    views = [cupy.asarray(np.ascontiguousarray(np.swapaxes(x, 1, 2))).swapaxes(1, 2) for x in (q, k, v, g)]
    o, S = unpack("recurrent_forward(...)", learner.recurrent_forward(*views), 2, "(o, state)")
    where = f"[{label(case)}, float64 inputs, each a transposed view (not contiguous)]"
    assert_close(f"recurrent_forward: o {where}", o, expected_o.astype(np.float32), dims="B T H V")
    assert_close(f"recurrent_forward: state {where}", S, expected_S.astype(np.float32), dims="B H K V")
