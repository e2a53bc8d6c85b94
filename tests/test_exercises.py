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
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from minilin.mixers import linear_attention

from minilin.course import mutants, runner, stubs, tree
from minilin.course.checks import CheckFailure, assert_close, check_form, gpu_status
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
    assert not set(ex.allow) & set(ex.reference), f"{ex.folder}: a module cannot be both the reference and allowed"
    functions = public_functions(runner.load_module(ex.path("solutions"), prefix="hints"))
    for function, hints in ex.function_hints:
        assert function in functions, f"{ex.folder}: function_hints names {function}(), not a function of the file"
        assert 1 <= len(hints) <= 3 and all(h.strip() for h in hints), f"{ex.folder}: 1 to 3 hints for {function}"
    if len(functions) > 1:
        assert {f for f, _ in ex.function_hints} == set(functions), (
            f"{ex.folder}: give every function of the file its own hints (function_hints)")


def test_points_grow_with_difficulty():
    """The parts of the course (basics 1-5, gates and scans 6-10, the delta rule 11-15, GPU 16-17, gradients
    and training from 18 on) are worth more, part by part."""
    parts = [EXERCISES[0:5], EXERCISES[5:10], EXERCISES[10:15], EXERCISES[15:17], EXERCISES[17:]]
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
        self.target, self.hit, self.count, self.most = target, False, 0, 0

    def __call__(self, value):
        self.count = 0
        value = self._walk(value)
        self.most = max(self.most, self.count)      # the most leaves one call returned
        return value

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
                finite = np.abs(x[np.isfinite(x)])  # -inf entries (a mask above a diagonal) set no scale
                y[middle] += relative * max(float(finite.max()) if finite.size else 1.0, 1e-300)
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
    # One run that changes nothing counts the values each function returns (the most over its calls)...
    module = runner.load_module(ex.path("solutions"), prefix="counted")
    counters = {name: _Perturb(-1) for name in names}
    for name, counter in counters.items():
        setattr(module, name, _wrap(getattr(module, name), counter))
    assert runner.run(ex, module=module, gpu=gpu, isolation="none").status == runner.SOLVED
    # ... then one run per value, changed by a millionth in every call that returns it.
    for name in names:
        assert counters[name].most > 0, f"{ex.folder}: the checks never call {name}()"
        for target in range(counters[name].most):
            module = runner.load_module(ex.path("solutions"), prefix="mutant")
            perturb = _Perturb(target)
            setattr(module, name, _wrap(getattr(module, name), perturb))
            result = runner.run(ex, module=module, stop_at_first_failure=True, gpu=gpu, isolation="none")
            assert perturb.hit and result.status == runner.FAILING, (
                f"{ex.folder}: the checks accept {name}() with returned value #{target} changed by a millionth")


@pytest.mark.parametrize("ex", CPU, ids=[ex.folder for ex in CPU])
def test_checks_reject_a_slightly_wrong_solution(ex):
    """For every public function of the solution and every value it returns: the check fails when only that
    value is changed by about a millionth. So no returned value goes unchecked, and no tolerance is loose."""
    _reject_wrong_results(ex)


# ---------------------------------------------------------------- what the checks catch, and how they say it

def _variant(ex, tmp_path, *replacements, function=None):
    """The solution of `ex` with each (old, new) replaced once (inside `function` when given), loaded as a
    module from tmp_path."""
    text = ex.path("solutions").read_text(encoding="utf-8")
    start = text.index(f"def {function}(") if function else 0
    head, body = text[:start], text[start:]
    for old, new in replacements:
        assert old in body, f"{ex.folder}: {old!r} is not in the solution"
        body = body.replace(old, new, 1)
    path = tmp_path / ex.folder / ex.file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + body, encoding="utf-8")
    return runner.load_module(path, prefix="variant")


def _failure(ex, module, **kwargs) -> str:
    result = runner.run(ex, module=module, **kwargs)
    assert result.status == runner.FAILING, [(c.name, c.outcome) for c in result.checks]
    problem = result.first_problem
    return problem.message if problem is not None else result.message


