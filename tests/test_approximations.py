"""Linformer and Nystromformer against exact non-causal softmax attention: their formulas (checked
against a plain per-head loop), where they must be exact, how the error falls as the rank / landmark
count grows on inputs where the method is meant to work, where it does not, and bad input.

The input distributions (worked out in the modules' docstrings, measured over 100 seeds at T = 64,
B = 2, H = 4 before being asserted on a few):
- i.i.d. normal tokens: sampling r of the T positions is a self-normalized estimate of the softmax
  sum, so its error falls with r for any input (every seed monotone over r = 4, 8, 16, 32).
- tokens correlated over T / 4 positions (AR(1), `_noncausal.correlated_normal`): segment means
  summarize their segments, so pooling (Linformer) and landmarks (Nystromformer, the paper's iterative
  pseudo-inverse) fall with r and m (every seed monotone; worst step ratio 0.70 and 0.76).
- On i.i.d. tokens the segment means carry almost nothing and Nystromformer stays poor until m nears T.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from minilin.mixers import _noncausal, linformer, nystromformer
from conftest import rel_err

B, T, H, K, V = 2, 64, 4, 16, 16


def iid_inputs(seed, T=T):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, T, H, D)) for D in (K, K, V))


def correlated_inputs(seed, T=T):
    rng = np.random.default_rng(seed)
    return tuple(_noncausal.correlated_normal(rng, (B, T, H, D), T / 4) for D in (K, K, V))


def loop_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def error(approx, q, k, v, **options):
    out, state = approx.parallel(q, k, v, **options)
    assert state is None
    return rel_err(out, approx.exact(q, k, v)[0])


def strictly_decreasing(errors) -> bool:
    return all(b < a for a, b in zip(errors, errors[1:]))


# --- the formulas ---------------------------------------------------------------------------------------

def test_exact_is_noncausal_softmax_attention():
    q, k, v = iid_inputs(0)
    out, _ = linformer.exact(q, k, v, scale=0.3)
    for b in range(B):
        for h in range(H):
            ref = loop_softmax(0.3 * q[b, :, h] @ k[b, :, h].T) @ v[b, :, h]
            assert rel_err(out[b, :, h], ref) < 1e-13
    assert rel_err(nystromformer.exact(q, k, v, scale=0.3)[0], out) == 0


def test_linformer_applies_E_to_keys_and_F_to_values():
    q, k, v = iid_inputs(1)
    rng = np.random.default_rng(2)
    E, F = rng.standard_normal((9, T)) / 3, rng.standard_normal((9, T)) / 3
    out, _ = linformer.parallel(q, k, v, E=E, F=F)
    for b in range(B):
        for h in range(H):
            ref = loop_softmax(K ** -0.5 * q[b, :, h] @ (E @ k[b, :, h]).T) @ (F @ v[b, :, h])
            assert rel_err(out[b, :, h], ref) < 1e-13


def test_nystromformer_formula_with_uneven_segments():
    """T = 64, m = 10: segments of 6 or 7 tokens; o = softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T) V."""
    q, k, v = iid_inputs(3)
    m = 10
    bounds = np.linspace(0, T, m + 1).round().astype(int)
    assert set(np.diff(bounds)) == {6, 7}
    out, _ = nystromformer.parallel(q, k, v, landmarks=m, pinv="exact")
    s = K ** -0.5
    for b in range(B):
        for h in range(H):
            Q, Kh, Vh = q[b, :, h], k[b, :, h], v[b, :, h]
            Ql = np.stack([Q[bounds[i]:bounds[i + 1]].mean(0) for i in range(m)])
            Kl = np.stack([Kh[bounds[i]:bounds[i + 1]].mean(0) for i in range(m)])
            ref = loop_softmax(s * Q @ Kl.T) @ np.linalg.pinv(loop_softmax(s * Ql @ Kl.T)) @ loop_softmax(s * Ql @ Kh.T) @ Vh
            assert rel_err(out[b, :, h], ref) < 1e-10


def test_iterative_pinv_converges_to_the_pseudo_inverse():
    """The paper's iteration is a pseudo-inverse in the limit (well-conditioned softmax matrix, i.i.d. tokens)."""
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((2, 3, 24, 16))
    A = loop_softmax(q @ k.swapaxes(-1, -2) / 4)
    assert rel_err(nystromformer.iterative_pinv(A, 60), np.linalg.pinv(A)) < 1e-10
    assert rel_err(nystromformer.iterative_pinv(A, 6), np.linalg.pinv(A)) > 1e-3   # 6 steps: not there yet


@pytest.mark.parametrize("approx", [linformer, nystromformer])
def test_noncausal_last_token_changes_the_first_output(approx):
    """Why there is no recurrent form: output 0 already depends on token T - 1."""
    q, k, v = correlated_inputs(5)
    options = {"rank": 16} if approx is linformer else {"landmarks": 8}
    k2, v2 = k.copy(), v.copy()
    k2[:, -1] += 1.0
    v2[:, -1] += 1.0
    if approx is linformer:
        options["projection"] = "pool"  # the sampled positions might miss token T - 1
    first = approx.parallel(q, k, v, **options)[0][:, 0]
    changed = approx.parallel(q, k2, v2, **options)[0][:, 0]
    assert np.abs(changed - first).max() > 1e-6


