"""Check for exercise 06 (you do not need to edit this file): the three forms of retention against
minilin.mixers.retnet, in float64, on random inputs with random per-head decays, each with the default
scale and another one; and counts of the Python lines the parallel and chunked forms run, which must not
grow with the tokens (parallel) or with the tokens per chunk (chunked)."""
import numpy as np

from minilin.chunking import decay_matrix
from minilin.course.checks import SEQUENCE_CASES, assert_close, assert_no_token_loop, check_form, label
from minilin.mixers import retnet


def _inputs(case, seed):
    (q, k, v), _ = retnet.example_inputs(**case, seed=seed)
    gamma = np.random.default_rng(seed + 1000).uniform(0.6, 0.999, case["H"])
    return q, k, v, gamma


def test_decay_mask(learner):
    for H, T, seed in [(1, 1, 0), (3, 7, 1), (2, 64, 2)]:
        gamma = np.random.default_rng(seed).uniform(0.5, 1.0, H)
        gamma[0] = 1.0                               # no decay at all is allowed too
        # gamma^(i - j) = exp(G_i - G_j) with G the cumulative sum of log gamma.
        G = np.cumsum(np.broadcast_to(np.log(gamma)[:, None], (H, T)), axis=1)
        assert_close(f"decay_mask(gamma, T={T}) with H={H}", learner.decay_mask(gamma, T), decay_matrix(G), dims="H I J")
    gamma = np.array([0.05])
    assert_close("decay_mask(gamma=[0.05], T=300) (tiny powers underflow to 0; negative ones must not appear)",
                 learner.decay_mask(gamma, 300), decay_matrix(np.cumsum(np.full((1, 300), np.log(0.05)), axis=1)),
                 dims="H I J")


def test_retnet_parallel(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 60):
        q, k, v, gamma = _inputs(case, seed)
        for scale in (None, 0.4):
            expected, _ = retnet.parallel(q, k, v, gamma=gamma, scale=scale)
            check_form("retnet_parallel", learner.retnet_parallel, (q, k, v, gamma), expected,
                       kwargs=dict(scale=scale), where=f"[{label(case)}]", outputs="o", dims="B T H V",
                       reference=lambda q, k, v, gamma, scale: retnet.parallel(q, k, v, gamma=gamma, scale=scale)[0])
    assert_no_token_loop("retnet_parallel", learner.retnet_parallel, _small, chunked=False)


def test_retnet_recurrent(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 70):
        q, k, v, gamma = _inputs(case, seed)
        for scale in (None, 0.4):
            check_form("retnet_recurrent", learner.retnet_recurrent, (q, k, v, gamma),
                       retnet.recurrent(q, k, v, gamma=gamma, scale=scale), kwargs=dict(scale=scale),
                       where=f"[{label(case)}]", reference=_reference)


def test_retnet_chunked(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 80):
        q, k, v, gamma = _inputs(case, seed)
        for scale in (0.3, None):
            expected = retnet.recurrent(q, k, v, gamma=gamma, scale=scale)
            for C in ((16, 1, 64, 5) if scale else (16,)):
                check_form("retnet_chunked", learner.retnet_chunked, (q, k, v, gamma), expected,
                           kwargs=dict(scale=scale, chunk_size=C), where=f"[{label(case)}]", chunk_size=C,
                           reference=_reference)
    assert_no_token_loop("retnet_chunked", learner.retnet_chunked,
                         lambda T, C: (_small(T, C)[0], dict(chunk_size=C)), chunked=True)


def _reference(q, k, v, gamma, scale=None, chunk_size=None):
    return retnet.recurrent(q, k, v, gamma=gamma, scale=scale)


def _small(T, chunk_size):
    q, k, v, gamma = _inputs(dict(B=1, T=T, H=2, K=4, V=4), T)
    return (q, k, v, gamma), {}
