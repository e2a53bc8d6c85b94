"""Wall-clock timing on the CPU: warm up, then the median of repeated runs; and the page faults of a call."""
from __future__ import annotations

import statistics
import time

try:
    import resource  # Unix only
except ImportError:  # pragma: no cover - Windows
    resource = None


def _run_times(fn, runs: int, warmup: int) -> list[float]:
    """Seconds of each of `runs` timed calls of `fn()`, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median_ms(fn, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of `fn()` in milliseconds over `repeats` runs, after `warmup` untimed runs."""
    return statistics.median(_run_times(fn, repeats, warmup)) * 1e3


def interleaved_median_ms(fns: dict, runs_per_round: dict, rounds: int, warmup: int = 1) -> dict:
    """Median wall time in milliseconds of each `fns[name]()`, timed in alternating rounds.

    Each round runs every function, one after another, `warmup` times untimed and then
    `runs_per_round[name]` times timed. Alternating, a burst of load on a shared machine falls on all of them
    instead of on whichever was being timed (one after the other, a burst during the slow token loop made
    the CPU bench's speed-up look up to 1.5x better than in the next run). The untimed runs at the start of
    each round let every timed run find the memory its own form left behind: right after another form,
    attention's parallel form (hundreds of MB of temporaries) took 1.7 s instead of 0.37 s on fresh pages.
    Returns {name: median ms over its rounds * runs_per_round runs}.
    """
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name] += _run_times(fn, runs_per_round[name], warmup)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


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
