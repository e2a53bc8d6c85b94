"""The forward engines' chunk pieces: the per-channel Gram matrix built by halving (`channel_gram`), the chunk
views, the in-place state pass and the triangular inverse's reads; and what they promise together: the
per-channel mixers exact for gates from -20 to -1e-8, float32 that does not lose accuracy with length, and
inputs never written to."""
from __future__ import annotations

import numpy as np
import pytest

from minilin import catalog, chunking, examples
from minilin.mixers import gated_deltanet, gla, hgrn2, kda, rwkv6, rwkv7, simple_gla
from conftest import is_sequence, rel_err


def definition(x, y, g, *, strict=False, before_decay=False):
    """sum_k x_ik y_jk exp(Gx_ik - G_jk) over the allowed (i, j), straight from the cumulative gates."""
    G = np.cumsum(g, axis=-2)
    Gx = np.concatenate([np.zeros_like(G[..., :1, :]), G[..., :-1, :]], axis=-2) if before_decay else G
    C = g.shape[-2]
    allowed = np.tri(C, k=-1 if (strict or before_decay) else 0, dtype=bool)
    exponent = np.where(allowed[:, :, None], Gx[..., :, None, :] - G[..., None, :, :], -np.inf)
    return np.einsum("...ik,...jk,...ijk->...ij", x, y, np.exp(exponent))


def gates(rng, shape, low=-20.0, high=-1e-8):
    """Log-gates spread over [low, high] on a log scale: decays from exp(-20) to 1 - 1e-8."""
    return -np.exp(rng.uniform(np.log(-high), np.log(-low), shape))


@pytest.mark.parametrize("C", [1, 2, 3, 5, 16, 37, 64])
@pytest.mark.parametrize("mode", ["causal", "strict", "before_decay"])
def test_channel_gram_and_its_decayed_rows_match_the_definition(rng, C, mode):
    x, y = rng.standard_normal((2, 2, 3, C, 6))
    g = gates(rng, (2, 3, C, 6))
    flags = dict(strict=mode == "strict", before_decay=mode == "before_decay")
    got = chunking.channel_gram(x, y, g, **flags)
    assert rel_err(got.A, definition(x, y, g, **flags)) < 1e-12
    G = np.cumsum(g, axis=-2)
    G_read = G - g if mode == "before_decay" else G                    # G_{i-1} or G_i
    assert rel_err(got.x_from_start, x * np.exp(G_read)) < 1e-13
    assert rel_err(got.y_to_end, y * np.exp(G[..., -1:, :] - G)) < 1e-13
    assert rel_err(got.chunk_decay, np.exp(G[..., -1, :])) < 1e-13


def test_channel_gram_of_several_rows_against_several_columns(rng):
    """A tuple of x against a tuple of y: every pair, stacked [nx, ny, ...]; one tuple alone: [n, ...]."""
    xs = tuple(rng.standard_normal((3, 20, 4)) for _ in range(2))
    ys = tuple(rng.standard_normal((3, 20, 4)) for _ in range(3))
    g = gates(rng, (3, 20, 4))
    both = chunking.channel_gram(xs, ys, g, before_decay=True)
    assert both.A.shape == (2, 3, 3, 20, 20) and both.x_from_start.shape == (2, 3, 20, 4)
    assert both.y_to_end.shape == (3, 3, 20, 4)
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            assert rel_err(both.A[i, j], definition(x, y, g, before_decay=True)) < 1e-12
    rows = chunking.channel_gram(xs, ys[0], g)
    assert rows.A.shape == (2, 3, 20, 20)
    assert rel_err(rows.A[1], definition(xs[1], ys[0], g)) < 1e-12


def test_channel_gram_stays_finite_beyond_the_float_range(rng):
    """Gates of -1000 per token: exp(+cumsum) would overflow within a few tokens; nothing here does."""
    x, y = rng.standard_normal((2, 2, 64, 8))
    g = -rng.uniform(500, 1000, (2, 64, 8))
    with np.errstate(over="raise", invalid="raise"):
        got = chunking.channel_gram(x, y, g)
    assert np.isfinite(got.A).all() and rel_err(got.A, definition(x, y, g)) < 1e-12
    assert np.isfinite(got.x_from_start).all() and np.isfinite(got.y_to_end).all()


def test_channel_gram_float32_keeps_float32_precision_for_any_gate(rng):
    """No cumulative sum is ever subtracted from another: a long chunk with strong and weak gates mixed
    loses nothing to float32 beyond the products' own rounding."""
    x, y = rng.standard_normal((2, 4, 256, 16))
    g = gates(rng, (4, 256, 16))
    ref = definition(x, y, g)
    got = chunking.channel_gram(*(a.astype(np.float32) for a in (x, y, g))).A
    assert got.dtype == np.float32 and rel_err(got, ref) < 2e-6


