"""The search: per policy, the highest request rate one replica sustains while meeting every SLO.

A rate is **sustained** (docs/capacity.md) when, over the measured part of its runs (all
seeds pooled; the first ``warmup`` fraction of each run's arrival window is left out):

* **the queue is stable**: :mod:`sim.stability`'s test shows that less than ``max_growth``
  (1%) of the arrivals stay behind (the one-sided upper bound of the queue's growth,
  arrivals minus completions per second, is below 1% of the arrival rate), and
* **every SLO is met**: each SLO statistic's one-sided upper bound (the pooled estimate plus
  t x the spread of the same statistic over the runs' sub-windows, sectioning) is within
  its limit.

A rate fails when an SLO statistic's estimate is over its limit or the queue is shown to
grow. Anything between is undecided: the rate is run again longer, as much longer as the
undecided look's own spread says it takes to decide (times ``SAFETY``, at least twice, at
most ``LONGEST`` times the first runs), at most ``extensions`` times, and fails if still
undecided (or if even the longest runs would not decide it), so nothing passes without
evidence. The looks share the 5% equally (each bound at 1 - 0.05 / looks), so a rate
whose queue keeps 1% of its arrivals, or whose SLO statistic is over its limit, passes at
most 5% of the time.

Run length is sized from the rate and the service time. A probe per policy (every request
at t = 0, so the replica works through a backlog) measures its saturation throughput mu
and the time a request spends in a full batch, s. A rate r's first runs have arrivals over
``service_times`` x s seconds, and at least the requests the queue test needs to show a
queue of r x s requests stable (:func:`sim.stability.requests_for_power`).

The search starts above mu (where the queue grows: a cheap fail, run on the first seed alone
and on the others only should it not fail), then tries the midpoint of [start / 2, start] (where
an SLO near saturation puts the boundary; halving then bisecting would try it next), and only if
that fails halves on from start / 2 until a rate
passes (or doubles while they pass, should the probe have undershot), then bisects until
(hi - lo) / lo <= tolerance. A rate undecided at its first look counts as passing while the
search goes higher, and is rerun longer only if it ends up the bracket's lo (``_Search.run``):
a rate below one shown sustained needs no evidence of its own. The max rate is the highest
rate that passed. Every search advances in lock-step rounds, each round's runs going to a
process pool at once, a look's other seeds only once its first is back and has not failed it for
certain (:func:`certain_miss`); the curve points for the figures go with the first round, each as long as
the run-length rule asks (it is drawn, never decided on, so the queue test's power does not size it).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

import numpy as np

from specbatch.commands.capacity.inputs import LONGEST, SAFETY, SLO, SLO_LATENCIES, SearchSettings
from sim.config import RunConfig
from sim.errors import InputError
from sim.limits import memory_problem, request_bytes
from sim.metrics import distribution_stats
from sim.stability import (WindowGrowths, measured_windows, pooled_growth, requests_for_power, sectioned_bound,
                           window_growths)

PROBE_BATCHES = 20   # the probe's requests: this many full batches, so most of it runs with a backlog
START_ABOVE = 1.1    # the first rate tried, over the probe's saturation throughput
STEP_DOWN = 0.5      # while no rate has passed, the next is this fraction of the last


@dataclass
class Probe:
    """A policy's saturation: every request at t = 0, measured while the replica still had a backlog."""

    throughput: float     # req/s: mu
    service_s: float      # mean time a request spent in the batch: s
    mean_batch_size: float


@dataclass
class PointRun:
    """One simulation at (rate, seed, requests), reduced to what the verdict and the report need."""

    rate: float
    seed: int
    num_requests: int
    growth: WindowGrowths | None    # the queue test's part of this run
    window: np.ndarray              # measured requests only, from here on: the sub-window each arrived in
    ttft_s: np.ndarray
    tpot_s: np.ndarray              # NaN for one-token outputs
    e2el_s: np.ndarray
    output_tokens: np.ndarray
    mean_k: float
    mean_batch_size: float
    steps: dict[str, np.ndarray] | None = None


