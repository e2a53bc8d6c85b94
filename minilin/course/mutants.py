"""Mutation testing of the exercise checks: how many slightly wrong solutions does each check reject?

    python -m minilin.course.mutants                 every CPU exercise (16, 17 too with --emulate-gpu or a GPU)
    python -m minilin.course.mutants 6 12 --show     two exercises, listing the mutants that survive
    python -m minilin.course.mutants --sample 3      three mutants per exercise, chosen by --seed
    python -m minilin.course.mutants --json out.json

A mutant is the worked solution with one small change inside one of its `# TODO:` ... `# END TODO` blocks
(the code a learner writes), made on the syntax tree and spliced back into the text:

    operator      a binary operator swapped (+ -, * /, ** *, @ *, // /, % //), a comparison made strict
                  or loose (< <=, > >=, == !=, is / is not)
    term          one operand of a + or - dropped
    sign          a unary minus dropped (-x -> x), a `not` dropped
    constant      an integer n -> n + 1 (and n - 1), a float c -> 2c, True <-> False, the output axes of an
                  einsum swapped ("bhij" -> "bhji")
    default       `x if cond else y` -> x, and -> y: for `scale = K ** -0.5 if scale is None else scale`, the
                  caller's scale ignored
    index         a subscript t -> t - 1 or t + 1, a slice bound b -> b + 1: the off-by-one token
    function      np.tril <-> np.triu, max <-> min, maximum <-> minimum, sum <-> mean, zeros <-> ones,
                  np.where(c, a, b) -> np.where(c, b, a)
    in place      `x = x + y` -> `x += y` (and the other operators): the caller's array changed
    statement     one assignment or expression statement replaced by `pass`: a step forgotten
    argument      two neighbouring positional arguments of a call swapped (einsum's operands, combine's)
    range         a bound of range(...) moved by one (b -> b - 1, b + 1)
    variable      a name read replaced by a look-alike of the same function: one that starts with the same
                  letter (k / kc, G / G_last, S / S0), or another of q, k, v
    kernel        in a GPU exercise's CUDA C++ string: an operator (+ -, * /, < <=, += -=, ...) or a number
                  changed, outside preprocessor lines

Each mutant runs against the exercise's check exactly as a learner's file would (minilin/course/runner.py,
in a child process with a time limit: a mutant that loops forever is rejected by the time limit). It is

    killed        the check fails
    survived      the check passes, and the mutant computes something else: a gap in the check
    equivalent    the check passes, and the mutant computes the same function as the solution (it is
                  not counted against the check)
    invalid       the mutant does not even import (not counted)

Equivalence is decided by replaying every call the check made on the solution (recorded by the guard),
and variants of those calls (array arguments scaled by random factors in [0.9, 1.1], [0.5, 1.0] and
[20, 40], which keeps signs, so gates stay <= 0, and the last of which finds answers that overflow where the
solution does not, such as a softmax without its max subtracted; a keyword the check passed left at its default; scale = 0.37 where
the check left it at its default; other floats times 1.3; chunk sizes 3 and 7), on the mutant
and on the solution (with NumPy's BLAS on one thread: many small products): the same results (to 1e-9 in
float64, 1e-5 in float32) and the same arguments afterwards on every one makes it equivalent. That is evidence, not proof; the report lists every
equivalent mutant so that a person can read them. The score of a check is killed / (killed + survived);
the table also counts the mutants killed by an error of their own (an exception, a time-out, a crash:
"(errors)"), and "compared" is the score among the others, the mutants that ran to the end: what the
comparisons and the guard catch.

tests/test_exercises.py runs a sample of mutants on every test run and the whole sweep when
MINILIN_MUTATION_SWEEP=1. A new exercise needs nothing here: its solution's TODO blocks are the sites.
"""
from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import re
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import runner
from .checks import gpu_status
from .guard import instrument
from .tree import DEFAULT_TIMEOUT, CourseError, load

KILLED, SURVIVED, EQUIVALENT, INVALID = "killed", "survived", "equivalent", "invalid"
MUTANT_TIMEOUT = 5.0          # seconds per check of a CPU exercise (most solutions need well under 0.2 s)