TOKEN_LOOP = """
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, v.shape[-1]))
    o = np.empty(v.shape)
    for t in range(T):
        v_old = np.einsum("bhkv,bhk->bhv", S, k[:, t])
        S = S + np.einsum("bhk,bhv->bhkv", beta[:, t, :, None] * k[:, t], v[:, t] - v_old)
        o[:, t] = scale * np.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, S
"""

FORWARD_SUBSTITUTION = """
    C = k.shape[-2]
    k_beta = beta[..., None] * k
    A = np.tril(k_beta @ np.swapaxes(k, -1, -2), -1)
    rhs = np.concatenate([k_beta, beta[..., None] * v], axis=-1)
    X = np.zeros_like(rhs)
    for t in range(C):
        X[..., t, :] = rhs[..., t, :] - np.einsum("...j,...jd->...d", A[..., t, :t], X[..., :t, :])
    return X[..., :k.shape[-1]], X[..., k.shape[-1]:]
"""


def _body(ex, function):
    """(the TODO block's code of `function`, as text) in the solution of `ex`."""
    text = ex.path("solutions").read_text(encoding="utf-8")
    start = text.index(f"def {function}(")
    begin = text.index("# TODO:", start)
    begin = text.index("\n", begin) + 1
    return text[begin:text.index("    # END TODO", begin)]


def test_checks_name_a_missing_scale(tmp_path):
    ex = EXERCISES[5]  # 06: retnet_recurrent ignoring the caller's scale
    module = _variant(ex, tmp_path, ("scale = K ** -0.5 if scale is None else scale", "scale = K ** -0.5"),
                      function="retnet_recurrent")
    message = _failure(ex, module)
    assert "retnet_recurrent(scale=0.4): o" in message and "times the expected one (= K ** -0.5 / scale)" in message


def test_checks_name_a_one_token_shift(tmp_path):
    ex = EXERCISES[1]  # 02: the read before the write
    module = _variant(ex, tmp_path, (
        '        S = S + np.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])\n'
        '        o[:, t] = scale * np.einsum("bhk,bhkv->bhv", q[:, t], S)\n',
        '        o[:, t] = scale * np.einsum("bhk,bhkv->bhv", q[:, t], S)\n'
        '        S = S + np.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])\n'))
    assert ("likely cause: shifted by one token: each output reads the state before its own token is written "
            "(o_t = S_{t-1}^T q_t)") in _failure(ex, module)
    # At T = 1 the same mistake leaves the output all zeros, and says so.
    (q, k, v), _ = linear_attention.example_inputs(B=1, T=1, H=1, K=4, V=3, seed=1)
    with pytest.raises(CheckFailure, match="every value is 0 where the expected ones are not"):
        check_form("linear_attention_recurrent", module.linear_attention_recurrent, (q, k, v),
                   linear_attention.recurrent(q, k, v), reference=linear_attention.recurrent)
    # An output stored one step late (o[:, t + 1] = ...) is named from the two arrays alone.
    (q, k, v), _ = linear_attention.example_inputs(B=2, T=37, H=3, K=8, V=5, seed=1)
    late = np.concatenate([np.zeros_like(q[:, :1, :, :5]), linear_attention.recurrent(q, k, v)[0][:, :-1]], axis=1)
    with pytest.raises(CheckFailure, match="shifted by one token, late: the value at t is the one expected at t - 1"):
        assert_close("o", late, linear_attention.recurrent(q, k, v)[0], dims="B T H V")


def test_checks_name_a_leak_from_the_future(tmp_path):
    ex = EXERCISES[1]  # 02: no causal mask
    module = _variant(ex, tmp_path, ("scores = scores * np.tril(np.ones((T, T)))", "scores = scores * np.ones((T, T))"))
    message = _failure(ex, module)
    assert "the output reads the future: o at t=0 changed when only the inputs after t=0 changed" in message
    ex = EXERCISES[12]  # 13: the mask inside the chunk lets the chunk's later tokens in
    module = _variant(ex, tmp_path, ("lower = np.tril(np.ones((C, C), dtype=bool))", "lower = np.ones((C, C), dtype=bool)"))
    assert "the output reads the future" in _failure(ex, module)


