"""Wall-clock timing on the CPU: warm up, then the median of repeated runs; and the page faults of a call."""
from __future__ import annotations

import statistics
import time

try:
    import resource  # Unix only
except ImportError:  # pragma: no cover - Windows
    resource = None


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


def minor_page_faults(fn) -> int | None:
    """Minor page faults of one `fn()` call (first touches of fresh memory), None where the OS does not say.

    Why it is a column of the CPU bench: glibc hands large freed blocks back to the OS between calls, so a
    form that makes many large temporaries touches fresh pages on every call, and on some virtual machines
    each fault costs microseconds (see the README's CPU section).
    """
    if resource is None:
        return None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
