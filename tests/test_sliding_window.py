"""Sliding-window attention: every form equal in float64, the ring buffer, continuation across the wrap,
W >= T equal to full causal attention, the chunked form never n x n, and bad input."""
from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest

from minilin.mixers import attention, sliding_window
from conftest import rel_err, state_err

TOL = 1e-10


def inputs(T, B=2, H=3, K=8, V=5, seed=0):
    args, _ = sliding_window.example_inputs(B, T, H, K, V, seed=seed)
    return args


def sliced(args, sl):
    return tuple(a[:, sl] for a in args)


# (T, window, chunk_size): W = 1, W = C, W not a multiple of C, W > T, W - 1 = C, T = 1, T % C != 0.
CASES = [(64, 16, 64), (100, 7, 16), (37, 1, 8), (50, 64, 16), (65, 33, 32), (1, 4, 16), (20, 5, 3), (70, 17, 16)]


@pytest.mark.parametrize("T, window, chunk_size", CASES)
def test_forms_agree(T, window, chunk_size):
    args = inputs(T, seed=T + window)
    ref, ref_state = sliding_window.recurrent(*args, window=window)
    for out, state in (sliding_window.parallel(*args, window=window),
                       sliding_window.chunked(*args, window=window, chunk_size=chunk_size)):
        assert rel_err(out, ref) < TOL
        assert state_err(state, ref_state) < TOL


def test_cache_is_a_ring_of_the_last_window_tokens():
    """After P tokens the cache holds W entries and token p sits in slot p % W."""
    T, W = 23, 5
    q, k, v = inputs(T)
    _, cache = sliding_window.chunked(q, k, v, window=W, chunk_size=4)
    assert cache.position == T and cache.k.shape == (2, W, 3, 8) and cache.v.shape == (2, W, 3, 5)
    for p in range(T - W, T):
        assert np.array_equal(cache.k[:, p % W], k[:, p]) and np.array_equal(cache.v[:, p % W], v[:, p])


def test_cache_grows_until_the_window_is_full():
    q, k, v = inputs(10)
    state = None
    for t in range(10):
        _, state = sliding_window.step(q[:, t], k[:, t], v[:, t], state=state, window=6)
        assert state.k.shape[1] == min(t + 1, 6) and state.position == t + 1


# (W, chunk_size): W - 1 = 4 = C and C = 1 make the full ring reach further back than the tiles do
# (its oldest entries are out of every new query's window and are dropped before tiling).
@pytest.mark.parametrize("W, C", [(6, 4), (5, 4), (3, 1)])
@pytest.mark.parametrize("t", [1, 5, 6, 13, 29])
def test_continuation_across_the_wrap(t, W, C):
    """[0, t) then [t, T) from the returned cache equals [0, T), in every form and mixing forms."""
    T = 30
    args = inputs(T, seed=t)
    full, full_state = sliding_window.parallel(*args, window=W)
    head, head_state = sliding_window.recurrent(*sliced(args, slice(0, t)), window=W)
    for form, extra in ((sliding_window.parallel, {}), (sliding_window.chunked, {"chunk_size": C}),
                        (sliding_window.recurrent, {})):
        tail, tail_state = form(*sliced(args, slice(t, T)), window=W, initial_state=head_state, **extra)
        assert rel_err(np.concatenate([head, tail], axis=1), full) < TOL
        assert state_err(tail_state, full_state) < TOL


def test_step_leaves_the_callers_cache_unchanged():
    q, k, v = inputs(12)
    _, cache = sliding_window.chunked(q[:, :10], k[:, :10], v[:, :10], window=4)
    before = (cache.k.copy(), cache.v.copy())
    sliding_window.step(q[:, 10], k[:, 10], v[:, 10], state=cache, window=4)
    assert np.array_equal(cache.k, before[0]) and np.array_equal(cache.v, before[1])


@pytest.mark.parametrize("window", [40, 41, 1000])
def test_window_covering_the_sequence_is_causal_attention(window):
    args = inputs(40, seed=window)
    ref, _ = attention.parallel(*args)
    for out, _ in (sliding_window.parallel(*args, window=window),
                   sliding_window.chunked(*args, window=window, chunk_size=16),
                   sliding_window.recurrent(*args, window=window)):
        assert rel_err(out, ref) < TOL


def test_window_covering_the_context_continues_like_attention():
    """With P + T <= W the ring buffer is the KV cache, in order."""
    args = inputs(40, seed=3)
    head, cache = sliding_window.chunked(*sliced(args, slice(0, 15)), window=64)
    _, kv = attention.chunked(*sliced(args, slice(0, 15)))
    assert state_err((cache.k, cache.v), tuple(kv)) < TOL
    out, _ = sliding_window.chunked(*sliced(args, slice(15, 40)), window=64, initial_state=cache)
    ref, _ = attention.chunked(*sliced(args, slice(15, 40)), initial_state=kv)
    assert rel_err(out, ref) < TOL


