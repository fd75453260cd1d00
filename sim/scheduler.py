"""Batching decisions, in plain Python: no SimPy, no torch, no clock.

Two scheduler modes (``engine.scheduler``; docs/scheduling.md):

* ``v0`` (the default; vLLM v0's behaviour): the classes below admit whole prompts
  into prefill-only steps and reserve each request's whole KV at admission;
* ``vllm-v1``: :class:`ChunkedPrefillScheduler`, paged KV in blocks allocated as
  tokens are written, each step carrying the running decodes plus prefill chunks up
  to a token budget, preemption by recompute when blocks run out. The loop
  (:mod:`sim.serving.loop`) applies its decisions; the block arithmetic lives here.

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
SCHEDULERS = ("v0", "vllm-v1")
PREEMPTION = ("recompute",)  # vLLM v1 preempts by recompute only
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


@dataclass
class ChunkedPrefillScheduler:
    """vLLM v1's scheduling (docs/scheduling.md): a token budget per step, paged KV, preemption.

    A step first schedules every running sequence's 1 + k tokens, allocating the blocks
    they write (``ceil((context + 1 + k) / block_size)`` minus what the row holds); when
    the free blocks do not cover them, the newest running requests are preempted (their
    blocks freed, recomputed later). Then prefill chunks fill what is left of the budget,
    in FCFS order: partially prefilled requests first, then the waiting queue's head
    (preempted requests first); a waiting request never preempts, it waits for blocks, and a
    step that preempted starts no waiting request.
    A running row holds ``ceil(context / block_size)`` blocks between steps: the slots of
    rejected draft tokens are freed with the step.
    """

    max_batch_size: int  # vLLM's max_num_seqs: running plus partially prefilled requests
    kv_budget_tokens: int
    max_num_batched_tokens: int
    block_size: int = 16
    chunked_prefill: bool = True
    prefill: str = "packed"  # what the v0 step backend reads; chunks are priced one by one
    name: str = "vllm-v1"

    @property
    def total_blocks(self) -> int:
        return self.kv_budget_tokens // self.block_size

    def blocks(self, tokens):
        """Blocks that hold ``tokens`` KV slots (an int or an int array)."""
        return (tokens + (self.block_size - 1)) // self.block_size

    def victims(self, need: np.ndarray, held: np.ndarray, free: int) -> int:
        """How many rows to preempt from the tail (the newest) so the others get ``need`` blocks.

        Preempting the last m rows frees what they hold and drops what they needed.
        """
        short = int(np.add.reduce(need)) - free
        if short <= 0:
            return 0
        gain = np.cumsum((need + held)[::-1])
        return int(np.searchsorted(gain, short)) + 1  # the first m whose gain covers the shortfall

    def chunk(self, left: int, budget: int) -> int:
        """Tokens of a prompt with ``left`` tokens to prefill that this step's ``budget`` takes
        (0: it must wait; without chunked prefill a prompt goes whole or not at all)."""
        if left <= budget:
            return left
        return budget if self.chunked_prefill else 0

    def charged_batch_size(self, running: int) -> int:
        return running

    def on_admit(self, admitted: int, running_after: int) -> None:
        """No state between steps beyond what the loop holds."""


def make_scheduler(batching: str, max_batch_size: int, kv_budget_tokens: int, prefill: str = "packed",
                   mode: str = "v0", *, max_num_batched_tokens: int = 8192, block_size: int = 16,
                   chunked_prefill: bool = True):
    """``prefill``: how the engine runs a block of admitted prompts, which sets its cost.

    ``mode`` vllm-v1 (continuous batching only) returns a :class:`ChunkedPrefillScheduler`.
    """
    if mode == "vllm-v1":
        if batching != "continuous":
            raise ValueError("the vllm-v1 scheduler batches continuously")
        return ChunkedPrefillScheduler(max_batch_size, kv_budget_tokens, max_num_batched_tokens, block_size,
                                       chunked_prefill, prefill)
    if mode != "v0":
        raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}")
    return _v0_scheduler(batching, max_batch_size, kv_budget_tokens, prefill)


def _v0_scheduler(batching: str, max_batch_size: int, kv_budget_tokens: int, prefill: str):
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
