"""The sweep's output folder: one JSON file per finished cell, and the table built from them.

A cell is keyed by a hash of what determines its result: the resolved config, the
contents of its trace and profile, and the code (package version plus the bytes of
sim/, policies/, workloads/ and a custom policy's module). Each cell file is written
atomically (sim.atomic_write), so a sweep killed at any moment leaves only whole
cells behind, and re-running it computes only the missing ones. Changed code or inputs
give new keys, so stale results are never reused.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import tomli_w

import sim
from sim.atomic_write import staged_file, write_file
from sim.config import RunConfig
from sim.errors import InputError
from sim.costmodel.profile import CSV_NAME, META_NAME, resolve_profile_path
from sim.lazy import lazy_module

pd = lazy_module("pandas")  # the tables only: a tune's or a search's runs never touch it

CODE_PACKAGES = ("sim", "policies", "workloads")
CELLS = "cells"
TABLE = "sweep"


def code_version() -> str:
    """The package version and a hash of every file of the simulator's packages (code and shipped data).

    Computed afresh by each sweep (a long-lived process may sweep again after an edit); a worker
    process computes it once, with :func:`worker_code_version`.
    """
    digest = hashlib.sha256(sim.__version__.encode())
    for root in _package_roots():
        for path in sorted(p for p in root.rglob("*") if p.is_file() and _is_source(p)):
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes())
    return f"{sim.__version__}+{digest.hexdigest()[:16]}"


@lru_cache(maxsize=1)
def worker_code_version() -> str:
    """The code a worker process runs: it cannot change under a running process, so hash it once."""
    return code_version()


def _package_roots() -> list[Path]:
    import importlib
    return [Path(importlib.import_module(name).__file__).parent for name in CODE_PACKAGES]


def _is_source(path: Path) -> bool:
    return "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")


def cell_key(config: RunConfig, version: str) -> str:
    """Hash of everything a cell's result depends on; the name of its file in cells/."""
    data = config.to_dict()
    data.pop("output", None)
    digest = hashlib.sha256(tomli_w.dumps(data).encode() + b"\0" + version.encode())
    for path in _input_files(config):
        digest.update(b"\0" + str(path.name).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


def _input_files(config: RunConfig) -> list[Path]:
    """Files outside the hashed packages that the run reads: its trace, its profile, a custom policy."""
    files = []
    if config.workload.trace is not None and Path(config.workload.trace).is_file():
        files.append(Path(config.workload.trace))
    inside = tuple(str(root) for root in _package_roots())
    try:
        profile_dir = resolve_profile_path(config.profile)
    except InputError:  # the run itself will fail and say why
        profile_dir = None
    if profile_dir is not None and not str(profile_dir.resolve()).startswith(inside):
        files += [p for p in (profile_dir / CSV_NAME, profile_dir / META_NAME) if p.is_file()]
    if ":" in config.policy.name:
        source = _policy_source(config.policy.name)
        if source is not None and not str(source.resolve()).startswith(inside):
            files.append(source)
    return files


def _policy_source(name: str) -> Path | None:
    from policies import policy_class

    try:
        file = inspect.getsourcefile(policy_class(name))
    except Exception:  # noqa: BLE001 - unresolvable: the run reports it
        return None
    return Path(file) if file else None


class CellStore:
    """cells/<key>.json in the output folder; a file is either absent or a whole cell."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.dir = self.out_dir / CELLS

    def prepare(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create the output folder: {exc.strerror or exc}", field="out",
                             source=self.out_dir) from None

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.path(key).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def save(self, key: str, record: dict[str, Any]) -> None:
        write_file(self.path(key), json.dumps(record, indent=1) + "\n")  # metrics in summary order


def build_table(cells: Iterable, keys: list[str], columns: list[str], store: CellStore) -> pd.DataFrame:
    """One row per cell in the sweep's own order: its parameters, status, error, key and scalar metrics."""
    rows, metric_names = [], {}
    for cell, key in zip(cells, keys):
        record = store.load(key)
        if record is None:
            raise RuntimeError(f"cell {cell.index} ({key}) has no stored result")
        metrics = record.get("metrics") or {}
        for name, value in metrics.items():
            if _scalar(value):
                metric_names.setdefault(name, None)
        rows.append(({"cell": cell.index, **{c: cell.columns.get(c) for c in columns}, "status": record["status"],
                      "error": record.get("error") or "", "key": key}, metrics))
    names = list(rows[0][0]) + list(metric_names) if rows else []
    values = {name: [params.get(name, metrics.get(name)) for params, metrics in rows] for name in names}
    return pd.DataFrame({name: _column(column) for name, column in values.items()})


def _column(values: list) -> pd.Series:
    """One type per column, as Parquet needs: whole numbers stay whole (nullable) where some cells lack
    them; a column that mixes numbers and text (a length given as 32 or as a table) becomes text."""
    kinds = {type(v) for v in values if v is not None and not _is_nan(v)}
    if kinds == {int}:
        return pd.Series(values, dtype="Int64")
    if kinds <= {int, float}:
        return pd.Series([math.nan if v is None else v for v in values], dtype="float64")
    if len(kinds) > 1:
        return pd.Series([None if v is None else str(v) for v in values], dtype=object)
    return pd.Series(values)


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) or value is None


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def write_tables(frame: pd.DataFrame, out_dir: Path, parquet: bool, csv: bool) -> list[Path]:
    """sweep.parquet and/or sweep.csv, each written atomically."""
    written = []
    if parquet:
        path = out_dir / f"{TABLE}.parquet"
        with staged_file(path) as staging:
            frame.to_parquet(staging, index=False)
        written.append(path)
    if csv:
        path = out_dir / f"{TABLE}.csv"
        write_file(path, frame.to_csv(index=False, lineterminator="\n").encode())
        written.append(path)
    return written


def have_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True
