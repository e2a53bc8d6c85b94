"""`minilin bench --against fla`: minilin's fastest CUDA kernel beside flash-linear-attention's, in one run.

FLA (Triton) is what a user would pick instead of minilin's kernels; this side-by-side is what a user needs
to choose between them. It needs FLA importable (`pip install fla-core`, pure Python: einops, torch and triton underneath);
FLA is never a dependency of minilin.

Problem: bench/gpu.py's (B=4, H=16, K=V=128), or --shape's (e.g. B=1 H=16 K=64 V=64; HV=32 for grouped value
heads), bfloat16 inputs, the same numbers for both (one draw per
length, on the bfloat16 grid), T in --lengths (default 2048 8192 32768); mixers simple_gla, deltanet and
gated_deltanet, against FLA's chunk_simple_gla, chunk_delta_rule and chunk_gated_delta_rule, and by --mixers gla
and kda (a decay per key channel) against chunk_gla and chunk_kda.

Both are checked before they are timed: output and final state against the float64 reference (minilin's
chunked form on CuPy in float64) within 1e-2, and minilin's output against FLA's within 1e-2. Timing: both
go through the same timer (bench/gpu_timing.py), warm-up first, and the two alternate over ROUNDS rounds so
that drift on a shared machine hits both alike. Two times per side, each the median over rounds:
- ms, the device time (--repeats runs queued back to back, the L2 cache overwritten between them): the
  kernels against the kernels, each side's host dispatch hidden behind its previous run. The goal (minilin /
  FLA at 0.9 or less) is judged on it.
- call ms, one call from an idle stream: each side pays its own dispatch (one checked call and one or two
  launches for minilin, several Triton launches for FLA), which is what a lone call costs.

`--grid` runs the same comparison over GRID instead: FLA's own benchmark shapes (its
benchmarks/ops/registry.py SHAPE_CONFIGS) and one long sequence, an initial state given to both sides; `--grid
all` adds K = V = 64 and K = 128 with V = 64 and 256 at each (B, T, H); `--head-dims 64x64 ...` keeps the
shapes of those widths only (with --resume, a grid timed a slice at a time). It prints one table, a row per shape
and a column per mixer (minilin / FLA device time, minilin's version), and --json writes every comparison.
A shape minilin's kernels do not take is reported as such and not timed. `--grid layouts` runs
LAYOUTS: packed sequences (cu_seqlens) and grouped value heads. The JSON is written after every cell, each row
with its date; `--resume` keeps the cells an earlier run's --json file holds (the same grid on the same GPU model,
failed cells timed again) and times the rest, so that a run its time limit cut short can be finished.
"""
from __future__ import annotations

import sys

import numpy as np

from . import SHAPE_SIZES, gpu, parse_shape, read_earlier_json, write_json
from .gpu_timing import SINGLE_CALLS, alternating_medians, copy_bandwidth_gbs

MIXERS = ("simple_gla", "deltanet", "gated_deltanet")  # the default
CHANNEL_MIXERS = ("gla", "kda")  # a decay per key channel, against chunk_gla and chunk_kda: by --mixers
DTYPE = "bfloat16"
ROUNDS = 3
GOAL = 0.9  # minilin's time over FLA's
# (B, T, H, K, V): FLA's SHAPE_CONFIGS, then one sequence at long and short context.
GRID = ((1, 8192, 96, 128, 128), (2, 16384, 16, 128, 128), (4, 2048, 16, 128, 128), (4, 4096, 64, 128, 128),
        (8, 1024, 8, 64, 64), (8, 2048, 32, 256, 256), (1, 32768, 16, 128, 128), (1, 2048, 16, 128, 128))
