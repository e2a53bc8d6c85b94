"""RWKV-6 and RWKV-7: every form equals the recurrence (float64, 1e-10) from any initial state; the
recurrences equal the papers' updates written out (RWKV-7 in its own transposed layout) and, for RWKV-7,
KDA and DeltaNet under the documented mapping; strong gates stay finite in the chunked forms; bad input
is named."""
from __future__ import annotations

import re

import numpy as np
import pytest

from minilin.chunking import gram_before_decay, local_cumsum
from minilin.mixers import deltanet, kda, rwkv6, rwkv7
from conftest import rel_err

TOL = 1e-10
SHAPES = [(1, 1, 1, 4, 4, 16), (2, 37, 3, 8, 5, 16), (1, 64, 2, 16, 16, 64), (2, 130, 2, 8, 12, 64),
          (1, 33, 1, 3, 2, 1), (1, 40, 2, 3, 2, 3)]
FORMS = {rwkv6: ("chunked", "parallel"), rwkv7: ("chunked",)}


def run(mod, form, args, chunk_size=16, **kwargs):
    if form == "chunked":
        kwargs["chunk_size"] = chunk_size
    return getattr(mod, form)(*args, **kwargs)


def sequence_slice(args, sl):
    return tuple(a[:, sl] if a.ndim >= 3 else a for a in args)


@pytest.mark.parametrize("mod", [rwkv6, rwkv7], ids=["rwkv6", "rwkv7"])
@pytest.mark.parametrize("B, T, H, K, V, chunk_size", SHAPES)
def test_forms_agree_from_an_initial_state(rng, mod, B, T, H, K, V, chunk_size):
    args, _ = mod.example_inputs(B, T, H, K, V, seed=T)
    S0 = rng.standard_normal((B, H, K, V))
    ref, ref_state = mod.recurrent(*args, initial_state=S0)
    for form in FORMS[mod]:
        out, state = run(mod, form, args, chunk_size, initial_state=S0)
        assert rel_err(out, ref) < TOL and rel_err(state, ref_state) < TOL, form


def test_rwkv6_is_the_papers_update(rng):
    """o_t = (S_{t-1} + diag(u) k_t v_t^T)^T r_t, then S_t = diag(exp(w_t)) S_{t-1} + k_t v_t^T, per (b, h)."""
    r, k, v, w, u = rwkv6.example_inputs(2, 20, 2, 4, 3, seed=5)[0]
    S = rng.standard_normal((2, 2, 4, 3))
    o, state = rwkv6.recurrent(r, k, v, w, u, scale=1.0, initial_state=S)
    for b in range(2):
        for h in range(2):
            M = S[b, h].copy()
            for t in range(20):
                kv = np.outer(k[b, t, h], v[b, t, h])
                assert rel_err(o[b, t, h], (M + np.diag(u[h]) @ kv).T @ r[b, t, h]) < TOL
                M = np.diag(np.exp(w[b, t, h])) @ M + kv
            assert rel_err(state[b, h], M) < TOL


def test_rwkv7_is_the_papers_update_in_its_own_layout(rng):
    """RWKV-7 writes wkv [V, K]: wkv_t = wkv_{t-1} (diag(w_t) - kappa^T (alpha * kappa)) + v^T k, o = wkv r.
    With a = -kappa, b = kappa * alpha and S = wkv^T this is rwkv7's update."""
    B, T, H, K, V = 1, 25, 2, 5, 3
    r, k, v = rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, K)), rng.standard_normal((B, T, H, V))
    log_w = -rng.uniform(0.01, 0.6, (B, T, H, K))
    kappa = rng.standard_normal((B, T, H, K))
    kappa /= np.linalg.norm(kappa, axis=-1, keepdims=True)
    alpha = rng.uniform(0, 1, (B, T, H, K))
    o, state = rwkv7.recurrent(r, log_w, k, v, -kappa, kappa * alpha, scale=1.0)
    for h in range(H):
        wkv = np.zeros((V, K))
        for t in range(T):
            kap = kappa[0, t, h][None]  # a row vector, as the paper writes it
            transition = np.diag(np.exp(log_w[0, t, h])) - kap.T @ (alpha[0, t, h][None] * kap)
            wkv = wkv @ transition + v[0, t, h][:, None] @ k[0, t, h][None]
            assert rel_err(o[0, t, h], wkv @ r[0, t, h]) < TOL
        assert rel_err(state[0, h], wkv.T) < TOL


