"""Does the queue keep up? A test of a run's stability from its arrival and finish times.

A replica offered more than it serves leaves part of every second's arrivals behind: the
number of requests in the system (arrived, not yet finished) grows without bound, and
so do TTFT and E2EL, however good a short run looks. This module measures that growth
and says whether it is there, with a stated test:

* **What is measured.** The *measured window* is the later part of a run's arrival
  window (by default its second half, so the empty system the run starts from does not
  count). It is cut into ``WINDOWS`` equal sub-windows; in each, the queue's growth is
  (arrivals - completions) / its length, in requests per second. Over the whole window
  that is the arrival rate minus the throughput: the growth test is the throughput test.
  (A capacity search, which must show a queue stable, cuts each run in ``WINDOWS``: the
  bound on a stable queue's growth widens with the number of sub-windows. A single run's
  check, which looks for growth, cuts it in ``GROWTH_WINDOWS``: an overloaded queue's
  increments are independent at any scale, and more of them make the t quantile smaller.)
* **The estimate.** The mean growth over every sub-window of every run given (seeds are
  independent replications), with a Student-t interval: mean +- t(n - 1) x sd / sqrt(n).
* **Why that interval is safe.** When the replica is overloaded its queue is a random
  walk with a drift, whose increments over disjoint sub-windows are independent: the
  interval is then exact (to the normal approximation). When it keeps up, the queue
  returns to a level, successive increments are negatively correlated, and the interval
  is wider than it needs to be. So the test errs towards "not shown stable", never
  towards hiding a growing queue.
* **The verdict.** With ``tolerated = MAX_GROWTH x arrival rate`` (1% of the arrivals
  left behind): ``stable`` when the upper bound of the interval is below it, ``grows``
  when the lower bound is above it, else undecided (a longer run decides). Each bound is
  one-sided at the confidence asked for (95% by default), so a rate whose queue keeps 1%
  or more of its arrivals passes as stable at most 5% of the time.

The capacity search (``specbatch.commands.capacity``) applies it to every rate it tries, and
every simulated run at a constant rate is checked with it (:func:`run_check`): a run whose
queue grows says so in one warning line and in summary.json's ``queue`` section.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

WINDOWS = 5          # sub-windows per run's measured window, to show a queue stable (fewer: tighter bound)
GROWTH_WINDOWS = 20  # ... to show it growing (more: a surer t; an overloaded queue's increments are independent)
MAX_GROWTH = 0.01    # the growth tolerated, as a fraction of the arrival rate
MEASURED_FROM = 0.5  # the measured window starts this far into the arrival window
CONFIDENCE = 0.95    # of each one-sided bound


@dataclass(frozen=True)
class QueueGrowth:
    """A queue's growth over the measured windows of one or more runs, with its interval."""

    arrival_rate: float   # arrivals per second in the measured windows
    throughput: float     # completions per second in the same windows
    growth: float         # mean growth of the number in the system, req/s (arrival_rate - throughput)
    low: float            # one-sided lower bound at `confidence`
    high: float           # one-sided upper bound at `confidence`
    confidence: float
    windows: int          # sub-windows averaged (per run x runs)
    window_s: float       # the measured windows' total length
    max_growth: float = MAX_GROWTH  # the growth tolerated, as a fraction of the arrival rate

    @property
    def tolerated(self) -> float:
        """The growth a kept-up queue may show: max_growth of the arrival rate."""
        return self.max_growth * self.arrival_rate

    @property
    def stable(self) -> bool:
        return self.high < self.tolerated

    @property
    def grows(self) -> bool:
        return self.low > self.tolerated

    @property
    def verdict(self) -> str:
        return "stable" if self.stable else "grows" if self.grows else "undecided"

    def document(self) -> dict:
        """As summary.json and capacity.json record it."""
        return {**{k: _finite(v) for k, v in asdict(self).items()}, "tolerated": _finite(self.tolerated),
                "verdict": self.verdict}

    def warning(self) -> str:
        """The one line a run whose queue grows prints."""
        share = self.growth / self.arrival_rate if self.arrival_rate > 0 else math.nan
        return (f"the queue grows without bound: over the second half of the arrivals "
                f"{self.arrival_rate:.4g} req/s came in and {self.throughput:.4g} req/s were served, so "
                f"{self.growth:.3g} req/s ({share:.1%}) stayed behind (at least {self.low:.3g} at "
                f"{self.confidence:.0%} confidence): this replica does not keep up with the offered rate, "
                f"and TTFT and E2EL grow with the run's length")


