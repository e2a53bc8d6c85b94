"""Check for exercise 01 (you do not need to edit this file): causal_attention and decode_step against
minilin.mixers.attention, in float64, on random inputs over several shapes."""
import numpy as np

from minilin.course.checks import SEQUENCE_CASES, assert_close, label, unpack
from minilin.mixers import attention


def test_causal_attention(learner):
    for seed, case in enumerate(SEQUENCE_CASES):
        (q, k, v), _ = attention.example_inputs(**case, seed=seed)
        for scale in (None, 0.3):
            expected, _ = attention.parallel(q, k, v, scale=scale)
            got = learner.causal_attention(q, k, v, scale=scale)
            assert_close(f"causal_attention(q, k, v, scale={scale}) [{label(case)}]", got, expected, dims="B T H V")


def test_decode_step(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 10):
        (q, k, v), _ = attention.example_inputs(**case, seed=seed)
        B, T, H, K, V = (case[d] for d in "BTHKV")
        # One step on top of a cache of P = T - 1 earlier tokens (P = 0 when T = 1).
        P = T - 1
        cache = attention.KVCache(k[:, :P], v[:, :P])
        expected_o, expected_cache = attention.step(q[:, P], k[:, P], v[:, P], state=cache if P else None)
        result = learner.decode_step(q[:, P], k[:, P], v[:, P], k[:, :P].copy(), v[:, :P].copy())
        o_t, cache_k, cache_v = unpack("decode_step(...)", result, 3, "(o_t, cache_k, cache_v)")
        where = f"[{label(case)}, P={P}]"
        assert_close(f"decode_step: o_t {where}", o_t, expected_o, dims="B H V")
        assert_close(f"decode_step: cache_k {where}", cache_k, expected_cache.k, dims="B P H K")
        assert_close(f"decode_step: cache_v {where}", cache_v, expected_cache.v, dims="B P H V")
        # A whole decode from an empty cache equals causal attention, token by token.
        expected, _ = attention.parallel(q, k, v, scale=0.5)
        cache_k, cache_v = np.zeros((B, 0, H, K)), np.zeros((B, 0, H, V))
        outputs = []
        for t in range(T):
            o_t, cache_k, cache_v = unpack("decode_step(...)", learner.decode_step(
                q[:, t], k[:, t], v[:, t], cache_k, cache_v, scale=0.5), 3, "(o_t, cache_k, cache_v)")
            outputs.append(o_t)
        assert_close(f"decode_step for t = 0..T-1 from an empty cache, stacked [{label(case)}]",
                     np.stack(outputs, axis=1), expected, dims="B T H V")
