"""Backward passes of the softmax mixers: causal attention and sliding-window attention (recurrent,
chunked, parallel), Linformer and Nystromformer (parallel). Every form against central finite differences
in float64 (all inputs at once and each alone), with and without a cache, at T = 1, T not a multiple of
the chunk, K != V; the forms against each other to 1e-10 over several chunk sizes; the KV cache's gradient
laid out as the cache; dstate refused; float32 at T = 4096 finite; bad cotangents named."""
from __future__ import annotations

import re

import numpy as np
import pytest

from minilin.mixers import attention, linformer, nystromformer, sliding_window
from minilin.mixers.attention import KVCache
from minilin.mixers.sliding_window import WindowCache
from conftest import rel_err
import directional

TOL = 1e-10
CAUSAL = {"attention": (attention, {}), "sliding_window": (sliding_window, {"window": 5})}
FORMS = ("recurrent", "chunked", "parallel")


def inputs(rng, B, T, H, K, V, P, mixer, window=5):
    """q, k, v and a cache of P earlier tokens (None when P = 0): random arrays, never zeros."""
    q, k, v = (rng.standard_normal((B, T, H, D)) for D in (K, K, V))
    if P == 0:
        return q, k, v, None
    if mixer == "attention":
        return q, k, v, KVCache(rng.standard_normal((B, P, H, K)), rng.standard_normal((B, P, H, V)))
    L = min(P, window)
    return q, k, v, WindowCache(rng.standard_normal((B, L, H, K)), rng.standard_normal((B, L, H, V)), np.int64(P))


def backward(mod, form, q, k, v, cache, do, chunk_size=4, **kw):
    if form == "chunked":
        kw["chunk_size"] = chunk_size
    return getattr(mod, f"{form}_backward")(q, k, v, do=do, initial_state=cache, **kw)


def loss_of(mod, form, do, chunk_size=4, **kw):
    if form == "chunked":
        kw["chunk_size"] = chunk_size

    def loss(q, k, v, initial_state):
        o, _ = getattr(mod, form)(q, k, v, initial_state=initial_state, **kw)
        return float((do * o).sum())
    return loss


def by_name(grads) -> dict:
    return {name[1:]: g for name, g in grads._asdict().items()}


def close(a, b) -> bool:
    """Equal to 1e-10 relative; where the reference is exactly zero (a query that reads one key has no
    gradient), equal to 1e-10 absolute."""
    return rel_err(a, b) < TOL if np.any(b) else np.abs(a).max(initial=0.0) < TOL


# (B, T, H, K, V, P): T = 1, T % chunk != 0, K != V, caches shorter and longer than the window.
SHAPES = [(1, 1, 1, 3, 2, 0), (1, 1, 2, 3, 2, 3), (2, 11, 2, 4, 3, 0), (2, 11, 2, 4, 3, 2), (1, 9, 3, 2, 5, 7)]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("mixer", sorted(CAUSAL))
@pytest.mark.parametrize("B, T, H, K, V, P", SHAPES)
def test_causal_gradients_match_finite_differences(rng, mixer, form, B, T, H, K, V, P):
    mod, kw = CAUSAL[mixer]
    q, k, v, cache = inputs(rng, B, T, H, K, V, P, mixer)
    do = rng.standard_normal((B, T, H, V))
    grads = backward(mod, form, q, k, v, cache, do, scale=0.7, **kw)
    assert (grads.dinitial_state is None) == (cache is None)
    directional.check_all_and_each(rng, loss_of(mod, form, do, scale=0.7, **kw),
                                   {"q": q, "k": k, "v": v, "initial_state": cache}, by_name(grads))


@pytest.mark.parametrize("mixer", sorted(CAUSAL))
@pytest.mark.parametrize("T, P", [(1, 0), (37, 0), (37, 6), (64, 3), (20, 40)])
def test_forms_agree(rng, mixer, T, P):
    mod, kw = CAUSAL[mixer]
    q, k, v, cache = inputs(rng, 2, T, 2, 8, 6, P, mixer)
    do = rng.standard_normal((2, T, 2, 6))
    ref = backward(mod, "recurrent", q, k, v, cache, do, **kw)
    others = [backward(mod, "parallel", q, k, v, cache, do, **kw)]
    others += [backward(mod, "chunked", q, k, v, cache, do, chunk_size=C, **kw) for C in (1, 3, 4, 16, 64)]
    for grads in others:
        for name in ("dq", "dk", "dv"):
            assert close(getattr(grads, name), getattr(ref, name)), name
        if cache is not None:
            assert close(grads.dinitial_state.k, ref.dinitial_state.k)
            assert close(grads.dinitial_state.v, ref.dinitial_state.v)