def test_window_actually_forgets():
    """Changing a token more than W - 1 positions back leaves the output unchanged; within the window it does not."""
    q, k, v = inputs(20)
    out, _ = sliding_window.chunked(q, k, v, window=5, chunk_size=4)
    k2, v2 = k.copy(), v.copy()
    k2[:, 10], v2[:, 10] = 3.0, -2.0
    out2, _ = sliding_window.chunked(q, k2, v2, window=5, chunk_size=4)
    changed = np.abs(out2 - out).max(axis=(0, 2, 3)) > 1e-12
    assert not changed[:10].any() and changed[10:15].all() and not changed[15:].any()


def peak_bytes(fn, *args, **kwargs) -> int:
    tracemalloc.start()
    try:
        fn(*args, **kwargs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_chunked_never_forms_an_n_by_n_matrix():
    """The chunked form's peak memory is O(T C), far below one T x T float64 score matrix, which the
    parallel form does form (so the measurement can tell them apart)."""
    T, W = 2048, 32
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, T, 1, 16)) for _ in range(3))
    one_square = T * T * 8
    assert peak_bytes(sliding_window.parallel, q, k, v, window=W) > one_square
    peak = peak_bytes(sliding_window.chunked, q, k, v, window=W, chunk_size=32)
    assert peak < one_square / 4, f"chunked peak {peak} bytes against {one_square} for one n x n matrix"


def test_float32_stays_float32():
    args = tuple(a.astype(np.float32) for a in inputs(33))
    for out, state in (sliding_window.parallel(*args, window=8), sliding_window.chunked(*args, window=8, chunk_size=16)):
        assert out.dtype == np.float32 and state.k.dtype == np.float32


# --- bad input: one test per case ------------------------------------------------------------------------

def test_window_zero():
    with pytest.raises(ValueError, match=r"window: expected a positive integer .*got 0"):
        sliding_window.parallel(*inputs(8), window=0)


def test_window_not_an_integer():
    with pytest.raises(TypeError, match=r"window: expected a positive integer .*got 2\.5"):
        sliding_window.chunked(*inputs(8), window=2.5)


def test_window_missing():
    with pytest.raises(TypeError, match="window"):
        sliding_window.parallel(*inputs(8))


def test_state_not_a_window_cache():
    q, k, v = inputs(8)
    with pytest.raises(TypeError, match=r"state: expected a WindowCache\(k, v, position\) or None, got ndarray"):
        sliding_window.step(q[:, 0], k[:, 0], v[:, 0], state=np.zeros((2, 3, 8, 5)), window=4)


def test_cache_length_disagrees_with_position():
    q, k, v = inputs(8)
    _, cache = sliding_window.chunked(q, k, v, window=4)
    bad = sliding_window.WindowCache(cache.k[:, :3], cache.v[:, :3], cache.position)
    with pytest.raises(ValueError, match=re.escape("initial_state.k: expected min(position, window) = min(8, 4) = 4 "
                                                   "entries, got 3")):
        sliding_window.parallel(q, k, v, window=4, initial_state=bad)


def test_cache_negative_position():
    q, k, v = inputs(8)
    bad = sliding_window.WindowCache(k[:, :0], v[:, :0], -1)
    with pytest.raises(ValueError, match=r"initial_state.position: expected a non-negative integer .*got -1"):
        sliding_window.chunked(q, k, v, window=4, initial_state=bad)


def test_cache_wrong_heads():
    q, k, v = inputs(8)
    _, cache = sliding_window.chunked(q, k, v, window=4)
    bad = sliding_window.WindowCache(cache.k[:, :, :2], cache.v, cache.position)
    with pytest.raises(ValueError, match=re.escape("state.k: expected shape [B, L, H, K] = [2, L, 3, 8], got [2, 4, 2, 8]")):
        sliding_window.step(q[:, 0], k[:, 0], v[:, 0], state=bad, window=4)


def test_chunk_size_zero():
    with pytest.raises(ValueError, match=r"chunk_size: expected a positive integer, got 0"):
        sliding_window.chunked(*inputs(8), window=4, chunk_size=0)


def test_mismatched_value_length():
    q, k, v = inputs(8)
    with pytest.raises(ValueError, match=re.escape("v: expected shape [B, T, H, V] = [2, 8, 3, V], got [2, 7, 3, 5]")):
        sliding_window.parallel(q, k, v[:, :7], window=4)
