"""Grouped value heads (GVA, `minilin.heads`) and packed variable-length batches (cu_seqlens, `minilin.varlen`).

- GVA: q, k with H heads and v, gates, beta with HV = G * H heads equal the plain call on q, k whose head j
  is q/k head j // G (built here by indexing, not by the library's own expansion), for every form and step,
  to ~1e-12 in float64; the backward's dq, dk are the expanded call's summed over each group, and all
  gradients match central finite differences.
- cu_seqlens: a packed call equals one call per sequence (same form, and the recurrent definition), for
  several length mixes (length-1 sequences, lengths not multiples of the chunk), with and without initial
  states, gradients included (and finite differences of the packed call).
- Bad cu_seqlens and HV not a multiple of H raise, naming the argument, the expectation and what was given.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from minilin.mixers import deltanet, gated_deltanet, gla, kda, linear_attention, simple_gla
import directional
from conftest import rel_err

MIXERS = {"linear_attention": linear_attention, "simple_gla": simple_gla, "gla": gla, "deltanet": deltanet,
          "gated_deltanet": gated_deltanet, "kda": kda}
FORMS = ("recurrent", "chunked", "parallel")
CHUNK = 4
TIGHT = 1e-12


def close(out, ref, tol=TIGHT) -> bool:
    """||out - ref|| <= tol * max(||ref||, 1): relative error, but an exact zero (the gate gradient of a
    sequence's first token when it starts from zeros) is compared in absolute terms, not against its own
    rounding noise. Inputs and cotangents here are of order 1."""
    return float(np.linalg.norm(out - ref)) <= tol * max(float(np.linalg.norm(ref)), 1.0)


def names(mod):
    return mod.SIGNATURE.names


def grouped_inputs(mod, B, T, H, G, K, V, seed):
    """Random valid inputs with q, k on H heads and the value side on H * G heads, as a dict by name."""
    value_side, _ = mod.example_inputs(B, T, H * G, K, V, seed=seed)
    query_key, _ = mod.example_inputs(B, T, H, K, V, seed=seed + 100)
    inputs = dict(zip(names(mod), value_side))
    inputs["q"], inputs["k"] = query_key[0], query_key[1]
    return inputs


def expanded(inputs, G):
    """The plain layout: q/k head j // G for value head j, by indexing."""
    out = dict(inputs)
    H = inputs["q"].shape[-2]
    index = [j // G for j in range(H * G)]
    out["q"], out["k"] = inputs["q"][..., index, :], inputs["k"][..., index, :]
    return out


def summed_over_groups(dx, G):
    """dx [..., H * G, K] -> [..., H, K]: head i is the sum of heads i G ... i G + G - 1, by a loop."""
    H = dx.shape[-2] // G
    return np.stack([sum(dx[..., i * G + r, :] for r in range(G)) for i in range(H)], axis=-2)


def call(mod, form, inputs, **options):
    if form == "chunked":
        options.setdefault("chunk_size", CHUNK)
    return getattr(mod, form)(*(inputs[n] for n in names(mod)), **options)


def state_like(mod, inputs, N, seed, columns=0):
    """A random state [N, HV, K, V + columns] (columns = 1: linear attention's normalizer column, positive)."""
    rng = np.random.default_rng(seed)
    HV, K, V = inputs["v"].shape[2], inputs["k"].shape[3], inputs["v"].shape[3]
    S = rng.standard_normal((N, HV, K, V + columns)) * 0.5
    if columns:
        S[..., V:] = np.abs(S[..., V:]) + 0.1
    return S


# ----- grouped value heads -----------------------------------------------------------------------------

@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", MIXERS)
@pytest.mark.parametrize("G", [1, 3])
def test_grouped_heads_equal_the_expanded_call(name, form, G):
    mod = MIXERS[name]
    inputs = grouped_inputs(mod, 2, 11, 2, G, 5, 4, seed=1)
    S0 = state_like(mod, inputs, 2, seed=2)
    o, S = call(mod, form, inputs, initial_state=S0)
    o_ref, S_ref = call(mod, form, expanded(inputs, G), initial_state=S0)
    assert o.shape == (2, 11, 2 * G, 4) and S.shape == (2, 2 * G, 5, 4)
    assert rel_err(o, o_ref) < TIGHT and rel_err(S, S_ref) < TIGHT


@pytest.mark.parametrize("name", MIXERS)
def test_grouped_heads_chunked_equals_recurrent(name):
    """Not only the same code on copies: the chunked form against the definition, both grouped."""
    mod = MIXERS[name]
    inputs = grouped_inputs(mod, 1, 13, 2, 2, 6, 3, seed=3)
    o, S = call(mod, "chunked", inputs)
    o_ref, S_ref = call(mod, "recurrent", inputs)
    assert rel_err(o, o_ref) < 1e-10 and rel_err(S, S_ref) < 1e-10


@pytest.mark.parametrize("name", MIXERS)
def test_grouped_heads_step(name):
    """Decoding token by token with grouped heads equals the expanded step and the grouped recurrent form."""
    mod = MIXERS[name]
    G = 2
    inputs = grouped_inputs(mod, 2, 5, 2, G, 4, 3, seed=4)
    plain = expanded(inputs, G)
    o_rec, S_rec = call(mod, "recurrent", inputs)
    state = state_ref = None
    for t in range(5):
        o_t, state = mod.step(*(inputs[n][:, t] for n in names(mod)), state=state)
        o_ref, state_ref = mod.step(*(plain[n][:, t] for n in names(mod)), state=state_ref)
        assert o_t.shape == (2, 2 * G, 3)
        assert rel_err(o_t, o_ref) < TIGHT and rel_err(state, state_ref) < TIGHT
        assert rel_err(o_t, o_rec[:, t]) < 1e-12
    assert rel_err(state, S_rec) < 1e-12


def backward(mod, form, inputs, do, dstate, **options):
    if form == "chunked":
        options.setdefault("chunk_size", CHUNK)
    grads = getattr(mod, f"{form}_backward")(*(inputs[n] for n in names(mod)), do=do, dstate=dstate, **options)
    return {n: getattr(grads, f"d{n}") for n in names(mod)}, grads.dinitial_state


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", MIXERS)
def test_grouped_heads_backward_equals_the_expanded_call(name, form):
    mod = MIXERS[name]
    G = 3
    inputs = grouped_inputs(mod, 2, 9, 2, G, 5, 4, seed=5)
    S0 = state_like(mod, inputs, 2, seed=6)
    rng = np.random.default_rng(7)
    do, dstate = rng.standard_normal((2, 9, 2 * G, 4)), rng.standard_normal(S0.shape)
    grads, dS0 = backward(mod, form, inputs, do, dstate, initial_state=S0)
    ref, dS0_ref = backward(mod, form, expanded(inputs, G), do, dstate, initial_state=S0)
    for n in names(mod):
        want = summed_over_groups(ref[n], G) if n in ("q", "k") else ref[n]
        assert grads[n].shape == inputs[n].shape, f"d{n}"
        assert rel_err(grads[n], want) < TIGHT, f"{name}.{form}_backward: d{n}"
    assert rel_err(dS0, dS0_ref) < TIGHT


def packed_loss(mod, form, do, dstate, **options):
    def loss(**inputs):
        state = inputs.pop("initial_state", None)
        o, S = call(mod, form, inputs, initial_state=state, **options)
        return float((o * do).sum()) + directional.inner(S, dstate)
    return loss


def check_finite_differences(mod, form, inputs, S0, do, dstate, seed, **options):
    grads, dS0 = backward(mod, form, inputs, do, dstate, initial_state=S0, **options)
    grads["initial_state"] = dS0
    arrays = dict(inputs, initial_state=S0)
    rng = np.random.default_rng(seed)
    directional.check_all_and_each(rng, packed_loss(mod, form, do, dstate, **options), arrays, grads)


@pytest.mark.parametrize("form", ("recurrent", "chunked"))
@pytest.mark.parametrize("name", MIXERS)
def test_grouped_heads_backward_matches_finite_differences(name, form):
    mod = MIXERS[name]
    inputs = grouped_inputs(mod, 1, 7, 2, 2, 3, 4, seed=8)
    S0 = state_like(mod, inputs, 1, seed=9)
    rng = np.random.default_rng(10)
    do, dstate = rng.standard_normal((1, 7, 4, 4)), rng.standard_normal(S0.shape)
    check_finite_differences(mod, form, inputs, S0, do, dstate, seed=11)


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet", "kda"])
def test_grouped_heads_with_normalize_qk(name):
    """normalize_qk: the group's gradients are summed before the chain rule of the L2 normalization."""
    mod = MIXERS[name]
    inputs = grouped_inputs(mod, 1, 6, 1, 3, 4, 3, seed=12)
    rng = np.random.default_rng(13)
    inputs["q"], inputs["k"] = rng.standard_normal(inputs["q"].shape), rng.standard_normal(inputs["k"].shape)
    S0 = state_like(mod, inputs, 1, seed=14)
    do, dstate = rng.standard_normal((1, 6, 3, 3)), rng.standard_normal(S0.shape)
    o, S = call(mod, "chunked", inputs, initial_state=S0, normalize_qk=True)
    o_ref, S_ref = call(mod, "chunked", expanded(inputs, 3), initial_state=S0, normalize_qk=True)
    assert rel_err(o, o_ref) < TIGHT and rel_err(S, S_ref) < TIGHT
    check_finite_differences(mod, "chunked", inputs, S0, do, dstate, seed=15, normalize_qk=True)


@pytest.mark.parametrize("form", ("recurrent", "chunked"))
def test_normalized_linear_attention_with_both_layouts(form):
    """normalize=True: the normalizer column rides in the state [N, HV, F, V + 1]; grouped and packed at once,
    against the expanded call per sequence, and the gradients against finite differences."""
    options = {"feature_map": "elu+1", "normalize": True}
    G, lengths = 2, (1, 5, 3)
    inputs = grouped_inputs(linear_attention, 1, 9, 2, G, 3, 4, seed=30)
    S0 = state_like(linear_attention, inputs, 3, seed=31, columns=1)
    cu = offsets(lengths)
    o, S = call(linear_attention, form, inputs, initial_state=S0, cu_seqlens=cu, **options)
    assert S.shape == (3, 2 * G, 3, 5)
    plain = expanded(inputs, G)
    for n in range(3):
        tokens = slice(int(cu[n]), int(cu[n + 1]))
        o_n, S_n = call(linear_attention, form, sequence(plain, tokens.start, tokens.stop),
                        initial_state=S0[n:n + 1], **options)
        assert rel_err(o[:, tokens], o_n) < TIGHT and rel_err(S[n:n + 1], S_n) < TIGHT
    rng = np.random.default_rng(32)
    do, dstate = rng.standard_normal(o.shape), rng.standard_normal(S.shape)
    check_finite_differences(linear_attention, form, inputs, S0, do, dstate, seed=33, cu_seqlens=cu, **options)
    with pytest.raises(ValueError, match=re.escape(
            "initial_state: expected shape [N, HV, K, V+1] = [3, 4, 3, 5], got [3, 4, 3, 4]")):
        call(linear_attention, form, inputs, initial_state=S0[..., :4], cu_seqlens=cu, **options)
    with pytest.raises(ValueError, match=re.escape("dstate: expected shape [N, HV, K, V+1] = [3, 4, 3, 5], got [1, 4, 3, 5]")):
        backward(linear_attention, form, inputs, do, dstate[:1], initial_state=S0, cu_seqlens=cu, **options)


@pytest.mark.parametrize("name", MIXERS)
def test_value_heads_not_a_multiple_of_query_heads(name):
    mod = MIXERS[name]
    inputs = grouped_inputs(mod, 1, 5, 1, 3, 4, 3, seed=16)        # HV = 3
    inputs["q"] = np.concatenate([inputs["q"]] * 2, axis=2)           # H = 2
    inputs["k"] = np.concatenate([inputs["k"]] * 2, axis=2)
    message = ("q and k, v: expected the value heads HV a multiple of the query/key heads H = 2 (each q/k head "
               "shared by HV / H value heads), got v with HV = 3 heads and q and k with H = 2")
    for form in FORMS:
        with pytest.raises(ValueError, match=re.escape(message)):
            call(mod, form, inputs)
    with pytest.raises(ValueError, match=re.escape(message)):
        mod.step(*(inputs[n][:, 0] for n in names(mod)))
    with pytest.raises(ValueError, match=re.escape(message)):
        backward(mod, "chunked", inputs, np.ones((1, 5, 3, 3)), None)


def test_query_and_key_heads_must_agree():
    inputs = grouped_inputs(gated_deltanet, 1, 5, 2, 2, 4, 3, seed=17)
    inputs["k"] = inputs["k"][:, :, :1]
    with pytest.raises(ValueError, match=re.escape("k: expected shape [B, T, H, K] = [1, 5, 2, 4], got [1, 5, 1, 4]")):
        call(gated_deltanet, "chunked", inputs)


# ----- packed sequences -------------------------------------------------------------------------------

LENGTHS = [(1, 7, 4), (5,), (3, 1, 1, 9), (13, 1), (1,)]


def offsets(lengths, dtype=np.int64):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)


def sequence(inputs, start, end):
    return {n: x[:, start:end] for n, x in inputs.items()}


@pytest.mark.parametrize("with_state", [False, True], ids=["zeros", "state"])
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda L: "-".join(map(str, L)))
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", MIXERS)
def test_packed_sequences_equal_one_call_each(name, form, lengths, with_state):
    mod = MIXERS[name]
    T, N = sum(lengths), len(lengths)
    G = 2 if name == "gated_deltanet" else 1            # the two layouts together, once
    inputs = grouped_inputs(mod, 1, T, 2, G, 5, 3, seed=T + N)
    S0 = state_like(mod, inputs, N, seed=N) if with_state else None
    cu = offsets(lengths, np.int32 if N % 2 else np.int64)
    o, S = call(mod, form, inputs, initial_state=S0, cu_seqlens=cu)
    assert o.shape == inputs["v"].shape and S.shape == (N, 2 * G, 5, 3)
    for n in range(N):
        part = sequence(inputs, int(cu[n]), int(cu[n + 1]))
        S0_n = None if S0 is None else S0[n:n + 1]
        o_n, S_n = call(mod, form, part, initial_state=S0_n)
        assert rel_err(o[:, cu[n]:cu[n + 1]], o_n) < TIGHT, f"sequence {n}: output"
        assert rel_err(S[n:n + 1], S_n) < TIGHT, f"sequence {n}: final state"
        o_def, S_def = call(mod, "recurrent", part, initial_state=S0_n)   # and the definition
        assert rel_err(o[:, cu[n]:cu[n + 1]], o_def) < 1e-10 and rel_err(S[n:n + 1], S_def) < 1e-10


