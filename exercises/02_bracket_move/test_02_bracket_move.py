"""Check for exercise 02 (you do not need to edit this file): both forms of linear attention against
minilin.mixers.linear_attention, in float64, with the default scale and another one; the parallel form
without a loop over tokens; and the FLOP counts against the formulas of the docstring."""
from minilin.course.checks import (SEQUENCE_CASES, assert_close, assert_equal, assert_no_token_loop, check_form,
                                   label)
from minilin.mixers import linear_attention

SIZES = [(1, 1, 1), (7, 3, 5), (64, 64, 64), (100, 16, 48), (4096, 128, 64)]


def test_parallel(learner):
    for seed, case in enumerate(SEQUENCE_CASES):
        (q, k, v), _ = linear_attention.example_inputs(**case, seed=seed)
        for scale in (None, 0.7):
            expected, _ = linear_attention.parallel(q, k, v, scale=scale)
            check_form("linear_attention_parallel", learner.linear_attention_parallel, (q, k, v), expected,
                       kwargs=dict(scale=scale), where=f"[{label(case)}]", outputs="o", dims="B T H V",
                       reference=lambda q, k, v, scale: linear_attention.parallel(q, k, v, scale=scale)[0])

    def call(T, chunk_size):
        (q, k, v), _ = linear_attention.example_inputs(B=1, T=T, H=1, K=4, V=4, seed=T)
        return (q, k, v), {}

    assert_no_token_loop("linear_attention_parallel", learner.linear_attention_parallel, call, chunked=False)


def test_recurrent(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 20):
        (q, k, v), _ = linear_attention.example_inputs(**case, seed=seed)
        for scale in (None, 0.7):
            check_form("linear_attention_recurrent", learner.linear_attention_recurrent, (q, k, v),
                       linear_attention.recurrent(q, k, v, scale=scale), kwargs=dict(scale=scale),
                       where=f"[{label(case)}]", reference=linear_attention.recurrent)


def test_flops_and_crossover(learner):
    for n, d_k, d_v in SIZES:
        assert_equal(f"flops_quadratic(n={n}, d_k={d_k}, d_v={d_v})", learner.flops_quadratic(n, d_k, d_v),
                     2 * n * n * (d_k + d_v))
        assert_equal(f"flops_linear(n={n}, d_k={d_k}, d_v={d_v})", learner.flops_linear(n, d_k, d_v),
                     4 * n * d_k * d_v)
    for d_k, d_v in [(64, 64), (16, 48), (3, 5), (128, 1)]:
        assert_close(f"crossover(d_k={d_k}, d_v={d_v})", learner.crossover(d_k, d_v), 2.0 * d_k * d_v / (d_k + d_v))
