"""Run an exercise's check without pytest: `minilin check`, `status` and `watch` use this, and so do the
proofs in tests/test_exercises.py and the mutation tool. `pytest exercises` runs the very same test
functions through exercises/conftest.py.

An exercise's check is its test_*.py: plain functions `test_<what>(learner)` that receive the learner's
module (instrumented by minilin/course/guard.py) and raise `CheckFailure` (or any exception) when
something is wrong.

Outcomes of one check: passed, todo (the learner's file still raises NotImplementedError), failed (also a
check that ran out of time: an endless loop), skipped (a GPU exercise where CuPy sees no GPU). Status of an
exercise, from its checks:
    solved       every check passed
    not started  every check hit a NotImplementedError still in the learner's file
    in progress  no check failed, but some still hit a NotImplementedError
    failing      a check failed, or the file does not import
    skipped      a GPU exercise on a machine without a usable GPU (never counted as solved)

Isolation. The learner's code may loop forever or crash Python, and `minilin watch` must survive both. So
by default the checks run in a child process (os.fork, where it exists: the child inherits the loaded
modules, so a check starts in milliseconds), which reports each check as it finishes over a pipe. The
parent gives every check `timeout` seconds (the exercise's `timeout`, default tree.DEFAULT_TIMEOUT, or
$MINILIN_CHECK_TIMEOUT); a check that runs longer is killed with its process and fails with "check timed
out after N s: an endless loop?", and a fresh child runs the checks after it. Where there is no fork
(Windows), the checks run in a thread, stopped at the time limit by an exception raised in it (that stops a
Python loop; a single NumPy call that never returns cannot be stopped there). `isolation="none"` runs them
in this process, with no time limit. $MINILIN_CHECK_ISOLATION = process | thread | none overrides the
default.

CUDA and fork: a child forked from a process that has started CUDA cannot use the GPU. So the commands never
touch CuPy themselves (checks.gpu_status asks a separate Python whether there is a GPU), each child starts
CUDA for itself, and a GPU exercise run from a process that has imported CuPy already (a test session)
runs its checks in a thread instead (isolation_for).
"""
from __future__ import annotations

import ctypes
import importlib.util
import inspect
import itertools
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .checks import CheckFailure, gpu_status
from .guard import instrument
from .tree import Exercise

PASSED, TODO, FAILED, SKIPPED = "passed", "todo", "failed", "skipped"
SOLVED, NOT_STARTED, IN_PROGRESS, FAILING = "solved", "not started", "in progress", "failing"
ISOLATIONS = ("process", "thread", "none")
OUTPUT_LIMIT = 4000        # characters of the learner's printed output kept with a result

_counter = itertools.count()


@dataclass
class CheckResult:
    name: str
    outcome: str
    message: str = ""
    todo: str = ""             # the learner function still raising NotImplementedError, for a todo check
    function: str = ""         # the learner function the failure belongs to (for its hint), when known
    seconds: float = 0.0


@dataclass
class ExerciseResult:
    exercise: Exercise
    checks: list = field(default_factory=list)
    status: str = FAILING
    message: str = ""          # why, when the exercise could not be run at all (import error, no GPU)
    output: str = ""           # what the learner's code printed (isolation "process"; otherwise it went
                               # straight to the terminal)

    @property
    def first_problem(self):
        """The first failed check, else the first todo one, else None."""
        for outcome in (FAILED, TODO):
            for check in self.checks:
                if check.outcome == outcome:
                    return check
        return None


def load_module(path: Path, prefix: str = "minilin_learner"):
    """Import the Python file at `path` afresh (a new module object every call) under a unique name."""
    name = f"{prefix}_{Path(path).stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    folder = str(Path(path).resolve().parent)
    sys.path.insert(0, folder)  # as under pytest: a helper file next to the learner's file imports
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(folder)
    return module


def check_functions(test_module) -> list:
    """The `test_*` functions of a check module, in the order they are written."""
    functions = [f for name, f in vars(test_module).items()
                 if name.startswith("test_") and inspect.isfunction(f) and f.__module__ == test_module.__name__]
    return sorted(functions, key=lambda f: f.__code__.co_firstlineno)


