"""`minilin status | check | hint | reset | watch`: the exercises from the command line.

Every command finds the exercise tree from the current directory (see `tree.find_root`) and runs the checks
in-process with `runner` (pytest is not needed; `pytest exercises` runs the same checks).
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import tempfile
import time

from . import runner
from .checks import gpu_status
from .runner import FAILED, FAILING, IN_PROGRESS, NOT_STARTED, PASSED, SKIPPED, SOLVED, TODO
from .stubs import make_stub
from .tree import CourseError, load, select

POLL_SECONDS = 0.5


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", metavar="PATH", help="the minilin clone holding exercises/ "
                        "(default: found from the current directory upward)")
    which = argparse.ArgumentParser(add_help=False)
    which.add_argument("--solutions", action="store_true", help="check the worked solutions in solutions/ instead")

    p = subparsers.add_parser("status", parents=[common, which], help="the exercises: solved / failing / not started",
                              description="Check every exercise and show where you stand (also what `minilin` runs).")
    p.set_defaults(func=status)

    p = subparsers.add_parser("check", parents=[common, which], help="check one exercise (default: the next unsolved)",
                              description="Check exercise N (default: the next unsolved one); show the first "
                              "failure and a hint.")
    p.add_argument("number", nargs="?", metavar="N", help="exercise number (see minilin status)")
    p.set_defaults(func=check)

    p = subparsers.add_parser("hint", parents=[common], help="hints for an exercise, from a nudge to the plan",
                              description="Show the hints of exercise N up to LEVEL (1 = a nudge; the last = the plan).")
    p.add_argument("number", metavar="N", help="exercise number")
    p.add_argument("level", nargs="?", type=int, default=1, metavar="LEVEL", help="how many hints to show (default 1)")
    p.set_defaults(func=hint)

    p = subparsers.add_parser("reset", parents=[common], help="restore the pristine stub of an exercise",
                              description="Put back exercise N's untouched stub (made from its solution, or from "
                              "git). Asks before throwing your work away; a copy of it is kept in the temp folder.")
    p.add_argument("number", metavar="N", help="exercise number")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.set_defaults(func=reset)

    p = subparsers.add_parser("watch", parents=[common], help="re-check the current exercise on every save",
                              description="Check the current exercise (default: the next unsolved) whenever its file "
                              "changes, and move on when it is solved. Polls the file, so it works everywhere. "
                              "Ctrl-C stops.")
    p.add_argument("number", nargs="?", metavar="N", help="start from this exercise")
    p.set_defaults(func=watch)


# ---------------------------------------------------------------- output

class Style:
    """ANSI colour when writing to a terminal (and NO_COLOR is unset); check marks when it can print them."""

    def __init__(self, stream=None):
        stream = stream or sys.stdout
        self.color = stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        try:
            "✓✗·".encode(stream.encoding or "ascii")
            self.marks = {PASSED: "✓", FAILED: "✗", TODO: "·", SKIPPED: "-"}
        except (UnicodeEncodeError, LookupError):
            self.marks = {PASSED: "+", FAILED: "x", TODO: ".", SKIPPED: "-"}

    def paint(self, text: str, status: str) -> str:
        codes = {SOLVED: "32", PASSED: "32", FAILING: "31", FAILED: "31", IN_PROGRESS: "33", TODO: "2",
                 NOT_STARTED: "2", SKIPPED: "36", "bold": "1"}
        return f"\033[{codes[status]}m{text}\033[0m" if self.color and status in codes else text


def _exercises(args):
    try:
        return load(args.root) if args.root else load()
    except CourseError as error:
        print(f"minilin: {error}", file=sys.stderr)
        return None


def next_exercise(results):
    """The first exercise, in list order, that is neither solved nor skipped (None if there is none)."""
    return next((r.exercise for r in results if r.status not in (SOLVED, SKIPPED)), None)


def summary_line(results, exercises, *, whole_course: bool = True) -> str:
    """'5/17 solved, 40/150 points; next: 06 RetNet, exercises/06_retnet/retnet.py'.
    whole_course=False: `exercises` is only the part that was run (no "all done")."""
    solved = [r for r in results if r.status == SOLVED]
    points = sum(r.exercise.points for r in solved)
    total = sum(ex.points for ex in exercises)
    line = f"{len(solved)}/{len(exercises)} solved, {points}/{total} points"
    skipped = [r.exercise for r in results if r.status == SKIPPED]
    if skipped:
        line += f" ({', '.join(f'{ex.number:02d}' for ex in skipped)} skipped: no GPU here)"
    upcoming = next_exercise(results)
    if upcoming is not None:
        line += f"; next: {upcoming.label}, {upcoming.relpath()}"
    elif len(solved) == len(exercises) and whole_course:
        line += "; all done!"
    return line


def todo_functions(result) -> list:
    """The learner's functions that still raise NotImplementedError, in the order the checks met them."""
    return list(dict.fromkeys(c.todo for c in result.checks if c.todo))