# --- where they must be exact ---------------------------------------------------------------------------

@pytest.mark.parametrize("make_inputs", [iid_inputs, correlated_inputs])
def test_linformer_identity_projection_is_exact(make_inputs):
    q, k, v = make_inputs(6)
    assert error(linformer, q, k, v, E=np.eye(T)) < 1e-13


@pytest.mark.parametrize("projection", ["sample", "pool"])
def test_linformer_full_rank_is_exact(projection):
    """rank = T: sampling picks every position (in order), pooling's segments are single tokens."""
    q, k, v = iid_inputs(7)
    assert error(linformer, q, k, v, rank=T, projection=projection, seed=7) < 1e-13


@pytest.mark.parametrize("make_inputs", [iid_inputs, correlated_inputs])
def test_nystromformer_all_landmarks_exact_pinv_is_exact(make_inputs):
    """m = T: landmarks are the tokens, and S pinv(S) S = S for any S."""
    q, k, v = make_inputs(8)
    assert error(nystromformer, q, k, v, landmarks=T, pinv="exact") < 1e-10


# --- the error falls as r / m grows, on inputs where it should ------------------------------------------

@pytest.mark.parametrize("seed", [10, 11, 12])
def test_linformer_sampling_error_falls_with_rank(seed):
    q, k, v = iid_inputs(seed)
    errors = [error(linformer, q, k, v, rank=r, seed=seed) for r in (4, 8, 16, 32)]
    assert strictly_decreasing(errors), errors


@pytest.mark.parametrize("seed", [20, 21, 22])
def test_linformer_pooling_error_falls_with_rank_on_correlated_tokens(seed):
    q, k, v = correlated_inputs(seed)
    errors = [error(linformer, q, k, v, rank=r, projection="pool") for r in (2, 4, 8, 16, 32)]
    assert strictly_decreasing(errors), errors
    assert errors[-1] < 0.05


@pytest.mark.parametrize("seed", [30, 31, 32])
def test_nystromformer_error_falls_with_landmarks_on_correlated_tokens(seed):
    q, k, v = correlated_inputs(seed)
    errors = [error(nystromformer, q, k, v, landmarks=m) for m in (2, 4, 8, 16, 32)]
    assert strictly_decreasing(errors), errors
    assert errors[-1] < 0.05


# --- where they do not work -----------------------------------------------------------------------------

def test_linformer_gaussian_projection_does_not_approach_softmax():
    """softmax(Q (R K)^T) (R V) with R ~ N(0, 1/r): the projected scores shrink like 1/sqrt(r), the output
    goes to zero, and the relative error goes to 1 instead of 0 (the module docstring's derivation)."""
    q, k, v = correlated_inputs(40)
    exact, _ = linformer.exact(q, k, v)
    errors, norms = [], []
    for r in (64, 256, 1024):
        out, _ = linformer.parallel(q, k, v, rank=r, projection="gaussian", seed=r)
        errors.append(rel_err(out, exact))
        norms.append(np.linalg.norm(out) / np.linalg.norm(exact))
    assert min(errors) > 0.5 and abs(errors[-1] - 1) < 0.1, errors
    assert strictly_decreasing(norms), norms


def test_nystromformer_exact_pinv_is_unstable_below_T():
    """Inverting the nearly singular landmark matrix exactly amplifies the approximation's mismatch: on ten
    seeds of the inputs where the iterative form falls steadily, the exact form mostly does not, and some
    of its errors exceed the output itself (measured: 84 of 100 seeds not monotone, worst 93x)."""
    not_monotone = worse_than_zero = 0
    for seed in range(50, 60):
        q, k, v = correlated_inputs(seed)
        errors = [error(nystromformer, q, k, v, landmarks=m, pinv="exact") for m in (2, 4, 8, 16, 32)]
        not_monotone += not strictly_decreasing(errors)
        worse_than_zero += max(errors) > 1
    assert not_monotone >= 5 and worse_than_zero >= 1, (not_monotone, worse_than_zero)


