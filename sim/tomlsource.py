"""TOML input with line numbers: parse with a one-line error, and find the line each key is on.

``tomllib`` gives values but not where they were written, and every bad value must be
answered with its file and line. :class:`KeyLines` reads the text once and records the
line of every header and key by its path, so the config, regress baselines and sweep
files all point at the same place for the same key:

- ``[engine]`` then ``max_batch_size = 0``: the line of ``max_batch_size``;
- ``engine.max_batch_size = 0`` (a dotted key): that line;
- ``workload = { rate = 0 }`` (an inline table): that line, for ``workload.rate`` too;
- ``[[scenario]]`` (arrays of tables): paths carry the index, ``("scenario", 2, "name")``.

A key that is not written (a default) falls back to its nearest written parent, e.g. the
``[engine]`` header. Enough of TOML for our files: multi-line arrays and inline tables are
skipped as one value; keys inside them are found at their parent's line.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from sim.errors import InputError

KeyPath = tuple  # a key's path: names and [[array]] indices, e.g. ("scenario", 0, "overrides", "workload")

_BARE_OR_QUOTED = r'(?:[A-Za-z0-9_\-]+|"[^"]*"|\'[^\']*\')'
_KEY = re.compile(rf"^({_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*)\s*=")
_HEADER = re.compile(r"^(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def parse_toml(text: str, source: str | Path) -> dict[str, Any]:
    """``tomllib.loads`` whose syntax errors are one InputError naming the file and line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise InputError(f"not valid TOML: {str(exc).split(' (at')[0]}", source=source,
                         line=int(match.group(1)) if match else None) from None


class KeyLines:
    """The line of every header and key of a TOML text, by path (see the module docstring)."""

    def __init__(self, text: str) -> None:
        self.lines: dict[tuple, int] = {}
        self.dotted: dict[str, int] = {}  # the same, by dotted name (a quoted "a.b" key reads as a.b)
        arrays: dict[tuple, int] = {}  # [[array]] path (without indices) -> index of its latest table
        current: tuple = ()
        depth = 0  # open brackets of a multi-line value: its lines are neither headers nor keys
        for number, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if depth:
                depth = max(0, depth + _bracket_balance(stripped))
                continue
            header = _HEADER.match(stripped)
            if header:
                parts = _with_indices(_split(header.group(2)), arrays)
                if header.group(1) == "[[":
                    names = tuple(p for p in parts if not isinstance(p, int))
                    arrays[names] = arrays.get(names, -1) + 1
                    parts = parts + (arrays[names],)
                current = parts
                self._record(current, number)
                continue
            key = _KEY.match(stripped)
            if key:
                self._record(current + _split(key.group(1)), number)
                depth = max(0, _bracket_balance(stripped[key.end():]))

    def _record(self, path: tuple, number: int) -> None:
        self.lines.setdefault(path, number)
        self.dotted.setdefault(".".join(str(p) for p in path if not isinstance(p, int)), number)

    def find(self, path: KeyPath | str) -> int | None:
        """The line of ``path`` (a tuple, or a dotted string without [[array]] indices), else of its
        nearest written parent; None if nothing of it is written."""
        if isinstance(path, str):
            while path:
                if path in self.dotted:
                    return self.dotted[path]
                path = path.rpartition(".")[0]
            return None
        for end in range(len(path), 0, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return None


def _split(dotted: str) -> tuple:
    """``a."b.c".d`` -> ("a", "b.c", "d")."""
    return tuple(part.strip().strip("\"'") for part in re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+', dotted)
                 if part.strip())


def _with_indices(parts: tuple, arrays: dict[tuple, int]) -> tuple:
    """[scenario.expected] belongs to the latest [[scenario]]: its index goes after the prefix."""
    out: tuple = ()
    for i, part in enumerate(parts):
        out += (part,)
        if parts[:i + 1] in arrays and i + 1 < len(parts):
            out += (arrays[parts[:i + 1]],)
    return out


def _bracket_balance(text: str) -> int:
    """Opened minus closed brackets and braces on a line, strings and comments aside."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'', "", text).split("#", 1)[0]
    return text.count("[") + text.count("{") - text.count("]") - text.count("}")
