"""`minilin tour`: the chapters' claims, each reproduced with measured numbers.

    minilin tour               every experiment, in order (~40 s on a 2-core CPU, about two minutes more the first
                               time, when the MQAR models are trained and cached)
    minilin tour --quick       smaller problems (seconds)
    minilin tour NAME ...      only these experiments (`minilin tour --list` names them)
    minilin tour --plots DIR   also a PNG per experiment (needs the `plot` extra: matplotlib)

Each experiment (minilin/experiments/) returns its data; this command prints a line with its count, name and
title as it starts ("[5/15] capacity: Capacity of a d x d state"), then the one sentence it demonstrates and
its table, and, with --plots, asks it for a figure.
"""
from __future__ import annotations

import os
import sys
import time

PLOT_HINT = ('minilin tour --plots needs matplotlib, which is not installed: pip install matplotlib (or, in a '
             'checkout, pip install -e ".[plot]"), or leave out --plots for the tables alone.')


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

    known = {e.name: e for e in EXPERIMENTS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"minilin tour: unknown experiment(s) {unknown}; choose from {list(known)}", file=sys.stderr)
        return 2
    if args.plots is not None and not args.plots.strip():
        print(f"minilin tour: --plots: expected a directory, got {args.plots!r}", file=sys.stderr)
        return 2
    selected = [known[n] for n in args.names] if args.names else EXPERIMENTS
    if args.list:  # the named experiments only, when some are named
        width = max(len(e.name) for e in selected)
        for e in selected:
            print(f"{e.name:{width}s}  {e.title}")
        return 0
    plotting = _plotting_ready(args.plots)
    if plotting is None:
        return 2
    # Printed to stdout, the tour's report; when stdout goes to a file and stderr is a terminal, the
    # progress lines are repeated there, so whoever waits sees how far the tour has got.
    echo = not sys.stdout.isatty() and sys.stderr.isatty()
    start_all = time.perf_counter()
    for i, e in enumerate(selected, 1):
        heading = heading_line(i, len(selected), e)
        print(f"\n{heading}", flush=True)
        if echo:
            print(heading, file=sys.stderr, flush=True)
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


def heading_line(i: int, count: int, e) -> str:
    """The line printed as experiment i of count starts: "[5/15] capacity: Capacity of a d x d state"."""
    return f"[{i}/{count}] {e.name}: {e.title}"


def _plotting_ready(directory):
    """True: plots go to `directory`; False: none asked for; None: they cannot be made (matplotlib is missing or
    the directory cannot be created; said on stderr), checked before any experiment runs."""
    if not directory:
        return False
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(PLOT_HINT, file=sys.stderr, flush=True)
        return None
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        print(f"minilin tour: --plots {directory}: cannot create the directory ({error})", file=sys.stderr)
        return None
    return True
