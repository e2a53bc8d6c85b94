"""Check for exercise 12 (you do not need to edit this file): the WY representation against a triangular
inverse with minilin.chunking.unit_lower_inverse, and the chunked form against the recurrence of
minilin.mixers.deltanet, in float64, with the default scale and another one; and a count of the chunked
form's Python lines, which must follow the chunks, not the tokens (its own code may not call minilin's
DeltaNet, nor loop over tokens)."""
import numpy as np

from minilin import examples
from minilin.chunking import unit_lower_inverse
from minilin.course.checks import SEQUENCE_CASES, assert_close, assert_no_token_loop, check_form, label, unpack
from minilin.mixers import deltanet


def test_wy_representation(learner):
    for seed, (lead, C, K, V) in enumerate([((), 1, 3, 2), ((2,), 5, 4, 3), ((2, 3), 16, 8, 5), ((1,), 64, 16, 16)]):
        rng = examples.generator(seed + 160)
        k = examples.unit_vectors(rng, (*lead, C, K))
        v = examples.normal(rng, (*lead, C, V))
        beta = examples.uniform(rng, 0, 1, (*lead, C))
        A = np.tril(beta[..., None] * (k @ np.swapaxes(k, -1, -2)), -1)
        T = unit_lower_inverse(A)                              # (I + A)^-1
        expected_W = T @ (beta[..., None] * k)
        expected_U = T @ (beta[..., None] * v)
        W, U = unpack("wy_representation(k, v, beta)", learner.wy_representation(k, v, beta), 2, "(W, U)")
        where = f"[chunks {list(lead)}, C={C}, K={K}, V={V}]"
        assert_close(f"wy_representation: W {where}", W, expected_W)
        assert_close(f"wy_representation: U {where}", U, expected_U)


def _reference(q, k, v, beta, scale=None, chunk_size=None):
    return deltanet.recurrent(q, k, v, beta, scale=scale)


def test_deltanet_chunked(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 170):
        (q, k, v, beta), _ = deltanet.example_inputs(**case, seed=seed)
        expected = deltanet.recurrent(q, k, v, beta)
        for C in (16, 1, 64, 5):
            check_form("deltanet_chunked", learner.deltanet_chunked, (q, k, v, beta), expected,
                       kwargs=dict(chunk_size=C), where=f"[{label(case)}]", chunk_size=C, reference=_reference)


def test_deltanet_chunked_scale(learner):
    case = dict(B=1, T=50, H=2, K=8, V=4)
    (q, k, v, beta), _ = deltanet.example_inputs(**case, seed=180)
    check_form("deltanet_chunked", learner.deltanet_chunked, (q, k, v, beta), deltanet.recurrent(q, k, v, beta, scale=1.5),
               kwargs=dict(scale=1.5, chunk_size=16), where=f"[{label(case)}]", chunk_size=16, reference=_reference)


def test_deltanet_chunked_loops_over_chunks(learner):
    """The chunked form's Python work follows the chunks; a loop over the tokens of a chunk (a forward
    substitution) may live in wy_representation."""
    def call(T, chunk_size):
        args, _ = deltanet.example_inputs(B=1, T=T, H=1, K=4, V=4, seed=T)
        return args, dict(chunk_size=chunk_size)

    assert_no_token_loop("deltanet_chunked", learner.deltanet_chunked, call, chunked=True,
                         exempt=("wy_representation",))
