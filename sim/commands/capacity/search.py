"""The search: per policy, the highest request rate one replica sustains while meeting every SLO.

Decision rule at a rate (see docs/capacity.md):

* each seed is one run of the base scenario at that rate; a run's first ``warmup``
  fraction of arrivals is discarded (the empty-system start is optimistic);
* the rate **meets the SLOs** when every SLO statistic computed over the measured
  requests of all seeds pooled is within its limit (pooling is one long run made of
  independent replications: more seeds sharpen a p99 rather than making the test
  stricter, as "every seed must pass" would), and
* **every seed keeps up**: when arrivals stop, at most ``max_batch_size +
  tolerance * requests`` requests are still unfinished. A replica below saturation
  leaves about one batch in flight; above it the backlog grows by (rate - service
  rate) * duration, so this test catches overload that a loose SLO would miss.

Run length grows with the rate: a probe (every request at t = 0) measures the
policy's saturation throughput mu, which fixes a window W = requests / mu; a run at
rate r has max(min_requests, ceil(r * W)) requests, so runs near saturation, where
queues take longest to settle, are the longest.

The search brackets from mu (doubling up while it passes, halving down while it
fails), then bisects until (hi - lo) / lo <= tolerance. The same rule is searched
for each seed alone; the spread of those per-seed maxima is the seed-to-seed
uncertainty. Every search advances in lock-step rounds, each round's runs going to a
process pool at once.
"""

from __future__ import annotations

import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

import numpy as np

from sim.commands.capacity.inputs import SLO, SLO_LATENCIES
from sim.commands.sweep.executors import die_with
from sim.config import RunConfig
from sim.metrics import distribution_stats

PROBE_RATE = 1e9  # req/s: every request arrives at once, so the probe measures pure service throughput


@dataclass(frozen=True)
class SearchSettings:
    seeds: tuple[int, ...] = (0, 1, 2)
    tolerance: float = 0.05        # relative width of the final bracket
    requests: int = 600            # requests per run at the saturation rate
    min_requests: int = 100        # fewest requests per run, at low rates
    warmup: float = 0.1            # fraction of each run's arrival window left out of the metrics
    curve_points: int = 5          # extra rates per policy for the figures, 0 for none
    max_halvings: int = 10         # give up (no rate meets the SLOs) below mu / 2**max_halvings
    max_doublings: int = 4


@dataclass
class PointRun:
    """One simulation at (rate, seed), reduced to what the decision and the report need."""

    rate: float
    seed: int
    num_requests: int
    window_s: float                 # the measured part of the arrival window
    backlog: int                    # requests unfinished when arrivals stopped
    throughput: float               # completed / duration of the whole run
    ttft_s: np.ndarray              # measured requests only, from here on
    tpot_s: np.ndarray              # NaN for one-token outputs
    e2el_s: np.ndarray
    output_tokens: np.ndarray
    mean_k: float
    mean_batch_size: float
    steps: dict[str, np.ndarray] | None = None


def run_point(config: RunConfig, rate: float, seed: int, num_requests: int, warmup: float,
              with_steps: bool = False) -> PointRun:
    """Simulate one point (a pure function of its arguments: safe to run in any worker)."""
    from sim.simulate import simulate

    workload = replace(config.workload, rate=rate, num_requests=num_requests, duration_s=None)
    result = simulate(replace(config, seed=seed, workload=workload))
    table, summary = result.requests, result.summary
    arrival = table.arrival_s.to_numpy()
    last = float(arrival.max())
    measured = arrival >= warmup * last
    steps = None
    if with_steps:
        steps = {c: result.steps[c].to_numpy() for c in ("start_s", "phase", "running", "k")}
    return PointRun(rate=rate, seed=seed, num_requests=num_requests, window_s=(1.0 - warmup) * last,
                    backlog=int((table.finish_s.to_numpy() > last).sum()),
                    throughput=float(summary["request_throughput"]),
                    ttft_s=table.ttft_s.to_numpy()[measured], tpot_s=table.tpot_s.to_numpy()[measured],
                    e2el_s=table.e2el_s.to_numpy()[measured], output_tokens=table.output_tokens.to_numpy()[measured],
                    mean_k=float(summary["mean_k"]), mean_batch_size=float(summary["mean_batch_size"]), steps=steps)


def _run_job(job: tuple) -> PointRun:
    return run_point(*job)


def pooled_stats(runs: list[PointRun], slos: tuple[SLO, ...]) -> dict[str, float]:
    """SLO statistics (summary.json names) over the pooled measured requests, plus vLLM's goodput."""
    stats: dict[str, float] = {}
    cat = {name: np.concatenate([getattr(r, f"{name}_s") for r in runs]) for name in SLO_LATENCIES}
    for name, values in cat.items():
        stats.update(distribution_stats(name, values[~np.isnan(values)]))
    good = np.ones(cat["ttft"].size, dtype=bool)
    for name, limit in request_limits(slos).items():
        good &= ~(cat[name] * 1e3 > limit)  # NaN (a one-token TPOT) meets any limit, as in vLLM
    window = sum(r.window_s for r in runs)
    stats["goodput"] = float(good.sum()) / window if window > 0 else math.nan
    stats["measured_requests"] = int(cat["ttft"].size)
    stats["mean_output_tokens"] = float(np.concatenate([r.output_tokens for r in runs]).mean())
    stats["mean_k"] = float(np.mean([r.mean_k for r in runs]))
    stats["mean_batch_size"] = float(np.mean([r.mean_batch_size for r in runs]))
    stats["max_backlog"] = int(max(r.backlog for r in runs))
    return stats


