"""The README's Python examples run as written, its quick-start commands are the ones CI runs, and the files
it points a newcomer to exist."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def commands(text: str) -> list[str]:
    """The command lines of a shell text: comments and blank lines dropped, whitespace trimmed."""
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def quick_start() -> str:
    return README.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def test_python_examples_run():
    """In order, in one namespace, as a reader pastes them into one session (a later one builds on an earlier)."""
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "the README has no Python example"
    session: dict = {}
    for code in blocks:
        exec(compile(code, "README.md", "exec"), session)


def test_quick_start_is_what_ci_runs():
    """Every quick-start command, in the same order, is a command of .ci/run (which runs more after them)."""
    shell = re.findall(r"```bash\n(.*?)```", quick_start(), flags=re.S)
    assert shell, "the quick start has no bash block"
    quick = commands(shell[0])
    assert quick[0].startswith("pip install -e "), quick
    ci = commands((ROOT / ".ci" / "run").read_text())
    positions = [ci.index(command) if command in ci else -1 for command in quick]
    missing = [command for command, at in zip(quick, positions) if at < 0]
    assert not missing, f".ci/run does not run the quick start's {missing}"
    assert positions == sorted(positions), f".ci/run runs the quick start's commands in another order: {quick}"


def test_the_quick_start_shows_a_first_mixer_call():
    assert "```python" in quick_start(), "the quick start needs a first mixer call a reader can paste"


def test_paths_named_in_the_layout_exist():
    """A file the layout names is in the tree (by its path, or by its name under the folder it is listed in)."""
    layout = README.split("## How the pieces are laid out", 1)[1]
    named = set(re.findall(r"[\w./-]+\.(?:md|py|sh|toml|cu|cuh)\b", layout))
    named |= {"CONVENTIONS.md", "CONTRIBUTING.md", "LICENSE", "csrc/NOTES.md", ".ci/run", "tools/gpu_check.sh",
              "tools/compare_builds.py", "tools/profile_chunked.py", "tools/ncu_regions.py"}
    for name in sorted(named):
        found = [path for path in ROOT.glob(f"**/{pathlib.PurePath(name).name}")
                 if ".git" not in path.parts and path.as_posix().endswith(name)]
        assert found, f"the README's layout names {name}, which is not in the tree"
