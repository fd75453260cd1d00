"""``specbatch regress``: check that scheduling logic still gives the numbers a baseline recorded.

A baseline TOML file names scenarios (a config file and/or inline overrides of the
default scenario) and, for each, the expected value of run-summary metrics with a
tolerance. Runs are a pure function of (config, seed) on one machine, so a tolerance of
zero holds for an unchanged code path and any change to scheduling, a policy or the cost
model shows up as a row in the change table. Across machines the cost model's curve fit
(scipy least squares over OpenBLAS, whose kernels differ per CPU) moves the last digits,
so every tolerance has a relative floor, :data:`FLOAT_DRIFT` (1e-8): ten times the drift
seen between CPUs, far below what a real change moves. Which way a metric may move is
decided per metric (latency up or throughput down is a regression; an improvement is reported,
and fails only with ``--fail-on-change``). ``--update`` rewrites the expected values in
place with tomlkit, so the file's scenarios, tolerances and comments survive.

From Python (a team's own pytest suite): ``assert_no_regression(path, policy=MyPolicy)``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from sim.atomic_write import write_file
from sim.errors import InputError, missing_file, read_text
from sim.metrics import PREFIX_CACHE_STATS, SCHEDULER_STATS
from sim.tomlsource import KeyLines, parse_toml

FORMAT_VERSION = 1
DIRECTIONS = ("lower-is-better", "higher-is-better", "must-not-change", "informational")
VERDICTS = ("ok", "regressed", "improved", "changed")
_LATENCY = re.compile(r"^(mean|median|std|p\d+)_(ttft|tpot|itl|e2el)_ms$")
_HIGHER = {"request_throughput", "output_throughput", "total_token_throughput", "token_goodput",
           "acceptance_rate", "mean_acceptance_length", "completed"}
_LOWER = {"duration_s", "busy_time_s"}
_FIXED = {"total_input_tokens", "total_output_tokens"}  # set by the workload: any change means it changed
# Cross-machine floating-point drift, relative: always allowed. The fitted cost curves differ
# between OpenBLAS kernels (AVX2 vs AVX-512 vs AVX), which moves the project baseline's
# metrics by up to 8.7e-10 relative; any change to scheduling logic, a policy or the cost model
# moves them by many orders more (>= 1e-6).
FLOAT_DRIFT = 1e-8
TOP_KEYS = {"format", "metrics", "tolerance", "direction", "scenario"}
SCENARIO_KEYS = {"name", "description", "config", "overrides", "tolerance", "expected"}


def default_direction(metric: str) -> str:
    """Which way is worse: latencies and busy time up, throughputs and acceptance down.

    Step and draft counts, mean k and mean batch size describe behaviour without being
    better either way: a change is reported ("changed"), not judged.
    """
    if _LATENCY.match(metric) or metric in _LOWER:
        return "lower-is-better"
    if metric in _HIGHER:
        return "higher-is-better"
    if metric in _FIXED:
        return "must-not-change"
    return "informational"


@dataclass(frozen=True)
class Tolerance:
    """A value passes when |now - baseline| <= max(abs, max(rel, FLOAT_DRIFT) * |baseline|).

    ``FLOAT_DRIFT`` (1e-8) is the floor of ``rel``, so a zero tolerance still passes the
    same run computed on another CPU (cross-machine floating-point drift).
    """

    abs: float = 0.0
    rel: float = 0.0

    def allowed(self, baseline: float) -> float:
        return max(self.abs, max(self.rel, FLOAT_DRIFT) * abs(baseline)) if math.isfinite(baseline) else self.abs

    def __str__(self) -> str:
        parts = ([f"abs {self.abs:g}"] if self.abs else []) + ([f"rel {self.rel:.3g}"] if self.rel else [])
        return ", ".join(parts) or "0"


def judge(baseline: float, now: float, tolerance: Tolerance, direction: str) -> str:
    """The verdict on one metric: ok, regressed, improved or changed (a move that is not judged)."""
    base_nan, now_nan = math.isnan(baseline), math.isnan(now)
    if base_nan and now_nan:
        return "ok"
    if base_nan or now_nan:  # a metric became undefined, or defined: no direction to read
        return "changed" if direction == "informational" else "regressed"
    delta = now - baseline
    if baseline == now or abs(delta) <= tolerance.allowed(baseline):  # == first: inf == inf
        return "ok"
    if direction == "informational":
        return "changed"
    if direction == "must-not-change":
        return "regressed"
    worse = delta > 0 if direction == "lower-is-better" else delta < 0
    return "regressed" if worse else "improved"


@dataclass(frozen=True)
class Row:
    scenario: str
    metric: str
    baseline: float
    now: float
    tolerance: Tolerance
    direction: str
    verdict: str

    @property
    def delta(self) -> float:
        return self.now - self.baseline

    @property
    def rel_delta(self) -> float:
        return self.delta / abs(self.baseline) if self.baseline else (0.0 if self.delta == 0 else math.nan)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "metric": self.metric, "baseline": _json(self.baseline),
                "now": _json(self.now), "delta": _json(self.delta), "rel_delta": _json(self.rel_delta),
                "tolerance": {"abs": self.tolerance.abs, "rel": self.tolerance.rel},
                "allowed": _json(self.tolerance.allowed(self.baseline)), "direction": self.direction,
                "verdict": self.verdict}


# ---------------------------------------------------------------------------------------------
# The baseline file


@dataclass
class Scenario:
    name: str
    index: int  # position among the file's [[scenario]] tables
    config: Path | None
    overrides: dict[str, Any]  # dotted config key -> value
    tolerances: dict[str, Tolerance]  # "default" or a metric
    expected: dict[str, float]
    description: str | None = None


@dataclass
class Baseline:
    path: Path
    text: str
    scenarios: list[Scenario]
    tolerances: dict[str, Tolerance]  # file-wide: "default" or a metric
    directions: dict[str, str]
    metrics: list[str] | None  # what --update records for a scenario with no expected values
    lines: KeyLines = field(repr=False, default=None)

    def tolerance(self, scenario: Scenario, metric: str) -> Tolerance:
        """Most specific first: the scenario's for the metric, its default, the file's for it, its default."""
        for table in (scenario.tolerances, self.tolerances):
            for key in (metric, "default"):
                if key in table:
                    return table[key]
        return Tolerance()

    def direction(self, metric: str) -> str:
        return self.directions.get(metric) or default_direction(metric)

    def error(self, path: tuple, message: str) -> InputError:
        """One line naming the field, the baseline file and the line."""
        return InputError(message, field=_dotted(path), source=self.path, line=self.lines.find(path))


def _dotted(path: tuple) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Parse and check a baseline file; every problem is an InputError naming the key and line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(missing_file(path, "baseline file"), field="baseline", source=path)
    text = read_text(path, field="baseline")
    data = parse_toml(text, path)
    base = Baseline(path, text, [], {}, {}, None, KeyLines(text))
    for key in data:
        if key not in TOP_KEYS:
            raise base.error((key,), f"unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    version = data.get("format", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise base.error(("format",), f"unsupported baseline format {version!r}; this specbatch reads "
                                      f"format = {FORMAT_VERSION}")
    base.tolerances = _tolerances(base, data.get("tolerance", {}), ("tolerance",))
    directions = data.get("direction", {})
    if not isinstance(directions, dict):
        raise base.error(("direction",), "expected a table of metric = direction")
    for metric, value in directions.items():
        if value not in DIRECTIONS:
            raise base.error(("direction", metric), f"{value!r} is not one of {', '.join(DIRECTIONS)}")
    base.directions = dict(directions)
    if "metrics" in data:
        metrics = data["metrics"]
        if not (isinstance(metrics, list) and metrics and all(isinstance(m, str) for m in metrics)):
            raise base.error(("metrics",), "expected a non-empty list of metric names")
        base.metrics = list(metrics)
    scenarios = data.get("scenario")
    if not isinstance(scenarios, list) or not scenarios:
        raise base.error(("scenario",), "no scenarios: add at least one [[scenario]] table")
    seen: dict[str, int] = {}
    for index, table in enumerate(scenarios):
        scenario = _scenario(base, index, table)
        if scenario.name in seen:
            raise base.error(("scenario", index, "name"),
                             f"duplicate scenario name {scenario.name!r} (also scenario {seen[scenario.name]})")
        seen[scenario.name] = index
        base.scenarios.append(scenario)
    return base


def _scenario(base: Baseline, index: int, table: Any) -> Scenario:
    from sim.config import flatten_sections

    at = ("scenario", index)
    if not isinstance(table, dict):
        raise base.error(at, "expected a [[scenario]] table")
    for key in table:
        if key not in SCENARIO_KEYS:
            raise base.error(at + (key,), f"unknown key (known: {', '.join(sorted(SCENARIO_KEYS))})")
    name = table.get("name")
    if not isinstance(name, str) or not name.strip():
        raise base.error(at + ("name",), "every scenario needs a name (a non-empty string)")
    config = table.get("config")
    if config is not None:
        if not isinstance(config, str) or not config:
            raise base.error(at + ("config",), "expected a path to a scenario TOML file")
        config = (base.path.parent / config)
        if not config.is_file():
            raise base.error(at + ("config",), f"{missing_file(config, 'config file')} {config}")
    overrides = table.get("overrides", {})
    if not isinstance(overrides, dict):
        raise base.error(at + ("overrides",), "expected a table of config keys, e.g. workload.rate = 0.2")
    if config is None and not overrides and "overrides" not in table:
        raise base.error(at, "give config = \"file.toml\" and/or an [scenario.overrides] table "
                             "(an empty one runs the default scenario)")
    expected = table.get("expected", {})
    if not isinstance(expected, dict):
        raise base.error(at + ("expected",), "expected a table of metric = value")
    for metric, value in expected.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise base.error(at + ("expected", metric), f"expected a number (or nan), got {value!r}")
    description = table.get("description")
    if description is not None and not isinstance(description, str):
        raise base.error(at + ("description",), "expected a string")
    return Scenario(name=name, index=index, config=config, overrides=flatten_sections(overrides),
                    tolerances=_tolerances(base, table.get("tolerance", {}), at + ("tolerance",)),
                    expected=dict(expected), description=description)


def _tolerances(base: Baseline, table: Any, at: tuple) -> dict[str, Tolerance]:
    if not isinstance(table, dict):
        raise base.error(at, "expected a table: default = { abs = ..., rel = ... } and/or metric = { ... }")
    out = {}
    for metric, spec in table.items():
        where = at + (metric,)
        if not isinstance(spec, dict) or not spec:
            raise base.error(where, f"expected a table such as {{ abs = 0.5 }} or {{ rel = 0.01 }}, got {spec!r}")
        for key, value in spec.items():
            if key not in ("abs", "rel"):
                raise base.error(where + (key,), "unknown tolerance key (known: abs, rel)")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0) \
                    or math.isinf(value):
                raise base.error(where + (key,), f"must be a finite number >= 0, got {value!r}")
        out[metric] = Tolerance(float(spec.get("abs", 0.0)), float(spec.get("rel", 0.0)))
    return out


# ---------------------------------------------------------------------------------------------
# Running and comparing


@dataclass
class ScenarioRun:
    name: str
    summary: dict[str, Any]
    policy: dict[str, Any]
    config_digest: str
    wall_s: float


@dataclass
class Comparison:
    """Every compared metric of every scenario run; ``passed`` decides the exit code."""

    baseline: Path
    rows: list[Row]
    runs: list[ScenarioRun]
    fail_on_change: bool = False
    recorded: int = 0  # values written by --update

    def with_verdict(self, *verdicts: str) -> list[Row]:
        return [row for row in self.rows if row.verdict in verdicts]

    @property
    def regressions(self) -> list[Row]:
        return self.with_verdict("regressed")

    @property
    def failures(self) -> list[Row]:
        return self.with_verdict("regressed", "improved", "changed") if self.fail_on_change else self.regressions

    @property
    def passed(self) -> bool:
        return not self.failures

    def counts(self) -> dict[str, int]:
        return {verdict: len(self.with_verdict(verdict)) for verdict in VERDICTS}

    def table(self, rows: Iterable[Row] | None = None) -> str:
        rows = [row for row in self.rows if row.verdict != "ok"] if rows is None else list(rows)
        return format_table(rows)

    def headline(self) -> str:
        c = self.counts()
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict}: {len(self.runs)} scenario(s), {len(self.rows)} metrics compared with {self.baseline}: "
                f"{c['regressed']} regressed, {c['improved']} improved, {c['changed']} changed"
                + (" (--fail-on-change)" if self.fail_on_change else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": str(self.baseline), "passed": self.passed, "fail_on_change": self.fail_on_change,
                "counts": self.counts(),
                "scenarios": [{"name": r.name, "policy": r.policy, "config_digest": r.config_digest}
                              for r in self.runs],
                "rows": [row.to_dict() for row in self.rows]}


def format_table(rows: list[Row]) -> str:
    """The change table: scenario, metric, baseline, now, delta, relative delta, tolerance, verdict."""
    header = ("scenario", "metric", "baseline", "now", "delta", "rel delta", "tolerance", "verdict")
    cells = [header] + [(r.scenario, r.metric, _num(r.baseline), _num(r.now), _num(r.delta, signed=True),
                         _pct(r.rel_delta), str(r.tolerance), r.verdict) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    right = {2, 3, 4, 5}
    lines = ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cell, widths)))
             .rstrip() for cell in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _num(value: float, signed: bool = False) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:+.7g}" if signed else f"{value:.7g}"


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:+.3g}%"


def _json(value: float) -> float | None:
    return value if isinstance(value, int) or math.isfinite(value) else None


def policy_name(policy: str | type | None) -> str | None:
    """A policy class becomes its ``module:Class`` name, which the policy registry imports."""
    if policy is None or isinstance(policy, str):
        return policy
    if not isinstance(policy, type) or "<locals>" in policy.__qualname__:
        raise InputError(f"{policy!r} cannot be imported by name: give a class defined at a module's top "
                         "level, or its 'module:Class' name", field="policy")
    return f"{policy.__module__}:{policy.__qualname__}"


def scenario_config(base: Baseline, scenario: Scenario, overrides: dict[str, tuple[Any, str]]):
    """defaults < the scenario's config file < its inline overrides < the caller's (flags, helper arguments)."""
    from sim.config import load_config

    where = ("scenario", scenario.index, "overrides")
    inline = {key: (_beside(base, key, value), _where(base, where + tuple(key.split(".", 1))))
              for key, value in scenario.overrides.items()}
    if isinstance(inline.get("policy.name", (None,))[0], str):  # policy.name = "lut:alpha=0.7", as --policy
        from specbatch.commands.flags import policy_overrides
        inline.update(policy_overrides(*inline["policy.name"]))
    caller = {k: v for k, v in overrides.items() if v[0] is not None}
    if "policy.name" in caller and inline.get("policy.name", (None,))[0] != caller["policy.name"][0]:
        inline = {k: v for k, v in inline.items() if not k.startswith("policy.")}  # another policy's parameters
    merged = {**inline, **caller, "output.records": ("none", "regress")}
    try:
        return load_config(scenario.config, merged)
    except InputError as exc:
        if exc.source is None or exc.source == "regress":
            raise InputError(f"scenario {scenario.name!r}: {exc.message}", field=exc.field, source=base.path,
                             line=base.lines.find(("scenario", scenario.index))) from None
        raise


PATH_KEYS = ("workload.trace", "workload.trace_vllm", "acceptance.trace")


def _beside(base: Baseline, key: str, value: Any) -> Any:
    """A relative file path in a scenario's overrides, read beside the baseline (as its ``config``),
    so that a baseline runs from any folder."""
    if key in PATH_KEYS and isinstance(value, str) and value and not Path(value).is_absolute():
        return str(base.path.parent / value)
    return value


def _where(base: Baseline, path: tuple) -> str:
    line = base.lines.find(path)
    return str(base.path) if line is None else f"{base.path}:{line}"


def run_scenario(base: Baseline, scenario: Scenario, overrides: dict[str, tuple[Any, str]]) -> ScenarioRun:
    from sim.simulate import simulate

    started = time.perf_counter()
    config = scenario_config(base, scenario, overrides)
    result = simulate(config)
    summary = {k: v for k, v in result.summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return ScenarioRun(scenario.name, summary, {"name": result.config.policy.name, **result.config.policy.params},
                       result.config.digest(), time.perf_counter() - started)


def _check_names(base: Baseline, scenarios: list[Scenario], known: dict[str, Any]) -> None:
    """Every metric the file names must be a metric of the run summary (checked at the first run)."""
    def check(path: tuple, names: Iterable[str], allow_default: bool = False) -> None:
        for name in names:
            if name not in known and not (allow_default and name == "default"):
                raise base.error(path + (name,), f"{name!r} is not a metric of the run summary "
                                                 f"(e.g. {', '.join(list(known)[:6])}, ...)")
    check(("tolerance",), base.tolerances, allow_default=True)
    check(("direction",), base.directions)
    for metric in base.metrics or []:
        if metric not in known:
            raise base.error(("metrics",), f"{metric!r} is not a metric of the run summary")
    for scenario in scenarios:
        at = ("scenario", scenario.index)
        check(at + ("expected",), scenario.expected)
        check(at + ("tolerance",), scenario.tolerances, allow_default=True)


def _check_own_metrics(base: Baseline, scenario: Scenario, summary: dict[str, Any]) -> None:
    """A scenario's expected metric its own run does not report (a vllm-v1 figure in a v0 scenario)."""
    at = ("scenario", scenario.index)
    for name in [*scenario.expected, *scenario.tolerances]:
        if name not in summary and name != "default":
            why = (" (only a vllm-v1 run reports it: engine.scheduler = \"vllm-v1\")" if name in SCHEDULER_STATS else
                   " (only a vllm-v1 run with prefix caching reports it)" if name in PREFIX_CACHE_STATS else "")
            raise base.error(at + ("expected" if name in scenario.expected else "tolerance", name),
                             f"{name!r} is not a metric of this scenario's runs{why}")