@dataclass
class Point:
    """The evidence at one rate: its last look's runs, pooled, and what they say."""

    rate: float
    requests: int                    # per seed, in the last look
    look: int                        # 0 for the first runs, 1 after one rerun ...
    first: int                       # requests per seed of the first look
    stats: dict[str, float]          # SLO statistics, goodput, throughput ... (pooled_stats)
    queue: dict                      # sim.stability.QueueGrowth.document()
    verdict: str                     # pass | fail | undecided (a curve point is not rerun)
    reason: str                      # why, in words
    rerun: int | None = None         # with verdict "extend": the requests per seed of the next look
    curve: bool = False              # run for the figures, not by the search (judged, never rerun)
    doubt: str = ""                  # with verdict "extend": what was not shown, in words

    def document(self) -> dict:
        return {"rate_req_s": self.rate, "requests_per_seed": self.requests, "look": self.look,
                "first_requests_per_seed": self.first, "verdict": self.verdict, "reason": self.reason,
                "curve_point": self.curve,
                **self.stats, "queue": self.queue}


def run_point(config: RunConfig, rate: float, seed: int, num_requests: int, warmup: float,
              with_steps: bool = False) -> PointRun:
    """Simulate one point (a pure function of its arguments: safe to run in any worker)."""
    from sim.simulate import simulate

    workload = replace(config.workload, rate=rate, num_requests=num_requests, duration_s=None)
    engine = replace(config.engine, jit="on")  # compiled decode runs: the same results, sooner
    result = simulate(replace(config, seed=seed, workload=workload, engine=engine))
    table, summary = result.request_columns, result.summary
    arrival, finish = table["arrival_s"], table["finish_s"]
    edges = measured_windows(arrival, warmup)
    measured = arrival >= edges[0] if edges is not None else np.zeros(arrival.shape, bool)
    steps = None
    if with_steps:
        steps = {c: np.asarray(result.step_columns[c]) for c in ("start_s", "phase", "running", "k")}
    return PointRun(rate=rate, seed=seed, num_requests=num_requests,
                    growth=window_growths(arrival, finish, warmup),
                    window=np.searchsorted(edges, arrival[measured], side="right") - 1 if edges is not None
                    else np.zeros(0, np.int64),
                    ttft_s=table["ttft_s"][measured], tpot_s=table["tpot_s"][measured],
                    e2el_s=table["e2el_s"][measured], output_tokens=table["output_tokens"][measured],
                    mean_k=float(summary["mean_k"]), mean_batch_size=float(summary["mean_batch_size"]), steps=steps)


def run_probe(config: RunConfig, seed: int, num_requests: int) -> Probe:
    """Every request at t = 0: the throughput and time in the batch while a backlog waited (from the
    last admission back to half that time: the start, when the first batch is admitted at once, and
    the end, when the batch drains, are left out)."""
    from sim.simulate import simulate

    workload = replace(config.workload, rate=math.inf, num_requests=num_requests, duration_s=None)
    table = simulate(replace(config, seed=seed, workload=workload)).request_columns
    if config.cluster.prefill_replicas:
        return _pools_probe(table)
    scheduled, finish = table["scheduled_s"], table["finish_s"]
    backlog_until = float(scheduled.max())
    done = (finish >= backlog_until / 2) & (finish <= backlog_until)
    if backlog_until <= 0 or done.sum() < 2:  # all admitted at once: no backlog to measure
        done, window = np.ones(finish.shape, bool), float(finish.max())
    else:
        window = backlog_until / 2
    in_batch = finish[done] - scheduled[done]
    return Probe(throughput=float(done.sum()) / window, service_s=float(in_batch.mean()),
                 mean_batch_size=float(in_batch.sum() / window))


