"""The learner's stubs are made from the worked solutions, so the two can never drift apart.

In a solution, the part the learner writes sits between two marker comments inside a function:

    def retnet_parallel(q, k, v, gamma, *, scale=None):
        \"\"\"(the docstring that teaches the math: kept in the stub)\"\"\"
        # TODO: build the decay mask D, then O = (Q K^T * D) V
        ...the solution...
        # END TODO

and the stub is the same file with each marked block replaced by

        raise NotImplementedError("TODO: build the decay mask D, then O = (Q K^T * D) V (about 4 lines)")

where the line count is measured from the block (code lines, not blank or comment lines). Everything else
(module docstring, imports, signatures, docstrings) is the same in both files.

    python -m minilin.course.stubs            check every stub against its solution (exit 1 if one differs)
    python -m minilin.course.stubs --write    rewrite the stubs from the solutions (for maintainers)

`minilin reset N` uses the same function to restore a pristine stub.
"""
from __future__ import annotations

import re
import sys

_BEGIN = re.compile(r"^(?P<indent>[ \t]+)# TODO: (?P<text>.+?)\s*$")
_END = re.compile(r"^[ \t]+# END TODO\s*$")


def about(lines: int) -> int:
    """Round a line count the way a person would say "about N lines"."""
    return lines if lines <= 10 else 5 * round(lines / 5)


def make_stub(solution: str, name: str = "solution") -> str:
    """The stub text for a solution's text (see the module docstring)."""
    out, block, begin = [], None, None
    for number, line in enumerate(solution.splitlines(keepends=True), 1):
        if block is None:
            m = _BEGIN.match(line)
            if m:
                text = m.group("text")
                if '"' in text or "\\" in text:
                    raise ValueError(f"{name}, line {number}: keep quotes and backslashes out of a TODO text")
                block, begin = [], (number, m.group("indent"), text)
            elif _END.match(line):
                raise ValueError(f"{name}, line {number}: '# END TODO' without a '# TODO:' before it")
            else:
                out.append(line)
        elif _END.match(line):
            number0, indent, text = begin
            code = [b for b in block if b.strip() and not b.strip().startswith("#")]
            if not code:
                raise ValueError(f"{name}, line {number0}: the TODO block holds no code")
            n = about(len(code))
            message = f'"TODO: {text} (about {n} line{"s" if n != 1 else ""})"'
            line = f"{indent}raise NotImplementedError({message})\n"
            if len(line) > 110:  # keep the stub readable: the message on a line of its own
                line = f"{indent}raise NotImplementedError(\n{indent}    {message})\n"
            out.append(line)
            block = None
        elif _BEGIN.match(line):
            raise ValueError(f"{name}, line {number}: a '# TODO:' inside another (line {begin[0]})")
        else:
            block.append(line)
    if block is not None:
        raise ValueError(f"{name}, line {begin[0]}: '# TODO:' without '# END TODO'")
    return "".join(out)


def main(argv=None) -> int:
    from .tree import CourseError, load

    argv = sys.argv[1:] if argv is None else argv
    write = "--write" in argv
    try:
        exercises = load()
    except CourseError as error:
        print(error, file=sys.stderr)
        return 2
    stale = []
    for ex in exercises:
        stub = make_stub(ex.path("solutions").read_text(encoding="utf-8"), ex.relpath("solutions"))
        path = ex.path("exercises")
        if not path.exists() or path.read_text(encoding="utf-8") != stub:
            stale.append(ex.relpath())
            if write:
                path.write_text(stub, encoding="utf-8")
    verb = "rewrote" if write else "out of date"
    for p in stale:
        print(f"{verb}: {p}")
    if not stale:
        print(f"all {len(exercises)} stubs match their solutions")
    return 1 if stale and not write else 0


if __name__ == "__main__":
    sys.exit(main())
