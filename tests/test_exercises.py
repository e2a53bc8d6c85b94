"""The exercises prove themselves: every untouched stub fails its check, every worked solution passes it,
and every check rejects a solution with any one returned value changed by a millionth.

Also: the list (exercises/exercises.toml) and the folders agree; each exercise has a title, points and
1-3 hints; each stub is exactly its solution with the marked blocks replaced (minilin/course/stubs.py),
with the same signatures; solutions do not import the reference they are checked against; and the CUDA
C++ of the GPU solutions compiles with nvcc where nvcc exists. The checks run in-process through
minilin.course.runner, the same code `minilin check` uses; `pytest exercises` runs the same test
functions through exercises/conftest.py.
"""
from __future__ import annotations

import ast
import inspect
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from minilin.course import runner, stubs, tree
from minilin.course.checks import gpu_status
from minilin.course.emulated_cupy import EMULATED, GXX, fake_cupy

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = tree.load(ROOT)
CPU = [ex for ex in EXERCISES if not ex.gpu]
GPU = [ex for ex in EXERCISES if ex.gpu]
HAVE_GPU = gpu_status()
ids = [ex.folder for ex in EXERCISES]


def public_functions(module) -> dict:
    return {name: f for name, f in vars(module).items()
            if inspect.isfunction(f) and f.__module__ == module.__name__ and not name.startswith("_")}


# ---------------------------------------------------------------- the list and the folders

def test_list_matches_the_folders():
    for top in ("exercises", "solutions"):
        folders = sorted(p.name for p in (ROOT / top).iterdir() if p.is_dir() and re.match(r"\d\d_", p.name))
        assert folders == [ex.folder for ex in EXERCISES], (
            f"{top}/ holds {folders}, but exercises/exercises.toml lists {[ex.folder for ex in EXERCISES]}")


@pytest.mark.parametrize("ex", EXERCISES, ids=ids)
def test_folders_hold_the_file_and_its_check_only(ex):
    names = {p.name for p in (ROOT / "exercises" / ex.folder).iterdir() if p.name != "__pycache__"}
    assert names == {ex.file, f"test_{ex.folder}.py"}, names
    names = {p.name for p in (ROOT / "solutions" / ex.folder).iterdir() if p.name != "__pycache__"}
    assert names == {ex.file}, names


@pytest.mark.parametrize("ex", EXERCISES, ids=ids)
def test_exercise_is_complete(ex):
    assert ex.title.strip() and ex.slug.strip()
    assert isinstance(ex.points, int) and ex.points > 0
    assert 1 <= len(ex.hints) <= 3 and all(h.strip() for h in ex.hints), f"{ex.folder}: give 1 to 3 hints"
    assert ex.path("exercises").is_file(), f"missing {ex.relpath()}"
    assert ex.path("solutions").is_file(), f"missing {ex.relpath('solutions')}"
    assert ex.test_path().is_file()
    assert ex.reference, f"{ex.folder}: name the minilin module(s) its check compares against"


def test_points_grow_with_difficulty():
    """The four parts of the course (basics 1-5, gates and scans 6-10, the delta rule 11-15, GPU 16-17)
    are worth more, part by part."""
    parts = [EXERCISES[0:5], EXERCISES[5:10], EXERCISES[10:15], EXERCISES[15:]]
    means = [sum(ex.points for ex in part) / len(part) for part in parts if part]
    assert means == sorted(means), f"mean points per part: {means}"


# ---------------------------------------------------------------- stubs and solutions

@pytest.mark.parametrize("ex", EXERCISES, ids=ids)
def test_stub_is_made_from_its_solution(ex):
    solution = ex.path("solutions").read_text(encoding="utf-8")
    assert ex.path("exercises").read_text(encoding="utf-8") == stubs.make_stub(solution, ex.relpath("solutions")), (
        f"{ex.relpath()} differs from its solution with the TODO blocks replaced: "
        "run `python -m minilin.course.stubs --write` (this overwrites the stubs)")


