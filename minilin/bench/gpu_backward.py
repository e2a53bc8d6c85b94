"""`minilin bench --backward` on a GPU: the forward and forward + backward of the CUDA kernels, and FLA's.

Mixers: linear_attention, simple_gla, gla, deltanet, gated_deltanet, kda (the ones with a backward kernel,
`minilin.cuda.<mixer>_backward`); default all but linear_attention (simple GLA's kernels with no gate).
Problem as the forward bench (bench/gpu.py): B=4, H=16, K=V=128, bf16 q, k, v (float32 gates, betas and state), T in
2048 and 8192 by default; with --grid the "every shape" grid instead (bench/against_fla.py's GRID: FLA's benchmark
shapes and one long sequence, --grid all adds other head dims, --head-dims keeps those of the K x V named), an
initial state given.

Each mixer is checked before it is timed, at a small problem with each K, V it is timed at (B=2, T=100, H=2, so
that the version chosen is the one timed; initial state given): every gradient of L = <do, o> + <dstate, S_T> from
the bf16 kernels against minilin's NumPy chunked_backward in float64 on the same (bf16-rounded) inputs, relative RMS
error at most 0.008 (dq, dk, dv, dinitial_state) and 0.02 (dg, dbeta), FLA's own test tolerances. A mixer that
fails at a K, V is reported and not timed there; a shape the forward kernels do not take is reported as such.

Timed (CUDA events, bench/gpu_timing.py, 3 alternating rounds, the median): the forward at its default version,
and the forward followed by the backward at its default version (the training step's two calls; the backward
recomputes the states, so the forward saves nothing). With --against fla, also FLA's chunk kernel forward and
its forward + backward through torch autograd on the same values; where FLA refuses to run (its gated chunk
backward refuses Triton 3.4-3.7.0 on Hopper), the row says why.

--json is written after every row, each row dated. With --grid, `--resume` keeps the rows an earlier run's --json
file holds (the same grid, with or without FLA as this run, on the same GPU model) and times only the rest: FLA
tunes its backward kernels at every new shape, so a grid with FLA beside it may take several runs on the same --json file.
"""
from __future__ import annotations

import sys

import numpy as np

from .. import catalog
from . import read_earlier_json, write_json
from .gpu_timing import alternating_medians

MIXERS = ("linear_attention", "simple_gla", "gla", "deltanet", "gated_deltanet", "kda")
DEFAULT_MIXERS = ("simple_gla", "gla", "deltanet", "gated_deltanet", "kda")
LENGTHS = (2048, 8192)
CHECK_PROBLEM = dict(B=2, T=100, H=2)  # with the K, V of the shapes timed
TOLERANCE = {"dq": 0.008, "dk": 0.008, "dv": 0.008, "dinitial_state": 0.008, "dg": 0.02, "dbeta": 0.02}
ROUNDS = 3
TARGET = 3.0  # forward + backward over forward


def _inputs(mixer: str, B: int, T: int, H: int, K: int, V: int, seed: int, state: bool) -> dict:
    """Float32 CuPy arrays on the bf16 grid where the kernels read bf16, in the mixer's valid range, plus do
    [B, T, H, V] and dstate [B, H, K, V] (never zeros)."""
    import cupy

    from ..cuda import from_bf16, to_bf16
    from ..cuda.bf16 import UNIT_KEY_SCALE

    rng = cupy.random.default_rng(seed)
    on_grid = lambda x: from_bf16(to_bf16(x))  # noqa: E731
    k = rng.standard_normal((B, T, H, K), dtype=cupy.float32)
    if mixer in ("deltanet", "gated_deltanet", "kda"):
        k *= UNIT_KEY_SCALE / cupy.linalg.norm(k, axis=-1, keepdims=True)
    out = {"q": on_grid(rng.standard_normal((B, T, H, K), dtype=cupy.float32)), "k": on_grid(k),
           "v": on_grid(rng.standard_normal((B, T, H, V), dtype=cupy.float32)),
           "g": rng.uniform(-1.0, -0.01, (B, T, H, K) if mixer in ("gla", "kda") else (B, T, H),
                            dtype=cupy.float32),
           "beta": rng.uniform(0.0, 1.0, (B, T, H), dtype=cupy.float32),
           "do": on_grid(rng.standard_normal((B, T, H, V), dtype=cupy.float32)),
           "dstate": rng.standard_normal((B, H, K, V), dtype=cupy.float32)}
    if state:
        out["initial_state"] = 0.1 * rng.standard_normal((B, H, K, V), dtype=cupy.float32)
    return out


def _names(mixer: str):
    return catalog.signature(mixer).names


def _cuda_args(mixer: str, x: dict):
    from .. import cuda

    return [cuda.to_bf16(x[n]) if n in ("q", "k", "v") else x[n] for n in _names(mixer)]


