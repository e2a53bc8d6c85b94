"""Check for exercise 10 (you do not need to edit this file): both forms of GLA against the recurrence of
minilin.mixers.gla, in float64, including gates strong enough that exp(-G) overflows."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_close, label, unpack
from minilin.mixers import gla


def test_gla_recurrent(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 100):
        (q, k, v, g), _ = gla.example_inputs(**case, seed=seed)
        expected_o, expected_S = gla.recurrent(q, k, v, g)
        o, S = unpack("gla_recurrent(...)", learner.gla_recurrent(q, k, v, g), 2, "(o, final_state)")
        assert_close(f"gla_recurrent: o [{label(case)}]", o, expected_o, dims="B T H V")
        assert_close(f"gla_recurrent: final state [{label(case)}]", S, expected_S, dims="B H K V")


def test_gla_chunked(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 110):
        (q, k, v, g), _ = gla.example_inputs(**case, seed=seed)
        expected_o, expected_S = gla.recurrent(q, k, v, g, scale=0.5)
        for C in (16, 1, 64, 5):
            o, S = unpack("gla_chunked(...)", learner.gla_chunked(q, k, v, g, scale=0.5, chunk_size=C), 2,
                          "(o, final_state)")
            where = f"[{label(case, chunk_size=C)}]"
            assert_close(f"gla_chunked: o {where}", o, expected_o, dims="B T H V", chunk_size=C)
            assert_close(f"gla_chunked: final state {where}", S, expected_S, dims="B H K V")


def test_gla_chunked_strong_gates(learner):
    case = dict(B=1, T=40, H=2, K=4, V=3)
    (q, k, v, _), _ = gla.example_inputs(**case, seed=120)
    g = np.random.default_rng(121).uniform(-60.0, -20.0, q.shape)   # a chunk of 32 sums to about -1300
    g[..., 0] = -1e-3                                                  # one channel that barely forgets
    expected_o, expected_S = gla.recurrent(q, k, v, g)
    with np.errstate(over="ignore", invalid="ignore"):
        o, S = unpack("gla_chunked(...)", learner.gla_chunked(q, k, v, g, chunk_size=32), 2, "(o, final_state)")
    where = f"[{label(case, chunk_size=32)}, g in [-60, -20]: exp(-G) overflows, keep exponents <= 0]"
    assert_close(f"gla_chunked: o {where}", o, expected_o, dims="B T H V", chunk_size=32)
    assert_close(f"gla_chunked: final state {where}", S, expected_S, dims="B H K V")
