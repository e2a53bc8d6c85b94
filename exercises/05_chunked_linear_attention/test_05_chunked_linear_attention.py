"""Check for exercise 05 (you do not need to edit this file): chunked linear attention against the
recurrence of minilin.mixers.linear_attention, in float64, for T = 1, T % C != 0, T % C == 0, C = 1, with the
default scale and another one; and a count of the Python lines it runs, which must follow the number of
chunks, not of tokens."""
from minilin.course.checks import SEQUENCE_CASES, assert_no_token_loop, check_form, label
from minilin.mixers import linear_attention


def _reference(q, k, v, scale=None, chunk_size=None):
    return linear_attention.recurrent(q, k, v, scale=scale)


def test_chunked_linear_attention(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 50):
        (q, k, v), _ = linear_attention.example_inputs(**case, seed=seed)
        expected = linear_attention.recurrent(q, k, v)
        for C in (16, 1, 64, 5):
            check_form("chunked_linear_attention", learner.chunked_linear_attention, (q, k, v), expected,
                       kwargs=dict(chunk_size=C), where=f"[{label(case)}]", chunk_size=C, reference=_reference)


def test_scale(learner):
    case = SEQUENCE_CASES[0]
    (q, k, v), _ = linear_attention.example_inputs(**case, seed=59)
    check_form("chunked_linear_attention", learner.chunked_linear_attention, (q, k, v),
               linear_attention.recurrent(q, k, v, scale=0.25), kwargs=dict(scale=0.25, chunk_size=8),
               where=f"[{label(case)}]", chunk_size=8, reference=_reference)


def test_loops_over_chunks(learner):
    def call(T, chunk_size):
        (q, k, v), _ = linear_attention.example_inputs(B=1, T=T, H=1, K=4, V=4, seed=T)
        return (q, k, v), dict(chunk_size=chunk_size)

    assert_no_token_loop("chunked_linear_attention", learner.chunked_linear_attention, call, chunked=True)
