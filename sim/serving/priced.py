"""The simulator's step backend: a step costs what the step table says; acceptance is drawn.

Nothing runs: a step's duration is looked up (pre-tabulated curves, O(1) per step;
:mod:`sim.costmodel.rules`) and the accepted draft tokens are drawn from the acceptance
model, so the clock simply waits the duration out. A decode step is priced at the largest
draft lag of its rows (the draft's catch-up), a ragged one at its largest k: exactly the
price of a uniform step at that k (batched drafting keeps the batch's shape, and padding
keeps a ragged step priced by the same table a policy predicts with). A host matcher's
ragged step (n-gram, suffix: rows without a match propose nothing) has no drafting to keep
in shape and is priced by its tokens instead (sim.costmodel.rules.tokens_price):
:func:`ragged_by_tokens` decides it for this backend and for the compiled runs.
"""

from __future__ import annotations

import numpy as np

from sim.speculation.acceptance import AcceptanceSampler
from sim.costmodel.model import DrafterKind, StepTable
from sim.jit import direct
from sim.serving import step


def ragged_by_tokens(table: StepTable) -> bool:
    """Whether a ragged step is priced by its tokens (a host matcher's drafting: no passes to keep in
    shape) rather than padded to its largest k."""
    return table.drafter_kind is DrafterKind.HOST


def prices_of(table: StepTable) -> step.Prices:
    """The step table as :func:`sim.serving.step.price` reads it."""
    return step.Prices(table.decode.array, table.decode_lag2.array, table.catch_up.array, table.prefill.array,
                       np.asarray(table.chunk if table.chunk is not None else [0.0, 0.0], dtype=np.float64),
                       float(table.context_step), float(table.prompt_step), float(table.chunk_step),
                       float(table.prefill_overhead), float(table.exposed_overhead), bool(table.overlapped),
                       float(table.kv_read_cost), float(table.attention_coefficient),
                       np.asarray(table.graph_pad if table.graph_pad is not None else [], dtype=np.int64),
                       ragged_by_tokens(table))


class PricedBackend:
    """Prices steps with ``table`` and draws acceptance with ``sampler`` (one per replica).

    The compiled runs price with the same table and the same rule (:func:`sim.serving.step.price`),
    so ``steps_compiled``; a subclass that changes how a step is executed runs step by step unless
    it says otherwise. ``compiled``: price with the rule's compiled twin (the same numbers, faster).
    """

    follows_rows = False
    steps_compiled = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        executes = {"run", "watch", "commit", "retire"}
        if executes & set(cls.__dict__) and "steps_compiled" not in cls.__dict__:
            cls.steps_compiled = False

    def __init__(self, table: StepTable, sampler: AcceptanceSampler, compiled: bool = False) -> None:
        self.table = table
        self.sampler = sampler
        self.prices = prices_of(table)
        self._price = direct(step.price) if compiled else step.price

    def run(self, plan) -> tuple[float, np.ndarray | None]:
        """The plan's price by the step table, and each decoded row's accepted drafts (drawn)."""
        dt = self._price(plan.state, self.prices)
        k = plan.k
        if not k:
            return dt, None
        ragged = plan.ragged_ks
        return dt, self.sampler.accepted(plan.scale, k if ragged is None else ragged)

    def watch(self, queue) -> None:
        """The queue is released as the clock moves (a playback releases it its own way)."""

    def commit(self) -> None:
        """Nothing to write: the step was only priced."""

    def retire(self, done: np.ndarray) -> None:
        """No per-row state of its own."""
