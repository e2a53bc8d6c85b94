"""pytest for the exercises: `pytest exercises` checks your files, `pytest exercises --solutions` the worked
solutions. The checks themselves are the test_*.py next to each exercise; the course code is in
minilin/course/. What this file adds to plain pytest:

- the `learner` fixture: the exercise's file (yours, or the solution's with --solutions), freshly imported,
  its functions watched as `minilin check` watches them (minilin/course/guard.py: arguments changed in place,
  calls into minilin's own code);
- a time limit per check (the exercise's `timeout`; POSIX, through SIGALRM): an endless loop fails with
  "check timed out after N s" instead of hanging the run;
- a function still raising NotImplementedError counts as TODO: one short line, never a traceback;
- GPU exercises skip, with the reason, where CuPy sees no GPU (and are never counted as solved);
- tests run in the order of exercises/exercises.toml, and a summary closes the run:
  `5/23 solved, 30/297 points; next: 06 RetNet, exercises/06_retnet/retnet.py`.
"""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from minilin.course import runner, tree
from minilin.course.checks import CheckFailure, gpu_status
from minilin.course.guard import instrument
from minilin.course.commands import summary_line

EXERCISES = tree.load(Path(__file__).resolve().parent.parent)
_results: dict = {}   # exercise number -> list of outcomes, in the order the checks ran
_checks: dict = {}    # exercise number -> the names of all its checks (whatever -k, --lf or a node id selects)
_ran: dict = {}       # exercise number -> the names of the checks that ran
_gpu = []             # gpu_status(), asked once


def pytest_addoption(parser):
    parser.addoption("--solutions", action="store_true",
                     help="run the exercise checks against the worked solutions in solutions/ instead of exercises/")


def pytest_configure(config):
    if config.getoption("tbstyle", "auto") == "auto":
        config.option.tbstyle = "short"  # the checks explain themselves; the line that failed is enough


def _tree(config) -> str:
    return "solutions" if config.getoption("--solutions") else "exercises"


def _exercise(item_or_report):
    path = getattr(item_or_report, "path", None) or Path(str(item_or_report.fspath))
    return tree.exercise_of(path, EXERCISES)


@pytest.fixture
def learner(request):
    """The learner's module for this exercise (solutions/ with --solutions), imported afresh."""
    ex = _exercise(request.node)
    if ex is None:
        pytest.fail(f"{request.path.parent.name} is not an exercise folder listed in exercises/exercises.toml",
                    pytrace=False)
    if ex.gpu:
        if not _gpu:
            _gpu.append(gpu_status())
        ok, reason = _gpu[0]
        if not ok:
            pytest.skip(f"exercise {ex.number:02d} {reason}")
    module = runner.load_module(ex.path(_tree(request.config)))
    instrument(module, allow=ex.allow)
    return module


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """The check's time limit: SIGALRM interrupts the learner's endless loop with a CheckFailure."""
    module = item.funcargs.get("learner") if hasattr(item, "funcargs") else None
    ex = _exercise(item)
    if module is None or ex is None or not hasattr(signal, "setitimer") or \
            threading.current_thread() is not threading.main_thread():
        yield
        return
    seconds = runner.time_limit(ex)
    guard = module.__minilin_guard__

    def alarm(signum, frame):
        raise CheckFailure(runner.timed_out_message(seconds, guard.last_called))

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pytest_collection_modifyitems(session, config, items):
    """Exercise order, then the order the checks are written in; and each exercise's whole set of checks, so that
    a run of some of them (-k, --lf, a node id) does not call the exercise solved."""
    for item in items:
        ex = _exercise(item)
        if ex is not None and ex.number not in _checks:
            _checks[ex.number] = {f.__name__ for f in runner.check_functions(item.module)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: ((_exercise(item).number if _exercise(item) else 0), order[id(item)]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    module = item.funcargs.get("learner") if hasattr(item, "funcargs") else None
    if call.when != "call" or call.excinfo is None or module is None:
        return
    todo = runner.todo_function(call.excinfo.value, Path(module.__file__))
    if todo:
        ex = _exercise(item)
        report.minilin_todo = todo
        report.longrepr = f"{ex.relpath(_tree(item.config))}: {todo}() is not written yet (minilin hint {ex.number})"


def pytest_report_teststatus(report, config):
    if report.when == "call" and getattr(report, "minilin_todo", None):
        return "todo", "T", ("TODO", {"yellow": True})
    return None


def pytest_runtest_logreport(report):
    ex = _exercise(report)
    if ex is None:
        return
    outcomes = _results.setdefault(ex.number, [])
    if report.when == "call" or report.skipped:
        _ran.setdefault(ex.number, set()).add(report.nodeid.split("::")[-1].split("[")[0])
    if report.when == "call":
        outcomes.append(runner.TODO if getattr(report, "minilin_todo", None) else report.outcome)
    elif report.skipped:
        outcomes.append(runner.SKIPPED)
    elif report.failed:  # an error in setup (the file does not import) or teardown
        outcomes.append(runner.FAILED)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    yield  # pytest's own summaries (failures, the short summary) first: the exercises' table comes last
    if not _results:
        return
    which = _tree(config)
    results = []
    partial = {}  # exercise number -> (checks run, checks it has), where its checks all passed but some did not run
    for ex in EXERCISES:
        if ex.number in _results:
            status = runner.status_of(_results[ex.number])
            ran, every = _ran.get(ex.number, set()), _checks.get(ex.number, set())
            if status == runner.SOLVED and not every <= ran:
                status, partial[ex.number] = runner.IN_PROGRESS, (len(ran & every), len(every))
            results.append(runner.ExerciseResult(ex, status=status))
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", f"minilin exercises ({which}/)")
    width = max(len(r.exercise.title) for r in results)
    for r in results:
        ex = r.exercise
        line = f"{ex.number:02d} {ex.title:<{width}}  {ex.points if r.status == runner.SOLVED else 0:>2}/{ex.points:<2}  "
        if ex.number in partial:
            line += (f"partial: {partial[ex.number][0]} of its {partial[ex.number][1]} checks ran and passed "
                     f"(minilin check {ex.number} runs them all)")
        elif r.status == runner.NOT_STARTED:
            line += f"not started: open {ex.relpath(which)} (minilin hint {ex.number})"
        elif r.status == runner.IN_PROGRESS:
            line += f"in progress: functions still TODO in {ex.relpath(which)} (minilin hint {ex.number})"
        elif r.status == runner.FAILING:
            line += f"failing: see the failure above (minilin check {ex.number}; minilin hint {ex.number})"
        elif r.status == runner.SKIPPED:
            line += f"skipped: {_gpu[0][1] if _gpu else 'needs a GPU'}"
        else:
            line += r.status
        markup = {runner.SOLVED: {"green": True}, runner.FAILING: {"red": True},
                  runner.SKIPPED: {"cyan": True}}.get(r.status, {})
        write(line, **markup)
    ran = [r.exercise for r in results]
    if len(ran) == len(EXERCISES):
        write(summary_line(results, EXERCISES), bold=True)
    else:
        write(summary_line(results, ran, whole_course=False) + f"   (ran {len(ran)} of {len(EXERCISES)} exercises; "
              "`minilin status` checks them all)", bold=True)
