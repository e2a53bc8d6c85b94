"""Check for exercise 05 (you do not need to edit this file): chunked linear attention against the
recurrence of minilin.mixers.linear_attention, in float64, for T = 1, T % C != 0, T % C == 0, C = 1."""
from minilin.course.checks import SEQUENCE_CASES, assert_output_and_state, label
from minilin.mixers import linear_attention


def test_chunked_linear_attention(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 50):
        (q, k, v), _ = linear_attention.example_inputs(**case, seed=seed)
        expected = linear_attention.recurrent(q, k, v)
        for C in (16, 1, 64, 5):
            assert_output_and_state("chunked_linear_attention", learner.chunked_linear_attention(q, k, v, chunk_size=C),
                                    expected, f"[{label(case, chunk_size=C)}]", chunk_size=C)


def test_scale(learner):
    case = SEQUENCE_CASES[1]
    (q, k, v), _ = linear_attention.example_inputs(**case, seed=59)
    assert_output_and_state("chunked_linear_attention",
                            learner.chunked_linear_attention(q, k, v, scale=0.25, chunk_size=8),
                            linear_attention.recurrent(q, k, v, scale=0.25), f"[{label(case, chunk_size=8)}]",
                            args="(scale=0.25)", chunk_size=8)
