"""Check for exercise 03 (you do not need to edit this file): the feature maps against
minilin.feature_maps, and normalized linear attention against minilin.mixers.linear_attention."""
import numpy as np

from minilin import feature_maps
from minilin.course.checks import SEQUENCE_CASES, assert_close, check_form, label, without_overflow
from minilin.mixers import linear_attention


def test_elu_plus_one(learner):
    rng = np.random.default_rng(3)
    for shape in [(1,), (5, 7), (2, 9, 3, 4)]:
        x = 3 * rng.standard_normal(shape)
        assert_close(f"elu_plus_one(x) for x of shape {list(shape)}", learner.elu_plus_one(x),
                     feature_maps.elu_plus_one(x))
    x = np.array([-800.0, -1.0, -1e-9, 0.0, 1e-9, 1.0, 800.0])
    name = "elu_plus_one at -800, -1, -1e-9, 0, 1e-9, 1, 800"
    assert_close(name, without_overflow(name, learner.elu_plus_one, x), feature_maps.elu_plus_one(x))


def test_favor_plus(learner):
    for seed, (m, K, shape) in enumerate([(8, 4, (3,)), (64, 16, (2, 5, 3)), (100, 8, (1, 7, 2))]):
        fm = feature_maps.FavorPlus(num_features=m, seed=seed)
        W = fm.projection(K)
        x = np.random.default_rng(seed).standard_normal((*shape, K))
        assert_close(f"favor_plus(x, W) with m={m}, K={K}, x {list(x.shape)}", learner.favor_plus(x, W.copy()), fm(x))


def test_normalized_linear_attention(learner):
    maps = [("elu+1", feature_maps.elu_plus_one), ("FAVOR+ (m=32)", feature_maps.FavorPlus(32, seed=1))]
    for seed, case in enumerate(SEQUENCE_CASES, 30):
        (q, k, v), _ = linear_attention.example_inputs(**case, seed=seed)
        for name, phi in maps:
            expected, _ = linear_attention.parallel(q, k, v, feature_map=phi, normalize=True)
            check_form("normalized_linear_attention", learner.normalized_linear_attention, (q, k, v, phi), expected,
                       where=f"with phi = {name} [{label(case)}]", outputs="o", dims="B T H V", scales={})