def compare_scenario(base: Baseline, scenario: Scenario, run: ScenarioRun) -> list[Row]:
    return [Row(scenario.name, metric, expected, run.summary[metric], base.tolerance(scenario, metric),
                base.direction(metric), judge(float(expected), float(run.summary[metric]),
                                              base.tolerance(scenario, metric), base.direction(metric)))
            for metric, expected in scenario.expected.items()]


def check_baseline(baseline: str | os.PathLike[str], *, policy: str | type | None = None,
                   overrides: dict[str, Any] | None = None, scenarios: Iterable[str] | None = None,
                   fail_on_change: bool = False, update: bool = False, progress=None,
                   policy_source: str = "policy") -> Comparison:
    """Run the baseline's scenarios and compare every expected metric; bad input raises InputError.

    ``policy`` (a name, ``module:Class`` or a Policy subclass) replaces every scenario's
    policy; ``overrides`` maps dotted config keys to values applied to every scenario.
    With ``update`` the expected values are rewritten (atomically) to the values now.
    """
    base = load_baseline(baseline)
    chosen = _choose(base, scenarios)
    flags = {key: (value, "overrides") for key, value in (overrides or {}).items()}
    if policy is not None:
        from specbatch.commands.flags import policy_overrides
        flags.update(policy_overrides(policy_name(policy), policy_source))  # "lut:alpha=0.7" too
    if not update:
        for scenario in chosen:
            if not scenario.expected:
                raise base.error(("scenario", scenario.index),
                                 f"scenario {scenario.name!r} has no expected values; record them with --update")
    rows, runs = [], []
    for number, scenario in enumerate(chosen):
        run = run_scenario(base, scenario, flags)
        if number == 0:  # every name in the file, before any output (a vllm-v1 scenario has more metrics)
            _check_names(base, chosen, dict.fromkeys([*run.summary, *SCHEDULER_STATS, *PREFIX_CACHE_STATS]))
        _check_own_metrics(base, scenario, run.summary)
        if progress:
            progress(f"[{number + 1}/{len(chosen)}] {scenario.name}: {run.wall_s:.2f} s")
        rows += compare_scenario(base, scenario, run)
        runs.append(run)
    comparison = Comparison(base.path, rows, runs, fail_on_change)
    if update:
        comparison.recorded = write_updated(base, chosen, runs)
    return comparison