def test_checks_name_an_argument_changed_in_place(tmp_path):
    ex = EXERCISES[10]  # 11: the delta write into the caller's S
    module = _variant(ex, tmp_path, (
        '    return S + np.einsum("bhk,bhv->bhkv", beta_t[..., None] * k_t, v_t - v_old)',
        '    S += np.einsum("bhk,bhv->bhkv", beta_t[..., None] * k_t, v_t - v_old)\n    return S'))
    result = runner.run(ex, module=module)
    messages = {c.name: c.message for c in result.checks}
    assert messages["test_delta_write"].startswith("delta_write() changed its argument S in place")
    assert messages["test_deltanet_recurrent_from_a_state"].startswith(
        "deltanet_recurrent() changed its argument initial_state in place")


def test_checks_refuse_minilin_own_code(tmp_path):
    ex = EXERCISES[11]  # 12: the chunked form handing the work to minilin's DeltaNet
    module = _variant(ex, tmp_path, ("    B, T, H, K = q.shape\n", "    from minilin.mixers import deltanet\n"
                                     "    return deltanet.recurrent(q, k, v, beta, scale=scale)\n"),
                      function="deltanet_chunked")
    message = _failure(ex, module)
    assert message.startswith("deltanet_chunked() calls minilin.mixers.deltanet.recurrent (line ")
    module = _variant(ex, tmp_path, ("    B, T, H, K = q.shape\n", "    from minilin.mixers import gated_deltanet\n"
                                     "    return gated_deltanet.chunked(q, k, v, 0 * beta, beta, scale=scale)\n"),
                      function="deltanet_chunked")
    assert "calls minilin.mixers.gated_deltanet.chunked" in _failure(ex, module)


def test_chunked_checks_refuse_a_token_loop(tmp_path):
    ex = EXERCISES[11]  # 12: right values, but one token at a time
    module = _variant(ex, tmp_path, (_body(ex, "deltanet_chunked"), TOKEN_LOOP), function="deltanet_chunked")
    result = runner.run(ex, module=module)
    failed = [c for c in result.checks if c.outcome == runner.FAILED]
    assert [c.name for c in failed] == ["test_deltanet_chunked_loops_over_chunks"], [c.name for c in failed]
    assert failed[0].message.startswith("deltanet_chunked: a loop over tokens?\n  ")
    assert "lines of your file ran for T=128 (chunk_size=32) against" in failed[0].message
    # A forward substitution, row by row, is fine in wy_representation: the chunked form's work still
    # follows the chunks.
    module = _variant(ex, tmp_path, (_body(ex, "wy_representation"), FORWARD_SUBSTITUTION), function="wy_representation")
    assert runner.run(ex, module=module).status == runner.SOLVED


def test_parallel_checks_refuse_a_token_loop(tmp_path):
    ex = EXERCISES[1]  # 02: the parallel form written as the recurrence
    loop = _body(ex, "linear_attention_recurrent").replace("    return o, S\n", "    return o\n")
    module = _variant(ex, tmp_path, (_body(ex, "linear_attention_parallel"), loop), function="linear_attention_parallel")
    assert _failure(ex, module).startswith("linear_attention_parallel: a loop over tokens?\n")


GLA_TOKEN_LOOP = """
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = np.zeros((B, H, K, v.shape[-1])) if initial_state is None else initial_state
    states = []
    for t in range(T):
        S = np.exp(g[:, t])[..., None, None] * S + np.einsum("bhk,bhv->bhkv", k[:, t], v[:, t])
        states.append(S)
    Sbar = np.zeros(S.shape) if dstate is None else dstate
    dq, dk, dv, dg = np.empty(q.shape), np.empty(k.shape), np.empty(v.shape), np.empty(g.shape)
    for t in range(T - 1, -1, -1):
        Sbar = Sbar + scale * np.einsum("bhk,bhv->bhkv", q[:, t], do[:, t])
        S_prev = states[t - 1] if t else (np.zeros(S.shape) if initial_state is None else initial_state)
        dq[:, t] = scale * np.einsum("bhkv,bhv->bhk", states[t], do[:, t])
        dk[:, t] = np.einsum("bhkv,bhv->bhk", Sbar, v[:, t])
        dv[:, t] = np.einsum("bhkv,bhk->bhv", Sbar, k[:, t])
        dg[:, t] = np.sum(Sbar * np.exp(g[:, t])[..., None, None] * S_prev, axis=(-2, -1))
        Sbar = np.exp(g[:, t])[..., None, None] * Sbar
    return dq, dk, dv, dg, (None if initial_state is None else Sbar)
"""


