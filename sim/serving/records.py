"""What a serving loop records: one named row per step, per-request arrays, compact ITLs.

Records live in typed numpy arrays, not in Python objects: a million-request run takes
about four million steps, and a tuple per step (about 150 bytes, plus a boxed float per
field) would cost more memory than the whole run is allowed. The loop still appends one
plain tuple per step (the cheapest thing to build in the hot loop); :class:`RowBuffer`
stages at most :data:`CHUNK` of them and moves each full chunk into a preallocated packed
structured array that grows by doubling (compiled decode runs write their rows into it
directly), so memory per step is the row's width in bytes (:data:`STEP_DTYPE`.itemsize,
46 bytes) and no per-step Python object outlives its chunk. The inter-token gaps use the
same buffer with a one-field dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PREFILL, DECODE, MIXED = 0, 1, 2  # MIXED: a vllm-v1 step of decodes and prefill chunks
CHUNK = 4096  # rows staged as tuples before they move into the columns

# One step's record, in the order the loop appends its fields. Integer widths are what a
# run can reach (k <= 127; batch sizes and per-step token counts < 2**31), so a step costs
# 46 bytes; sums over these columns are taken in int64 (numpy widens int32 sums).
STEP_DTYPE = np.dtype([
    ("start_s", np.float64),             # when the step was scheduled
    ("end_s", np.float64),               # when its tokens were out
    ("phase", np.int8),                  # PREFILL or DECODE
    ("batch_size", np.int32),            # charged: admitted prompts, or running (static: the batch's start size)
    ("running", np.int32),               # sequences decoding after a prefill / in a decode step
    ("k", np.int8),                      # speculation length (a ragged step: its largest k)
    ("mean_context_tokens", np.float64),  # prefill: mean prompt; decode: mean context before the step
    ("drafted_tokens", np.int32),
    ("accepted_tokens", np.int32),
    ("emitted_tokens", np.int32),
])
STEP_FIELDS = STEP_DTYPE.names
# A vllm-v1 step's record adds its prefill chunks' tokens, its KV blocks and its preemptions
# (each < 2**31 per step, so 12 more bytes: 58 a step).
STEP_DTYPE_V1 = np.dtype(STEP_DTYPE.descr + [
    ("prefill_tokens", np.int32),        # prompt (or recompute) tokens of the step's chunks
    ("kv_blocks", np.int32),             # KV blocks in use during the step
    ("preemptions", np.int32),           # requests preempted at the step's start
])


class RowBuffer:
    """Rows as one packed structured array (a row is the dtype's width) growing by doubling.

    Python code ``append``s a row (a tuple in the dtype's field order; for a one-field
    dtype, the bare value) or ``extend``s many; they are staged and moved in by one slice
    assignment per :data:`CHUNK`. Compiled decode runs (:mod:`sim.serving.compiled`) write
    rows in place after :meth:`open_rows`. :meth:`columns` returns each field as a view.
    """

    def __init__(self, dtype: np.dtype, capacity: int = CHUNK) -> None:
        self.dtype = np.dtype(dtype)
        self.rows = np.empty(capacity, self.dtype)
        # one field: bare values go in through the field's view (twice as fast as into the records)
        self._field = self.dtype.names[0] if len(self.dtype.names) == 1 else None
        self._filled = 0
        self._staged: list = []

    def append(self, row) -> None:
        staged = self._staged
        staged.append(row)
        if len(staged) >= CHUNK:
            self._flush()

    def extend(self, rows) -> None:
        staged = self._staged
        staged.extend(rows)
        if len(staged) >= CHUNK:
            self._flush()

    def __len__(self) -> int:
        return self._filled + len(self._staged)

    def open_rows(self, n: int) -> tuple[int, np.ndarray]:
        """Room for ``n`` rows written in place: the first free row and the whole array;
        :meth:`close_rows` then keeps the rows written."""
        self._flush()
        self._grow(self._filled + n)
        return self._filled, self.rows

    def close_rows(self, written: int) -> None:
        self._filled += written

    def columns(self) -> dict[str, np.ndarray]:
        """The rows so far, one view per field (valid until the next append)."""
        self._flush()
        rows = self.rows[:self._filled]
        return {name: rows[name] for name in self.dtype.names}

    def _grow(self, end: int) -> None:
        capacity = self.rows.shape[0]
        if end > capacity:
            while capacity < end:
                capacity *= 2
            grown = np.empty(capacity, self.dtype)
            grown[:self._filled] = self.rows[:self._filled]
            self.rows = grown

    def _flush(self) -> None:
        staged = self._staged
        if staged:
            start, end = self._filled, self._filled + len(staged)
            self._grow(end)
            target = self.rows if self._field is None else self.rows[self._field]
            target[start:end] = staged
            self._filled = end
            staged.clear()


def grown(array: np.ndarray, capacity: int, fill=0) -> np.ndarray:
    """``array`` with its last axis extended to ``capacity``, the new entries ``fill``: per-request
    arrays that double as a cluster replica is given requests (queues and loops alike)."""
    out = np.full(array.shape[:-1] + (capacity,), fill, dtype=array.dtype)
    out[..., :array.shape[-1]] = array
    return out


def step_buffer(dtype: np.dtype = STEP_DTYPE) -> RowBuffer:
    """The step records of one loop: ``append((start_s, end_s, phase, ...))`` in ``dtype``'s
    order (STEP_DTYPE, or STEP_DTYPE_V1 for a vllm-v1 loop)."""
    return RowBuffer(dtype)


def value_buffer(dtype) -> RowBuffer:
    """One growing column of plain values (``append(x)``, ``extend(xs)``); ``.array()`` reads it."""
    return RowBuffer(np.dtype([("value", dtype)]))


def buffer_array(buffer: RowBuffer) -> np.ndarray:
    """The only column of a :func:`value_buffer` (a view)."""
    return buffer.columns()["value"]


def step_columns(step_rows, dtype: np.dtype = STEP_DTYPE) -> dict[str, np.ndarray]:
    """The per-step records as typed, named columns: from a :class:`RowBuffer` (no copy;
    its own dtype) or a list of tuples in ``dtype``'s order."""
    if isinstance(step_rows, RowBuffer):
        return step_rows.columns()
    table = np.array(step_rows, dtype=dtype) if step_rows else np.zeros(0, dtype)
    return {name: np.ascontiguousarray(table[name]) for name in dtype.names}


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