@pytest.mark.parametrize("with_state", [False, True], ids=["zeros", "state"])
@pytest.mark.parametrize("lengths", LENGTHS[:4], ids=lambda L: "-".join(map(str, L)))
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", MIXERS)
def test_packed_gradients_equal_one_call_each(name, form, lengths, with_state):
    mod = MIXERS[name]
    T, N = sum(lengths), len(lengths)
    G = 2 if name == "kda" else 1
    inputs = grouped_inputs(mod, 1, T, 2, G, 4, 3, seed=2 * T + N)
    S0 = state_like(mod, inputs, N, seed=N + 1) if with_state else None
    rng = np.random.default_rng(T)
    do, dstate = rng.standard_normal(inputs["v"].shape), rng.standard_normal((N, 2 * G, 4, 3))
    cu = offsets(lengths)
    grads, dS0 = backward(mod, form, inputs, do, dstate, initial_state=S0, cu_seqlens=cu)
    assert (dS0 is None) == (S0 is None)
    for n in range(N):
        tokens = slice(int(cu[n]), int(cu[n + 1]))
        part = sequence(inputs, tokens.start, tokens.stop)
        ref, dS0_n = backward(mod, form, part, do[:, tokens], dstate[n:n + 1],
                              initial_state=None if S0 is None else S0[n:n + 1])
        for x in names(mod):
            assert close(grads[x][:, tokens], ref[x]), f"sequence {n}: d{x}"
        if S0 is not None:
            assert close(dS0[n:n + 1], dS0_n), f"sequence {n}: dinitial_state"