_BEGIN = re.compile(r"^[ \t]+# TODO: ")
_END = re.compile(r"^[ \t]+# END TODO\s*$")


@dataclass
class Mutant:
    number: int              # the exercise
    index: int               # its position in the exercise's list of mutants
    kind: str                # operator, term, sign, constant, default, index, function, in place, kernel
    line: int                # in the solution's file
    before: str
    after: str
    source: str              # the whole mutated file

    @property
    def label(self) -> str:
        return f"{self.number:02d}#{self.index} line {self.line} [{self.kind}] {self.before!r} -> {self.after!r}"


@dataclass
class Outcome:
    mutant: Mutant
    verdict: str
    why: str = ""            # the check's first failure, or how a survivor differs


# ---------------------------------------------------------------- making mutants

def todo_lines(source: str) -> list:
    """(first, last) line numbers (1-based, inclusive) of the code inside each TODO block."""
    blocks, begin = [], None
    for number, line in enumerate(source.splitlines(), 1):
        if _BEGIN.match(line):
            begin = number + 1
        elif _END.match(line) and begin is not None:
            blocks.append((begin, number - 1))
            begin = None
    return blocks


_BINARY = {ast.Add: [ast.Sub], ast.Sub: [ast.Add], ast.Mult: [ast.Div], ast.Div: [ast.Mult],
           ast.FloorDiv: [ast.Div], ast.Mod: [ast.FloorDiv], ast.Pow: [ast.Mult], ast.MatMult: [ast.Mult]}
_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**", ast.MatMult: "@"}
_FUNCTIONS = {"tril": "triu", "triu": "tril", "max": "min", "min": "max", "maximum": "minimum",
              "minimum": "maximum", "sum": "mean", "mean": "sum", "zeros": "ones", "ones": "zeros"}


def _expression_mutations(node):
    """(kind, new node) for each mutation of one expression node."""
    if isinstance(node, ast.BinOp):
        for op in _BINARY.get(type(node.op), []):
            yield "operator", ast.BinOp(node.left, op(), node.right)
        if isinstance(node.op, (ast.Add, ast.Sub)):
            yield "term", node.left
            yield "term", node.right if isinstance(node.op, ast.Add) else ast.UnaryOp(ast.USub(), node.right)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        yield "sign", node.operand
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        yield "operator", ast.Compare(node.left, [_COMPARE[type(node.ops[0])]()], node.comparators)
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            yield "constant", ast.Constant(not value)
        elif isinstance(value, int):
            yield "constant", ast.Constant(value + 1)
            if value > 0:
                yield "constant", ast.Constant(value - 1)
        elif isinstance(value, float):
            yield "constant", ast.Constant(2 * value if value else 1.0)
        elif isinstance(value, str) and "->" in value and re.fullmatch(r"[a-z,]+->[a-z]+", value):
            spec, out = value.split("->")
            if len(out) >= 2:
                yield "constant", ast.Constant(f"{spec}->{out[:-2]}{out[-1]}{out[-2]}")
    elif isinstance(node, ast.IfExp):
        yield "default", node.body
        yield "default", node.orelse
    elif isinstance(node, ast.Call):
        function = node.func
        if isinstance(function, ast.Attribute) and function.attr in _FUNCTIONS:
            yield "function", ast.Call(ast.Attribute(function.value, _FUNCTIONS[function.attr], ast.Load()),
                                       node.args, node.keywords)
        if isinstance(function, ast.Attribute) and function.attr == "where" and len(node.args) == 3:
            yield "function", ast.Call(function, [node.args[0], node.args[2], node.args[1]], node.keywords)


def _shifted(node, delta: int):
    return ast.BinOp(node, ast.Add() if delta > 0 else ast.Sub(), ast.Constant(abs(delta)))


def _index_mutations(subscript: ast.Subscript):
    """(kind, node, new node): a Name index moved by one; a slice bound moved by one."""
    elements = subscript.slice.elts if isinstance(subscript.slice, ast.Tuple) else [subscript.slice]
    for element in elements:
        if isinstance(element, ast.Name):
            yield "index", element, _shifted(element, -1)
            yield "index", element, _shifted(element, +1)
        elif isinstance(element, ast.Slice):
            for bound in (element.lower, element.upper):
                if bound is not None and not isinstance(bound, ast.Constant) and not (
                        isinstance(bound, ast.UnaryOp) and isinstance(bound.operand, ast.Constant)):
                    yield "index", bound, _shifted(bound, +1)