def request_limits(slos: tuple[SLO, ...]) -> dict[str, float]:
    """Per-request limits for goodput: the tightest limit given on each latency (ms)."""
    limits: dict[str, float] = {}
    for slo in slos:
        limits[slo.latency] = min(limits.get(slo.latency, math.inf), slo.limit_ms)
    return limits


class Verdict:
    """The pass/fail rule at one rate, for a set of runs (all seeds pooled, or one seed)."""

    def __init__(self, slos: tuple[SLO, ...], max_batch_size: int, tolerance: float) -> None:
        self.slos, self.max_batch_size, self.tolerance = slos, max_batch_size, tolerance

    def keeps_up(self, run: PointRun) -> bool:
        return run.backlog <= self.max_batch_size + self.tolerance * run.num_requests

    def __call__(self, runs: list[PointRun]) -> bool:
        stats = pooled_stats(runs, self.slos)
        return all(self.keeps_up(r) for r in runs) and all(stats[s.metric] <= s.limit_ms for s in self.slos)


class RateSearch:
    """Bracket, then bisect, a pass/fail boundary in rate; ``next_rate`` is None when done."""

    def __init__(self, start: float, settings: SearchSettings) -> None:
        self.start, self.settings = start, settings
        self.lo: float | None = None   # highest rate that passed
        self.hi: float | None = None   # lowest rate that failed

    def next_rate(self) -> float | None:
        s = self.settings
        if self.lo is None and self.hi is None:
            return self.start
        if self.lo is None:
            return self.hi / 2 if self.hi > self.start / 2 ** s.max_halvings else None
        if self.hi is None:
            return self.lo * 2 if self.lo < self.start * 2 ** s.max_doublings else None
        if (self.hi - self.lo) / self.lo <= s.tolerance:
            return None
        return (self.lo + self.hi) / 2

    def record(self, rate: float, passed: bool) -> None:
        if passed:
            self.lo = rate if self.lo is None else max(self.lo, rate)
        else:
            self.hi = rate if self.hi is None else min(self.hi, rate)


@dataclass
class PolicyOutcome:
    label: str
    config: RunConfig
    saturation: float                   # probe throughput, req/s
    window_s: float                     # W: runs at rate r have max(min_requests, ceil(r * W)) requests
    max_rate: float                     # highest rate that passed pooled (0 when none did)
    bracket: tuple[float, float | None]
    seed_max_rates: list[float]
    uncertainty: float
    points: dict[float, dict[str, float]] = field(default_factory=dict)  # rate -> pooled stats, all seeds
    operating: dict[str, float] | None = None
    steps: dict[str, np.ndarray] | None = None


class Runner:
    """Runs batches of points on a process pool (or in-process for jobs = 1), caching every result."""

    def __init__(self, jobs: int, progress: Callable[[str], None] | None = None) -> None:
        self.jobs = max(1, jobs)
        # Workers exit if this process is killed (kill -9 leaves no pool behind: sweep's die_with).
        self.pool = ProcessPoolExecutor(self.jobs, initializer=die_with, initargs=(os.getpid(),)) \
            if self.jobs > 1 else None
        self.cache: dict[tuple[str, float, int, bool], PointRun] = {}  # (label, rate, seed, with steps)
        self.progress = progress or (lambda text: None)
        self.runs = 0

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def run(self, wanted: Iterable[tuple[str, RunConfig, float, int, int, float, bool]]) -> int:
        """Run the points not yet cached; returns how many that was."""
        keys, jobs = [], []
        for label, config, rate, seed, n, warmup, steps in wanted:
            key = (label, rate, seed, steps)
            if key not in self.cache and key not in keys:
                keys.append(key)
                jobs.append((config, rate, seed, n, warmup, steps))
        if not jobs:
            return 0
        results = self.pool.map(_run_job, jobs) if self.pool else map(_run_job, jobs)
        for key, result in zip(keys, results):
            self.cache[key] = result
        self.runs += len(jobs)
        return len(jobs)

    def get(self, label: str, rate: float, seed: int, steps: bool = False) -> PointRun:
        return self.cache[(label, rate, seed, steps)]

    def has(self, label: str, rate: float, seed: int) -> bool:
        return (label, rate, seed, False) in self.cache


