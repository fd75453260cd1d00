"""Run configuration: shipped defaults < TOML file < command-line flags.

Every value remembers where it came from (a file and line, a flag, or the shipped
defaults), so a bad one is answered with one line naming the field, the source and
the line. Unknown keys are errors too: a typo must not silently fall back to a
default.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from sim.acceptance import DISTRIBUTIONS, AcceptanceSpec
from sim.errors import InputError
from sim.router import ROUTERS
from sim.scheduler import BATCHING, PREFILL
from workloads.lengths import LengthSpec, parse_length_spec
from workloads.traffic import RateProfile, burstiness_from_cv, parse_rate_profile

ARRIVALS = ("poisson", "gamma")
RECORDS = ("csv", "parquet", "none")
DEFAULT_SCENARIO = "default.toml"



@dataclass(frozen=True)
class Source:
    where: str  # a file path, a flag such as "--rate", or "defaults"
    line: int | None = None


@dataclass(frozen=True)
class WorkloadConfig:
    arrival: str
    rate: float
    burstiness: float
    duration_s: float | None
    num_requests: int | None
    prompt_tokens: LengthSpec
    output_tokens: LengthSpec
    trace: str | None
    rate_profile: RateProfile | None = None  # replaces rate when set
    cv: float | None = None                  # gamma gaps' coefficient of variation; burstiness = 1 / cv^2


@dataclass(frozen=True)
class EngineConfig:
    batching: str
    max_batch_size: int
    kv_cache_tokens: int | None
    prefill: str = "packed"  # packed (varlen, priced at the mean prompt) | padded (at the longest)


@dataclass(frozen=True)
class PolicyConfig:
    name: str
    params: dict[str, Any]


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int
    router: str


@dataclass(frozen=True)
class OutputConfig:
    dir: str | None
    records: str
    timeline: str | None = None  # Chrome trace-event JSON of the simulated timeline (sim.commands.timeline)
    timeline_window: tuple[float, float] | None = None  # only events overlapping [start, end) seconds


@dataclass(frozen=True)
class RunConfig:
    seed: int
    profile: str
    workload: WorkloadConfig
    engine: EngineConfig
    policy: PolicyConfig
    acceptance: AcceptanceSpec
    output: OutputConfig
    cluster: ClusterConfig = ClusterConfig(1, ROUTERS[0])
    sources: dict[str, Source] = field(default_factory=dict, compare=False, repr=False)

    def error(self, key: str, message: str) -> InputError:
        """An InputError naming ``key`` and where its value came from."""
        return error_at(self.sources, key, message)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as TOML-ready data (None values are left out)."""
        w = self.workload
        workload = {"arrival": w.arrival, "rate": w.rate,
                    "rate_profile": w.rate_profile.to_dict() if w.rate_profile is not None else None,
                    "burstiness": w.burstiness if w.cv is None else None, "cv": w.cv,
                    "duration_s": w.duration_s, "num_requests": w.num_requests,
                    "prompt_tokens": w.prompt_tokens.to_dict(), "output_tokens": w.output_tokens.to_dict(),
                    "trace": w.trace}
        data = {
            "seed": self.seed,
            "profile": self.profile,
            "workload": workload,
            "engine": {"batching": self.engine.batching, "max_batch_size": self.engine.max_batch_size,
                       "prefill": self.engine.prefill,
                       "kv_cache_tokens": self.engine.kv_cache_tokens},
            "policy": {"name": self.policy.name, **self.policy.params},
            "acceptance": {"alpha": self.acceptance.alpha, "distribution": self.acceptance.distribution,
                           "concentration": self.acceptance.concentration},
            "output": {"dir": self.output.dir, "records": self.output.records, "timeline": self.output.timeline,
                       "timeline_window": _window_text(self.output.timeline_window)},
        }
        if self.cluster.replicas > 1:  # one replica is the plain single-replica run: same file, same digest
            data["cluster"] = {"replicas": self.cluster.replicas, "router": self.cluster.router}
        return _drop_none(data)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def digest(self) -> str:
        """Short hash of everything that determines the run's results (not where they are written).

        A trace is hashed by its contents, not its path, so an edited trace is a new run.
        """
        data = self.to_dict()
        data.pop("output", None)
        payload = tomli_w.dumps(data).encode()
        if self.workload.trace is not None and Path(self.workload.trace).is_file():
            payload += hashlib.sha256(Path(self.workload.trace).read_bytes()).digest()
        return hashlib.sha256(payload).hexdigest()[:10]


