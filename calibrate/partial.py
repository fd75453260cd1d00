"""Resumable progress: finished points survive a crash, Ctrl-C or a lost machine.

Each finished point is appended (and flushed) as one line of ``profile.partial.csv``;
``calibration.partial.json`` records the settings the run was started with. A re-run with
the same settings skips the finished points; different settings are refused with one error
that suggests ``--fresh``. Both files go away once the final profile is written.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.atomic_write import write_file
from sim.costmodel.profile import COLUMNS, KEY_COLUMNS

PARTIAL_CSV = "profile.partial.csv"
PARTIAL_JSON = "calibration.partial.json"
PARTIAL_COLUMNS = COLUMNS + ("note",)  # note: why a point was skipped, or how it was timed


def _key(row: dict[str, Any]) -> tuple:
    return tuple(str(row[c]) for c in KEY_COLUMNS)


def _normalise(settings: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(settings, sort_keys=True))


class PartialRun:
    """The partial files of one output directory."""

    def __init__(self, out: Path, settings: dict[str, Any], *, fresh: bool = False) -> None:
        self.out = Path(out)
        self.csv_path, self.json_path = self.out / PARTIAL_CSV, self.out / PARTIAL_JSON
        self.settings = _normalise(settings)
        self.rows: dict[tuple, dict[str, str]] = {}
        if fresh:
            return  # stale files are replaced by start(), nothing is deleted before that
        if self.json_path.is_file():
            try:
                previous = json.loads(self.json_path.read_text()).get("settings")
            except (json.JSONDecodeError, AttributeError):
                previous = None
            if previous != self.settings:
                raise InputError(f"{self.out} holds a partial calibration started with different settings "
                                 f"({_differences(previous, self.settings)}); rerun with --fresh to discard it "
                                 f"or choose another --out", field="out")
            self.rows = {_key(r): r for r in _read_rows(self.csv_path)}

    @property
    def resumed(self) -> int:
        return len(self.rows)

    def done(self, key: tuple) -> bool:
        return tuple(str(v) for v in key) in self.rows

    def start(self) -> None:
        """Write the settings file (and an empty CSV) unless resuming."""
        self.out.mkdir(parents=True, exist_ok=True)
        if self.rows:
            return
        write_file(self.json_path, json.dumps({"settings": self.settings}, indent=2, sort_keys=True) + "\n")
        write_file(self.csv_path, ",".join(PARTIAL_COLUMNS) + "\n")

    def record(self, row: dict[str, Any]) -> None:
        """Append one finished point and push it to disk before moving on."""
        line = {c: _cell(row.get(c, "")) for c in PARTIAL_COLUMNS}
        with open(self.csv_path, "a", newline="") as handle:
            csv.DictWriter(handle, PARTIAL_COLUMNS, lineterminator="\n").writerow(line)
            handle.flush()
            os.fsync(handle.fileno())
        self.rows[_key(line)] = line

    def finish(self) -> None:
        self.csv_path.unlink(missing_ok=True)
        self.json_path.unlink(missing_ok=True)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.9g}"
    return "" if value is None else str(value)


def _read_rows(path: Path) -> list[dict[str, str]]:
    """Complete rows only: a line cut short by a kill is dropped (that point is re-measured)."""
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        text = handle.read()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]
    rows = []
    for row in csv.DictReader(lines):
        if None in row or any(row.get(c) is None for c in PARTIAL_COLUMNS):
            continue
        rows.append(row)
    return rows


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in d.items():
        flat.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return flat


def _differences(old: Any, new: dict[str, Any]) -> str:
    if not isinstance(old, dict):
        return "unreadable settings file"
    old, new = _flatten(old), _flatten(new)
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys[:3]) + (", ..." if len(keys) > 3 else "")
