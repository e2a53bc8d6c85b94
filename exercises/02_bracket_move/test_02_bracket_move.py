"""Check for exercise 02 (you do not need to edit this file): both forms of linear attention against
minilin.mixers.linear_attention, in float64, and the FLOP counts against the formulas of the docstring."""
from minilin.course.checks import SEQUENCE_CASES, assert_close, assert_equal, assert_output_and_state, label
from minilin.mixers import linear_attention

SIZES = [(1, 1, 1), (7, 3, 5), (64, 64, 64), (100, 16, 48), (4096, 128, 64)]


def test_parallel(learner):
    for seed, case in enumerate(SEQUENCE_CASES):
        (q, k, v), _ = linear_attention.example_inputs(**case, seed=seed)
        for scale in (None, 0.7):
            expected, _ = linear_attention.parallel(q, k, v, scale=scale)
            got = learner.linear_attention_parallel(q, k, v, scale=scale)
            assert_close(f"linear_attention_parallel(scale={scale}) [{label(case)}]", got, expected, dims="B T H V")


def test_recurrent(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 20):
        (q, k, v), _ = linear_attention.example_inputs(**case, seed=seed)
        for scale in (None, 0.7):
            assert_output_and_state("linear_attention_recurrent",
                                    learner.linear_attention_recurrent(q, k, v, scale=scale),
                                    linear_attention.recurrent(q, k, v, scale=scale),
                                    f"(scale={scale}) [{label(case)}]")


def test_flops_and_crossover(learner):
    for n, d_k, d_v in SIZES:
        assert_equal(f"flops_quadratic(n={n}, d_k={d_k}, d_v={d_v})", learner.flops_quadratic(n, d_k, d_v),
                     2 * n * n * (d_k + d_v))
        assert_equal(f"flops_linear(n={n}, d_k={d_k}, d_v={d_v})", learner.flops_linear(n, d_k, d_v),
                     4 * n * d_k * d_v)
    for d_k, d_v in [(64, 64), (16, 48), (3, 5), (128, 1)]:
        assert_close(f"crossover(d_k={d_k}, d_v={d_v})", learner.crossover(d_k, d_v), 2.0 * d_k * d_v / (d_k + d_v))
