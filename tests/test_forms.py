"""Every mixer's forms compute the same function (float64, 1e-10; the one-form mixers are measured in
test_approximations.py), continue from a returned state, and a loop of `step` equals the recurrence. Driven by
the catalog, so a new mixer is covered on arrival."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minilin import catalog, chunking
from conftest import is_sequence, rel_err, state_err, time_slice

TOL = 1e-10
MIXERS = catalog.names()
# The agreement tests need two forms to compare; the one-form mixers (Linformer, Nystromformer: parallel only)
# are measured against their exact function in test_approximations.py instead.
SEVERAL_FORMS = [n for n in MIXERS if len(catalog.forms(n)) > 1]
# (B, T, H, K, V, chunk_size): T = 1, T % chunk != 0, chunk 16 and 64, K != V, B > 1, H > 1.
SHAPES = [
    (1, 1, 1, 4, 4, 16),
    (2, 37, 3, 8, 5, 16),
    (1, 64, 2, 16, 16, 64),
    (2, 130, 2, 8, 12, 64),
    (1, 100, 1, 6, 9, 16),
]


def run_form(mod, form, args, kwargs, chunk_size, **extra):
    fn = getattr(mod, form)
    if form == "chunked":
        extra["chunk_size"] = chunk_size
    return fn(*args, **kwargs, **extra)


def assert_forms_agree(name, B, T, H, K, V, chunk_size, seed):
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(B, T, H, K, V, seed=seed)
    baseline = catalog.baseline_form(name)
    ref, ref_state = run_form(mod, baseline, args, kwargs, chunk_size)
    assert np.isfinite(ref).all()
    for form in catalog.forms(name):
        out, state = run_form(mod, form, args, kwargs, chunk_size)
        assert out.shape == ref.shape and out.dtype == ref.dtype, f"{name}.{form}: {out.shape} {out.dtype}"
        err = rel_err(out, ref)
        assert err < TOL, f"{name}.{form} vs {baseline}: output relative error {err:.2e}"
        err = state_err(state, ref_state)
        assert err < TOL, f"{name}.{form} vs {baseline}: final state relative error {err:.2e}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}C{}".format(*s))
@pytest.mark.parametrize("name", SEVERAL_FORMS)
def test_forms_agree_on_awkward_shapes(name, shape):
    assert_forms_agree(name, *shape, seed=hash(shape) % 1000)


@pytest.mark.parametrize("name", SEVERAL_FORMS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(B=st.integers(1, 2), T=st.integers(1, 80), H=st.integers(1, 3), K=st.integers(1, 9),
       V=st.integers(1, 9), chunk_size=st.sampled_from([1, 3, 16, 64]), seed=st.integers(0, 2**16))
def test_forms_agree_hypothesis(name, B, T, H, K, V, chunk_size, seed):
    assert_forms_agree(name, B, T, H, K, V, chunk_size, seed)


def stateful(name) -> bool:
    """Causal mixers with a state to carry (the non-causal approximations have neither)."""
    return callable(getattr(catalog.module(name), "step", None))


@pytest.mark.parametrize("name", [n for n in MIXERS if stateful(n)])
def test_continuation_from_returned_state(name):
    """Running [0, T) equals running [0, t) and then [t, T) from the returned state, in every form."""
    B, T, H, K, V, t = 2, 75, 2, 8, 6, 29
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(B, T, H, K, V, seed=7)
    for form in catalog.forms(name):
        full, full_state = run_form(mod, form, args, kwargs, 16)
        head, head_state = run_form(mod, form, time_slice(args, slice(0, t)), kwargs, 16)
        tail, tail_state = run_form(mod, form, time_slice(args, slice(t, T)), kwargs, 16, initial_state=head_state)
        err = rel_err(np.concatenate([head, tail], axis=1), full)
        assert err < TOL, f"{name}.{form}: continued output relative error {err:.2e}"
        err = state_err(tail_state, full_state)
        assert err < TOL, f"{name}.{form}: continued final state relative error {err:.2e}"


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet", "kda"])
def test_delta_state_is_affine_in_its_start(name):
    """What the CUDA split of the delta rule (csrc/delta/v12_split_sequence.cu) stands on: the final state is
    A S_0 + L for every start S_0, where [L | A] is the final state of the same run with K more value columns, v = 0
    there, from the start [0 | I] (each column of the state evolves alone, so the identity's columns become A)."""
    B, T, H, K, V = 2, 75, 2, 6, 5
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(B, T, H, K, V, seed=13)
    q, k, v, *gates = args
    if len(gates) == 2:  # the example gates forget the start within these 75 tokens: decay 50 times slower
        gates[0] = gates[0] * 0.02
    args = (q, k, v, *gates)
    widened = np.concatenate([v, np.zeros(v.shape[:-1] + (K,))], axis=-1)
    start = np.concatenate([np.zeros((B, H, K, V)), np.broadcast_to(np.eye(K), (B, H, K, K))], axis=-1)
    _, carried = mod.chunked(q, k, widened, *gates, **kwargs, initial_state=start, chunk_size=16)
    L, A = carried[..., :V], carried[..., V:]
    S0 = np.random.default_rng(14).standard_normal((B, H, K, V))
    _, state = mod.chunked(*args, **kwargs, initial_state=S0, chunk_size=16)
    assert state_err(L, state) > 1e-3  # the start still shows in the final state, so A is tested
    assert state_err(A @ S0 + L, state) < TOL


@pytest.mark.parametrize("name", [n for n in MIXERS if stateful(n)])
def test_step_loop_equals_recurrent(name):
    B, T, H, K, V = 2, 23, 3, 5, 7
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(B, T, H, K, V, seed=11)
    ref, ref_state = getattr(mod, catalog.baseline_form(name))(*args, **kwargs)
    state, outputs = None, []
    for t in range(T):
        o_t, state = mod.step(*time_slice(args, t), state=state, **kwargs)
        outputs.append(o_t)
    err = rel_err(np.stack(outputs, axis=1), ref)
    assert err < TOL, f"{name}.step loop: output relative error {err:.2e}"
    assert state_err(state, ref_state) < TOL


@pytest.mark.parametrize("tokens", [1, 24, 48])
@pytest.mark.parametrize("name", [n for n in MIXERS if "chunked" in catalog.forms(n) and stateful(n)])
def test_chunked_forms_agree_segment_by_segment(name, tokens, monkeypatch):
    """The chunked forward forms take the sequence a segment of whole chunks at a time (`chunking.segments`,
    SEGMENT_TOKENS = 512 by default, more than these tests' T): with segments of one chunk and of 24 and 48
    tokens (not multiples of the chunk), T not a multiple of the chunk, and with and without an initial
    state, they still equal the definition."""
    monkeypatch.setattr(chunking, "SEGMENT_TOKENS", tokens)
    assert_forms_agree(name, 2, 100, 2, 8, 12, 16, seed=tokens)
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(2, 100, 2, 8, 12, seed=tokens + 1)
    _, S0 = mod.recurrent(*time_slice(args, slice(0, 29)), **kwargs)
    rest = time_slice(args, slice(29, 100))
    ref, ref_state = mod.recurrent(*rest, **kwargs, initial_state=S0)
    for C in (5, 16):
        out, state = mod.chunked(*rest, **kwargs, initial_state=S0, chunk_size=C)
        assert rel_err(out, ref) < TOL, f"{name}.chunked C={C}: output relative error {rel_err(out, ref):.2e}"
        assert state_err(state, ref_state) < TOL, f"{name}.chunked C={C}: final state relative error"


@pytest.mark.parametrize("name", MIXERS)
def test_float32_forms_agree_at_T2048(name):
    """float32 forms agree with each other and with the float64 definition to 1e-4 at T = 2048."""
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(1, 2048, 2, 32, 32, dtype=np.float32, seed=3)
    args64 = tuple(a.astype(np.float64) if hasattr(a, "astype") else a for a in args)
    baseline = catalog.baseline_form(name)
    ref64, _ = getattr(mod, baseline)(*args64, **kwargs)
    for form in catalog.forms(name):
        out, _ = run_form(mod, form, args, kwargs, 64)
        assert out.dtype == np.float32, f"{name}.{form} returned {out.dtype} for float32 inputs"
        err = rel_err(out, ref64)
        assert err < 1e-4, f"{name}.{form} float32 vs float64 {baseline}: relative error {err:.2e}"


def test_every_sequence_input_is_sliced_consistently():
    """The test protocol above relies on it: sequence inputs are [B, T, ...], parameters are not."""
    for name in MIXERS:
        args, _ = catalog.module(name).example_inputs(2, 7, 3, 4, 5)
        for a in args:
            if is_sequence(a):
                assert a.shape[:2] == (2, 7), f"{name}: sequence input of shape {a.shape}"


def _arrays(x):
    """Every array in an output or state: an array, a tuple of them (a cache), or none."""
    if isinstance(x, (tuple, list)):
        return [a for item in x for a in _arrays(item)]
    return [x] if isinstance(x, np.ndarray) and x.ndim > 0 else []


@pytest.mark.parametrize("name", MIXERS)
def test_no_form_returns_memory_shared_with_its_inputs(name):
    """Outputs and states are arrays of their own: changing one in place changes no input and no other
    output (the easy mistakes: hgrn's one array as both output and state, attention's cache holding the
    caller's k and v). Checked for every form, with and without a state passed in, and for step."""
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(2, 9, 2, 4, 3, seed=5)
    calls = [(form, args, {}) for form in catalog.forms(name)]
    if stateful(name):
        _, state = mod.recurrent(*args, **kwargs)
        calls += [(form, args, {"initial_state": state}) for form in catalog.forms(name)]
        calls += [("step", time_slice(args, 0), {"state": None}), ("step", time_slice(args, 0), {"state": state})]
    for form, call_args, extra in calls:
        out, new_state = run_form(mod, form, call_args, kwargs, 4, **extra)
        returned = _arrays(out) + _arrays(new_state)
        given = _arrays(list(call_args)) + _arrays(list(extra.values()))
        for i, a in enumerate(returned):
            for b in given + returned[i + 1:]:
                assert not np.shares_memory(a, b), f"{name}.{form}{' with a state' if extra else ''}: " \
                                                   f"a returned array shares memory with an input or another output"