def _pools_probe(table: dict) -> Probe:
    """A disaggregated split's saturation (every request at t = 0 at the prefill pool): the throughput over
    the middle half of the completions, while both pools still had a backlog behind them, and a request's
    time in service, its queues left out: in a prefill batch, on the link, and in a decode batch (from its
    first token to its last)."""
    finish = np.sort(table["finish_s"])
    n = finish.shape[0]
    lo, hi = n // 4, (3 * n) // 4
    window = float(finish[hi] - finish[lo]) if hi > lo else 0.0
    if window <= 0:  # too few requests, or all finished at once: the whole run
        lo, hi, window = 0, n, float(finish[-1])
    in_service = ((table["prefill_done_s"] - table["scheduled_s"])
                  + (table["kv_transfer_end_s"] - table["kv_transfer_start_s"])
                  + (table["finish_s"] - table["first_token_s"]))
    throughput = (hi - lo) / window
    return Probe(throughput=throughput, service_s=float(in_service.mean()),
                 mean_batch_size=float(throughput * in_service.mean()))


def _work(job: tuple) -> int:
    """A job's requests: what its time grows with."""
    return job[3] if job[0] == "probe" else job[4]


def _run_job(job: tuple):
    kind, *args = job
    return run_probe(*args) if kind == "probe" else run_point(*args)


def pooled_stats(runs: list[PointRun], slos: tuple[SLO, ...], rate: float,
                 confidence: float = 0.95) -> dict[str, float]:
    """SLO statistics (summary.json names) over the pooled measured requests, each SLO's with its
    one-sided upper bound (``<metric>_upper``, from the runs' sub-windows: sim.stability's
    sectioning), and goodput: the rate times the fraction of measured requests meeting every
    per-request limit (so never above the rate)."""
    stats: dict[str, float] = {}
    cat = {name: np.concatenate([getattr(r, f"{name}_s") for r in runs]) for name in SLO_LATENCIES}
    for name, values in cat.items():
        stats.update(distribution_stats(name, values[~np.isnan(values)]))
    for slo in slos:
        stats[f"{slo.metric}_upper"] = sectioned_bound(stats[slo.metric], _sections(runs, slo), confidence)
    good = np.ones(cat["ttft"].size, dtype=bool)
    for name, limit in request_limits(slos).items():
        good &= ~(cat[name] * 1e3 > limit)  # NaN (a one-token TPOT) meets any limit, as in vLLM
    stats["good_fraction"] = float(good.mean()) if good.size else math.nan
    stats["goodput"] = rate * stats["good_fraction"]
    stats["measured_requests"] = int(cat["ttft"].size)
    stats["mean_output_tokens"] = float(np.concatenate([r.output_tokens for r in runs]).mean())
    stats["mean_k"] = float(np.mean([r.mean_k for r in runs]))
    stats["mean_batch_size"] = float(np.mean([r.mean_batch_size for r in runs]))
    return stats


def _sections(runs: list[PointRun], slo: SLO) -> np.ndarray:
    """The SLO's statistic in each sub-window of each run."""
    out = []
    for run in runs:
        values = getattr(run, f"{slo.latency}_s")
        for window in np.unique(run.window):
            section = values[(run.window == window) & ~np.isnan(values)]
            out.append(distribution_stats(slo.latency, section)[slo.metric] if section.size else math.nan)
    return np.asarray(out, dtype=float)


def request_limits(slos: tuple[SLO, ...]) -> dict[str, float]:
    """Per-request limits for goodput: the tightest limit given on each latency (ms)."""
    limits: dict[str, float] = {}
    for slo in slos:
        limits[slo.latency] = min(limits.get(slo.latency, math.inf), slo.limit_ms)
    return limits


