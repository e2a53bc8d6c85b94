"""Check for exercise 04 (you do not need to edit this file). The reference memory is the final state of
minilin.mixers.linear_attention run over the pairs (scale 1); reads, the self term (k_i . k_i) v_i and
the interference (read minus self term) are computed from it, in float64."""
import numpy as np

from minilin.course.checks import assert_close, unpack
from minilin.mixers import linear_attention

# (n pairs, d key width, d_v value width, keys: "unit", "orthonormal" or "any norm" (unit keys times 0.5 .. 2, so
# that a self term written as v_i rather than (k_i . k_i) v_i shows))
CASES = [(1, 4, 3, "unit"), (6, 8, 5, "orthonormal"), (8, 8, 8, "orthonormal"), (20, 8, 4, "unit"),
         (100, 16, 16, "unit"), (12, 8, 3, "any norm")]


def _pairs(n, d, d_v, kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "orthonormal":
        keys = np.linalg.qr(rng.standard_normal((d, d)))[0][:, :n].T  # n orthonormal rows
    else:
        keys = rng.standard_normal((n, d))
        keys /= np.linalg.norm(keys, axis=1, keepdims=True)
        if kind == "any norm":
            keys *= rng.uniform(0.5, 2.0, (n, 1))
    return keys, rng.standard_normal((n, d_v))


def _reference(keys, values):
    """The memory written by linear attention (B = H = 1, scale 1), its reads, and the split."""
    n = keys.shape[0]
    _, state = linear_attention.recurrent(keys[None, :, None], keys[None, :, None], values[None, :, None], scale=1.0)
    S = state[0, 0]
    reads = keys @ S
    self_term = np.sum(keys * keys, axis=1)[:, None] * values
    return S, reads, self_term, reads - self_term, n


def test_write_and_read(learner):
    for seed, (n, d, d_v, kind) in enumerate(CASES):
        keys, values = _pairs(n, d, d_v, kind, seed)
        S_ref, reads_ref, *_ = _reference(keys, values)
        where = f"[n={n}, d={d}, d_v={d_v}, {kind} keys]"
        S = learner.write(keys, values)
        assert_close(f"write(keys, values) {where}", S, S_ref, dims="D V")
        queries = np.random.default_rng(seed + 100).standard_normal((3, d))
        assert_close(f"read(S, queries) {where}", learner.read(S_ref, queries), queries @ S_ref, dims="M V")
        assert_close(f"read(S, keys) {where}", learner.read(S_ref, keys), reads_ref, dims="N V")


def test_split_read(learner):
    for seed, (n, d, d_v, kind) in enumerate(CASES, 10):
        keys, values = _pairs(n, d, d_v, kind, seed)
        _, reads, self_ref, interference_ref, _ = _reference(keys, values)
        where = f"[n={n}, d={d}, d_v={d_v}, {kind} keys]"
        self_term, interference = unpack("split_read(keys, values)", learner.split_read(keys, values), 2,
                                         "(self_term, interference)")
        # Interference is zero up to rounding for orthonormal keys: measure errors against the read's size.
        atol = 1e-10 * float(np.abs(reads).max())
        assert_close(f"split_read: self_term {where}", self_term, self_ref, dims="N V", atol=atol)
        assert_close(f"split_read: interference {where}", interference, interference_ref, dims="N V", atol=atol)
        ratio_ref = np.sum(interference_ref ** 2) / np.sum(self_ref ** 2)
        assert_close(f"interference_ratio(keys, values) {where}", learner.interference_ratio(keys, values),
                     ratio_ref, atol=1e-12)
