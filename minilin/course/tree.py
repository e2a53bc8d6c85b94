"""Where the exercises live and what the list says about them.

A learner works in a clone of minilin: the course finds it by walking up from the current directory to
the first folder holding `exercises/exercises.toml` (or takes `--root` / $MINILIN_ROOT). Inside it:

    exercises/exercises.toml           the list: order, slug, title, file, points, hints, gpu, ...
    exercises/NN_slug/<file>.py        the learner's file (a stub until written)
    exercises/NN_slug/test_NN_slug.py  its check (the learner never edits it)
    solutions/NN_slug/<file>.py        the worked solution, same names and signatures

NN is the exercise's position in the list, counted from 1.

An entry of the list:

    [[exercise]]
    slug = "retnet"                      the folder is NN_slug
    title = "Fixed decay: RetNet in three forms"
    file = "retnet.py"                   the learner's file inside the folder
    points = 10
    reference = ["minilin.mixers.retnet"]   what the check compares against (never callable from the file)
    hints = ["a nudge", "more", "the plan"] 1 to 3, shown in order by `minilin hint`
    allow = ["minilin.scan"]             optional: minilin modules the learner's file may call
    gpu = true                           optional: needs CuPy and a GPU
    timeout = 120                        optional: seconds one check may take (default DEFAULT_TIMEOUT)

    [exercise.function_hints]            optional: 1 to 3 hints per function of the file; after a failure
    decay_mask = ["...", "..."]          the hint shown is that of the function that failed
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from . import _toml

LIST_NAME = "exercises.toml"
FIELDS = {"slug": str, "title": str, "file": str, "points": int, "hints": list}
OPTIONAL = {"gpu": (bool, False), "reference": (list, []), "allow": (list, []), "timeout": ((int, float), None),
            "function_hints": (dict, {})}

# Seconds one check may run before it counts as an endless loop (the checks of the CPU exercises take well
# under a second; a GPU exercise compiles its kernel first and sets its own `timeout`).
DEFAULT_TIMEOUT = 10.0


class CourseError(Exception):
    """Something about the exercise tree is wrong; the message says what to do."""


@dataclass(frozen=True)
class Exercise:
    number: int                 # position in the list, from 1
    slug: str
    title: str
    file: str                   # the learner's file name inside the exercise folder
    points: int
    hints: tuple
    gpu: bool = False
    reference: tuple = ()       # the minilin modules its check compares against
    allow: tuple = ()           # the minilin modules the learner's file may call (none by default)
    timeout: float = DEFAULT_TIMEOUT   # seconds one check may take
    function_hints: tuple = ()  # ((function name, (hint, ...)), ...)
    root: Path = field(default=Path("."), compare=False)

    def hints_for(self, function: str | None) -> tuple:
        """The hints of one function of the learner's file, or the exercise's own when it has none."""
        return dict(self.function_hints).get(function, self.hints) if function else self.hints

    @property
    def folder(self) -> str:
        return f"{self.number:02d}_{self.slug}"

    @property
    def label(self) -> str:
        return f"{self.number:02d} {self.title}"

    def path(self, tree: str = "exercises") -> Path:
        """The learner's file in `exercises` (default) or `solutions`."""
        return self.root / tree / self.folder / self.file

    def relpath(self, tree: str = "exercises") -> str:
        """The file's path as the learner would type it from the repository root."""
        return f"{tree}/{self.folder}/{self.file}"

    def test_path(self) -> Path:
        """The exercise's check: exercises/NN_slug/test_NN_slug.py (a name no other test file has, so that
        pytest can collect the exercises together with tests/)."""
        path = self.root / "exercises" / self.folder / f"test_{self.folder}.py"
        if not path.is_file():
            raise CourseError(f"{path}: the check of exercise {self.number} is missing")
        return path