@pytest.mark.parametrize("form", ("recurrent", "chunked"))
@pytest.mark.parametrize("name", MIXERS)
def test_packed_gradients_match_finite_differences(name, form):
    mod = MIXERS[name]
    lengths = (1, 6, 3)
    inputs = grouped_inputs(mod, 1, 10, 1, 2, 3, 4, seed=18)
    S0 = state_like(mod, inputs, 3, seed=19)
    rng = np.random.default_rng(20)
    do, dstate = rng.standard_normal(inputs["v"].shape), rng.standard_normal(S0.shape)
    check_finite_differences(mod, form, inputs, S0, do, dstate, seed=21, cu_seqlens=offsets(lengths))


@pytest.mark.parametrize("name", MIXERS)
def test_packed_final_state_gradient_alone(name):
    """dstate only (do = 0): each sequence's initial state gets its own sequence's gradient, no other."""
    mod = MIXERS[name]
    inputs = grouped_inputs(mod, 1, 6, 2, 1, 3, 3, seed=22)
    S0 = state_like(mod, inputs, 2, seed=23)
    dstate = np.zeros((2, 2, 3, 3))
    dstate[1] = np.random.default_rng(24).standard_normal((2, 3, 3))
    grads, dS0 = backward(mod, "chunked", inputs, np.zeros(inputs["v"].shape), dstate, initial_state=S0,
                          cu_seqlens=offsets((2, 4)))
    assert not dS0[0].any() and dS0[1].any()
    for x in names(mod):
        assert not grads[x][:, :2].any(), f"d{x} of the first sequence"