@dataclass(frozen=True)
class WindowGrowths:
    """One run's part of the test: the growth in each sub-window of its measured window."""

    growths: np.ndarray   # req/s, one per sub-window
    arrived: int          # arrivals in the measured window
    served: int           # completions in it
    window_s: float       # its length


def measured_windows(arrival_s: np.ndarray, measured_from: float = MEASURED_FROM,
                     windows: int = WINDOWS) -> np.ndarray | None:
    """The edges of a run's sub-windows: ``windows`` equal parts of the arrival window from
    ``measured_from`` of the way in, the last arrival inside the last; None when the arrivals
    span no time (every request at once)."""
    first, last = float(np.min(arrival_s)), float(np.max(arrival_s))
    start = first + measured_from * (last - first)
    if not last > start:
        return None
    edges = np.linspace(start, last, windows + 1)
    edges[-1] = np.nextafter(last, math.inf)
    return edges


def window_growths(arrival_s: np.ndarray, finish_s: np.ndarray, measured_from: float = MEASURED_FROM,
                   windows: int = WINDOWS) -> WindowGrowths | None:
    """One run's growths; None when its arrivals span no time (every request at once)."""
    edges = measured_windows(arrival_s, measured_from, windows)
    if edges is None:
        return None
    arrived, served = in_windows(arrival_s, edges), in_windows(finish_s, edges)
    return WindowGrowths((arrived - served) / np.diff(edges), int(arrived.sum()), int(served.sum()),
                         float(edges[-1] - edges[0]))


