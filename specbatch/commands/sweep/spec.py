"""The sweep file: a base scenario and the axes to vary, expanded into resolved cells.

Every cell's config is resolved with ``load_config`` before anything runs, so an unknown
axis, an empty axis or a value of the wrong type fails at once with one line naming the
axis, the sweep file and the line. Axis keys are whatever ``load_config`` accepts (dotted
keys such as ``workload.rate``, or a ``specbatch run`` flag name such as ``rate``), so a
setting added to the config later is an axis without any change here.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies import PolicyError, make_policy
from sim.config import RunConfig, flatten_sections, key_for, load_config
from sim.errors import InputError, missing_file, read_text
from sim.tomlsource import KeyLines, parse_toml

POLICY_AXIS = "policy"
TOP_KEYS = ("base", "scenario", "axes", "zip")
EXCLUSIVE = ("workload.duration_s", "workload.num_requests")


@dataclass(frozen=True)
class Axis:
    """One varied setting: its name as written, where it is written, and one override dict per value."""

    name: str                    # as written in the file, e.g. "rate" or "workload.rate" or "policy"
    where: str                   # "axes.rate" or "zip.load.rate": the TOML path, for messages
    line: int | None
    points: tuple[dict[str, Any], ...]   # config key -> value, one dict per value of the axis
    columns: tuple[dict[str, Any], ...]  # table column -> value, one dict per value of the axis


@dataclass(frozen=True)
class Cell:
    index: int
    config: RunConfig
    columns: dict[str, Any]


@dataclass(frozen=True)
class Sweep:
    path: Path
    base: Path | None
    axes: tuple[Axis, ...]
    dimensions: tuple[tuple[Axis, ...], ...]  # the product runs over these; a zip group is one dimension
    cells: tuple[Cell, ...]

    @property
    def columns(self) -> list[str]:
        """The table's parameter columns: each axis's, in the order the file gives them."""
        names: dict[str, None] = {}
        for axis in self.axes:
            for point in axis.columns:
                names.update(dict.fromkeys(point))
        return list(names)


def load_sweep(path: str | Path) -> Sweep:
    """Parse a sweep file and resolve every cell's config; any bad input raises one InputError."""
    path = Path(path)
    if not path.is_file():
        raise InputError(missing_file(path, "sweep file"), source=path, field="sweep")
    text = read_text(path, field="sweep")
    return sweep_from_data(parse_toml(text, path), _Where(path, text, path.parent))


def sweep_from_data(data: dict[str, Any], where: "_Where | None" = None) -> Sweep:
    """A sweep given as data in the sweep file's shape (the Python API's ``specbatch.sweep({...})``);
    without ``where``, errors name the source "sweep" and a ``base`` file is relative to the working folder."""
    where = where or _Where(Path("sweep"), "", Path("."))
    if not isinstance(data, dict):
        raise InputError(f"expected a table of base, scenario, axes and zip, got {data!r}", source=where.path)
    for key in data:
        if key not in TOP_KEYS:
            raise where.error(key, f"unknown sweep key (expected {', '.join(TOP_KEYS)})")
    base = _base_file(data.get("base"), where)
    scenario = _scenario(data.get("scenario", {}), where)
    dimensions: list[tuple[Axis, ...]] = []
    axes_table = data.get("axes", {})
    if not isinstance(axes_table, dict):
        raise where.error("axes", "expected a table of axis = [values]")
    for name, values in _axis_items(axes_table):
        dimensions.append((_axis(name, values, f"axes.{name}", where),))
    zips = data.get("zip", {})
    if not isinstance(zips, dict) or any(not isinstance(g, dict) for g in zips.values()):
        raise where.error("zip", "expected named tables of axes that vary together: [zip.NAME]")
    for group_name, group in zips.items():
        group_axes = tuple(_axis(name, values, f"zip.{group_name}.{name}", where)
                           for name, values in _axis_items(group))
        if not group_axes:
            raise where.error(f"zip.{group_name}", "empty zip group: give at least one axis")
        first = group_axes[0]
        for axis in group_axes[1:]:
            if len(axis.points) != len(first.points):
                raise where.error(axis.where, f"has {len(axis.points)} values but {first.name} in the same zip "
                                              f"group has {len(first.points)}; zipped axes need equal lengths")
        dimensions.append(group_axes)
    axes = tuple(axis for dim in dimensions for axis in dim)
    if not axes:
        raise where.error("axes", "no axes: give at least one, e.g. seed = [0, 1, 2]")
    _check_disjoint(axes, where)
    cells = _resolve_cells(base, scenario, dimensions, where)
    return Sweep(where.path, base, axes, tuple(dimensions), tuple(cells))