def test_unit_lower_inverse_reads_only_below_the_diagonal(rng):
    A = np.tril(rng.standard_normal((5, 24, 24)) * 0.2, -1)
    garbage = A + np.triu(rng.standard_normal((5, 24, 24)) * 1e6)
    assert np.array_equal(chunking.unit_lower_inverse(garbage), chunking.unit_lower_inverse(A))
    assert rel_err(chunking.unit_lower_inverse(A) @ (np.eye(24) + A), np.broadcast_to(np.eye(24), A.shape)) < 1e-13


@pytest.mark.parametrize("C", [1, 5, 64, 65, 300])
def test_unit_lower_solve_is_the_inverse_applied(rng, C):
    """Forward substitution by halves (blocks of 64 inverted) == (I + A)^-1 X, for a strided A too."""
    A = np.tril(rng.standard_normal((3, C + 7, C + 7)) * 0.1, -1)[:, 3:C + 3, 3:C + 3]   # a view, not contiguous
    X = rng.standard_normal((3, C, 4))
    Y = chunking.unit_lower_solve(A, X)
    assert rel_err((np.eye(C) + np.tril(A, -1)) @ Y, X) < 1e-13
    assert rel_err(Y, chunking.unit_lower_inverse(np.ascontiguousarray(A)) @ X) < 1e-12


def test_decay_matrix_takes_the_differences_before_rounding(rng):
    """G summed in float64 over thousands of gates, L in float32: exact to float32's rounding of L itself."""
    g = -rng.uniform(0, 1, 4096)
    G = np.cumsum(g)[-64:]                                    # about -2000
    L64 = chunking.decay_matrix(G)

    def worst(L):  # the largest relative error of an entry exp(D), D >= -30
        D = G[:, None] - G[None, :]
        seen = np.tri(64, dtype=bool) & (D > -30)
        return np.max(np.abs(L - L64)[seen] / L64[seen])

    L32 = chunking.decay_matrix(G, dtype=np.float32)
    assert L32.dtype == np.float32 and worst(L32) < 4e-6      # float32's exp of D rounded once: |D| 2^-24
    assert worst(chunking.decay_matrix(G.astype(np.float32))) > 3e-5   # G rounded first: ulp(2000) ~ 1.2e-4


def test_chunk_view_is_a_view_unless_it_pads(rng):
    x = rng.standard_normal((2, 48, 3, 5))
    view = chunking.chunk_view(x, 16)
    assert view.shape == (2, 3, 3, 16, 5) and np.shares_memory(view, x)
    assert np.array_equal(view, chunking.to_chunks(x, 16))
    padded = chunking.chunk_view(x, 20)
    assert not np.shares_memory(padded, x) and np.array_equal(padded, chunking.to_chunks(x, 20))
    o, o_chunks = chunking.chunked_output(x, 20)
    assert o.shape == (2, 60, 3, 5) and np.shares_memory(o, o_chunks) and o_chunks.shape == (2, 3, 3, 20, 5)


@pytest.mark.parametrize("decay_shape", [None, (2, 3, 7), (2, 3, 7, 4)])
@pytest.mark.parametrize("with_S0", [False, True])
@pytest.mark.parametrize("with_out", [False, True])
def test_read_and_pass_is_the_loop(rng, decay_shape, with_S0, with_out):
    """O_n = q_n S_n + A_n V_n and S_{n+1} = decay_n S_n + k_n^T V_n, chunk by chunk, written into `out`
    when given (T = 33 tokens in 7 chunks of 5: the last one padded)."""
    B, H, N, C, K, V, T = 2, 3, 7, 5, 4, 6, 33
    A, q = rng.standard_normal((B, H, N, C, C)), rng.standard_normal((B, H, N, C, K))
    k_T, v = rng.standard_normal((B, H, N, K, C)), rng.standard_normal((B, T, H, V))
    decay = None if decay_shape is None else rng.uniform(0, 1, decay_shape)
    S0 = rng.standard_normal((B, H, K, V)) if with_S0 else None
    vc = chunking.to_chunks(v, C)
    expected, S = [], np.zeros((B, H, K, V)) if S0 is None else S0
    for n in range(N):
        expected.append(q[:, :, n] @ S + A[:, :, n] @ vc[:, :, n])
        d = 1.0 if decay is None else (decay[:, :, n, None, None] if decay.ndim == 3 else decay[:, :, n, :, None])
        S = d * S + k_T[:, :, n] @ vc[:, :, n]
    o, o_chunks = chunking.chunked_output(v, C)
    got, S_final = chunking.read_and_pass(A, q, k_T, decay, v, S0, C, out=o_chunks if with_out else None)
    if with_out:
        assert got is o_chunks
        got = o[:, :T]
    assert rel_err(got, chunking.from_chunks(np.stack(expected, axis=2), T)) < 1e-13
    assert rel_err(S_final, S) < 1e-13


