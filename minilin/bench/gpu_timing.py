"""GPU timing with CUDA events: warm up, then the median of repeated runs (bench/timing.py is the CPU timer).

Device work is asynchronous, so a host clock around a launch measures the launch, not the kernel. Each run
here is bracketed by two CUDA events on the stream the work goes to, and the elapsed time between them is
read after the stream finishes. Two numbers come out of one call:

- `median_ms`, the device time: runs queued back to back without waiting for each other, so that while the
  GPU works on run i the host is already preparing run i + 1, and run i + 1's start event fires when run i's
  work is done, not when the host got there. Between two runs (outside the events) a write over twice the
  L2 cache evicts what the previous run left there, so every run starts from DRAM, as triton.testing.do_bench
  does. This is the kernels' own time, what a ladder of kernel versions compares.
- `call_ms`, one call from an idle stream: the start event fires at once, the host then checks the arguments
  and launches, so the host's dispatch (~50 us for a minilin call, several Triton launches for FLA) is inside
  the events. This is what a lone call costs a user; for short kernels it differs from the device time.

The median of each is reported; a run slower than `budget_ms` allows lowers the count of queued runs (the
caller reports how many were taken).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass
class Timing:
    median_ms: float  # device time: the median of the queued runs
    runs: int  # queued runs taken
    call_ms: float | None = None  # the median of the calls from an idle stream, host dispatch included


SINGLE_CALLS = 5  # calls from an idle stream per median_ms, for call_ms


def _events(kind: str):
    """(make_event, record(event), synchronize(event), elapsed_ms(start, end), make_flush()) for CuPy's or
    torch's current stream; make_flush returns a function that overwrites twice the L2 cache on it."""
    if kind == "torch":
        import torch

        def make_flush():
            buffer = torch.empty(2 * l2_bytes(), dtype=torch.uint8, device="cuda")
            return buffer.zero_

        return (lambda: torch.cuda.Event(enable_timing=True), lambda e: e.record(), lambda e: e.synchronize(),
                lambda a, b: a.elapsed_time(b), make_flush)
    import cupy

    def make_flush():
        buffer = cupy.empty(2 * l2_bytes(), dtype=cupy.uint8)
        return lambda: buffer.fill(0)

    return (cupy.cuda.Event, lambda e: e.record(), lambda e: e.synchronize(),
            lambda a, b: cupy.cuda.get_elapsed_time(a, b), make_flush)


def l2_bytes() -> int:
    """The current device's L2 cache size in bytes."""
    import cupy

    return cupy.cuda.Device().attributes["L2CacheSize"]


def median_ms(fn, *, repeats: int = 50, warmup: int = 3, budget_ms: float = 10_000.0, events: str = "cupy",
              calls: int = SINGLE_CALLS, timer=None) -> Timing:
    """Device time of `fn()` in milliseconds: the median of up to `repeats` queued runs after `warmup` runs
    and `calls` single calls from an idle stream (their median is `call_ms`; the first also sizes the run).

    events: "cupy" (CuPy's current stream) or "torch" (torch's current stream), whichever runs the work;
    timer: the (make, record, sync, elapsed, make_flush) tuple itself, for tests without a GPU.
    If one run takes longer than budget_ms / repeats, fewer runs are queued (at least 3); the single calls
    after the first stop at half of budget_ms.
    """
    make, record, sync, elapsed, make_flush = timer or _events(events)
    for _ in range(warmup):
        fn()
    idle = make()  # the single calls below start from an idle stream, not behind the warm-up's work
    record(idle)
    sync(idle)
    def one_call() -> float:
        start, end = make(), make()
        record(start)
        fn()
        record(end)
        sync(end)
        return elapsed(start, end)

    call_times = [one_call()]
    first = max(call_times[0], 1e-3)
    call_times += [one_call() for _ in range(min(calls - 1, int(budget_ms / 2 / first)))]
    runs = max(3, min(repeats, int(budget_ms / first)))
    flush = make_flush()
    pairs = [(make(), make()) for _ in range(runs)]
    for start, end in pairs:
        flush()
        record(start)
        fn()
        record(end)
    sync(pairs[-1][1])
    times = [elapsed(start, end) for start, end in pairs]
    return Timing(statistics.median(times), len(times), statistics.median(call_times))


def alternating_medians(runs: list, *, repeats: int, rounds: int, budget_ms: float = 10_000.0) -> list[tuple]:
    """Time each (fn, events) of `runs` in `rounds` alternating rounds: fn_0, fn_1, ..., fn_0, fn_1, ...

    Each round takes median_ms of every fn (up to `repeats` runs, at most `budget_ms` each round), so a drift
    of the machine falls on all of them instead of on whichever was being timed. Returns, per fn, (the
    median of its round medians, its round medians, its runs over all rounds, the median of its rounds'
    call_ms).
    """
    medians = [[] for _ in runs]
    call_medians = [[] for _ in runs]
    counts = [0 for _ in runs]
    for _ in range(rounds):
        for i, (fn, events) in enumerate(runs):
            t = median_ms(fn, repeats=repeats, events=events, budget_ms=budget_ms)
            medians[i].append(t.median_ms)
            call_medians[i].append(t.call_ms)
            counts[i] += t.runs
    return [(statistics.median(m), m, n, statistics.median(c)) for m, n, c in zip(medians, counts, call_medians)]


def copy_bandwidth_gbs(nbytes: int = 2 * 2**30, repeats: int = 20) -> float:
    """Device-to-device copy rate in GB/s (1e9 bytes/s), counting bytes read plus bytes written: the
    achievable memory bandwidth, the ceiling every memory-bound kernel is measured against."""
    import cupy

    src = cupy.random.default_rng(0).random(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    t = median_ms(lambda: cupy.copyto(dst, src), repeats=repeats, warmup=2)
    return 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9