class _Where:
    """Turns a TOML path in the sweep file into an InputError with the file and line."""

    def __init__(self, path: Path, text: str, base_dir: Path) -> None:
        self.path, self.lines, self.base_dir = path, KeyLines(text), base_dir

    def line(self, dotted: str) -> int | None:
        return self.lines.find(dotted)

    def error(self, dotted: str, message: str) -> InputError:
        return InputError(message, field=dotted, source=self.path, line=self.line(dotted))

    def token(self, dotted: str) -> str:
        """A source label for load_config: ``file:line``, so its errors point into the sweep file."""
        line = self.line(dotted)
        return f"{self.path}:{line}" if line is not None else str(self.path)


def _base_file(base: Any, where: _Where) -> Path | None:
    if base is None:
        return None
    if not isinstance(base, str) or not base:
        raise where.error("base", f"expected the path of a scenario file, got {base!r}")
    resolved = where.base_dir / base
    if not resolved.is_file():
        raise where.error("base", f"{missing_file(resolved, 'scenario file')} '{base}' (looked for {resolved})")
    return resolved


def _scenario(table: Any, where: _Where) -> dict[str, tuple[Any, str]]:
    """Inline overrides for every cell, written like a scenario file under [scenario]."""
    if not isinstance(table, dict):
        raise where.error("scenario", "expected a table written like a scenario file")
    return {key: (value, where.token(f"scenario.{key}")) for key, value in flatten_sections(table).items()}


def _axis_items(table: dict[str, Any], prefix: str = ""):
    """(dotted name, values) pairs; an unquoted dotted key (workload.rate = [...]) nests tables in TOML."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _axis_items(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _axis(name: str, values: Any, dotted: str, where: _Where) -> Axis:
    line = where.line(dotted)

    def fail(message: str) -> InputError:
        return InputError(message, field=dotted, source=where.path, line=line)

    if not isinstance(values, list):
        raise fail(f"expected a list of values, got {values!r}")
    if not values:
        raise fail("empty axis: give at least one value")
    if name == POLICY_AXIS:
        points = tuple(_policy_point(value, fail) for value in values)
        columns = tuple({POLICY_AXIS: policy_label(point),
                         **{key: _cell_value(v) for key, v in point.items()}} for point in points)
        return Axis(name, dotted, line, points, columns)
    key = key_for(name)
    if key.startswith("output."):
        raise fail("output settings do not vary in a sweep (each cell's results go to the sweep's table)")
    points = tuple({key: value} for value in values)
    return Axis(name, dotted, line, points, tuple({key: _cell_value(value)} for value in values))


def _policy_point(value: Any, fail) -> dict[str, Any]:
    if isinstance(value, str):  # "lut:alpha=0.7", as --policy takes it
        from specbatch.commands.flags import policy_spec
        try:
            name, params = policy_spec(value, "policy")
        except InputError as exc:
            raise fail(exc.message) from None
        value = {"name": name, **params}
    if not isinstance(value, dict):
        raise fail(f"each policy is a name or a table like {{name = \"fixed\", k = 2}}, got {value!r}")
    if not isinstance(value.get("name"), str) or not value["name"]:
        raise fail(f"a policy table needs a name, got {value!r}")
    return {f"policy.{key}": v for key, v in value.items()}


def policy_label(point: dict[str, Any]) -> str:
    """A short, readable name for a policy and its parameters, e.g. ``fixed k=2``."""
    params = " ".join(f"{k.split('.', 1)[1]}={_cell_value(v)}" for k, v in point.items() if k != "policy.name")
    return f"{point['policy.name']} {params}".strip()


def _cell_value(value: Any) -> Any:
    """Scalars as they are; tables and lists (a length distribution, a rate profile) as compact JSON."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return value