def _look_alikes(name: str, names) -> set:
    family = {"q", "k", "v"}
    alike = {other for other in names if other != name and other[:1] == name[:1] and other.isidentifier()}
    if name in family:
        alike |= family & set(names) - {name}
    return alike


class _Splicer:
    """Replaces the text of one node of `source` (AST positions are UTF-8 byte offsets)."""

    def __init__(self, source: str):
        self.lines = source.encode("utf-8").splitlines(keepends=True)

    def text(self, node) -> str:
        return self._span(node)[1].decode("utf-8")

    def _span(self, node):
        start = sum(len(line) for line in self.lines[:node.lineno - 1]) + node.col_offset
        end = sum(len(line) for line in self.lines[:node.end_lineno - 1]) + node.end_col_offset
        data = b"".join(self.lines)
        return (start, end), data[start:end]

    def replace(self, node, text: str) -> str:
        (start, end), _ = self._span(node)
        data = b"".join(self.lines)
        return (data[:start] + text.encode("utf-8") + data[end:]).decode("utf-8")


def _inside(node, blocks) -> bool:
    return any(first <= node.lineno and node.end_lineno <= last for first, last in blocks)


def python_mutants(source: str, number: int = 0) -> list:
    """Every mutant of the Python code inside the TODO blocks of `source` (see the module docstring)."""
    tree = ast.parse(source)
    blocks = todo_lines(source)
    splice = _Splicer(source)
    found, seen = [], set()

    def add(kind, node, text):
        before = splice.text(node)
        mutated = splice.replace(node, text)
        if mutated == source or mutated in seen:
            return
        try:
            ast.parse(mutated)
        except SyntaxError:
            return
        seen.add(mutated)
        found.append(Mutant(number, len(found), kind, node.lineno, before, text, mutated))

    stores = {id(n) for n in ast.walk(tree) if isinstance(getattr(n, "ctx", None), (ast.Store, ast.Del))}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        names = {a.arg for a in function.args.args + function.args.kwonlyargs}
        names |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names \
                    and _inside(node, blocks):
                for other in sorted(_look_alikes(node.id, names)):
                    add("variable", node, other)
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or not _inside(node, blocks):
            continue
        if isinstance(node, ast.expr) and id(node) not in stores:
            for kind, new in _expression_mutations(node):
                add(kind, node, f"({ast.unparse(new)})")
        if isinstance(node, ast.Subscript):
            for kind, target, new in _index_mutations(node):
                if _inside(target, blocks):
                    add(kind, target, f"({ast.unparse(new)})")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)) and not (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            add("statement", node, "pass")
        if isinstance(node, ast.Call):
            positional = [a for a in node.args if not isinstance(a, (ast.Starred, ast.Constant))]
            for first, second in zip(positional, positional[1:]):
                if ast.dump(first) != ast.dump(second) and node.args.index(second) == node.args.index(first) + 1:
                    swapped = copy.deepcopy(node)
                    i = node.args.index(first)
                    swapped.args[i], swapped.args[i + 1] = node.args[i + 1], node.args[i]
                    add("argument", node, f"({ast.unparse(swapped)})")
            if isinstance(node.func, ast.Name) and node.func.id == "range":
                for bound in node.args[:2]:
                    if not isinstance(bound, ast.Constant):
                        add("range", bound, f"({ast.unparse(_shifted(bound, -1))})")
                        add("range", bound, f"({ast.unparse(_shifted(bound, +1))})")
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.BinOp) and isinstance(node.value.left, ast.Name)
                and node.value.left.id == node.targets[0].id and type(node.value.op) in _SYMBOL):
            name = node.targets[0].id
            add("in place", node, f"{name} {_SYMBOL[type(node.value.op)]}= {ast.unparse(node.value.right)}")
    return sorted(found, key=lambda m: (m.line, m.index))


