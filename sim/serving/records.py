"""What a serving loop records: one named row per step, per-request arrays, compact ITLs.

Records live in typed numpy arrays, not Python objects: a million-request run takes about
four million steps. The rules (sim/serving/rules.py) write each step's record and its
inter-token gaps straight into preallocated arrays at the positions kept in the state's
counters (``C_REC_POS``, ``C_ITL_POS``); :class:`Buffers` grows them by doubling before a
step (or a compiled run) could run out of room, so memory per step is the record's width
(:data:`STEP_DTYPE`.itemsize, 62 bytes) plus its gaps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sim.scheduler.layout import C_ITL_END, C_ITL_POS, C_REC_END, C_REC_POS, DECODE, MIXED, PREFILL

__all__ = ["PREFILL", "DECODE", "MIXED", "STEP_DTYPE", "STEP_FIELDS", "V1_FIELDS", "Buffers", "ReplicaRecords",
           "StepSink", "TotalsOnly", "copied", "grown"]

# One step's record. Integer widths are what a run can reach (k <= 127; batch sizes and per-step
# token counts < 2**31); sums over these columns are taken in int64 (numpy widens int32 sums).
STEP_DTYPE = np.dtype([
    ("start_s", np.float64),             # when the step was scheduled
    ("end_s", np.float64),               # when its tokens were out
    ("phase", np.int8),                  # PREFILL, DECODE or MIXED
    ("batch_size", np.int32),            # charged: admitted prompts, or decoding rows (static: the batch's start size)
    ("running", np.int32),               # requests decoding after a prefill / in the batch (vllm-v1: rows running)
    ("k", np.int8),                      # speculation length (a ragged step: its largest k)
    ("mean_context_tokens", np.float64),  # prefill: mean prompt; decode: mean context before the step
    ("drafted_tokens", np.int32),
    ("drafts", np.int32),                # rows that proposed at least one token (vLLM's num_drafts)
    ("accepted_tokens", np.int32),
    ("emitted_tokens", np.int32),
    ("prefill_tokens", np.int32),        # vllm-v1: prompt (or recompute) tokens of the step's chunks
    ("kv_blocks", np.int32),             # vllm-v1: KV blocks in use during the step
    ("preemptions", np.int32),           # vllm-v1: requests preempted at the step's start
])
V1_FIELDS = ("prefill_tokens", "kv_blocks", "preemptions")  # steps.csv has them for vllm-v1 runs only
STEP_FIELDS = tuple(name for name in STEP_DTYPE.names if name not in V1_FIELDS)

RECORD_ROOM = 4096  # step records a compiled run may write before it returns for more room
ITL_ROOM = 8192  # ... and inter-token gaps beyond one per row


class StepSink(Protocol):
    """Where a run's finished step records go while it runs (specbatch/commands/outputs.py's steps file)."""

    every: int  # records a hand-over: a compiled run returns to hand them over
    keeps: bool  # whether the run keeps its records too (else only their totals: sim.metrics.StepTotals)
    streamed: list[str] | None  # set by the run once the sink has had every record: the steps' columns

    def start(self, columns: list[str]) -> None:
        """The records' fields to take, in order, before the first :meth:`rows`."""

    def rows(self, steps: np.ndarray, lo: int, hi: int) -> None:
        """Records ``lo`` to ``hi`` of ``steps`` are final (``every`` of them, the run's last excepted); the
        array is not written there again while the sink has it (the call's duration, where it keeps none)."""


class TotalsOnly:
    """A :class:`StepSink` for a run whose steps no one reads, only its summary (a sweep's cell,
    ``specbatch run --records none``): the records are totalled a block at a time and dropped."""

    keeps = False
    streamed = None

    @property
    def every(self) -> int:
        from sim.metrics import STEP_BLOCK

        return STEP_BLOCK

    def start(self, columns: list[str]) -> None:
        pass

    def rows(self, steps: np.ndarray, lo: int, hi: int) -> None:
        pass