def judge(runs: list[PointRun], slos: tuple[SLO, ...], settings: SearchSettings, look: int, first: int,
          extend: bool = True) -> Point:
    """The verdict at one rate from one look's runs (all seeds): pass, fail, or (``extend``) rerun longer.

    Pass: the queue is shown stable and every SLO's upper bound is within its limit. Fail: an SLO's
    estimate is over its limit, or the queue is shown to grow. Anything else is undecided: rerun
    longer (as long as the spread says it takes), or fail at the last look or when even the
    longest runs would not decide it, since nothing passes without evidence.
    """
    rate, n = runs[0].rate, runs[0].num_requests
    stats = pooled_stats(runs, slos, rate, settings.confidence)
    parts = [r.growth for r in runs]
    growth = pooled_growth(parts, settings.confidence, settings.max_growth) if all(p is not None for p in parts) \
        else None
    if growth is not None:
        stats["throughput"], stats["arrival_rate"] = growth.throughput, growth.arrival_rate
    missed = [f"{slo.metric} {stats[slo.metric]:.4g} > {slo.limit_ms:g}" for slo in slos
              if not stats[slo.metric] <= slo.limit_ms]
    unsure = [slo for slo in slos if not stats[f"{slo.metric}_upper"] <= slo.limit_ms]
    queue = growth.document() if growth is not None else {"verdict": "untested"}
    point = Point(rate, n, look, first, stats, queue, "fail", "")
    if missed:
        point.reason = "SLO missed: " + ", ".join(missed)
    elif growth is None:
        point.reason = "too few requests to test the queue"
    elif growth.grows:
        point.reason = f"queue grows ({growth.growth:.3g} req/s, at least {growth.low:.3g})"
    elif growth.stable and not unsure:
        point.verdict, point.reason = "pass", f"queue stable (growth < {growth.high:.3g} req/s), every SLO met"
    else:
        doubt = ([] if growth.stable else [f"queue growth up to {growth.high:.3g} req/s"])
        doubt += [f"{slo.metric} up to {stats[f'{slo.metric}_upper']:.4g}" for slo in unsure]
        # How much longer, for each bound's half-width to fit its margin: a kept-up queue's change over a
        # sub-window stays bounded, so its growth's half-width shrinks as 1 / requests; an SLO statistic's
        # as 1 / sqrt(requests).
        needs = [] if growth.stable else [_longer(growth.high - growth.growth, growth.tolerated - growth.growth, 1)]
        needs += [_longer(stats[f"{slo.metric}_upper"] - stats[slo.metric], slo.limit_ms - stats[slo.metric], 2)
                  for slo in unsure]
        longest = first * LONGEST
        factor = SAFETY * max(needs)  # infinite where an estimate is past its limit undecidedly: try the longest
        hopeless = math.isfinite(factor) and n * factor > 2 * longest
        if not extend:
            point.verdict, point.reason = "undecided", "not shown: " + ", ".join(doubt)
        elif look >= settings.extensions or n >= longest or hopeless:
            point.reason = "not shown: " + ", ".join(doubt) + (" (even the longest runs would not decide it)"
                                                               if hopeless else "")
        else:
            rerun = min(longest, math.ceil(n * max(2.0, factor))) if math.isfinite(factor) else longest
            point.verdict, point.rerun, point.doubt = "extend", rerun, ", ".join(doubt)
            point.reason = "undecided (" + ", ".join(doubt) + f"): rerun with {point.rerun} requests"
    return point


def certain_miss(run: PointRun, slos: tuple[SLO, ...], others: int, per_run: int) -> str | None:
    """An SLO whose statistic, over the measured requests of ``run`` pooled with those of ``others`` more
    runs (each at most ``per_run`` of them), is over its limit whatever those runs hold; None if none is.

    A mean is at least this run's sum over the most requests the pool can have (latencies are positive);
    a percentile (linear interpolation, as numpy's) is over the limit once the sorted value below its
    position is, that is once at least N - floor(q (N - 1)) of the N pooled values are, which holds for
    every N up to the most the pool can have when it holds for the most (one value to spare, and a
    relative 1e-9 on the limit, against rounding)."""
    for slo in slos:
        values = getattr(run, f"{slo.latency}_s")
        values = values[~np.isnan(values)] * 1000.0
        most = values.size + others * per_run
        stat, limit = slo.metric.split("_")[0], slo.limit_ms * (1 + 1e-9)
        if not values.size:
            continue
        if stat == "mean":
            if float(values.sum()) / most > limit:
                return slo.metric
            continue
        q = 50.0 if stat == "median" else float(stat[1:])
        if int(np.count_nonzero(values > limit)) >= most - math.floor(q / 100 * (most - 1)) + 1:
            return slo.metric
    return None