_CXX_TOKEN = re.compile(r"\+=|-=|\*=|<=|>=|==|!=|<<|>>|\+\+|--|->|&&|\|\||[-+*/<>]|\b\d+\.\d*f?\b|\b\d+\b")
_CXX_SWAP = {"+": "-", "-": "+", "*": "/", "/": "*", "<": "<=", "<=": "<", ">": ">=", ">=": ">", "+=": "-=",
             "-=": "+=", "*=": "+=", "==": "!=", "!=": "=="}


def kernel_mutants(source: str, number: int = 0, start: int = 0) -> list:
    """Mutants of the CUDA C++ inside the string constants of the TODO blocks: one operator or one number
    changed, outside preprocessor lines and comments."""
    tree = ast.parse(source)
    blocks = todo_lines(source)
    splice = _Splicer(source)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value
                and _inside(node, blocks)):
            continue
        code = node.value
        offset = 0
        for line_number, line in enumerate(code.splitlines(keepends=True)):
            text = line.split("//")[0]
            if text.lstrip().startswith("#") or "__global__" in text or not text.strip():
                offset += len(line)
                continue
            for match in _CXX_TOKEN.finditer(text):
                token = match.group(0)
                if token in _CXX_SWAP:
                    if token == "*" and not (text[match.start() - 1:match.start()] == " " and
                                             text[match.end():match.end() + 1] == " "):
                        continue          # a pointer declaration or a dereference, not a product
                    if token == "-" and text[match.end():match.end() + 1] != " ":
                        continue          # a unary minus
                    replacements = [_CXX_SWAP[token]]
                elif token[0].isdigit():
                    if "." in token:
                        value = float(token.rstrip("f"))
                        replacements = [f"{2 * value if value else 1.0}f"]
                    else:
                        replacements = [str(int(token) + 1)] + ([str(int(token) - 1)] if int(token) > 0 else [])
                else:
                    continue
                for new in replacements:
                    at = offset + match.start()
                    mutated_code = code[:at] + new + code[at + len(token):]
                    mutated = splice.replace(node, _raw_string(mutated_code))
                    found.append(Mutant(number, start + len(found), "kernel",
                                        node.lineno + code[:at].count("\n"),
                                        line.strip(), (text[:match.start()] + new + text[match.end():]).strip(),
                                        mutated))
            offset += len(line)
    return found


def _raw_string(text: str) -> str:
    if '"""' in text or text.endswith("\\"):
        return repr(text)
    return 'r"""' + text + '"""'


def mutants(ex, root=None) -> list:
    """Every mutant of exercise `ex`'s worked solution, numbered from 0."""
    source = ex.path("solutions").read_text(encoding="utf-8")
    found = python_mutants(source, ex.number)
    found += kernel_mutants(source, ex.number, start=len(found))
    for i, m in enumerate(found):
        m.index = i
    return found


def sample(found: list, count: int, seed: int = 0) -> list:
    """`count` mutants of one exercise, the same ones for the same seed."""
    if count >= len(found):
        return list(found)
    return sorted(random.Random(seed).sample(found, count), key=lambda m: m.index)


# ---------------------------------------------------------------- running them

class Recording:
    """The calls a check makes on the solution, kept to replay them on a mutant (see the module docstring)."""

    def __init__(self, ex, gpu=None):
        self.exercise = ex
        module = runner.load_module(ex.path("solutions"), prefix="minilin_solution")
        guard = instrument(module, allow=ex.allow, record=True)
        result = runner.run(ex, module=module, tree="solutions", gpu=gpu, isolation="none")
        if result.status != runner.SOLVED:
            raise CourseError(f"{ex.relpath('solutions')} does not pass its own check: "
                              + (result.first_problem.message if result.first_problem else result.message))
        self.calls = [call for call in guard.calls if call.error is None]
        self.solution = {name: getattr(f, "__minilin_original__", f) for name, f in vars(module).items()
                         if callable(f) and hasattr(f, "__minilin_original__")}


