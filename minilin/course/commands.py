"""`minilin status | check | hint | reset | watch`: the exercises from the command line.

Every command finds the exercise tree from the current directory (see `tree.find_root`) and runs the checks
with `runner`, each in a child process with a time limit (pytest is not needed; `pytest exercises` runs the
same checks). The current exercise, the one `check`, `hint` and `watch` mean without a number, is kept by
`progress`: `check` confirms a solve ("03 solved, +6 points") and makes the next unsolved one current.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import tempfile

from . import progress, runner
from .checks import gpu_status
from .keys import Keys
from .runner import FAILED, FAILING, IN_PROGRESS, NOT_STARTED, PASSED, SKIPPED, SOLVED, TODO
from .stubs import make_stub
from .tree import CourseError, load, select

POLL_SECONDS = 0.5
PRINTED_LINES = 20         # of what the learner's code printed, shown with a result
CLEAR = "\033[H\033[2J\033[3J"   # cursor home, clear the screen and its scrollback


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", metavar="PATH", help="the minilin clone holding exercises/ "
                        "(default: found from the current directory upward)")
    which = argparse.ArgumentParser(add_help=False)
    which.add_argument("--solutions", action="store_true", help="check the worked solutions in solutions/ instead")

    p = subparsers.add_parser("status", parents=[common, which], help="the exercises: solved / failing / not started",
                              description="Check every exercise and show where you stand (also what `minilin` runs).")
    p.set_defaults(func=status)

    timing = argparse.ArgumentParser(add_help=False)
    timing.add_argument("--timeout", type=float, metavar="SECONDS", help="time limit per check (default: the "
                        "exercise's, 10 s for most; also $MINILIN_CHECK_TIMEOUT)")

    p = subparsers.add_parser("check", parents=[common, which, timing],
                              help="check one exercise (default: the current one)",
                              description="Check exercise N (default: the current one, the first unsolved at "
                              "the start); show the first failure and a hint for the function that failed. A "
                              "solved exercise is confirmed, and the next unsolved one becomes current.")
    p.add_argument("number", nargs="?", metavar="N", help="exercise number (see minilin status)")
    p.set_defaults(func=check)

    p = subparsers.add_parser("hint", parents=[common], help="hints for an exercise, from a nudge to the plan",
                              description="Show the hints of exercise N (default: the current one) up to LEVEL "
                              "(1 = a nudge; the last = the plan). Without N: the hints of the function whose "
                              "check failed last, where it has its own.")
    p.add_argument("number", nargs="?", metavar="N", help="exercise number (default: the current exercise)")
    p.add_argument("level", nargs="?", type=int, default=1, metavar="LEVEL", help="how many hints to show (default 1)")
    p.add_argument("--for", dest="function", metavar="FUNCTION", help="the hints of one function of the file")
    p.set_defaults(func=hint)

    p = subparsers.add_parser("reset", parents=[common], help="restore the pristine stub of an exercise",
                              description="Put back exercise N's untouched stub (made from its solution, or from "
                              "git). Asks before throwing your work away; a copy of it is kept in the temp folder.")
    p.add_argument("number", metavar="N", help="exercise number")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.set_defaults(func=reset)

    p = subparsers.add_parser("watch", parents=[common, timing], help="re-check the current exercise on every save",
                              description="Check the current exercise whenever its file changes, and move on to "
                              "the next unsolved one when it is solved (GPU exercises are passed over where "
                              "there is no GPU). With N: watch exercise N only. Keys, no Enter needed in a "
                              "terminal: h hint, n next exercise, r check again, q quit (Ctrl-C also stops).")
    p.add_argument("number", nargs="?", metavar="N", help="watch this exercise only (do not move on)")
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
    """'5/23 solved, 30/297 points; next: 06 RetNet, exercises/06_retnet/retnet.py'.
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


def _run(ex, args, tree="exercises", gpu=None):
    return runner.run(ex, tree=tree, gpu=gpu, timeout=getattr(args, "timeout", None))


def _first_open(exercises, tree, gpu, args=None):
    """The first unsolved exercise that can run here, running checks in order until one is not solved."""
    for ex in exercises:
        result = _run(ex, args, tree, gpu)
        if result.status not in (SOLVED, SKIPPED):
            return ex, result
    return None, None


def _next_open(exercises, after, tree, gpu, args=None):
    """The next unsolved exercise after `after` in list order, then from the start (never `after` itself);
    GPU exercises are passed over where there is no GPU. (None, None) when every other one is solved."""
    i = exercises.index(after)
    return _first_open(exercises[i + 1:] + exercises[:i], tree, gpu, args)


def _current(exercises, tree, gpu, args=None):
    """The current exercise (progress), else the first unsolved: (exercise, result or None)."""
    if tree == "exercises":
        ex = progress.current(exercises)
        if ex is not None:
            return ex, None
    return _first_open(exercises, tree, gpu, args)


