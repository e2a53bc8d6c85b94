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
EXERCISES = tree.load(ROOT)
COUNT, POINTS = len(EXERCISES), sum(ex.points for ex in EXERCISES)
GPU = [ex.number for ex in EXERCISES if ex.gpu]
SKIPPED = f"({', '.join(f'{n:02d}' for n in GPU)} skipped: no GPU here)"


# ---------------------------------------------------------------- the list

def test_fallback_reader_reads_the_list_as_tomllib_does():
    tomllib = pytest.importorskip("tomllib")
    text = (ROOT / "exercises" / "exercises.toml").read_text(encoding="utf-8")
    assert _toml.loads_subset(text) == tomllib.loads(text)
    sample = 'a = "x \\" \\\\ \\u00e9"  # c\nb = \'lit\'\n[t]\nn = -1_000\nf = 2.5e3\nl = [\n 1, # one\n 2,\n]\nok = true\n'
    assert _toml.loads_subset(sample) == tomllib.loads(sample)
    nested = '[[e]]\na = 1\n[e.h]\nx = ["1"]\n[[e]]\na = 2\n[e.h]\ny = ["2", "3"]\n'
    assert _toml.loads_subset(nested) == tomllib.loads(nested) == {"e": [{"a": 1, "h": {"x": ["1"]}},
                                                                        {"a": 2, "h": {"y": ["2", "3"]}}]}


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
    with pytest.raises(tree.CourseError, match="no exercise '²'"):  # a digit to str.isdigit, not to int()
        tree.select(exercises, "²")


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


def test_check_gradients_names_sign_shift_and_a_missing_none():
    from minilin.course.checks import check_gradients

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 9, 3))
    loss = lambda x: float(np.sum(np.sin(x)))                       # dL/dx = cos(x)
    grad = np.cos(x)
    check_gradients("f", (grad, None), (grad, None), names=("dx", "dS0"), dims=("B T H", "B H"),
                    loss=lambda x, S0: loss(x), inputs=(x, None))
    with pytest.raises(CheckFailure, match="every value has the wrong sign") as failure:
        check_gradients("f", (-grad,), (grad,), names=("dx",), dims=("B T H",), loss=loss, inputs=(x,))
    assert "finite differences side with minilin's" in str(failure.value)
    late = np.concatenate([np.zeros_like(grad[:, :1]), grad[:, :-1]], axis=1)
    with pytest.raises(CheckFailure, match="shifted by one token, late: the gradient at t is the one expected at t - 1"):
        check_gradients("f", (late,), (grad,), names=("dx",), dims=("B T H",))
    with pytest.raises(CheckFailure, match=r"f: dS0: expected None \(there is no such input"):
        check_gradients("f", (grad, grad[:, 0]), (grad, None), names=("dx", "dS0"), dims=("B T H", "B H"))
    with pytest.raises(CheckFailure, match=r"expected a tuple \(dx, dS0\) of 2 items, got an array"):
        check_gradients("f", grad, (grad, None), names=("dx", "dS0"), dims=("B T H", "B H"))
    # A gradient that matches the expected one but not the loss's finite differences: the check's own bug.
    with pytest.raises(CheckFailure, match="a bug in the check, not in your code"):
        check_gradients("f", (2 * grad,), (2 * grad,), names=("dx",), dims=("B T H",), loss=loss, inputs=(x,))


def test_blas_threads_restores_the_count():
    from minilin.course.checks import _openblas_threads, blas_threads

    found = _openblas_threads()
    if found is None:
        pytest.skip("no OpenBLAS found in this process")
    get, _ = found
    before = get()
    with blas_threads(1):
        assert get() == 1
    assert get() == before


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
    assert code == 0 and f"0/{COUNT} solved, 0/{POINTS} points" in text
    assert "next: 01 Causal softmax attention" in text and "minilin check 1" in text


def test_status_check_and_hint(course, monkeypatch):
    _solve(course, 1)
    _solve(course, 2)
    code, text = minilin(course, "status", monkeypatch=monkeypatch)
    assert f"2/{COUNT} solved, 10/{POINTS} points" in text and "next: 03 Feature maps" in text
    code, text = minilin(course, "check", monkeypatch=monkeypatch)
    assert code == 1 and text.startswith("03 Feature maps") and "not started" in text
    code, text = minilin(course, "check", "2", monkeypatch=monkeypatch)
    assert code == 0 and "02 solved, +5 points" in text and "next: 03 Feature maps" in text
    code, text = minilin(course, "hint", "3", "2", monkeypatch=monkeypatch)
    assert "hint (1 of 3)" in text and "hint (2 of 3)" in text and "hint (3 of 3)" not in text
    assert "(a more specific one: minilin hint 3 3)" in text
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