# ----- bad cu_seqlens ----------------------------------------------------------------------------------

BAD = [
    (np.array([[0, 3, 8]]), ValueError, "cu_seqlens: expected a 1-D array [N + 1] with N >= 1 sequences, got shape [1, 3]"),
    (np.array([0]), ValueError, "cu_seqlens: expected a 1-D array [N + 1] with N >= 1 sequences, got shape [1]"),
    (np.array([0.0, 3.0, 8.0]), TypeError, "cu_seqlens: expected an integer array (int32 or int64), got float64"),
    (np.array([False, True]), TypeError, "cu_seqlens: expected an integer array (int32 or int64), got bool"),
    (np.array([0, 3, 8], dtype=np.uint32), TypeError, "cu_seqlens: expected an integer array (int32 or int64), got uint32"),
    (np.array([0, 3, 8], dtype=np.int16), TypeError, "cu_seqlens: expected an integer array (int32 or int64), got int16"),
    ([0, 3, 8], TypeError, "cu_seqlens: expected a 1-D integer array (int32 or int64) [N + 1], got list"),
    (np.array([1, 3, 8]), ValueError, "cu_seqlens: expected cu_seqlens[0] = 0, got 1"),
    (np.array([0, 3, 7]), ValueError, "cu_seqlens: expected cu_seqlens[-1] = T = 8 (every token in one sequence), got 7"),
    (np.array([0, 3, 9]), ValueError, "cu_seqlens: expected cu_seqlens[-1] = T = 8 (every token in one sequence), got 9"),
    (np.array([0, 3, 3, 8], np.int32), ValueError, "cu_seqlens: expected strictly increasing offsets (every sequence at "
     "least one token), got cu_seqlens[1] = 3, cu_seqlens[2] = 3"),
    (np.array([0, 5, 2, 8]), ValueError, "cu_seqlens: expected strictly increasing offsets (every sequence at "
     "least one token), got cu_seqlens[1] = 5, cu_seqlens[2] = 2"),
]