GRID_HEAD_DIMS = ((64, 64), (128, 64), (128, 256))  # --grid all: these (K, V) too, at each grid (B, T, H)
# --grid layouts: eight sequences of mixed lengths (some not a whole number of 64-token chunks) packed into one
# batch row of 32768 tokens, and grouped value heads as in Qwen3-Next's Gated DeltaNet (16 q/k heads, 32 value
# heads) at one sequence of 32768 and at B = 4, T = 8192. FLA's chunk_gated_delta_rule takes both layouts; its
# simple GLA and DeltaNet kernels take cu_seqlens but one q/k head per value head, so they get q and k repeated
# (the copy not timed).
PACKED_LENGTHS = (8000, 1000, 6100, 2100, 4200, 555, 7213, 3600)
LAYOUTS = (
    ("8 packed, 32768 tokens, H = 16", 32768,
     dict(B=1, H=16, K=128, V=128, cu_seqlens=tuple(int(x) for x in np.cumsum((0,) + PACKED_LENGTHS)))),
    ("1, 32768, H_qk = 16, H_v = 32", 32768, dict(B=1, H=16, HV=32, K=128, V=128)),
    ("4, 8192, H_qk = 16, H_v = 32", 8192, dict(B=4, H=16, HV=32, K=128, V=128)),
)


def grid_shapes(which: str, head_dims: list[tuple[int, int]] | None = None) -> list[tuple]:
    """GRID, or with which == "all" GRID and GRID_HEAD_DIMS at every (B, T, H) of it, without repeats; with
    head_dims (--head-dims' (K, V) pairs) only the shapes of those widths, in the grid's order. A pair the grid
    does not hold is a ValueError that lists the ones it does."""
    shapes = list(GRID)
    if which == "all":
        shapes += [(B, T, H, K, V) for B, T, H, _, _ in GRID for K, V in GRID_HEAD_DIMS]
    shapes = list(dict.fromkeys(shapes))
    if head_dims:
        held = list(dict.fromkeys(shape[3:] for shape in shapes))
        missing = [dims for dims in head_dims if tuple(dims) not in held]
        if missing:
            def named(pairs):
                return ", ".join(f"{K}x{V}" for K, V in pairs)
            raise ValueError(f"--head-dims: grid {which!r} has K x V {named(held)}; got {named(missing)}")
        shapes = [shape for shape in shapes if shape[3:] in {tuple(dims) for dims in head_dims}]
    return shapes


def grid_problems(which: str, head_dims: list[tuple[int, int]] | None = None) -> list[tuple[str, int, dict]]:
    """(label, T, problem) for every cell row of --grid `which`: the shapes of grid_shapes (those of head_dims
    when given), or LAYOUTS."""
    if which == "layouts":
        return list(LAYOUTS)
    return [(", ".join(map(str, (B, T, H, K, V))), T, dict(B=B, H=H, K=K, V=V))
            for B, T, H, K, V in grid_shapes(which, head_dims)]


def fla_version() -> str | None:
    try:
        import fla
    except ImportError:
        return None
    return getattr(fla, "__version__", "unknown version")


def compare(mixer: str, T: int, repeats: int, problem: dict | None = None, with_state: bool = False) -> dict:
    """One (mixer, T) at `problem`'s B, H, K, V (default bench/gpu.py's PROBLEM): errors of both, then
    alternating timings. Returns a flat dict (JSON row); a side that fails or misses the tolerance is reported
    in its "note" and nothing is timed."""
    import cupy

    try:
        return _compare(mixer, T, repeats, problem or gpu.PROBLEM, with_state)
    finally:  # this length's arrays are gone with _compare's frame; hand their memory back
        cupy.get_default_memory_pool().free_all_blocks()