def todo_function(error: BaseException, learner_path: Path):
    """The learner function still raising NotImplementedError, if `error` is that; else None."""
    if not isinstance(error, NotImplementedError):
        return None
    frames = traceback.extract_tb(error.__traceback__)
    if frames and Path(frames[-1].filename).resolve() == Path(learner_path).resolve():
        return frames[-1].name
    return None


def explain(error: BaseException, learner_path: Path, test_path: Path) -> str:
    """A short account of an exception: the message, and where it happened in the learner's file (or,
    failing that, in the check), without minilin's or NumPy's internals."""
    if isinstance(error, CheckFailure):
        return str(error)
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if Path(f.filename).resolve() == Path(learner_path).resolve()]
    shown = mine or [f for f in frames if Path(f.filename).resolve() == Path(test_path).resolve()][-1:]
    lines = [f"{type(error).__name__}: {error}".rstrip(": ")]
    for f in shown:
        lines.append(f"  {Path(f.filename).name}, line {f.lineno}, in {f.name}: {(f.line or '').strip()}")
    return "\n".join(lines)


def default_isolation() -> str:
    chosen = os.environ.get("MINILIN_CHECK_ISOLATION", "").strip().lower()
    if chosen in ISOLATIONS:
        return chosen
    return "process" if hasattr(os, "fork") else "thread"


def cuda_started_here() -> bool:
    """Whether this process has imported the real CuPy (and so may have started CUDA): a process forked
    from it could not use the GPU. (The CPU emulation of tests and the mutation tool is not CUDA.)"""
    cupy = sys.modules.get("cupy")
    return cupy is not None and not getattr(cupy, "__minilin_emulated__", False)


def isolation_for(exercise: Exercise, isolation: str | None = None) -> str:
    """The isolation a run of `exercise` gets: `isolation`, else the default, except that a GPU exercise in a
    process that has imported CuPy runs in a thread instead of a forked child."""
    isolation = isolation or default_isolation()
    if isolation == "process" and exercise.gpu and cuda_started_here():
        return "thread"
    return isolation


def time_limit(exercise: Exercise, timeout=None) -> float:
    """Seconds one check of `exercise` may run: `timeout`, else $MINILIN_CHECK_TIMEOUT, else the exercise's."""
    if timeout is None and os.environ.get("MINILIN_CHECK_TIMEOUT"):
        timeout = float(os.environ["MINILIN_CHECK_TIMEOUT"])
    return float(timeout if timeout is not None else exercise.timeout)


def timed_out_message(seconds: float, running: str | None) -> str:
    where = f" {running}() was still running" if running else ""
    return (f"check timed out after {seconds:g} s: an endless loop?{where}. (Each check gets {seconds:g} s; "
            "the worked solution needs well under one. Look for a loop whose condition never changes.)")


def run(exercise: Exercise, *, tree: str = "exercises", module=None, stop_at_first_failure: bool = False,
        gpu=None, timeout=None, isolation: str | None = None) -> ExerciseResult:
    """Run every check of `exercise` against the learner's file in `tree` ("exercises" or "solutions"),
    or against `module` when given (an already loaded module, e.g. a modified copy). `timeout`: seconds per
    check (see time_limit); `isolation`: "process", "thread" or "none" (see the module docstring)."""
    result = ExerciseResult(exercise)
    if exercise.gpu:
        ok, reason = gpu if gpu is not None else gpu_status()
        if not ok:
            result.status, result.message = SKIPPED, reason
            return result
    job = _Job(exercise, tree, module, stop_at_first_failure)
    isolation = isolation_for(exercise, isolation)
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation: expected one of {ISOLATIONS}, got {isolation!r}")
    if isolation == "none":
        events = []
        job.run(events.append)
        _collect(result, events)
    else:
        _run_isolated(job, result, time_limit(exercise, timeout), isolation)
    if not result.checks and not result.message:
        result.message = f"{exercise.test_path().name} has no test_* functions"
    result.status = status_of([c.outcome for c in result.checks]) if not result.message or result.checks else FAILING
    return result