def error_at(sources: dict[str, Source], key: str, message: str) -> InputError:
    src = sources.get(key) or sources.get(key.rsplit(".", 1)[0])
    if src is None:
        return InputError(message, field=key)
    if src.where.startswith("--"):
        return InputError(message, field=key, source=src.where)
    return InputError(message, field=key, source=src.where, line=src.line)


def load_config(path: str | Path | None = None, overrides: dict[str, tuple[Any, str]] | None = None) -> RunConfig:
    """Resolve a run config. ``overrides`` maps dotted keys to (value, flag name)."""
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    default_text = (resources.files("sim") / "scenarios" / DEFAULT_SCENARIO).read_text()
    _merge(values, sources, _parse_toml(default_text, "defaults"), None, "defaults")
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise InputError("no such config file", source=path, field="config")
        text = path.read_text()
        table = _parse_toml(text, str(path))
        _check_exclusive(table, text, path)
        if "workload.num_requests" in _flatten(table):
            values.pop("workload.duration_s", None)
        if "workload.duration_s" in _flatten(table):
            values.pop("workload.num_requests", None)
        _merge(values, sources, table, text, str(path))
    overrides = {k: v for k, v in (overrides or {}).items() if v[0] is not None}
    if "workload.duration_s" in overrides and "workload.num_requests" in overrides:
        raise InputError("give either --duration or --num-requests, not both", field="workload.num_requests",
                         source=overrides["workload.num_requests"][1])
    if "policy.name" in overrides:
        _forget_policy(values, sources, overrides["policy.name"][0])
    for key, (value, flag) in overrides.items():
        if key == "workload.num_requests":
            values.pop("workload.duration_s", None)
        if key == "workload.duration_s":
            values.pop("workload.num_requests", None)
        values[key] = value
        sources[key] = Source(flag)
    return _build(values, sources)


