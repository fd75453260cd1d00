"""``trtllm-schedule``: TensorRT-LLM's ``draft_len_schedule``, batch size -> draft length.

TensorRT-LLM (PR #10860, ``tensorrt_llm/_torch/speculative/utils.py``) keys the schedule by
batch-size *upper bounds*: a batch of b sequences drafts the length of the smallest key
>= b, and a batch larger than every key drafts nothing (speculation off: the implicit
``max_concurrency``). ``{4: 4, 8: 2, 32: 1}``: batches 1-4 draft 4, 5-8 draft 2, 9-32
draft 1, 33 and more draft 0. Keys are whole numbers >= 1, lengths whole numbers >= 0;
``max_draft_len`` (optional, TensorRT-LLM's speculative_config field) caps them: a
longer length is an error, as TensorRT-LLM's validator makes it. TOML and JSON keys are
text, so ``{"4" = 4}`` and ``{"4": 4}`` both mean batch size 4.

Per step: one bisection over the keys. See docs/policy-engines.md.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from policies.base import BatchView, Policy, PolicyError
from policies.knobs import named, batch_key, load_knob, whole

PARAM = "draft_len_schedule"


def check_schedule(schedule: Any, max_draft_len: int | None) -> dict[int, int]:
    """The schedule as {batch size: draft length}, sorted by key."""
    given = load_knob(schedule, PARAM)
    if not given:
        raise PolicyError(f"{PARAM} must map at least one batch size to a draft length, e.g. {{4: 4, 8: 2, 32: 1}}",
                          field=PARAM)
    out: dict[int, int] = {}
    for key, value in given.items():
        bs = batch_key(key, PARAM)
        if bs in out:
            raise PolicyError(f"{PARAM}: batch size {bs} is given twice", field=PARAM)
        out[bs] = whole(value, f"the draft length of batch size {bs}", PARAM)
        if max_draft_len is not None and out[bs] > max_draft_len:
            raise PolicyError(f"{PARAM}: the draft length {out[bs]} of batch size {bs} is above max_draft_len = "
                              f"{max_draft_len}", field=PARAM)
    return dict(sorted(out.items()))


def engine_config(table: list[list[int]]) -> dict[int, int]:
    """A ``lut`` table [[start, end, k], ...] as draft_len_schedule: each range's end -> its k (a
    batch takes the smallest key >= it; above the last end, which is the table's max batch, none)."""
    return {end: k for _, end, k in table}


def format_schedule(schedule: dict[int, int]) -> str:
    """As TensorRT-LLM's Python API and its YAML options both read it: {4: 4, 8: 2, 32: 1}."""
    return "{" + ", ".join(f"{bs}: {k}" for bs, k in schedule.items()) + "}"


class TrtllmSchedule(Policy):
    name = "trtllm-schedule"
    max_k_param = PARAM

    def __init__(self, draft_len_schedule: Any = None, max_draft_len: int | None = None) -> None:
        with named(self.name):
            self._setup(draft_len_schedule, max_draft_len)

    def _setup(self, draft_len_schedule: Any = None, max_draft_len: int | None = None) -> None:
        if draft_len_schedule is None:
            raise PolicyError(f"give {PARAM}, TensorRT-LLM's dict batch size -> draft length, e.g. "
                              "{4: 4, 8: 2, 32: 1}", field=PARAM)
        self.max_draft_len = None if max_draft_len is None else whole(max_draft_len, "max_draft_len",
                                                                      "max_draft_len", lo=1)
        self.schedule = check_schedule(draft_len_schedule, self.max_draft_len)
        self._keys = list(self.schedule)
        self._lengths = [*self.schedule.values(), 0]  # past the largest key: no speculation

    @property
    def max_k(self) -> int:
        return max(self._lengths)

    def k_for(self, batch_size: int) -> int:
        return self._lengths[bisect_left(self._keys, batch_size)]

    def choose_k(self, view: BatchView) -> int:
        i = bisect_left(self._keys, view.batch_size)
        if view.explain is not None:
            view.explain.update(rule=f"{{{self._keys[i]}: {self._lengths[i]}}}" if i < len(self._keys) else
                                f"batch {view.batch_size} > largest key {self._keys[-1]}: no speculation")
        return self._lengths[i]

    def k_by_batch_size(self, max_batch: int) -> list[int]:
        """The schedule depends on the batch size alone: a compiled run reads it as a table."""
        return [self.k_for(b) for b in range(max_batch + 1)]

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {PARAM: {str(k): v for k, v in self.schedule.items()}}
        if self.max_draft_len is not None:
            params["max_draft_len"] = self.max_draft_len
        return params