@pytest.mark.parametrize("ex", EXERCISES, ids=ids)
def test_stub_raises_in_every_function(ex):
    """Each public function of an untouched stub is a docstring and one `raise NotImplementedError("TODO: ...")`."""
    module = ast.parse(ex.path("exercises").read_text(encoding="utf-8"))
    functions = [node for node in module.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")]
    assert functions, f"{ex.relpath()} defines no function to write"
    for f in functions:
        body = f.body[1:] if ast.get_docstring(f) else f.body
        assert ast.get_docstring(f), f"{ex.relpath()}: {f.name} needs a docstring that teaches the math"
        ok = (len(body) == 1 and isinstance(body[0], ast.Raise) and isinstance(body[0].exc, ast.Call)
              and getattr(body[0].exc.func, "id", None) == "NotImplementedError")
        assert ok, f"{ex.relpath()}: {f.name} should be only `raise NotImplementedError(...)` in the stub"
        message = body[0].exc.args[0].value
        assert re.fullmatch(r"TODO: .+ \(about \d+ lines?\)", message), message


@pytest.mark.parametrize("ex", EXERCISES, ids=ids)
def test_stub_and_solution_have_the_same_signatures(ex):
    stub, solution = (runner.load_module(ex.path(t), prefix=f"sig_{t}") for t in ("exercises", "solutions"))
    stub_functions, solution_functions = public_functions(stub), public_functions(solution)
    assert list(stub_functions) == list(solution_functions)
    for name in stub_functions:
        assert inspect.signature(stub_functions[name]) == inspect.signature(solution_functions[name]), name


def _names_used(source: str) -> set:
    """Every module path the code reaches: imports, and attribute chains through imported names
    (`from minilin import mixers` then `mixers.retnet.parallel` reaches minilin.mixers.retnet.parallel)."""
    aliases, used = {}, set()
    tree_ = ast.parse(source)
    for node in ast.walk(tree_):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
                used.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                used.add(f"{node.module}.{alias.name}")
    for node in ast.walk(tree_):
        if isinstance(node, ast.Attribute):
            parts = []
            while isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name) and node.id in aliases:
                used.add(".".join([aliases[node.id], *reversed(parts)]))
    return used


@pytest.mark.parametrize("ex", EXERCISES, ids=ids)
def test_solution_does_not_use_its_reference(ex):
    """A solution that called the module it is checked against would pass without teaching anything."""
    used = _names_used(ex.path("solutions").read_text(encoding="utf-8"))
    for reference in ex.reference:
        hits = sorted(name for name in used if name == reference or name.startswith(reference + "."))
        assert not hits, f"{ex.relpath('solutions')} uses {hits}, the reference its check compares against"


# ---------------------------------------------------------------- the checks themselves

@pytest.mark.parametrize("ex", CPU, ids=[ex.folder for ex in CPU])
def test_untouched_stub_fails_every_check(ex):
    result = runner.run(ex, tree="exercises")
    assert result.status == runner.NOT_STARTED, [(c.name, c.outcome, c.message) for c in result.checks] or result.message


@pytest.mark.parametrize("ex", CPU, ids=[ex.folder for ex in CPU])
def test_solution_passes_every_check(ex):
    result = runner.run(ex, tree="solutions")
    assert result.status == runner.SOLVED, "\n".join(f"{c.name}: {c.outcome}\n{c.message}" for c in result.checks)


@pytest.mark.skipif(not HAVE_GPU[0], reason=HAVE_GPU[1])
@pytest.mark.parametrize("ex", GPU, ids=[ex.folder for ex in GPU])
def test_gpu_solution_passes_every_check(ex):
    result = runner.run(ex, tree="solutions", gpu=HAVE_GPU)
    assert result.status == runner.SOLVED, "\n".join(f"{c.name}: {c.outcome}\n{c.message}" for c in result.checks)


