"""From a replica's sustainable rate to replicas and price.

Replicas = ceil(target / max rate per replica): it assumes the router splits the
traffic evenly. For Poisson traffic routed at random this is exact: a random split
of a Poisson stream is a Poisson stream at target / replicas, which is at most the
rate the search verified. (A cluster model that simulates routing would refine it;
this does not depend on one.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Costing:
    replicas: int | None                      # None without a target rate, or when no rate met the SLOs
    cost_per_m_at_target: float | None        # $ per 1M output tokens serving the target with `replicas`
    cost_per_m_at_max_rate: float | None      # $ per 1M output tokens of one replica run at its max rate
    fleet_cost_per_hour: float | None = None  # $ per hour for `replicas` replicas


def replicas_needed(target_rate: float, max_rate: float) -> int | None:
    if max_rate <= 0:
        return None
    ratio = target_rate / max_rate
    return max(1, math.ceil(ratio - 1e-12 * ratio))  # 2.0000000001 from rounding is still 2


def cost_per_million(rate: float, mean_output_tokens: float, gpus: float, price_per_gpu_hour: float) -> float:
    """Dollars per 1M output tokens when `gpus` GPUs serve `rate` req/s of `mean_output_tokens` each."""
    tokens_per_hour = rate * mean_output_tokens * 3600.0
    return gpus * price_per_gpu_hour / tokens_per_hour * 1e6


def costing(max_rate: float, mean_output_tokens: float, target_rate: float | None, price: float | None,
            gpus_per_replica: int) -> Costing:
    replicas = replicas_needed(target_rate, max_rate) if target_rate is not None else None
    at_target = at_max = fleet = None
    if price is not None and max_rate > 0:
        at_max = cost_per_million(max_rate, mean_output_tokens, gpus_per_replica, price)
        if replicas is not None:
            at_target = cost_per_million(target_rate, mean_output_tokens, replicas * gpus_per_replica, price)
            fleet = replicas * gpus_per_replica * price
    return Costing(replicas, at_target, at_max, fleet)
