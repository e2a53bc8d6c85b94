"""`minilin bench`: time every form of every mixer, after checking it against the reference.

    minilin bench                   the GPU bench where it can run, else the CPU bench (and it says which)
    minilin bench --quick           a small problem, for a first look (seconds on a CPU)
    minilin bench --device cpu      NumPy on this CPU (bench/cpu.py)
    minilin bench --device cpu --floor
                                    the chunked forms' matrix products alone, a bound (bench/cpu_floor.py)
    minilin bench --device cpu --backward
                                    forward and forward + backward per mixer and form (bench/cpu_backward.py)
    minilin bench --device gpu      the CUDA kernels and CuPy (bench/gpu.py, with the CUDA extension)
    minilin bench --against fla     the fastest CUDA kernels beside flash-linear-attention's (bench/against_fla.py)
    minilin bench --against fla --shape B=1 H=16 K=64 V=64
                                    the same at one problem of your own (HV=32: grouped value heads)
    minilin bench --against fla --grid [all | layouts] [--head-dims 64x64 ...]
                                    the same at FLA's benchmark shapes and at long context (layouts: packed
                                    sequences and grouped value heads; --head-dims: only the shapes of those K, V)
    minilin bench --decode          one decode step per sequence against the state's I/O floor (bench/decode.py)
    minilin bench --backward [--against fla] [--grid]
                                    the CUDA forward and forward + backward, FLA's beside them (bench/gpu_backward.py),
                                    at --lengths or at the grid's shapes

Tables go to stdout; progress (what is being timed, with a count) and the choice of device go to stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from ..threads import is_one_thread, rerun

QUICK_GPU = dict(lengths=[2048], repeats=5)  # --quick on the GPU: one length, 5 runs per measurement


def _as_positive(text: str) -> int | None:
    """text as an integer >= 1 written plainly ('8', not '08' or '8.0'), or None."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 and str(value) == text.strip() else None


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the flag in its error)."""
    value = _as_positive(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time each mixer's forms (checked first)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "gpu"], default=None,
                   help="cpu: the NumPy reference; gpu: the CUDA extension and CuPy (default: gpu where the GPU "
                        "bench can run, else cpu)")
    p.add_argument("--quick", action="store_true",
                   help="a small problem for a first look: on the CPU seconds (bench/cpu.py's QUICK_PROBLEM, one "
                        "round), on the GPU one length (2048) and 5 runs per measurement")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' for stdout)")
    p.add_argument("--repeats", type=_positive_int, default=None, help="GPU: timed runs per measurement (median reported); CPU: alternating timing rounds")
    p.add_argument("--mixers", nargs="+", metavar="NAME", help="only these mixers")
    p.add_argument("--lengths", nargs="+", type=_positive_int, metavar="T",
                   help="GPU only: sequence lengths (default 2048 8192 32768; with --backward 2048 8192)")
    p.add_argument("--against", choices=["fla"], default=None,
                   help="GPU only: time minilin's fastest kernels beside flash-linear-attention's (needs fla-core)")
    p.add_argument("--shape", nargs="+", metavar="D=N",
                   help="with --against fla: the problem's sizes instead of B=4 H=16 K=128 V=128 (those not given "
                        "keep these), at --lengths; HV=N gives N value heads, each q/k head shared by HV / H of them")
    p.add_argument("--grid", nargs="?", const="fla", choices=["fla", "all", "layouts"], default=None,
                   help="with --against fla or --backward: FLA's benchmark shapes and one long sequence instead of "
                        "--lengths (bench/against_fla.py's GRID); 'all' adds K, V = 64 / 64, 128 / 64 and 128 / 256; "
                        "'layouts' (--against fla only): packed sequences and grouped value heads")
    p.add_argument("--head-dims", nargs="+", metavar="KxV",
                   help="with --grid or --grid all: only the grid's shapes with these key and value widths (e.g. 64x64 "
                        "128x256); with --resume the file's other cells are kept, so a grid can be timed a slice at a "
                        "time")
    p.add_argument("--resume", action="store_true",
                   help="with --grid (--against fla, or --backward) and --json PATH: keep the cells PATH already holds "
                        "(the same grid, timed on the same GPU model) and time only the rest, so that a run cut short "
                        "can be finished")
    p.add_argument("--floor", action="store_true",
                   help="CPU only: time the matrix products of chunked linear attention and Gated DeltaNet "
                        "alone against their token loops (a bound on the chunked speed-up)")
    p.add_argument("--backward", action="store_true",
                   help="time forward and forward + backward (gradients checked first: on the CPU by finite "
                        "differences, on the GPU against the float64 NumPy backward)")
    p.add_argument("--decode", action="store_true",
                   help="GPU only: one decode step (one token for each of N = 1, 64, 256 sequences) of Gated DeltaNet, "
                        "KDA and simple GLA against the floor of reading and writing the state once")
    p.add_argument("--chunk-sizes", nargs="+", type=_positive_int, metavar="C",
                   help="with --floor: the chunk sizes to time (default 16 32 64)")
    p.set_defaults(func=_run)


SHAPE_SIZES = ("B", "H", "K", "V", "HV")  # --shape's names: batch, q/k heads, key and value widths, value heads


def parse_shape(items: list[str], default: dict | None = None) -> dict:
    """--shape's D=N items over `default` (bench/gpu.py's PROBLEM): a problem dict for bench/gpu.make_inputs.
    Raises ValueError naming the item, what was expected and what was given."""
    if default is None:
        from .gpu import PROBLEM as default
    problem = dict(default)
    for item in items:
        name, equals, value = item.partition("=")
        if not equals or name not in SHAPE_SIZES:
            raise ValueError(f"--shape: expected items NAME=N with NAME one of {', '.join(SHAPE_SIZES)}, got {item!r}")
        size = _as_positive(value)
        if size is None:
            raise ValueError(f"--shape: {name} must be a positive integer, got {value!r}")
        problem[name] = size
    if "HV" in problem and problem["HV"] % problem["H"] != 0:
        raise ValueError(f"--shape: HV (value heads) must be a multiple of H (q/k heads), got HV={problem['HV']} "
                         f"with H={problem['H']}")
    if problem.get("HV") == problem["H"]:
        del problem["HV"]
    return problem


def parse_head_dims(items: list[str]) -> list[tuple[int, int]]:
    """--head-dims' KxV items: the (K, V) pairs, in order, without repeats. Raises ValueError naming the item,
    what was expected and what was given."""
    dims = []
    for item in items:
        K, x, V = item.lower().partition("x")
        if not x or not (K.isdigit() and V.isdigit()) or int(K) <= 0 or int(V) <= 0:
            raise ValueError(f"--head-dims: expected items KxV with K and V positive integers (e.g. 128x256), "
                             f"got {item!r}")
        dims.append((int(K), int(V)))
    return list(dict.fromkeys(dims))


def _refuse(message: str) -> int:
    print(f"minilin bench: {message}", file=sys.stderr)
    return 2


def default_device(args) -> tuple[str, str]:
    """The device when --device is not given, and the line that says why: options that only one bench takes
    pick it; otherwise the GPU bench where it can run (CuPy, a GPU, the extension), else the CPU bench."""
    if args.against or args.lengths or getattr(args, "grid", None) or getattr(args, "decode", False):
        return "gpu", ""
    if args.floor or args.chunk_sizes:
        return "cpu", ""
    from ..cuda import available

    ok, reason = available()
    if ok:
        return "gpu", "minilin bench: timing the CUDA kernels on the GPU (--device cpu times the NumPy reference)"
    return "cpu", (f"minilin bench: no GPU bench here ({reason.rstrip('.')}); timing the NumPy reference on this "
                   f"CPU instead, as --device cpu does")


# Where `write_json` sends `--json -`: the real standard output, while a run with `--json -` sends its tables and
# notes to standard error (`_run`), so that what stdout carries is the JSON alone.
_json_stdout = None


def _run(args) -> int:
    if args.json == "-":
        global _json_stdout
        _json_stdout = sys.stdout
        try:
            with contextlib.redirect_stdout(sys.stderr):
                return _checked_run(args)
        finally:
            _json_stdout = None
    return _checked_run(args)


def _checked_run(args) -> int:
    folder = os.path.dirname(os.path.abspath(args.json)) if args.json and args.json != "-" else None
    if folder is not None and not os.path.isdir(folder):
        return _refuse(f"--json: expected a file in an existing folder, got {args.json!r} (no folder {folder!r})")
    if args.device is None:
        args.device, said = default_device(args)
        if said:
            print(said, file=sys.stderr, flush=True)
    if args.against and args.device == "cpu":
        return _refuse("--against fla compares CUDA kernels: it runs on the GPU (drop --device cpu)")
    if args.grid and args.against != "fla" and not args.backward:
        return _refuse("--grid is a grid of shapes for --against fla or --backward: add one of them")
    if args.grid == "layouts" and args.backward:
        return _refuse("--grid layouts times the forward only: drop --backward, or use --grid / --grid all")
    if args.grid and args.device == "cpu":
        return _refuse("--grid times the CUDA kernels at FLA's shapes: it runs on the GPU (drop --device cpu)")
    if getattr(args, "resume", False) and not ((args.against == "fla" or args.backward) and args.grid and args.json
                                               and args.json != "-"):
        return _refuse("--resume finishes a grid that --json PATH holds: it needs --grid with --against fla or "
                       "--backward, and --json PATH (a file)")
    if args.grid and args.lengths:
        return _refuse("--grid has its own shapes: drop --lengths")
    if getattr(args, "head_dims", None):
        if args.grid not in ("fla", "all"):
            return _refuse(f"--head-dims picks shapes of --grid or --grid all, got "
                           f"{'--grid ' + args.grid if args.grid else 'no --grid'}")
        from .against_fla import grid_shapes

        try:
            args.head_dims = parse_head_dims(args.head_dims)
            grid_shapes(args.grid, args.head_dims)
        except ValueError as error:
            return _refuse(str(error))
    if getattr(args, "shape", None):
        if args.against != "fla" or args.grid or args.backward:
            return _refuse("--shape sets the problem of --against fla (without --grid, which has its own shapes, "
                           "or --backward)")
        try:
            parse_shape(args.shape)
        except ValueError as error:
            return _refuse(str(error))
    if args.chunk_sizes and not args.floor:
        return _refuse("--chunk-sizes goes with --floor (the chunked forms run at their default chunk size otherwise)")
    if args.lengths and args.device == "cpu":
        return _refuse(f"--lengths picks the GPU bench's sequence lengths; the CPU bench runs its one problem size "
                       f"(bench/cpu.py's PROBLEM, or QUICK_PROBLEM with --quick), got --lengths "
                       f"{' '.join(map(str, args.lengths))} with --device cpu")
    if args.floor and args.device != "cpu":
        return _refuse("--floor times NumPy's matrix products: it runs on the CPU (add --device cpu)")
    if args.floor and args.quick:
        return _refuse("--floor has one problem size (bench/cpu_floor.py's PROBLEM): drop --quick")
    if args.floor and args.backward:
        return _refuse("--floor times the chunked forwards' products: drop --backward (--device cpu --backward times "
                       "forward and forward + backward)")
    if getattr(args, "decode", False):
        if args.device == "cpu" or args.against or args.floor or args.lengths or args.backward or args.quick:
            return _refuse("--decode times the GPU's decode step on its own sizes: drop --device cpu, --against, "
                           "--floor, --lengths, --backward and --quick (--repeats sets its runs)")
        from . import decode

        return decode.main(args)
    if args.device == "cpu" and getattr(args, "argv", None) is not None and not is_one_thread():
        # The CPU benches time in one BLAS thread with fixed malloc thresholds, as `minilin train` computes
        # (minilin.threads says why): a child Python with that environment runs the same command.
        argv = args.argv if "--device" in args.argv else [*args.argv, "--device", "cpu"]
        return rerun(argv)
    if args.floor:
        from . import cpu_floor

        return cpu_floor.main(args)
    if args.backward and args.device == "cpu":
        from . import cpu_backward

        return cpu_backward.main(args)
    if args.backward:
        from . import gpu_backward

        return gpu_backward.main(args)
    if args.device == "cpu":
        from . import cpu

        return cpu.main(args)
    if args.quick:
        args.lengths = args.lengths or QUICK_GPU["lengths"]
        args.repeats = args.repeats or QUICK_GPU["repeats"]
    try:
        from . import gpu
    except ImportError as error:  # the GPU benchmark lands with the CUDA extension
        return _refuse(f"--device gpu is not available: {error}. Try --device cpu.")
    if args.against == "fla":
        from . import against_fla

        return against_fla.main(args)
    return gpu.main(args)


def write_json(destination: str, results: dict) -> None:
    """`--json`: the results as indented JSON to the file `destination`, or to standard output for '-'. The file is
    written whole or not at all (a temporary file beside it, then renamed over it): a grid rewrites it after every
    cell, and a run stopped mid-write must not lose the cells it held."""
    payload = json.dumps(results, indent=2)
    if destination == "-":
        print(payload, file=_json_stdout or sys.stdout, flush=True)
        return
    partial = f"{destination}.partial"
    with open(partial, "w") as f:
        f.write(payload + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, destination)


def read_earlier_json(path: str) -> dict:
    """`--resume`: what an earlier run's `--json` file at `path` holds ({} where there is no such file yet), each
    of its rows dated with that run's date unless the row carries its own (the file's machine record, date
    included, is rewritten by the run that resumes it)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        try:
            earlier = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"--resume: {path} is not a JSON file of an earlier run ({error}); give another --json "
                             f"PATH to start afresh") from None
    date = earlier.get("machine", {}).get("date")
    return dict(earlier, rows=[{"date": date, **r} for r in earlier.get("rows", [])])
