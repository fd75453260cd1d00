"""What a serving loop records: one named row per step, per-request arrays, compact ITLs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PREFILL, DECODE, MIXED = 0, 1, 2  # MIXED: a vllm-v1 step of decodes and prefill chunks

# One step's record. The loop appends plain tuples in this order (a tuple is the cheapest
# thing to build per step) and :func:`step_columns` names and types them once, at the end.
STEP_DTYPE = np.dtype([
    ("start_s", np.float64),             # when the step was scheduled
    ("end_s", np.float64),               # when its tokens were out
    ("phase", np.int64),                 # PREFILL or DECODE
    ("batch_size", np.int64),            # charged: admitted prompts, or running (static: the batch's start size)
    ("running", np.int64),               # sequences decoding after a prefill / in a decode step
    ("k", np.int64),                     # speculation length (a ragged step: its largest k)
    ("mean_context_tokens", np.float64),  # prefill: mean prompt; decode: mean context before the step
    ("drafted_tokens", np.int64),
    ("accepted_tokens", np.int64),
    ("emitted_tokens", np.int64),
])
STEP_FIELDS = STEP_DTYPE.names
# A vllm-v1 step's record adds its prefill chunks' tokens, its KV blocks and its preemptions.
STEP_DTYPE_V1 = np.dtype(STEP_DTYPE.descr + [
    ("prefill_tokens", np.int64),        # prompt (or recompute) tokens of the step's chunks
    ("kv_blocks", np.int64),             # KV blocks in use during the step
    ("preemptions", np.int64),           # requests preempted at the step's start
])


def step_columns(step_rows: list[tuple], dtype: np.dtype = STEP_DTYPE) -> dict[str, np.ndarray]:
    """The per-step records (tuples in ``dtype``'s order) as typed, named columns."""
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
