"""Check for exercise 09 (you do not need to edit this file): segsum against the differences of one cumulative
sum (in log space at j <= i, -inf above the diagonal) and minilin.chunking.decay_matrix (in exp space), and the
chunked SSD against the recurrence of minilin.mixers.mamba2, in float64, with and without the skip D, with strong
decays, and a count of its Python lines (chunks, not tokens)."""
import numpy as np

from minilin.chunking import decay_matrix
from minilin.course.checks import SEQUENCE_CASES, assert_close, assert_no_token_loop, check_form, label
from minilin.mixers import mamba2


def test_segsum(learner):
    rng = np.random.default_rng(9)
    for shape, strength in [((1,), 1.0), ((3, 7), 1.0), ((2, 2, 64), 30.0), ((2, 3, 40), 0.1)]:
        g = -strength * rng.uniform(0, 1, shape)
        T = shape[-1]
        below, above = np.tril(np.ones((T, T), bool)), np.triu(np.ones((T, T), bool), 1)
        got = learner.segsum(g)
        where = f"for g of shape {list(shape)}, g down to {-strength}"
        if hasattr(got, "shape") and got.shape == shape + (T,):
            # In log space where j <= i, so that a long segment's sum is checked too (its exp is ~0 at strength
            # 30), and exactly -inf above the diagonal, as the docstring says.
            G = np.cumsum(g, axis=-1)
            assert_close(f"segsum(g)[..., i, j] for j <= i {where}", np.asarray(got)[..., below],
                         (G[..., :, None] - G[..., None, :])[..., below])
            assert np.isneginf(np.asarray(got)[..., above]).all(), (
                f"segsum(g) {where}: expected -inf above the diagonal (j > i), got "
                f"{np.asarray(got)[..., above][~np.isneginf(np.asarray(got)[..., above])][:3]}")
        with np.errstate(over="ignore", invalid="ignore"):
            got = np.exp(got) if hasattr(got, "shape") else got
        assert_close(f"exp(segsum(g)) {where} (above the diagonal exp(-inf) = 0)", got,
                     decay_matrix(np.cumsum(g, axis=-1)))


def test_ssd_chunked(learner):
    for seed, case in enumerate(SEQUENCE_CASES, 90):
        (x, dt, A, B, C, D), _ = mamba2.example_inputs(**case, seed=seed)
        expected = mamba2.recurrent(x, dt, A, B, C, D)
        for size in (16, 1, 64, 5):
            check_form("ssd_chunked", learner.ssd_chunked, (x, dt, A, B, C, D), expected,
                       kwargs=dict(chunk_size=size), where=f"[{label(case)}: P = V, N = K]",
                       outputs=("y", "final state"), dims=("B T H P", "B H N P"), chunk_size=size, scales={})


def test_ssd_without_skip_and_strong_decay(learner):
    case = dict(B=1, T=100, H=2, K=4, V=3)
    (x, dt, A, B, C, _), _ = mamba2.example_inputs(**case, seed=99)
    dt = dt * 40                         # decays down to exp(-40) per token: a naive exp(-G) overflows
    with np.errstate(over="ignore", invalid="ignore"):
        check_form("ssd_chunked", learner.ssd_chunked, (x, dt, A, B, C), mamba2.recurrent(x, dt, A, B, C),
                   kwargs=dict(chunk_size=64),
                   where=f"[{label(case)}, D=None, dt * A down to {float((dt * A).min()):.0f}]",
                   outputs=("y", "final state"), dims=("B T H P", "B H N P"), chunk_size=64, scales={})


def test_ssd_loops_over_chunks(learner):
    def call(T, chunk_size):
        args, _ = mamba2.example_inputs(B=1, T=T, H=1, K=2, V=3, seed=T)
        return args, dict(chunk_size=chunk_size)

    assert_no_token_loop("ssd_chunked", learner.ssd_chunked, call, chunked=True)