def test_chunked_backward_checks_refuse_a_token_loop(tmp_path):
    ex = EXERCISES[19]  # 20: the right gradients, one token at a time
    module = _variant(ex, tmp_path, (_body(ex, "chunked_backward"), GLA_TOKEN_LOOP), function="chunked_backward")
    result = runner.run(ex, module=module)
    failed = [c for c in result.checks if c.outcome == runner.FAILED]
    assert [c.name for c in failed] == ["test_chunked_backward_loops_over_chunks"], [(c.name, c.message) for c in failed]
    assert failed[0].message.startswith("chunked_backward: a loop over tokens?\n  ")


def test_gradient_checks_say_what_is_wrong(tmp_path):
    ex = EXERCISES[18]  # 19: dq without the scale, dv without its dS^T k ... each named
    module = _variant(ex, tmp_path, ("dq = scale * np.einsum", "dq = np.einsum"), function="recurrent_backward")
    message = _failure(ex, module)
    assert message.startswith("recurrent_backward(scale=None): dq [B=2 T=37 H=3 K=8 V=5]: values differ")
    assert "likely cause: every value is 2.82843 times the expected one (= 1 / scale)" in message
    assert "the finite differences side with minilin's" in message
    module = _variant(ex, tmp_path, ("        adjoints[:, t] = Sbar\n        Sbar = np.exp(g[:, t])[..., None, None] * Sbar",
                                     "        Sbar = np.exp(g[:, t])[..., None, None] * Sbar\n        adjoints[:, t] = Sbar"),
                      function="state_adjoints")
    message = _failure(ex, module)
    assert "last time step that differs: t=36" in message
    assert "likely cause: every value is the expected one times exp(g_t), token by token" in message
    module = _variant(ex, tmp_path, ("return dq, dk, dv, dg, dS0", "return dk, dq, dv, dg, dS0"), function="recurrent_backward")
    assert "likely cause: this is the expected dk: the gradients returned in the wrong order?" in _failure(ex, module)
    ex = EXERCISES[17]  # 18: the tiled form forming the whole [T, T] matrix
    module = _variant(ex, tmp_path, ("    B, T, H, K = q.shape\n", "    return attention_backward(q, k, v, o, lse, do, scale=scale)\n"),
                      function="attention_backward_tiled")
    result = runner.run(ex, module=module)
    failed = {c.name: c.message for c in result.checks if c.outcome == runner.FAILED}
    assert list(failed) == ["test_attention_backward_tiled_memory"], failed
    assert "MiB at its peak, more than 1.0 MiB (an eighth of one [T, T] float64 matrix" in failed["test_attention_backward_tiled_memory"]


def test_training_check_rejects_a_broken_step(tmp_path):
    """Exercise 22's thresholds: a correct solution learns (the solution's check passes elsewhere); the loop
    without zero_grad, and the gradient of the blocks' input with the wrong sign, do not."""
    ex = EXERCISES[21]
    for replacement, function in ((("        model.zero_grad()\n", ""), "train"),
                                  (("        dx = block.backward(ctx, dx)\n", "        dx = block.backward(ctx, -dx)\n"),
                                   "loss_and_grads")):
        module = _variant(ex, tmp_path, replacement, function=function)
        outcomes = {c.name: c for c in runner.run(ex, module=module).checks}
        assert outcomes["test_training_learns"].outcome == runner.FAILED, replacement
        assert outcomes["test_training_learns"].message.startswith("train() did not learn enough: after 150 steps")
    module = _variant(ex, tmp_path, ("    embed, norm, head = ", "    return model.loss_and_grads(tokens, targets)[0]\n    embed, norm, head = "),
                      function="loss_and_grads")
    assert "loss_and_grads() calls LanguageModel.loss_and_grads: that is minilin's own backward" in _failure(ex, module)


