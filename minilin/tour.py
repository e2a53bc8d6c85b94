"""`minilin tour`: the chapters' claims, each reproduced with measured numbers.

    minilin tour               every experiment, in order (a couple of minutes on a 2-core CPU)
    minilin tour --quick       smaller problems (seconds)
    minilin tour NAME ...      only these experiments
    minilin tour --plots DIR   also a PNG per experiment (needs the `plot` extra: matplotlib)
"""
from __future__ import annotations

import sys
import time


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
        for e in EXPERIMENTS:
            print(f"{e.name:16s} {e.title}")
        return 0
    known = {e.name: e for e in EXPERIMENTS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"minilin tour: unknown experiment(s) {unknown}; choose from {list(known)}", file=sys.stderr)
        return 2
    selected = [known[n] for n in args.names] if args.names else EXPERIMENTS
    plotting = _plotting_ready(args.plots)
    for i, e in enumerate(selected, 1):
        start = time.perf_counter()
        data = e.run(args.quick)
        print(f"\n== {i}. {e.title} ({e.name}, {time.perf_counter() - start:.1f} s)")
        print(e.claim)
        print(e.table(data))
        if plotting and e.plot is not None:
            import os

            path = os.path.join(args.plots, f"{e.name}.png")
            e.plot(data, path)
            print(f"plot: {path}")
    return 0


def _plotting_ready(directory) -> bool:
    if not directory:
        return False
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('minilin tour --plots needs matplotlib: pip install -e ".[plot]"  (tables are printed anyway)')
        return False
    import os

    os.makedirs(directory, exist_ok=True)
    return True
