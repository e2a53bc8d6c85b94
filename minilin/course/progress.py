"""The learner's place in the course, remembered between commands: the current exercise (the one `minilin
check`, `hint` and `watch` mean when given no number) and the function whose check failed last there (whose
hints `minilin hint` shows).

Kept in <root>/.minilin/progress.json, a folder that ignores itself in git (it holds a .gitignore of `*`).
Losing the file loses nothing: the current exercise is then the first one not solved.
"""
from __future__ import annotations

import json
from pathlib import Path

FOLDER, NAME = ".minilin", "progress.json"


def _path(root) -> Path:
    return Path(root) / FOLDER / NAME


def load(root) -> dict:
    try:
        data = json.loads(_path(root).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(root, **changes) -> None:
    """Update the stored fields (None removes one). A read-only clone simply remembers nothing."""
    data = load(root)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = _path(root)
    try:
        path.parent.mkdir(exist_ok=True)
        ignore = path.parent / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# minilin's record of where you are in the exercises: yours, not the repository's\n*\n",
                              encoding="utf-8")
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    except OSError:
        pass


def current(exercises):
    """The stored current exercise, or None when none is stored (or it is not in the list any more)."""
    if not exercises:
        return None
    folder = load(exercises[0].root).get("current")
    return next((ex for ex in exercises if ex.folder == folder), None)


def remember(ex, function: str | None = None) -> None:
    """Make `ex` the current exercise; `function`: the one whose check failed (None: none did)."""
    save(ex.root, current=ex.folder, function=function or None)


def failed_function(ex) -> str | None:
    """The function whose check failed last in `ex`, if `ex` is the current exercise."""
    data = load(ex.root)
    return data.get("function") if data.get("current") == ex.folder else None
