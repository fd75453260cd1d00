"""The simulator's step backend: a step costs what the step table says; acceptance is drawn.

Nothing runs: a step's duration is looked up (pre-tabulated curves, O(1) per step;
:mod:`sim.costmodel_rules`) and the accepted draft tokens are drawn from the acceptance
model, so the clock simply waits the duration out. A decode step is priced at the largest
draft lag of its rows (the draft's catch-up), a ragged one at its largest k: exactly the
price of a uniform step at that k (batched drafting keeps the batch's shape, and padding
keeps a ragged step priced by the same table a policy predicts with). A host matcher's
ragged step (n-gram, suffix: rows without a match propose nothing) has no drafting to keep
in shape and is priced by its tokens instead (sim.costmodel_rules.tokens_price):
:func:`ragged_by_tokens` decides it for this backend and for the compiled runs.
"""

from __future__ import annotations

import numpy as np

from policies.base import BatchView
from sim.acceptance import AcceptanceSampler
from sim.costmodel import DrafterKind, StepTable


def ragged_by_tokens(table: StepTable) -> bool:
    """Whether a ragged step is priced by its tokens (a host matcher's drafting: no passes to keep in
    shape) rather than padded to its largest k."""
    return table.drafter_kind is DrafterKind.HOST


class PricedBackend:
    """Prices steps with ``table`` and draws acceptance with ``sampler`` (one per replica).

    The compiled runs price with the same table and the same rules, so ``steps_compiled``; a
    subclass that changes how a step is executed runs step by step unless it says otherwise."""

    follows_rows = False
    steps_compiled = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        executes = {"prefill", "decode", "chunks", "watch", "commit", "retire"}
        if executes & set(cls.__dict__) and "steps_compiled" not in cls.__dict__:
            cls.steps_compiled = False

    def __init__(self, table: StepTable, sampler: AcceptanceSampler) -> None:
        self.table = table
        self.sampler = sampler
        self._by_tokens = ragged_by_tokens(table)

    def prefill(self, queue, head: int, n: int, prompt_tokens: float) -> float:
        """``prompt_tokens``: the length the scheduler prices the block at (sim.scheduler.v0.prefill_prompt)."""
        return self.table.prefill_time(n, prompt_tokens)

    def decode(self, view: BatchView, k: int, ragged: np.ndarray | None, scale: np.ndarray,
               max_lag: int) -> tuple[float, np.ndarray | None]:
        charged, context = view.batch_size, view.mean_context_tokens
        if not k:
            return self.table.decode_time(charged, 0, context), None
        if ragged is not None and self._by_tokens:  # priced by its tokens, not padded
            dt = self.table.decode_time_by_tokens(charged, ragged.tolist(), context)
        else:
            dt = self.table.decode_time_at_lag(charged, k, context, max_lag)
        return dt, self.sampler.accepted(scale, k if ragged is None else ragged)

    def chunks(self, decode_tokens: int, tokens: np.ndarray, prefixes: np.ndarray) -> float:
        """What a vllm-v1 step's prefill chunks add to it (sim.costmodel's mixed-step formula):
        ``decode_tokens`` = the step's decode tokens (0: a step of chunks alone); chunk i has
        ``tokens[i]`` new tokens after ``prefixes[i]`` its request already holds in the KV cache."""
        return self.table.chunks_time(decode_tokens, tokens.tolist(), prefixes.tolist())

    def watch(self, queue) -> None:
        """The queue is released as the clock moves (a playback releases it its own way)."""

    def commit(self) -> None:
        """Nothing to write: the step was only priced."""

    def retire(self, done: np.ndarray) -> None:
        """No per-row state of its own."""
