"""Check for exercise 21 (you do not need to edit this file): one token's backward and the whole recurrent
backward pass of DeltaNet against minilin.mixers.deltanet's recurrent_backward, and against central finite
differences of L = <do, o> + <dstate, S_T>, in float64: with and without an initial state and a dstate,
the default scale and another one, and the final state's gradient alone (do = 0); and the WY form's
backward against the exact derivative of <dW, W> + <dU, U> (the complex-step derivative through
minilin.chunking.unit_lower_inverse) and central finite differences."""
import numpy as np

from minilin import examples
from minilin.chunking import unit_lower_inverse
from minilin.course.checks import SEQUENCE_CASES, check_gradients, label
from minilin.mixers import _delta_rule, deltanet

NAMES = ("dq", "dk", "dv", "dbeta", "dinitial_state")
DIMS = ("B T H K", "B T H K", "B T H V", "B T H", "B H K V")
STEP_NAMES = ("dS_prev", "dq_t", "dk_t", "dv_t", "dbeta_t")
STEP_DIMS = ("B H K V", "B H K", "B H K", "B H V", "B H")


def _inputs(case, seed):
    (q, k, v, beta), _ = deltanet.example_inputs(**case, seed=seed)
    rng = np.random.default_rng(seed + 1000)
    do = rng.standard_normal(v.shape)
    S0 = rng.standard_normal((case["B"], case["H"], case["K"], case["V"]))
    dS = rng.standard_normal(S0.shape)
    return q, k, v, beta, do, S0, dS


def test_delta_step_backward(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 600):
        q, k, v, beta, do, S_prev, dS = _inputs(case, seed)
        q_t, k_t, v_t, beta_t, do_t = q[:, 0], k[:, 0], v[:, 0], beta[:, 0], do[:, 0]
        expected = deltanet.recurrent_backward(q_t[:, None], k_t[:, None], v_t[:, None], beta_t[:, None],
                                               do=do_t[:, None], dstate=dS, scale=1.0, initial_state=S_prev)
        got = learner.delta_step_backward(S_prev, q_t, k_t, v_t, beta_t, do_t, dS)

        def loss(S_prev, q_t, k_t, v_t, beta_t):
            o_t, S_t = _delta_rule.step(q_t, k_t, v_t, None, beta_t, S_prev)
            return float(np.sum(do_t * o_t) + np.sum(dS * S_t))

        check_gradients("delta_step_backward(S_prev, q_t, k_t, v_t, beta_t, do_t, dS_t)", got,
                        (expected.dinitial_state, expected.dq[:, 0], expected.dk[:, 0], expected.dv[:, 0],
                         expected.dbeta[:, 0]), names=STEP_NAMES, dims=STEP_DIMS,
                        where=f"[B={case['B']} H={case['H']} K={case['K']} V={case['V']}]",
                        factors={"beta_t": beta_t},
                        loss=loss, inputs=(S_prev, q_t, k_t, v_t, beta_t), seed=seed)


def _loss(do, dS, scale):
    def loss(q, k, v, beta, S0):
        s = q.shape[-1] ** -0.5 if scale is None else scale
        o, S = _delta_rule.recurrent(s * q, k, v, None, beta, S0)   # the engine: no range checks on beta +- h d
        return float(np.sum(do * o) + (0.0 if dS is None else np.sum(dS * S)))
    return loss


def _check(learner, case, q, k, v, beta, do, S0, dS, scale, where, seed):
    expected = deltanet.recurrent_backward(q, k, v, beta, do=do, dstate=dS, scale=scale, initial_state=S0)
    got = learner.deltanet_recurrent_backward(q, k, v, beta, do=do, dstate=dS, scale=scale, initial_state=S0)
    s = case["K"] ** -0.5 if scale is None else scale
    check_gradients(f"deltanet_recurrent_backward(scale={scale})", got, tuple(expected), names=NAMES, dims=DIMS,
                    where=f"[{label(case)}{where}]", scales={"scale": s, "K ** -0.5": case["K"] ** -0.5},
                    factors={"beta_t": beta}, loss=_loss(do, dS, scale), inputs=(q, k, v, beta, S0), seed=seed)


