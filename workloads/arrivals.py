"""Arrival processes, defined as in ``vllm bench serve``.

The first request arrives at t = 0 and each later one after a random gap, so a
run of n requests spans n - 1 gaps. Gamma gaps have shape = burstiness and mean
1 / rate: burstiness 1 is a Poisson process, below 1 burstier, above 1 smoother
(vLLM's parameterisation: shape = burstiness, scale = 1 / (rate * burstiness)). A rate
of inf sends every request at t = 0, as ``vllm bench serve --request-rate inf``.
"""

from __future__ import annotations

import math

import numpy as np


def poisson_arrivals(rng: np.random.Generator, rate: float, *, duration_s: float | None = None,
                     num_requests: int | None = None) -> np.ndarray:
    return gamma_arrivals(rng, rate, 1.0, duration_s=duration_s, num_requests=num_requests)


def gamma_arrivals(rng: np.random.Generator, rate: float, burstiness: float, *,
                   duration_s: float | None = None, num_requests: int | None = None) -> np.ndarray:
    """Arrival times with Gamma(shape=burstiness, mean=1/rate) gaps.

    Exactly one of ``duration_s`` (every arrival before it) and ``num_requests`` is given.
    """
    if (duration_s is None) == (num_requests is None):
        raise ValueError("give exactly one of duration_s and num_requests")
    if rate == math.inf:
        if num_requests is None:
            raise ValueError("rate inf sends every request at t = 0: give num_requests, not a duration")
        return np.zeros(num_requests)
    if not (rate > 0 and burstiness > 0 and math.isfinite(rate) and math.isfinite(burstiness)):
        raise ValueError("rate and burstiness must be positive finite numbers")
    scale = 1.0 / (rate * burstiness)
    if num_requests is not None:
        gaps = _gaps(rng, burstiness, scale, max(num_requests - 1, 0))
        return np.concatenate(([0.0], np.cumsum(gaps)))[:num_requests]
    # Draw in chunks sized to the expected count so the stream, and thus the
    # result, depends only on the seed and the parameters.
    chunk = max(int(rate * duration_s * 1.1) + 16, 16)
    times = [np.zeros(1)]
    last = 0.0
    while last < duration_s:
        block = last + np.cumsum(_gaps(rng, burstiness, scale, chunk))
        times.append(block)
        last = float(block[-1])
    arrivals = np.concatenate(times)
    return arrivals[arrivals < duration_s]


def _gaps(rng: np.random.Generator, shape: float, scale: float, n: int) -> np.ndarray:
    if shape == 1.0:
        return rng.exponential(scale, size=n)
    return rng.gamma(shape, scale, size=n)
