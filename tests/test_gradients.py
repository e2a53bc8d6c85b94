"""Every mixer's backward forms, driven by the catalog and the signatures, so a new mixer is covered on arrival:

- central finite differences in float64 along random directions, all inputs at once and each input alone
  (sequence inputs, parameters, the initial state), at awkward shapes (T = 1, T not a multiple of the
  chunk, K != V, a state given);
- recurrent_backward == chunked_backward (and the other backward forms) to 1e-10 for several chunk sizes;
- the final state's gradient alone (do = 0);
- float32 at T = 4096 with gates down to -20: no NaN or inf;
- bad cotangents: a clear error naming `do` or `dstate`.
The families' own files (test_backward_*.py) test their engines and special parameters in more depth.
"""
from __future__ import annotations

import numpy as np
import pytest

from minilin import catalog, chunking
import directional
from conftest import rel_err

CAUSAL = [n for n in catalog.names() if callable(getattr(catalog.module(n), "step", None))]
NONCAUSAL = [n for n in catalog.names() if n not in CAUSAL]
BACKWARD_FORMS = ("recurrent", "chunked", "parallel", "scan", "convolution")
# (B, T, H, K, V, chunk_size, with a state)
SHAPES = [(1, 1, 1, 4, 4, 16, False), (2, 37, 2, 6, 5, 16, True), (1, 20, 2, 5, 7, 8, False)]


def backward_forms(name):
    mod = catalog.module(name)
    return [form for form in BACKWARD_FORMS if callable(getattr(mod, f"{form}_backward", None))]


def has_array_state(name) -> bool:
    return catalog.signature(name).state is not None or name == "linear_attention"


def call(mod, form, args, kwargs, chunk_size, **extra):
    """mod.<form>(*args, ...), the chunk size passed to the chunked forms, forward and backward."""
    options = dict(kwargs, **extra)
    if form in ("chunked", "chunked_backward"):
        options["chunk_size"] = chunk_size
    return getattr(mod, form)(*args, **options)


def setup(name, B, T, H, K, V, with_state, seed):
    """Inputs as a dict by name (positional arrays, array keywords, initial_state), the other keywords, and
    random cotangents (dstate None where the state is a cache)."""
    mod = catalog.module(name)
    sig = catalog.signature(name)
    args, kwargs = mod.example_inputs(B, T, H, K, V, seed=seed)
    inputs = dict(zip(sig.names, args))
    rng = np.random.default_rng(seed + 1)
    forward = getattr(mod, catalog.baseline_form(name))
    if with_state:
        _, state = forward(*args, **kwargs)
        inputs["initial_state"] = state
    o, state = forward(*args, **kwargs, **({"initial_state": inputs["initial_state"]} if with_state else {}))
    do = rng.standard_normal(o.shape)
    dstate = directional.direction(rng, state) if has_array_state(name) else None
    return mod, sig, inputs, kwargs, do, dstate


def loss_fn(mod, sig, form, kwargs, do, dstate, chunk_size):
    def loss(**inputs):
        args = [inputs[n] for n in sig.names]
        extra = {"initial_state": inputs["initial_state"]} if "initial_state" in inputs else {}
        o, state = call(mod, form, args, kwargs, chunk_size, **extra)
        total = float((o * do).sum())
        if dstate is not None:
            total += directional.inner(state, dstate)
        return total
    return loss


def grads_by_name(grads, inputs):
    return {name: getattr(grads, f"d{name}") for name in inputs}


def run_backward(mod, sig, form, inputs, kwargs, do, dstate, chunk_size):
    args = [inputs[n] for n in sig.names]
    extra = {"initial_state": inputs["initial_state"]} if "initial_state" in inputs else {}
    return call(mod, f"{form}_backward", args, kwargs, chunk_size, do=do, dstate=dstate, **extra)


CASES = [(name, form) for name in CAUSAL for form in backward_forms(name)] + \
        [(name, "parallel") for name in NONCAUSAL]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}C{}{}".format(*s[:6], "S" if s[6] else ""))