def _compare(mixer: str, T: int, repeats: int, problem: dict, with_state: bool) -> dict:
    import cupy

    from .. import catalog, cuda

    inputs = gpu.make_inputs(mixer, T, seed=T, problem=problem, with_state=with_state)
    ref_o, ref_state = gpu.reference(mixer, inputs, cupy.float64)
    # what a user's call would run at this shape
    version = cuda.default_version(cuda.OPS[mixer], DTYPE == "bfloat16", problem["K"], problem["V"])
    row = {"mixer": mixer, "T": T, **{d: problem[d] for d in "BHKV"}, "initial_state": with_state, "dtype": DTYPE,
           "minilin_version": version}
    if "HV" in problem:
        row["HV"] = problem["HV"]
    if "cu_seqlens" in problem:
        row["cu_seqlens"] = list(problem["cu_seqlens"])
    ours = gpu.cuda_call(mixer, inputs, DTYPE, version)
    try:
        our_o, our_state = gpu.cuda_out_as_float(ours())
    except ValueError as error:  # a size the kernels do not take: say so, time nothing
        row["note"] = f"minilin: not supported ({error})"[:300]
        return row
    row.update(minilin_error=catalog.relative_error(our_o, ref_o),
               minilin_state_error=catalog.relative_error(our_state, ref_state))
    try:
        theirs, fla_as_cupy = gpu.fla_call(mixer, inputs, DTYPE)
        fla_o, fla_state = fla_as_cupy(theirs())
    except Exception as error:  # noqa: BLE001 - FLA may fail in its own ways (Triton compilation, its API)
        row["note"] = f"FLA failed: {type(error).__name__}: {error}"[:300]
        return row
    row.update(fla_error=catalog.relative_error(fla_o, ref_o),
               fla_state_error=catalog.relative_error(fla_state, ref_state),
               minilin_vs_fla_error=catalog.relative_error(our_o, fla_o))
    tol = gpu.TOLERANCE[DTYPE]
    errors = [row[k] for k in ("minilin_error", "minilin_state_error", "fla_error", "fla_state_error",
                               "minilin_vs_fla_error")]
    if not all(e <= tol for e in errors):  # NaN fails too
        row["note"] = f"WRONG (tolerance {tol:g}): not timed"
        return row
    (ours_ms, ours_rounds, _, ours_call), (fla_ms, fla_rounds, _, fla_call) = alternating_medians(
        [(ours, "cupy"), (theirs, "torch")], repeats=repeats, rounds=ROUNDS)
    row.update(minilin_ms=ours_ms, fla_ms=fla_ms, minilin_rounds_ms=ours_rounds, fla_rounds_ms=fla_rounds,
               minilin_call_ms=ours_call, fla_call_ms=fla_call)
    row["ratio"] = row["minilin_ms"] / row["fla_ms"]
    row["call_ratio"] = ours_call / fla_call
    return row


def _e(row: dict, key: str) -> str:
    return f"{row[key]:.1e}" if key in row else "-"


