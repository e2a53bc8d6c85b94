"""Wall-clock timing on the CPU: warm up, then the median of repeated runs."""
from __future__ import annotations

import statistics
import time


def median_ms(fn, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of `fn()` in milliseconds over `repeats` runs, after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3
