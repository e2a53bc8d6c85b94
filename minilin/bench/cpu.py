"""`minilin bench --device cpu`: each mixer's recurrent (token loop) against its chunked form, in NumPy.

Problem: B=1, H=4, T=4096, K=V=64, float32 (CONVENTIONS.md shapes). For each mixer: the baseline form's
time (the recurrent loop, one vectorized update over B and H per token), the chunked form's time, the
speed-up, the chunked output's relative error against the baseline run in float64, and each form's minor
page faults per call (one more call after the timed ones). Each form is checked before it is timed; a form
whose error exceeds float32's tolerance is reported and not timed. The forms are timed in alternating
rounds (`timing.interleaved_median_ms`), so that load on a shared machine hits them alike.
"""
from __future__ import annotations

import platform
import sys
import time

import numpy as np

from .. import catalog
from . import write_json
from .timing import interleaved_median_ms, minor_page_faults

PROBLEM = dict(B=1, T=4096, H=4, K=64, V=64)
QUICK_PROBLEM = dict(B=1, T=256, H=2, K=32, V=32)  # --quick: a first look in seconds, one round
FLOAT32_TOLERANCE = 1e-4
ROUNDS = 3          # alternating timing rounds (--repeats overrides)
RUNS_PER_ROUND = 3  # runs of each non-baseline form per round (the baseline: one)


def machine() -> str:
    import os

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, NumPy {np.__version__}"


def bench_mixer(name: str, repeats: int | None, problem: dict | None = None) -> dict:
    mod = catalog.module(name)
    baseline = catalog.baseline_form(name)
    args32, kwargs = mod.example_inputs(**(problem or PROBLEM), dtype=np.float32)
    args64 = tuple(a.astype(np.float64) if hasattr(a, "astype") else a for a in args32)
    reference, _ = getattr(mod, baseline)(*args64, **kwargs)
    row = {"mixer": name, "baseline": baseline}
    checked = {}  # the forms within tolerance, as closures over the float32 inputs
    for form in catalog.forms(name):
        fn = getattr(mod, form)
        out, _ = fn(*args32, **kwargs)
        error = catalog.relative_error(out, reference)
        row[f"{form}_error"] = error
        if not error <= FLOAT32_TOLERANCE:  # NaN fails too
            row[f"{form}_ms"] = None
            continue
        checked[form] = lambda fn=fn: fn(*args32, **kwargs)
    # The slow baseline once per round, the faster forms RUNS_PER_ROUND times: 3 and 9 runs by default.
    runs = {form: 1 if form == baseline else RUNS_PER_ROUND for form in checked}
    times = interleaved_median_ms(checked, runs, rounds=repeats or ROUNDS)
    for form, fn in checked.items():
        row[f"{form}_ms"] = times[form]
        row[f"{form}_page_faults"] = minor_page_faults(fn)
    if name in catalog.APPROXIMATES:  # reported, never held to a rounding tolerance
        exact, _ = catalog.reference(name)(*args64, **kwargs)
        row["approximation_error"] = catalog.relative_error(getattr(mod, baseline)(*args32, **kwargs)[0], exact)
    if row.get("chunked_ms") and row.get(f"{baseline}_ms"):
        row["speedup"] = row[f"{baseline}_ms"] / row["chunked_ms"]
    return row


def format_table(rows: list[dict]) -> str:
    lines = ["| mixer | baseline form | baseline ms | chunked ms | speed-up | chunked rel. error "
             "| page faults per call (baseline / chunked) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        speedup = f"{r['speedup']:.1f}x" if "speedup" in r else "-"
        error = f"{r['chunked_error']:.1e}" if "chunked_error" in r else "-"
        if "approximation_error" in r:
            error = f"{r['approximation_error']:.1e} vs exact softmax (approximation)"
        faults = f"{_faults(r, r['baseline'])} / {_faults(r, 'chunked')}"
        lines.append(f"| {r['mixer']} | {r['baseline']} | {_ms(r, r['baseline'])} | {_ms(r, 'chunked')} "
                     f"| {speedup} | {error} | {faults} |")
    return "\n".join(lines)


def _ms(row: dict, form: str) -> str:
    if f"{form}_ms" not in row:
        return "-"
    value = row[f"{form}_ms"]
    return "wrong, not timed" if value is None else f"{value:.1f}"


def _faults(row: dict, form: str) -> str:
    value = row.get(f"{form}_page_faults")
    return "-" if value is None else f"{value:,}"


def main(args) -> int:
    names = args.mixers or catalog.names()
    unknown = sorted(set(names) - set(catalog.names()))
    if unknown:
        print(f"--mixers: unknown mixer(s) {unknown}; choose from {catalog.names()}", file=sys.stderr)
        return 2
    quick = getattr(args, "quick", False)
    problem = QUICK_PROBLEM if quick else PROBLEM
    rounds = args.repeats or (1 if quick else ROUNDS)
    print(f"minilin bench --device cpu{' --quick' if quick else ''}: B={problem['B']} "
          f"H={problem['H']} T={problem['T']} K={problem['K']} V={problem['V']}, float32, median over "
          f"{rounds} alternating round{'s' if rounds > 1 else ''} (each form: one untimed run, then the baseline "
          f"once, every other form {RUNS_PER_ROUND} times); {machine()}", flush=True)
    rows = []
    for i, name in enumerate(names, 1):
        # Progress on stderr (the table on stdout stays clean): the line says what is being timed, and ends
        # with how long it took.
        print(f"[{i}/{len(names)}] {name}: checking, then timing {', '.join(catalog.forms(name))} ...", end="",
              file=sys.stderr, flush=True)
        start = time.perf_counter()
        rows.append(bench_mixer(name, rounds, problem))
        print(f" {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    print(format_table(rows))
    if args.json:
        write_json(args.json, {"device": "cpu", "machine": machine(), "problem": problem, "rows": rows})
    wrong = [r["mixer"] for r in rows if any(v is None for k, v in r.items() if k.endswith("_ms"))]
    return 1 if wrong else 0