def test_nystromformer_landmarks_of_iid_tokens_carry_little():
    """Segment means of i.i.d. tokens shrink toward zero and summarize nothing: a quarter of the tokens as
    landmarks still leaves most of the output wrong."""
    q, k, v = iid_inputs(41)
    assert error(nystromformer, q, k, v, landmarks=T // 4) > 0.4


def test_linformer_seed_picks_the_positions():
    q, k, v = iid_inputs(42)
    a, b, c = (linformer.parallel(q, k, v, rank=8, seed=s)[0] for s in (1, 1, 2))
    assert np.array_equal(a, b) and not np.allclose(a, c)


def test_float32_stays_float32():
    q, k, v = (x.astype(np.float32) for x in correlated_inputs(43))
    assert linformer.parallel(q, k, v, rank=8)[0].dtype == np.float32
    assert nystromformer.parallel(q, k, v, landmarks=8)[0].dtype == np.float32


# --- bad input: one test per case ------------------------------------------------------------------------

def test_rank_zero():
    with pytest.raises(ValueError, match=re.escape("rank: expected an integer 1 <= rank <= 64 = T (sample picks r "
                                                   "of the T positions), got 0")):
        linformer.parallel(*iid_inputs(0), rank=0)


def test_rank_above_T_when_sampling():
    with pytest.raises(ValueError, match=r"rank: expected an integer 1 <= rank <= 64 .*got 65"):
        linformer.parallel(*iid_inputs(0), rank=65)


def test_rank_missing():
    with pytest.raises(TypeError, match=r"rank: expected a positive integer .*got None"):
        linformer.parallel(*iid_inputs(0))


def test_unknown_projection():
    with pytest.raises(ValueError, match=re.escape("projection: expected one of ['sample', 'pool', 'gaussian'], got 'svd'")):
        linformer.parallel(*iid_inputs(0), rank=4, projection="svd")


def test_E_wrong_length():
    with pytest.raises(ValueError, match=re.escape("E: expected shape [R, T] = [R, 64], got [4, 63]")):
        linformer.parallel(*iid_inputs(0), E=np.ones((4, 63)))


def test_F_rank_differs_from_E():
    with pytest.raises(ValueError, match=re.escape("F: expected shape [R, T] = [4, 64], got [5, 64]")):
        linformer.parallel(*iid_inputs(0), E=np.ones((4, 64)), F=np.ones((5, 64)))


def test_F_without_E():
    with pytest.raises(ValueError, match=r"F: expected None when E is None"):
        linformer.parallel(*iid_inputs(0), rank=4, F=np.ones((4, 64)))


@pytest.mark.parametrize("approx, options", [(linformer, {"rank": 4}), (nystromformer, {"landmarks": 4})])
def test_initial_state_refused(approx, options):
    with pytest.raises(ValueError, match=r"initial_state: expected None \(.* is non-causal"):
        approx.parallel(*iid_inputs(0), initial_state=np.zeros((B, H, K, V)), **options)


def test_landmarks_above_T():
    with pytest.raises(ValueError, match=re.escape("landmarks: expected an integer 1 <= landmarks <= 64 = T, got 65")):
        nystromformer.parallel(*iid_inputs(0), landmarks=65)


def test_landmarks_not_an_integer():
    with pytest.raises(TypeError, match=r"landmarks: expected an integer .*got 4\.0"):
        nystromformer.parallel(*iid_inputs(0), landmarks=4.0)


def test_unknown_pinv():
    with pytest.raises(ValueError, match=re.escape("pinv: expected one of ['iterative', 'exact'], got 'newton'")):
        nystromformer.parallel(*iid_inputs(0), landmarks=4, pinv="newton")


def test_iterations_zero():
    with pytest.raises(ValueError, match=r"iterations: expected a positive integer, got 0"):
        nystromformer.parallel(*iid_inputs(0), landmarks=4, iterations=0)


def test_exact_rejects_unknown_options():
    with pytest.raises(TypeError, match=re.escape("linformer.exact: unexpected keyword argument(s) ['rnak']")):
        linformer.exact(*iid_inputs(0), rnak=4)


def test_mismatched_key_dim():
    q, k, v = iid_inputs(0)
    with pytest.raises(ValueError, match=re.escape("k: expected shape [B, T, H, K] = [2, 64, 4, 16], got [2, 64, 4, 15]")):
        nystromformer.parallel(q, k[..., :15], v, landmarks=4)


@pytest.mark.parametrize("approx", [linformer, nystromformer])
def test_catalog_measures_approximations_against_exact(approx):
    """The tour and the bench compare an approximation with exact softmax attention, not with itself:
    on its own example inputs the difference is real (not rounding) and moderate."""
    from minilin import catalog

    name = approx.__name__.rsplit(".", 1)[1]
    assert catalog.reference(name) is approx.exact
    args, kwargs = approx.example_inputs(2, 128, 2, 16, 16, seed=9)
    err = rel_err(approx.parallel(*args, **kwargs)[0], catalog.reference(name)(*args, **kwargs)[0])
    assert 1e-4 < err < 0.3, err


def test_a_given_float64_projection_joins_the_working_dtype():
    """E is an array input: float32 q, k, v with a float64 E compute in float64, as every mixer promotes (it was cast
    down to q's float32, a relative error of ~1e-7 against the float64 computation)."""
    from minilin.mixers import linformer

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 8, 2, 3)).astype(np.float32) for _ in range(3))
    E = rng.standard_normal((3, 8))
    o, _ = linformer.parallel(q, k, v, E=E)
    o64, _ = linformer.parallel(*(x.astype(np.float64) for x in (q, k, v)), E=E)
    assert o.dtype == np.float64 and np.array_equal(o, o64)