@pytest.mark.parametrize("name, form", CASES)
def test_backward_matches_finite_differences(name, form, shape):
    B, T, H, K, V, C, with_state = shape
    if name in NONCAUSAL and (with_state or T < 4):
        pytest.skip("the non-causal approximations take no state and need a few tokens")
    mod, sig, inputs, kwargs, do, dstate = setup(name, B, T, H, K, V, with_state and name in CAUSAL, seed=T + K)
    grads = run_backward(mod, sig, form, inputs, kwargs, do, dstate, C)
    assert type(grads).__name__.endswith("Gradients")
    by_name = grads_by_name(grads, inputs)
    loss = loss_fn(mod, sig, form, kwargs, do, dstate, C)
    rng = np.random.default_rng(T)
    given = {n: x for n, x in inputs.items() if x is not None}
    directions = {n: directional.direction(rng, x) for n, x in given.items()}
    directional.check(loss, inputs, by_name, directions)                    # every input at once
    for n in given:                                                        # and each alone
        directional.check(loss, inputs, by_name, {n: directions[n]})
    for field in grads._fields:  # an optional input left out (the initial state here) has None, not zeros
        if field[1:] not in given:
            assert getattr(grads, field) is None, f"{field}: expected None for an input that was not given"


@pytest.mark.parametrize("name", CAUSAL)
def test_backward_forms_agree_for_several_chunk_sizes(name):
    mod, sig, inputs, kwargs, do, dstate = setup(name, 2, 45, 2, 6, 5, True, seed=9)
    ref = grads_by_name(run_backward(mod, sig, "recurrent", inputs, kwargs, do, dstate, 16), inputs)
    for form in backward_forms(name):
        for C in ((1, 3, 16, 64) if form == "chunked" else (16,)):
            got = grads_by_name(run_backward(mod, sig, form, inputs, kwargs, do, dstate, C), inputs)
            for n, g in ref.items():
                err = directional_err(got[n], g)
                assert err < 1e-10, f"{name}.{form}_backward (chunk {C}) vs recurrent_backward: d{n} error {err:.2e}"


@pytest.mark.parametrize("tokens", [1, 24])
@pytest.mark.parametrize("name", [n for n in CAUSAL if "chunked" in backward_forms(n)])
def test_chunked_backward_agrees_segment_by_segment(name, tokens, monkeypatch):
    """The chunked backward takes the sequence a segment at a time, as the forward does (SEGMENT_TOKENS = 512 by
    default, more than these tests' T): with segments of one chunk and of 24 tokens (not a multiple of the
    chunk), with and without an initial state, every gradient still equals the recurrent backward's."""
    monkeypatch.setattr(chunking, "SEGMENT_TOKENS", tokens)
    for with_state in (True, False):
        mod, sig, inputs, kwargs, do, dstate = setup(name, 2, 45, 2, 6, 5, with_state, seed=10 + tokens)
        ref = grads_by_name(run_backward(mod, sig, "recurrent", inputs, kwargs, do, dstate, 16), inputs)
        for C in (5, 16):
            got = grads_by_name(run_backward(mod, sig, "chunked", inputs, kwargs, do, dstate, C), inputs)
            for n, g in ref.items():
                err = directional_err(got[n], g)
                assert err < 1e-10, f"{name}.chunked_backward (chunk {C}, segments of {tokens}): d{n} error {err:.2e}"


def directional_err(a, b) -> float:
    if isinstance(b, tuple):
        return max((directional_err(x, y) for x, y in zip(a, b) if directional.is_array(y)), default=0.0)
    return rel_err(a, b)


