"""``vllm-dynamic``: vLLM v1's dynamic speculative decoding, from a pasted ``speculative_config``.

vLLM (PR #32374, ``vllm/v1/spec_decode/dynamic/utils.py``) schedules K per step by the
number of scheduled requests, from ``num_speculative_tokens_per_batch_size``, a list of
inclusive ranges ``[[start_bs, end_bs, K], ...]``. As vLLM builds its lookup:

* the list must not be empty, every entry is three whole numbers, K >= 0, the ranges are
  sorted and do not overlap, and the first starts at batch size 1;
* a batch size in a gap between ranges, or beyond the last, takes the K of the range
  before it;
* every K is clamped to ``num_speculative_tokens`` (the startup maximum vLLM sizes its
  buffers by): K = min(num_speculative_tokens, K);
* without ``num_speculative_tokens_per_batch_size`` vLLM runs the static
  ``num_speculative_tokens`` at every step, and so does this policy.

The other keys of the config (``method``, ``model``, ...) say which draft runs, which the
profile already fixes; they are accepted and ignored. Per step: one list look-up.
See docs/policy-engines.md.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from policies.base import BatchView, Policy, PolicyError
from policies.knobs import named, load_knob, whole

PARAM = "speculative_config"
SCHEDULE = "num_speculative_tokens_per_batch_size"
MAX_K = "num_speculative_tokens"


def check_schedule(schedule: Any) -> list[list[int]]:
    """vLLM's validation of ``num_speculative_tokens_per_batch_size``; errors name the policy parameter."""
    where = f"{PARAM}.{SCHEDULE}"
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise PolicyError(f"{where} must not be empty: a list of [start_bs, end_bs, K], got {schedule!r}",
                          field=PARAM)
    rows: list[list[int]] = []
    for i, entry in enumerate(schedule, start=1):
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise PolicyError(f"{where}: entry {i} must be a 3-item sequence [start_bs, end_bs, K], got {entry!r}",
                              field=PARAM)
        start, end, k = (whole(v, f"entry {i}'s {name}", PARAM, lo)
                         for v, name, lo in zip(entry, ("start_bs", "end_bs", "K"), (1, 1, 0)))
        if end < start:
            raise PolicyError(f"{where}: entry {i} ends before it starts, {list(entry)!r}", field=PARAM)
        if rows and start <= rows[-1][1]:
            raise PolicyError(f"{where}: ranges must be non-overlapping and sorted, but entry {i} {list(entry)!r} "
                              f"starts at or before the end of {rows[-1]!r}", field=PARAM)
        rows.append([start, end, k])
    if rows[0][0] != 1:
        raise PolicyError(f"{where} must start at 1 (its first range starts at {rows[0][0]})", field=PARAM)
    return rows


class VllmDynamic(Policy):
    name = "vllm-dynamic"
    max_k_param = PARAM

    def __init__(self, speculative_config: Any = None) -> None:
        with named(self.name):
            self._setup(speculative_config)

    def _setup(self, speculative_config: Any = None) -> None:
        if speculative_config is None:
            raise PolicyError(f"give {PARAM}: vLLM's JSON, e.g. {{\"{MAX_K}\": 4, \"{SCHEDULE}\": "
                              "[[1, 8, 4], [9, 32, 2], [33, 256, 0]]}", field=PARAM)
        config = load_knob(speculative_config, PARAM)
        if MAX_K not in config:
            raise PolicyError(f"{PARAM} needs {MAX_K} (vLLM's largest K), got keys {sorted(config)}", field=PARAM)
        self.num_speculative_tokens = whole(config[MAX_K], MAX_K, PARAM, lo=1)
        given = config.get(SCHEDULE)
        self.schedule = None if given is None else check_schedule(given)
        rows = self.schedule or [[1, 1, self.num_speculative_tokens]]
        self._starts = [row[0] for row in rows]
        cap = self.num_speculative_tokens
        self._rows = rows
        self._ks = [min(cap, row[2]) for row in rows]
        self._max_k = max(self._ks)

    @property
    def max_k(self) -> int:
        return self._max_k

    def row_for(self, batch_size: int) -> int:
        """Index of the range whose K applies: the last one starting at or below the batch size."""
        return max(bisect_right(self._starts, batch_size) - 1, 0)

    def k_for(self, batch_size: int) -> int:
        """vLLM's K at this batch size (0 for an empty batch, as vLLM's lookup[0])."""
        return self._ks[self.row_for(batch_size)] if batch_size >= 1 else 0

    def k_by_batch_size(self, max_batch: int) -> list[int]:
        """K depends on the batch size alone: a compiled run reads it as a table (what :meth:`choose_k`
        returns; a step is never chosen for at batch size 0)."""
        return [self._ks[self.row_for(b)] for b in range(max_batch + 1)]

    def choose_k(self, view: BatchView) -> int:
        i = self.row_for(view.batch_size)
        if view.explain is not None:
            view.explain["rule"] = (f"static {MAX_K} = {self.num_speculative_tokens}" if self.schedule is None else
                                    _rule(self._rows[i], view.batch_size, self._ks[i], self.num_speculative_tokens))
        return self._ks[i]

    def params(self) -> dict[str, Any]:
        config: dict[str, Any] = {MAX_K: self.num_speculative_tokens}
        if self.schedule is not None:
            config[SCHEDULE] = [list(row) for row in self.schedule]
        return {PARAM: config}


def engine_config(table: list[list[int]]) -> dict[str, Any]:
    """A ``lut`` table [[start, end, k], ...] (from batch size 1, as build_lut makes it) as vLLM's
    speculative_config keys (add ``method`` and ``model``). vLLM needs num_speculative_tokens >= 1."""
    return {MAX_K: max(1, max(row[2] for row in table)), SCHEDULE: [list(row) for row in table]}


def _rule(row: list[int], batch_size: int, k: int, cap: int) -> str:
    start, end, given = row
    text = f"[{start}, {end}, {given}]" + ("" if batch_size <= end else f" (batch {batch_size} in the gap after it)")
    return text + (f", clamped to {MAX_K} = {cap}" if given > cap else "")
