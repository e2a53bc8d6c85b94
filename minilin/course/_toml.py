"""Read exercises/exercises.toml: `tomllib` on Python 3.11+, a small reader of the same subset on 3.10.

The fallback understands exactly what exercises.toml uses, and says so when it meets anything else:
comments, `[table]` and `[[array-of-tables]]` headers, dotted `[array.table]` headers (a table inside the
last entry of an array of tables, as `[exercise.function_hints]`), `key = value` with basic ("...") or literal ('...')
strings, integers, floats, true/false, and arrays of those (which may span lines, with trailing commas).
tests/test_course.py checks that it reads exercises.toml exactly as tomllib does.
"""
from __future__ import annotations

import re

try:  # Python 3.11+
    import tomllib as _tomllib
except ModuleNotFoundError:  # Python 3.10
    _tomllib = None


class TomlError(ValueError):
    pass


def loads(text: str) -> dict:
    if _tomllib is not None:
        return _tomllib.loads(text)
    return loads_subset(text)


_KEY = re.compile(r"[A-Za-z0-9_-]+")
_NUMBER = re.compile(r"[+-]?(\d[\d_]*)(\.\d[\d_]*)?([eE][+-]?\d+)?")
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


def loads_subset(text: str) -> dict:
    """The fallback reader (see the module docstring)."""
    root: dict = {}
    table = root
    pos, line = 0, 1

    def error(message):
        raise TomlError(f"exercises.toml line {line}: {message} (this reader knows only a small part of TOML; "
                        "use Python 3.11+ for the full format)")

    def skip_blank(multiline):
        nonlocal pos, line
        while pos < len(text):
            c = text[pos]
            if c in " \t\r":
                pos += 1
            elif c == "#":
                while pos < len(text) and text[pos] != "\n":
                    pos += 1
            elif c == "\n" and multiline:
                pos += 1
                line += 1
            else:
                return

    def value():
        nonlocal pos
        c = text[pos] if pos < len(text) else ""
        if c == '"':
            return basic_string()
        if c == "'":
            end = text.find("'", pos + 1)
            if end < 0 or "\n" in text[pos:end]:
                error("unterminated literal string")
            s, pos = text[pos + 1:end], end + 1
            return s
        if c == "[":
            pos += 1
            items = []
            while True:
                skip_blank(True)
                if pos < len(text) and text[pos] == "]":
                    pos += 1
                    return items
                items.append(value())
                skip_blank(True)
                if pos < len(text) and text[pos] == ",":
                    pos += 1
                elif pos < len(text) and text[pos] == "]":
                    pos += 1
                    return items
                else:
                    error("expected ',' or ']' in an array")
        for word, result in (("true", True), ("false", False)):
            if text.startswith(word, pos):
                pos += len(word)
                return result
        m = _NUMBER.match(text, pos)
        if m:
            pos = m.end()
            literal = m.group(0).replace("_", "")
            return float(literal) if (m.group(2) or m.group(3)) else int(literal)
        error(f"cannot read a value starting with {text[pos:pos + 10]!r}")

    def basic_string():
        nonlocal pos
        pos += 1
        out = []
        while True:
            if pos >= len(text) or text[pos] == "\n":
                error("unterminated string")
            c = text[pos]
            if c == '"':
                pos += 1
                return "".join(out)
            if c == "\\":
                e = text[pos + 1:pos + 2]
                if e in _ESCAPES:
                    out.append(_ESCAPES[e])
                    pos += 2
                elif e == "u":
                    out.append(chr(int(text[pos + 2:pos + 6], 16)))
                    pos += 6
                else:
                    error(f"unknown escape \\{e}")
            else:
                out.append(c)
                pos += 1

    while True:
        skip_blank(True)
        if pos >= len(text):
            return root
        if text.startswith("[[", pos):
            end = text.find("]]", pos)
            name = text[pos + 2:end].strip()
            if end < 0 or not _KEY.fullmatch(name):
                error("bad [[table]] header")
            existing = root.setdefault(name, [])
            if not isinstance(existing, list):
                error(f"{name} is both a table and an array of tables")
            table = {}
            existing.append(table)
            pos = end + 2
        elif text[pos] == "[":
            end = text.find("]", pos)
            parts = [part.strip() for part in text[pos + 1:end].split(".")]
            if end < 0 or not all(_KEY.fullmatch(part) for part in parts):
                error("bad [table] header")
            parent = root
            for part in parts[:-1]:   # a dotted header: into the last entry of an array of tables
                parent = parent.get(part)
                if isinstance(parent, list) and parent:
                    parent = parent[-1]
                if not isinstance(parent, dict):
                    error(f"[{'.'.join(parts)}]: {part} is not a table defined above")
            if parts[-1] in parent:
                error(f"repeated [table] header [{'.'.join(parts)}]")
            table = parent[parts[-1]] = {}
            pos = end + 1
        else:
            m = _KEY.match(text, pos)
            if not m:
                error(f"expected a key, got {text[pos:pos + 10]!r}")
            key = m.group(0)
            pos = m.end()
            skip_blank(False)
            if pos >= len(text) or text[pos] != "=":
                error(f"expected '=' after {key}")
            pos += 1
            skip_blank(False)
            if key in table:
                error(f"duplicate key {key}")
            table[key] = value()
        skip_blank(False)
        if pos < len(text) and text[pos] != "\n":
            error(f"unexpected text {text[pos:pos + 10]!r} at the end of a line")