class _Perturb:
    """Changes leaf number `target` (depth first) of a returned value by about a millionth of its size:
    a float array at its middle element, an integer by 1, a float by 1e-6 relative (or 1e-6 at zero),
    a string at its middle character."""

    def __init__(self, target: int):
        self.target, self.hit, self.count = target, False, 0

    def __call__(self, value):
        self.count = 0
        return self._walk(value)

    def _walk(self, x):
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*[self._walk(v) for v in x])
        if isinstance(x, (tuple, list)):
            return type(x)(self._walk(v) for v in x)
        if isinstance(x, dict):
            return {key: self._walk(v) for key, v in x.items()}
        leaf = isinstance(x, (np.ndarray, np.number, int, float, str)) and not isinstance(x, (bool, np.bool_))
        if not leaf:
            return x
        index, self.count = self.count, self.count + 1
        if index != self.target:
            return x
        self.hit = True
        if isinstance(x, str):  # one character changed, in the middle
            if not x:
                return "?"
            middle = len(x) // 2
            return x[:middle] + ("A" if x[middle] != "A" else "L") + x[middle + 1:]
        if isinstance(x, np.ndarray):
            if x.size == 0:
                return x
            y = x.copy()
            middle = np.unravel_index(x.size // 2, x.shape)
            if y.dtype.kind == "f":  # a millionth in float64; a thousandth in float32, checked to 1e-4
                relative = 1e-6 if y.dtype == np.float64 else 1e-3
                y[middle] += relative * max(float(np.abs(x).max()), 1e-300)
            else:
                y[middle] += 1
            return y
        if isinstance(x, (int, np.integer)):
            return x + 1
        return x + 1e-6 * max(abs(float(x)), 1.0) if x == 0 else x * (1 + 1e-6)


def _wrap(function, perturb):
    def wrapper(*args, **kwargs):
        return perturb(function(*args, **kwargs))
    return wrapper


def _reject_wrong_results(ex, skip=(), gpu=None):
    names = [name for name in public_functions(runner.load_module(ex.path("solutions"), prefix="names"))
             if name not in skip]
    for name in names:
        target = 0
        while True:
            module = runner.load_module(ex.path("solutions"), prefix="mutant")
            perturb = _Perturb(target)
            setattr(module, name, _wrap(getattr(module, name), perturb))
            result = runner.run(ex, module=module, stop_at_first_failure=True, gpu=gpu, isolation="none")
            if not perturb.hit:
                assert target > 0, f"{ex.folder}: the checks never call {name}()"
                break
            assert result.status == runner.FAILING, (
                f"{ex.folder}: the checks accept {name}() with returned value #{target} changed by a millionth")
            target += 1


@pytest.mark.parametrize("ex", CPU, ids=[ex.folder for ex in CPU])
def test_checks_reject_a_slightly_wrong_solution(ex):
    """For every public function of the solution and every value it returns: the check fails when only that
    value is changed by about a millionth. So no returned value goes unchecked, and no tolerance is loose."""
    _reject_wrong_results(ex)


# ---------------------------------------------------------------- CUDA C++ of the GPU exercises

NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the CUDA C++ of the GPU solutions is compiled where it exists")
@pytest.mark.parametrize("ex", GPU, ids=[ex.folder for ex in GPU])
def test_gpu_solution_kernel_compiles(ex, tmp_path):
    module = runner.load_module(ex.path("solutions"), prefix="nvcc")
    source = tmp_path / "kernel.cu"
    source.write_text(module.kernel_source(), encoding="utf-8")
    done = subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "-c", str(source), "-o", str(tmp_path / "kernel.o")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- the GPU exercises, emulated on the CPU
#
# Where there is no GPU, the GPU solutions still run through minilin/course/emulated_cupy.py: a stand-in
# `cupy` whose RawKernels are compiled by g++ as C++20 and run with one std::thread per CUDA thread.

@pytest.fixture
def emulated_cupy(tmp_path_factory, monkeypatch):
    if GXX is None:
        pytest.skip("g++ not found: the CPU emulation of the GPU exercises needs it")
    import sys

    fake = fake_cupy(tmp_path_factory.getbasetemp())
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


@pytest.mark.parametrize("ex", GPU, ids=[ex.folder for ex in GPU])
def test_gpu_solution_passes_under_cpu_emulation(ex, emulated_cupy):
    result = runner.run(ex, tree="solutions", gpu=EMULATED)
    assert result.status == runner.SOLVED, "\n".join(f"{c.name}: {c.outcome}\n{c.message}" for c in result.checks)


@pytest.mark.parametrize("ex", GPU, ids=[ex.folder for ex in GPU])
def test_gpu_stub_fails_under_cpu_emulation(ex, emulated_cupy):
    result = runner.run(ex, tree="exercises", gpu=EMULATED)
    assert result.status == runner.NOT_STARTED, [(c.name, c.outcome, c.message) for c in result.checks]


@pytest.mark.parametrize("ex", GPU, ids=[ex.folder for ex in GPU])
def test_gpu_checks_reject_a_slightly_wrong_solution(ex, emulated_cupy):
    """As for the CPU exercises, for the launchers' results (float32: changed by a thousandth)."""
    _reject_wrong_results(ex, skip=("kernel_source",), gpu=EMULATED)