def search_capacity(configs: dict[str, RunConfig], slos: tuple[SLO, ...], settings: SearchSettings,
                    jobs: int = os.cpu_count() or 1, progress: Callable[[str], None] | None = None,
                    curve_groups: dict[str, str] | None = None) -> dict[str, PolicyOutcome]:
    """The whole search for every policy (label -> config), in lock-step rounds on one pool.

    ``curve_groups`` (label -> group) makes the labels of one group share their curve rates
    (one profile's policies, say); by default every label is in one group.
    """
    runner = Runner(jobs, progress)
    try:
        return _search(runner, configs, slos, settings, curve_groups or {})
    finally:
        runner.close()


def _search(runner: Runner, configs: dict[str, RunConfig], slos: tuple[SLO, ...],
            s: SearchSettings, curve_groups: dict[str, str]) -> dict[str, PolicyOutcome]:
    say = runner.progress
    runner.run((label, cfg, PROBE_RATE, s.seeds[0], s.requests, 0.0, False) for label, cfg in configs.items())
    saturation = {label: runner.get(label, PROBE_RATE, s.seeds[0]).throughput for label in configs}
    window = {label: s.requests / mu for label, mu in saturation.items()}
    say("saturation probe (req/s): " + ", ".join(f"{label} {mu:.4g}" for label, mu in saturation.items()))

    def size(label: str, rate: float) -> int:
        return max(s.min_requests, math.ceil(rate * window[label]))

    def job(label: str, rate: float, seed: int, steps: bool = False):
        return (label, configs[label], rate, seed, size(label, rate), s.warmup, steps)

    verdicts = {label: Verdict(slos, cfg.engine.max_batch_size, s.tolerance) for label, cfg in configs.items()}
    pooled = {label: RateSearch(saturation[label], s) for label in configs}
    per_seed = {(label, seed): RateSearch(saturation[label], s) for label in configs for seed in s.seeds}
    rounds = 0
    while True:
        wanted = []
        for label, search in pooled.items():
            rate = search.next_rate()
            if rate is not None:
                wanted += [job(label, rate, seed) for seed in s.seeds]
        for (label, seed), search in per_seed.items():
            rate = search.next_rate()
            if rate is not None:
                wanted.append(job(label, rate, seed))
        if not wanted:
            break
        rounds += 1
        new = runner.run(wanted)
        for label, search in pooled.items():
            rate = search.next_rate()
            if rate is not None:
                search.record(rate, verdicts[label]([runner.get(label, rate, seed) for seed in s.seeds]))
        for (label, seed), search in per_seed.items():
            rate = search.next_rate()
            if rate is not None:
                search.record(rate, verdicts[label]([runner.get(label, rate, seed)]))
        say(f"round {rounds}: {new} runs ({runner.runs} so far); brackets (req/s) " + ", ".join(
            f"{label} {_bracket_text(search)}" for label, search in pooled.items()))

    # The curves of a group share their rates (so they are comparable): evenly up to its fastest probe.
    group = {label: curve_groups.get(label, "") for label in configs}
    top = {g: max(saturation[label] for label in configs if group[label] == g) for g in group.values()}
    curve = {label: [top[group[label]] * j / s.curve_points for j in range(1, s.curve_points + 1)]
             for label in configs}
    finals = {label: search.lo for label, search in pooled.items() if search.lo is not None}
    runner.run([job(label, rate, seed) for label in configs for rate in curve[label] for seed in s.seeds]
               + [job(label, rate, s.seeds[0], True) for label, rate in finals.items()])

    outcomes = {}
    for label in configs:
        search = pooled[label]
        seed_rates = [per_seed[(label, seed)].lo or 0.0 for seed in s.seeds]
        complete = sorted(rate for (lab, rate, seed, steps) in runner.cache
                          if lab == label and seed == s.seeds[0] and not steps and rate != PROBE_RATE
                          and all(runner.has(label, rate, other) for other in s.seeds))
        points = {rate: pooled_stats([runner.get(label, rate, seed) for seed in s.seeds], slos) for rate in complete}
        max_rate = search.lo or 0.0
        outcomes[label] = PolicyOutcome(
            label=label, config=configs[label], saturation=saturation[label], window_s=window[label],
            max_rate=max_rate, bracket=(max_rate, search.hi), seed_max_rates=seed_rates,
            uncertainty=uncertainty(max_rate, search.hi, seed_rates), points=points,
            operating=points.get(max_rate), steps=runner.get(label, max_rate, s.seeds[0], True).steps
            if search.lo is not None else None)
    return outcomes


def uncertainty(lo: float, hi: float | None, seed_rates: list[float]) -> float:
    """Half the final bracket and the standard error of the per-seed maxima, added in quadrature."""
    half = (hi - lo) / 2 if hi is not None and lo > 0 else 0.0
    spread = float(np.std(seed_rates, ddof=1)) / math.sqrt(len(seed_rates)) if len(seed_rates) > 1 else 0.0
    return math.hypot(half, spread)


def _bracket_text(search: RateSearch) -> str:
    lo = "?" if search.lo is None else f"{search.lo:.4g}"
    hi = "?" if search.hi is None else f"{search.hi:.4g}"
    return f"[{lo}, {hi}]"


def stderr_progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