def test_check_confirms_a_solve_then_makes_the_next_one_current(course, monkeypatch):
    code, text = minilin(course, "check", monkeypatch=monkeypatch)
    assert code == 1 and text.startswith("01 Causal softmax attention") and "not started" in text
    _solve(course, 1)
    code, text = minilin(course, "check", monkeypatch=monkeypatch)        # the current one: 01, now solved
    assert code == 0 and text.startswith("01 Causal softmax attention") and "01 solved, +5 points" in text
    assert "next: 02 The bracket move" in text
    code, text = minilin(course, "check", monkeypatch=monkeypatch)        # and 02 is current now
    assert code == 1 and text.startswith("02 The bracket move") and "not started" in text
    assert (course / ".minilin" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_the_hint_belongs_to_the_function_that_failed(course, monkeypatch):
    ex = _solve(course, 6)
    ex.path().write_text(ex.path().read_text().replace("gamma[:, None, None] ** C * S", "S"))
    code, text = minilin(course, "check", "6", monkeypatch=monkeypatch)
    assert code == 1 and "retnet_chunked(scale=0.3, chunk_size=16): o" in text
    assert "hint for retnet_chunked() (1 of 3): Exercise 05's chunk loop" in text
    assert "more: minilin hint 6 2 --for retnet_chunked" in text
    code, text = minilin(course, "hint", monkeypatch=monkeypatch)         # no number: the current exercise,
    assert text.startswith("06 Fixed decay") and "hint for retnet_chunked() (1 of 3)" in text  # its failure
    code, text = minilin(course, "hint", "6", "2", "--for", "decay_mask", monkeypatch=monkeypatch)
    assert "hint for decay_mask() (1 of 2)" in text and "hint for decay_mask() (2 of 2)" in text
    code, text = minilin(course, "hint", "6", "2", monkeypatch=monkeypatch)
    assert "  hint (2 of 3): decay_mask: exponent" in text and "(hints for one function: minilin hint 6 --for" in text


def test_check_times_out_an_endless_loop(course, monkeypatch):
    ex = _solve(course, 7)
    ex.path().write_text(ex.path().read_text().replace("offset *= 2", "offset *= 1"))
    code, text = minilin(course, "check", "7", "--timeout", "1", monkeypatch=monkeypatch)
    assert code == 1 and "✗ test_associative_scan" in text.replace("x test_", "✗ test_")
    assert "check timed out after 1 s: an endless loop? associative_scan() was still running" in text
    assert "hint for associative_scan() (1 of 3)" in text


def test_check_shows_what_the_learner_code_printed(course, monkeypatch):
    ex = _solve(course, 4)
    ex.path().write_text(ex.path().read_text().replace(
        "    return keys.T @ values", "    print('keys of shape', keys.shape)\n    return keys.T @ values"))
    code, text = minilin(course, "check", "4", monkeypatch=monkeypatch)
    assert code == 0 and "what your code printed:\n  | keys of shape (1, 4)\n  | keys of shape (6, 8)" in text
    ex.path().write_text(ex.path().read_text().replace("print('keys of shape', keys.shape)",
                                                       "[print(i) for i in range(100)]"))
    code, text = minilin(course, "check", "4", monkeypatch=monkeypatch)
    assert "what your code printed (the last 20 of 600 lines):\n  | 80\n" in text and text.count("  | ") == 20  # 6 cases


class FakeKeys:
    """Stands in for minilin.course.keys.Keys: each wait() takes the next scripted step, a key or a function
    that edits files (the learner saving); when the script is over, 'q'."""

    single = True

    def __init__(self, *script):
        self.script = list(script)
        self.entered = False

    def __enter__(self):
        self.entered = True
        return self

    def __exit__(self, *exc):
        return False

    def wait(self, seconds):
        if not self.script:
            return "q"
        step = self.script.pop(0)
        if callable(step):
            step()
            return None
        return step


def _save(ex, text=None):
    """A save of the learner's file (the solution by default), seen by watch's polling."""
    def save():
        ex.path().write_text(text if text is not None else ex.path("solutions").read_text())
        stamp = os.stat(ex.path()).st_mtime_ns
        os.utime(ex.path(), ns=(stamp + 10 ** 9, stamp + 10 ** 9))
    return save


def watching(course, keys, *args, monkeypatch):
    """`minilin watch ARGS` with scripted keys, no GPU; returns (exit code, output)."""
    import contextlib
    import io

    from minilin.course import commands

    monkeypatch.chdir(course)
    monkeypatch.setattr(commands, "gpu_status", lambda: (False, "needs a GPU: none here"))
    monkeypatch.setattr(commands, "POLL_SECONDS", 0.0)
    parsed = cli.build_parser().parse_args(["watch", *args])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = commands.watch(parsed, keys=keys)
    return code, out.getvalue()


def test_watch_confirms_moves_on_and_passes_over_the_gpu_exercises(course, monkeypatch):
    exercises = tree.load(course)
    for ex in exercises:
        if not ex.gpu and ex.number not in (13, 15):
            _solve(course, ex.number)                  # 13 and 15 are left; the GPU ones cannot run here
    from minilin.course import progress

    progress.remember(exercises[14])                   # the learner is on 15
    keys = FakeKeys(_save(exercises[14]), "q")
    code, text = watching(course, keys, monkeypatch=monkeypatch)
    assert code == 0 and keys.entered
    assert "minilin watch: checks run on every save of exercises/15_hybrid_stack/hybrid.py" in text
    assert "15 solved, +10 points" in text
    # past the GPU ones (no GPU here) and the solved ones, round to 13, the one left
    assert "next: 13 Gated DeltaNet" in text and "exercises/13_gated_deltanet/gated_deltanet.py" in text
    assert "16_cuda_recurrent" not in text and "Stopped watching." in text
    keys = FakeKeys(_save(exercises[12]))
    code, text = watching(course, keys, monkeypatch=monkeypatch)
    assert "13 solved, +15 points" in text and "Every exercise that can run here is solved" in text


def test_watch_n_stays_on_n_and_takes_keys(course, monkeypatch):
    ex = tree.load(course)[4]
    keys = FakeKeys("h", "h", "r", _save(ex), None, "q")
    code, text = watching(course, keys, "5", monkeypatch=monkeypatch)
    assert code == 0 and not keys.script
    screens = text.split("-" * 78)                     # not a terminal: a rule between the screens
    assert "not started" in screens[1] and "hint (" not in screens[1]
    assert "hint (1 of 3)" in screens[2] and "hint (2 of 3)" not in screens[2]   # h: the first hint
    assert "hint (2 of 3)" in screens[3]                                           # h again: the next
    assert "hint (2 of 3)" not in screens[4]                                       # r: checked again
    assert "05 solved, +8 points" in screens[5] and "watching 05 still" in screens[5]
    assert "06 Fixed decay" not in text and "[h] hint  [n] next exercise  [r] check again  [q] quit" in text


def test_watch_survives_an_endless_loop(course, monkeypatch):
    ex = _solve(course, 7)
    text = ex.path().read_text()
    ex.path().write_text(text.replace("offset *= 2", "offset *= 1"))
    keys = FakeKeys(_save(ex, text), "n", "q")
    code, out = watching(course, keys, "7", "--timeout", "1", monkeypatch=monkeypatch)
    assert "check timed out after 1 s: an endless loop?" in out and "07 solved, +10 points" in out
    assert "on to 08 Selective SSM" in out               # n: the next unsolved one


def test_watch_clears_the_screen_on_a_terminal():
    import io

    from minilin.course import commands

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = commands._Screen(commands.Style(), stream=Terminal())
    screen.clear()
    assert screen.stream.getvalue() == commands.CLEAR


def test_keys_without_enter_on_a_terminal():
    termios = pytest.importorskip("termios")
    pty = pytest.importorskip("pty")
    from minilin.course.keys import Keys

    master, slave = pty.openpty()
    stream = os.fdopen(slave, "r")
    before = termios.tcgetattr(slave)
    try:
        with Keys(stream) as keys:
            assert keys.mode == "cbreak" and keys.single
            assert not termios.tcgetattr(slave)[3] & termios.ICANON        # no line buffering
            os.write(master, b"H")
            assert keys.wait(2.0) == "h"
            assert keys.wait(0.01) is None
        assert termios.tcgetattr(slave) == before                          # the terminal as it was
    finally:
        stream.close()
        os.close(master)


def test_keys_from_a_pipe_are_lines():
    from minilin.course.keys import Keys

    read, write = os.pipe()
    stream = os.fdopen(read, "r")
    with Keys(stream) as keys:
        assert keys.mode == "lines" and not keys.single
        os.write(write, b"n\n\n")
        assert keys.wait(2.0) == "n" and keys.wait(2.0) == "\n"
        os.close(write)
        assert keys.wait(2.0) is None and keys.mode == "none"             # the input ended: only waiting
    stream.close()
    with Keys(io_without_fileno()) as keys:
        assert keys.mode == "none" and keys.wait(0.0) is None


def io_without_fileno():
    import io

    return io.StringIO("q\n")


# ---------------------------------------------------------------- pytest exercises

def _pytest(course, *args, **environment):
    """`pytest exercises` in the copied tree, as a learner runs it. The summaries asserted below are those of
    a machine without a GPU, so the GPU is hidden from the child; minilin is importable from this checkout
    even where it is not pip-installed."""
    import minilin

    package_root = str(Path(minilin.__file__).resolve().parents[1])
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}  # not an xdist worker
    env.update(CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p), **environment)
    done = subprocess.run([sys.executable, "-m", "pytest", "exercises", "-p", "no:cacheprovider", *args],
                          cwd=course, capture_output=True, text=True, env=env)
    return done.returncode, done.stdout + done.stderr