def check(mixer: str, K: int = 128, V: int = 128) -> dict:
    """Relative RMS error of each gradient of the bf16 kernels against the float64 NumPy backward, at
    CHECK_PROBLEM with this K, V."""
    import cupy

    from .. import cuda

    x = _inputs(mixer, **CHECK_PROBLEM, K=K, V=V, seed=0, state=True)
    args = _cuda_args(mixer, x)
    got = getattr(cuda, f"{mixer}_backward")(*args, do=cuda.to_bf16(x["do"]), dstate=x["dstate"],
                                             initial_state=x["initial_state"])
    as64 = lambda a: cupy.asnumpy(cuda.bf16.as_float32(a)).astype(np.float64)  # noqa: E731 - bf16 gradients widened
    ref = catalog.module(mixer).chunked_backward(*(as64(x[n]) for n in _names(mixer)), do=as64(x["do"]),
                                                 dstate=as64(x["dstate"]), initial_state=as64(x["initial_state"]))
    errors = {}
    for field in got._fields:
        a, b = getattr(got, field), getattr(ref, field)
        if b is not None:
            errors[field] = float(np.linalg.norm(as64(a) - b) / np.linalg.norm(b))
    return errors


def _fla(mixer: str, x: dict):
    """(forward closure, forward + backward closure) of FLA's chunk kernel on the same values, or a string: why not."""
    try:
        import torch
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.gla import chunk_gla
        from fla.ops.kda import chunk_kda
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as error:  # noqa: BLE001 - FLA is optional
        return f"FLA not importable ({type(error).__name__})"
    from ..cuda import to_bf16

    names = _names(mixer) + (("initial_state",) if "initial_state" in x else ())  # FLA's gets the same state
    t = {n: (torch.as_tensor(to_bf16(x[n], bits=True), device="cuda").view(torch.bfloat16) if n in "qkv"
             else torch.as_tensor(x[n], device="cuda")) for n in names}
    do = torch.as_tensor(to_bf16(x["do"], bits=True), device="cuda").view(torch.bfloat16)
    dstate = torch.as_tensor(x["dstate"], device="cuda")
    leaves = {n: a.detach().clone().requires_grad_(True) for n, a in t.items()}
    common = dict(scale=x["q"].shape[-1] ** -0.5, output_final_state=True)
    state = lambda a: {"initial_state": a["initial_state"]} if "initial_state" in a else {}  # noqa: E731
    call = {"simple_gla": lambda a: chunk_simple_gla(a["q"], a["k"], a["v"], g=a["g"], **state(a), **common),
            "gla": lambda a: chunk_gla(a["q"], a["k"], a["v"], g=a["g"], **state(a), **common),
            "linear_attention": lambda a: chunk_simple_gla(a["q"], a["k"], a["v"], **state(a), **common),
            "deltanet": lambda a: chunk_delta_rule(a["q"], a["k"], a["v"], beta=a["beta"], **state(a), **common),
            "gated_deltanet": lambda a: chunk_gated_delta_rule(a["q"], a["k"], a["v"], g=a["g"], beta=a["beta"],
                                                               **state(a), **common),
            "kda": lambda a: chunk_kda(a["q"], a["k"], a["v"], g=a["g"], beta=a["beta"], **state(a), **common)}[mixer]

    def forward():
        with torch.no_grad():
            return call(t)

    def forward_backward():
        o, S = call(leaves)
        torch.autograd.backward([o, S], [do, dstate])

    try:
        forward_backward()
    except Exception as error:  # noqa: BLE001 - FLA's refusal, reported in the table
        return f"FLA refused: {str(error).splitlines()[0][:120]}"
    return forward, forward_backward


