"""The gated-linear family's hand-written backward passes: the engine (`_gated_linear.recurrent_backward`,
`chunked_backward`, `parallel_backward`) and the chunk pieces behind it (`chunking.*_backward`), against
central finite differences in float64 and against each other.

The loss is L = <do, o> + <dS, S_T>; a gradient is checked along a random direction d: the central
difference of L along d (`directional_fd`) must equal sum <grad, d>, for all inputs moved at once and for
each input alone.
"""
from __future__ import annotations

import numpy as np
import pytest

from minilin import chunking
from minilin.mixers import _gated_linear
from conftest import rel_err

GATES = [None, "scalar", "channel"]
FD_TOL = 1e-7       # fourth-order central differences at h = 1e-4: the worst seen here is 3e-9
AGREE_TOL = 1e-10   # recurrent vs chunked backward, float64


def engine_inputs(rng, B, T, H, K, V, gate, with_S0, low=-1.5):
    """[q, k, v, g, S0]: standard normal, log-gates in [low, -0.05] (None for no gate / no S0)."""
    q, k = rng.standard_normal((2, B, T, H, K))
    v = rng.standard_normal((B, T, H, V))
    g = {None: None, "scalar": (B, T, H), "channel": (B, T, H, K)}[gate]
    g = None if g is None else rng.uniform(low, -0.05, g)
    S0 = rng.standard_normal((B, H, K, V)) if with_S0 else None
    return [q, k, v, g, S0]


def directional_fd(loss, inputs, direction, eps=1e-4):
    """The derivative of `loss` along `direction` by the fourth-order central difference
        (8 (L(x + h d) - L(x - h d)) - (L(x + 2h d) - L(x - 2h d))) / (12 h),
    exact to O(h^4): a derivative that is small next to the loss's curvature is still measured to about
    1e-10 (the two-point difference's O(h^2) error is not small enough there). None entries skipped."""
    def at(step):
        return loss([None if x is None else x + step * d for x, d in zip(inputs, direction)])
    return (8 * (at(eps) - at(-eps)) - (at(2 * eps) - at(-2 * eps))) / (12 * eps)


def assert_matches_fd(loss, inputs, grads, rng, names):
    """Check `grads` against central differences of `loss`: along one random direction for all inputs
    at once, then for each input alone."""
    assert len(grads) == len(inputs)
    for x, dx, name in zip(inputs, grads, names):
        assert (x is None) == (dx is None), f"{name}: gradient given for a missing input or missing for a given one"
        if x is not None:
            assert dx.shape == x.shape and dx.dtype == x.dtype, f"d{name}: {dx.shape} {dx.dtype} vs {x.shape}"
    given = [i for i, x in enumerate(inputs) if x is not None]
    directions = {"all": [None if x is None else rng.standard_normal(x.shape) for x in inputs]}
    for i in given:
        directions[names[i]] = [d if j == i else (None if d is None else np.zeros_like(d))
                                for j, d in enumerate(directions["all"])]
    for which, direction in directions.items():
        fd = directional_fd(loss, inputs, direction)
        analytic = sum(float((dx * d).sum()) for dx, d in zip(grads, direction) if d is not None)
        err = abs(fd - analytic) / max(abs(fd), 1e-6)  # the floor: a derivative that is exactly 0
        assert err < FD_TOL, f"{which}: finite difference {fd!r} vs backward {analytic!r} (rel err {err:.1e})"


def engine_loss(do, dS):
    def loss(inputs):
        o, S = _gated_linear.recurrent(*inputs)
        return float((o * do).sum()) + (0.0 if dS is None else float((S * dS).sum()))
    return loss


