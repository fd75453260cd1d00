"""Timers: warm up, repeat, keep robust statistics of the per-pass latency.

* CPU: ``time.perf_counter`` around each pass.
* CUDA: a pair of CUDA events around each pass, after a synchronize so the queue is empty
  (the sample then includes the host's kernel-launch time, as in a real step).
* CUDA graphs: serving engines (vLLM) capture decode-sized passes in CUDA graphs and
  replay them, which removes most launch overhead; :func:`time_cuda` can do the same, one
  graph per shape, and falls back to eager execution if capture fails (and says so).

Each point stops repeating once its samples add up to ``budget_s`` (at least one sample),
so a grid with a few very long passes still finishes in predictable time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class TimerConfig:
    warmup: int = 1
    repeats: int = 3
    budget_s: float = 2.0  # stop repeating (and warming up) once this much time was spent


@dataclass(frozen=True)
class Measurement:
    samples: tuple[float, ...]  # seconds per pass
    graph: bool = False  # replayed from a CUDA graph
    note: str = ""  # e.g. why graph capture fell back to eager

    def stats(self) -> dict[str, float | int]:
        """The ``sim.costmodel.profile`` LATENCY columns (seconds) plus ``samples``."""
        x = np.asarray(self.samples, dtype=float)
        return {
            "samples": int(x.size),
            "latency_median_s": float(np.median(x)),
            "latency_mean_s": float(x.mean()),
            "latency_std_s": float(x.std(ddof=1)) if x.size > 1 else 0.0,
            "latency_p10_s": float(np.percentile(x, 10)),
            "latency_p90_s": float(np.percentile(x, 90)),
            "latency_min_s": float(x.min()),
        }


def _repeat(run: Callable[[], float], cfg: TimerConfig) -> tuple[float, ...]:
    spent = 0.0
    for _ in range(cfg.warmup):
        spent += run()
        if spent >= cfg.budget_s:
            break
    samples: list[float] = []
    while len(samples) < cfg.repeats and (not samples or sum(samples) < cfg.budget_s):
        samples.append(run())
    return tuple(samples)


def time_cpu(fn: Callable[[], object], cfg: TimerConfig) -> Measurement:
    """Wall-clock time of ``fn`` with ``time.perf_counter``."""
    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return Measurement(_repeat(run, cfg))


def time_cuda(fn: Callable[[], object], cfg: TimerConfig, *, graph: bool = False) -> Measurement:
    """GPU time of ``fn`` with CUDA events; with ``graph`` capture it once and time replays."""
    import torch

    note = ""
    if graph:
        try:
            replay = _capture(fn, cfg.warmup)
            return Measurement(_repeat(lambda: _event_time(replay), cfg), graph=True)
        except Exception as exc:  # noqa: BLE001 - any capture problem means "run eagerly"
            torch.cuda.synchronize()
            note = f"CUDA graph capture failed, timed eagerly: {type(exc).__name__}: {exc}".splitlines()[0]
    return Measurement(_repeat(lambda: _event_time(fn), cfg), note=note)


def _event_time(fn: Callable[[], object]) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _capture(fn: Callable[[], object], warmup: int) -> Callable[[], object]:
    """Capture ``fn`` into a CUDA graph (after warm-up on a side stream, as torch requires)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay
