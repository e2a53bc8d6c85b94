"""Check for exercise 20 (you do not need to edit this file): the chunk states' adjoints and the chunked
backward pass of simple GLA against minilin.mixers.simple_gla's backward, and the gradients against
central finite differences of L = <do, o> + <dstate, S_T>, in float64: T = 1, T % C != 0, C = 1, K != V,
with and without an initial state and a dstate, the default scale and another one, the final state's
gradient alone (do = 0), gates strong enough that exp(-G) overflows; and a count of the Python lines each
function runs (they must follow the chunks, not the tokens)."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_close, assert_no_token_loop, check_gradients, label
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


def _expected_chunk_adjoints(q, k, v, g, do, dS, scale, C):
    """Entry n: minilin's gradient of the initial state of the tokens from n C on; entry N: dstate."""
    B, T, H, K = q.shape
    N = -(-T // C)
    out = np.empty((B, N + 1, H, K, v.shape[-1]))
    out[:, N] = 0 if dS is None else dS
    for n in range(N):
        s = n * C
        out[:, n] = simple_gla.recurrent_backward(q[:, s:], k[:, s:], v[:, s:], g[:, s:], do=do[:, s:], dstate=dS,
                                                  scale=scale, initial_state=np.zeros_like(out[:, N])).dinitial_state
    return out


def test_chunk_state_adjoints(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 500):
        q, k, v, g, do, _, dS = _inputs(case, seed)
        for C, scale, dstate in ((16, None, None), (5, 0.5, dS), (64, None, dS), (1, 0.5, None)):
            got = learner.chunk_state_adjoints(q, do, g, scale=scale, dstate=dstate, chunk_size=C)
            where = f"[{label(case, chunk_size=C)}, {'dstate given' if dstate is not None else 'dstate=None'}]"
            s = case["K"] ** -0.5 if scale is None else scale
            assert_close(f"chunk_state_adjoints(scale={scale}): dS {where}", got,
                         _expected_chunk_adjoints(q, k, v, g, do, dstate, scale, C), dims="B N H K V",
                         kind="gradient", scales={"scale": s, "K ** -0.5": case["K"] ** -0.5})


def _loss(do, dS, scale):
    def loss(q, k, v, g, S0):
        o, S = simple_gla.recurrent(q, k, v, g, scale=scale, initial_state=S0)
        return float(np.sum(do * o) + (0.0 if dS is None else np.sum(dS * S)))
    return loss


def _check(learner, case, q, k, v, g, do, S0, dS, scale, C, where, seed):
    expected = simple_gla.chunked_backward(q, k, v, g, do=do, dstate=dS, scale=scale, initial_state=S0, chunk_size=C)
    got = learner.chunked_backward(q, k, v, g, do=do, dstate=dS, scale=scale, initial_state=S0, chunk_size=C)
    s = case["K"] ** -0.5 if scale is None else scale
    check_gradients(f"chunked_backward(scale={scale}, chunk_size={C})", got, tuple(expected), names=NAMES, dims=DIMS,
                    where=f"[{label(case)}{where}]", chunk_size=C, scales={"scale": s, "K ** -0.5": case["K"] ** -0.5},
                    factors={"exp(g_t)": np.exp(g)}, loss=_loss(do, dS, scale), inputs=(q, k, v, g, S0), seed=seed)


def test_chunked_backward(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 510):
        q, k, v, g, do, S0, dS = _inputs(case, seed)
        for C, scale, initial_state, dstate in ((16, None, None, None), (5, 0.5, S0, dS), (64, None, S0, None),
                                                (1, 0.5, None, dS)):
            where = ((", initial_state given" if initial_state is not None else "")
                     + (", dstate given" if dstate is not None else ""))
            _check(learner, case, q, k, v, g, do, initial_state, dstate, scale, C, where, seed)


def test_chunked_backward_final_state_alone(learner):
    case = SEQUENCE_CASES[0]
    q, k, v, g, do, S0, dS = _inputs(case, 520)
    _check(learner, case, q, k, v, g, np.zeros_like(do), S0, dS, None, 16, ", do = 0: the final state's gradient alone", 520)


def test_chunked_backward_strong_gates(learner):
    case = dict(B=1, T=90, H=2, K=8, V=4)
    q, k, v, g, do, S0, dS = _inputs(case, 530, gates=(-30.0, -5.0))   # a chunk of 64 sums to about -1100
    with np.errstate(over="ignore", invalid="ignore"):
        _check(learner, case, q, k, v, g, do, S0, dS, None, 64,
               ", g in [-30, -5]: exp(-G) overflows, keep every exponent <= 0", 530)


def _call(T, chunk_size):
    q, k, v, g, do, S0, dS = _inputs(dict(B=1, T=T, H=1, K=4, V=4), T)
    return (q, k, v, g), dict(do=do, dstate=dS, initial_state=S0, chunk_size=chunk_size)


def test_chunk_state_adjoints_loop_over_chunks(learner):
    def call(T, chunk_size):
        (q, k, v, g), kwargs = _call(T, chunk_size)
        return (q, kwargs["do"], g), dict(dstate=kwargs["dstate"], chunk_size=chunk_size)

    assert_no_token_loop("chunk_state_adjoints", learner.chunk_state_adjoints, call, chunked=True)


def test_chunked_backward_loops_over_chunks(learner):
    assert_no_token_loop("chunked_backward", learner.chunked_backward, _call, chunked=True)