def _longer(half_width: float, margin: float, power: int) -> float:
    """The factor of requests that brings a half-width shrinking as requests ** (-1 / power) within its margin."""
    return (half_width / margin) ** power if margin > 0 and math.isfinite(half_width) else math.inf


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
            # After the start fails, first the rate that halving would bisect to next (the boundary is most
            # often near the saturation throughput), and only should that fail, the halved start.
            first = (self.start * STEP_DOWN + self.start) / 2
            if self.hi == self.start:
                return first
            below = self.start * STEP_DOWN if self.hi == first else self.hi * STEP_DOWN
            return below if self.hi > self.start * STEP_DOWN ** s.max_steps_down else None
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

    def refute(self, rate: float, standing: Iterable[float]) -> None:
        """``rate``, counted as passing, failed after all: it bounds the bracket from above, and lo falls
        back to the highest of the rates still standing (passed, or counted as passing) below it."""
        self.record(rate, False)
        self.lo = max((r for r in standing if r < rate), default=None)


@dataclass
class PolicyOutcome:
    label: str
    config: RunConfig
    probe: Probe
    max_rate: float                     # highest rate that passed (0 when none did)
    bracket: tuple[float, float | None]
    points: dict[float, Point] = field(default_factory=dict)  # every rate run, with its evidence
    steps: dict[str, np.ndarray] | None = None
    runs: int = 0                       # simulations the search ran for it (probe and reruns included)
    requests: int = 0                   # requests those simulations served: what the search's time grows with

    @property
    def operating(self) -> dict[str, float] | None:
        """The pooled statistics at the max rate."""
        point = self.points.get(self.max_rate)
        return point.stats if point is not None and self.max_rate > 0 else None


class Runner:
    """Runs batches of jobs on a process pool (or in-process for jobs = 1), caching every result."""

    def __init__(self, jobs: int, progress: Callable[[str], None] | None = None) -> None:
        from specbatch.commands.workers import worker_pool

        self.jobs = max(1, jobs)
        self.pool = worker_pool(self.jobs) if self.jobs > 1 else None
        self.cache: dict[tuple, object] = {}    # (label, ...) -> a Probe or a PointRun
        self.by_label: dict[str, int] = {}      # runs per label
        self.requests: dict[str, int] = {}      # requests simulated per label
        self.progress = progress or (lambda text: None)
        self.runs = 0

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def run(self, wanted: Iterable[tuple[tuple, tuple]], then: Callable[[tuple, object], list] | None = None) -> int:
        """Run the (key, job) pairs not yet cached; returns how many that was. ``then(key, result)``, called
        as each result comes back, may ask for more (key, job) pairs, run in the same batch (a look's other
        seeds, once its first is back): the runs asked for depend on the results alone, never on timing."""
        then = then or (lambda key, result: [])
        keys: set[tuple] = set()

        def fresh(pairs) -> list[tuple[tuple, tuple]]:
            out = [(key, job) for key, job in pairs if key not in self.cache and key not in keys]
            keys.update(key for key, _ in out)
            return sorted(out, key=lambda pair: -_work(pair[1]))  # the longest first: less idling at the end

        queue = fresh(wanted)
        ran = 0
        if self.pool is None:
            while queue:
                key, job = queue.pop(0)
                ran += self._keep(key, job, _run_job(job))
                queue += fresh(then(key, self.cache[key]))
            return ran
        from concurrent.futures import FIRST_COMPLETED, wait

        pending = {self.pool.submit(_run_job, job): (key, job) for key, job in queue}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                key, job = pending.pop(future)
                ran += self._keep(key, job, future.result())
                for more in fresh(then(key, self.cache[key])):
                    pending[self.pool.submit(_run_job, more[1])] = more
        return ran

    def _keep(self, key: tuple, job: tuple, result) -> int:
        self.cache[key] = result
        self.by_label[key[0]] = self.by_label.get(key[0], 0) + 1
        self.requests[key[0]] = self.requests.get(key[0], 0) + _work(job)
        self.runs += 1
        return 1

    def get(self, key: tuple):
        return self.cache[key]

    def release(self, key: tuple) -> None:
        """Forget a result once judged (its per-request arrays add up over a search's hundreds of runs)."""
        self.cache.pop(key, None)