def test_pytest_exercises_on_a_learner_tree(course):
    _solve(course, 1)
    ex = _solve(course, 2)
    ex.path().write_text(ex.path().read_text().replace("return 2 * d_k * d_v / (d_k + d_v)", "return d_k"))
    endless = _solve(course, 7)
    endless.path().write_text(endless.path().read_text().replace("offset *= 2", "offset *= 1"))
    code, text = _pytest(course, MINILIN_CHECK_TIMEOUT="1")
    assert code == 1
    lines = text.splitlines()
    table = lines[lines.index(next(l for l in lines if "minilin exercises (exercises/)" in l)) + 1:]
    assert table[0].startswith("01 ") and table[0].rstrip().endswith("5/5   solved")
    assert table[1].startswith("02 ") and "failing" in table[1]
    assert table[2].startswith("03 ") and table[2].rstrip().endswith(
        "not started: open exercises/03_feature_maps/feature_maps.py (minilin hint 3)")
    assert [l[:2] for l in table[:COUNT]] == [f"{n:02d}" for n in range(1, COUNT + 1)]
    assert table[COUNT] == (f"1/{COUNT} solved, 5/{POINTS} points {SKIPPED}; "
                         "next: 02 The bracket move: linear attention, parallel and recurrent, exercises/02_bracket_move/bracket.py")
    assert "NotImplementedError" not in text            # untouched ones are a line in the table, not tracebacks
    assert "crossover(d_k=16, d_v=48): values differ" in text
    assert "check timed out after 1 s: an endless loop? associative_scan() was still running" in text
    assert table[6].startswith("07 ") and "failing" in table[6]
    assert " todo" in lines[-1] and "failed" in lines[-1]


def test_pytest_exercises_solutions(course):
    code, text = _pytest(course, "--solutions")
    assert code == 0, text[-3000:]
    cpu = [ex for ex in EXERCISES if not ex.gpu]
    assert f"{len(cpu)}/{COUNT} solved, {sum(ex.points for ex in cpu)}/{POINTS} points {SKIPPED}" in text


def test_pytest_runs_only_the_named_exercises(course):
    code, text = _pytest(course, "--solutions", "-k", "16 or 17 or 06")
    assert code == 0
    assert "06 Fixed decay" in text and "16 GPU" in text and "17 GPU" in text and "05 Chunked" not in text
    assert f"(ran 3 of {COUNT} exercises" in text


def test_a_run_of_some_checks_is_not_called_solved(course):
    """-k (or --lf, a node id) that selects some of an exercise's checks: they passed, but the exercise is partial,
    with no points, until all of them run."""
    code, text = _pytest(course, "--solutions", "-k", "softmax_attention and decode")
    assert code == 0
    line = next(l for l in text.splitlines() if l.startswith("01 "))
    assert "0/5" in line and "partial: 1 of its 3 checks ran and passed (minilin check 1 runs them all)" in line


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