def _variants(call, rng, function):
    """The recorded call and its variants: (description, args, kwargs). Keyword parameters the check left
    at their default are varied too: scale (0.37), a float (times 1.3), chunk_size (3 and 7)."""
    yield "as the check called it", call.args, call.kwargs
    scaled = []
    for low, high in ((0.9, 1.1), (0.5, 1.0), (20.0, 40.0)):
        def vary(x):
            if isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.size:
                scaled.append(True)
                return x * rng.uniform(low, high, x.shape).astype(x.dtype)
            if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
                return type(x)(vary(y) for y in x)
            if isinstance(x, dict):
                return {key: vary(y) for key, y in x.items()}
            return x
        varied = vary(call.args)
        if not scaled:
            break         # no float array among the arguments: the same call again would tell nothing new
        yield f"with the arrays scaled by [{low}, {high}]", varied, call.kwargs
    import inspect

    parameters = inspect.signature(function).parameters
    positional = [p.name for p in parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = set(call.kwargs) | set(positional[:len(call.args)])
    for name, parameter in parameters.items():
        if name in call.kwargs and parameter.default is not parameter.empty:
            yield f"with {name} left at its default", call.args, {k: v for k, v in call.kwargs.items() if k != name}
        value = call.kwargs.get(name, parameter.default)
        if name == "scale" and value is None:
            tries = [0.37]
        elif isinstance(value, float):
            tries = [value * 1.3]
        elif name == "chunk_size" and isinstance(value, int):
            tries = [3, 7]
        else:
            continue
        if name not in call.kwargs and name in given:
            continue          # passed by position: left alone
        for new in tries:
            yield f"with {name}={new:g}", call.args, {**call.kwargs, name: new}


@dataclass(frozen=True)
class _Raised:
    error: str


def _same(a, b) -> bool:
    from ..backend import to_numpy

    if hasattr(a, "_fields") or isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        if not (hasattr(b, "shape") and hasattr(b, "dtype")):
            return False
        a, b = np.asarray(to_numpy(a)), np.asarray(to_numpy(b))
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind not in "fc":
            return bool(np.array_equal(a, b))
        rtol = 1e-5 if a.dtype == np.float32 else 1e-9
        finite = np.isfinite(a)
        if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite], equal_nan=True):
            return False
        size = float(np.max(np.abs(a[finite]), initial=0.0))
        return bool(np.all(np.abs(a[finite] - b[finite]) <= rtol * max(size, 1e-300)))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(b, (int, float)) and (a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b)))
    if isinstance(a, (int, str, bytes, type(None))) or isinstance(b, (int, str, bytes, type(None))):
        return type(a) is type(b) and a == b
    return True          # another object (a feature map passed in): not the function's result


def differs(recording: Recording, module) -> str | None:
    """How the mutant `module` differs from the solution on the recorded calls and their variants, or None."""
    rng = np.random.default_rng(0)
    for call in recording.calls:
        mutant_function = getattr(module, call.name, None)
        mutant_function = getattr(mutant_function, "__minilin_original__", mutant_function)
        original = recording.solution[call.name]
        for how, args, kwargs in _variants(call, rng, original):
            results = []
            for function in (original, mutant_function):
                a, k = copy.deepcopy(args), copy.deepcopy(kwargs)
                try:
                    with np.errstate(all="ignore"):
                        value = function(*a, **k)
                except Exception as error:
                    value = _Raised(type(error).__name__)
                results.append((value, a, k))
            (v1, a1, k1), (v2, a2, k2) = results
            if isinstance(v1, _Raised):
                continue          # a variant the solution itself refuses tells nothing
            if isinstance(v1, str) and "__global__" in v1:
                break             # CUDA C++ source: its text may differ; what it computes is judged by the launcher
            if not _same(v1, v2):
                return f"{call.name}() {how} returns something else"
            if not (_same(list(a1), list(a2)) and _same(k1, k2)):
                return f"{call.name}() {how} changes its arguments differently"
    return None


