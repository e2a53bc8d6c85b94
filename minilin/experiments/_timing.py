"""Timing for the experiments that measure this CPU (bracket, cost): medians of alternating rounds of the CPU
time of one thread, taken in a child process that runs NumPy's BLAS on one thread with fixed malloc
thresholds, and a note when the machine was busy.

    single_threaded(function, **kwargs)       function(**kwargs) in a child process with one BLAS thread
    alternating_ms(fns, rounds, budget_s)     {key: median ms} of each fns[key](), timed in alternating rounds

Why one BLAS thread: what these experiments show is work (FLOPs, how time grows with the length), and one
thread's time follows the work. On a shared machine with few cores a multi-threaded BLAS call waits for its
slowest thread, and one thread descheduled by other work stalls the whole call for a scheduler slice, so the
same product can take twice as long from one call to the next.

Why CPU time: with one thread, the process's CPU time (time.process_time) is the time this computation spent
on a core, and the time it waited while other programs ran is not in it. Wall-clock time on this 2-core
machine, with a load average of 15 from other work, put one chunked form at 7x its time of a quiet moment;
its CPU time stayed within a few percent. (Other work still shares the caches, so a busy machine still
shifts CPU times a little.) In the fallback, timed in this process with several BLAS threads, CPU time would
add the threads up, so wall-clock time is taken there.

Why a child process: OpenBLAS, MKL and BLIS read their thread count from the environment
(OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, MKL_NUM_THREADS, BLIS_NUM_THREADS) once, when NumPy loads them, and
this process imported NumPy long ago. A fresh interpreter started with those set to 1 gets one thread, with no
dependency that changes the count at run time. The child imports minilin from the same place as this process.

Why fixed malloc thresholds: glibc returns large freed blocks to the OS and moves its mmap threshold with the
process's history, so whether a call's temporaries land on fresh pages (a page fault each, microseconds on a
virtual machine) depends on what ran before it: Gated DeltaNet's chunked form at T = 512 took 6.9 ms of CPU
time after one history and 3.4 ms after another. The child runs with GLIBC_TUNABLES fixing the mmap threshold
at 32 MiB (glibc's largest) and the trim threshold at 1 GiB, so every call reuses the pages of the last one,
and what is timed is the computation (glibc's manual, "Memory Allocation Tunables"; elsewhere it is ignored).

Why alternating rounds and medians: each round times every function once after the others (a warm-up call
first, so each finds its memory warm), so a burst of load falls on all of them alike instead of on whichever
was being timed; the median of the samples ignores the few a burst hit. Tiny functions are called several
times per sample, so a sample lasts at least MIN_SAMPLE_S and the timer's resolution does not matter.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from ..threads import MALLOC_TUNABLES, THREAD_VARIABLES, compute_environment  # noqa: F401 - MALLOC_TUNABLES: for tests

MIN_SAMPLE_S = 1e-3    # a sample (one or more calls) lasts at least this long
MAX_SAMPLES = 5        # samples of one function per round
CHILD_TIMEOUT_S = 600
_RESULT = "MINILIN-TIMING-RESULT "  # marks the child's answer among anything else it may print


def single_threaded(function, **kwargs):
    """function(**kwargs), a module-level function returning JSON-able data, run in a child Python process
    whose BLAS runs on one thread. Returns what it returned, through JSON (tuples come back as lists).
    Raises RuntimeError with the child's error output when it fails."""
    request = json.dumps({"module": function.__module__, "function": function.__qualname__, "kwargs": kwargs})
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = compute_environment()
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
    child = subprocess.run([sys.executable, "-c", "from minilin.experiments._timing import _child; _child()"],
                           input=request, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    answers = [line for line in child.stdout.splitlines() if line.startswith(_RESULT)]
    if child.returncode != 0 or not answers:
        raise RuntimeError(f"the timing process for {function.__module__}.{function.__qualname__} failed (exit "
                           f"status {child.returncode}):\n{child.stderr[-3000:]}")
    return json.loads(answers[-1][len(_RESULT):])


def child_environment() -> dict:
    """The variables the timing process runs under (THREAD_VARIABLES and GLIBC_TUNABLES), as it sees them."""
    return {name: os.environ.get(name) for name in (*THREAD_VARIABLES, "GLIBC_TUNABLES")}


def _child() -> None:
    """The child's side of single_threaded: the request on stdin, the answer on one marked line of stdout."""
    import importlib

    request = json.loads(sys.stdin.read())
    function = getattr(importlib.import_module(request["module"]), request["function"])
    print(_RESULT + json.dumps(function(**request["kwargs"])), flush=True)


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def _calls_per_sample(fn, clock) -> tuple[int, float]:
    """(calls per sample so that one lasts MIN_SAMPLE_S, seconds of one call), from two calls whose times are
    not kept: the first pays for first touches of memory, the second is the estimate."""
    fn()
    start = clock()
    fn()
    once = max(clock() - start, 1e-9)
    return max(1, int(MIN_SAMPLE_S / once + 0.999)), once


def alternating_ms(fns: dict, rounds: int, budget_s: float, clock: str = "cpu") -> dict:
    """Median milliseconds per call of each fns[key](), timed in `rounds` alternating rounds.

    clock: "cpu" (the process's CPU time: for one thread) or "wall". Per round and function: one warm-up call,
    then as many samples (1 to MAX_SAMPLES) as fit in about `budget_s`, each sample `calls` calls timed
    together. Returns {key: {"ms": median over all samples, "rounds_ms": [each round's median], "samples":
    count}}.
    """
    clock = CLOCKS[clock]
    plan = {}
    for key, fn in fns.items():
        calls, once = _calls_per_sample(fn, clock)
        plan[key] = (calls, max(1, min(MAX_SAMPLES, int(budget_s / (calls * once)))))
    samples = {key: [] for key in fns}
    per_round = {key: [] for key in fns}
    for _ in range(max(1, rounds)):
        for key, fn in fns.items():
            calls, count = plan[key]
            fn()
            this_round = []
            for _ in range(count):
                start = clock()
                for _ in range(calls):
                    fn()
                this_round.append((clock() - start) / calls * 1e3)
            samples[key] += this_round
            per_round[key].append(statistics.median(this_round))
    return {key: {"ms": statistics.median(samples[key]), "rounds_ms": per_round[key], "samples": len(samples[key])}
            for key in fns}


def spread(rounds_ms: list[float]) -> float:
    """How far a measurement's round medians disagree: (largest - smallest) / median (0 for one round)."""
    return (max(rounds_ms) - min(rounds_ms)) / statistics.median(rounds_ms) if len(rounds_ms) > 1 else 0.0


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
            f"{sample['cores']} cores): CPU times leave out the waits, but other work still shares the caches.")


def not_reproduced(checks: list[dict]) -> list[str]:
    """The lines that say which of an experiment's measured claims this run did not reproduce: one
    "not reproduced in this run: <claim> (measured: ...)" per failed check ({"claim", "reproduced",
    "measured"})."""
    return [f"not reproduced in this run: {c['claim']} (measured: {c['measured']})" for c in checks
            if not c["reproduced"]]
