"""The graded exercises: a clone of minilin holds them in exercises/ (the learner's files and their checks)
and solutions/ (worked solutions); this package finds them, checks them, and gives the `minilin` commands

    minilin [status]          every exercise: solved / failing / not started, points, the next one
    minilin check [N]         check exercise N (default: the next unsolved), show the first failure and a hint
    minilin hint N [LEVEL]    the hints for N, from a nudge (1) to the plan (3)
    minilin reset N [--yes]   put back the pristine stub of N (asks before throwing work away)
    minilin watch [N]         re-check whenever the file is saved (polling; Ctrl-C stops)

Pieces: tree (find and read the exercise list), checks (the comparison every check uses), runner (run one
exercise's check without pytest), stubs (make the stubs from the solutions), commands (the CLI).
`pytest exercises` runs the same checks through exercises/conftest.py.
"""
from __future__ import annotations


def register(subparsers) -> None:
    from .commands import register as register_commands

    register_commands(subparsers)