def status_word(result, width: int = 60) -> str:
    if result.status == IN_PROGRESS:
        done = sum(c.outcome == PASSED for c in result.checks)
        return f"in progress ({done}/{len(result.checks)} checks pass; to write: {', '.join(todo_functions(result))})"
    if result.status == SKIPPED:
        return f"skipped: {result.message}"
    if result.status == FAILING:
        problem = result.first_problem
        why = (problem.message if problem is not None else result.message).splitlines()
        first = re.sub(r" \[[^\]]*\]", "", why[0]) if why else ""   # the case in brackets is too long here
        return f"failing: {first[:width - 3] + '...' if len(first) > width else first}"
    return result.status


def _run_all(exercises, tree, style, gpu):
    results = []
    width = max(len(ex.title) for ex in exercises)
    for ex in exercises:
        result = runner.run(ex, tree=tree, gpu=gpu)
        results.append(result)
        earned = ex.points if result.status == SOLVED else 0
        print(f"  {ex.number:02d}  {ex.title:<{width}}  {earned:>2}/{ex.points:<2} pts  "
              f"{style.paint(status_word(result), result.status)}", flush=True)
    return results


# ---------------------------------------------------------------- commands

def status(args) -> int:
    exercises = _exercises(args)
    if exercises is None:
        if getattr(args, "command", None) != "status":
            print("(`minilin --help` lists the other commands: tour, bench, ...)", file=sys.stderr)
        return 2
    style = Style()
    tree = "solutions" if args.solutions else "exercises"
    print(style.paint(f"minilin exercises ({exercises[0].root / tree})", "bold"))
    results = _run_all(exercises, tree, style, gpu_status() if any(ex.gpu for ex in exercises) else None)
    solved = sum(r.status == SOLVED for r in results)
    bar = 30
    filled = round(bar * solved / len(exercises))
    print(f"\n  [{'#' * filled}{'.' * (bar - filled)}] {summary_line(results, exercises)}")
    upcoming = next_exercise(results)
    if upcoming is not None and not args.solutions:
        print(f"  open {upcoming.relpath()}, then: minilin check {upcoming.number}  "
              f"(or minilin watch; stuck? minilin hint {upcoming.number})")
    return 0


def _first_open(exercises, tree, gpu):
    """The next unsolved exercise, running checks in order until one is not solved."""
    for ex in exercises:
        result = runner.run(ex, tree=tree, gpu=gpu)
        if result.status not in (SOLVED, SKIPPED):
            return ex, result
    return None, None


def show(result, style, tree="exercises") -> None:
    """One exercise's result: a line per check, the first failure in full, and the first hint."""
    ex = result.exercise
    print(style.paint(f"{ex.label}", "bold") + f"  ({ex.relpath(tree)})")
    if result.message:
        print(f"  {style.paint(status_word(result), result.status)}" if result.status == SKIPPED
              else style.paint("  " + result.message.replace("\n", "\n  "), FAILED))
    for c in result.checks:
        note = f"  ({c.todo}() is still a TODO)" if c.outcome == TODO else ""
        print(f"  {style.paint(style.marks[c.outcome], c.outcome)} {c.name}{note}")
    problem = result.first_problem
    if problem is not None and problem.outcome == FAILED:
        print()
        print("  " + problem.message.replace("\n", "\n  "))
    if result.status == SKIPPED:
        print("  GPU exercises run where CuPy sees an NVIDIA GPU: pip install -e \".[cuda]\" there (CuPy compiles\n"
              f"  the kernel itself; nvcc is not needed), then minilin check {ex.number}. The stub is ready to write anyway.")
    if result.status == SOLVED:
        print(style.paint(f"\n  solved: +{ex.points} points", SOLVED))
    elif result.status == NOT_STARTED:
        print(f"\n  not started: open {ex.relpath(tree)}, read the docstrings, and replace each "
              "`raise NotImplementedError`.")
    elif result.status != SKIPPED:
        if result.status == IN_PROGRESS:
            print(f"\n  still to write in {ex.relpath(tree)}: {', '.join(f + '()' for f in todo_functions(result))}")
        print(f"\n  hint (1 of {len(ex.hints)}): {ex.hints[0]}")
        if len(ex.hints) > 1:
            print(f"  more: minilin hint {ex.number} 2")


