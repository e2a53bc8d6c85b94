"""Check for exercise 11 (you do not need to edit this file): the delta-rule write against
minilin.mixers.deltanet.step, and the recurrence against minilin.mixers.deltanet, in float64, from zeros and
from a given state (which must come back unchanged), with the default scale and another one."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_close, check_form, label
from minilin.mixers import deltanet


def test_delta_write(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 130):
        (q, k, v, beta), _ = deltanet.example_inputs(**case, seed=seed)
        S = np.random.default_rng(seed).standard_normal((case["B"], case["H"], case["K"], case["V"]))
        _, expected = deltanet.step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], state=S)
        got = learner.delta_write(S.copy(), k[:, 0], v[:, 0], beta[:, 0])
        assert_close(f"delta_write(S, k_t, v_t, beta_t) [{label(case)}]", got, expected, dims="B H K V")
    # With a unit key and beta = 1, the memory holds exactly v_t for k_t afterwards.
    k_t = k[:, 0]
    got = learner.delta_write(S.copy(), k_t, v[:, 0], np.ones_like(beta[:, 0]))
    assert_close("delta_write with beta = 1: the read S^T k_t afterwards", np.einsum("bhkv,bhk->bhv", got, k_t),
                 v[:, 0], dims="B H V")


def test_deltanet_recurrent(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 140):
        (q, k, v, beta), _ = deltanet.example_inputs(**case, seed=seed)
        check_form("deltanet_recurrent", learner.deltanet_recurrent, (q, k, v, beta), deltanet.recurrent(q, k, v, beta),
                   where=f"[{label(case)}]", reference=deltanet.recurrent)


def test_deltanet_recurrent_from_a_state(learner):
    case = SEQUENCE_CASES[0]
    (q, k, v, beta), _ = deltanet.example_inputs(**case, seed=150)
    S0 = np.random.default_rng(151).standard_normal((case["B"], case["H"], case["K"], case["V"]))
    for scale in (0.6, None):
        check_form("deltanet_recurrent", learner.deltanet_recurrent, (q, k, v, beta),
                   deltanet.recurrent(q, k, v, beta, scale=scale, initial_state=S0),
                   kwargs=dict(scale=scale, initial_state=S0), where=f"[{label(case)}]", reference=deltanet.recurrent)