def _judge(m: Mutant, ex, recording, gpu, timeout: float, folder: Path) -> Outcome:
    """The verdict on one mutant. `recording`: a function giving the Recording of the solution's check (made
    once, when a first mutant survives)."""
    path = folder / ex.folder / ex.file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(m.source, encoding="utf-8")
    try:
        module = runner.load_module(path, prefix="minilin_mutant")
    except Exception as error:
        return Outcome(m, INVALID, f"{type(error).__name__}: {error}")
    try:
        if ex.gpu and not runner.cuda_started_here() and "cupy" not in sys.modules:
            # A real GPU: this process must not start CUDA (its children could not use the GPU), so the
            # checks, the solution's recording and the replay all run in one child of their own.
            ok, verdict = _in_child(lambda: _verdict_here(ex, module, gpu), timeout * 12)
            if not ok:
                return Outcome(m, KILLED, verdict)
            return Outcome(m, *verdict)
        result = runner.run(ex, module=module, stop_at_first_failure=True, gpu=gpu, timeout=timeout)
        if result.status != runner.SOLVED:
            return Outcome(m, KILLED, _first_line(result))
        made = recording()      # here, not in the child: made once for all the mutants
        ok, how = _in_child(lambda: _replay(made, module), timeout * 4)
        how = how if ok else how or "the replay failed"
        return Outcome(m, SURVIVED, how) if how else Outcome(m, EQUIVALENT)
    finally:
        sys.modules.pop(module.__name__, None)


def _replay(made, module):
    """`differs` with NumPy's BLAS on one thread: the replays make many small products (exercise 22 trains a
    model in them), where more threads mostly wait on each other; the solution and the mutant run alike."""
    from .checks import blas_threads

    with blas_threads(1):
        return differs(made, module)


def _first_line(result) -> str:
    problem = result.first_problem
    return (problem.message if problem else result.message).splitlines()[0][:200]


def _verdict_here(ex, module, gpu):
    result = runner.run(ex, module=module, stop_at_first_failure=True, gpu=gpu, isolation="none")
    if result.status != runner.SOLVED:
        return KILLED, _first_line(result)
    how = differs(Recording(ex, gpu=gpu), module)
    return (SURVIVED, how) if how else (EQUIVALENT, "")