def assert_no_regression(baseline: str | os.PathLike[str], *, policy: str | type | None = None,
                         overrides: dict[str, Any] | None = None, scenarios: Iterable[str] | None = None,
                         fail_on_change: bool = False) -> Comparison:
    """For a team's own tests: the comparison, or an AssertionError whose message is the failing rows."""
    comparison = check_baseline(baseline, policy=policy, overrides=overrides, scenarios=scenarios,
                                fail_on_change=fail_on_change)
    if not comparison.passed:
        raise AssertionError(f"{comparison.headline()}\n{comparison.table(comparison.failures)}")
    return comparison


def _choose(base: Baseline, names: Iterable[str] | None) -> list[Scenario]:
    if names is None:
        return base.scenarios
    by_name = {s.name: s for s in base.scenarios}
    chosen = []
    for name in dict.fromkeys(names):  # each once, in the order given
        if name not in by_name:
            raise InputError(f"no scenario named {name!r} in {base.path} (it has: {', '.join(by_name)})",
                             field="scenario", source="--scenario")
        chosen.append(by_name[name])
    return chosen


# ---------------------------------------------------------------------------------------------
# --update


def write_updated(base: Baseline, scenarios: list[Scenario], runs: list[ScenarioRun]) -> int:
    """Rewrite the expected values of ``scenarios`` in place, keeping everything else, atomically.

    A scenario keeps its own set of expected metrics; one with none gets the file's
    ``metrics`` list, or every scalar metric of the run summary. Floats are written with
    repr, which round-trips, so a zero tolerance compares what was run (to FLOAT_DRIFT).
    """
    import tomlkit

    doc = tomlkit.parse(base.text)
    recorded = 0
    for scenario, run in zip(scenarios, runs):
        table = doc["scenario"][scenario.index]
        metrics = list(scenario.expected) or base.metrics or list(run.summary)
        created = "expected" not in table
        if created:
            table["expected"] = tomlkit.table()
        expected = table["expected"]
        for metric in metrics:
            value = run.summary[metric]
            expected[metric] = int(value) if isinstance(value, int) else float(value)
            recorded += 1
        if created:
            expected.add(tomlkit.nl())  # a blank line before the next [[scenario]]
    text = tomlkit.dumps(doc)
    try:
        write_file(base.path, text, keep_mode=True)
    except OSError as exc:
        raise InputError(f"cannot rewrite the baseline: {exc.strerror or exc}", source=base.path) from None
    return recorded


