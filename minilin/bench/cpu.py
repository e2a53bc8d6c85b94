"""`minilin bench --device cpu`: each mixer's recurrent (token loop) against its chunked form, in NumPy.

Problem: B=1, H=4, T=4096, K=V=64, float32 (CONVENTIONS.md shapes). For each mixer: the baseline form's
time (the recurrent loop, one vectorized update over B and H per token), the chunked form's time at the
chunk size chosen for it here (`CHUNK_SIZES`), the speed-up, the target (`TARGETS`), and where the
matrix products of the chunked form are known (`cpu_floor.PRODUCTS`), their time alone, the floor, timed
in the same rounds; then the chunked output's relative error against the baseline run in float64, and
each form's minor page faults per call (one more call after the timed ones). Each form is checked before
it is timed; a form whose error exceeds float32's tolerance is reported and not timed. The forms are
timed in alternating rounds (`timing.interleaved_median_ms`), so that load on a shared machine hits them
alike. `NOTES` says where a chunked form cannot win on a CPU and why.
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

# The chunk size each chunked form runs at here, chosen by measurement on the 2-core development machine
# (speed-ups at C = 16, 32 and 64 in one process): the gated linear family is fastest at 32 (16 and 64 8-15%
# slower), the WY forms of the delta rule at 16 (32 within 2%, 64 20-25% slower: their C x C x V products
# and their triangular inverses grow with C; Gated DeltaNet at 32 3-7% slower once its pass no longer
# multiplies by T). Mixers not listed run at their chunked form's default (64).
CHUNK_SIZES = {name: 32 for name in ("linear_attention", "retnet", "lightning", "mamba2", "simple_gla", "gla",
                                     "hgrn2", "rwkv6")}
CHUNK_SIZES.update({name: 16 for name in ("deltanet", "gated_deltanet", "kda", "rwkv7")})

# Speed-ups over the token loop that the chunked forms are held to (a benchmark, not a timed test).
TARGETS = {"linear_attention": 8.0, "gated_deltanet": 6.0, "gla": 2.0, "kda": 2.0, "hgrn2": 2.0, "rwkv6": 2.0,
           "rwkv7": 2.0}

# Why some chunked forms do not beat the loop on a CPU.
ELEMENTWISE = ("one elementwise update per token (no matrix state, no matrix product to batch): the loop is already "
               "the cheapest form, and no chunking beats it on a CPU")
NOTES = {"mamba": ELEMENTWISE, "hgrn": ELEMENTWISE}

# Where the targets are missed, where the time goes: one chunked call split into its steps, timed one after
# another in the form's own order, segment by segment (medians of 30-40 calls in one process; the timing
# itself adds about 1 ms to Gated DeltaNet's 256-step pass), on the 2-core development machine, 2026-12-01
# (x86_64 VM, NumPy 2.4.6, one BLAS thread), in the minutes in which the bench measured the loops at 52-54 and
# 92-94 ms. The box is shared: a call's time moves by 5% from run to run, and by up to 30% while other work
# runs on it.
NOTES["linear_attention"] = (
    "8x asks for 6.6 ms. The four products alone (Q K^T, A V, K^T V, Q S_n at C = 32: 200 M multiply-adds, the "
    "floor column) take 4.4-4.9 ms, at 80-95 GFLOP/s the peak of one core (OpenBLAS keeps products this small "
    "on one thread), and the input checks 0.6 ms (q . q, k . k and v . v, whose finiteness proves theirs: "
    "three reads of 4 MB): 5-5.5 ms before anything else. The rest of a 7.6-8.3 ms call, each step a pass over "
    "an array no larger than an input: K^T copied for Q K^T (0.8 ms; a transposed right operand runs 2-4x "
    "slower), the state pass (0.55: 8 x 16 additions of [4, 64, 64]; 0.37 since the states are laid out chunk "
    "first, each addition one contiguous block), the sum of the two output terms (0.45; 0.07 since the intra-chunk "
    "term is written in the output's layout, 2026-12-02), a round of calls per segment (0.3), q * scale (0.25), "
    "the causal mask (0.2). Measured no faster: q * scale "
    "folded into A and the inter-chunk output, one fused [Q | A][S; V] output product, segment buffers "
    "allocated once per call, N + 1 state slots for one product of all writes, C = 16, 48 or 64, and K^T's copy "
    "replaced by swapped views for both products (1.08x the time: the scores' product on a swapped right operand "
    "took 1.5x as long, which the saved copy did not pay for); on 2026-12-02 the swapped view for Q K^T alone, "
    "K^T still copied for the writes (1.3x the time of the two products and the copy), one transpose of all of k "
    "into [B, H, K, T] (2.2 against 0.9 ms for the per-segment copies) or of each segment into [B, H, K, L] "
    "(1.11x with the two products), contiguous copies of each segment's q, k and v for the products (1.12x)")
NOTES["gated_deltanet"] = (
    "6x asks for 15.3-15.6 ms (the loop at 92-94 ms); the chunked call takes 15.2-15.9. Its state pass takes "
    "8-9 ms: 256 chunks one after another, each three products (K_e S_n; the output [Q_e | P T diag(beta)] "
    "[S_n; R_n]; the write K^T diag(exp(G_C - G)) T diag(beta) R_n: per head 16 x 64 to 64 x 80 operands, at "
    "75-85 GFLOP/s near one core's peak) and three elementwise steps (the residual R_n = V_n - K_e S_n, the "
    "decay, the sum); then the gates' decays 2.2 (exp(G_i - G_j) from float64 sums; Q and K times their "
    "decays), the inverses (I + A)^-1 diag(beta) 1.7, the grams 1.4, K^T's copy 0.85, the input checks 0.8 "
    "(finiteness, beta |k|^2 <= 1) and T folded into P and K^T 0.5. Measured no faster: FLA's order (W and U "
    "for all chunks, Delta_n = U_n - W_n S_n in the pass), the outputs of all chunks as one product after the "
    "pass, Delta_n = [T | T] [V_n; -K_e S_n] as one product, C = 24 or 32 (the pass halves its calls at 32, but "
    "the grams, inverses and fold grow by more)")


def machine() -> str:
    import os

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, NumPy {np.__version__}"


def bench_mixer(name: str, repeats: int | None, problem: dict | None = None) -> dict:
    from .cpu_floor import floor_parts

    mod = catalog.module(name)
    baseline = catalog.baseline_form(name)
    args32, kwargs = mod.example_inputs(**(problem or PROBLEM), dtype=np.float32)
    args64 = tuple(a.astype(np.float64) if hasattr(a, "astype") else a for a in args32)
    reference, _ = getattr(mod, baseline)(*args64, **kwargs)
    row = {"mixer": name, "baseline": baseline}
    if name in CHUNK_SIZES and "chunked" in catalog.forms(name):
        row["chunk_size"] = CHUNK_SIZES[name]
    checked = {}  # the forms within tolerance, as closures over the float32 inputs
    for form in catalog.forms(name):
        fn = getattr(mod, form)
        extra = {"chunk_size": row["chunk_size"]} if form == "chunked" and "chunk_size" in row else {}
        out, _ = fn(*args32, **kwargs, **extra)
        error = catalog.relative_error(out, reference)
        row[f"{form}_error"] = error
        if not error <= FLOAT32_TOLERANCE:  # NaN fails too
            row[f"{form}_ms"] = None
            continue
        checked[form] = lambda fn=fn, extra=extra: fn(*args32, **kwargs, **extra)
    # The chunked form's products alone (bench/cpu_floor.py), in the same rounds: the floor beside it.
    floor = floor_parts(name, args32, row.get("chunk_size", 64))
    timed = {**checked, **{("floor", label): fn for label, fn in floor.items()}}
    # The slow baseline once per round, the faster forms RUNS_PER_ROUND times: 3 and 9 runs by default.
    runs = {form: 1 if form == baseline else RUNS_PER_ROUND for form in timed}
    times = interleaved_median_ms(timed, runs, rounds=repeats or ROUNDS)
    for form, fn in checked.items():
        row[f"{form}_ms"] = times[form]
        row[f"{form}_page_faults"] = minor_page_faults(fn)
    if floor:
        row["floor_ms"] = {label: times[("floor", label)] for label in floor}
    if name in catalog.APPROXIMATES:  # reported, never held to a rounding tolerance
        exact, _ = catalog.reference(name)(*args64, **kwargs)
        row["approximation_error"] = catalog.relative_error(getattr(mod, baseline)(*args32, **kwargs)[0], exact)
    if row.get("chunked_ms") and row.get(f"{baseline}_ms"):
        row["speedup"] = row[f"{baseline}_ms"] / row["chunked_ms"]
    if name in TARGETS:
        row["target"] = TARGETS[name]
    if name in NOTES:
        row["note"] = NOTES[name]
    return row


def format_table(rows: list[dict]) -> str:
    lines = ["| mixer | baseline form | C | baseline ms | chunked ms | speed-up | target | floor ms (loop / floor) "
             "| chunked / floor | chunked rel. error | page faults per call (baseline / chunked) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        speedup = f"{r['speedup']:.1f}x" if "speedup" in r else "-"
        if r.get("note"):
            speedup += " (see note)"
        target = f"{r['target']:.0f}x" if "target" in r else "-"
        error = f"{r['chunked_error']:.1e}" if "chunked_error" in r else "-"
        if "approximation_error" in r:
            error = f"{r['approximation_error']:.1e} vs exact softmax (approximation)"
        faults = f"{_faults(r, r['baseline'])} / {_faults(r, 'chunked')}"
        floor, versus = _floor(r)
        lines.append(f"| {r['mixer']} | {r['baseline']} | {r.get('chunk_size', '-')} | {_ms(r, r['baseline'])} "
                     f"| {_ms(r, 'chunked')} | {speedup} | {target} | {floor} | {versus} | {error} | {faults} |")
    return "\n".join(lines)


def format_notes(rows: list[dict]) -> str:
    """The notes under the table: one line per mixer that has one."""
    return "\n".join(f"- {r['mixer']}: {r['note']}." for r in rows if r.get("note"))


def _floor(row: dict) -> tuple[str, str]:
    """'ms (loop / floor)' of the floor's last part (the one a chunked form does in full), and chunked / floor."""
    parts = row.get("floor_ms")
    if not parts:
        return "-", "-"
    label, ms = list(parts.items())[-1]
    loop = row.get(f"{row['baseline']}_ms")
    cell = f"{ms:.1f} ({loop / ms:.1f}x, {label})" if loop else f"{ms:.1f} ({label})"
    chunked = row.get("chunked_ms")
    return cell, (f"{chunked / ms:.2f}" if chunked else "-")


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
    notes = format_notes(rows)
    if notes:
        print(notes)
    if args.json:
        write_json(args.json, {"device": "cpu", "machine": machine(), "problem": problem, "rows": rows})
    wrong = [r["mixer"] for r in rows if any(v is None for k, v in r.items() if k.endswith("_ms"))]
    return 1 if wrong else 0
