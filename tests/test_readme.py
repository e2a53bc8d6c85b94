"""The README's Python example runs as written, and its quick-start commands are the ones CI runs."""
from __future__ import annotations

import pathlib
import re

README = (pathlib.Path(__file__).parent.parent / "README.md").read_text()


def test_api_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "the README has no Python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_quick_start_has_exactly_the_two_commands():
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = [line.split("#")[0].strip() for line in re.findall(r"```bash\n(.*?)```", quick, flags=re.S)[0].splitlines()]
    assert commands == ['pip install -e . && minilin tour', 'pip install -e ".[test]" && pytest']