@pytest.mark.parametrize("W, C, P", [(1, 4, 3), (4, 4, 9), (5, 2, 13), (7, 16, 2), (64, 16, 5)])
def test_sliding_window_band_and_ring(rng, W, C, P):
    """Windows of one token, of exactly one chunk, wider than the sequence; a full ring that has wrapped."""
    q, k, v, cache = inputs(rng, 1, 23, 2, 4, 3, P, "sliding_window", window=W)
    do = rng.standard_normal((1, 23, 2, 3))
    ref = backward(sliding_window, "recurrent", q, k, v, cache, do, window=W)
    for form, extra in (("parallel", {}), ("chunked", {"chunk_size": C})):
        grads = backward(sliding_window, form, q, k, v, cache, do, window=W, **extra)
        for a, b in zip(grads[:3] + tuple(grads.dinitial_state[:2]), ref[:3] + tuple(ref.dinitial_state[:2])):
            assert close(a, b)
    directional.check_all_and_each(rng, loss_of(sliding_window, "chunked", do, chunk_size=C, window=W),
                                   {"q": q, "k": k, "v": v, "initial_state": cache}, by_name(ref))


def test_cache_gradient_is_laid_out_like_the_cache(rng):
    """dinitial_state is a KVCache / WindowCache: the gradient of cached token p sits where token p sits."""
    q, k, v, cache = inputs(rng, 1, 6, 2, 4, 3, 8, "attention")
    g = attention.chunked_backward(q, k, v, do=rng.standard_normal((1, 6, 2, 3)), initial_state=cache)
    assert isinstance(g.dinitial_state, KVCache)
    assert g.dinitial_state.k.shape == cache.k.shape and g.dinitial_state.v.shape == cache.v.shape
    q, k, v, cache = inputs(rng, 1, 6, 2, 4, 3, 8, "sliding_window", window=5)
    g = sliding_window.chunked_backward(q, k, v, do=rng.standard_normal((1, 6, 2, 3)), initial_state=cache, window=5)
    assert isinstance(g.dinitial_state, WindowCache) and g.dinitial_state.position == 8
    assert g.dinitial_state.k.shape == cache.k.shape
    # Token 7 (slot 2) is read by the first new query (token 8 reads 4 .. 8); token 3 (slot 3) by none.
    assert np.abs(g.dinitial_state.k[:, 2]).max() > 0 and not np.any(g.dinitial_state.k[:, 3])


@pytest.mark.parametrize("mixer", sorted(CAUSAL))
@pytest.mark.parametrize("form", FORMS)
def test_dstate_is_refused(rng, mixer, form):
    mod, kw = CAUSAL[mixer]
    q, k, v, cache = inputs(rng, 1, 4, 1, 2, 2, 3, mixer)
    with pytest.raises(ValueError, match=r"dstate: expected None .*cache"):
        backward(mod, form, q, k, v, cache, rng.standard_normal((1, 4, 1, 2)), dstate=cache, **kw)


@pytest.mark.parametrize("mixer", sorted(CAUSAL))
def test_bad_do_is_named(rng, mixer):
    mod, kw = CAUSAL[mixer]
    q, k, v, _ = inputs(rng, 2, 5, 2, 3, 4, 0, mixer)
    with pytest.raises(ValueError, match=re.escape("do: expected shape [B, T, H, V] = [2, 5, 2, 4], got [2, 5, 2]")):
        mod.chunked_backward(q, k, v, do=rng.standard_normal((2, 5, 2)), **kw)
    bad = rng.standard_normal((2, 5, 2, 4))
    bad[0, 1, 0, 2] = np.nan
    with pytest.raises(ValueError, match=r"do: expected finite values"):
        mod.parallel_backward(q, k, v, do=bad, **kw)
    with pytest.raises(TypeError, match=r"do: expected an array"):
        mod.recurrent_backward(q, k, v, do=None, **kw)


@pytest.mark.parametrize("mixer", sorted(CAUSAL))
def test_float32_long_sequence_is_finite(mixer):
    mod, kw = CAUSAL[mixer]
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, 4096, 2, D)).astype(np.float32) * 3 for D in (16, 16, 8, 8))
    grads = mod.chunked_backward(q, k, v, do=do, **kw)
    for g in grads[:3]:
        assert g.dtype == np.float32 and np.isfinite(g).all()


# --- the non-causal approximations ---------------------------------------------------------------------


