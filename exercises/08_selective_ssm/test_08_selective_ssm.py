"""Check for exercise 08 (you do not need to edit this file): zero-order hold against
minilin.mixers.s4.discretize, and both selective scans against minilin.mixers.mamba, in float64; the
parallel one must not loop over tokens (a count of the Python lines it runs)."""
import numpy as np

from minilin.course.checks import assert_close, assert_no_token_loop, check_form, label, unpack, without_overflow
from minilin.mixers import mamba, s4

CASES = [dict(B=1, T=1, H=1, K=2, V=3), dict(B=2, T=37, H=2, K=4, V=3), dict(B=1, T=64, H=1, K=8, V=8)]


def test_zoh(learner):
    rng = np.random.default_rng(8)
    H, N = 5, 6
    dt = rng.uniform(0.001, 0.5, H)
    A = -rng.uniform(0.0, 3.0, (H, N))
    A[0, 0], A[1, 1], A[2, 2] = 0.0, -1e-13, -1e-7       # an integrator, and decays too small for exp(z) - 1
    B = rng.standard_normal((H, N))
    A_bar, B_bar = unpack("zoh(dt, A, B)", without_overflow("zoh(dt, A, B) with A = 0 in places", learner.zoh, dt, A, B),
                          2, "(A_bar, B_bar)")
    expected_A, expected_B = s4.discretize(dt, A, B)
    assert_close("zoh: A_bar", A_bar, expected_A, dims="H N")
    # Relative to each element: B_bar must keep its digits where dt A is tiny (use np.expm1).
    assert_close("zoh: B_bar", B_bar / expected_B, np.ones_like(expected_B), dims="H N", rtol=1e-10)


def test_selective_scan(learner):
    for seed, case in enumerate(CASES, 80):
        (x, dt, A, B, C, D), _ = mamba.example_inputs(**case, seed=seed)
        where = f"[{label(case)}: D = H * V = {x.shape[-1]} channels, N = K = {A.shape[1]} states]"
        check_form("selective_scan", learner.selective_scan, (x, dt, A, B, C, D), mamba.recurrent(x, dt, A, B, C, D),
                   where=where, outputs=("y", "final state"), dims=("B T D", "B D N"), scales={})


def test_selective_scan_parallel(learner):
    for seed, case in enumerate(CASES, 90):
        (x, dt, A, B, C, D), _ = mamba.example_inputs(**case, seed=seed)
        where = f"[{label(case)}: D = H * V = {x.shape[-1]} channels, N = K = {A.shape[1]} states]"
        check_form("selective_scan_parallel", learner.selective_scan_parallel, (x, dt, A, B, C, D),
                   mamba.recurrent(x, dt, A, B, C, D), where=where, outputs=("y", "final state"),
                   dims=("B T D", "B D N"), scales={})

    def call(T, chunk_size):
        args, _ = mamba.example_inputs(B=1, T=T, H=1, K=2, V=3, seed=T)
        return args, {}

    assert_no_token_loop("selective_scan_parallel", learner.selective_scan_parallel, call, chunked=False)
