"""`minilin tour`: the chapters' claims, each reproduced with measured numbers.

    minilin tour               every experiment, in order (under two minutes on a 2-core CPU)
    minilin tour --quick       smaller problems (seconds)
    minilin tour NAME ...      only these experiments (`minilin tour --list` names them)
    minilin tour --plots DIR   also a PNG per experiment (needs the `plot` extra: matplotlib)

Each experiment (minilin/experiments/) returns its data; this command prints its title, the one sentence it
demonstrates and its table, and, with --plots, asks it for a figure.
"""
from __future__ import annotations

import os
import sys
import time

PLOT_HINT = ('minilin tour --plots needs matplotlib: pip install matplotlib (or, in a checkout, '
             'pip install -e ".[plot]"). Printing the tables only.')


def register(subparsers) -> None:
    p = subparsers.add_parser("tour", help="run the chapters' experiments and print what they show",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", metavar="NAME", help="experiments to run (default: all)")
    p.add_argument("--quick", action="store_true", help="smaller problems, for a fast look")
    p.add_argument("--plots", metavar="DIR", help="write one PNG per experiment into DIR")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.set_defaults(func=main)


def main(args) -> int:
    from .experiments import EXPERIMENTS

    if args.list:
        width = max(len(e.name) for e in EXPERIMENTS)
        for e in EXPERIMENTS:
            print(f"{e.name:{width}s}  {e.title}")
        return 0
    known = {e.name: e for e in EXPERIMENTS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"minilin tour: unknown experiment(s) {unknown}; choose from {list(known)}", file=sys.stderr)
        return 2
    selected = [known[n] for n in args.names] if args.names else EXPERIMENTS
    plotting = _plotting_ready(args.plots)
    if plotting is None:
        return 2
    start_all = time.perf_counter()
    for i, e in enumerate(selected, 1):
        print(f"\n== {i}. {e.title} ({e.name})", flush=True)
        start = time.perf_counter()
        data = e.run(args.quick)
        elapsed = time.perf_counter() - start
        print(e.claim)
        print(e.table(data))
        if plotting and e.plot is not None:
            path = os.path.join(args.plots, f"{e.name}.png")
            e.plot(data, path)
            print(f"plot: {path}")
        print(f"({elapsed:.1f} s)", flush=True)
    mode = "quick" if args.quick else "default"
    print(f"\nminilin tour: {len(selected)} experiment(s), {mode} sizes, {time.perf_counter() - start_all:.1f} s")
    return 0


def _plotting_ready(directory):
    """True: plots go to `directory`; False: no plots (none asked for, or matplotlib missing, which is
    said); None: the directory cannot be made (said on stderr)."""
    if not directory:
        return False
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(PLOT_HINT, flush=True)
        return False
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        print(f"minilin tour: --plots {directory}: cannot create the directory ({error})", file=sys.stderr)
        return None
    return True
