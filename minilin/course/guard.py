"""What happens around every call a check makes into the learner's file, written once for every exercise.

`instrument(module, allow=...)` replaces each public function of the learner's module with a wrapper. When a
check calls one (a call from the check, not one learner function calling another), the wrapper

1. remembers its name, so that a failure can be blamed on the function that failed (and its hint shown);
2. copies every array argument (also inside lists, tuples and dicts) and afterwards compares: an argument
   changed in place fails the call, naming the argument ("changed its argument initial_state in place");
3. watches, with `sys.setprofile`, every function that the learner's own code calls directly: a function
   of minilin (the reference the check compares against, its engines, its chunked helpers) fails the call,
   unless the exercise's `allow` list names its module. The check itself calls the reference freely: only
   calls whose caller is a line of the learner's file count, so `from minilin.mixers.deltanet import
   recurrent`, `deltanet.recurrent(...)` and `importlib.import_module(...)` are all caught, while an allowed
   minilin function (exercise 15's mixers) may use the rest of minilin inside. A function the check passes
   in as an argument (exercise 03's feature map phi) may be called, whichever module it comes from.

With `record=True` the wrapper also keeps the arguments of every call (for the mutation tool, which replays
a check's calls on a mutant and on the solution to tell equivalent mutants from surviving ones).

The same wrapper serves `minilin check` (minilin/course/runner.py) and `pytest exercises`
(exercises/conftest.py), so a new exercise gets all of this without writing anything.
"""
from __future__ import annotations

import copy
import functools
import inspect
import sys
from dataclasses import dataclass, field

import numpy as np

from .checks import CheckFailure


WATCHED = "minilin."   # calls from the learner's file into modules named so are refused (unless allowed)
COURSE = "minilin.course"


@dataclass
class Call:
    """One call a check made: the function's name, copies of its arguments, and the result (or error)."""

    name: str
    args: tuple
    kwargs: dict
    result: object = None
    error: BaseException | None = None


@dataclass
class Guard:
    """The state of one instrumented module (see the module docstring)."""

    module_name: str
    path: str                              # the learner's file: calls from its lines are watched
    allow: tuple = ()
    last_called: str | None = None         # the function the check called last, for hints
    record: bool = False
    calls: list = field(default_factory=list)
    depth: int = 0
    violation: str | None = None
    on_call: object = None                 # called with the function's name as a check calls it (the runner
                                           # passes it on, so that a time-out can name the running function)

    def forget(self) -> None:
        self.last_called, self.violation = None, None


def _is_array(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "copy") and not isinstance(x, np.generic)


def _arrays(value, where: str):
    """(where, array) for every array inside `value`: an argument, or lists / tuples / dicts of them."""
    if _is_array(value):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _arrays(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _arrays(item, f"{where}[{i}]")


def _changed(before, after) -> int:
    """How many elements differ (NaN equal to NaN); works for NumPy and CuPy arrays."""
    from ..backend import to_numpy

    a, b = np.asarray(to_numpy(before)), np.asarray(to_numpy(after))
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.size, b.size, 1)
    same = (a == b) | ((a != a) & (b != b)) if a.dtype.kind in "fc" else (a == b)
    return int(np.size(same) - np.count_nonzero(same))


def _allowed(module: str, allow) -> bool:
    return any(module == name or module.startswith(name + ".") for name in allow)


def _code_of(function):
    """The code object that runs when `function` (a function, a method, or an object with __call__) is called."""
    target = getattr(function, "__func__", function)
    code = getattr(target, "__code__", None)
    if code is None:
        call = getattr(type(function), "__call__", None)
        code = getattr(getattr(call, "__func__", call), "__code__", None)
    return code


def instrument(module, *, allow=(), record: bool = False) -> Guard:
    """Wrap the public functions of the learner's `module` in place (see the module docstring); returns the
    Guard that holds what the wrappers saw. Calling it twice on one module does nothing more."""
    existing = getattr(module, "__minilin_guard__", None)
    if existing is not None:
        existing.record = existing.record or record
        return existing
    guard = Guard(module.__name__, str(getattr(module, "__file__", "")), tuple(allow), record=record)
    for name, function in list(vars(module).items()):
        if name.startswith("_") or not inspect.isfunction(function) or function.__module__ != module.__name__:
            continue
        setattr(module, name, _wrap(function, guard))
    module.__minilin_guard__ = guard
    return guard


def _wrap(function, guard: Guard):
    name = function.__name__
    parameters = list(inspect.signature(function).parameters)

    given = set()   # the code of the callables the check passed in (a feature map phi): those may be called

    def profile(frame, event, arg):
        if event != "call" or guard.violation is not None:
            return
        caller = frame.f_back
        if caller is None or caller.f_code.co_filename != guard.path:
            return
        called = frame.f_globals.get("__name__", "")
        if (called.startswith(WATCHED) and not called.startswith(COURSE) and not _allowed(called, guard.allow)
                and frame.f_code not in given):
            guard.violation = (f"{name}() calls {called}.{frame.f_code.co_name} (line {caller.f_lineno} of your "
                               f"file): minilin's own code is what the check compares against. Write it "
                               f"yourself with NumPy" + (f" (of minilin, your file may call {', '.join(guard.allow)})"
                                                         if guard.allow else ""))

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        __tracebackhide__ = True
        if guard.depth > 0:  # one learner function calling another: nothing to watch twice
            return function(*args, **kwargs)
        guard.last_called, guard.violation = name, None
        if guard.on_call is not None:
            guard.on_call(name)
        named = list(zip(parameters, args)) + list(kwargs.items())
        before = [(where, x, x.copy()) for argument, value in named for where, x in _arrays(value, argument)]
        call = Call(name, copy.deepcopy(args), copy.deepcopy(kwargs)) if guard.record else None
        given.clear()
        given.update(_code_of(value) for _, value in named if callable(value))
        previous = sys.getprofile()
        guard.depth += 1
        sys.setprofile(profile)
        try:
            result = function(*args, **kwargs)
        except BaseException as error:
            if call is not None:
                call.error = error
                guard.calls.append(call)
            if guard.violation is not None:
                raise CheckFailure(guard.violation) from error
            raise
        finally:
            sys.setprofile(previous)
            guard.depth -= 1
        if call is not None:
            call.result = result
            guard.calls.append(call)
        if guard.violation is not None:
            raise CheckFailure(guard.violation)
        for where, x, original in before:
            changed = _changed(original, x)
            if changed:
                raise CheckFailure(
                    f"{name}() changed its argument {where} in place ({changed} of {x.size} values): the caller's "
                    f"array must come back as it was given. Work on a new array (x = x * c, not x *= c; "
                    f"x = x.copy() before writing into it)")
        return result

    wrapper.__minilin_original__ = function
    return wrapper