def format_table(rows: list[dict], copy_gbs: float) -> str:
    lines = [f"| mixer | T | minilin ms | FLA ms | minilin / FLA | goal <= {GOAL} | call ms minilin / FLA (ratio) | "
             f"I/O floor ms | error minilin / FLA (vs float64) | minilin vs FLA |",
             "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        floor = gpu.io_floor_bytes(r["T"], DTYPE, r if all(d in r for d in "BHKV") else None) / (copy_gbs * 1e9) * 1e3
        errors = f"{_e(r, 'minilin_error')} / {_e(r, 'fla_error')}"
        if "ratio" not in r:
            lines.append(f"| {r['mixer']} | {r['T']} | - | - | - | {r.get('note', '')} | - | {floor:.3f} | {errors} | "
                         f"{_e(r, 'minilin_vs_fla_error')} |")
            continue
        met = "met" if r["ratio"] <= GOAL else "not met"
        call = (f"{r['minilin_call_ms']:.3f} / {r['fla_call_ms']:.3f} ({r['call_ratio']:.2f})"
                if r.get("call_ratio") is not None else "-")
        lines.append(f"| {r['mixer']} | {r['T']} | {r['minilin_ms']:.3f} (v{r['minilin_version']}) | "
                     f"{r['fla_ms']:.3f} | {r['ratio']:.2f} | {met} | {call} | {floor:.3f} | {errors} | "
                     f"{_e(r, 'minilin_vs_fla_error')} |")
    return "\n".join(lines)


def format_grid(rows: list[dict], mixers: list[str]) -> str:
    """One row per shape (its "label"), one column per mixer: minilin / FLA device time (minilin's version), or
    why not."""
    lines = ["| B, T, H, K, V | " + " | ".join(mixers) + " |", "| --- |" + " ---: |" * len(mixers)]
    for label in dict.fromkeys(r["label"] for r in rows):
        cells = []
        for mixer in mixers:
            r = next((r for r in rows if r["mixer"] == mixer and r["label"] == label), None)
            if r is None:
                cells.append("-")
            elif "ratio" in r:
                cells.append(f"{'**' if r['ratio'] > GOAL else ''}{r['ratio']:.2f}{'**' if r['ratio'] > GOAL else ''}"
                             f" (v{r['minilin_version']}, {r['minilin_ms']:.3f} / {r['fla_ms']:.3f} ms)")
            else:
                cells.append(r.get("note", "-").split(" (")[0])
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(args) -> int:
    from ..cuda import available

    ok, reason = available()
    if not ok:
        print(f"minilin bench --against fla: {reason}. `minilin doctor` says what is missing.", file=sys.stderr)
        return 2
    version = fla_version()
    if version is None:
        print("minilin bench --against fla: flash-linear-attention is not importable; install it with "
              "`pip install fla-core` (offline: carry the fla-core and einops wheels).", file=sys.stderr)
        return 2
    mixers = args.mixers or list(MIXERS)
    unknown = [m for m in mixers if m not in MIXERS + CHANNEL_MIXERS]
    if unknown:
        print(f"--mixers: FLA is compared for {list(MIXERS + CHANNEL_MIXERS)}, got {unknown}", file=sys.stderr)
        return 2
    repeats = args.repeats or 50
    lengths = args.lengths or gpu.LENGTHS
    info = gpu.machine()
    info["fla"] = version
    copy_gbs = copy_bandwidth_gbs()
    if getattr(args, "grid", None):
        return main_grid(args, mixers, repeats, info, copy_gbs)
    problem = parse_shape(args.shape, gpu.PROBLEM) if getattr(args, "shape", None) else gpu.PROBLEM
    sizes = " ".join(f"{d}={problem[d]}" for d in SHAPE_SIZES if d in problem)
    print(f"minilin bench --against fla: {info['gpu']}, {info['date']}, FLA {version}, torch {info.get('torch')}, "
          f"CuPy {info['cupy']}; {sizes}, {DTYPE}; per round the median of {repeats} queued runs (and of "
          f"{SINGLE_CALLS} single calls), reported the median over {ROUNDS} alternating rounds", flush=True)
    rows = []
    for mixer in mixers:
        for T in lengths:
            row = compare(mixer, T, repeats, problem)
            state = (f"{row['minilin_ms']:.3f} vs {row['fla_ms']:.3f} ms (one call: {row['minilin_call_ms']:.3f} vs "
                     f"{row['fla_call_ms']:.3f})" if "ratio" in row else row["note"])
            print(f"  {mixer} T={T}: {state}", file=sys.stderr, flush=True)
            rows.append(row)
    print(format_table(rows, copy_gbs))
    if args.json:
        write_json(args.json, {"against": "fla", "machine": info, "copy_bandwidth_gbs": copy_gbs,
                               "problem": problem, "rows": rows})
    return 1 if any("ratio" not in r for r in rows) else 0


def resumed_rows(path: str, grid: str, info: dict) -> list[dict]:
    """--resume: the rows of an earlier `--grid` run's JSON at `path` (none if there is no such file yet). The file
    must hold the same grid timed on the same GPU model, or ValueError says what it holds instead."""
    earlier = read_earlier_json(path)
    if not earlier:
        return []
    if earlier.get("against") != "fla" or earlier.get("backward"):
        raise ValueError(f"--resume: {path} holds {'a --backward run' if earlier.get('backward') else 'another bench'}"
                         f", not a forward --against fla grid (give another --json PATH to start afresh)")
    machine = earlier.get("machine", {})
    held = (earlier.get("grid"), machine.get("gpu"), machine.get("fla"), machine.get("torch"))
    if held != (grid, info["gpu"], info.get("fla"), info.get("torch")):
        raise ValueError(f"--resume: {path} holds grid {held[0]!r} timed on {held[1]!r} against FLA {held[2]} (torch "
                         f"{held[3]}); this run is grid {grid!r} on {info['gpu']!r} against FLA {info.get('fla')} "
                         f"(torch {info.get('torch')}): one table, one configuration (give another --json PATH to "
                         f"start afresh)")
    return [r for r in earlier["rows"] if not _failed(r)]  # a failed cell is timed again


def _failed(row: dict) -> bool:
    """A cell that was checked and not timed for a reason other than minilin not taking the shape."""
    return "ratio" not in row and not row.get("note", "").startswith("minilin: not supported")


def main_grid(args, mixers: list[str], repeats: int, info: dict, copy_gbs: float) -> int:
    """--grid: every mixer at every grid shape (those of --head-dims when given), initial state given, one table
    (rows: shapes). With --resume, the cells that --json's file already holds are kept and not timed again, and
    appear in the table and the file with this run's, in the grid's order."""
    head_dims = getattr(args, "head_dims", None)
    problems = grid_problems(args.grid, head_dims)
    try:
        rows = resumed_rows(args.json, args.grid, info) if getattr(args, "resume", False) else []
    except ValueError as error:
        print(f"minilin bench {error}", file=sys.stderr)
        return 2
    done = {(r["label"], r["mixer"]) for r in rows}
    print(f"minilin bench --against fla --grid {args.grid}: {info['gpu']}, {info['date']}, FLA {info['fla']}, "
          f"torch {info.get('torch')}, CuPy {info['cupy']}; {DTYPE}, initial state given; device time, per round "
          f"the median of {repeats} queued runs, reported the median over {ROUNDS} alternating rounds; cells: "
          f"minilin / FLA (bold above {GOAL})"
          + (f"; K x V {', '.join(f'{K}x{V}' for K, V in head_dims)} only" if head_dims else "")
          + (f"; {len(rows)} cells kept from {args.json}" if rows else ""), flush=True)
    total = len(problems) * len(mixers)
    position = {(label, mixer): i * len(mixers) + j + 1 for i, (label, _, _) in enumerate(problems)
                for j, mixer in enumerate(mixers)}  # this run's cells, counted for the progress lines
    order = {(label, mixer): i * len(mixers) + j for i, (label, _, _) in enumerate(grid_problems(args.grid))
             for j, mixer in enumerate(mixers)}  # the whole grid's, for the rows kept from --resume's file too
    for label, T, problem in problems:
        for mixer in mixers:
            if (label, mixer) in done:
                continue
            row = {"label": label, **compare(mixer, T, repeats, problem=problem, with_state=True), "date": info["date"]}
            state = (f"{row['minilin_ms']:.3f} vs {row['fla_ms']:.3f} ms ({row['ratio']:.2f})" if "ratio" in row
                     else row["note"])
            print(f"  [{position[label, mixer]}/{total}] {mixer} {label}: {state}", file=sys.stderr, flush=True)
            rows.append(row)
            rows.sort(key=lambda r: order.get((r["label"], r["mixer"]), len(order)))  # the grid's order, kept cells too
            if args.json:  # after every cell, so that a run cut short keeps what it measured
                write_json(args.json, {"against": "fla", "grid": args.grid, "machine": info,
                                       "copy_bandwidth_gbs": copy_gbs, "rows": rows})
    print(format_grid(rows, mixers))
    return 1 if any(_failed(r) for r in rows) else 0