def _in_child(work, seconds: float):
    """(True, work()) from a forked child (a mutant may loop forever or crash), or (False, what went
    wrong): a time-out or a crash."""
    if not hasattr(os, "fork"):
        return True, work()
    import multiprocessing
    import signal

    reader, writer = multiprocessing.Pipe(duplex=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # see runner._in_child
        pid = os.fork()
    if pid == 0:
        try:
            reader.close()
            writer.send((True, work()))
        except BaseException as error:
            try:
                writer.send((False, f"the replay raised {type(error).__name__}: {error}"[:200]))
            except BaseException:
                pass
        finally:
            os._exit(0)
    writer.close()
    try:
        if reader.poll(seconds):
            try:
                return reader.recv()
            except EOFError:
                return False, "the mutant crashed Python"
        return False, f"timed out after {seconds:g} s"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        reader.close()


def sweep(ex, chosen=None, *, gpu=None, timeout=None, progress=None) -> list:
    """Judge the mutants `chosen` (default: all) of exercise `ex`; a list of Outcome."""
    chosen = mutants(ex) if chosen is None else chosen
    # GPU exercises compile their kernel first; an exercise that sets its own `timeout` (exercise 22 trains a
    # model) gets that; the others MUTANT_TIMEOUT.
    timeout = timeout or (max(ex.timeout, 60.0) if ex.gpu else
                          MUTANT_TIMEOUT if ex.timeout == DEFAULT_TIMEOUT else ex.timeout)
    made = []

    def recording():
        if not made:
            made.append(Recording(ex, gpu=gpu))
        return made[0]

    outcomes = []
    with tempfile.TemporaryDirectory(prefix="minilin-mutants-") as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a mutant dividing by zero says so; the verdict is what counts
        for m in chosen:
            outcome = _judge(m, ex, recording, gpu, timeout, Path(folder))
            outcomes.append(outcome)
            if progress:
                progress(outcome)
    return outcomes


_ERROR = re.compile(r"^(\w+(Error|Exception)\b|check timed out|the check stopped Python|timed out|the mutant crashed)")


def by_error(outcome) -> bool:
    """A mutant killed because its own code raised, hung or crashed, not because a comparison failed."""
    return outcome.verdict == KILLED and bool(_ERROR.match(outcome.why))


def score(outcomes) -> dict:
    """Counts of each verdict; "errors": the killed ones that raised, hung or crashed; "score": killed /
    (killed + survived); "compared": the same among the mutants that ran to the end (killed by a comparison
    or a guard, or survived), a stricter measure of what the comparisons catch."""
    counts = {verdict: sum(o.verdict == verdict for o in outcomes) for verdict in (KILLED, SURVIVED, EQUIVALENT, INVALID)}
    counts["errors"] = sum(by_error(o) for o in outcomes)
    judged = counts[KILLED] + counts[SURVIVED]
    counts["score"] = counts[KILLED] / judged if judged else 1.0
    ran = judged - counts["errors"]
    counts["compared"] = (counts[KILLED] - counts["errors"]) / ran if ran else 1.0
    return counts


def _row(name, count, c) -> str:
    return (f"{name:<32} {count:>7} {c[KILLED]:>6} {'(' + str(c['errors']) + ')':>8} {c[SURVIVED]:>8} "
            f"{c[EQUIVALENT]:>6} {c[INVALID]:>7} {100 * c['score']:>6.1f}% {100 * c['compared']:>7.1f}%")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minilin.course.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("numbers", nargs="*", metavar="N", help="exercises (default: all that can run here)")
    parser.add_argument("--sample", type=int, metavar="K", help="only K mutants per exercise")
    parser.add_argument("--seed", type=int, default=0, help="which sample (default 0)")
    parser.add_argument("--show", action="store_true", help="list the surviving and the equivalent mutants")
    parser.add_argument("--json", metavar="PATH", help="write every outcome to PATH")
    parser.add_argument("--emulate-gpu", action="store_true",
                        help="run the GPU exercises' mutants on the CPU emulation of CuPy (needs g++)")
    parser.add_argument("--timeout", type=float, help="seconds per check of a mutant")
    parser.add_argument("--root", help="the minilin clone (default: found from the current directory)")
    args = parser.parse_args(argv)
    try:
        exercises = load(args.root) if args.root else load()
        chosen = [exercises[int(n) - 1] for n in args.numbers] if args.numbers else exercises
    except (CourseError, ValueError, IndexError) as error:
        print(f"mutants: {error}", file=sys.stderr)
        return 2
    gpu = None
    if any(ex.gpu for ex in chosen):
        if args.emulate_gpu:
            from .emulated_cupy import EMULATED, GXX, fake_cupy

            if GXX is None:
                print("mutants: --emulate-gpu needs g++", file=sys.stderr)
                return 2
            sys.modules["cupy"] = fake_cupy(Path(tempfile.mkdtemp(prefix="minilin-emulated-")))
            gpu = EMULATED
        else:
            gpu = gpu_status()
            if not gpu[0]:
                skipped = [ex for ex in chosen if ex.gpu]
                print(f"(skipping {', '.join(f'{ex.number:02d}' for ex in skipped)}: {gpu[1]}; --emulate-gpu "
                      "runs them on the CPU)")
                chosen = [ex for ex in chosen if not ex.gpu]
    report, everything = [], []
    began = time.perf_counter()
    print(f"{'exercise':<32} {'mutants':>7} {'killed':>6} {'(errors)':>8} {'survived':>8} {'equiv.':>6} {'invalid':>7} "
          f"{'score':>7} {'compared':>8}")
    for ex in chosen:
        found = mutants(ex)
        picked = sample(found, args.sample, args.seed) if args.sample else found
        outcomes = sweep(ex, picked, gpu=gpu, timeout=args.timeout)
        counts = score(outcomes)
        report.append((ex, counts))
        everything += outcomes
        print(_row(ex.folder, len(outcomes), counts), flush=True)
        if args.show:
            for o in outcomes:
                if o.verdict in (SURVIVED, EQUIVALENT):
                    print(f"    {o.verdict:<10} {o.mutant.label}" + (f"\n               {o.why}" if o.why else ""))
    total = score(everything)
    print(_row("all", len(everything), total) + f"   ({time.perf_counter() - began:.0f} s)")
    if args.json:
        data = [dict(asdict(o.mutant), verdict=o.verdict, why=o.why, by_error=by_error(o)) for o in everything]
        for d in data:
            d.pop("source")
        Path(args.json).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