def bench(mixer: str, shape: tuple, repeats: int, against: bool, with_state: bool = False) -> dict:
    """One mixer at shape (B, T, H, K, V): forward, forward + backward (and FLA's); a shape the kernels do not take
    comes back with a "note" and no times."""
    from .. import cuda

    B, T, H, K, V = shape
    x = _inputs(mixer, B, T, H, K, V, seed=1, state=with_state)
    args = _cuda_args(mixer, x)
    forward = getattr(cuda, mixer)
    backward = getattr(cuda, f"{mixer}_backward")
    do = cuda.to_bf16(x["do"])
    state = {"initial_state": x["initial_state"]} if with_state else {}
    family = cuda.OPS[mixer]  # the forward op; its backward is f"{family}_bwd"
    row = {"mixer": mixer, "B": B, "T": T, "H": H, "K": K, "V": V, "initial_state": with_state}
    try:
        forward(*args, **state, check_values=False)
        backward(*args, do=do, dstate=x["dstate"], **state, check_values=False)
    except ValueError as error:  # a size the kernels do not take: say so, time nothing
        return dict(row, note=f"not supported ({error})"[:300])

    def forward_backward():
        forward(*args, **state, check_values=False)
        backward(*args, do=do, dstate=x["dstate"], **state, check_values=False)

    runs = [(lambda: forward(*args, **state, check_values=False), "cupy"), (forward_backward, "cupy")]
    fla = _fla(mixer, x) if against else None
    if isinstance(fla, tuple):
        runs += [(fla[0], "torch"), (fla[1], "torch")]
    timed = alternating_medians(runs, repeats=repeats, rounds=ROUNDS, budget_ms=3000.0)
    row.update(forward_ms=timed[0][0], forward_backward_ms=timed[1][0],
               forward_version=cuda.default_version(family, True, K, V),
               backward_version=cuda.default_version(f"{family}_bwd", True, K, V))
    row["ratio"] = row["forward_backward_ms"] / row["forward_ms"]
    if isinstance(fla, tuple):
        row["fla_forward_ms"], row["fla_forward_backward_ms"] = timed[2][0], timed[3][0]
        row["against_fla"] = row["forward_backward_ms"] / row["fla_forward_backward_ms"]
    elif fla is not None:
        row["fla_note"] = fla
    return row


def format_table(rows: list[dict], checks: dict) -> str:
    """rows: bench's; checks: {label: {gradient: error}}, label "mixer" or "mixer K=.., V=..", as main makes them."""
    lines = ["| mixer | B, T, H, K, V | forward ms (version) | forward + backward ms (backward version) | "
             "ratio (target <= 3x) | FLA forward ms | FLA forward + backward ms | minilin / FLA (forward + backward) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        shape = ", ".join(str(r[d]) for d in ("B", "T", "H", "K", "V"))
        if "forward_ms" not in r:
            lines.append(f"| {r['mixer']} | {shape} | - | {r.get('note', '-')} | - | - | - | - |")
            continue
        fla = (f"{r['fla_forward_ms']:.3f} | {r['fla_forward_backward_ms']:.3f} | {r['against_fla']:.2f}"
               if "against_fla" in r else f"- | {r.get('fla_note', '-')} | -")
        lines.append(f"| {r['mixer']} | {shape} | {r['forward_ms']:.3f} (v{r['forward_version']}) | "
                     f"{r['forward_backward_ms']:.3f} (v{r['backward_version']}) | "
                     f"{r['ratio']:.1f}x | {fla} |")
    lines.append("")
    lines.append(f"Checked first (relative RMS error against the float64 NumPy backward, "
                 f"{', '.join(f'{k}={v}' for k, v in CHECK_PROBLEM.items())}, at the K, V timed):")
    for label, errors in checks.items():
        lines.append(f"- {label}: " + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))
    return "\n".join(lines)