def test_deltanet_recurrent_backward(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 610):
        q, k, v, beta, do, S0, dS = _inputs(case, seed)
        for scale, initial_state, dstate in ((None, None, None), (0.6, S0, dS), (None, S0, None), (0.6, None, dS)):
            where = ((", initial_state given" if initial_state is not None else "")
                     + (", dstate given" if dstate is not None else ""))
            _check(learner, case, q, k, v, beta, do, initial_state, dstate, scale, where, seed)


def test_deltanet_recurrent_backward_final_state_alone(learner):
    case = SEQUENCE_CASES[0]
    q, k, v, beta, do, S0, dS = _inputs(case, 620)
    _check(learner, case, q, k, v, beta, np.zeros_like(do), S0, dS, None, ", do = 0: the final state's gradient alone",
           620)


def test_deltanet_recurrent_backward_strong_writes(learner):
    """beta close to 1 with repeated keys: the memory is overwritten, and the adjoint passes back through
    I - beta k k^T, which nearly removes the k direction."""
    case = dict(B=1, T=30, H=2, K=4, V=3)
    q, k, v, beta, do, S0, dS = _inputs(case, 630)
    rng = examples.generator(631)
    k = examples.unit_vectors(rng, (1, 3, 2, 4))[:, rng.integers(0, 3, 30)]      # three keys, each used often
    beta = examples.uniform(rng, 0.9, 1.0, beta.shape)
    _check(learner, case, q, k, v, beta, do, S0, dS, None, ", three keys repeated, beta in [0.9, 1]", 630)


def _wy(k, v, beta):
    """Exercise 12's (W, U) through minilin's triangular inverse; works on complex arrays too."""
    k_beta = beta[..., None] * k
    T = unit_lower_inverse(k_beta @ np.swapaxes(k, -1, -2))     # (I + tril(., -1))^-1
    return T @ k_beta, T @ (beta[..., None] * v)


def _exact_wy_gradients(k, v, beta, dW, dU):
    """d/d(k, v, beta) of <dW, W> + <dU, U>, entry by entry, by the complex-step derivative: with x -> x + i h
    for a tiny h, Im L / h is the derivative to rounding (no difference of two nearby numbers is taken).
    One entry position at a time, in every chunk of the batch at once (the chunks are independent)."""
    h = 1e-30
    grads = []
    for which, x in enumerate((k, v, beta)):
        grad = np.empty(x.shape)
        for index in np.ndindex(*x.shape[len(beta.shape) - 1:]):          # positions inside one chunk
            inputs = [k.astype(complex), v.astype(complex), beta.astype(complex)]
            inputs[which][(...,) + index] += 1j * h
            W, U = _wy(*inputs)
            per_chunk = np.sum(dW * W, axis=(-2, -1)) + np.sum(dU * U, axis=(-2, -1))
            grad[(...,) + index] = per_chunk.imag / h
        grads.append(grad)
    return tuple(grads)


def test_wy_backward(learner):
    for seed, (lead, C, K, V) in enumerate([((), 1, 3, 2), ((2,), 5, 4, 3), ((2, 3), 16, 8, 5), ((1,), 24, 6, 6)], 640):
        rng = examples.generator(seed)
        k = examples.unit_vectors(rng, (*lead, C, K))
        v = examples.normal(rng, (*lead, C, V))
        beta = examples.uniform(rng, 0, 1, (*lead, C))
        dW, dU = examples.normal(rng, (*lead, C, K)), examples.normal(rng, (*lead, C, V))

        def loss(k, v, beta):
            W, U = _wy(k, v, beta)
            return float(np.sum(dW * W) + np.sum(dU * U))

        got = learner.wy_backward(k, v, beta, dW, dU)
        check_gradients("wy_backward(k, v, beta, dW, dU)", got, _exact_wy_gradients(k, v, beta, dW, dU),
                        names=("dk", "dv", "dbeta"), dims=("", "", ""), where=f"[chunks {list(lead)}, C={C}, K={K}, V={V}]",
                        factors={"beta": beta}, loss=loss, inputs=(k, v, beta), seed=seed)
