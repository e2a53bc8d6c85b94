"""The graded exercises: a clone of minilin holds them in exercises/ (the learner's files and their checks)
and solutions/ (worked solutions); this package finds them, checks them, and gives the `minilin` commands

    minilin [status]          every exercise: solved / failing / not started, points, the next one
    minilin check [N]         check exercise N (default: the current one), show the first failure and a hint
                              for the function that failed; a solve is confirmed and the next one made current
    minilin hint [N] [LEVEL]  the hints for N (default: the current one, its failing function), a nudge to the plan
    minilin reset N [--yes]   put back the pristine stub of N (asks before throwing work away)
    minilin watch [N]         re-check on every save; keys h (hint), n (next), r (re-check), q (quit)

Pieces: tree (find and read the exercise list), checks (the comparison every check uses, and what it
says), guard (what happens around every call into the learner's file), runner (run one exercise's checks in
a child process with a time limit), progress (the current exercise), keys (single key presses), stubs (make
the stubs from the solutions), mutants (mutation testing of the checks), emulated_cupy (the GPU exercises on
a CPU), commands (the CLI). `pytest exercises` runs the same checks through exercises/conftest.py.
"""
from __future__ import annotations


def register(subparsers) -> None:
    from .commands import register as register_commands

    register_commands(subparsers)
