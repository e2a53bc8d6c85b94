"""GPU timing with CUDA events: warm up, then the median of repeated runs (bench/timing.py is the CPU timer).

Device work is asynchronous, so a host clock around a launch measures the launch, not the kernel. Each run
here is bracketed by two CUDA events on the stream the work goes to, and the elapsed time between them is
read after the stream finishes. The median of many runs is reported; a run slower than `budget_ms` allows
lowers the count (the caller reports how many runs were taken).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass
class Timing:
    median_ms: float
    runs: int


def _events(kind: str):
    """(make_event, record(event), synchronize(event), elapsed_ms(start, end)) for CuPy's or torch's stream."""
    if kind == "torch":
        import torch

        return (lambda: torch.cuda.Event(enable_timing=True), lambda e: e.record(), lambda e: e.synchronize(),
                lambda a, b: a.elapsed_time(b))
    import cupy

    return (cupy.cuda.Event, lambda e: e.record(), lambda e: e.synchronize(),
            lambda a, b: cupy.cuda.get_elapsed_time(a, b))


def median_ms(fn, *, repeats: int = 50, warmup: int = 3, budget_ms: float = 10_000.0, events: str = "cupy") -> Timing:
    """Median time of `fn()` in milliseconds over up to `repeats` event-timed runs after `warmup` runs.

    events: "cupy" (CuPy's current stream) or "torch" (torch's current stream), whichever runs the work.
    If one run takes longer than budget_ms / repeats, fewer runs are taken (at least 3).
    """
    make, record, sync, elapsed = _events(events)
    for _ in range(warmup):
        fn()
    start, end = make(), make()
    record(start)
    fn()
    record(end)
    sync(end)
    first = elapsed(start, end)
    runs = max(3, min(repeats, int(budget_ms / max(first, 1e-3))))
    times = [first]
    for _ in range(runs - 1):
        start, end = make(), make()
        record(start)
        fn()
        record(end)
        sync(end)
        times.append(elapsed(start, end))
    return Timing(statistics.median(times), len(times))


def alternating_medians(runs: list, *, repeats: int, rounds: int, budget_ms: float = 10_000.0) -> list[tuple]:
    """Time each (fn, events) of `runs` in `rounds` alternating rounds: fn_0, fn_1, ..., fn_0, fn_1, ...

    Each round takes median_ms of every fn (up to `repeats` runs, at most `budget_ms` each round), so a drift
    of the machine falls on all of them instead of on whichever was being timed. Returns, per fn, (the
    median of its round medians, its round medians, its runs over all rounds).
    """
    medians = [[] for _ in runs]
    counts = [0 for _ in runs]
    for _ in range(rounds):
        for i, (fn, events) in enumerate(runs):
            t = median_ms(fn, repeats=repeats, events=events, budget_ms=budget_ms)
            medians[i].append(t.median_ms)
            counts[i] += t.runs
    return [(statistics.median(m), m, n) for m, n in zip(medians, counts)]


def copy_bandwidth_gbs(nbytes: int = 2 * 2**30, repeats: int = 20) -> float:
    """Device-to-device copy rate in GB/s (1e9 bytes/s), counting bytes read plus bytes written: the
    achievable memory bandwidth, the ceiling every memory-bound kernel is measured against."""
    import cupy

    src = cupy.random.default_rng(0).random(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    t = median_ms(lambda: cupy.copyto(dst, src), repeats=repeats, warmup=2)
    return 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9
