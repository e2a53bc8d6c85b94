"""Check for exercise 10 (you do not need to edit this file): both forms of GLA against the recurrence of
minilin.mixers.gla, in float64, each with the default scale and another one, including gates strong enough
that exp(-G) overflows; and a count of the chunked form's Python lines (chunks, not tokens)."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_no_token_loop, check_form, label
from minilin.mixers import gla


def _reference(q, k, v, g, scale=None, chunk_size=None):
    return gla.recurrent(q, k, v, g, scale=scale)


def test_gla_recurrent(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 100):
        (q, k, v, g), _ = gla.example_inputs(**case, seed=seed)
        for scale in (None, 0.5):
            check_form("gla_recurrent", learner.gla_recurrent, (q, k, v, g), gla.recurrent(q, k, v, g, scale=scale),
                       kwargs=dict(scale=scale), where=f"[{label(case)}]", reference=_reference)


def test_gla_chunked(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 110):
        (q, k, v, g), _ = gla.example_inputs(**case, seed=seed)
        expected = gla.recurrent(q, k, v, g, scale=0.5)
        for C in (16, 1, 64, 5):
            check_form("gla_chunked", learner.gla_chunked, (q, k, v, g), expected, kwargs=dict(scale=0.5, chunk_size=C),
                       where=f"[{label(case)}]", chunk_size=C, reference=_reference)


def test_gla_chunked_strong_gates(learner):
    case = dict(B=1, T=40, H=2, K=4, V=3)
    (q, k, v, _), _ = gla.example_inputs(**case, seed=120)
    g = np.random.default_rng(121).uniform(-60.0, -20.0, q.shape)   # a chunk of 32 sums to about -1300
    g[..., 0] = -1e-3                                                  # one channel that barely forgets
    with np.errstate(over="ignore", invalid="ignore"):
        check_form("gla_chunked", learner.gla_chunked, (q, k, v, g), gla.recurrent(q, k, v, g),
                   kwargs=dict(chunk_size=32),
                   where=f"[{label(case)}, g in [-60, -20]: exp(-G) overflows, keep exponents <= 0]", chunk_size=32)


def test_gla_chunked_loops_over_chunks(learner):
    def call(T, chunk_size):
        args, _ = gla.example_inputs(B=1, T=T, H=1, K=4, V=4, seed=T)
        return args, dict(chunk_size=chunk_size)

    assert_no_token_loop("gla_chunked", learner.gla_chunked, call, chunked=True)
