"""The delta-rule family's hand-written backward passes (minilin/mixers/_delta_rule.py), proven.

Engine level, for every gate kind (None: DeltaNet, scalar: Gated DeltaNet, per-channel: KDA):
- `recurrent_backward` and `chunked_backward` against central finite differences of the definition
  (`_delta_rule.recurrent`) in float64, along a random direction in all inputs at once and in each input
  alone, at awkward shapes (T = 1, T not a multiple of the chunk, K != V), with and without an initial state,
  with and without a final-state cotangent, for the final state alone (do = 0), and with beta up to 2;
- `recurrent_backward == chunked_backward` to 1e-10 for several chunk sizes;
- float32 at T = 4096 with log-gates down to -20: finite, nothing overflows, and the two forms agree.
"""
from __future__ import annotations

import numpy as np
import pytest

from minilin.mixers import _delta_rule
from conftest import rel_err

GATES = ["none", "scalar", "channel"]
NAMES = ["q", "k", "v", "g", "beta", "S0"]


def make_inputs(rng, B, T, H, K, V, gate, *, initial_state=True, beta_max=1.0, g_low=-1.0,
                dtype=np.float64):
    """Engine inputs (q already scaled), unit keys: the transition is stable while beta |k|^2 <= 2."""
    q = rng.standard_normal((B, T, H, K)) * K ** -0.5
    k = rng.standard_normal((B, T, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, H, V))
    g = {"none": None,
         "scalar": rng.uniform(g_low, -0.01, (B, T, H)),
         "channel": rng.uniform(g_low, -0.01, (B, T, H, K))}[gate]
    beta = rng.uniform(0, beta_max, (B, T, H))
    S0 = rng.standard_normal((B, H, K, V)) if initial_state else None
    return [None if x is None else x.astype(dtype) for x in (q, k, v, g, beta, S0)]


def loss(inputs, do, dS, with_magnitude=False):
    """L = <do, o> + <dS, S_T> through the definition; with_magnitude: also sum |do o| + |dS S_T|, the scale of
    L's float64 rounding."""
    o, S = _delta_rule.recurrent(*inputs)
    terms = [o * do] + ([] if dS is None else [S * dS])
    value = float(sum(t.sum() for t in terms))
    return (value, float(sum(np.abs(t).sum() for t in terms))) if with_magnitude else value


def directional_fd(inputs, do, dS, direction, eps=1e-6):
    """The central difference along `direction`, and a bound on its rounding noise: each loss is rounded by about
    u sum |terms| (u = 2^-52), and the difference divides that by 2 eps, so at eps = 1e-6 a loss of magnitude 20
    carries ~5e-9 of noise whatever the gradient's size (an S0 direction decayed over the sequence is ~1e-4)."""
    plus = [None if x is None else x + eps * d for x, d in zip(inputs, direction)]
    minus = [None if x is None else x - eps * d for x, d in zip(inputs, direction)]
    (l_plus, m_plus), (l_minus, m_minus) = (loss(plus, do, dS, True), loss(minus, do, dS, True))
    return (l_plus - l_minus) / (2 * eps), np.finfo(np.float64).eps * (m_plus + m_minus) / (2 * eps)


def backward(form, inputs, do, dS, chunk_size):
    if form == "recurrent":
        return _delta_rule.recurrent_backward(*inputs, do, dS, checkpoint_every=5)
    return _delta_rule.chunked_backward(*inputs, do, dS, chunk_size)


def assert_matches_finite_differences(rng, inputs, do, dS, grads):
    for x, d in zip(inputs, grads):
        assert (x is None) == (d is None)
        if x is not None:
            assert d.shape == x.shape and d.dtype == x.dtype and np.isfinite(d).all()
    directions = [None if x is None else rng.standard_normal(x.shape) for x in inputs]
    # all inputs at once, then each alone
    cases = [("all", directions)]
    cases += [(NAMES[i], [d if j == i else None for j, d in enumerate(directions)])
              for i in range(6) if inputs[i] is not None]
    for label, direction in cases:
        filled = [None if x is None else (np.zeros_like(x) if d is None else d)
                  for x, d in zip(inputs, direction)]
        # L is affine in q, in v and in S0 alone (the recurrence is linear in (v, S0), o linear in q), so along
        # those the difference has no truncation error and a long step shrinks its rounding noise
        affine = label in ("q", "v", "S0")
        expected, noise = directional_fd(inputs, do, dS, filled, eps=1e-3 if affine else 1e-6)
        terms = [float((gr * d).sum()) for gr, d in zip(grads, filled) if gr is not None]
        got = sum(terms)
        scale = max(sum(abs(t) for t in terms), 1e-3)
        assert abs(got - expected) <= 1e-7 * scale + noise, \
            f"{label}: analytic {got:.12g}, finite differences {expected:.12g} (rounding noise {noise:.3g})"