def in_windows(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """How many of ``times`` fall in each [edges[i], edges[i + 1]) (NaN in none): a count per
    window without sorting a long run's million times."""
    window = np.searchsorted(edges, times, side="right")  # i + 1 for a time in window i
    return np.bincount(window, minlength=edges.shape[0] + 1)[1:edges.shape[0]]


def requests_for_power(in_system: float, runs: int, measured_fraction: float, windows: int = WINDOWS,
                       confidence: float = CONFIDENCE, max_growth: float = MAX_GROWTH) -> int:
    """Requests per run for the test to show a kept-up queue stable: with ``in_system`` requests
    in the system on average (Little: rate x time in the system), a queue that fluctuates like a
    Poisson count (variance = mean) changes by about sqrt(2 x in_system) over a sub-window longer
    than a request's stay; the bound on the mean growth over ``runs`` x ``windows`` sub-windows is
    below ``max_growth`` of the arrivals once each run has

        t x sqrt(2 x in_system) x sqrt(windows) / (max_growth x sqrt(runs) x measured_fraction)

    requests (``measured_fraction``: the part of a run's arrivals that is measured). A queue near
    saturation fluctuates more and needs longer runs; the capacity search reruns those."""
    t = t_quantile(confidence, max(1, runs * windows - 1))
    return math.ceil(t * math.sqrt(2 * max(in_system, 0.0) * windows)
                     / (max_growth * math.sqrt(runs) * measured_fraction))


_T_QUANTILES: dict[tuple[float, int], float] = {}  # this process's, by (confidence, dof)


def t_quantile(confidence: float, dof: int) -> float:
    """Student's t quantile, scipy.special's ``stdtrit`` (the same function as scipy.stats.t.ppf,
    without importing scipy.stats: 0.3 s of every run's post-run check)."""
    key = (float(confidence), int(dof))
    if key not in _T_QUANTILES:
        _T_QUANTILES[key] = _stored_t_quantile(*key)
    return _T_QUANTILES[key]


def _stored_t_quantile(confidence: float, dof: int) -> float:
    """``stdtrit(dof, confidence)``, kept in the fit cache (sim/costmodel/cache.py, keyed by scipy's
    version among the rest): importing scipy.special takes 0.2 s, most of a constant-rate run's
    growth check, for the one quantile it needs, the same every run. A process that has imported
    scipy.special computes it; the stored double is the computed one."""
    import hashlib
    import sys

    from sim.costmodel import cache

    name = "stdtrit-" + hashlib.sha256(f"{cache.CODE_VERSION}:{confidence.hex()}:{dof}".encode()).hexdigest()[:16]
    if "scipy.special" not in sys.modules:
        stored = cache.load(name)
        if stored is not None and stored.get("value", np.zeros(0)).shape == (1,):
            return float(stored["value"][0])
    from scipy.special import stdtrit

    value = float(stdtrit(dof, confidence))
    cache.store(name, {"value": np.array([value])})
    return value


def sectioned_bound(estimate: float, sections: np.ndarray, confidence: float = CONFIDENCE) -> float:
    """A one-sided upper confidence bound on a statistic estimated from a whole sample, its spread
    taken from the same statistic on independent-enough sections of it (sectioning: the sub-windows
    of every run): estimate + t(n - 1) x sd(sections) / sqrt(n). NaN with fewer than two sections."""
    sections = sections[np.isfinite(sections)]
    if sections.size < 2:
        return math.nan
    return estimate + t_quantile(confidence, sections.size - 1) * float(sections.std(ddof=1)) / math.sqrt(sections.size)


def pooled_growth(parts: Sequence[WindowGrowths], confidence: float = CONFIDENCE,
                  max_growth: float = MAX_GROWTH) -> QueueGrowth | None:
    """The test over runs' growths pooled (independent replications); None with fewer than two sub-windows."""
    g = np.concatenate([part.growths for part in parts]) if parts else np.zeros(0)
    if g.size < 2:
        return None
    mean = float(g.mean())
    half = t_quantile(confidence, g.size - 1) * float(g.std(ddof=1)) / math.sqrt(g.size)
    length = sum(part.window_s for part in parts)
    return QueueGrowth(arrival_rate=sum(p.arrived for p in parts) / length, throughput=sum(p.served for p in parts)
                       / length, growth=mean, low=mean - half, high=mean + half, confidence=confidence,
                       windows=int(g.size), window_s=length, max_growth=max_growth)


def queue_growth(runs: Sequence[tuple[np.ndarray, np.ndarray]], measured_from: float = MEASURED_FROM,
                 windows: int = WINDOWS, confidence: float = CONFIDENCE) -> QueueGrowth | None:
    """The test over runs given as (arrival_s, finish_s) pairs; None when there is too little to test."""
    parts = [window_growths(arrival_s, finish_s, measured_from, windows) for arrival_s, finish_s in runs]
    return None if any(part is None for part in parts) else pooled_growth(parts, confidence)


def run_check(workload, arrival_s: np.ndarray, scheduled_s: np.ndarray, finish_s: np.ndarray) -> QueueGrowth | None:
    """The growth test of one simulated run, where it applies: arrivals at one constant rate,
    open-loop (not a trace, a time-varying rate, every request at once, or a client that holds
    requests back, whose queue waits outside the replica), and a measured window that holds
    ``2 x GROWTH_WINDOWS`` arrivals and outlasts a request's median time in service (over a
    shorter one, few finish however well the replica keeps up)."""
    if (workload.trace is not None or workload.trace_vllm is not None or workload.rate_profile is not None
            or not math.isfinite(workload.rate) or workload.max_concurrency is not None):
        return None
    edges = measured_windows(arrival_s, MEASURED_FROM, GROWTH_WINDOWS)
    if edges is None or edges[-1] - edges[0] < float(np.median(finish_s - scheduled_s)) \
            or int(np.count_nonzero(arrival_s >= edges[0])) < 2 * GROWTH_WINDOWS:
        return None
    return queue_growth([(arrival_s, finish_s)], windows=GROWTH_WINDOWS)


def _finite(value):
    return value if not isinstance(value, float) or math.isfinite(value) else None
