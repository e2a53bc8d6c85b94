"""Check for exercise 09 (you do not need to edit this file): segsum against minilin.chunking.decay_matrix
(in exp space), and the chunked SSD against the recurrence of minilin.mixers.mamba2, in float64."""
import numpy as np

from minilin.chunking import decay_matrix
from minilin.course.checks import SEQUENCE_CASES, assert_close, label, unpack
from minilin.mixers import mamba2


def test_segsum(learner):
    rng = np.random.default_rng(9)
    for shape, strength in [((1,), 1.0), ((3, 7), 1.0), ((2, 2, 64), 30.0)]:
        g = -strength * rng.uniform(0, 1, shape)
        got = learner.segsum(g)
        with np.errstate(over="ignore", invalid="ignore"):
            got = np.exp(got) if hasattr(got, "shape") else got
        assert_close(f"exp(segsum(g)) for g of shape {list(shape)} (g down to {-strength}; above the diagonal "
                     "exp(-inf) = 0)", got, decay_matrix(np.cumsum(g, axis=-1)))


def test_ssd_chunked(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 90):
        (x, dt, A, B, C, D), _ = mamba2.example_inputs(**case, seed=seed)
        expected_y, expected_h = mamba2.recurrent(x, dt, A, B, C, D)
        for size in (16, 1, 64, 5):
            y, h = unpack("ssd_chunked(...)", learner.ssd_chunked(x, dt, A, B, C, D, chunk_size=size), 2,
                          "(y, final_state)")
            where = f"[{label(case, chunk_size=size)}: P = V, N = K]"
            assert_close(f"ssd_chunked: y {where}", y, expected_y, dims="B T H P", chunk_size=size)
            assert_close(f"ssd_chunked: final state {where}", h, expected_h, dims="B H N P")


def test_ssd_without_skip_and_strong_decay(learner):
    case = dict(B=1, T=100, H=2, K=4, V=3)
    (x, dt, A, B, C, _), _ = mamba2.example_inputs(**case, seed=99)
    dt = dt * 40                         # decays down to exp(-40) per token: a naive exp(-G) overflows
    expected_y, expected_h = mamba2.recurrent(x, dt, A, B, C)
    y, h = unpack("ssd_chunked(...)", learner.ssd_chunked(x, dt, A, B, C, chunk_size=64), 2, "(y, final_state)")
    where = f"[{label(case, chunk_size=64)}, D=None, dt * A down to {float((dt * A).min()):.0f}]"
    assert_close(f"ssd_chunked: y {where}", y, expected_y, dims="B T H P", chunk_size=64)
    assert_close(f"ssd_chunked: final state {where}", h, expected_h, dims="B H N P")