# (B, T, H, K, V, chunk_size): T = 1; T % chunk != 0 with K != V; several chunks and sub-blocks.
SHAPES = [(1, 1, 1, 4, 3, 16), (2, 21, 2, 5, 3, 8), (1, 40, 1, 6, 7, 32)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}C{}".format(*s))
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_backward_matches_finite_differences(rng, form, gate, shape):
    *dims, chunk_size = shape
    B, T, H, K, V = dims
    inputs = make_inputs(rng, *dims, gate)
    do, dS = rng.standard_normal((B, T, H, V)), rng.standard_normal((B, H, K, V))
    assert_matches_finite_differences(rng, inputs, do, dS, backward(form, inputs, do, dS, chunk_size))


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("form", ["recurrent", "chunked"])
@pytest.mark.parametrize("case", ["no initial state, no dS", "final state alone", "beta up to 2"])
def test_backward_edge_cases_match_finite_differences(rng, form, gate, case):
    B, T, H, K, V, chunk_size = 2, 19, 2, 4, 6, 8
    inputs = make_inputs(rng, B, T, H, K, V, gate, initial_state=case != "no initial state, no dS",
                         beta_max=2.0 if case == "beta up to 2" else 1.0)
    do = rng.standard_normal((B, T, H, V))
    dS = None if case == "no initial state, no dS" else rng.standard_normal((B, H, K, V))
    if case == "final state alone":
        do = np.zeros_like(do)
    grads = backward(form, inputs, do, dS, chunk_size)
    if case == "no initial state, no dS":
        assert grads[5] is None
    if gate == "none":
        assert grads[3] is None
    assert_matches_finite_differences(rng, inputs, do, dS, grads)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("beta_max", [1.0, 2.0])
def test_recurrent_and_chunked_backward_agree(rng, gate, beta_max):
    B, T, H, K, V = 2, 70, 2, 8, 5
    inputs = make_inputs(rng, B, T, H, K, V, gate, beta_max=beta_max, g_low=-3.0)
    do, dS = rng.standard_normal((B, T, H, V)), rng.standard_normal((B, H, K, V))
    reference = _delta_rule.recurrent_backward(*inputs, do, dS)
    for chunk_size in [1, 3, 16, 64]:
        for name, got, ref in zip(NAMES, _delta_rule.chunked_backward(*inputs, do, dS, chunk_size), reference):
            assert (got is None) == (ref is None), name
            err = 0.0 if ref is None else rel_err(got, ref)
            assert err < 1e-10, f"chunk_size={chunk_size}, d{name}: relative error {err:.2e}"
    parallel = _delta_rule.parallel_backward(*inputs, do, dS)
    assert max(rel_err(a, b) for a, b in zip(parallel, reference) if b is not None) < 1e-10


def test_recurrent_backward_checkpoints_change_nothing(rng):
    inputs = make_inputs(rng, 1, 23, 2, 4, 3, "scalar")
    do, dS = rng.standard_normal((1, 23, 2, 3)), rng.standard_normal((1, 2, 4, 3))
    reference = _delta_rule.recurrent_backward(*inputs, do, dS, checkpoint_every=23)
    for every in [1, 4, 64]:
        got = _delta_rule.recurrent_backward(*inputs, do, dS, checkpoint_every=every)
        assert max(rel_err(a, b) for a, b in zip(got, reference) if b is not None) < 1e-13