# ---------------------------------------------------------------------------------------------
# The command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", required=True, help="baseline TOML file: scenarios, expected metrics, "
                                                           "tolerances (see docs/regress.md)")
    parser.add_argument("--scenario", action="append", default=None, metavar="NAME",
                        help="run only this scenario (repeatable)")
    parser.add_argument("--update", action="store_true",
                        help="rewrite the expected values with the values now (keeps comments and tolerances)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the comparison as JSON here")
    parser.add_argument("--fail-on-change", action="store_true",
                        help="fail on any move beyond tolerance, improvements and informational metrics too")
    parser.add_argument("--policy", default=None,
                        help="run every scenario with this policy instead (a name or module:Class)")
    parser.add_argument("--all", action="store_true", help="print every compared metric, not only the changes")


def main(args: argparse.Namespace) -> int:
    from sim.atomic_write import check_output, output_lock

    if args.json:  # every output checked before the scenarios run, not after
        check_output(args.json, folder=False, source=f"--json {args.json}")
    if args.update and Path(args.baseline).is_file():
        check_output(args.baseline, folder=False, source=f"--update {args.baseline}")
    with output_lock(args.baseline, source="--baseline") if args.update else contextlib.nullcontext():
        comparison = check_baseline(args.baseline, policy=args.policy, scenarios=args.scenario,
                                    fail_on_change=args.fail_on_change, update=args.update,
                                    progress=lambda line: print(line, file=sys.stderr), policy_source="--policy")
    if args.json:
        _write_json(Path(args.json), comparison.to_dict())
    rows = comparison.rows if args.all else [row for row in comparison.rows if row.verdict != "ok"]
    if rows:
        print(format_table(rows))
    if args.update:
        moved = sum(row.verdict != "ok" for row in comparison.rows)
        print(f"Updated {args.baseline}: recorded {comparison.recorded} values of {len(comparison.runs)} "
              f"scenario(s); {moved} moved beyond tolerance" + (" (above: old baseline vs now)." if moved else "."))
        return 0
    print(comparison.headline())
    return 0 if comparison.passed else 1


def _write_json(path: Path, document: dict) -> None:
    try:
        write_file(path, json.dumps(document, indent=2) + "\n")
    except OSError as exc:
        raise InputError(f"cannot write the comparison: {exc.strerror or exc}", field="--json", source=path) from None
