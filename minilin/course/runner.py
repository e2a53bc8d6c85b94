"""Run an exercise's check without pytest: `minilin check`, `status` and `watch` use this, and so does the
proof in tests/test_exercises.py. `pytest exercises` runs the very same test functions through
exercises/conftest.py.

An exercise's check is its test_*.py: plain functions `test_<what>(learner)` that receive the learner's
module and raise `CheckFailure` (or any exception) when something is wrong.

Outcomes of one check: passed, todo (the learner's file still raises NotImplementedError), failed, skipped
(a GPU exercise where CuPy sees no GPU). Status of an exercise, from its checks:
    solved       every check passed
    not started  every check hit a NotImplementedError still in the learner's file
    in progress  no check failed, but some still hit a NotImplementedError
    failing      a check failed, or the file does not import
    skipped      a GPU exercise on a machine without a usable GPU (never counted as solved)
"""
from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .checks import CheckFailure, gpu_status
from .tree import Exercise

PASSED, TODO, FAILED, SKIPPED = "passed", "todo", "failed", "skipped"
SOLVED, NOT_STARTED, IN_PROGRESS, FAILING = "solved", "not started", "in progress", "failing"

_counter = itertools.count()


@dataclass
class CheckResult:
    name: str
    outcome: str
    message: str = ""
    todo: str = ""             # the learner function still raising NotImplementedError, for a todo check


@dataclass
class ExerciseResult:
    exercise: Exercise
    checks: list = field(default_factory=list)
    status: str = FAILING
    message: str = ""          # why, when the exercise could not be run at all (import error, no GPU)

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


def run(exercise: Exercise, *, tree: str = "exercises", module=None, stop_at_first_failure: bool = False,
        gpu=None) -> ExerciseResult:
    """Run every check of `exercise` against the learner's file in `tree` ("exercises" or "solutions"),
    or against `module` when given (an already loaded module, e.g. a modified copy)."""
    result = ExerciseResult(exercise)
    learner_path = exercise.path(tree)
    test_path = exercise.test_path()
    if exercise.gpu:
        ok, reason = gpu if gpu is not None else gpu_status()
        if not ok:
            result.status, result.message = SKIPPED, reason
            return result
    if module is None:
        try:
            module = load_module(learner_path)
        except FileNotFoundError:
            result.message = f"{exercise.relpath(tree)} does not exist (minilin reset {exercise.number} restores it)"
            return result
        except Exception as error:
            result.message = f"{exercise.relpath(tree)} does not import:\n" + "".join(
                traceback.format_exception_only(type(error), error)).rstrip()
            return result
    try:
        checks = load_module(test_path, prefix="minilin_check")
    except Exception as error:  # the check itself is broken: say so instead of crashing
        result.message = f"the check {test_path.name} does not import (a bug in the course, not in your file):\n" + \
            "".join(traceback.format_exception_only(type(error), error)).rstrip()
        sys.modules.pop(module.__name__, None)
        return result
    for function in check_functions(checks):
        try:
            function(module)
        except Exception as error:  # a failed check, or the learner's code raising
            todo = todo_function(error, Path(module.__file__))
            if todo:
                outcome, message = TODO, f"{todo}() still raises NotImplementedError: {error}"
            else:
                outcome, message = FAILED, explain(error, Path(module.__file__), test_path)
            result.checks.append(CheckResult(function.__name__, outcome, message, todo or ""))
            if stop_at_first_failure and outcome == FAILED:
                break
        else:
            result.checks.append(CheckResult(function.__name__, PASSED))
    sys.modules.pop(checks.__name__, None)
    sys.modules.pop(module.__name__, None)
    if not result.checks:
        result.message = f"{test_path.name} has no test_* functions"
    result.status = status_of([c.outcome for c in result.checks])
    return result


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