def test_an_endless_loop_times_out_and_the_other_checks_still_run(tmp_path):
    ex = EXERCISES[6]  # 07: the offset never doubles
    module = _variant(ex, tmp_path, ("offset *= 2", "offset *= 1"))
    result = runner.run(ex, module=module, timeout=1)
    outcomes = {c.name: (c.outcome, c.message) for c in result.checks}
    assert outcomes["test_combine"][0] == outcomes["test_sequential_scan"][0] == runner.PASSED
    outcome, message = outcomes["test_associative_scan"]
    assert outcome == runner.FAILED
    assert message.startswith("check timed out after 1 s: an endless loop? associative_scan() was still running")
    module = _variant(ex, tmp_path, ("    T = a.shape[1]\n", "    import os\n    os._exit(3)\n"))
    message = runner.run(ex, module=module).first_problem.message
    assert message.startswith("the check stopped Python itself (exit status 3) while associative_scan() ran")


@pytest.mark.parametrize("isolation", ["thread", "none"])
def test_the_other_isolations_run_the_checks_too(isolation, tmp_path):
    ex = EXERCISES[6]
    assert runner.run(ex, tree="solutions", isolation=isolation).status == runner.SOLVED
    if isolation == "thread":
        module = _variant(ex, tmp_path, ("offset *= 2", "offset *= 1"))
        message = runner.run(ex, module=module, timeout=1, isolation="thread").first_problem.message
        assert message.startswith("check timed out after 1 s")


def _scales_checked(ex, gpu=None) -> dict:
    """For each function of the solution taking `scale`: the scales its check passed (None: the default)."""
    recording = mutants.Recording(ex, gpu=gpu)
    seen = {}
    for name, function in recording.solution.items():
        if "scale" in inspect.signature(function).parameters:
            seen[name] = set()
    for call in recording.calls:
        if call.name in seen:
            value = call.kwargs.get("scale")
            seen[call.name].add(None if value is None else "given")
    return seen


@pytest.mark.parametrize("ex", CPU, ids=[ex.folder for ex in CPU])
def test_every_scale_is_checked_at_its_default_and_at_another_value(ex):
    """A function that takes `scale` and ignores the caller's (or gets the default wrong) must fail."""
    for name, seen in _scales_checked(ex).items():
        assert seen == {None, "given"}, f"{ex.folder}: the check calls {name}() with scale {sorted(map(str, seen))} only"


# ---------------------------------------------------------------- mutation testing of the checks

def test_mutants_of_a_small_solution():
    source = (
        '"""doc"""\n'
        'def f(x, *, scale=None):\n'
        '    """doc"""\n'
        '    # TODO: it\n'
        '    scale = 2.0 if scale is None else scale\n'
        '    y = x * scale - 1\n'
        '    return y\n'
        '    # END TODO\n'
        'def g(x):\n'
        '    return x + 1\n')
    found = mutants.python_mutants(source)
    pairs = {(m.kind, m.before, m.after) for m in found}
    assert ("default", "2.0 if scale is None else scale", "(2.0)") in pairs        # the caller's scale ignored
    assert ("operator", "x * scale - 1", "(x * scale + 1)") in pairs
    assert ("term", "x * scale - 1", "(x * scale)") in pairs
    assert ("constant", "1", "(2)") in pairs and ("constant", "2.0", "(4.0)") in pairs
    assert ("statement", "y = x * scale - 1", "pass") in pairs
    assert ("in place", "y = x * scale - 1", "y") not in {(k, b, a[:1]) for k, b, a in pairs}
    assert all(m.line in (5, 6, 7) for m in found), "mutants only inside the TODO block"
    kernel = mutants.kernel_mutants('def k():\n    # TODO: k\n    return r"""\n#define N 4\n'
                                    '__global__ void f(float* o, int n) {\n    for (int i = 0; i < n; ++i) o[i] = 2 * o[i];\n}\n"""\n'
                                    '    # END TODO\n')
    changes = {(m.before, m.after) for m in kernel}
    line = "for (int i = 0; i < n; ++i) o[i] = 2 * o[i];"
    assert (line, line.replace("i < n", "i <= n")) in changes and (line, line.replace("2 *", "3 *")) in changes
    assert not any("#define" in m.before or "float*" not in m.source for m in kernel)


