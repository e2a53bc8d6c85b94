"""`minilin bench`: time every form of every mixer, after checking it against the reference.

    minilin bench --device cpu      NumPy on this CPU (bench/cpu.py)
    minilin bench --device cpu --floor
                                    the chunked forms' matrix products alone, a bound (bench/cpu_floor.py)
    minilin bench [--device gpu]    the CUDA kernels and CuPy (bench/gpu.py, with the CUDA extension)
    minilin bench --against fla     the fastest CUDA kernels beside flash-linear-attention's (bench/against_fla.py)
    minilin bench --decode          one decode step per sequence against the state's I/O floor (bench/decode.py)
"""
from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time each mixer's forms (checked first)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "gpu"], default="gpu",
                   help="cpu: the NumPy reference; gpu: the CUDA extension and CuPy (default)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' for stdout)")
    p.add_argument("--repeats", type=int, default=None, help="GPU: timed runs per measurement (median reported); CPU: alternating timing rounds")
    p.add_argument("--mixers", nargs="+", metavar="NAME", help="only these mixers")
    p.add_argument("--lengths", nargs="+", type=int, metavar="T",
                   help="GPU only: sequence lengths (default 2048 8192 32768)")
    p.add_argument("--against", choices=["fla"], default=None,
                   help="GPU only: time minilin's fastest kernels beside flash-linear-attention's (needs fla-core)")
    p.add_argument("--floor", action="store_true",
                   help="CPU only: time the matrix products of chunked linear attention and Gated DeltaNet "
                        "alone against their token loops (a bound on the chunked speed-up)")
    p.add_argument("--decode", action="store_true",
                   help="GPU only: one decode step (one token for each of N = 1, 64, 256 sequences) of Gated DeltaNet, "
                        "KDA and simple GLA against the floor of reading and writing the state once")
    p.add_argument("--chunk-sizes", nargs="+", type=int, metavar="C",
                   help="with --floor: the chunk sizes to time (default 16 32 64)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    if args.against and args.device == "cpu":
        print("--against fla compares CUDA kernels: it runs on the GPU (drop --device cpu)")
        return 2
    if args.chunk_sizes and not args.floor:
        print("--chunk-sizes goes with --floor (the chunked forms run at their default chunk size otherwise)")
        return 2
    if args.lengths and args.device == "cpu":
        print(f"--lengths picks the GPU bench's sequence lengths; the CPU bench runs its one problem size "
              f"(bench/cpu.py's PROBLEM), got --lengths {' '.join(map(str, args.lengths))} with --device cpu")
        return 2
    if args.floor and args.device != "cpu":
        print("--floor times NumPy's matrix products: it runs on the CPU (add --device cpu)")
        return 2
    if getattr(args, "decode", False):
        if args.device == "cpu" or args.against or args.floor or args.lengths:
            print("--decode times the GPU's decode step on its own sizes: drop --device cpu, --against, --floor and "
                  "--lengths")
            return 2
        from . import decode

        return decode.main(args)
    if args.floor:
        from . import cpu_floor

        return cpu_floor.main(args)
    if args.device == "cpu":
        from . import cpu

        return cpu.main(args)
    try:
        from . import gpu
    except ImportError as error:  # the GPU benchmark lands with the CUDA extension
        print(f"minilin bench --device gpu is not available: {error}. Try --device cpu.")
        return 2
    if args.against == "fla":
        from . import against_fla

        return against_fla.main(args)
    return gpu.main(args)


def write_json(destination: str, results: dict) -> None:
    """`--json`: the results as indented JSON to the file `destination`, or to standard output for '-'."""
    payload = json.dumps(results, indent=2)
    if destination == "-":
        print(payload)
    else:
        with open(destination, "w") as f:
            f.write(payload + "\n")