BACKWARDS = {
    "recurrent": lambda x, do, dS, C: _gated_linear.recurrent_backward(*x, do, dS),
    "chunked": lambda x, do, dS, C: _gated_linear.chunked_backward(*x, do, dS, C),
    "parallel": lambda x, do, dS, C: _gated_linear.parallel_backward(*x, do, dS),
}
# (B, T, H, K, V, chunk_size, initial state, dS given, do = 0)
CASES = {
    "T1": (1, 1, 2, 3, 4, 3, True, True, False),
    "T7C3_KneV": (2, 7, 2, 3, 5, 3, True, True, False),
    "no_S0_no_dS": (1, 7, 1, 4, 2, 3, False, False, False),
    "final_state_only": (1, 8, 2, 3, 4, 3, True, True, True),
    "C37_subblocks": (1, 37, 1, 3, 2, 37, True, True, False),  # per-channel gram: 3 sub-blocks, padded
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("gate", GATES, ids=str)
@pytest.mark.parametrize("form", BACKWARDS)
def test_engine_backward_matches_finite_differences(rng, form, gate, case):
    B, T, H, K, V, C, with_S0, with_dS, zero_do = CASES[case]
    inputs = engine_inputs(rng, B, T, H, K, V, gate, with_S0)
    do = np.zeros((B, T, H, V)) if zero_do else rng.standard_normal((B, T, H, V))
    dS = rng.standard_normal((B, H, K, V)) if with_dS else None
    grads = BACKWARDS[form](inputs, do, dS, C)
    assert_matches_fd(engine_loss(do, dS), inputs, grads, rng, ["q", "k", "v", "g", "S0"])


@pytest.mark.parametrize("gate", GATES, ids=str)
def test_recurrent_and_chunked_backward_agree(rng, gate):
    B, T, H, K, V = 2, 70, 2, 5, 3
    inputs = engine_inputs(rng, B, T, H, K, V, gate, with_S0=True)
    do, dS = rng.standard_normal((B, T, H, V)), rng.standard_normal((B, H, K, V))
    reference = _gated_linear.recurrent_backward(*inputs, do, dS)
    for C in (1, 3, 16, 37, 64):
        for name, got, ref in zip(["dq", "dk", "dv", "dg", "dS0"],
                                  _gated_linear.chunked_backward(*inputs, do, dS, C), reference):
            if ref is None:
                assert got is None, f"{name} should be None (gate {gate})"
                continue
            assert rel_err(got, ref) < AGREE_TOL, f"chunk {C}, {name}: rel err {rel_err(got, ref):.1e}"
    _, _, _, dg, dS0 = _gated_linear.chunked_backward(*inputs[:4], None, do, None, 16)
    assert dS0 is None and (dg is None) == (gate is None)


@pytest.mark.parametrize("gate", GATES, ids=str)
def test_float32_long_sequence_with_strong_gates_stays_finite(gate):
    """T = 4096, gates down to -20 (decays to exp(-20) per token), float32: no NaN, no inf, no overflow,
    float32 out, and close to the float64 result."""
    rng = np.random.default_rng(7)
    B, T, H, K, V = 1, 4096, 1, 8, 8
    inputs = engine_inputs(rng, B, T, H, K, V, gate, with_S0=True, low=-20.0)
    do, dS = rng.standard_normal((B, T, H, V)), rng.standard_normal((B, H, K, V))
    ref = _gated_linear.chunked_backward(*inputs, do, dS, 64)
    single = [None if x is None else x.astype(np.float32) for x in inputs]
    do32, dS32 = do.astype(np.float32), dS.astype(np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        for grads in (_gated_linear.chunked_backward(*single, do32, dS32, 64),
                      _gated_linear.recurrent_backward(*single, do32, dS32)):
            for got, want in zip(grads, ref):
                if want is None:
                    continue
                assert got.dtype == np.float32 and np.isfinite(got).all()
                assert rel_err(got, want) < 1e-4


# ---- the chunk pieces ----------------------------------------------------------------------------------

def gram_gate(rng, shape, gate):
    """A chunk-local cumulative gate for x, y of `shape` [..., C, K]: None, scalar [..., C], per-channel."""
    if gate is None:
        return None
    if gate == "scalar":
        return np.cumsum(-rng.uniform(0.05, 1.5, shape[:-1]), axis=-1)
    return np.cumsum(-rng.uniform(0.05, 1.5, shape), axis=-2)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("C", [1, 5, 37])
@pytest.mark.parametrize("gate", GATES, ids=str)
def test_gated_gram_backward_matches_finite_differences(rng, gate, C, strict):
    x, y = rng.standard_normal((2, 2, C, 3))
    G = gram_gate(rng, (2, C, 3), gate)
    dA = rng.standard_normal((2, C, C))

    def loss(inputs):
        return float((chunking.gated_gram(*inputs, strict=strict) * dA).sum())

    dx, dy = chunking.gated_gram_backward(dA, x, y, G, strict=strict)
    dG = None if G is None else chunking.gate_terms(x, dx, G) - chunking.gate_terms(y, dy, G)
    assert_matches_fd(loss, [x, y, G], [dx, dy, dG], rng, ["x", "y", "G"])


@pytest.mark.parametrize("gate", GATES, ids=str)
def test_gated_gram_backward_with_stacked_x(rng, gate):
    """x with an extra leading axis (several Grams against one y and one decay): dy sums over it."""
    x = rng.standard_normal((2, 3, 20, 4))
    y = rng.standard_normal((3, 20, 4))
    G = gram_gate(rng, (3, 20, 4), gate)
    dA = rng.standard_normal((2, 3, 20, 20))
    dx, dy = chunking.gated_gram_backward(dA, x, y, G)
    parts = [chunking.gated_gram_backward(dA[i], x[i], y, G) for i in range(2)]
    assert np.allclose(dx, np.stack([p[0] for p in parts]), rtol=1e-13, atol=1e-13)
    assert np.allclose(dy, parts[0][1] + parts[1][1], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("C", [1, 6, 37])
def test_gram_before_decay_backward_matches_finite_differences(rng, C):
    x, y = rng.standard_normal((2, 2, C, 3))
    G = gram_gate(rng, (2, C, 3), "channel")
    dA = rng.standard_normal((2, C, C))

    def loss(inputs):
        return float((chunking.gram_before_decay(*inputs) * dA).sum())

    dx, dy = chunking.gram_before_decay_backward(dA, x, y, G)
    # x_i enters as x_i exp(G_{i-1}), y_j as y_j exp(-G_j) (the docstring's rule).
    x_terms = chunking.gate_terms(x, dx, G)
    dG = np.concatenate([x_terms[..., 1:, :], np.zeros_like(x_terms[..., :1, :])], axis=-2)
    dG -= chunking.gate_terms(y, dy, G)
    assert_matches_fd(loss, [x, y, G], [dx, dy, dG], rng, ["x", "y", "G"])


@pytest.mark.parametrize("gate", GATES, ids=str)
@pytest.mark.parametrize("with_S0", [False, True])
def test_pass_states_backward_matches_finite_differences(rng, gate, with_S0):
    B, H, N, K, V = 2, 2, 4, 3, 5
    writes = rng.standard_normal((B, H, N, K, V))
    G_total = {None: None, "scalar": (B, H, N), "channel": (B, H, N, K)}[gate]
    G_total = None if G_total is None else rng.uniform(-2, -0.05, G_total)
    S0 = rng.standard_normal((B, H, K, V)) if with_S0 else None
    dS_in, dS_final = rng.standard_normal((B, H, N, K, V)), rng.standard_normal((B, H, K, V))

    def loss(inputs):
        S_in, S_final = chunking.pass_states(inputs[0], G_total, inputs[1])
        return float((S_in * dS_in).sum() + (S_final * dS_final).sum())

    d_writes, dS0 = chunking.pass_states_backward(dS_in, G_total, dS_final)
    assert_matches_fd(loss, [writes, S0], [d_writes, dS0 if with_S0 else None], rng, ["writes", "S0"])


def test_to_chunks_transposed_and_reverse_cumsum(rng):
    x = rng.standard_normal((2, 37, 3, 5))
    assert np.array_equal(chunking.to_chunks_transposed(x, 16), chunking.transposed(chunking.to_chunks(x, 16)))
    a = rng.standard_normal((3, 7))
    assert np.allclose(chunking.reverse_cumsum(a, 1), np.cumsum(a[:, ::-1], 1)[:, ::-1], rtol=1e-14)


# ---- the public modules: each mixer's own mapping and parameters ---------------------------------------

def public_case(rng, name, B=2, T=7, H=2, K=3, V=4):
    """(module, positional arrays, array keywords, other keywords) for one mixer, every optional array
    given, each in its valid range with room for the finite-difference steps."""
    from minilin import catalog

    def normal(*shape):
        return rng.standard_normal(shape)

    def gate(*shape):
        return rng.uniform(-1.5, -0.05, shape)

    q, k, v = normal(B, T, H, K), normal(B, T, H, K), normal(B, T, H, V)
    arrays, options = {"initial_state": normal(B, H, K, V)}, {}
    if name == "simple_gla":
        args = [q, k, v, gate(B, T, H)]
    elif name in ("gla", "rwkv6"):
        args = [q, k, v, gate(B, T, H, K)] + ([normal(H, K)] if name == "rwkv6" else [])
    elif name == "hgrn2":
        args = [q, v, gate(B, T, H, K)]
    elif name == "retnet":
        args, arrays["gamma"] = [q, k, v], rng.uniform(0.5, 0.95, H)
    elif name == "lightning":
        args, arrays["slope"] = [q, k, v], rng.uniform(0.1, 1.0, H)
    elif name == "mamba2":  # x, dt, A, B, C, D
        args = [v, rng.uniform(0.1, 0.5, (B, T, H)), rng.uniform(-2.0, -0.5, H), q, k, normal(H)]
    elif name == "linear_attention":
        args, options["feature_map"] = [q, k, v], "elu+1"
    else:
        raise KeyError(name)
    return catalog.module(name), args, arrays, options


def assert_public_backward_matches_fd(rng, mod, args, arrays, options, form, chunk_size=3):
    """The public `<form>_backward` against central differences of the public `recurrent` (the definition),
    every array input (positional and keyword) moved at once and alone."""
    names = [t.name for t in mod.SIGNATURE.inputs][:len(args)] + list(arrays)
    o, S = mod.recurrent(*args, **arrays, **options)
    do, dstate = rng.standard_normal(o.shape), rng.standard_normal(S.shape)
    extra = {"chunk_size": chunk_size} if form == "chunked" else {}
    grads = getattr(mod, f"{form}_backward")(*args, do=do, dstate=dstate, **arrays, **options, **extra)
    fields = grads._asdict()
    got = [fields["d" + n] for n in names[:len(args)]] + [fields["d" + n] for n in arrays]

    def loss(inputs):
        o, S = mod.recurrent(*inputs[:len(args)], **dict(zip(arrays, inputs[len(args):])), **options)
        return float((o * do).sum() + (S * dstate).sum())

    assert_matches_fd(loss, list(args) + list(arrays.values()), got, rng, names)
    return grads


MIXERS = ["simple_gla", "gla", "hgrn2", "retnet", "lightning", "mamba2", "linear_attention", "rwkv6"]


@pytest.mark.parametrize("form", ["recurrent", "chunked", "parallel"])
@pytest.mark.parametrize("name", MIXERS)
def test_public_backward_matches_finite_differences(rng, name, form):
    """Every array a mixer takes (its own parameters included: gamma, slope, dt, A, D, u) through the
    mixer's mapping onto the engine; T = 7 with chunks of 3, K != V, an initial state and dstate."""
    mod, args, arrays, options = public_case(rng, name)
    assert_public_backward_matches_fd(rng, mod, args, arrays, options, form)


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
@pytest.mark.parametrize("feature_map, normalize", [
    ("identity", False), ("elu+1", False), ("elu+1", True), ("relu", False), ("relu", True), ("favor+", False),
    ("favor+", True)])
def test_linear_attention_backward_through_feature_maps_and_the_normalizer(rng, feature_map, normalize, form):
    from minilin import feature_maps
    from minilin.mixers import linear_attention
    B, T, H, K, V = 1, 6, 2, 3, 4
    phi = feature_maps.FavorPlus(5, seed=3) if feature_map == "favor+" else feature_map  # F = 5 != K
    q, k = rng.standard_normal((2, B, T, H, K))
    v = rng.standard_normal((B, T, H, V))
    F = 5 if feature_map == "favor+" else K
    S0 = np.abs(rng.standard_normal((B, H, F, V + normalize))) + 0.1 * normalize  # a positive normalizer column
    grads = assert_public_backward_matches_fd(rng, linear_attention, [q, k, v], {"initial_state": S0},
                                              {"feature_map": phi, "normalize": normalize}, form)
    assert grads.dinitial_state.shape == S0.shape


def test_defaults_have_no_gradient_and_gradients_keep_float32(rng):
    """gamma, slope, D, initial_state not given: their fields are None. float32 in, float32 out."""
    from minilin.mixers import lightning, mamba2, retnet
    q, k, v = (rng.standard_normal((1, 5, 2, 3)).astype(np.float32) for _ in range(3))
    do = rng.standard_normal((1, 5, 2, 3)).astype(np.float32)
    for mod in (retnet, lightning):
        grads = mod.chunked_backward(q, k, v, do=do, chunk_size=2)
        assert grads[3] is None and grads.dinitial_state is None
        assert all(g.dtype == np.float32 for g in grads[:3])
    x, B_in, C_out = q, k, v
    dt, A = rng.uniform(0.1, 0.5, (1, 5, 2)).astype(np.float32), -rng.uniform(0.5, 2, 2).astype(np.float32)
    grads = mamba2.chunked_backward(x, dt, A, B_in, C_out, do=do, chunk_size=2)
    assert grads.dD is None and grads.dinitial_state is None
    assert all(g.dtype == np.float32 for g in grads[:5])


def test_mamba2_without_D_matches_finite_differences(rng):
    mod, args, arrays, options = public_case(rng, "mamba2")
    grads = assert_public_backward_matches_fd(rng, mod, args[:5], arrays, options, "chunked")
    assert grads.dD is None


def test_feature_map_without_a_backward_is_a_type_error(rng):
    from minilin.mixers import linear_attention
    q = rng.standard_normal((1, 4, 1, 3))
    with pytest.raises(TypeError, match="feature_map: expected a map with a backward"):
        linear_attention.chunked_backward(q, q, q, do=q, feature_map=lambda x: x * x)



def test_a_users_feature_map_with_its_backward_matches_finite_differences(rng):
    """A callable map that brings its own backward (phi.backward(x, dphi) = phi'(x)^T dphi) is used for dq and dk:
    the map's derivative 2 x differs from the identity's, so using the wrong backward fails here."""
    from minilin.mixers import linear_attention

    def square(x):
        return x * x
    square.backward = lambda x, dphi: 2 * x * dphi
    q, k, v = (rng.standard_normal((1, 7, 2, 3)) for _ in range(3))
    for form in ("recurrent", "chunked"):
        assert_public_backward_matches_fd(rng, linear_attention, [q, k, v], {}, {"feature_map": square}, form)


@pytest.mark.parametrize("name", MIXERS)
def test_bad_cotangents_are_named(rng, name):
    mod, args, arrays, options = public_case(rng, name, B=1, T=4)
    o, S = mod.recurrent(*args, **arrays, **options)
    backward = mod.chunked_backward
    with pytest.raises(TypeError, match="do: expected an array"):
        backward(*args, do=None, **arrays, **options)
    with pytest.raises(ValueError, match=r"do: expected shape"):
        backward(*args, do=o[:, :-1], **arrays, **options)
    with pytest.raises(ValueError, match=r"do: expected finite"):
        backward(*args, do=np.full_like(o, np.nan), **arrays, **options)
    with pytest.raises(ValueError, match=r"dstate: expected shape"):
        backward(*args, do=o, dstate=S[..., :-1], **arrays, **options)


@pytest.mark.parametrize("C", [5, 8])
@pytest.mark.parametrize("before_decay", [False, True])
def test_channel_gram_backward_with_tuples_matches_one_pair_at_a_time(rng, C, before_decay):
    """Tuples of x and y (every x against every y, one decay) give each pair's gradients summed, the Gram
    built in the same sweep is channel_gram's, and the decays are those of the decayed rows."""
    xs, ys = tuple(rng.standard_normal((2, 2, C, 3))), tuple(rng.standard_normal((3, 2, C, 3)))
    g = -rng.uniform(0.05, 1.5, (2, C, 3))
    dA = rng.standard_normal((2, 3, 2, C, C))
    dxs, dys = tuple(rng.standard_normal((2, 2, C, 3))), tuple(rng.standard_normal((3, 2, C, 3)))
    got = chunking.channel_gram_backward(dA, xs, ys, g, before_decay=before_decay, dx_from_start=dxs,
                                         dy_to_end=dys, with_gram=True)
    forward = chunking.channel_gram(xs, ys, g, before_decay=before_decay)
    assert np.allclose(got.A, forward.A, rtol=1e-13, atol=1e-13)
    assert np.allclose(got.chunk_decay, forward.chunk_decay, rtol=1e-13, atol=1e-13)
    for i, x in enumerate(xs):
        assert np.allclose(x * got.from_start, forward.x_from_start[i], rtol=1e-13, atol=1e-13)
        parts = [chunking.channel_gram_backward(dA[i, j], x, y, g, before_decay=before_decay) for j, y in enumerate(ys)]
        want = sum(p.dx for p in parts) + dxs[i] * got.from_start
        assert np.allclose(got.dx[i], want, rtol=1e-12, atol=1e-12)
    for j, y in enumerate(ys):
        assert np.allclose(y * got.to_end, forward.y_to_end[j], rtol=1e-13, atol=1e-13)
        parts = [chunking.channel_gram_backward(dA[i, j], x, y, g, before_decay=before_decay) for i, x in enumerate(xs)]
        want = sum(p.dy for p in parts) + dys[j] * got.to_end
        assert np.allclose(got.dy[j], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("C", [1, 6, 16])
def test_channel_gram_backward_matches_finite_differences_with_decayed_rows(rng, C):
    """The cotangents of x_from_start and y_to_end go back through the same decays (a loss on all three
    outputs of channel_gram), and the gate's gradient follows the gate_terms rule with the chunk's end."""
    x, y = rng.standard_normal((2, 2, C, 3))
    G = gram_gate(rng, (2, C, 3), "channel")
    dA, dX, dY = rng.standard_normal((2, C, C)), rng.standard_normal((2, C, 3)), rng.standard_normal((2, C, 3))

    def loss(inputs):
        out = chunking.channel_gram(inputs[0], inputs[1], chunking.gates_of(inputs[2]))
        return float((out.A * dA).sum() + (out.x_from_start * dX).sum() + (out.y_to_end * dY).sum())

    got = chunking.channel_gram_backward(dA, x, y, chunking.gates_of(G), dx_from_start=dX, dy_to_end=dY)
    dG = chunking.gate_terms(x, got.dx, G) - chunking.gate_terms(y, got.dy, G)
    dG[..., -1, :] += (y * got.to_end * dY).sum(-2)          # y_to_end = y exp(G_C - G): + at the chunk's end
    assert_matches_fd(loss, [x, y, G], [got.dx, got.dy, dG], rng, ["x", "y", "G"])