@pytest.mark.parametrize("name", [n for n in CAUSAL if has_array_state(n)])
def test_gradient_of_the_final_state_alone(name):
    """do = 0: only <dstate, final_state> is differentiated (the path a truncated-BPTT caller uses)."""
    mod, sig, inputs, kwargs, do, dstate = setup(name, 1, 23, 2, 4, 3, True, seed=4)
    do = np.zeros_like(do)
    for form in backward_forms(name):
        grads = grads_by_name(run_backward(mod, sig, form, inputs, kwargs, do, dstate, 8), inputs)
        rng = np.random.default_rng(2)
        given = {n: x for n, x in inputs.items() if x is not None}
        directional.check(loss_fn(mod, sig, form, kwargs, do, dstate, 8), inputs, grads,
                          {n: directional.direction(rng, x) for n, x in given.items()})


def _strong_decays(name, args, kwargs, rng):
    """The mixers whose decay is not a log-gate input, with per-token log-decays reaching -20 (and close to 0):
    Mamba-2's dt * A (A = -20 per head, dt in (0, 1)), RetNet's log gamma and Lightning's -slope per head."""
    args, kwargs = list(args), dict(kwargs)
    if name == "mamba2":
        args[1] = rng.uniform(1e-8, 1, args[1].shape).astype(np.float32)   # dt [B, T, H]
        args[2] = np.full(args[2].shape, -20.0, np.float32)                 # A [H]
    elif name == "retnet":
        kwargs["gamma"] = np.exp(np.array([-20.0, -1e-8])).astype(np.float32)
    elif name == "lightning":
        kwargs["slope"] = np.array([20.0, 1e-8], np.float32)
    return args, kwargs


@pytest.mark.parametrize("name", CAUSAL)
def test_float32_long_sequence_with_strong_gates_stays_finite(name):
    """T = 4096 in float32 with every log-gate drawn in [-20, -1e-8] (the decays that are not log-gates taken to
    the same range: `_strong_decays`): every gradient is finite."""
    mod, sig = catalog.module(name), catalog.signature(name)
    args, kwargs = mod.example_inputs(1, 4096, 2, 8, 8, dtype=np.float32, seed=1)
    rng = np.random.default_rng(0)
    args = [rng.uniform(-20, -1e-8, a.shape).astype(np.float32) if t.gate else a for a, t in zip(args, sig.inputs)]
    args, kwargs = _strong_decays(name, args, kwargs, rng)
    o, state = mod.chunked(*args, **kwargs)
    grads = mod.chunked_backward(*args, **kwargs, do=rng.standard_normal(o.shape).astype(np.float32))
    for field, g in zip(grads._fields, grads):
        for array in (g if isinstance(g, tuple) else (g,)):
            if directional.is_array(array):
                assert np.isfinite(array).all(), f"{name}.chunked_backward: {field} has NaN or inf"
                assert array.dtype in (np.float32, np.complex64), f"{name}: {field} is {array.dtype}"


@pytest.mark.parametrize("name", CAUSAL)
def test_bad_cotangents_are_named(name):
    mod, sig, inputs, kwargs, do, dstate = setup(name, 2, 9, 2, 4, 3, False, seed=3)
    args = [inputs[n] for n in sig.names]
    with pytest.raises(ValueError, match=r"do: expected shape"):
        mod.chunked_backward(*args, **kwargs, do=do[:, :-1])
    with pytest.raises(TypeError, match=r"do: expected"):
        mod.chunked_backward(*args, **kwargs, do=do.astype(np.int64))
    bad = do.copy()
    bad.flat[3] = np.nan
    with pytest.raises(ValueError, match=r"do: expected finite values"):
        mod.recurrent_backward(*args, **kwargs, do=bad)
    if dstate is not None:
        wrong = dstate[..., :-1] if not isinstance(dstate, tuple) else dstate
        with pytest.raises(ValueError, match=r"dstate: expected shape"):
            mod.chunked_backward(*args, **kwargs, do=do, dstate=wrong)
    else:
        with pytest.raises(ValueError, match=r"dstate: expected None"):
            mod.chunked_backward(*args, **kwargs, do=do, dstate=np.zeros(3))