def main(args) -> int:
    from ..cuda import available
    from .against_fla import grid_shapes
    from .gpu import PROBLEM, machine

    ok, reason = available()
    if not ok:
        print(f"minilin bench --backward: {reason}; `minilin bench --device cpu --backward` times the NumPy "
              f"backward.", file=sys.stderr)
        return 2
    mixers = args.mixers or list(DEFAULT_MIXERS)
    unknown = [m for m in mixers if m not in MIXERS]
    if unknown:
        print(f"--mixers: the GPU backward exists for {list(MIXERS)}, got {unknown}", file=sys.stderr)
        return 2
    grid = getattr(args, "grid", None)
    if grid:
        head_dims = getattr(args, "head_dims", None)
        shapes, problem = grid_shapes(grid, head_dims), f"the grid ({grid}), initial state given"
        if head_dims:
            problem += f", K x V {', '.join(f'{K}x{V}' for K, V in head_dims)} only"
        grid_order = grid_shapes(grid)  # the whole grid's, for the rows kept from --resume's file too
    else:
        lengths = args.lengths or ([2048] if args.quick else LENGTHS)
        shapes = [(PROBLEM["B"], T, PROBLEM["H"], PROBLEM["K"], PROBLEM["V"]) for T in lengths]
        problem = ", ".join(f"{k}={v}" for k, v in PROBLEM.items())
        grid_order = shapes
    repeats = args.repeats or (5 if args.quick else 20)
    info = machine()
    against = args.against == "fla"
    if against:
        from .against_fla import fla_version

        info["fla"] = fla_version()  # which FLA the rows were timed against, in the file's record
    checks, rows, failed = {}, [], []
    if getattr(args, "resume", False):
        try:
            rows, checks = resumed(args.json, grid, against, info)
        except ValueError as error:
            print(f"minilin bench --backward {error}", file=sys.stderr)
            return 2
    done = {(r["mixer"], shape_of(r)) for r in rows}
    print(f"minilin bench --backward: {info['gpu']}, {info['date']}; bf16, {problem}; device time, median of "
          f"{ROUNDS} alternating rounds" + (f"; {len(rows)} rows kept from {args.json}" if rows else ""), flush=True)
    order = {(m, tuple(s)): i * len(grid_order) + j for i, m in enumerate(mixers) for j, s in enumerate(grid_order)}

    def report(finished: bool) -> dict:  # --json's contents, written after every row and once more at the end
        timed = {(r["mixer"], shape_of(r)) for r in rows}
        complete = all((m, tuple(s)) in timed for m in mixers for s in grid_order)  # every cell of the whole grid
        return {"backward": True, "grid": grid, "against": args.against, "machine": info, "shapes": grid_order,
                "tolerance": TOLERANCE, "checks": checks, "rows": rows, "finished": finished, "complete": complete}

    head_dims = list(dict.fromkeys((K, V) for *_, K, V in shapes))
    labelled = len(set((K, V) for *_, K, V in grid_order)) > 1  # the whole grid's widths: one slice's checks kept apart
    for mixer in mixers:
        wrong = set()  # the (K, V) whose gradients missed the tolerance: not timed
        left = [s for s in shapes if (mixer, tuple(s)) not in done]
        for K, V in head_dims:
            if not any(tuple(s[3:]) == (K, V) for s in left):
                continue  # every shape at this K, V was kept from --resume's file, its check with it
            label = f"{mixer} K={K}, V={V}" if labelled else mixer
            try:
                errors = check(mixer, K, V)
            except ValueError as error:  # no kernel takes this K, V: bench reports its shapes as not supported
                print(f"  {label}: not checked ({error})", file=sys.stderr, flush=True)
                continue
            checks[label] = errors
            bad = {n: e for n, e in errors.items() if not e <= TOLERANCE[n]}
            if bad:
                wrong.add((K, V))
                failed.append(label)
                print(f"  {label}: gradients outside tolerance {bad}; not timed", file=sys.stderr, flush=True)
        for shape in left:
            if tuple(shape[3:]) in wrong:
                continue
            row = dict(bench(mixer, shape, repeats, against, with_state=bool(grid)), date=info["date"])
            print(f"  {mixer} B={shape[0]} T={shape[1]} H={shape[2]} K={shape[3]} V={shape[4]}: {progress(row)}",
                  file=sys.stderr, flush=True)
            rows.append(row)
            rows.sort(key=lambda r: order.get((r["mixer"], shape_of(r)), len(order)))  # kept rows in place too
            if args.json:  # after every row, so that a run cut short keeps what it measured ("finished": false)
                write_json(args.json, report(finished=False))
    print(format_table(rows, checks))
    if args.json:
        write_json(args.json, report(finished=True))
    return 1 if failed else 0


def shape_of(row: dict) -> tuple:
    """A row's (B, T, H, K, V)."""
    return tuple(row[d] for d in "BTHKV")


def resumed(path: str, grid: str | None, against: bool, info: dict) -> tuple[list[dict], dict]:
    """--resume: the rows and gradient checks of an earlier --backward run's JSON at `path` (none if there is no
    such file yet), each row with its run's date. The file must hold the same grid, with FLA beside it exactly when
    this run has it, timed on the same GPU model, or ValueError says what it holds instead."""
    earlier = read_earlier_json(path)
    if not earlier:
        return [], {}
    held = (earlier.get("backward"), earlier.get("grid"), earlier.get("against") == "fla",
            earlier.get("machine", {}).get("gpu"))
    if held != (True, grid, against, info["gpu"]):
        fla = lambda x: "with FLA" if x else "without FLA"  # noqa: E731
        raise ValueError(f"--resume: {path} holds {'a --backward run' if held[0] else 'no --backward run'} of grid "
                         f"{held[1]!r} {fla(held[2])} on {held[3]!r}; this run is grid {grid!r} {fla(against)} on "
                         f"{info['gpu']!r} (give another --json PATH to start afresh)")
    return earlier["rows"], dict(earlier.get("checks", {}))


def progress(row: dict) -> str:
    """One row of bench in words, for the line printed as each shape finishes: minilin's times and FLA's (or why
    FLA did not run), or the row's note."""
    if "forward_ms" not in row:
        return row["note"]
    text = f"forward {row['forward_ms']:.3f} ms, forward + backward {row['forward_backward_ms']:.3f} ms"
    if "fla_forward_ms" in row:
        text += (f"; FLA {row['fla_forward_ms']:.3f} / {row['fla_forward_backward_ms']:.3f} ms "
                 f"(minilin / FLA {row['against_fla']:.2f})")
    elif "fla_note" in row:
        text += f"; {row['fla_note']}"
    return text
