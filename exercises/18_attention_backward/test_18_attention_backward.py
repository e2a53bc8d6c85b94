"""Check for exercise 18 (you do not need to edit this file): the forward's log-sum-exp against the masked
scores' own, and both backward forms against minilin.mixers.attention's parallel_backward and against
central finite differences of <do, o>, in float64, with the default scale and another one, with scores in
the hundreds (where exp(S) overflows but exp(S - lse) does not); the Python lines each form runs (every
token at once; blocks, not tokens) and the memory the tiled form takes (no [T, T] array)."""
import tracemalloc

import numpy as np

from minilin.course.checks import (SEQUENCE_CASES, assert_close, assert_no_token_loop, check_form, check_gradients,
                                   fail, label, unpack)
from minilin.mixers import attention

NAMES, DIMS = ("dq", "dk", "dv"), ("B T H K", "B T H K", "B T H V")
LOUD = 30.0   # q and k this many times larger: scores of several hundred


def _lse(q, k, scale):
    """log sum_{j <= i} exp(scale q_i . k_j), [B, T, H], computed here in float64 with the row max subtracted."""
    T = q.shape[1]
    scores = scale * np.einsum("bihk,bjhk->bhij", q, k)
    scores = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, scores)
    m = scores.max(-1, keepdims=True)
    return (m + np.log(np.exp(scores - m).sum(-1, keepdims=True)))[..., 0].transpose(0, 2, 1)


def _inputs(case, seed, loud=1.0):
    (q, k, v), _ = attention.example_inputs(**case, seed=seed)
    do = np.random.default_rng(seed + 1000).standard_normal(v.shape)
    return loud * q, loud * k, v, do


def _loss(do, scale):
    return lambda q, k, v: float(np.sum(do * attention.parallel(q, k, v, scale=scale)[0]))


def test_attention_forward(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 300):
        q, k, v, _ = _inputs(case, seed)
        for scale in (None, 0.3):
            s = case["K"] ** -0.5 if scale is None else scale
            check_form("attention_forward", learner.attention_forward, (q, k, v),
                       (attention.parallel(q, k, v, scale=scale)[0], _lse(q, k, s)), kwargs=dict(scale=scale),
                       where=f"[{label(case)}]", outputs=("o", "lse"), dims=("B T H V", "B T H"))
    case = SEQUENCE_CASES[0]
    q, k, v, _ = _inputs(case, 305, LOUD)
    with np.errstate(all="ignore"):
        check_form("attention_forward", learner.attention_forward, (q, k, v),
                   (attention.parallel(q, k, v)[0], _lse(q, k, case["K"] ** -0.5)),
                   where=f"[{label(case)}, q and k times {LOUD:g}: scores in the hundreds; subtract the row max "
                         "before exp]", outputs=("o", "lse"), dims=("B T H V", "B T H"))


def _check_backward(learner, function, cases, seed0, **options):
    for seed, case in enumerate(cases, seed0):
        for scale, loud in ((None, 1.0), (0.3, 1.0), (None, LOUD)):
            q, k, v, do = _inputs(case, seed, loud)
            s = case["K"] ** -0.5 if scale is None else scale
            o = attention.parallel(q, k, v, scale=scale)[0]
            lse = _lse(q, k, s)
            expected = attention.parallel_backward(q, k, v, do=do, scale=scale)
            with np.errstate(all="ignore"):
                got = getattr(learner, function)(q, k, v, o, lse, do, scale=scale, **options)
            where = f"[{label(case, **options)}" + (
                f", q and k times {LOUD:g}: recompute P as exp(S - lse)]" if loud > 1 else "]")
            check_gradients(f"{function}(scale={scale})", got, (expected.dq, expected.dk, expected.dv), names=NAMES,
                            dims=DIMS, where=where, chunk_size=options.get("block_size"),
                            scales={"scale": s, "K ** -0.5": case["K"] ** -0.5},
                            loss=_loss(do, scale), inputs=(q, k, v), seed=seed)


def test_attention_backward(learner):
    _check_backward(learner, "attention_backward", SEQUENCE_CASES, 310)


def test_attention_backward_is_parallel(learner):
    def call(T, chunk_size):
        q, k, v, do = _inputs(dict(B=1, T=T, H=1, K=4, V=4), T)
        return (q, k, v, attention.parallel(q, k, v)[0], _lse(q, k, 0.5), do), {}

    assert_no_token_loop("attention_backward", learner.attention_backward, call, chunked=False)


def test_attention_backward_tiled(learner):
    for block_size in (16, 5, 64):
        _check_backward(learner, "attention_backward_tiled", SEQUENCE_CASES[:1] + SEQUENCE_CASES[2:], 320,
                        block_size=block_size)
    _check_backward(learner, "attention_backward_tiled", SEQUENCE_CASES[1:2], 325, block_size=3)


def test_attention_backward_tiled_loops_over_blocks(learner):
    def call(T, chunk_size):
        q, k, v, do = _inputs(dict(B=1, T=T, H=1, K=4, V=4), T)
        return (q, k, v, attention.parallel(q, k, v)[0], _lse(q, k, 0.5), do), dict(block_size=chunk_size)

    assert_no_token_loop("attention_backward_tiled", learner.attention_backward_tiled, call, chunked=True)


def test_attention_backward_tiled_memory(learner):
    """At T = 1024 a [T, T] float64 matrix takes 8 MiB per head; the tiled form must stay well below."""
    case = dict(B=1, T=1024, H=1, K=4, V=4)
    q, k, v, do = _inputs(case, 330)
    o, lse = attention.parallel(q, k, v)[0], _lse(q, k, 0.5)
    budget = case["T"] ** 2 * 8 // 8
    tracemalloc.start()
    try:
        result = learner.attention_backward_tiled(q, k, v, o, lse, do, block_size=64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    dq, dk, dv = unpack("attention_backward_tiled(...)", result, 3, "(dq, dk, dv)")
    if peak > budget:
        fail(f"attention_backward_tiled(block_size=64) [{label(case)}]: {peak / 2 ** 20:.1f} MiB at its peak, more "
             f"than {budget / 2 ** 20:.1f} MiB (an eighth of one [T, T] float64 matrix, {case['T'] ** 2 * 8 / 2 ** 20:.0f} "
             "MiB): a [T, T] array, or one of every tile at once? Recompute each tile's P from lse when it is needed")
    expected = attention.parallel_backward(q, k, v, do=do)
    for name, got, want, dims in zip(NAMES, (dq, dk, dv), (expected.dq, expected.dk, expected.dv), DIMS):
        assert_close(f"attention_backward_tiled(block_size=64): {name} [{label(case)}]", got, want, dims=dims,
                     chunk_size=64, kind="gradient")
