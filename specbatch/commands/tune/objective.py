"""What a tune optimises: a latency statistic of ``summary.json`` (vLLM's names), or request goodput.

The statistics are ``sim.metrics``' own (``vllm bench serve``'s definitions): the mean, the
median or a percentile of TTFT, TPOT, ITL or E2EL over a run's requests, named as in
summary.json (``mean_e2el_ms``, ``p99_tpot_ms``; ``p50_`` means ``median_``), minimised;
or ``request_goodput`` (requests per second meeting every SLO of ``--goodput``, as vLLM
counts them), maximised. A candidate's value is the mean over seeds of each seed's
statistic, and candidates are compared on the same seeds (paired: the seeds' workloads
are the same, so most of the seed-to-seed spread cancels).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from sim.errors import InputError
from sim.metrics import PERCENTILES

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATISTICS = ("mean", "median", *(f"p{p}" for p in PERCENTILES))
LATENCY_METRICS = tuple(f"{s}_{m}_ms" for m in LATENCIES for s in STATISTICS)
GOODPUT = "request_goodput"
DEFAULT = "mean_e2el_ms"
NOISE_LEVEL = 0.05  # "within noise": a paired t-test at 5% (two-sided) does not find the difference


@dataclass(frozen=True)
class Objective:
    metric: str          # a summary.json name
    maximize: bool

    def loss(self, summary: dict) -> float:
        """What the search minimises (goodput negated); NaN (no such requests) counts as infinitely bad."""
        value = summary.get(self.metric)
        if value is None or not math.isfinite(value):
            return math.inf
        return -value if self.maximize else value

    def value(self, loss: float) -> float:
        """A loss back in the metric's own sign and unit."""
        return -loss if self.maximize else loss

    @property
    def unit(self) -> str:
        return "req/s" if self.maximize else "ms"

    def __str__(self) -> str:
        return f"{'maximise' if self.maximize else 'minimise'} {self.metric}"


def parse_objective(text: str, goodput: dict | None, source: str = "--objective") -> Objective:
    """``mean_e2el_ms``, ``p99_tpot_ms``, ``p50_ttft_ms``, or ``request_goodput`` (alias ``goodput``),
    which needs the SLOs (``--goodput ttft:500 tpot:50``)."""
    name = re.sub(r"^p50_", "median_", text.strip())
    if name in (GOODPUT, "goodput"):
        if not goodput:
            raise InputError("request goodput needs SLOs: give --goodput ttft:MS tpot:MS e2el:MS (vLLM's pairs)",
                             source=source)
        return Objective(GOODPUT, maximize=True)
    if name not in LATENCY_METRICS:
        raise InputError(f"unknown objective '{text}'; use {GOODPUT} or one of {', '.join(LATENCY_METRICS)} "
                         "(p50_ for median_)", source=source)
    return Objective(name, maximize=False)


@dataclass(frozen=True)
class Paired:
    """The difference a - b of two candidates' losses over the same seeds, and Student's t-test of it
    (the per-seed differences as a sample; with one seed there is no spread, and any difference counts)."""

    mean: float
    se: float            # standard error of the mean difference (0 with one seed)
    seeds: int

    def bound(self, level: float) -> float:
        """The one-sided critical difference at ``level``: t(1 - level, seeds - 1) standard errors."""
        if self.seeds < 2 or self.se == 0:
            return 0.0
        from sim.stability import t_quantile

        return t_quantile(1.0 - level, self.seeds - 1) * self.se

    def interval(self, level: float = NOISE_LEVEL) -> float:
        """Half the two-sided confidence interval of the mean difference at ``level`` (95% by default)."""
        return self.bound(level / 2)

    @property
    def noise(self) -> float:
        """Half the two-sided 95% confidence interval of the mean difference."""
        return self.interval()

    @property
    def within_noise(self) -> bool:
        """a is better than b, or worse by no more than the noise."""
        return self.mean <= self.noise

    def category(self, level: float = NOISE_LEVEL) -> str:
        """"better", "within noise" or "worse": where the confidence interval at ``level`` lies."""
        half = self.interval(level)
        return "better" if self.mean < -half else ("within noise" if self.mean <= half else "worse")

    def below(self, level: float) -> bool:
        """a is better than b, significantly at ``level`` (one-sided)."""
        return self.mean < 0 and self.mean < -self.bound(level)


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    diffs = [x - y for x, y in zip(a, b)]
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2 or not math.isfinite(mean):
        return Paired(mean, 0.0, n)
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return Paired(mean, math.sqrt(var / n), n)