def find_root(start=None) -> Path:
    """The repository root: $MINILIN_ROOT, else the first folder at or above `start` (default: the current
    directory) that holds exercises/exercises.toml."""
    if start is None and os.environ.get("MINILIN_ROOT"):
        start = os.environ["MINILIN_ROOT"]
        if not (Path(start) / "exercises" / LIST_NAME).is_file():
            raise CourseError(f"MINILIN_ROOT={start} holds no exercises/{LIST_NAME}")
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "exercises" / LIST_NAME).is_file():
            return folder
    raise CourseError(
        f"no minilin exercises found in {here} or any folder above it.\n"
        "The exercises live in a clone of the minilin repository: cd into your clone (the folder with\n"
        "exercises/ and solutions/) and run the command again, or pass --root PATH_TO_CLONE.\n"
        "Everything else works from anywhere: minilin tour, minilin bench --device cpu, minilin doctor "
        "(minilin --help lists them).")


def load(root=None) -> list[Exercise]:
    """The exercises of the tree at `root` (found with `find_root` when None), in list order."""
    root = Path(root) if root is not None else find_root()
    list_path = root / "exercises" / LIST_NAME
    try:
        data = _toml.loads(list_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CourseError(f"cannot read {list_path}: {error}") from error
    entries = data.get("exercise")
    if not isinstance(entries, list) or not entries:
        raise CourseError(f"{list_path}: expected [[exercise]] entries")
    exercises = []
    for number, entry in enumerate(entries, 1):
        where = f"{list_path}, exercise {number}"
        for key, kind in FIELDS.items():
            if not isinstance(entry.get(key), kind) or (kind is bool) != isinstance(entry.get(key), bool):
                raise CourseError(f"{where}: expected {key} ({kind.__name__}), got {entry.get(key)!r}")
        if not all(isinstance(hint, str) for hint in entry["hints"]):
            raise CourseError(f"{where}: expected hints to be a list of strings")
        unknown = set(entry) - set(FIELDS) - set(OPTIONAL)
        if unknown:
            raise CourseError(f"{where}: unknown keys {sorted(unknown)}")
        for key, (kind, default) in OPTIONAL.items():
            if key in entry and (not isinstance(entry[key], kind) or isinstance(entry[key], bool) != (kind is bool)):
                raise CourseError(f"{where}: expected {key} ({getattr(kind, '__name__', 'a number')}), got {entry[key]!r}")
        extra = {key: entry.get(key, default) for key, (kind, default) in OPTIONAL.items()}
        for key in ("reference", "allow"):
            if not all(isinstance(name, str) for name in extra[key]):
                raise CourseError(f"{where}: expected {key} to be a list of module names")
        for function, hints in extra["function_hints"].items():
            if not isinstance(hints, list) or not all(isinstance(hint, str) for hint in hints):
                raise CourseError(f"{where}: expected function_hints.{function} to be a list of strings")
        exercises.append(Exercise(number=number, slug=entry["slug"], title=entry["title"], file=entry["file"],
                                  points=entry["points"], hints=tuple(entry["hints"]), gpu=bool(extra["gpu"]),
                                  reference=tuple(extra["reference"]), allow=tuple(extra["allow"]),
                                  timeout=float(extra["timeout"] or DEFAULT_TIMEOUT),
                                  function_hints=tuple((f, tuple(h)) for f, h in extra["function_hints"].items()),
                                  root=root))
    return exercises


def select(exercises: list[Exercise], number) -> Exercise:
    """Exercise `number` (an int or a string like '6', '06' or '06_retnet')."""
    text = str(number).strip()
    digits = text.split("_", 1)[0]
    if digits.isascii() and digits.isdigit() and 1 <= int(digits) <= len(exercises):  # not "²", which int() refuses
        return exercises[int(digits) - 1]
    for ex in exercises:
        if text in (ex.slug, ex.folder):
            return ex
    raise CourseError(f"no exercise {number!r}: choose a number from 1 to {len(exercises)} (minilin status lists them)")


def exercise_of(path, exercises: list[Exercise]):
    """The exercise whose folder holds `path` (a test file), or None."""
    folder = Path(path).resolve().parent.name
    return next((ex for ex in exercises if ex.folder == folder), None)