def test_rwkv7_maps_onto_kda_and_deltanet(rng):
    """KDA (decay, then the delta rule on the decayed memory) is (D - beta k (D k)^T) S + beta k v^T:
    rwkv7 with w = g, a = exp(g) * k, b = -beta k and the written key beta k. Without decay: DeltaNet."""
    q, k, v, g, beta = kda.example_inputs(2, 70, 2, 6, 4, seed=8)[0]
    bk = beta[..., None] * k
    o_kda, S_kda = kda.chunked(q, k, v, g, beta, chunk_size=16)
    o, S = rwkv7.chunked(q, g, bk, v, np.exp(g) * k, -bk, chunk_size=16)
    assert rel_err(o, o_kda) < TOL and rel_err(S, S_kda) < TOL
    o_dn, S_dn = deltanet.recurrent(q, k, v, beta)
    o, S = rwkv7.chunked(q, np.zeros_like(g), bk, v, k, -bk, chunk_size=16)
    assert rel_err(o, o_dn) < TOL and rel_err(S, S_dn) < TOL


def test_gram_before_decay_matches_its_definition(rng):
    """A_ij = sum_k x_ik y_jk exp(G_{i-1,k} - G_jk) for j < i, with strong gates (exp(-G) would overflow)."""
    C, K = 37, 5
    x, y = rng.standard_normal((2, C, K)), rng.standard_normal((2, C, K))
    G = local_cumsum(-rng.uniform(0, 40, (1, 1, 2, C, K)))[0, 0]
    A = gram_before_decay(x, y, G)
    G_before = np.concatenate([np.zeros((2, 1, K)), G[:, :-1]], axis=1)
    expected = np.zeros((2, C, C))
    for i in range(C):
        for j in range(i):
            expected[:, i, j] = (x[:, i] * y[:, j] * np.exp(G_before[:, i] - G[:, j])).sum(-1)
    assert np.isfinite(A).all() and rel_err(A, expected) < TOL


@pytest.mark.parametrize("mod", [rwkv6, rwkv7], ids=["rwkv6", "rwkv7"])
def test_continuation_and_step(mod):
    args, _ = mod.example_inputs(2, 50, 2, 5, 3, seed=4)
    ref, ref_state = mod.recurrent(*args)
    for form in ("recurrent",) + FORMS[mod]:
        o1, s1 = run(mod, form, sequence_slice(args, slice(0, 19)))
        o2, s2 = run(mod, form, sequence_slice(args, slice(19, 50)), initial_state=s1)
        assert rel_err(np.concatenate([o1, o2], axis=1), ref) < TOL and rel_err(s2, ref_state) < TOL, form
    state, outs = None, []
    for t in range(50):
        o_t, state = mod.step(*sequence_slice(args, t), state=state)
        outs.append(o_t)
    assert rel_err(np.stack(outs, axis=1), ref) < TOL and rel_err(state, ref_state) < TOL


@pytest.mark.parametrize("mod", [rwkv6, rwkv7], ids=["rwkv6", "rwkv7"])
def test_float32_matches_float64(mod):
    args, _ = mod.example_inputs(1, 1024, 2, 32, 32, dtype=np.float32, seed=2)
    ref, _ = mod.recurrent(*(a.astype(np.float64) for a in args))
    for form in FORMS[mod]:
        out, state = run(mod, form, args, 64)
        assert out.dtype == np.float32 and state.dtype == np.float32
        assert rel_err(out, ref) < 1e-4, form