def test_mutation_verdicts(tmp_path):
    ex = EXERCISES[4]  # 05
    found = {m.after: m for m in mutants.mutants(ex)}
    in_place = next(m for m in found.values() if m.kind == "in place")        # S += ... on the local state
    wrong = next(m for m in found.values() if m.kind == "default" and "K ** " in m.after)
    outcomes = {o.mutant.index: o for o in mutants.sweep(ex, [in_place, wrong])}
    assert outcomes[in_place.index].verdict == mutants.EQUIVALENT
    assert outcomes[wrong.index].verdict == mutants.KILLED
    assert mutants.score(list(outcomes.values()))["score"] == 1.0


@pytest.mark.parametrize("ex", CPU, ids=[ex.folder for ex in CPU])
def test_a_sample_of_mutants_is_rejected(ex):
    """Three mutants of each solution, the same three every run: the check rejects each (or the mutant
    computes the same function). The whole sweep: MINILIN_MUTATION_SWEEP=1, or python -m minilin.course.mutants."""
    picked = mutants.sample(mutants.mutants(ex), 3, seed=ex.number)
    outcomes = mutants.sweep(ex, picked)
    survivors = [f"{o.mutant.label}: {o.why}" for o in outcomes if o.verdict == mutants.SURVIVED]
    assert not survivors, survivors


SWEEP = os.environ.get("MINILIN_MUTATION_SWEEP")


@pytest.mark.skipif(not SWEEP, reason="the whole mutation sweep (minutes): MINILIN_MUTATION_SWEEP=1 runs it")
@pytest.mark.parametrize("ex", CPU, ids=[ex.folder for ex in CPU])
def test_checks_reject_97_percent_of_mutants(ex):
    outcomes = mutants.sweep(ex)
    counts = mutants.score(outcomes)
    survivors = [o.mutant.label for o in outcomes if o.verdict == mutants.SURVIVED]
    assert counts["score"] >= 0.97, f"{ex.folder}: {100 * counts['score']:.1f}% rejected; survivors: {survivors}"


@pytest.mark.skipif(not SWEEP, reason="the whole mutation sweep (minutes): MINILIN_MUTATION_SWEEP=1 runs it")
@pytest.mark.parametrize("ex", GPU, ids=[ex.folder for ex in GPU])
def test_gpu_checks_reject_97_percent_of_mutants(ex, emulated_cupy):
    outcomes = mutants.sweep(ex, gpu=EMULATED)
    counts = mutants.score(outcomes)
    survivors = [o.mutant.label for o in outcomes if o.verdict == mutants.SURVIVED]
    assert counts["score"] >= 0.97, f"{ex.folder}: {100 * counts['score']:.1f}% rejected; survivors: {survivors}"


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
    """Solved (mutants.Recording raises otherwise), with every scale checked at its default and another value."""
    for name, seen in _scales_checked(ex, gpu=EMULATED).items():
        assert seen == {None, "given"}, f"{ex.folder}: the check calls {name}() with scale {sorted(map(str, seen))} only"


@pytest.mark.parametrize("ex", GPU, ids=[ex.folder for ex in GPU])
def test_gpu_stub_fails_under_cpu_emulation(ex, emulated_cupy):
    result = runner.run(ex, tree="exercises", gpu=EMULATED)
    assert result.status == runner.NOT_STARTED, [(c.name, c.outcome, c.message) for c in result.checks]


@pytest.mark.parametrize("ex", GPU, ids=[ex.folder for ex in GPU])
def test_gpu_checks_reject_a_slightly_wrong_solution(ex, emulated_cupy):
    """As for the CPU exercises, for the launchers' results (float32: changed by a thousandth)."""
    _reject_wrong_results(ex, skip=("kernel_source",), gpu=EMULATED)