# ---------------------------------------------------------------- running the checks (here, or in a child)

@dataclass
class _Job:
    exercise: Exercise
    tree: str
    module: object
    stop_at_first_failure: bool

    def run(self, report, start: int = 0) -> None:
        """Run the checks from number `start` on, reporting events: ("checks", names), ("start", name),
        ("calling", function), ("result", CheckResult), ("message", text), then ("end", None)."""
        ex, module, loaded = self.exercise, self.module, False
        test_path = ex.test_path()
        try:
            if module is None:
                try:
                    module, loaded = load_module(ex.path(self.tree)), True
                except FileNotFoundError:
                    report(("message", f"{ex.relpath(self.tree)} does not exist "
                                       f"(minilin reset {ex.number} restores it)"))
                    return
                except Exception as error:
                    report(("message", f"{ex.relpath(self.tree)} does not import:\n" + "".join(
                        traceback.format_exception_only(type(error), error)).rstrip()))
                    return
            try:
                checks = load_module(test_path, prefix="minilin_check")
            except Exception as error:  # the check itself is broken: say so instead of crashing
                report(("message", f"the check {test_path.name} does not import (a bug in the course, not in "
                                   "your file):\n" + "".join(traceback.format_exception_only(type(error), error)).rstrip()))
                return
            guard = instrument(module, allow=ex.allow)
            guard.on_call = lambda name: report(("calling", name))
            functions = check_functions(checks)
            report(("checks", [f.__name__ for f in functions]))
            learner_path = Path(module.__file__)
            for function in functions[start:]:
                report(("start", function.__name__))
                guard.forget()
                began = time.perf_counter()
                try:
                    function(module)
                except (Exception, SystemExit) as error:  # a failed check, or the learner's code raising
                    todo = todo_function(error, learner_path)
                    if todo:
                        check = CheckResult(function.__name__, TODO, f"{todo}() still raises NotImplementedError: "
                                            f"{error}", todo, todo)
                    else:
                        check = CheckResult(function.__name__, FAILED, explain(error, learner_path, test_path),
                                            function=guard.last_called or "")
                else:
                    check = CheckResult(function.__name__, PASSED)
                check.seconds = time.perf_counter() - began
                report(("result", check))
                if self.stop_at_first_failure and check.outcome == FAILED:
                    break
            guard.on_call = None
            sys.modules.pop(checks.__name__, None)
        finally:
            if loaded:
                sys.modules.pop(module.__name__, None)
            report(("end", None))


def _collect(result: ExerciseResult, events) -> None:
    for kind, payload in events:
        if kind == "result":
            result.checks.append(payload)
        elif kind == "message":
            result.message = payload


class _Feed:
    """What the parent learns from a child while it runs: the check names, the check and the learner
    function running now, the results so far."""

    def __init__(self):
        self.names, self.running, self.calling, self.done, self.ended = None, None, None, [], False

    def take(self, result, event) -> None:
        kind, payload = event
        if kind == "checks":
            self.names = payload
        elif kind == "start":
            self.running, self.calling = payload, None
        elif kind == "calling":
            self.calling = payload
        elif kind == "result":
            result.checks.append(payload)
            self.done.append(payload.name)
            self.running = None
        elif kind == "message":
            result.message = payload
        elif kind == "end":
            self.ended = True


