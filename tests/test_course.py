"""The course machinery (minilin/course/): the list reader, the comparison and its messages, the stub
maker, the runner, the commands, and `pytest exercises` with its summary. The exercises themselves are
proven in tests/test_exercises.py."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minilin import cli
from minilin.course import _toml, runner, stubs, tree
from minilin.course.checks import CheckFailure, assert_close, assert_equal, unpack

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- the list

def test_fallback_reader_reads_the_list_as_tomllib_does():
    tomllib = pytest.importorskip("tomllib")
    text = (ROOT / "exercises" / "exercises.toml").read_text(encoding="utf-8")
    assert _toml.loads_subset(text) == tomllib.loads(text)
    sample = 'a = "x \\" \\\\ \\u00e9"  # c\nb = \'lit\'\n[t]\nn = -1_000\nf = 2.5e3\nl = [\n 1, # one\n 2,\n]\nok = true\n'
    assert _toml.loads_subset(sample) == tomllib.loads(sample)


@pytest.mark.parametrize("bad", ['a = {x = 1}', 'a = "open', 'a = 1 b = 2', 'a = 1\na = 2', '[[x]\n'])
def test_fallback_reader_refuses_what_it_does_not_know(bad):
    with pytest.raises(_toml.TomlError, match="line"):
        _toml.loads_subset(bad)


def test_root_is_found_from_below_and_missing_root_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("MINILIN_ROOT", raising=False)
    assert tree.find_root(ROOT / "exercises" / "06_retnet") == ROOT
    with pytest.raises(tree.CourseError, match="clone of the minilin repository"):
        tree.find_root(tmp_path)
    monkeypatch.setenv("MINILIN_ROOT", str(ROOT))
    monkeypatch.chdir(tmp_path)
    assert tree.find_root() == ROOT


def test_select_by_number_or_name():
    exercises = tree.load(ROOT)
    assert tree.select(exercises, "6").slug == tree.select(exercises, "06_retnet").slug == "retnet"
    with pytest.raises(tree.CourseError, match="from 1 to"):
        tree.select(exercises, 99)


# ---------------------------------------------------------------- assert_close and friends

def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(CheckFailure) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_assert_close_passes_within_tolerance():
    x = np.random.default_rng(0).standard_normal((2, 5, 3, 4))
    assert_close("o", x * (1 + 1e-10), x, dims="B T H V")
    assert_close("s", 2.0, np.float64(2.0))
    assert_close("zero up to rounding", np.array([1e-17]), np.array([0.0]), atol=1e-12)


def test_assert_close_explains_shape_dtype_and_kind_first():
    x = np.zeros((2, 7, 3, 5))
    assert "got None (did the function forget to `return`?)" in _message(assert_close, "o", None, x)
    assert "a tuple of 2 items" in _message(assert_close, "o", (x, x), x)
    message = _message(assert_close, "o", x.transpose(0, 2, 1, 3), x, dims="B T H V")
    assert "wrong shape: expected [B, T, H, V] = [2, 7, 3, 5], got [2, 3, 7, 5]" in message
    assert "another order" in message
    assert "3 axes instead of 4" in _message(assert_close, "o", x[0], x, dims="B T H V")
    assert "dtype float32, expected float64" in _message(assert_close, "o", x.astype(np.float32), x)


def test_assert_close_names_the_worst_index_and_the_first_time_step():
    expected = np.random.default_rng(1).standard_normal((2, 40, 3, 4))
    got = expected.copy()
    got[1, 20:, 2, 3] += 1.0
    got[0, 33, 0, 0] += 5.0
    message = _message(assert_close, "o [case]", got, expected, dims="B T H V", chunk_size=16)
    assert "worst at (b=0, t=33, h=0, v=0)" in message
    assert "first time step that differs: t=20 (chunk 1, position 4 with chunk_size=16); t=0..19 match" in message
    assert "relative error ||got - expected|| / ||expected||" in message


def test_assert_close_never_passes_nan():
    expected = np.ones((1, 3, 1, 1))
    got = expected.copy()
    got[0, 1] = np.nan
    assert "got nan at (b=0, t=1, h=0, v=0)" in _message(assert_close, "o", got, expected, dims="B T H V")


def test_assert_equal_and_unpack():
    assert_equal("n", np.int64(4), 4)
    assert "expected 5, got 4" in _message(assert_equal, "n", 4, 5)
    assert "expected int 5, got float 5.0" in _message(assert_equal, "n", 5.0, 5)
    assert "expected a tuple (o, S) of 2 items, got an array" in _message(unpack, "f()", np.zeros(3), 2, "(o, S)")


# ---------------------------------------------------------------- stubs

SOLUTION = '''"""doc"""
import numpy as np


def f(x):
    """teaches"""
    # TODO: double it
    y = x + x
    # a comment does not count

    return y
    # END TODO
'''


def test_make_stub_replaces_the_marked_block_and_counts_code_lines():
    stub = stubs.make_stub(SOLUTION)
    assert stub.endswith('    """teaches"""\n    raise NotImplementedError("TODO: double it (about 2 lines)")\n')
    one = stubs.make_stub(SOLUTION.replace("    y = x + x\n", "").replace("return y", "return x + x"))
    assert one.endswith('raise NotImplementedError("TODO: double it (about 1 line)")\n')
    long = stubs.make_stub(SOLUTION.replace("double it", "double it " + "and more " * 10))
    assert long.endswith('    raise NotImplementedError(\n        "TODO: double it and more ' + "and more " * 9 + '(about 2 lines)")\n')
    assert stub.startswith('"""doc"""\nimport numpy as np\n')
    assert stubs.about(7) == 7 and stubs.about(23) == 25


@pytest.mark.parametrize("broken, why", [
    (SOLUTION.replace("    # END TODO\n", ""), "without '# END TODO'"),
    (SOLUTION.replace("    # TODO: double it\n", ""), "without a '# TODO:'"),
    (SOLUTION.replace("double it", 'say "hi"'), "quotes"),
    (SOLUTION.replace("    y = x + x\n", "    # TODO: nested\n"), "inside another"),
])
def test_make_stub_refuses_broken_markers(broken, why):
    with pytest.raises(ValueError, match=why):
        stubs.make_stub(broken)


# ---------------------------------------------------------------- the runner

@pytest.fixture
def course(tmp_path):
    """A copy of the exercise tree to work in, as a learner would."""
    for top in ("exercises", "solutions"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _solve(course, number):
    ex = tree.load(course)[number - 1]
    shutil.copy(ex.path("solutions"), ex.path("exercises"))
    return ex


def test_runner_statuses(course):
    exercises = tree.load(course)
    ex = exercises[5]  # 06: four functions
    assert runner.run(ex).status == runner.NOT_STARTED
    text = ex.path("solutions").read_text()
    stub = ex.path().read_text()
    ex.path().write_text(text[:text.index("def retnet_recurrent")] + stub[stub.index("def retnet_recurrent"):])
    result = runner.run(ex)
    assert result.status == runner.IN_PROGRESS
    assert [c.todo for c in result.checks if c.outcome == runner.TODO] == ["retnet_recurrent", "retnet_chunked"]
    ex.path().write_text(text.replace("gamma[:, None, None] ** C * S", "S"))
    result = runner.run(ex)
    assert result.status == runner.FAILING and "values differ" in result.first_problem.message
    ex.path().write_text(text.replace("def decay_mask(gamma, T):", "def decay_mask(gamma, T)"))
    result = runner.run(ex)
    assert result.status == runner.FAILING and "does not import" in result.message and "SyntaxError" in result.message
    ex.path().write_text(text)
    assert runner.run(ex).status == runner.SOLVED


def test_a_not_implemented_error_elsewhere_is_a_failure_not_a_todo(course):
    ex = _solve(course, 1)
    (ex.path().parent / "helper.py").write_text("def unfinished():\n    raise NotImplementedError('not here')\n")
    ex.path().write_text("import helper\n" + ex.path().read_text().replace(
        "    # TODO: scores", "    helper.unfinished()\n    # TODO: scores"))
    result = runner.run(ex)
    assert result.status == runner.FAILING
    assert "NotImplementedError" in result.first_problem.message and "attention.py, line" in result.first_problem.message


def test_the_learner_file_errors_point_at_the_learner_line(course):
    ex = _solve(course, 2)
    ex.path().write_text(ex.path().read_text().replace("return 2 * n * n * d_k + 2 * n * n * d_v", "return n @ d_k"))
    message = runner.run(ex).first_problem.message
    assert message.startswith("TypeError") and "bracket.py, line" in message and "return n @ d_k" in message


# ---------------------------------------------------------------- the commands

def minilin(course, *args, stdin_tty=False, answer="", monkeypatch=None):
    """Run `minilin ARGS` in the course copy; returns (exit code, output)."""
    import contextlib
    import io

    monkeypatch.chdir(course)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: stdin_tty, raising=False)
    monkeypatch.setattr("builtins.input", lambda prompt="": (print(prompt, end=""), answer)[1])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(list(args))
    return code, out.getvalue()


def test_course_commands_come_first_and_bare_minilin_is_status(course, monkeypatch):
    assert cli.COMMAND_MODULES[0] == "minilin.course"
    code, text = minilin(course, monkeypatch=monkeypatch)
    assert code == 0 and "0/17 solved, 0/177 points" in text
    assert "next: 01 Causal softmax attention" in text and "minilin check 1" in text


def test_status_check_and_hint(course, monkeypatch):
    _solve(course, 1)
    _solve(course, 2)
    code, text = minilin(course, "status", monkeypatch=monkeypatch)
    assert "2/17 solved, 10/177 points" in text and "next: 03 Feature maps" in text
    code, text = minilin(course, "check", monkeypatch=monkeypatch)
    assert code == 1 and text.startswith("03 Feature maps") and "not started" in text
    code, text = minilin(course, "check", "2", monkeypatch=monkeypatch)
    assert code == 0 and "solved: +5 points" in text and "next: 03 Feature maps" in text
    code, text = minilin(course, "hint", "3", "2", monkeypatch=monkeypatch)
    assert "hint 1 of 3" in text and "hint 2 of 3" in text and "hint 3 of 3" not in text and "minilin hint 3 3" in text
    code, text = minilin(course, "check", "--solutions", "12", monkeypatch=monkeypatch)
    assert code == 0 and "solved" in text


def test_check_shows_the_first_failure_and_a_hint(course, monkeypatch):
    ex = _solve(course, 5)
    ex.path().write_text(ex.path().read_text().replace(' + np.einsum("bihk,bhkv->bihv", qc, S)', ""))
    code, text = minilin(course, "check", "5", monkeypatch=monkeypatch)
    assert code == 1
    assert "first time step that differs: t=16 (chunk 1, position 0" in text
    assert "hint (1 of 3)" in text and "more: minilin hint 5 2" in text


def test_reset_asks_before_throwing_work_away(course, monkeypatch):
    ex = _solve(course, 4)
    stub = (ROOT / "exercises" / ex.folder / ex.file).read_text()
    code, text = minilin(course, "reset", "4", monkeypatch=monkeypatch)  # not a terminal: refuses
    assert code == 1 and "--yes" in text and ex.path().read_text() != stub
    code, text = minilin(course, "reset", "4", stdin_tty=True, answer="n", monkeypatch=monkeypatch)
    assert code == 1 and "Throw them away? [y/N]" in text and ex.path().read_text() != stub
    code, text = minilin(course, "reset", "4", stdin_tty=True, answer="y", monkeypatch=monkeypatch)
    assert code == 0 and ex.path().read_text() == stub
    saved = Path(text.split("saved in ")[1].split()[0])
    assert saved.read_text() == ex.path("solutions").read_text()
    saved.unlink()
    assert minilin(course, "reset", "4", monkeypatch=monkeypatch)[1].endswith("already the untouched stub.\n")
    ex.path().unlink()
    assert minilin(course, "reset", "4", monkeypatch=monkeypatch)[0] == 0 and ex.path().read_text() == stub


def test_reset_without_solutions_uses_git(course, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git not found")
    ex = tree.load(course)[6]
    subprocess.run(["git", "init", "-q"], cwd=course, check=True)
    subprocess.run(["git", "add", "exercises"], cwd=course, check=True)
    subprocess.run(["git", "-c", "user.name=l", "-c", "user.email=l@x", "commit", "-qm", "start"], cwd=course, check=True)
    stub = ex.path().read_text()
    shutil.rmtree(course / "solutions")
    ex.path().write_text("# my attempt\n")
    assert minilin(course, "reset", "7", "--yes", monkeypatch=monkeypatch)[0] == 0
    assert ex.path().read_text() == stub


def test_watch_checks_again_on_save_and_moves_on(course, monkeypatch):
    exercises = tree.load(course)
    for ex in exercises[:-4]:
        _solve(course, ex.number)
    pending = exercises[-4]  # 14: the first unsolved one; 15 is solved on the way, 16 and 17 skip (no GPU)
    _solve(course, 15)
    saves = []

    def sleep(seconds):  # the learner saves a solution while watch polls
        if not saves:
            saves.append(1)
            text = pending.path("solutions").read_text()
            pending.path().write_text(text)
            os.utime(pending.path(), ns=(1, 10 ** 18))

    monkeypatch.setattr("minilin.course.commands.time.sleep", sleep)
    monkeypatch.setattr("minilin.course.commands.gpu_status", lambda: (False, "needs a GPU: none here"))
    code, text = minilin(course, "watch", monkeypatch=monkeypatch)
    assert code == 0 and saves
    assert f"== watching {pending.relpath()}" in text and "changed, checking again" in text
    assert text.count("solved: +") == 2 and "No exercises left to watch" in text


# ---------------------------------------------------------------- pytest exercises

def _pytest(course, *args):
    """`pytest exercises` in the copied tree, as a learner runs it. The summaries asserted below are those of
    a machine without a GPU, so the GPU is hidden from the child; minilin is importable from this checkout
    even where it is not pip-installed."""
    import minilin

    package_root = str(Path(minilin.__file__).resolve().parents[1])
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}  # not an xdist worker
    env.update(CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-m", "pytest", "exercises", "-p", "no:cacheprovider", *args],
                          cwd=course, capture_output=True, text=True, env=env)
    return done.returncode, done.stdout + done.stderr


def test_pytest_exercises_on_a_learner_tree(course):
    _solve(course, 1)
    ex = _solve(course, 2)
    ex.path().write_text(ex.path().read_text().replace("return 2 * d_k * d_v / (d_k + d_v)", "return d_k"))
    code, text = _pytest(course)
    assert code == 1
    lines = text.splitlines()
    table = lines[lines.index(next(l for l in lines if "minilin exercises (exercises/)" in l)) + 1:]
    assert table[0].startswith("01 ") and table[0].rstrip().endswith("5/5   solved")
    assert table[1].startswith("02 ") and "failing" in table[1]
    assert table[2].startswith("03 ") and table[2].rstrip().endswith(
        "not started: open exercises/03_feature_maps/feature_maps.py (minilin hint 3)")
    assert [l[:2] for l in table[:17]] == [f"{n:02d}" for n in range(1, 18)]
    assert table[17] == ("1/17 solved, 5/177 points (16, 17 skipped: no GPU here); "
                         "next: 02 The bracket move: linear attention, parallel and recurrent, exercises/02_bracket_move/bracket.py")
    assert "NotImplementedError" not in text            # untouched ones are a line in the table, not tracebacks
    assert "crossover(d_k=16, d_v=48): values differ" in text
    assert " todo" in lines[-1] and "failed" in lines[-1]


def test_pytest_exercises_solutions(course):
    code, text = _pytest(course, "--solutions")
    assert code == 0, text[-3000:]
    assert "15/17 solved, 142/177 points (16, 17 skipped: no GPU here)" in text


def test_pytest_runs_only_the_named_exercises(course):
    code, text = _pytest(course, "--solutions", "-k", "16 or 17 or 06")
    assert code == 0
    assert "06 Fixed decay" in text and "16 GPU" in text and "17 GPU" in text and "05 Chunked" not in text
    assert "(ran 3 of 17 exercises" in text


def test_the_list_loads_without_tomllib(monkeypatch):
    """Python 3.10 has no tomllib: the course then reads the list with its own small reader."""
    monkeypatch.setattr(_toml, "_tomllib", None)
    assert [ex.folder for ex in tree.load(ROOT)] == [p.name for p in sorted((ROOT / "exercises").glob("[0-9][0-9]_*"))]


def test_exercises_and_tests_collect_together():
    """exercises/ is a package only so that `pytest tests exercises` keeps tests/conftest.py importable
    as `conftest`; the checks' file names (test_NN_slug.py) clash with none in tests/."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests", "exercises"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
