"""The scheduler's decision for one step, as a backend reads it (vLLM V1's ``SchedulerOutput``).

:func:`sim.serving.step.plan` writes the plan into the scheduler's plan slots (``C_STEP_*``,
``S_ROW_K``, ``S_CHUNK_*``: sim/scheduler/layout.py), where the compiled runs read it;
:class:`Plan` is the same plan for a backend written in Python (the simulator's own prices it
with :func:`sim.serving.step.price`; the real replay runs it on a GPU; a playback checks it
against what was recorded). It only reads: nothing but the scheduler writes a plan.
"""

from __future__ import annotations

import numpy as np

from sim.scheduler.layout import (C_ADMIT, C_CHUNK_TOKENS, C_CHUNKS, C_DECODE_TOKENS, C_HEAD, C_PREEMPTED_NOW,
                                  C_RAGGED, C_STEP_BLOCKS,
                                  C_STEP_CHARGED, C_STEP_K, C_STEP_LAG, NOTHING, PREFILL,
                                  REQ_PROMPT, ROW_CONTEXT, ROW_LAG, ROW_REMAINING, ROW_SCALE, S_CHUNK_PREFIX,
                                  S_CHUNK_TOKENS, S_ROW_K, STEP_MEAN, STEP_PROMPT)


class Plan:
    """One step's plan over a replica's state (sim.serving.state.ReplicaState), valid from the
    step's planning until its update. Arrays are views: read them, do not keep them."""

    __slots__ = ("_state", "_queue", "paged", "phase", "rows", "k")

    def __init__(self, state, queue) -> None:
        self._state, self._queue = state, queue
        self.paged = state.paged  # vllm-v1 (mixed steps of decodes and chunks) or v0 (a prefill or a decode)
        self.phase = NOTHING  # PREFILL (v0's prompts), DECODE, or MIXED (vllm-v1: decodes and prefill chunks)
        self.rows = 0  # the running rows the step decodes: rows [0, rows) of the batch (0: none)
        self.k = 0  # the step's k: the largest of its rows' (a ragged step runs padded to it)

    def planned(self, phase: int, rows: int) -> None:
        """The scheduler has planned a step (sim.serving.step.plan returned its kind and decoded rows)."""
        self.phase, self.rows = int(phase), int(rows)
        self.k = int(self._state.ctr[C_STEP_K]) if rows else 0

    @property
    def state(self):
        """The step's arrays as :func:`sim.serving.step.price` reads them."""
        return self._state.arrays()

    @property
    def prefill(self) -> bool:
        """A v0 prefill of whole prompts (no decodes)."""
        return not self.paged and self.phase == PREFILL

    # ------------------------------------------------------------------ decodes
    @property
    def running(self) -> int:
        """BatchView's name for :attr:`rows`."""
        return self.rows

    @property
    def ks(self) -> np.ndarray:
        """Each decoded row's k (after a host matcher's rows cut theirs to what they proposed)."""
        return self._state.sched[S_ROW_K, :self.rows]

    @property
    def ragged_ks(self) -> np.ndarray | None:
        """Each decoded row's k when they differ (a copy), else None."""
        return self.ks.copy() if self.rows and self._state.ctr[C_RAGGED] else None

    @property
    def batch_size(self) -> int:
        """The batch size the decodes are charged at (static batching keeps its first size)."""
        return int(self._state.ctr[C_STEP_CHARGED])

    @property
    def mean_context_tokens(self) -> float:
        """The decoded rows' mean context (v0 prefill: the prompts' mean length)."""
        return float(self._state.clk[STEP_MEAN])

    @property
    def max_lag(self) -> int:
        """The decoded rows' largest draft lag: what the draft's catch-up is priced at."""
        return int(self._state.ctr[C_STEP_LAG])

    @property
    def scale(self) -> np.ndarray:
        """What the acceptance sampler reads for each decoded row (sim.speculation.acceptance)."""
        return self._state.rowf[ROW_SCALE, :self.rows]

    @property
    def lag_tokens(self) -> np.ndarray:
        return self._state.rows[ROW_LAG, :self.rows]

    @property
    def remaining_tokens(self) -> np.ndarray:
        return self._state.rows[ROW_REMAINING, :self.rows]

    @property
    def context_tokens(self) -> np.ndarray:
        return self._state.rows[ROW_CONTEXT, :self.rows]

    # ------------------------------------------------------------------ v0 prefill
    @property
    def prefill_head(self) -> int:
        """The queue position of the first prompt a v0 prefill admits."""
        return int(self._state.ctr[C_HEAD])

    @property
    def prefill_count(self) -> int:
        """How many prompts a v0 prefill admits (from the head of the queue)."""
        return int(self._state.ctr[C_ADMIT]) if self.prefill else 0

    @property
    def prompt_lengths(self) -> np.ndarray:
        head = self.prefill_head
        return self._queue.reqi[REQ_PROMPT, head:head + self.prefill_count]

    @property
    def priced_prompt_tokens(self) -> float:
        """The length a v0 prefill is priced at: the prompts' mean, or (right-padded) their longest."""
        return float(self._state.clk[STEP_PROMPT])

    @property
    def queue(self):
        """The replica's queue (its requests' arrival times and lengths)."""
        return self._queue

    # ------------------------------------------------------------------ vllm-v1 chunks
    @property
    def chunks(self) -> int:
        """Prefill chunks in the step (vllm-v1)."""
        ctr = self._state.ctr
        return int(ctr[C_CHUNKS]) if self.paged and ctr[C_CHUNK_TOKENS] else 0

    @property
    def chunk_tokens(self) -> np.ndarray:
        """Each chunk's new tokens."""
        return self._state.sched[S_CHUNK_TOKENS, :self.chunks]

    @property
    def chunk_prefixes(self) -> np.ndarray:
        """The tokens each chunk's request already holds in the KV cache (what it attends to beyond itself)."""
        return self._state.sched[S_CHUNK_PREFIX, :self.chunks]

    @property
    def preempted(self) -> int:
        """Requests the scheduler preempted to make room for this step (vllm-v1)."""
        return int(self._state.ctr[C_PREEMPTED_NOW]) if self.paged else 0

    @property
    def kv_blocks(self) -> int:
        """KV blocks in use during the step, this step's new ones included (vllm-v1 allocates them as it
        schedules, as vLLM's ``allocate_slots``)."""
        return int(self._state.ctr[C_STEP_BLOCKS]) if self.paged else 0

    @property
    def decode_tokens(self) -> int:
        """The step's decode tokens beside its chunks (each row's 1 + k, as scheduled)."""
        return int(self._state.ctr[C_DECODE_TOKENS]) if self.rows else 0