@pytest.mark.parametrize("gate", GATES)
def test_float32_long_sequence_with_strong_gates_stays_finite(rng, gate):
    B, T, H, K, V = 1, 4096, 1, 8, 8
    inputs = make_inputs(rng, B, T, H, K, V, gate, g_low=-20.0, dtype=np.float32)
    do = rng.standard_normal((B, T, H, V)).astype(np.float32)
    dS = rng.standard_normal((B, H, K, V)).astype(np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        chunked = _delta_rule.chunked_backward(*inputs, do, dS, 64)
        recurrent = _delta_rule.recurrent_backward(*inputs, do, dS)
    for name, c, r in zip(NAMES, chunked, recurrent):
        if r is None:
            continue
        assert c.dtype == np.float32 and np.isfinite(c).all() and np.isfinite(r).all(), name
        assert rel_err(c, r) < 1e-4, f"d{name}: chunked vs recurrent in float32 {rel_err(c, r):.2e}"


# ----- public level: the modules' chain rule (scale, normalize_qk), allow_neg_eigval, bad cotangents -----

from minilin.mixers import deltanet, gated_deltanet, kda  # noqa: E402

PUBLIC = {"deltanet": deltanet, "gated_deltanet": gated_deltanet, "kda": kda}


def public_loss(mod, args, state, do, dstate, kwargs):
    o, S = mod.recurrent(*args, initial_state=state, **kwargs)
    return float((o * do).sum() + (S * dstate).sum())


def assert_public_matches_finite_differences(rng, mod, args, state, kwargs, form, eps=1e-6):
    B, T, H, _ = args[0].shape
    do = rng.standard_normal((B, T, H, state.shape[-1]))
    dstate = rng.standard_normal(state.shape)
    extra = {"chunk_size": 4} if form == "chunked" else {}
    grads = getattr(mod, f"{form}_backward")(*args, do=do, dstate=dstate, initial_state=state, **kwargs, **extra)
    inputs = list(args) + [state]
    gradients = list(grads)
    assert len(gradients) == len(inputs) and grads._fields[-1] == "dinitial_state"
    directions = [rng.standard_normal(x.shape) for x in inputs]
    for which in ["all"] + list(range(len(inputs))):
        chosen = [d if which == "all" or which == i else np.zeros_like(d) for i, d in enumerate(directions)]
        plus = [x + eps * d for x, d in zip(inputs, chosen)]
        minus = [x - eps * d for x, d in zip(inputs, chosen)]
        expected = (public_loss(mod, plus[:-1], plus[-1], do, dstate, kwargs)
                    - public_loss(mod, minus[:-1], minus[-1], do, dstate, kwargs)) / (2 * eps)
        terms = [float((gr * d).sum()) for gr, d in zip(gradients, chosen)]
        got = sum(terms)
        scale = max(sum(abs(t) for t in terms), 1e-3)
        label = "all" if which == "all" else grads._fields[which]
        assert abs(got - expected) <= 1e-7 * scale, f"{label}: analytic {got:.12g}, finite differences {expected:.12g}"


@pytest.mark.parametrize("form", ["recurrent", "chunked", "parallel"])
@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_backward_with_normalize_qk_and_scale(rng, name, form):
    """normalize_qk=True: raw q, k of any length; the chain rule through L2 normalization and scale."""
    mod = PUBLIC[name]
    args, _ = mod.example_inputs(B=1, T=11, H=2, K=5, V=3, seed=int(rng.integers(1 << 16)))
    args = list(args)
    args[0] = 3 * rng.standard_normal(args[0].shape)
    args[1] = 2 * rng.standard_normal(args[1].shape)          # keys far from unit length
    state = rng.standard_normal((1, 2, 5, 3))
    assert_public_matches_finite_differences(rng, mod, args, state, {"normalize_qk": True, "scale": 0.7}, form)


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet"])
def test_public_backward_with_negative_eigenvalues(rng, name, form):
    """allow_neg_eigval=True with beta up to 2: transitions with eigenvalues down to -1."""
    mod = PUBLIC[name]
    args, _ = mod.example_inputs(B=2, T=9, H=1, K=4, V=6, seed=int(rng.integers(1 << 16)))
    args = list(args)
    args[-1] = rng.uniform(1.0, 2.0, args[-1].shape)
    state = rng.standard_normal((2, 1, 4, 6))
    assert_public_matches_finite_differences(rng, mod, args, state, {"allow_neg_eigval": True}, form)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_backward_forms_agree_and_keep_dtype(name):
    mod = PUBLIC[name]
    args, _ = mod.example_inputs(B=2, T=37, H=2, K=8, V=5, seed=3)
    rng = np.random.default_rng(5)
    do = rng.standard_normal((2, 37, 2, 5))
    reference = mod.recurrent_backward(*args, do=do)
    assert reference.dinitial_state is None
    for grads in [mod.chunked_backward(*args, do=do, chunk_size=16), mod.parallel_backward(*args, do=do)]:
        for field, got, ref in zip(grads._fields, grads, reference):
            assert (got is None) == (ref is None), field
            assert got is None or rel_err(got, ref) < 1e-10, field
    args32 = [x.astype(np.float32) for x in args]
    grads = mod.chunked_backward(*args32, do=do.astype(np.float32))
    assert all(x is None or x.dtype == np.float32 for x in grads)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_backward_names_bad_cotangents(name):
    mod = PUBLIC[name]
    args, _ = mod.example_inputs(B=2, T=6, H=2, K=4, V=3)
    with pytest.raises(ValueError, match=r"do: expected shape \[B, T, HV, V\] = \[2, 6, 2, 3\], got \[2, 6, 2\]"):
        mod.chunked_backward(*args, do=np.ones((2, 6, 2)))
    with pytest.raises(TypeError, match="do"):
        mod.recurrent_backward(*args, do=None)
    with pytest.raises(ValueError, match=r"dstate: expected shape"):
        mod.recurrent_backward(*args, do=np.ones((2, 6, 2, 3)), dstate=np.ones((2, 2, 4)))
    with pytest.raises(ValueError, match="dstate: expected finite"):
        mod.chunked_backward(*args, do=np.ones((2, 6, 2, 3)), dstate=np.full((2, 2, 4, 3), np.nan))


# ----- RWKV-7's generalized delta rule: S_t = (Diag(exp(w_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T -----

from minilin.mixers import rwkv7  # noqa: E402

RWKV7_NAMES = ["q", "w", "k", "v", "a", "b", "S0"]


def rwkv7_inputs(rng, B, T, H, K, V, *, initial_state=True, w_low=None, dtype=np.float64):
    """Engine inputs (q = scale * r), built as RWKV-7 builds a and b (a = -kappa, b = kappa * alpha);
    w in RWKV-7's range (-0.61, 0), or uniform in [w_low, -0.01]."""
    (r, w, k, v, a, b), _ = rwkv7.example_inputs(B, T, H, K, V, seed=int(rng.integers(1 << 16)))
    if w_low is not None:
        w = rng.uniform(w_low, -0.01, w.shape)
    S0 = rng.standard_normal((B, H, K, V)) if initial_state else None
    return [None if x is None else x.astype(dtype) for x in (0.5 * r, w, k, v, a, b, S0)]


def rwkv7_loss(inputs, do, dS):
    o, S = rwkv7.recurrent(*inputs[:6], scale=1.0, initial_state=inputs[6])
    return float((o * do).sum() + (0.0 if dS is None else (S * dS).sum()))


def rwkv7_backward(form, inputs, do, dS, chunk_size):
    if form == "recurrent":
        return rwkv7._recurrent_backward(*inputs, do, dS, checkpoint_every=5)
    return rwkv7._chunked_backward(*inputs, do, dS, chunk_size)


@pytest.mark.parametrize("case", ["T=1", "T % C != 0, K != V", "no initial state, no dS", "final state alone"])
@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_rwkv7_backward_matches_finite_differences(rng, form, case):
    B, T, H, K, V, C = {"T=1": (1, 1, 1, 4, 3, 16)}.get(case, (2, 21, 2, 5, 3, 8))
    inputs = rwkv7_inputs(rng, B, T, H, K, V, initial_state=case != "no initial state, no dS")
    do = np.zeros((B, T, H, V)) if case == "final state alone" else rng.standard_normal((B, T, H, V))
    dS = None if case == "no initial state, no dS" else rng.standard_normal((B, H, K, V))
    grads = rwkv7_backward(form, inputs, do, dS, C)
    for x, d in zip(inputs, grads):
        assert (x is None) == (d is None) and (d is None or (d.shape == x.shape and np.isfinite(d).all()))
    directions = [None if x is None else rng.standard_normal(x.shape) for x in inputs]
    eps = 1e-6
    for which in ["all"] + [i for i, x in enumerate(inputs) if x is not None]:
        chosen = [None if d is None else (d if which in ("all", i) else np.zeros_like(d))
                  for i, d in enumerate(directions)]
        plus = [None if x is None else x + eps * d for x, d in zip(inputs, chosen)]
        minus = [None if x is None else x - eps * d for x, d in zip(inputs, chosen)]
        expected = (rwkv7_loss(plus, do, dS) - rwkv7_loss(minus, do, dS)) / (2 * eps)
        terms = [float((gr * d).sum()) for gr, d in zip(grads, chosen) if gr is not None]
        scale = max(sum(abs(t) for t in terms), 1e-3)
        label = "all" if which == "all" else RWKV7_NAMES[which]
        assert abs(sum(terms) - expected) <= 1e-7 * scale, f"{label}: {sum(terms):.12g} vs {expected:.12g}"


def test_rwkv7_recurrent_and_chunked_backward_agree(rng):
    B, T, H, K, V = 2, 70, 2, 8, 5
    inputs = rwkv7_inputs(rng, B, T, H, K, V, w_low=-3.0)
    do, dS = rng.standard_normal((B, T, H, V)), rng.standard_normal((B, H, K, V))
    reference = rwkv7._recurrent_backward(*inputs, do, dS)
    for chunk_size in [1, 3, 16, 64]:
        got = rwkv7._chunked_backward(*inputs, do, dS, chunk_size)
        for name, g, r in zip(RWKV7_NAMES, got, reference):
            assert rel_err(g, r) < 1e-10, f"chunk_size={chunk_size}, d{name}: {rel_err(g, r):.2e}"


def test_rwkv7_float32_long_sequence_with_strong_decays_stays_finite(rng):
    B, T, H, K, V = 1, 4096, 1, 8, 8
    inputs = rwkv7_inputs(rng, B, T, H, K, V, w_low=-20.0, dtype=np.float32)
    do = rng.standard_normal((B, T, H, V)).astype(np.float32)
    dS = rng.standard_normal((B, H, K, V)).astype(np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        chunked = rwkv7._chunked_backward(*inputs, do, dS, 64)
        recurrent = rwkv7._recurrent_backward(*inputs, do, dS)
    for name, c, r in zip(RWKV7_NAMES, chunked, recurrent):
        assert c.dtype == np.float32 and np.isfinite(c).all() and np.isfinite(r).all(), name
        assert rel_err(c, r) < 1e-4, f"d{name}: chunked vs recurrent in float32 {rel_err(c, r):.2e}"


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_rwkv7_public_backward_matches_finite_differences(rng, form):
    """The public functions: dr through q = scale * r, every field named by SIGNATURE.gradients."""
    (r, w, k, v, a, b), _ = rwkv7.example_inputs(B=2, T=13, H=2, K=5, V=4, seed=int(rng.integers(1 << 16)))
    state = rng.standard_normal((2, 2, 5, 4))
    assert_public_matches_finite_differences(rng, rwkv7, [r, w, k, v, a, b], state, {"scale": 0.8}, form)


def test_rwkv7_public_backward_forms_agree_and_name_bad_cotangents(rng):
    (r, w, k, v, a, b), _ = rwkv7.example_inputs(B=1, T=40, H=2, K=6, V=3, seed=7)
    do = rng.standard_normal((1, 40, 2, 3))
    reference = rwkv7.recurrent_backward(r, w, k, v, a, b, do=do)
    got = rwkv7.chunked_backward(r, w, k, v, a, b, do=do, chunk_size=16)
    assert got._fields == ("dr", "dw", "dk", "dv", "da", "db", "dinitial_state") and got.dinitial_state is None
    assert max(rel_err(x, y) for x, y in zip(got[:-1], reference[:-1])) < 1e-10
    with pytest.raises(ValueError, match=r"do: expected shape \[B, T, H, V\] = \[1, 40, 2, 3\]"):
        rwkv7.chunked_backward(r, w, k, v, a, b, do=do[:, :-1])
    with pytest.raises(ValueError, match="dstate: expected shape"):
        rwkv7.recurrent_backward(r, w, k, v, a, b, do=do, dstate=np.zeros((1, 2, 6)))
