"""Check for exercise 13 (you do not need to edit this file): both forms of Gated DeltaNet against the
recurrence of minilin.mixers.gated_deltanet, in float64, each with the default scale and another one,
including decays strong enough that exp(-G) overflows; and a count of the chunked form's Python lines
(chunks, not tokens)."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_no_token_loop, check_form, label
from minilin.mixers import gated_deltanet


def _reference(q, k, v, g, beta, scale=None, chunk_size=None):
    return gated_deltanet.recurrent(q, k, v, g, beta, scale=scale)


def test_gated_deltanet_recurrent(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 190):
        (q, k, v, g, beta), _ = gated_deltanet.example_inputs(**case, seed=seed)
        for scale in (None, 0.8):
            check_form("gated_deltanet_recurrent", learner.gated_deltanet_recurrent, (q, k, v, g, beta),
                       gated_deltanet.recurrent(q, k, v, g, beta, scale=scale), kwargs=dict(scale=scale),
                       where=f"[{label(case)}]", reference=_reference)


def test_gated_deltanet_chunked(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 200):
        (q, k, v, g, beta), _ = gated_deltanet.example_inputs(**case, seed=seed)
        expected = gated_deltanet.recurrent(q, k, v, g, beta, scale=0.8)
        for C in (16, 1, 64, 5):
            check_form("gated_deltanet_chunked", learner.gated_deltanet_chunked, (q, k, v, g, beta), expected,
                       kwargs=dict(scale=0.8, chunk_size=C), where=f"[{label(case)}]", chunk_size=C,
                       reference=_reference)


def test_gated_deltanet_chunked_strong_decay(learner):
    case = dict(B=1, T=90, H=2, K=8, V=4)
    (q, k, v, _, beta), _ = gated_deltanet.example_inputs(**case, seed=210)
    g = np.random.default_rng(211).uniform(-30.0, -5.0, (1, 90, 2))   # a chunk of 64 sums to about -1100
    with np.errstate(over="ignore", invalid="ignore"):
        check_form("gated_deltanet_chunked", learner.gated_deltanet_chunked, (q, k, v, g, beta),
                   gated_deltanet.recurrent(q, k, v, g, beta), kwargs=dict(chunk_size=64),
                   where=f"[{label(case)}, g in [-30, -5]: exp(-G) overflows, keep exponents <= 0]", chunk_size=64)


def test_gated_deltanet_chunked_loops_over_chunks(learner):
    def call(T, chunk_size):
        args, _ = gated_deltanet.example_inputs(B=1, T=T, H=1, K=4, V=4, seed=T)
        return args, dict(chunk_size=chunk_size)

    assert_no_token_loop("gated_deltanet_chunked", learner.gated_deltanet_chunked, call, chunked=True)
