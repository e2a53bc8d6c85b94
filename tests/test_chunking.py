"""The shared chunk pieces on their own: padding round trip, decay masks, gated Gram matrices, the
state pass and the triangular inverse (checked against SciPy's triangular solve)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from minilin import chunking


def test_to_chunks_round_trip_pads_with_zeros(rng):
    x = rng.standard_normal((2, 37, 3, 5))
    c = chunking.to_chunks(x, 16)
    assert c.shape == (2, 3, 3, 16, 5) and c.flags.c_contiguous
    assert np.array_equal(c[:, :, -1, 5:], np.zeros((2, 3, 11, 5)))
    assert np.array_equal(chunking.from_chunks(c, 37), x)


def test_decay_matrix_is_exp_of_segment_sums(rng):
    g = -rng.uniform(0, 3, (4, 10))
    G = np.cumsum(g, axis=-1)
    L = chunking.decay_matrix(G)
    for i in range(10):
        for j in range(10):
            expected = np.exp(g[:, j + 1:i + 1].sum(-1)) if j <= i else 0.0
            assert np.allclose(L[:, i, j], expected, rtol=1e-13, atol=0)
    assert np.array_equal(chunking.decay_matrix(G, strict=True), L * np.tri(10, k=-1))


def test_decay_matrix_never_overflows():
    G = np.cumsum(np.full(64, -800.0))  # G_i - G_j reaches +50000 above the diagonal
    with np.errstate(over="raise", invalid="raise"):
        L = chunking.decay_matrix(G)
    assert np.isfinite(L).all() and L[0, 0] == 1.0 and L[1, 0] == 0.0


@pytest.mark.parametrize("C", [1, 5, 16, 37, 64])
@pytest.mark.parametrize("strict", [False, True])
def test_channel_gram_matches_the_definition(rng, C, strict):
    x, y = rng.standard_normal((2, 3, C, 6))
    G = np.cumsum(-rng.uniform(0, 2, (3, C, 6)), axis=-2)
    expected = np.einsum("bik,bjk,bijk->bij", x, y, np.exp(G[:, :, None, :] - G[:, None, :, :]))
    expected *= np.tri(C, k=-1 if strict else 0)
    got = chunking.gated_gram(x, y, G, strict=strict)
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_channel_gram_with_stacked_queries(rng):
    """x may carry extra leading axes (several Grams against one y and one decay)."""
    x = rng.standard_normal((2, 3, 40, 4))
    y = rng.standard_normal((3, 40, 4))
    G = np.cumsum(-rng.uniform(0, 1, (3, 40, 4)), axis=-2)
    both = chunking.gated_gram(x, y, G)
    assert np.allclose(both[1], chunking.gated_gram(x[1], y, G), rtol=1e-13, atol=1e-13)


def test_pass_states_matches_the_loop(rng):
    dS = rng.standard_normal((2, 3, 5, 4, 6))
    g = -rng.uniform(0, 1, (2, 3, 5, 4))
    S0 = rng.standard_normal((2, 3, 4, 6))
    S_in, S_final = chunking.pass_states(dS, g, S0)
    S = S0
    for n in range(5):
        assert np.allclose(S_in[:, :, n], S, rtol=1e-13, atol=1e-13)
        S = np.exp(g[:, :, n])[..., None] * S + dS[:, :, n]
    assert np.allclose(S_final, S, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("C", [1, 2, 3, 4, 5, 8, 16, 37, 64])
def test_unit_lower_inverse_matches_scipy_triangular_solve(rng, C):
    k = rng.standard_normal((8, C, 16))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    beta = rng.uniform(0, 1, (8, C, 1))
    A = np.tril((beta * k) @ k.swapaxes(-1, -2), -1)  # the delta rule's A: unit keys, beta in [0, 1]
    rhs = rng.standard_normal((8, C, 5))
    expected = scipy.linalg.solve_triangular(A, rhs, lower=True, unit_diagonal=True)
    got = chunking.unit_lower_inverse(A) @ rhs
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-12
    # The diagonal and the upper triangle are never read.
    noisy = A + np.triu(rng.standard_normal(A.shape))
    assert np.array_equal(chunking.unit_lower_inverse(noisy), chunking.unit_lower_inverse(A))


@pytest.mark.parametrize("C", [1, 2, 3, 4, 5, 8, 16, 37, 64])
def test_unit_lower_inverse_in_float32_batches(rng, C):
    """float32, a batch of batches (as the chunked forms call it): T (I + A) = I to float32 rounding. (At
    C = 2 a float32 batch once came out wrong while float64 was right.)"""
    k = rng.standard_normal((3, 4, C, 16))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    A = np.tril((rng.uniform(0, 1, (3, 4, C, 1)) * k) @ k.swapaxes(-1, -2), -1).astype(np.float32)
    T = chunking.unit_lower_inverse(A)
    assert T.dtype == np.float32
    identity = np.broadcast_to(np.eye(C), A.shape)
    assert np.abs(T.astype(np.float64) @ (identity + A) - identity).max() < 1e-5