def _forget_policy(values: dict[str, Any], sources: dict[str, Source], new_name: str) -> None:
    """A different policy name drops the parameters (and their sources) set for the earlier policy."""
    if values.get("policy.name") == new_name:
        return
    for key in [k for k in values if k.startswith("policy.")]:
        del values[key]
        sources.pop(key, None)


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        line = int(match.group(1)) if match else None
        raise InputError(f"not valid TOML: {str(exc).split(' (at')[0]}", source=where, line=line) from None


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and dotted in ("workload", "engine", "policy", "acceptance", "output",
                                                               "cluster"):
            out.update(_flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _merge(values: dict, sources: dict, table: dict, text: str | None, where: str) -> None:
    flat = _flatten(table)
    if "policy.name" in flat:
        _forget_policy(values, sources, flat["policy.name"])
    for key, value in flat.items():
        values[key] = value
        sources[key] = Source(where, _locate(text, key) if text is not None else None)


def _check_exclusive(table: dict, text: str, path: Path) -> None:
    flat = _flatten(table)
    if "workload.duration_s" in flat and "workload.num_requests" in flat:
        raise InputError("give either duration_s or num_requests, not both", field="workload.num_requests",
                         source=path, line=_locate(text, "workload.num_requests"))


def _locate(text: str, dotted: str) -> int | None:
    """Line of ``dotted`` in a TOML text: its ``key =`` under the right [table], else the table's header."""
    section, _, key = dotted.rpartition(".")
    current, header_line = "", None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = re.match(r"^\[\s*([A-Za-z0-9_.\-\s]+?)\s*\]", stripped)
        if header:
            current = header.group(1).replace(" ", "")
            if current == dotted:  # an unknown [table], or a value written as a [table]
                return number
            if current == section:
                header_line = number
            continue
        assignment = re.match(r"^([A-Za-z0-9_.\-\"]+)\s*=", stripped)
        if assignment:
            name = assignment.group(1).strip('"')
            full = f"{current}.{name}" if current else name
            if full == dotted:
                return number
    return header_line


KNOWN = {
    "seed", "profile",
    "workload.arrival", "workload.rate", "workload.burstiness", "workload.duration_s", "workload.num_requests",
    "workload.prompt_tokens", "workload.output_tokens", "workload.trace", "workload.rate_profile", "workload.cv",
    "engine.batching", "engine.max_batch_size", "engine.kv_cache_tokens", "engine.prefill",
    "policy.name",
    "acceptance.alpha", "acceptance.distribution", "acceptance.concentration",
    "output.dir", "output.records", "output.timeline", "output.timeline_window",
    "cluster.replicas", "cluster.router",
}


def _build(values: dict[str, Any], sources: dict[str, Source]) -> RunConfig:
    for key in values:
        if key not in KNOWN and not key.startswith("policy."):
            raise error_at(sources, key, "unknown setting")
    get = _Getter(values, sources)
    rate_profile = get.rate_profile("workload.rate_profile")
    cv = get.number("workload.cv", positive=True, optional=True)
    burstiness = get.number("workload.burstiness", positive=True)
    if cv is not None:
        if sources.get("workload.burstiness", Source("defaults")).where != "defaults":
            src = sources["workload.burstiness"]
            where = src.where + (f":{src.line}" if src.line is not None and not src.where.startswith("--") else "")
            raise error_at(sources, "workload.cv", f"give either burstiness or cv, not both (burstiness set at {where})")
        burstiness = burstiness_from_cv(cv)
    duration_s = get.number("workload.duration_s", positive=True, optional=True)
    if (rate_profile is not None and rate_profile.natural_duration_s is not None and duration_s is not None
            and sources.get("workload.duration_s", Source("defaults")).where == "defaults"):
        duration_s = rate_profile.natural_duration_s  # the phases' total unless a duration is given
    if rate_profile is not None and duration_s is None and (rate_profile.shape == "ramp"
                                                            and rate_profile.duration_s is None):
        raise error_at(sources, "workload.rate_profile", "a ramp with num_requests needs its own duration "
                       "(duration_s in the table, or ramp:START:END:SECONDS)")
    workload = WorkloadConfig(
        arrival=get.choice("workload.arrival", ARRIVALS),
        rate=get.number("workload.rate", positive=True),
        burstiness=burstiness,
        duration_s=duration_s,
        num_requests=get.integer("workload.num_requests", minimum=1, optional=True),
        prompt_tokens=get.length("workload.prompt_tokens"),
        output_tokens=get.length("workload.output_tokens"),
        trace=get.text("workload.trace", optional=True),
        rate_profile=rate_profile,
        cv=cv,
    )
    if workload.trace is None and workload.duration_s is None and workload.num_requests is None:
        raise error_at(sources, "workload.duration_s", "give duration_s or num_requests (or a trace)")
    engine = EngineConfig(
        batching=get.choice("engine.batching", BATCHING),
        max_batch_size=get.integer("engine.max_batch_size", minimum=1),
        kv_cache_tokens=get.integer("engine.kv_cache_tokens", minimum=1, optional=True),
        prefill=get.choice("engine.prefill", PREFILL),
    )
    params = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("policy.") and k != "policy.name"}
    policy = PolicyConfig(name=get.text("policy.name"), params=params)
    alpha = get.number("acceptance.alpha")
    if not 0.0 < alpha < 1.0:
        raise error_at(sources, "acceptance.alpha", f"must be inside (0, 1), got {alpha}")
    acceptance = AcceptanceSpec(alpha=alpha, distribution=get.choice("acceptance.distribution", DISTRIBUTIONS),
                                concentration=get.number("acceptance.concentration", positive=True))
    output = OutputConfig(dir=get.text("output.dir", optional=True), records=get.choice("output.records", RECORDS),
                          timeline=get.text("output.timeline", optional=True),
                          timeline_window=get.window("output.timeline_window"))
    if output.timeline_window is not None and output.timeline is None:
        raise error_at(sources, "output.timeline_window", "applies only to a timeline: give "
                       "--timeline FILE (or timeline in [output]) too")
    cluster = ClusterConfig(replicas=get.integer("cluster.replicas", minimum=1),
                            router=get.choice("cluster.router", ROUTERS))
    return RunConfig(seed=get.integer("seed", minimum=0), profile=get.text("profile"), workload=workload,
                     engine=engine, policy=policy, acceptance=acceptance, output=output, cluster=cluster,
                     sources=dict(sources))


