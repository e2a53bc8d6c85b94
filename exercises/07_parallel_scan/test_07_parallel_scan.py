"""Check for exercise 07 (you do not need to edit this file): combine and both scans against minilin.scan,
in float64, and a count of the calls to combine that proves the scan has log depth."""
import math

import numpy as np

from minilin import scan
from minilin.course.checks import assert_close, fail, unpack

SHAPES = [(1, 1, 1), (2, 5, 3), (1, 37, 4), (3, 64, 2), (1, 1000, 3)]


def _steps(shape, seed):
    """a in (0, 1] (a decay exp(g), g <= 0) and b normal: the recurrences of minilin's mixers."""
    rng = np.random.default_rng(seed)
    return np.exp(-rng.uniform(0.0, 1.0, shape)), rng.standard_normal(shape)


def test_combine(learner):
    rng = np.random.default_rng(7)
    first = (rng.uniform(0, 1, (3, 4)), rng.standard_normal((3, 4)))
    second = (rng.uniform(0, 1, (3, 4)), rng.standard_normal((3, 4)))
    expected = scan.combine(first, second)
    a, b = unpack("combine(first, second)", learner.combine(first, second), 2, "(a, b)")
    assert_close("combine: a of the composed step", a, expected[0])
    assert_close("combine: b of the composed step (the order matters: first, then second)", b, expected[1])


def test_sequential_scan(learner):
    for seed, shape in enumerate(SHAPES):
        a, b = _steps(shape, seed)
        assert_close(f"sequential_scan(a, b), a and b {list(shape)}", learner.sequential_scan(a, b),
                     scan.sequential_scan(a, b), dims="B T D")


def test_associative_scan(learner):
    original = learner.combine
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    learner.combine = counted
    try:
        for seed, shape in enumerate(SHAPES, 10):
            a, b = _steps(shape, seed)
            calls.clear()
            got = learner.associative_scan(a, b)
            assert_close(f"associative_scan(a, b), a and b {list(shape)}", got, scan.sequential_scan(a, b), dims="B T D")
            T = shape[1]
            allowed = 2 * math.ceil(math.log2(T)) + 2
            if T > 1 and not calls:
                fail("associative_scan never called combine(): call it once per round, on all positions at once "
                     "(the check counts the calls to see the log depth)")
            if len(calls) > allowed:
                fail(f"associative_scan called combine() {len(calls)} times for T = {T}: that is a loop over t. "
                     f"A log-depth scan needs at most {allowed} rounds of one vectorized combine each")
    finally:
        learner.combine = original
