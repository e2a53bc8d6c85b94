"""Check for exercise 17 (you do not need to edit this file; runs where CuPy sees a GPU): the kernel
compiles, and chunked_forward in float32 matches minilin.mixers.linear_attention's float64 recurrence to
1e-4 of the largest output: T = 1, T % 16 != 0, K != V, K = V = 64, and a long sequence, with the default
scale and another; and float64 inputs that are not contiguous in memory."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_close, fail, label, unpack
from minilin.mixers import linear_attention

CASES = SEQUENCE_CASES + (dict(B=2, T=16, H=1, K=64, V=64), dict(B=1, T=500, H=2, K=32, V=48))


def test_kernel_compiles(learner):
    import cupy

    source = learner.kernel_source()
    if not isinstance(source, str):
        fail(f"kernel_source(): expected the CUDA C++ source as a str, got {type(source).__name__}")
    kernel = cupy.RawKernel(source, "chunked_fwd")
    try:
        kernel.compile() if hasattr(kernel, "compile") else kernel.attributes
    except Exception as error:
        fail(f"kernel_source() does not compile as `chunked_fwd`:\n{error}")


def test_chunked_forward(learner):
    import cupy

    for seed, case in enumerate(CASES, 250):
        (q, k, v), _ = linear_attention.example_inputs(**case, seed=seed)
        for scale in (None, 0.5):
            expected_o, expected_S = linear_attention.recurrent(q, k, v, scale=scale)     # float64
            inputs = [cupy.asarray(x, dtype=cupy.float32) for x in (q, k, v)]
            o, S = unpack("chunked_forward(...)", learner.chunked_forward(*inputs, scale=scale), 2, "(o, state)")
            where = f"(scale={scale}) [{label(case)}, float32]"
            assert_close(f"chunked_forward: o {where}", o, expected_o.astype(np.float32), dims="B T H V", chunk_size=16)
            assert_close(f"chunked_forward: state {where}", S, expected_S.astype(np.float32), dims="B H K V")


def test_chunked_forward_takes_any_layout(learner):
    """float64 inputs, and views that are not contiguous in memory: the launcher makes contiguous float32
    copies before it hands raw pointers to the kernel."""
    import cupy

    case = SEQUENCE_CASES[0]
    (q, k, v), _ = linear_attention.example_inputs(**case, seed=257)
    expected_o, expected_S = linear_attention.recurrent(q, k, v)
    views = [cupy.asarray(np.ascontiguousarray(np.swapaxes(x, 1, 2))).swapaxes(1, 2) for x in (q, k, v)]
    o, S = unpack("chunked_forward(...)", learner.chunked_forward(*views), 2, "(o, state)")
    where = f"[{label(case)}, float64 inputs, each a transposed view (not contiguous)]"
    assert_close(f"chunked_forward: o {where}", o, expected_o.astype(np.float32), dims="B T H V", chunk_size=16)
    assert_close(f"chunked_forward: state {where}", S, expected_S.astype(np.float32), dims="B H K V")
