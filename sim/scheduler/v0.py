"""The v0 schedulers (vLLM v0's behaviour; docs/batching.md): prefill-first, whole-request KV reservations.

A step is either a prefill of whole prompts admitted from the head of the FCFS waiting queue,
or a decode step of every running request. An admitted request reserves its prompt, its
whole output and the policy's largest speculation up front (``REQ_RESERVE``), so it is never
preempted: more conservative than vLLM's paged allocation, and docs/scheduling.md says so.

* continuous batching (vLLM): admit whenever a slot and the KV budget allow;
* static batching (arXiv 2310.18813): admit only into an empty batch, and charge every step of
  the batch at the size it started with (finished sequences stay in a padded batch).

Admitted prompts cost as one variable-length batch at their mean length (``packed``, vLLM) or
right-padded to the longest (``padded``: ``generate``, and the real replay).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scheduler.layout import (C_ADMIT, C_ARRIVED, C_HEAD, C_KV_USED, C_PHASE, C_RUNNING, C_STATIC_BATCH,
                                  C_STEP_ROWS, DECODE, N_PARAMS, NOTHING, P_KV_BUDGET, P_MAX_SEQS, P_PADDED, P_STATIC,
                                  PREFILL, REQ_PROMPT, REQ_RESERVE)

STUCK = -2  # plan_v0: a waiting request can never be admitted (prepare checks this before a run)


def admit_count(reqi, ctr, par):
    """How many requests at the head of the waiting queue to admit and prefill now (0: none)."""
    running, head = ctr[C_RUNNING], ctr[C_HEAD]
    waiting = ctr[C_ARRIVED] - head
    if waiting <= 0 or running >= par[P_MAX_SEQS] or (par[P_STATIC] and running):
        return 0
    room = min(par[P_MAX_SEQS] - running, waiting)
    free = par[P_KV_BUDGET] - ctr[C_KV_USED]
    n = 0
    used = 0
    while n < room:
        used += reqi[REQ_RESERVE, head + n]
        if used > free:
            break
        n += 1
    return n


def plan_v0(reqi, ctr, par):
    """The next step: PREFILL (``C_ADMIT`` requests, their KV reserved), DECODE (every running row),
    NOTHING (wait for arrivals), or STUCK."""
    n = admit_count(reqi, ctr, par)
    if n:
        head = ctr[C_HEAD]
        for r in range(head, head + n):
            ctr[C_KV_USED] += reqi[REQ_RESERVE, r]
        ctr[C_ADMIT] = n
        ctr[C_PHASE] = PREFILL
    elif ctr[C_RUNNING]:
        ctr[C_STEP_ROWS] = ctr[C_RUNNING]
        ctr[C_PHASE] = DECODE
    elif ctr[C_ARRIVED] > ctr[C_HEAD]:
        ctr[C_PHASE] = STUCK
    else:
        ctr[C_PHASE] = NOTHING
    return ctr[C_PHASE]


def prefill_prompt(reqi, ctr, par):
    """The prompt length the admitted block is priced at: its mean (packed) or longest (padded),
    and its mean for the record."""
    head, n = ctr[C_HEAD], ctr[C_ADMIT]
    total = 0
    longest = 0
    for r in range(head, head + n):
        p = reqi[REQ_PROMPT, r]
        total += p
        if p > longest:
            longest = p
    mean = total / n
    return (longest if par[P_PADDED] and n > 1 else mean), mean


def charged_batch(ctr, m):
    """The batch size a decode step of m rows is charged at (static batching: the batch's first size)."""
    return ctr[C_STATIC_BATCH] if ctr[C_STATIC_BATCH] >= 0 else m


RULES = (admit_count, plan_v0, prefill_prompt, charged_batch)


@dataclass
class V0Scheduler:
    """Continuous or static batching with whole-request KV reservations (the module docstring)."""

    max_batch_size: int
    kv_budget_tokens: int
    prefill: str = "packed"
    static: bool = False

    paged = False  # KV reserved per request, not in blocks
    lookahead = 0

    @property
    def name(self) -> str:
        return "static" if self.static else "continuous"

    def params(self) -> np.ndarray:
        par = np.zeros(N_PARAMS, dtype=np.int64)
        par[P_MAX_SEQS], par[P_KV_BUDGET] = self.max_batch_size, self.kv_budget_tokens
        par[P_STATIC], par[P_PADDED] = self.static, self.prefill == "padded"
        return par

    def initial_static_batch(self) -> int:
        """``C_STATIC_BATCH``'s start: a static batch's size (0 before the first), -1 when not static."""
        return 0 if self.static else -1