class _Getter:
    """Typed reads of the merged values, each failing with the value's source."""

    def __init__(self, values: dict[str, Any], sources: dict[str, Source]) -> None:
        self.values, self.sources = values, sources

    def _raw(self, key: str, optional: bool):
        if key not in self.values or self.values[key] is None:
            if optional:
                return None
            raise error_at(self.sources, key, "missing")
        return self.values[key]

    def number(self, key: str, positive: bool = False, optional: bool = False) -> float | None:
        raw = self._raw(key, optional)
        if raw is None:
            return None
        try:
            value = float(raw) if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError):
            raise error_at(self.sources, key, f"'{raw}' is not a number") from None
        if not math.isfinite(value):
            raise error_at(self.sources, key, f"'{raw}' is not a finite number")
        if positive and value <= 0:
            raise error_at(self.sources, key, f"must be greater than 0, got {raw}")
        return value

    def integer(self, key: str, minimum: int, optional: bool = False) -> int | None:
        raw = self._raw(key, optional)
        if raw is None:
            return None
        if isinstance(raw, str):
            try:
                raw = int(raw)
            except ValueError:
                raise error_at(self.sources, key, f"'{raw}' is not a whole number") from None
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise error_at(self.sources, key, f"'{raw}' is not a whole number")
        if raw < minimum:
            raise error_at(self.sources, key, f"must be at least {minimum}, got {raw}")
        return raw

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        raw = self._raw(key, False)
        if raw not in allowed:
            raise error_at(self.sources, key, f"'{raw}' is not one of {', '.join(allowed)}")
        return raw

    def text(self, key: str, optional: bool = False) -> str | None:
        raw = self._raw(key, optional)
        if raw is None:
            return None
        if not isinstance(raw, str) or not raw:
            raise error_at(self.sources, key, f"expected a non-empty string, got {raw!r}")
        return raw

    def rate_profile(self, key: str) -> RateProfile | None:
        raw = self._raw(key, True)
        if raw is None:
            return None
        try:
            return parse_rate_profile(raw)
        except ValueError as exc:
            raise error_at(self.sources, key, str(exc)) from None

    def window(self, key: str) -> tuple[float, float] | None:
        """'START:END' in seconds of simulated time, 0 <= START < END."""
        raw = self._raw(key, True)
        if raw is None:
            return None
        parts = str(raw).split(":")
        try:
            start, end = (float(p) for p in parts) if len(parts) == 2 else (math.nan, math.nan)
        except ValueError:
            start = end = math.nan
        if not (math.isfinite(start) and math.isfinite(end)):
            raise error_at(self.sources, key, f"'{raw}' is not START:END in seconds (e.g. 100:160)")
        if not 0 <= start < end:
            raise error_at(self.sources, key, f"needs 0 <= START < END, got {raw}")
        return start, end

    def length(self, key: str) -> LengthSpec:
        try:
            return parse_length_spec(self._raw(key, False))
        except ValueError as exc:
            raise error_at(self.sources, key, str(exc)) from None


def _window_text(window: tuple[float, float] | None) -> str | None:
    return None if window is None else f"{window[0]!r}:{window[1]!r}"


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: (_drop_none(v) if isinstance(v, dict) else v) for k, v in data.items() if v is not None}