def _run_isolated(job: _Job, result: ExerciseResult, seconds: float, isolation: str) -> None:
    start = 0
    while True:
        feed = _Feed()
        stopped = (_in_child if isolation == "process" else _in_thread)(job, start, seconds, result, feed)
        if feed.ended or stopped is None:
            return
        # The child stopped in the middle: a time-out, or a crash. Blame the running check, go on after it.
        ex = job.exercise
        if feed.names is None:  # still importing the learner's file
            result.message = (f"{ex.relpath(job.tree)} did not finish importing within {seconds:g} s: an endless "
                              "loop at the top level of the file?" if stopped == "timeout" else
                              f"{ex.relpath(job.tree)}: importing it stopped Python ({stopped})")
            return
        running = feed.running or (feed.names[start + len(feed.done)] if start + len(feed.done) < len(feed.names) else None)
        if running is None:
            return
        message = (timed_out_message(seconds, feed.calling) if stopped == "timeout" else
                   f"the check stopped Python itself ({stopped}) while {feed.calling or 'the check'}() ran: "
                   "a crash, or os._exit / sys.exit in your file?")
        result.checks.append(CheckResult(running, FAILED, message, function=feed.calling or ""))
        if job.stop_at_first_failure:
            return
        start = feed.names.index(running) + 1
        if start >= len(feed.names):
            return


def _tail(stream, limit: int = OUTPUT_LIMIT) -> str:
    """The last `limit` characters written to the file `stream`."""
    size = stream.seek(0, os.SEEK_END)
    stream.seek(max(0, size - limit))
    text = stream.read().decode(errors="replace")
    return (f"... ({size - limit} bytes before these)\n" + text) if size > limit else text


def _describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"killed by signal {number}, {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exit status {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else f"status {status}"


def _in_child(job: _Job, start: int, seconds: float, result: ExerciseResult, feed: _Feed):
    """Run the job in a forked child; None when it ended normally, "timeout", or how it died."""
    import multiprocessing

    reader, writer = multiprocessing.Pipe(duplex=False)
    printed = tempfile.TemporaryFile()   # what the learner's code prints, shown with the result
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    with warnings.catch_warnings():  # Python 3.12 warns of fork in a process with threads (NumPy's BLAS pool):
        warnings.simplefilter("ignore", DeprecationWarning)  # the child runs Python code only, never waits on them
        pid = os.fork()
    if pid == 0:  # the child: run, report, and leave without running the parent's exit handlers
        code = 0
        try:
            reader.close()
            os.dup2(printed.fileno(), 1)
            os.dup2(printed.fileno(), 2)
            sys.stdout = sys.stderr = open(printed.fileno(), "w", buffering=1, closefd=False, errors="replace")
            job.run(writer.send, start)
        except BaseException:
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    writer.close()
    outcome = None
    try:
        deadline = time.monotonic() + seconds
        while not feed.ended:
            left = deadline - time.monotonic()
            if left <= 0 or not reader.poll(left):
                outcome = "timeout"
                break
            try:
                event = reader.recv()
            except EOFError:
                outcome = "crash"
                break
            feed.take(result, event)
            if event[0] in ("start", "result", "checks"):
                deadline = time.monotonic() + seconds
    finally:
        if not feed.ended:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
        reader.close()
        result.output += _tail(printed)
        printed.close()
    if outcome == "crash":
        return _describe_exit(status)
    return outcome


class _Stop(BaseException):
    """Raised inside a check's thread at its time limit (a BaseException: `except Exception` lets it pass)."""


def _in_thread(job: _Job, start: int, seconds: float, result: ExerciseResult, feed: _Feed):
    """The fallback without fork: the job in a thread, stopped at the time limit by raising _Stop in it."""
    events: queue.Queue = queue.Queue()

    def work():
        try:
            job.run(events.put, start)
        except _Stop:
            pass

    worker = threading.Thread(target=work, daemon=True, name="minilin-check")
    worker.start()
    deadline = time.monotonic() + seconds
    while not feed.ended:
        try:
            event = events.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(_Stop))
            worker.join(2.0)
            return "timeout"
        feed.take(result, event)
        if event[0] in ("start", "result", "checks"):
            deadline = time.monotonic() + seconds
    worker.join()
    return None


def status_of(outcomes) -> str:
    """An exercise's status from the outcomes of its checks (see the module docstring)."""
    outcomes = set(outcomes)
    if not outcomes or FAILED in outcomes:
        return FAILING
    if SKIPPED in outcomes:
        return SKIPPED
    if outcomes == {PASSED}:
        return SOLVED
    if outcomes == {TODO}:
        return NOT_STARTED
    return IN_PROGRESS
