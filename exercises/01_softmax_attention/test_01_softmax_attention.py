"""Check for exercise 01 (you do not need to edit this file): causal_attention and decode_step against
minilin.mixers.attention, in float64, on random inputs over several shapes, with the default scale and
another one, and with scores in the hundreds (where exp without the row max subtracted overflows)."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_close, assert_no_token_loop, check_form, label, unpack
from minilin.mixers import attention

LOUD = 30.0   # q and k this many times larger: scores of several hundred, exp(score) = inf in float64


def test_causal_attention(learner):
    for seed, case in enumerate(SEQUENCE_CASES):
        (q, k, v), _ = attention.example_inputs(**case, seed=seed)
        for scale in (None, 0.3):
            expected, _ = attention.parallel(q, k, v, scale=scale)
            check_form("causal_attention", learner.causal_attention, (q, k, v), expected, kwargs=dict(scale=scale),
                       where=f"[{label(case)}]", outputs="o", dims="B T H V")
    case = SEQUENCE_CASES[0]
    (q, k, v), _ = attention.example_inputs(**case, seed=5)
    expected, _ = attention.parallel(LOUD * q, LOUD * k, v)
    with np.errstate(all="ignore"):
        check_form("causal_attention", learner.causal_attention, (LOUD * q, LOUD * k, v), expected,
                   where=f"[{label(case)}, q and k times {LOUD:g}: scores in the hundreds; subtract each row's max "
                         "before exp]", outputs="o", dims="B T H V")


def test_causal_attention_is_parallel(learner):
    def call(T, chunk_size):
        (q, k, v), _ = attention.example_inputs(B=1, T=T, H=1, K=4, V=4, seed=T)
        return (q, k, v), {}

    assert_no_token_loop("causal_attention", learner.causal_attention, call, chunked=False)


def _decode(learner, q, k, v, scale):
    """decode_step for t = 0..T-1 from an empty cache: the outputs stacked [B, T, H, V]."""
    B, T, H, K = q.shape
    cache_k, cache_v = np.zeros((B, 0, H, K)), np.zeros((B, 0, H, v.shape[-1]))
    outputs = []
    for t in range(T):
        o_t, cache_k, cache_v = unpack("decode_step(...)", learner.decode_step(
            q[:, t], k[:, t], v[:, t], cache_k, cache_v, scale=scale), 3, "(o_t, cache_k, cache_v)")
        outputs.append(o_t)
    return np.stack(outputs, axis=1)


def test_decode_step(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 10):
        (q, k, v), _ = attention.example_inputs(**case, seed=seed)
        # One step on top of a cache of P = T - 1 earlier tokens (P = 0 when T = 1).
        P = case["T"] - 1
        cache = attention.KVCache(k[:, :P], v[:, :P])
        expected_o, expected_cache = attention.step(q[:, P], k[:, P], v[:, P], state=cache if P else None)
        result = learner.decode_step(q[:, P], k[:, P], v[:, P], k[:, :P], v[:, :P])
        o_t, cache_k, cache_v = unpack("decode_step(...)", result, 3, "(o_t, cache_k, cache_v)")
        where = f"[{label(case)}, P={P}]"
        scales = {"K ** -0.5": case["K"] ** -0.5}
        assert_close(f"decode_step: o_t {where}", o_t, expected_o, dims="B H V", scales=scales)
        assert_close(f"decode_step: cache_k {where}", cache_k, expected_cache.k, dims="B P H K")
        assert_close(f"decode_step: cache_v {where}", cache_v, expected_cache.v, dims="B P H V")
        # A whole decode from an empty cache equals causal attention, token by token.
        expected, _ = attention.parallel(q, k, v, scale=0.5)
        assert_close(f"decode_step(scale=0.5) for t = 0..T-1 from an empty cache, stacked [{label(case)}]",
                     _decode(learner, q, k, v, 0.5), expected, dims="B T H V", scales={"scale": 0.5})
    case = SEQUENCE_CASES[0]
    (q, k, v), _ = attention.example_inputs(**case, seed=15)
    expected, _ = attention.parallel(LOUD * q, LOUD * k, v)
    with np.errstate(all="ignore"):
        got = _decode(learner, LOUD * q, LOUD * k, v, None)
    assert_close(f"decode_step for t = 0..T-1, stacked [{label(case)}, q and k times {LOUD:g}: scores in the "
                 "hundreds; subtract the max before exp]", got, expected, dims="B T H V")
