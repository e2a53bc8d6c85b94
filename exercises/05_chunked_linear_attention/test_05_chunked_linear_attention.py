"""Check for exercise 05 (you do not need to edit this file): chunked linear attention against the
recurrence of minilin.mixers.linear_attention, in float64, for T = 1, T % C != 0, T % C == 0, C = 1."""
from minilin.course.checks import SEQUENCE_CASES, assert_close, label, unpack
from minilin.mixers import linear_attention


def test_chunked_linear_attention(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 50):
        (q, k, v), _ = linear_attention.example_inputs(**case, seed=seed)
        expected_o, expected_S = linear_attention.recurrent(q, k, v)
        for C in (16, 1, 64, 5):
            o, S = unpack("chunked_linear_attention(...)", learner.chunked_linear_attention(q, k, v, chunk_size=C),
                          2, "(o, final_state)")
            where = f"[{label(case, chunk_size=C)}]"
            assert_close(f"chunked_linear_attention: o {where}", o, expected_o, dims="B T H V", chunk_size=C)
            assert_close(f"chunked_linear_attention: final state {where}", S, expected_S, dims="B H K V")


def test_scale(learner):
    case = SEQUENCE_CASES[1]
    (q, k, v), _ = linear_attention.example_inputs(**case, seed=59)
    expected_o, expected_S = linear_attention.recurrent(q, k, v, scale=0.25)
    o, S = unpack("chunked_linear_attention(...)", learner.chunked_linear_attention(q, k, v, scale=0.25, chunk_size=8),
                  2, "(o, final_state)")
    assert_close(f"chunked_linear_attention(scale=0.25): o [{label(case, chunk_size=8)}]", o, expected_o,
                 dims="B T H V", chunk_size=8)
    assert_close(f"chunked_linear_attention(scale=0.25): final state [{label(case, chunk_size=8)}]", S, expected_S,
                 dims="B H K V")
