"""minilin's command line. Each command lives in its own module, which adds its parser with
`register(subparsers)` and sets `func`; this file only wires them together.

    minilin [status]            the exercises: solved / failing / not started, and the next one
    minilin check|watch [N]       check an exercise (default: the current one); watch re-checks on every save
    minilin hint [N] [LEVEL]      its hints, from a nudge to the plan
    minilin reset N               put back exercise N's untouched stub
    minilin tour [NAME ...] [--quick] [--plots DIR] [--list]
    minilin bench [--device cpu|gpu] [--json PATH]
    minilin train mqar [--quick] small models trained on the CPU with minilin's own gradients
    minilin doctor              what was found for the CUDA side (nvcc, CuPy, GPU, extension)
"""
from __future__ import annotations

import argparse
import importlib
import sys

# The modules that provide commands, in the order `minilin --help` lists them.
COMMAND_MODULES = ["minilin.course", "minilin.tour", "minilin.bench", "minilin.train", "minilin.doctor"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minilin",
        description="Linear attention, state-space models and the delta rule, built from scratch.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the command line itself, for a command that re-runs itself in a child process
    if args.command is None:
        if "status" in parser._subparsers._group_actions[0].choices:  # the exercises' overview
            args = parser.parse_args(["status"])
        else:
            parser.print_help()
            return 0
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