def check(args) -> int:
    exercises = _exercises(args)
    if exercises is None:
        return 2
    tree = "solutions" if args.solutions else "exercises"
    gpu = gpu_status() if any(ex.gpu for ex in exercises) else None
    style = Style()
    if args.number is None:
        ex, result = _first_open(exercises, tree, gpu)
        if ex is None:
            print("Every exercise that can run here is solved. " + ("The GPU ones need a machine with CuPy and a GPU."
                                                                   if any(e.gpu for e in exercises) and not gpu[0] else ""))
            return 0
    else:
        try:
            ex = select(exercises, args.number)
        except CourseError as error:
            print(f"minilin: {error}", file=sys.stderr)
            return 2
        result = runner.run(ex, tree=tree, gpu=gpu)
    show(result, style, tree)
    if result.status == SOLVED:
        upcoming, _ = _first_open(exercises[ex.number:], tree, gpu)
        if upcoming is not None:
            print(f"  next: {upcoming.label}, {upcoming.relpath(tree)}  (minilin check {upcoming.number})")
        else:
            print("  that was the last one to solve here.")
    return 0 if result.status == SOLVED else 1


def hint(args) -> int:
    exercises = _exercises(args)
    if exercises is None:
        return 2
    try:
        ex = select(exercises, args.number)
    except CourseError as error:
        print(f"minilin: {error}", file=sys.stderr)
        return 2
    level = max(1, min(args.level, len(ex.hints)))
    print(f"{ex.label}  ({ex.relpath()})")
    for i, text in enumerate(ex.hints[:level], 1):
        print(f"  hint {i} of {len(ex.hints)}: {text}")
    if level < len(ex.hints):
        print(f"  (a more specific one: minilin hint {ex.number} {level + 1})")
    return 0


def pristine_stub(ex) -> str:
    """The untouched stub: made from the worked solution, or (if solutions/ is gone) taken from git's HEAD."""
    solution = ex.path("solutions")
    if solution.exists():
        return make_stub(solution.read_text(encoding="utf-8"), ex.relpath("solutions"))
    import subprocess

    try:
        return subprocess.run(["git", "show", f"HEAD:{ex.relpath()}"], cwd=ex.root, check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise CourseError(f"cannot restore {ex.relpath()}: {ex.relpath('solutions')} is missing and git could "
                          f"not give the committed stub ({error})") from error


def reset(args) -> int:
    exercises = _exercises(args)
    if exercises is None:
        return 2
    try:
        ex = select(exercises, args.number)
        stub = pristine_stub(ex)
    except CourseError as error:
        print(f"minilin: {error}", file=sys.stderr)
        return 2
    path = ex.path()
    current = path.read_text(encoding="utf-8") if path.exists() else None
    if current == stub:
        print(f"{ex.relpath()} is already the untouched stub.")
        return 0
    if current is not None:
        changed = sum(1 for line in difflib.unified_diff(stub.splitlines(), current.splitlines(), lineterm="", n=0)
                      if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        if not args.yes:
            if not sys.stdin.isatty():
                print(f"{ex.relpath()} has your changes ({changed} lines differ from the stub); "
                      f"run `minilin reset {ex.number} --yes` to throw them away.", file=sys.stderr)
                return 1
            answer = input(f"{ex.relpath()} has your changes ({changed} lines differ from the stub). "
                           "Throw them away? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("Nothing changed.")
                return 1
        fd, backup = tempfile.mkstemp(prefix=f"minilin-{ex.folder}-", suffix=".py")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(current)
        print(f"Your version is saved in {backup}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(stub, encoding="utf-8")
    print(f"{ex.relpath()} is the untouched stub again.")
    return 0


def _stamp(path):
    try:
        st = os.stat(path)
        return st.st_mtime_ns, st.st_size
    except OSError:
        return None


def watch(args) -> int:
    exercises = _exercises(args)
    if exercises is None:
        return 2
    gpu = gpu_status() if any(ex.gpu for ex in exercises) else None
    style = Style()
    try:
        if args.number is not None:
            ex = select(exercises, args.number)
        else:
            ex, _ = _first_open(exercises, "exercises", gpu)
    except CourseError as error:
        print(f"minilin: {error}", file=sys.stderr)
        return 2
    try:
        while ex is not None:
            print(style.paint(f"\n== watching {ex.relpath()} (checks run on every save; Ctrl-C stops)", "bold"))
            result = runner.run(ex, gpu=gpu)
            show(result, style)
            while result.status not in (SOLVED, SKIPPED):
                stamp = _stamp(ex.path())
                while _stamp(ex.path()) == stamp:
                    time.sleep(POLL_SECONDS)
                print(style.paint(f"\n-- {time.strftime('%H:%M:%S')} {ex.file} changed, checking again", "bold"))
                result = runner.run(ex, gpu=gpu)
                show(result, style)
            ex = exercises[ex.number] if ex.number < len(exercises) else None
        print("\nNo exercises left to watch: that was the last one.")
    except KeyboardInterrupt:
        print("\nStopped watching.")
    return 0