@pytest.mark.parametrize("mod", [rwkv6, rwkv7], ids=["rwkv6", "rwkv7"])
def test_strong_gates_stay_finite(rng, mod):
    """w down to -1000 per token on a third of the channels: exp(+cumsum) would overflow within a chunk."""
    args, _ = mod.example_inputs(1, 200, 2, 8, 4, seed=3)
    w_index = 3 if mod is rwkv6 else 1
    w = args[w_index] - rng.uniform(0, 1000, args[w_index].shape) * (rng.uniform(size=args[w_index].shape) < 0.3)
    args = (*args[:w_index], w, *args[w_index + 1:])
    ref, _ = mod.recurrent(*args)
    for form in FORMS[mod]:
        out, state = run(mod, form, args, 64)
        assert np.isfinite(out).all() and np.isfinite(state).all()
        assert rel_err(out, ref) < TOL, form


# --- bad input ------------------------------------------------------------------------------------


def test_rwkv6_positive_decay():
    r, k, v, w, u = rwkv6.example_inputs(2, 10, 3, 4, 5)[0]
    w[1, 4, 2, 0] = 0.25
    with pytest.raises(ValueError, match=r"w: expected log-space decay w <= 0 .*got max 0\.25"):
        rwkv6.chunked(r, k, v, w, u)


def test_rwkv6_bonus_shape():
    r, k, v, w, u = rwkv6.example_inputs(2, 10, 3, 4, 5)[0]
    with pytest.raises(ValueError, match=re.escape("u: expected shape [H, K] = [3, 4], got [4]")):
        rwkv6.recurrent(r, k, v, w, u[0])


def test_rwkv6_mismatched_value_batch():
    r, k, v, w, u = rwkv6.example_inputs(2, 10, 3, 4, 5)[0]
    with pytest.raises(ValueError, match=re.escape("v: expected shape [B, T, H, V] = [2, 10, 3, V], got [1, 10, 3, 5]")):
        rwkv6.parallel(r, k, v[:1], w, u)


def test_rwkv7_positive_decay():
    r, w, k, v, a, b = rwkv7.example_inputs(2, 10, 3, 4, 5)[0]
    w[0, 0, 0, 3] = 1e-3
    with pytest.raises(ValueError, match=r"w: expected log-space decay w <= 0 .*got max 0\.001"):
        rwkv7.chunked(r, w, k, v, a, b)


def test_rwkv7_wrong_rank():
    r, w, k, v, a, b = rwkv7.example_inputs(2, 10, 3, 4, 5)[0]
    with pytest.raises(ValueError, match=re.escape("a: expected shape [B, T, H, K] = [2, 10, 3, 4], got [2, 10, 4]")):
        rwkv7.recurrent(r, w, k, v, a[:, :, 0], b)


def test_rwkv7_state_shape():
    r, w, k, v, a, b = (x[:, 0] for x in rwkv7.example_inputs(2, 10, 3, 4, 5)[0])
    with pytest.raises(ValueError, match=re.escape("state: expected shape [B, H, K, V] = [2, 3, 4, 5], got [2, 3, 5, 4]")):
        rwkv7.step(r, w, k, v, a, b, state=np.zeros((2, 3, 5, 4)))


def test_integer_dtype():
    r, w, k, v, a, b = rwkv7.example_inputs(2, 10, 3, 4, 5)[0]
    with pytest.raises(TypeError, match=r"b: expected a floating-point array \(float32 or float64\), got int64"):
        rwkv7.chunked(r, w, k, v, a, np.ones(b.shape, dtype=np.int64))


def test_nan():
    r, k, v, w, u = rwkv6.example_inputs(2, 10, 3, 4, 5)[0]
    u[2, 1] = np.nan
    with pytest.raises(ValueError, match=re.escape("u: expected finite values, got nan at index (2, 1)")):
        rwkv6.chunked(r, k, v, w, u)


@pytest.mark.parametrize("mod", [rwkv6, rwkv7], ids=["rwkv6", "rwkv7"])
def test_chunk_size_not_positive(mod):
    args, _ = mod.example_inputs(2, 10, 3, 4, 5)
    with pytest.raises(ValueError, match=r"chunk_size: expected a positive integer, got -3"):
        mod.chunked(*args, chunk_size=-3)