def failed_function(result):
    """The learner function that the first problem belongs to (a failure or a TODO), or None."""
    problem = result.first_problem
    return (problem.function or problem.todo or None) if problem is not None else None


def solved_line(ex) -> str:
    return f"{ex.number:02d} solved, +{ex.points} points"


def hint_lines(ex, function, level: int = 1) -> list:
    """The first `level` hints for `function` of `ex` (its own, where the list has them), as printed lines."""
    hints = ex.hints_for(function)
    own = function and hints is not ex.hints
    level = max(1, min(level, len(hints)))
    head = f"hint for {function}()" if own else "hint"
    lines = [f"{head} ({i} of {len(hints)}): {text}" for i, text in enumerate(hints[:level], 1)]
    if level < len(hints):
        lines.append(f"more: minilin hint {ex.number} {level + 1}" + (f" --for {function}" if own else ""))
    return lines


def show(result, style, tree="exercises", *, hints: int = 1) -> None:
    """One exercise's result: a line per check, the first failure in full, and the first `hints` hints of
    the function that failed (or of the exercise)."""
    ex = result.exercise
    print(style.paint(f"{ex.label}", "bold") + f"  ({ex.relpath(tree)})")
    if result.message:
        print(f"  {style.paint(status_word(result), result.status)}" if result.status == SKIPPED
              else style.paint("  " + result.message.replace("\n", "\n  "), FAILED))
    for c in result.checks:
        note = f"  ({c.todo}() is still a TODO)" if c.outcome == TODO else ""
        print(f"  {style.paint(style.marks[c.outcome], c.outcome)} {c.name}{note}")
    if result.output.strip():
        lines = result.output.rstrip().splitlines()
        shown = lines[-PRINTED_LINES:]
        print(f"\n  what your code printed{f' (the last {len(shown)} of {len(lines)} lines)' if len(lines) > len(shown) else ''}:")
        print("\n".join("  | " + line for line in shown))
    problem = result.first_problem
    if problem is not None and problem.outcome == FAILED:
        print()
        print("  " + problem.message.replace("\n", "\n  "))
    if result.status == SKIPPED:
        print("  GPU exercises run where CuPy sees an NVIDIA GPU: pip install -e \".[cuda]\" there (CuPy compiles\n"
              f"  the kernel itself; nvcc is not needed), then minilin check {ex.number}. The stub is ready to write anyway.")
    if result.status == SOLVED:
        print(style.paint(f"\n  {solved_line(ex)}", SOLVED))
    elif result.status == NOT_STARTED:
        print(f"\n  not started: open {ex.relpath(tree)}, read the docstrings, and replace each "
              "`raise NotImplementedError`.")
        if hints > 1:
            print("\n" + "\n".join("  " + line for line in hint_lines(ex, failed_function(result), hints - 1)))
    elif result.status != SKIPPED:
        if result.status == IN_PROGRESS:
            print(f"\n  still to write in {ex.relpath(tree)}: {', '.join(f + '()' for f in todo_functions(result))}")
        print("\n" + "\n".join("  " + line for line in hint_lines(ex, failed_function(result), hints)))


def check(args) -> int:
    exercises = _exercises(args)
    if exercises is None:
        return 2
    tree = "solutions" if args.solutions else "exercises"
    gpu = gpu_status() if any(ex.gpu for ex in exercises) else None
    style = Style()
    result = None
    if args.number is None:
        ex, result = _current(exercises, tree, gpu, args)
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
    if result is None:
        result = _run(ex, args, tree, gpu)
    show(result, style, tree)
    if result.status in (SOLVED, SKIPPED):
        upcoming, _ = _next_open(exercises, ex, tree, gpu, args)
        if tree == "exercises":
            if upcoming is not None:
                progress.remember(upcoming)
            elif result.status == SOLVED:
                progress.remember(ex)
        if upcoming is not None:
            print(f"  next: {upcoming.label}, {upcoming.relpath(tree)}  (minilin check)")
        else:
            print("  that was the last one to solve here.")
    elif tree == "exercises":
        progress.remember(ex, failed_function(result))
    return 0 if result.status == SOLVED else 1


