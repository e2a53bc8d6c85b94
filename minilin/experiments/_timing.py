"""Timing for the experiments that measure this CPU (bracket, cost): the fastest of several runs, and a note
when the machine was busy while they ran.

The fastest run is the one least disturbed by other work, so the closest to the algorithm's own cost. A
busy machine still disturbs it, multi-threaded BLAS calls most (one descheduled thread stalls the call
for a whole scheduler slice), so the tables say when the load average exceeded the cores.
"""
from __future__ import annotations

import os

from ..bench.timing import median_ms


def best_ms(fn, runs: int) -> float:
    """The fastest of `runs` single timed calls of fn(), in milliseconds."""
    return min(median_ms(fn, repeats=1, warmup=0) for _ in range(max(1, runs)))


def machine_load() -> dict:
    """{"cores": logical CPUs, "load": 1-minute load average} (load None where the OS has no load average)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return {"cores": os.cpu_count() or 1, "load": load}


def busiest(*loads: dict) -> dict:
    """The sample with the highest load: the one that says most about disturbed timings."""
    known = [sample for sample in loads if sample["load"] is not None]
    return max(known, key=lambda sample: sample["load"]) if known else loads[0]


def load_note(sample: dict) -> str:
    """A warning line when the load average exceeded the number of cores while timing, else ''."""
    if sample["load"] is None or sample["load"] <= sample["cores"]:
        return ""
    return (f"Note: the machine was busy while timing (1-minute load average {sample['load']:.1f} on "
            f"{sample['cores']} cores): other work inflates these times, multi-threaded BLAS calls most.")
