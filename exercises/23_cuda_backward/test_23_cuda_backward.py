"""Check for exercise 23 (you do not need to edit this file; runs where CuPy sees a GPU): the kernel
compiles, and recurrent_backward in float32 matches minilin.mixers.simple_gla's float64 recurrent_backward
to 1e-4 of each gradient's largest value: T = 1, odd sizes, K != V, K = V = 64 and a long sequence, with
and without an initial state and a dstate, the default scale and another; and float64 inputs that are not
contiguous in memory."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, check_gradients, fail, label
from minilin.mixers import simple_gla

CASES = SEQUENCE_CASES + (dict(B=1, T=20, H=1, K=64, V=64), dict(B=1, T=120, H=2, K=32, V=48))
NAMES = ("dq", "dk", "dv", "dg", "dinitial_state")
DIMS = ("B T H K", "B T H K", "B T H V", "B T H", "B H K V")


def _inputs(case, seed):
    (q, k, v, g), _ = simple_gla.example_inputs(**case, seed=seed)
    rng = np.random.default_rng(seed + 1000)
    do = rng.standard_normal(v.shape)
    S0 = rng.standard_normal((case["B"], case["H"], case["K"], case["V"]))
    dS = rng.standard_normal(S0.shape)
    return q, k, v, g, do, S0, dS


def _expected(q, k, v, g, do, dS, scale, S0):
    grads = simple_gla.recurrent_backward(q, k, v, g, do=do, dstate=dS, scale=scale, initial_state=S0)  # float64
    return tuple(None if x is None else x.astype(np.float32) for x in grads)


def test_kernel_compiles(learner):
    import cupy

    source = learner.kernel_source()
    if not isinstance(source, str):
        fail(f"kernel_source(): expected the CUDA C++ source as a str, got {type(source).__name__}")
    kernel = cupy.RawKernel(source, "recurrent_bwd")
    try:
        kernel.compile() if hasattr(kernel, "compile") else kernel.attributes
    except Exception as error:
        fail(f"kernel_source() does not compile as `recurrent_bwd`:\n{error}")


def test_recurrent_backward(learner):
    import cupy

    for seed, case in enumerate(CASES, 800):
        q, k, v, g, do, S0, dS = _inputs(case, seed)
        for scale, initial_state, dstate in ((None, None, None), (0.5, S0, dS)):
            on_gpu = [cupy.asarray(x, dtype=cupy.float32) for x in (q, k, v, g, do)]
            state = None if initial_state is None else cupy.asarray(initial_state, dtype=cupy.float32)
            cotangent = None if dstate is None else cupy.asarray(dstate, dtype=cupy.float32)
            got = learner.recurrent_backward(*on_gpu[:4], do=on_gpu[4], dstate=cotangent, scale=scale,
                                             initial_state=state)
            where = (f"[{label(case)}, float32" + (", initial_state given" if initial_state is not None else "")
                     + (", dstate given" if dstate is not None else "") + "]")
            s = case["K"] ** -0.5 if scale is None else scale
            check_gradients(f"recurrent_backward(scale={scale})", got,
                            _expected(q, k, v, g, do, dstate, scale, initial_state), names=NAMES, dims=DIMS,
                            where=where, scales={"scale": s, "K ** -0.5": case["K"] ** -0.5},
                            factors={"exp(g_t)": np.exp(g)})


def test_recurrent_backward_takes_any_layout(learner):
    """float64 inputs, and views that are not contiguous in memory: the launcher makes contiguous float32
    copies before it hands raw pointers to the kernel."""
    import cupy

    case = SEQUENCE_CASES[0]
    q, k, v, g, do, S0, dS = _inputs(case, 810)
    views = [cupy.asarray(np.ascontiguousarray(np.swapaxes(x, 1, 2))).swapaxes(1, 2) for x in (q, k, v, g, do)]
    state, cotangent = (cupy.asarray(np.ascontiguousarray(np.swapaxes(x, 2, 3))).swapaxes(2, 3) for x in (S0, dS))
    got = learner.recurrent_backward(*views[:4], do=views[4], dstate=cotangent, initial_state=state)
    check_gradients("recurrent_backward", got, _expected(q, k, v, g, do, dS, None, S0), names=NAMES, dims=DIMS,
                    where=f"[{label(case)}, float64 inputs, each a transposed view (not contiguous)]")