class Buffers:
    """The step records and the inter-token gaps (value, count), growing by doubling; finished
    records handed to a :class:`StepSink` as the run goes, where one is attached (:meth:`stream_to`).

    A sink that does not keep the records has them handed over ``every`` at a time from the first,
    and each block is added to :attr:`totals` (what the summary needs of them, in sim.metrics'
    blocks) and its room reused: the buffer then holds at most a block and a compiled run's room.
    """

    def __init__(self, ctr: np.ndarray, capacity: int = 4096) -> None:
        self.steps = np.empty(capacity, STEP_DTYPE)
        self.itl_values = np.empty(capacity)
        self.itl_weights = np.empty(capacity, dtype=np.int32)  # rows sharing a gap: at most a batch
        self.ctr = ctr
        self.sink: StepSink | None = None
        self.sent = 0  # records handed to the sink (of those in the buffer)
        self.dropped = 0  # records handed over and dropped from the buffer (a sink that keeps none)
        self.totals = None  # sim.metrics.StepTotals of the dropped records
        ctr[C_REC_POS] = ctr[C_ITL_POS] = 0
        ctr[C_REC_END] = ctr[C_ITL_END] = capacity

    def stream_to(self, sink: StepSink) -> None:
        """Hand ``sink`` every record once it is written, ``sink.every`` at a time (and the rest at :meth:`flush`)."""
        if not sink.keeps:
            from sim.metrics import STEP_BLOCK, StepTotals

            if sink.every != STEP_BLOCK:
                raise ValueError(f"a sink that keeps no records takes them {STEP_BLOCK} at a time (sim.metrics)")
            self.totals = StepTotals()
        self.sink, self.sent = sink, 0
        self.room(0, 0)

    def room(self, records: int, gaps: int) -> None:
        """Make room for ``records`` more step records and ``gaps`` more inter-token gaps (and hand a
        sink what it is owed: the records' end is then set where the next hand-over falls due)."""
        ctr = self.ctr
        sink = self.sink
        if sink is not None:
            self._hand_over(sink)
        if ctr[C_REC_POS] + records > self.steps.shape[0]:
            self.steps = _doubled(self.steps, ctr[C_REC_POS] + records, ctr[C_REC_POS])
        if ctr[C_ITL_POS] + gaps > self.itl_values.shape[0]:
            need, used = ctr[C_ITL_POS] + gaps, ctr[C_ITL_POS]
            self.itl_values = _doubled(self.itl_values, need, used)
            self.itl_weights = _doubled(self.itl_weights, need, used)
        end = self.steps.shape[0]
        if sink is not None:
            end = min(end, max(self.sent + sink.every, int(ctr[C_REC_POS]) + records))
        ctr[C_REC_END], ctr[C_ITL_END] = end, self.itl_values.shape[0]

    def _hand_over(self, sink: StepSink) -> None:
        """Hand over every whole block written; a sink that keeps none: total them and reuse their room."""
        written = int(self.ctr[C_REC_POS])
        while written - self.sent >= sink.every:
            self._give(sink, self.sent, self.sent + sink.every)
        if not sink.keeps and self.sent:
            self._drop(written)

    def _give(self, sink: StepSink, lo: int, hi: int) -> None:
        sink.rows(self.steps, lo, hi)
        if self.totals is not None:
            block = self.steps[lo:hi]
            self.totals.add({name: block[name] for name in STEP_DTYPE.names})
        self.sent = hi

    def _drop(self, written: int) -> None:
        """Move the records not yet handed over to the front (as bytes: see :func:`_doubled`)."""
        tail = written - self.sent
        self.steps[:tail].view(np.uint8)[:] = self.steps[self.sent:written].view(np.uint8)
        self.dropped += self.sent
        self.ctr[C_REC_POS] = tail
        self.sent = 0

    def flush(self) -> None:
        """Hand the sink the records it has not had (the run's last), and detach it."""
        sink, self.sink = self.sink, None
        if sink is not None:
            self._hand_over(sink)  # whole blocks first: the last is the only short one
            written = int(self.ctr[C_REC_POS])
            if written > self.sent:
                self._give(sink, self.sent, written)
            if not sink.keeps:
                self._drop(written)
        self.sent = int(self.ctr[C_REC_POS])
        self.ctr[C_REC_END] = self.steps.shape[0]

    def __len__(self) -> int:
        return self.dropped + int(self.ctr[C_REC_POS])

    def step_columns(self, v1: bool) -> dict[str, np.ndarray]:
        """The steps so far, one view per field (a v0 run's without the vllm-v1 fields)."""
        rows = self.steps[:self.ctr[C_REC_POS]]
        return {name: rows[name] for name in STEP_DTYPE.names if v1 or name not in V1_FIELDS}

    def itl(self) -> tuple[np.ndarray, np.ndarray]:
        n = int(self.ctr[C_ITL_POS])
        return self.itl_values[:n], self.itl_weights[:n]


def copied(steps: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Records ``lo`` to ``hi`` as an array of their own (copied as bytes: see :func:`_doubled`), for a sink
    that holds them after the buffer reuses their room: a view would also keep the whole buffer alive."""
    rows = np.empty(hi - lo, steps.dtype)
    rows.view(np.uint8)[:] = steps[lo:hi].view(np.uint8)
    return rows


def _doubled(array: np.ndarray, need: int, used: int) -> np.ndarray:
    capacity = array.shape[0]
    while capacity < need:
        capacity *= 2
    out = np.empty(capacity, array.dtype)
    # as bytes: numpy copies a packed record dtype field by field (2M records: 0.13-0.37 s against 0.02 s)
    out[:used].view(np.uint8)[:] = array[:used].view(np.uint8)
    return out


def grown(array: np.ndarray, capacity: int, fill=0) -> np.ndarray:
    """``array`` with its last axis extended to ``capacity``, the new entries ``fill``: per-request
    arrays that double as a cluster replica is given requests (queues and loops alike)."""
    out = np.empty(array.shape[:-1] + (capacity,), dtype=array.dtype)  # each entry written once, not twice
    out[..., :array.shape[-1]] = array
    out[..., array.shape[-1]:] = fill
    return out


@dataclass
class ReplicaRecords:
    """What one replica measured; arrays are indexed by request (in its queue order)."""

    scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    decode_steps: np.ndarray
    drafted_tokens: np.ndarray
    accepted_tokens: np.ndarray
    steps: dict[str, np.ndarray]
    itl_values: np.ndarray
    itl_weights: np.ndarray
    preemptions: np.ndarray | None = None  # vllm-v1: times each request was preempted
    cached_tokens: np.ndarray | None = None  # vllm-v1: prompt tokens found in the prefix cache (num_cached_tokens)
    scheduler: dict | None = None  # vllm-v1: the scheduler's counters (prefix cache, peak blocks)