@pytest.mark.parametrize("decay_shape", [None, (2, 3, 7), (2, 3, 7, 4)])
@pytest.mark.parametrize("with_S0", [False, True])
def test_states_after_chunks_is_the_loop(rng, decay_shape, with_S0):
    writes = rng.standard_normal((2, 3, 7, 4, 5))
    decay = None if decay_shape is None else rng.uniform(0, 1, decay_shape)
    S0 = rng.standard_normal((2, 3, 4, 5)) if with_S0 else None
    expected, S = [], np.zeros((2, 3, 4, 5)) if S0 is None else S0
    for n in range(7):
        d = 1.0 if decay is None else (decay[:, :, n, None, None] if decay.ndim == 3 else decay[:, :, n, :, None])
        S = d * S + writes[:, :, n]
        expected.append(S)
    got = chunking.states_after_chunks(writes.copy(), decay, S0)
    assert rel_err(got, np.stack(expected, axis=2)) < 1e-14


def log_gate_position(mod):
    """Which positional input of a per-channel mixer is its log-gate."""
    return {gla: 3, kda: 3, hgrn2: 2, rwkv6: 3, rwkv7: 1}[mod]


PER_CHANNEL = [gla, kda, hgrn2, rwkv6, rwkv7]


@pytest.mark.parametrize("mod", PER_CHANNEL, ids=lambda m: m.__name__.split(".")[-1])
@pytest.mark.parametrize("C", [16, 64])
def test_per_channel_mixers_exact_for_gates_from_minus_20_to_minus_1e_8(mod, C):
    """float64: chunked == recurrent to 1e-10; float32 chunked within 2e-6 of the float64 recurrence."""
    rng = np.random.default_rng(C)
    args, kwargs = mod.example_inputs(1, 300, 2, 16, 12, seed=C)
    args = list(args)
    args[log_gate_position(mod)] = gates(rng, args[log_gate_position(mod)].shape)
    ref, ref_state = mod.recurrent(*args, **kwargs)
    out, state = mod.chunked(*args, **kwargs, chunk_size=C)
    assert rel_err(out, ref) < 1e-10 and rel_err(state, ref_state) < 1e-10
    out32, state32 = mod.chunked(*(a.astype(np.float32) for a in args), **kwargs, chunk_size=C)
    assert np.isfinite(out32).all() and rel_err(out32, ref) < 2e-6 and rel_err(state32, ref_state) < 2e-6


LONG = {"simple_gla": (simple_gla, 3), "gla": (gla, 3), "gated_deltanet": (gated_deltanet, 3), "kda": (kda, 3),
        "rwkv6": (rwkv6, 3)}


@pytest.mark.parametrize("name", list(LONG))
@pytest.mark.parametrize("gate", ["example", "strong"])
def test_float32_does_not_lose_accuracy_with_length(name, gate):
    """T = 2048 in one chunk (the parallel form) and in chunks of 512: within 1e-6 of the float64 recurrence,
    as for chunks of 64 (cumulative gates summed over 2048 tokens reach -1000; rounded to float32 and then
    subtracted, they left errors of 1e-5 to 1e-4 here)."""
    mod, position = LONG[name]
    args, kwargs = mod.example_inputs(1, 2048, 1, 16, 16, seed=4)
    args = list(args)
    if gate == "strong":
        args[position] = -20.0 * np.random.default_rng(5).uniform(0, 1, args[position].shape) ** 3
    ref, _ = mod.recurrent(*args, **kwargs)
    args32 = [a.astype(np.float32) for a in args]
    for form, extra in (("chunked", dict(chunk_size=64)), ("chunked", dict(chunk_size=512)), ("parallel", {})):
        out, _ = getattr(mod, form)(*args32, **kwargs, **extra)
        err = rel_err(out, ref)
        assert err < 1e-6, f"{name}.{form} {extra} float32: relative error {err:.1e}"


@pytest.mark.parametrize("name", catalog.names())
def test_no_form_writes_into_its_inputs(name):
    """Chunk views alias the inputs (and a single key channel makes even a swapped view contiguous): every
    form must leave its arguments as they were."""
    mod = catalog.module(name)
    args, kwargs = mod.example_inputs(1, 32, 1, 1, 1, seed=2)
    before = [a.copy() if hasattr(a, "copy") else a for a in args]
    for form in catalog.forms(name):
        extra = {"chunk_size": 16} if form == "chunked" else {}
        getattr(mod, form)(*args, **kwargs, **extra)
        for a, b in zip(args, before):
            if is_sequence(a) or hasattr(a, "shape"):
                assert np.array_equal(a, b), f"{name}.{form} changed an input"