def search_capacity(configs: dict[str, RunConfig], slos: tuple[SLO, ...], settings: SearchSettings,
                    jobs: int = os.cpu_count() or 1, progress: Callable[[str], None] | None = None,
                    curve_groups: dict[str, str] | None = None) -> dict[str, PolicyOutcome]:
    """The whole search for every policy (label -> config), in lock-step rounds on one pool.

    ``curve_groups`` (label -> group) makes the labels of one group share their curve rates
    (one profile's policies, say); by default every label is in one group.
    """
    runner = Runner(jobs, progress)
    try:
        return _Search(runner, configs, slos, settings).run(curve_groups or {})
    finally:
        runner.close()


class _Search:
    """One capacity search's state: the probes, each policy's bracket and the look at its current rate."""

    def __init__(self, runner: Runner, configs: dict[str, RunConfig], slos: tuple[SLO, ...],
                 settings: SearchSettings) -> None:
        self.runner, self.configs, self.slos, self.s = runner, configs, slos, settings
        self.probes: dict[str, Probe] = {}
        self.points: dict[str, dict[float, Point]] = {label: {} for label in configs}
        self.steps: dict[str, tuple[float, dict]] = {}  # label -> (its highest pass, that look's first-seed steps)
        self.curve_points: dict[str, dict[float, Point]] = {}

    def size(self, label: str, rate: float, decided: bool = True) -> int:
        """Requests per seed of a rate's first look: arrivals over service_times service times, and
        enough for the queue test to show a queue of rate x service time requests (Little's law)
        stable (sim.stability.requests_for_power), whichever is more. A curve point (not ``decided``)
        is drawn, never decided on: the service times alone size it."""
        s, service = self.s, self.probes[label].service_s
        long_enough = max(s.min_requests, math.ceil(rate * s.service_times * service))
        if not decided:
            return long_enough
        return max(long_enough,
                   requests_for_power(rate * service, len(s.seeds), 1 - s.warmup, confidence=s.confidence,
                                      max_growth=s.max_growth))

    def jobs(self, label: str, rate: float, n: int, seeds=None, steps: bool = False):
        """A look's runs; with ``steps`` the first seed's run keeps its step records (should the rate be
        the max rate, the operating-point figure draws them: no run again for them)."""
        seeds = seeds or self.s.seeds
        for seed in seeds:
            keep = steps and seed == seeds[0]
            yield (label, rate, seed, n, keep), ("point", self.configs[label], rate, seed, n, self.s.warmup, keep)

    def looked(self, label: str, rate: float, n: int, look: int, extend: bool = True, seeds=None,
               steps: bool = False, keep: bool = False, decided: bool = True) -> Point:
        """The verdict of one look's runs (their per-request arrays are then let go, unless ``keep`` and
        the rate did not fail: a rate is never looked at again with the same length, but a look of the
        first seed alone goes on with the others); a pass above the label's best so far keeps the first
        seed's step records."""
        keys = [key for key, _ in self.jobs(label, rate, n, seeds, steps)]
        runs = [self.runner.get(key) for key in keys]
        point = judge(runs, self.slos, self.s, look, self.size(label, rate, decided), extend)
        best = self.steps.get(label)
        if steps and point.verdict == "pass" and (best is None or rate > best[0]):
            self.steps[label] = (rate, runs[0].steps)
        for key in keys if not keep or point.verdict == "fail" else ():
            self.runner.release(key)
        return point

    def probe(self) -> None:
        s, say = self.s, self.runner.progress
        wanted = []
        for label, config in self.configs.items():
            # full batches on every replica that decodes (a disaggregated split's decode pool)
            n = max(s.min_requests, PROBE_BATCHES * config.engine.max_batch_size * max(1, config.cluster.decode_replicas))
            wanted.append(((label, "probe"), ("probe", config, s.seeds[0], n)))
        self.runner.run(wanted)
        self.probes = {label: self.runner.get((label, "probe")) for label in self.configs}
        say("saturation probe (req/s): " + ", ".join(f"{label} {p.throughput:.4g}" for label, p in self.probes.items()))
        largest = max(self.size(label, p.throughput * START_ABOVE * 2 ** s.max_doublings) * LONGEST
                      for label, p in self.probes.items())
        problem = memory_problem(request_bytes(largest))
        if problem is not None:
            raise InputError(f"the longest runs the search may need ({largest} requests) {problem}",
                             source="--service-times")

    def run(self, curve_groups: dict[str, str]) -> dict[str, PolicyOutcome]:
        """Rounds until every label's bracket is within the tolerance with its lo shown sustained.

        A rate undecided at its first look is counted as passing while the search goes higher, and
        rerun longer (the extensions of :func:`judge`) only once it is the label's lo at the end:
        a rate below a higher one shown sustained needs no evidence of its own, and near the
        boundary such reruns were most of a search's work. If the rerun fails, the bracket's hi
        comes down to it, lo falls back to the highest rate still standing below it, and the
        search goes on from there; so the max rate is, as before, a rate its own runs showed
        sustained, and every rate gets at most 1 + extensions looks.
        """
        s, say = self.s, self.runner.progress
        self.probe()
        searches = {label: RateSearch(START_ABOVE * p.throughput, s) for label, p in self.probes.items()}
        curve = self.curve_rates(curve_groups)  # run with the first round, which has few runs of its own
        looks: dict[str, tuple[int, int]] = {}  # label -> (look, requests per seed) due at its current rate
        seeds: dict[str, tuple[int, ...]] = {}  # label -> the seeds of the look due (the first alone: see below)
        confirming: dict[str, float] = {}      # label -> the undecided lo being rerun longer
        tentative: dict[str, dict[float, tuple[int, int]]] = {label: {} for label in self.configs}
        standing: dict[str, set[float]] = {label: set() for label in self.configs}  # passed or counted as passing
        rounds = 0
        while True:
            due = {}
            for label, search in searches.items():
                rate = confirming.get(label, search.next_rate())
                if rate is None and search.lo in tentative[label]:
                    rate = confirming[label] = search.lo
                    looks[label] = tentative[label].pop(rate)
                if rate is not None:
                    due[label] = rate
            if not due:
                break
            rounds += 1
            for label, rate in due.items():
                if label not in looks:
                    looks[label] = (0, self.size(label, rate))
                    # Above the saturation throughput the queue grows: one seed shows that as well as
                    # three (a fail can only lower the answer); the others run only if it does not.
                    seeds[label] = s.seeds[:1] if rate >= self.probes[label].throughput else s.seeds
            # A look's first seed runs first; its other seeds follow unless it alone already puts an SLO
            # statistic of the pooled seeds over its limit (a certain fail: the other seeds cannot change it).
            wanted, follow, certain = [], {}, set()

            def then(key, result):
                label, rest = follow.pop(key, (None, []))
                if rest and certain_miss(result, self.slos, len(rest), key[3]) is not None:
                    certain.add(label)
                    return []
                return rest

            for label, rate in due.items():
                first, *rest = self.jobs(label, rate, looks[label][1], seeds[label], steps=True)
                follow[first[0]] = (label, rest)
                if first[0] in self.runner.cache:  # run in an earlier round (the first seed alone, above mu)
                    wanted += then(first[0], self.runner.get(first[0]))
                else:
                    wanted.append(first)
            new = self.runner.run(wanted + [job for label, rates in curve.items() for rate in rates
                                            for job in self.jobs(label, rate, self.size(label, rate, False),
                                                                 s.seeds[:1])], then)
            curve = self.curve_looks(curve)
            for label, rate in due.items():
                look, n = looks.pop(label)
                partial = len(seeds[label]) < len(s.seeds)
                point = self.looked(label, rate, n, look, seeds=s.seeds[:1] if label in certain else seeds[label],
                                    steps=True, keep=partial)
                if label in certain:
                    point.reason += " (the first seed alone: over the limit whatever the other seeds hold)"
                if partial and point.verdict != "fail":
                    looks[label], seeds[label] = (look, n), s.seeds  # the other seeds, at the same length
                    continue
                if partial:
                    point.reason += " (the first seed alone: above the saturation throughput)"
                if point.verdict == "extend" and label in confirming:
                    looks[label] = (look + 1, point.rerun)
                    continue
                self.points[label][rate] = point
                confirming.pop(label, None)
                if point.verdict == "extend":
                    tentative[label][rate] = (look + 1, point.rerun)
                    point.verdict = "undecided"
                    point.reason = (f"not shown ({point.doubt}): counted as passing while higher rates were tried "
                                    "(rerun longer only if it is the max rate)")
                if point.verdict == "fail":
                    standing[label].discard(rate)
                    searches[label].refute(rate, standing[label])
                else:
                    standing[label].add(rate)
                    searches[label].record(rate, True)
            say(f"round {rounds}: {new} runs ({self.runner.runs} so far); brackets (req/s) " + ", ".join(
                f"{label} {_bracket_text(search)}" for label, search in searches.items()))
        for label, points in self.curve_points.items():  # where the search ran a curve's rate, its evidence wins
            self.points[label] = {**points, **self.points[label]}
        outcomes = {}
        for label, search in searches.items():
            max_rate = search.lo or 0.0
            steps = self.steps.get(label, (None, None))
            outcomes[label] = PolicyOutcome(label=label, config=self.configs[label], probe=self.probes[label],
                                            max_rate=max_rate, bracket=(max_rate, search.hi),
                                            points=dict(sorted(self.points[label].items())),
                                            steps=steps[1] if steps[0] == search.lo else None,
                                            runs=self.runner.by_label.get(label, 0),
                                            requests=self.runner.requests.get(label, 0))
        return outcomes

    def curve_rates(self, curve_groups: dict[str, str]) -> dict[str, list[float]]:
        """Evenly spaced rates up to the fastest probe of the label's group, for the figures: one look
        each, of the first seed (a curve point is drawn, not decided on; it is never rerun and its
        queue test may stay undecided)."""
        s = self.s
        group = {label: curve_groups.get(label, "") for label in self.configs}
        top = {g: max(self.probes[label].throughput for label in self.configs if group[label] == g)
               for g in group.values()}
        return {label: [top[group[label]] * j / s.curve_points for j in range(1, s.curve_points + 1)]
                for label in self.configs}

    def curve_looks(self, curve: dict[str, list[float]]) -> dict[str, list[float]]:
        """Judge the curve points just run; returns none left to run."""
        for label, rates in curve.items():
            for rate in rates:
                point = self.looked(label, rate, self.size(label, rate, False), 0, extend=False, seeds=self.s.seeds[:1],
                                    decided=False)
                point.curve = True
                self.curve_points.setdefault(label, {})[rate] = point
        return {}


def _bracket_text(search: RateSearch) -> str:
    lo = "?" if search.lo is None else f"{search.lo:.4g}"
    hi = "?" if search.hi is None else f"{search.hi:.4g}"
    return f"[{lo}, {hi}]"


def stderr_progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
