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

The capacity search (``sim.commands.capacity``) applies it to every rate it tries, and
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

    @property
    def tolerated(self) -> float:
        """The growth a kept-up queue may show: MAX_GROWTH of the arrival rate."""
        return MAX_GROWTH * self.arrival_rate

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


def queue_growth(runs: Sequence[tuple[np.ndarray, np.ndarray]], measured_from: float = MEASURED_FROM,
                 windows: int = WINDOWS, confidence: float = CONFIDENCE) -> QueueGrowth | None:
    """The growth over the runs given as (arrival_s, finish_s) pairs; None when there is too little
    to test (a run whose arrivals span no time, or fewer than two sub-windows in all)."""
    from scipy import stats

    growths, arrived, served, length = [], 0, 0, 0.0
    for arrival_s, finish_s in runs:
        first, last = float(np.min(arrival_s)), float(np.max(arrival_s))
        start = first + measured_from * (last - first)
        if not last > start:
            return None
        edges = np.linspace(start, last, windows + 1)
        edges[-1] = np.nextafter(last, math.inf)  # the last arrival belongs to the last sub-window
        a = np.diff(np.searchsorted(np.sort(arrival_s), edges))
        d = np.diff(np.searchsorted(np.sort(finish_s), edges))
        growths.append((a - d) / np.diff(edges))
        arrived, served, length = arrived + int(a.sum()), served + int(d.sum()), length + (edges[-1] - start)
    g = np.concatenate(growths)
    if g.size < 2:
        return None
    mean = float(g.mean())
    half = float(stats.t.ppf(confidence, g.size - 1) * g.std(ddof=1) / math.sqrt(g.size))
    return QueueGrowth(arrival_rate=arrived / length, throughput=served / length, growth=mean, low=mean - half,
                       high=mean + half, confidence=confidence, windows=int(g.size), window_s=length)


def run_check(workload, arrival_s: np.ndarray, finish_s: np.ndarray) -> QueueGrowth | None:
    """The growth test of one simulated run, where it applies: arrivals at one constant rate,
    open-loop (not a trace, a time-varying rate, every request at once, or a client that holds
    requests back, whose queue waits outside the replica)."""
    if (workload.trace is not None or workload.trace_vllm is not None or workload.rate_profile is not None
            or not math.isfinite(workload.rate) or workload.max_concurrency is not None):
        return None
    return queue_growth([(arrival_s, finish_s)], windows=GROWTH_WINDOWS)


def _finite(value):
    return value if not isinstance(value, float) or math.isfinite(value) else None