@pytest.mark.parametrize("cu, error, message", BAD, ids=[m.split("got ")[-1] for _, _, m in BAD])
@pytest.mark.parametrize("name", MIXERS)
def test_bad_cu_seqlens(name, cu, error, message):
    mod = MIXERS[name]
    inputs = grouped_inputs(mod, 1, 8, 2, 1, 4, 3, seed=25)
    for form in FORMS:
        with pytest.raises(error, match=re.escape(message)):
            call(mod, form, inputs, cu_seqlens=cu)
    with pytest.raises(error, match=re.escape(message)):
        backward(mod, "recurrent", inputs, np.ones((1, 8, 2, 3)), None, cu_seqlens=cu)


@pytest.mark.parametrize("name", MIXERS)
def test_cu_seqlens_needs_one_batch(name):
    mod = MIXERS[name]
    inputs = grouped_inputs(mod, 2, 8, 2, 1, 4, 3, seed=26)
    with pytest.raises(ValueError, match=re.escape("cu_seqlens: expected B = 1 (the sequences packed along T), got B = 2")):
        call(mod, "chunked", inputs, cu_seqlens=offsets((3, 5)))


@pytest.mark.parametrize("name", MIXERS)
def test_packed_states_are_one_per_sequence(name):
    mod = MIXERS[name]
    inputs = grouped_inputs(mod, 1, 8, 2, 1, 4, 3, seed=27)
    cu = offsets((3, 5))
    with pytest.raises(ValueError, match=re.escape(
            "initial_state: expected shape [N, HV, K, V] = [2, 2, 4, 3], got [1, 2, 4, 3]")):
        call(mod, "chunked", inputs, cu_seqlens=cu, initial_state=np.zeros((1, 2, 4, 3)))
    with pytest.raises(ValueError, match=re.escape("dstate: expected shape [N, HV, K, V] = [2, 2, 4, 3], got [1, 2, 4, 3]")):
        backward(mod, "chunked", inputs, np.ones((1, 8, 2, 3)), np.zeros((1, 2, 4, 3)), cu_seqlens=cu)
