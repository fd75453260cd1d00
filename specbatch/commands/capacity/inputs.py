"""What a capacity search is asked: SLOs, the policies to compare, the base workload, the search settings.

Every bad value fails here, before any simulation, as one InputError naming the flag.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from sim.config import PolicyConfig, RunConfig, load_config
from sim.errors import InputError
from sim.stability import CONFIDENCE, MAX_GROWTH

SLO_STATS = ("mean", "median", "p90", "p99")  # summary.json's statistics; p50 is accepted for median
SLO_LATENCIES = ("ttft", "tpot", "e2el")
SLO_METRICS = tuple(f"{s}_{m}_ms" for m in SLO_LATENCIES for s in SLO_STATS)


LONGEST = 16   # an undecided rate's reruns are at most this many times its first runs' length
SAFETY = 1.5   # a rerun is this much longer than the undecided look's spread says it needs


@dataclass(frozen=True)
class SearchSettings:
    seeds: tuple[int, ...] = (0, 1, 2)
    tolerance: float = 0.02        # relative width of the final bracket
    service_times: float = 40.0    # a rate's first runs: arrivals over this many service times
    min_requests: int = 200        # fewest requests per run
    warmup: float = 0.5            # fraction of each run's arrival window left out of the measurement
    max_growth: float = MAX_GROWTH  # a sustained rate's queue keeps less than this share of its arrivals
    extensions: int = 2            # at most this many longer reruns while undecided (up to LONGEST x)
    curve_points: int = 5          # extra rates per policy for the figures, 0 for none
    max_steps_down: int = 10       # give up (no rate meets the SLOs) below START_ABOVE * mu * STEP_DOWN**10
    max_doublings: int = 4

    @property
    def looks(self) -> int:
        return self.extensions + 1

    @property
    def confidence(self) -> float:
        """Of each look's one-sided bound: the 5% shared equally between the looks."""
        return 1 - (1 - CONFIDENCE) / self.looks


DEFAULTS = SearchSettings()  # the flags' and the API's defaults


@dataclass(frozen=True)
class SLO:
    """An upper bound on one latency statistic, named as in summary.json (``p99_ttft_ms``)."""

    metric: str
    limit_ms: float

    @property
    def latency(self) -> str:
        """The per-request latency the statistic is over: ttft, tpot or e2el."""
        return self.metric.split("_")[1]

    def __str__(self) -> str:
        return f"{self.metric} <= {self.limit_ms:g}"


@dataclass(frozen=True)
class PolicySpec:
    label: str                 # as the user wrote it, e.g. "fixed:k=2"
    name: str
    params: dict[str, Any]


def parse_slo(text: str) -> SLO:
    """``p99_ttft_ms=2000`` -> SLO; ``p50_`` means ``median_`` as in vLLM's percentile names."""
    metric, sep, value = text.partition("=")
    metric = metric.strip()
    if not sep or not metric or not value.strip():
        raise InputError(f"'{text}' is not METRIC=MILLISECONDS, e.g. p99_ttft_ms=2000", source="--slo")
    metric = re.sub(r"^p50_", "median_", metric)
    if metric not in SLO_METRICS:
        raise InputError(f"unknown metric '{text.partition('=')[0].strip()}'; use one of "
                         f"{', '.join(SLO_METRICS)} (p50_ for median_)", source="--slo")
    try:
        limit = float(value)
    except ValueError:
        raise InputError(f"'{value.strip()}' in '{text}' is not a number of milliseconds", source="--slo") from None
    if not (math.isfinite(limit) and limit > 0):
        raise InputError(f"the limit of {metric} must be a positive number of milliseconds, got {value.strip()}",
                         source="--slo")
    return SLO(metric, limit)


def parse_slos(texts: list[str] | None) -> tuple[SLO, ...]:
    items = [part for text in (texts or []) for part in text.split(",") if part.strip()]
    if not items:
        raise InputError("give at least one SLO, e.g. --slo p99_ttft_ms=2000", source="--slo")
    slos = [parse_slo(item) for item in items]
    seen: dict[str, SLO] = {}
    for slo in slos:
        if slo.metric in seen and seen[slo.metric] != slo:
            raise InputError(f"{slo.metric} is given twice with different limits", source="--slo")
        seen[slo.metric] = slo
    return tuple(seen.values())


def parse_policies(text: str) -> tuple[PolicySpec, ...]:
    """``none,fixed:k=2,goodput:k_max=4:alpha=0.7``: each as ``--policy`` takes it
    (:func:`specbatch.commands.flags.policy_spec`), separated by commas outside brackets and quotes."""
    from specbatch.commands.flags import policy_spec, split_outside

    specs = []
    for label in (part.strip() for part in split_outside(text, ",")):
        if not label:
            raise InputError(f"empty policy in '{text}'", source="--policies")
        name, params = policy_spec(label, "--policies")
        specs.append(PolicySpec(label, name, params))
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise InputError(f"a policy is listed twice in '{text}'", source="--policies")
    return tuple(specs)


def policies_error(label: str, message: str, field: str | None) -> InputError:
    """A problem with one of --policies' entries, named by its label."""
    return InputError(f"{label}: {message}", field=field, source="--policies")


def base_config(path: str | None, overrides: dict[str, tuple[Any, str]], split: bool = False) -> RunConfig:
    """The scenario the search varies the rate of; it must generate its arrivals at one constant rate.
    Disaggregated pools come from --pd-ratios (``split``: a split's config, its pools set there), never from
    the scenario, so that the aggregated replica beside the splits is aggregated."""
    config = load_config(path, overrides)
    if config.cluster.prefill_replicas and not split:
        raise config.error("cluster.prefill_replicas", "a capacity search sizes disaggregated serving with "
                           "--pd-ratios P:D or --gpu-budget N; drop [cluster] prefill_replicas and decode_replicas")
    if config.workload.trace is not None:
        raise config.error("workload.trace", "a capacity search needs generated arrivals at a constant rate, "
                           "not a trace")
    if config.cluster.replicas > 1:
        raise config.error("cluster.replicas", "a capacity search sizes one replica and computes the replicas "
                           "a target needs; drop [cluster] replicas")
    if config.workload.rate_profile is not None:
        raise config.error("workload.rate_profile", "a capacity search varies one constant rate; drop the "
                           "time-varying rate profile")
    return config


def policy_config(base: RunConfig, spec: PolicySpec) -> RunConfig:
    """The base config with this policy; parameters of the base's own policy apply when the names match.

    With a speculation method given, its ``num_speculative_tokens`` is the largest k of a built-in
    policy whose largest k is one parameter (``fixed``'s k, ``goodput``'s and ``lut``'s k_max) and was
    not given, as vLLM sizes every step by it."""
    import inspect

    from policies.registry import BUILTIN

    params = dict(base.policy.params) if base.policy.name == spec.name else {}
    params.update(spec.params)
    method = base.speculation
    if method.given and spec.name in BUILTIN:
        takes = inspect.signature(BUILTIN[spec.name]).parameters
        param = "k" if "k" in takes else "k_max" if "k_max" in takes else None
        if param is not None and not ({"k", "k_max", "table"} & set(params)):
            params[param] = method.num_speculative_tokens
    return replace(base, policy=PolicyConfig(spec.name, params))


def positive(value: float | None, flag: str) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InputError(f"must be greater than 0, got {value:g}", source=flag)
    return value
