"""Batching decisions, in plain Python: no SimPy, no torch, no clock.

The simulator and the real replay drive the *same* scheduler objects; only time
differs. A scheduler answers one question before each step: how many requests at
the head of the FCFS waiting queue to admit (and prefill) now. Zero means "run a
decode step" if anything is running, or "wait for arrivals" if not.

KV-cache budget: an admitted request reserves its prompt, its whole output and
k_max speculative slots up front, so a running request never has to be preempted.
This is more conservative than vLLM's paged allocation with preemption, and says
so in the docs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BATCHING = ("continuous", "static")
PREFILL = ("packed", "padded")  # admitted prompts cost as their mean length (varlen) or their longest


def kv_reserve(prompt_tokens: np.ndarray, output_tokens: np.ndarray, max_k: int) -> np.ndarray:
    """KV-cache tokens each request reserves on admission: its prompt, its whole output and
    the speculative slots of the largest step its policy can take."""
    return prompt_tokens + output_tokens + max_k


@dataclass
class ContinuousBatching:
    """vLLM-style: admit waiting requests FCFS whenever a slot and KV budget allow."""

    max_batch_size: int
    kv_budget_tokens: int
    prefill: str = "packed"
    name: str = "continuous"

    def admit(self, running: int, kv_used: int, waiting_reserve: np.ndarray) -> int:
        """``waiting_reserve``: KV tokens each waiting request would reserve, queue order."""
        room = min(self.max_batch_size - running, waiting_reserve.shape[0])
        if room <= 0:
            return 0
        if room == 1:  # the common case under light load: skip the cumulative sum
            return int(kv_used + int(waiting_reserve[0]) <= self.kv_budget_tokens)
        fits = np.cumsum(waiting_reserve[:room]) <= self.kv_budget_tokens - kv_used
        return int(np.count_nonzero(fits))  # cumsum is increasing, so the fitting ones are a prefix

    def charged_batch_size(self, running: int) -> int:
        return running

    def on_admit(self, admitted: int, running_after: int) -> None:
        """Continuous batching keeps no state between steps."""


@dataclass
class StaticBatching:
    """As in arXiv 2310.18813: take up to B waiting requests and run them until all finish.

    Finished sequences stay in the batch as padding until the whole batch ends (as
    ``generate`` on a padded batch does), so every step is charged at the size the
    batch started with.
    """

    max_batch_size: int
    kv_budget_tokens: int
    prefill: str = "packed"
    name: str = "static"
    _batch_size: int = 0

    def admit(self, running: int, kv_used: int, waiting_reserve: np.ndarray) -> int:
        if running:
            return 0
        room = min(self.max_batch_size, waiting_reserve.shape[0])
        fits = np.cumsum(waiting_reserve[:room]) <= self.kv_budget_tokens - kv_used
        return int(np.count_nonzero(fits))

    def charged_batch_size(self, running: int) -> int:
        return self._batch_size if running else 0

    def on_admit(self, admitted: int, running_after: int) -> None:
        self._batch_size = running_after


def make_scheduler(batching: str, max_batch_size: int, kv_budget_tokens: int, prefill: str = "packed"):
    """``prefill``: how the engine runs a block of admitted prompts, which sets its cost.

    packed: as one variable-length batch (vLLM), priced at the prompts' mean length;
    padded: right-padded to the longest (``generate`` on a padded batch, and the real replay).
    """
    if prefill not in PREFILL:
        raise ValueError(f"prefill must be one of {', '.join(PREFILL)}")
    if batching == "continuous":
        return ContinuousBatching(max_batch_size, kv_budget_tokens, prefill)
    if batching == "static":
        return StaticBatching(max_batch_size, kv_budget_tokens, prefill)
    raise ValueError(f"batching must be one of {', '.join(BATCHING)}")