@pytest.mark.parametrize("T, rank, shared", [(1, 1, True), (13, 4, False), (13, 4, True), (16, 16, False)])
def test_linformer_gradients_match_finite_differences(rng, T, rank, shared):
    q, k, v = (rng.standard_normal((2, T, 3, D)) for D in (4, 4, 6))
    do = rng.standard_normal((2, T, 3, 6))
    E = rng.standard_normal((rank, T))
    F = None if shared else rng.standard_normal((rank, T))
    grads = linformer.parallel_backward(q, k, v, do=do, E=E, F=F, scale=0.8)
    assert (grads.dF is None) == shared

    def loss(q, k, v, E, F):
        return float((do * linformer.parallel(q, k, v, E=E, F=F, scale=0.8)[0]).sum())
    directional.check_all_and_each(rng, loss, {"q": q, "k": k, "v": v, "E": E, "F": F}, by_name(grads))


@pytest.mark.parametrize("projection", ["sample", "pool", "gaussian"])
def test_linformer_built_in_projections(rng, projection):
    """E and F built inside: their gradients are None; q, k, v's are exact."""
    (q, k, v), kw = linformer.example_inputs(1, 20, 2, 4, 3, seed=5)
    kw["projection"] = projection
    do = rng.standard_normal((1, 20, 2, 3))
    grads = linformer.parallel_backward(q, k, v, do=do, **kw)
    assert grads.dE is None and grads.dF is None

    def loss(q, k, v):
        return float((do * linformer.parallel(q, k, v, **kw)[0]).sum())
    directional.check_all_and_each(rng, loss, {"q": q, "k": k, "v": v}, by_name(grads))


@pytest.mark.parametrize("pinv", ["iterative", "exact"])
@pytest.mark.parametrize("T, m", [(1, 1), (13, 4), (12, 12), (40, 5)])
def test_nystromformer_gradients_match_finite_differences(rng, pinv, T, m):
    q, k, v = (rng.standard_normal((2, T, 2, D)) for D in (4, 4, 3))
    do = rng.standard_normal((2, T, 2, 3))
    grads = nystromformer.parallel_backward(q, k, v, do=do, landmarks=m, pinv=pinv, scale=0.6)

    def loss(q, k, v):
        return float((do * nystromformer.parallel(q, k, v, landmarks=m, pinv=pinv, scale=0.6)[0]).sum())
    directional.check_all_and_each(rng, loss, {"q": q, "k": k, "v": v}, by_name(grads))


def test_pseudo_inverse_gradients(rng):
    """Both pseudo-inverses' backward passes alone, on general matrices: the iteration's on a square one,
    the exact one also on a rank-deficient one (perturbed through its factors, so that its rank stays 3)."""
    A = rng.standard_normal((2, 5, 5))
    dZ = rng.standard_normal(A.shape)
    directional.check(lambda A: float((nystromformer.iterative_pinv(A, 4) * dZ).sum()), {"A": A},
                      {"A": nystromformer._iterative_pinv_backward(A, dZ, 4)}, {"A": rng.standard_normal(A.shape)})
    U, W = rng.standard_normal((2, 6, 3)), rng.standard_normal((2, 3, 4))
    dX = rng.standard_normal((2, 4, 6))
    dA = nystromformer._exact_pinv_backward(U @ W, np.linalg.pinv(U @ W), dX)
    directional.check(lambda U, W: float((np.linalg.pinv(U @ W) * dX).sum()), {"U": U, "W": W},
                      {"U": dA @ W.swapaxes(-1, -2), "W": U.swapaxes(-1, -2) @ dA},
                      {"U": rng.standard_normal(U.shape), "W": rng.standard_normal(W.shape)})


@pytest.mark.parametrize("mod, kw", [(linformer, {"rank": 256}), (nystromformer, {"landmarks": 64})])
def test_non_causal_float32_long_sequence_is_finite(mod, kw):
    (q, k, v), _ = mod.example_inputs(1, 4096, 2, 16, 8, dtype=np.float32, seed=2)
    do = np.random.default_rng(0).standard_normal(v.shape).astype(np.float32)
    for g in mod.parallel_backward(q, k, v, do=do, **kw)[:3]:
        assert g.dtype == np.float32 and np.isfinite(g).all()


@pytest.mark.parametrize("mod, kw", [(linformer, {"rank": 8}), (nystromformer, {"landmarks": 4})])
def test_non_causal_cotangents(rng, mod, kw):
    q, k, v = (rng.standard_normal((1, 16, 2, D)) for D in (4, 4, 3))
    with pytest.raises(ValueError, match=re.escape("do: expected shape [B, T, H, V] = [1, 16, 2, 3], got [1, 16, 2, 4]")):
        mod.parallel_backward(q, k, v, do=rng.standard_normal((1, 16, 2, 4)), **kw)
    with pytest.raises(ValueError, match=r"dstate: expected None"):
        mod.parallel_backward(q, k, v, do=rng.standard_normal((1, 16, 2, 3)), dstate=np.ones((1, 2, 4, 3)), **kw)
