"""Check for exercise 10 (you do not need to edit this file): both forms of GLA against the recurrence of
minilin.mixers.gla, in float64, including gates strong enough that exp(-G) overflows."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_output_and_state, label
from minilin.mixers import gla


def test_gla_recurrent(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 100):
        (q, k, v, g), _ = gla.example_inputs(**case, seed=seed)
        assert_output_and_state("gla_recurrent", learner.gla_recurrent(q, k, v, g), gla.recurrent(q, k, v, g),
                                f"[{label(case)}]")


def test_gla_chunked(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 110):
        (q, k, v, g), _ = gla.example_inputs(**case, seed=seed)
        expected = gla.recurrent(q, k, v, g, scale=0.5)
        for C in (16, 1, 64, 5):
            assert_output_and_state("gla_chunked", learner.gla_chunked(q, k, v, g, scale=0.5, chunk_size=C), expected,
                                    f"[{label(case, chunk_size=C)}]", chunk_size=C)


def test_gla_chunked_strong_gates(learner):
    case = dict(B=1, T=40, H=2, K=4, V=3)
    (q, k, v, _), _ = gla.example_inputs(**case, seed=120)
    g = np.random.default_rng(121).uniform(-60.0, -20.0, q.shape)   # a chunk of 32 sums to about -1300
    g[..., 0] = -1e-3                                                  # one channel that barely forgets
    with np.errstate(over="ignore", invalid="ignore"):
        result = learner.gla_chunked(q, k, v, g, chunk_size=32)
    where = f"[{label(case, chunk_size=32)}, g in [-60, -20]: exp(-G) overflows, keep exponents <= 0]"
    assert_output_and_state("gla_chunked", result, gla.recurrent(q, k, v, g), where, chunk_size=32)
