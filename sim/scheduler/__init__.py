"""Schedulers: each decides what a replica's next step runs and owns what it decides with (docs/scheduling.md).

* ``vllm-v1`` (the default; :mod:`sim.scheduler.v1`): vLLM V1's scheduler. Each step carries the
  running requests' decodes (with their speculative tokens) and prefill chunks under one token
  budget; KV lives in blocks behind a KV-cache manager with prefix caching
  (:mod:`sim.scheduler.kvcache`); preemption by recompute.
* ``v0`` (:mod:`sim.scheduler.v0`): vLLM v0's prefill-first steps with whole-request KV
  reservations, continuous or static batching (arXiv 2310.18813's setting).

A scheduler is plain Python and numpy (its decisions are rules the compiled runs call too):
no SimPy, no torch, no clock. The simulator and the real replay drive the same schedulers.
"""

from __future__ import annotations

import numpy as np

from sim.scheduler.v0 import V0Scheduler
from sim.scheduler.v1 import PREEMPTION, V1Scheduler

BATCHING = ("continuous", "static")
SCHEDULERS = ("vllm-v1", "v0")
PREFILL = ("packed", "padded")  # v0: admitted prompts cost as their mean length (varlen) or their longest

__all__ = ["BATCHING", "SCHEDULERS", "PREFILL", "PREEMPTION", "V0Scheduler", "V1Scheduler", "kv_reserve",
           "make_scheduler"]


def kv_reserve(prompt_tokens: np.ndarray, output_tokens: np.ndarray, max_k: int) -> np.ndarray:
    """KV-cache tokens each request reserves on admission under v0: its prompt, its whole output and
    the speculative slots of the largest step its policy can take."""
    return prompt_tokens + output_tokens + max_k


def make_scheduler(batching: str, max_batch_size: int, kv_budget_tokens: int, prefill: str = "packed",
                   mode: str = "vllm-v1", *, max_num_batched_tokens: int = 8192, block_size: int = 16,
                   chunked_prefill: bool = True, prefix_caching: bool = True, async_scheduling: bool = False,
                   lookahead: int = 0):
    """A replica's scheduler. ``prefill`` (v0): how the engine runs a block of admitted prompts:
    ``packed`` as one variable-length batch (vLLM), priced at the prompts' mean length; ``padded``
    right-padded to the longest (``generate`` on a padded batch, and the real replay).
    ``lookahead`` (vllm-v1): the KV slots a step keeps ahead for the speculation's draft tokens."""
    if mode == "vllm-v1":
        if batching != "continuous":
            raise ValueError("the vllm-v1 scheduler batches continuously")
        return V1Scheduler(max_batch_size, kv_budget_tokens, max_num_batched_tokens, block_size, chunked_prefill,
                           prefix_caching, lookahead, async_scheduling)
    if mode != "v0":
        raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}")
    if prefill not in PREFILL:
        raise ValueError(f"prefill must be one of {', '.join(PREFILL)}")
    if batching not in BATCHING:
        raise ValueError(f"batching must be one of {', '.join(BATCHING)}")
    return V0Scheduler(max_batch_size, kv_budget_tokens, prefill, static=batching == "static")
