"""Check for exercise 19 (you do not need to edit this file): the state's adjoints, the gate's gradient and
the whole recurrent backward pass of simple GLA against minilin.mixers.simple_gla's recurrent_backward,
and the gradients against central finite differences of L = <do, o> + <dstate, S_T>, in float64: with
and without an initial state and a dstate, the default scale and another one, the final state's gradient
alone (do = 0), and gates down to -20."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_close, check_gradients, label
from minilin.mixers import simple_gla

NAMES = ("dq", "dk", "dv", "dg", "dinitial_state")
DIMS = ("B T H K", "B T H K", "B T H V", "B T H", "B H K V")


def _inputs(case, seed, gates=None):
    (q, k, v, g), _ = simple_gla.example_inputs(**case, seed=seed)
    rng = np.random.default_rng(seed + 1000)
    if gates is not None:
        g = rng.uniform(*gates, g.shape)
    do = rng.standard_normal(v.shape)
    S0 = rng.standard_normal((case["B"], case["H"], case["K"], case["V"]))
    dS = rng.standard_normal(S0.shape)
    return q, k, v, g, do, S0, dS


def _expected_adjoints(q, k, v, g, do, dS, scale):
    """Sbar_t = dL/dS_t from minilin: the gradient of the initial state of the tokens after t (the adjoint
    carried back to S_t), plus S_t's own read q'_t do_t^T."""
    B, T, H, K = q.shape
    s = K ** -0.5 if scale is None else scale
    own = s * np.einsum("bthk,bthv->bthkv", q, do)
    later = np.empty_like(own)
    later[:, -1] = 0 if dS is None else dS
    for t in range(T - 1):
        later[:, t] = simple_gla.recurrent_backward(
            q[:, t + 1:], k[:, t + 1:], v[:, t + 1:], g[:, t + 1:], do=do[:, t + 1:], dstate=dS, scale=scale,
            initial_state=np.zeros((B, H, K, v.shape[-1]))).dinitial_state
    return own + later


def test_state_adjoints(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 400):
        q, k, v, g, do, _, dS = _inputs(case, seed)
        for scale, dstate in ((None, None), (0.5, dS)):
            got = learner.state_adjoints(q, do, g, scale=scale, dstate=dstate)
            where = f"[{label(case)}, {'dstate given' if dstate is not None else 'dstate=None'}]"
            assert_close(f"state_adjoints(scale={scale}): Sbar {where}", got,
                         _expected_adjoints(q, k, v, g, do, dstate, scale), dims="B T H K V", kind="gradient",
                         factors={"exp(g_t)": np.exp(g)},
                         scales={"scale": case["K"] ** -0.5 if scale is None else scale, "K ** -0.5": case["K"] ** -0.5})


def test_gate_gradient(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 410):
        q, k, v, g, do, S0, dS = _inputs(case, seed)
        for dstate, initial_state in ((None, None), (dS, S0)):
            grads = simple_gla.recurrent_backward(q, k, v, g, do=do, dstate=dstate, initial_state=initial_state)
            final = simple_gla.recurrent(q, k, v, g, initial_state=initial_state)[1]
            got = learner.gate_gradient(q, k, grads.dq, grads.dk, dstate=dstate,
                                        final_state=None if dstate is None else final)
            where = f"[{label(case)}, {'dstate and initial_state given' if dstate is not None else 'dstate=None'}]"
            assert_close(f"gate_gradient: dg {where}", got, grads.dg, dims="B T H", kind="gradient")


def _loss(do, dS, scale):
    def loss(q, k, v, g, S0):
        o, S = simple_gla.recurrent(q, k, v, g, scale=scale, initial_state=S0)
        return float(np.sum(do * o) + (0.0 if dS is None else np.sum(dS * S)))
    return loss


def _check(learner, case, q, k, v, g, do, S0, dS, scale, where, seed):
    expected = simple_gla.recurrent_backward(q, k, v, g, do=do, dstate=dS, scale=scale, initial_state=S0)
    got = learner.recurrent_backward(q, k, v, g, do=do, dstate=dS, scale=scale, initial_state=S0)
    s = case["K"] ** -0.5 if scale is None else scale
    check_gradients(f"recurrent_backward(scale={scale})", got, tuple(expected), names=NAMES, dims=DIMS,
                    where=f"[{label(case)}{where}]", scales={"scale": s, "K ** -0.5": case["K"] ** -0.5},
                    factors={"exp(g_t)": np.exp(g)},
                    loss=_loss(do, dS, scale), inputs=(q, k, v, g, S0), seed=seed)


def test_recurrent_backward(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 420):
        q, k, v, g, do, S0, dS = _inputs(case, seed)
        for scale, initial_state, dstate in ((None, None, None), (0.5, S0, dS), (None, S0, None), (0.5, None, dS)):
            where = ((", initial_state given" if initial_state is not None else "")
                     + (", dstate given" if dstate is not None else ""))
            _check(learner, case, q, k, v, g, do, initial_state, dstate, scale, where, seed)


def test_recurrent_backward_final_state_alone(learner):
    """do = 0: every gradient comes from <dstate, S_T> alone."""
    case = SEQUENCE_CASES[0]
    q, k, v, g, do, S0, dS = _inputs(case, 430)
    _check(learner, case, q, k, v, g, np.zeros_like(do), S0, dS, None, ", do = 0: the final state's gradient alone", 430)


def test_recurrent_backward_strong_gates(learner):
    case = dict(B=1, T=40, H=2, K=4, V=3)
    q, k, v, g, do, S0, dS = _inputs(case, 440, gates=(-20.0, -5.0))
    with np.errstate(over="ignore", invalid="ignore"):
        _check(learner, case, q, k, v, g, do, S0, dS, None, ", g in [-20, -5]", 440)