def _check_disjoint(axes: tuple[Axis, ...], where: _Where) -> None:
    owner: dict[str, Axis] = {}
    for axis in axes:
        for key in sorted({k for point in axis.points for k in point}):
            if key in owner and owner[key] is not axis:
                raise where.error(axis.where, f"sets {key}, which axis {owner[key].where} also sets")
            owner[key] = axis
    exclusive = [owner[k] for k in EXCLUSIVE if k in owner]
    if len(exclusive) == 2 and exclusive[0] is not exclusive[1]:
        raise where.error(exclusive[1].where, f"an axis varies {EXCLUSIVE[1]} and another {EXCLUSIVE[0]}; "
                                              "vary one of them (or both in one zip group)")


def _resolve_cells(base: Path | None, scenario: dict[str, tuple[Any, str]],
                   dimensions: list[tuple[Axis, ...]], where: _Where) -> list[Cell]:
    cells = []
    choices = [range(len(dim[0].points)) for dim in dimensions]
    for index, picks in enumerate(itertools.product(*choices)):
        overrides: dict[str, tuple[Any, str]] = {}
        origin: dict[str, Axis] = {}
        columns: dict[str, Any] = {}
        for dim, pick in zip(dimensions, picks):
            for axis in dim:
                token = where.token(axis.where)
                for key, value in axis.points[pick].items():
                    overrides[key] = (value, token)
                    origin[key] = axis
                columns.update(axis.columns[pick])
        config = _resolve(base, _layer(scenario, overrides), origin, where)
        cells.append(Cell(index, config, columns))
    return cells


def _layer(lower: dict[str, tuple[Any, str]], upper: dict[str, tuple[Any, str]]) -> dict[str, tuple[Any, str]]:
    """Axis values over [scenario] values, with the config's own layering rules: a different policy
    name drops the lower layer's policy parameters, and duration_s and num_requests replace each other."""
    merged = dict(lower)
    name = upper.get("policy.name")
    if name is not None and lower.get("policy.name", (None,))[0] != name[0]:
        merged = {k: v for k, v in merged.items() if not k.startswith("policy.")}
    for one, other in (EXCLUSIVE, EXCLUSIVE[::-1]):
        if one in upper:
            merged.pop(other, None)
    merged.update(upper)
    return merged


def _resolve(base: Path | None, overrides: dict[str, tuple[Any, str]], origin: dict[str, Axis],
             where: _Where) -> RunConfig:
    try:
        config = load_config(base, overrides)
    except InputError as exc:
        raise _blame(exc, origin, where) from None
    try:
        make_policy(config.policy.name, config.policy.params)  # parameter types are checked before any run
    except PolicyError as exc:
        key = "policy.name" if exc.field in (None, "name") else f"policy.{exc.field}"
        raise _blame(config.error(key, exc.message), origin, where) from None
    return config


def _blame(exc: InputError, origin: dict[str, Axis], where: _Where) -> InputError:
    """An error about a value an axis set names the axis (and the config key, if it differs)."""
    axis = origin.get(exc.field or "")
    if axis is None:  # a base-file or [scenario] value: load_config's error already says where
        return exc
    obvious = exc.field in (axis.name, key_for(axis.name)) or (axis.name == POLICY_AXIS
                                                                   and exc.field == "policy.name")
    detail = "" if obvious else f" ({exc.field})"
    if exc.message == "unknown setting":
        message = f"unknown setting '{exc.field}': not a scenario setting (see docs/configuration.md)"
    else:
        message = exc.message + detail
    return InputError(message, field=axis.where, source=where.path, line=axis.line)