def hint(args) -> int:
    exercises = _exercises(args)
    if exercises is None:
        return 2
    function = args.function
    try:
        if args.number is None:
            ex = progress.current(exercises)
            if ex is None:
                ex, result = _first_open(exercises, "exercises", gpu_status() if any(e.gpu for e in exercises) else None)
                if ex is None:
                    print("Every exercise that can run here is solved: no hint needed. (minilin hint N for one.)")
                    return 0
                function = function or failed_function(result)
            else:
                function = function or progress.failed_function(ex)
        else:
            ex = select(exercises, args.number)
    except CourseError as error:
        print(f"minilin: {error}", file=sys.stderr)
        return 2
    own = dict(ex.function_hints)
    if args.function and args.function not in own:
        known = ", ".join(own) or "none"
        print(f"minilin: exercise {ex.number:02d} has no hints of its own for {args.function}() "
              f"(functions with their own: {known}); the exercise's hints:", file=sys.stderr)
        function = None
    print(f"{ex.label}  ({ex.relpath()})")
    for line in hint_lines(ex, function, args.level):
        print("  " + line.replace("more: minilin hint", "(a more specific one: minilin hint"), end="")
        print(")" if line.startswith("more:") else "")
    others = [name for name in own if name != function]
    if others:
        print(f"  (hints for one function: minilin hint {ex.number} --for {' | '.join(others)})")
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


class _Screen:
    """Where watch draws: cleared between checks on a terminal; elsewhere a rule between them."""

    def __init__(self, style, stream=None):
        self.style = style
        self.stream = stream or sys.stdout
        self.clears = self.stream.isatty() and os.environ.get("TERM") != "dumb"

    def clear(self) -> None:
        if self.clears:
            self.stream.write(CLEAR)
            self.stream.flush()
        else:
            print("\n" + "-" * 78)


def watch(args, keys=None) -> int:
    """The watch loop (see the parser's description). `keys`: where key presses come from (a Keys)."""
    exercises = _exercises(args)
    if exercises is None:
        return 2
    gpu = gpu_status() if any(ex.gpu for ex in exercises) else None
    style = Style()
    pinned = args.number is not None
    try:
        if pinned:
            ex, result = select(exercises, args.number), None
        else:
            ex, result = _current(exercises, "exercises", gpu, args)
    except CourseError as error:
        print(f"minilin: {error}", file=sys.stderr)
        return 2
    if ex is None:
        print("Every exercise that can run here is solved: nothing to watch.")
        return 0
    screen = _Screen(style)
    keys = keys if keys is not None else Keys()
    news, hints = [], 1

    def draw():
        screen.clear()
        scope = f"exercise {ex.number:02d} only" if pinned else "moving on when solved"
        print(style.paint(f"minilin watch: checks run on every save of {ex.relpath()} ({scope})", "bold"))
        for line in news:
            print(style.paint(line, SOLVED if "solved" in line else "bold"))
        print()
        show(result, style, hints=hints)
        if pinned and result.status == SOLVED:
            print(f"  watching {ex.number:02d} still: save to check again, n for the next exercise")
        press = "" if keys.single else " (then Enter)"
        print(style.paint(f"\n  [h] hint  [n] next exercise  [r] check again  [q] quit{press}", "bold"), flush=True)

    try:
        with keys:
            if result is None:
                result = _run(ex, args, gpu=gpu)
            progress.remember(ex, failed_function(result))
            draw()
            while True:
                if not pinned and result.status in (SOLVED, SKIPPED):  # move on, and say why
                    news = [solved_line(ex) if result.status == SOLVED
                            else f"{ex.number:02d} skipped: {result.message}"]
                    upcoming, upcoming_result = _next_open(exercises, ex, "exercises", gpu, args)
                    if upcoming is None:
                        if result.status == SOLVED:
                            progress.remember(ex)
                        print(style.paint(f"\n  {news[0]}", SOLVED))
                        print("\nEvery exercise that can run here is solved: nothing left to watch."
                              + (" (The GPU ones need CuPy and a GPU.)" if gpu is not None and not gpu[0] else ""))
                        return 0
                    news.append(f"next: {upcoming.label}")
                    ex, result, hints = upcoming, upcoming_result, 1
                    progress.remember(ex, failed_function(result))
                    draw()
                    continue
                event = _wait(ex.path(), keys)
                if event == "q":
                    print("Stopped watching.")
                    return 0
                if event == "h":
                    hints += 1
                elif event == "n":
                    upcoming, upcoming_result = _next_open(exercises, ex, "exercises", gpu, args)
                    if upcoming is None:
                        news = ["no other exercise to solve here"]
                    else:
                        news = [f"on to {upcoming.label} (you can come back: minilin watch {ex.number})"]
                        ex, result, hints = upcoming, upcoming_result, 1
                else:  # the file changed, or r
                    result, hints, news = _run(ex, args, gpu=gpu), 1, []
                progress.remember(ex, failed_function(result))
                draw()
    except KeyboardInterrupt:
        print("\nStopped watching.")
    return 0


def _wait(path, keys) -> str:
    """Until the file at `path` changes ("changed") or one of the keys h, n, r, q is pressed (that key)."""
    stamp = _stamp(path)
    while True:
        key = keys.wait(POLL_SECONDS)
        if key in ("h", "n", "r", "q"):
            return key
        if key == "\n":
            return "r"
        if _stamp(path) != stamp:
            return "changed"
