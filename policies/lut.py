"""``lut``: a look-up table batch size -> k (arXiv 2310.18813; vLLM's num_speculative_tokens_per_batch_size).

The table is a list of inclusive ranges ``[[start_bs, end_bs, k], ...]``. Give it
explicitly (``table``), or give an acceptance rate (``alpha``) and the table is built
at bind() from the run's cost model: for each batch size b, the k in 0..k_max that
minimises the expected time per generated token at a reference context c,

    step_time(b, k, c) / ((1 - alpha^(k+1)) / (1 - alpha)),

ties going to the smaller k. A batch size no range covers takes the k of the nearest
range below it; below the first range, the first range's k; above the last, the
last range's k. Per step the policy does one list look-up.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any, Callable, Sequence

from policies.base import BatchView, CostModelLike, Policy, PolicyError, check_k_max

DEFAULT_K_MAX = 4
DEFAULT_CONTEXT = 512
FALLBACK_MAX_BATCH = 256  # batch sizes tabulated when the cost model does not say its max_batch
_TIE = 1e-12  # relative: a larger k must be cheaper per token by more than rounding noise


def max_batch_of(cost_model: CostModelLike) -> int:
    """The largest batch size a table built from ``cost_model`` must cover."""
    return int(getattr(cost_model, "max_batch", None) or FALLBACK_MAX_BATCH)


def expected_tokens(alpha: float, k: int) -> float:
    """E[a + 1] = (1 - alpha^(k+1)) / (1 - alpha): tokens one sequence emits per step."""
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_k(step_time: Callable[[int, int, float], float], alpha: float, k_max: int, batch_size: int,
           context_tokens: float) -> tuple[int, float]:
    """The k in 0..k_max with the least expected time per token at this batch, and that time."""
    best, best_cost = 0, step_time(batch_size, 0, context_tokens)  # E[tokens] at k = 0 is 1
    for k in range(1, k_max + 1):
        cost = step_time(batch_size, k, context_tokens) / expected_tokens(alpha, k)
        if cost < best_cost * (1.0 - _TIE):
            best, best_cost = k, cost
    return best, best_cost


def build_lut(step_time: Callable[[int, int, float], float], alpha: float, k_max: int, max_batch: int,
              context_tokens: float = DEFAULT_CONTEXT) -> list[list[int]]:
    """The table [[start, end, k], ...] for batch sizes 1..max_batch, consecutive equal k merged.

    ``step_time(batch_size, k, context_tokens)`` is the predicted decode step time (a
    cost model's or a step table's); the k chosen per batch size is :func:`best_k`'s.
    """
    check_alpha(alpha)
    check_k_max(k_max)
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise PolicyError(f"max_batch must be a whole number >= 1, got {max_batch!r}", field="max_batch")
    table: list[list[int]] = []
    for b in range(1, max_batch + 1):
        k, _ = best_k(step_time, alpha, k_max, b, context_tokens)
        if table and table[-1][2] == k:
            table[-1][1] = b
        else:
            table.append([b, b, k])
    return table


def check_table(table: Any) -> list[list[int]]:
    """Validate a table [[start, end, k], ...]; return it sorted by start. Errors name ``table``."""
    if not isinstance(table, (list, tuple)) or not table:
        raise PolicyError(f"table must be a non-empty list of [start_bs, end_bs, k] rows, got {table!r}",
                          field="table")
    rows = []
    for i, row in enumerate(table, start=1):
        if (not isinstance(row, (list, tuple)) or len(row) != 3
                or any(isinstance(v, bool) or not isinstance(v, int) for v in row)):
            raise PolicyError(f"table row {i} must be three whole numbers [start_bs, end_bs, k], got {row!r}",
                              field="table")
        start, end, k = row
        if start < 1:
            raise PolicyError(f"table row {i} {list(row)}: start batch size must be >= 1", field="table")
        if start > end:
            raise PolicyError(f"table row {i} {list(row)}: start {start} is after end {end}", field="table")
        if k < 0:
            raise PolicyError(f"table row {i} {list(row)}: k must be >= 0", field="table")
        rows.append((i, [start, end, k]))
    rows.sort(key=lambda r: r[1][0])
    for (i, prev), (j, row) in zip(rows, rows[1:]):
        if row[0] <= prev[1]:
            raise PolicyError(f"table row {j} {row} overlaps row {i} {prev} (batch size {row[0]})",
                              field="table")
    return [row for _, row in rows]


def check_alpha(alpha: Any) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
        raise PolicyError(f"alpha must be a number inside (0, 1), got {alpha!r}", field="alpha")


class TablePolicy(Policy):
    """A k table given explicitly, or built at bind() from the cost model and an acceptance rate.

    Subclasses say how to check a given table (``check_table``), how to build one
    (``build_table``) and how to look k up (``_set_lookup``); the row's last field is k.
    """

    table_form = "[[...], ...]"  # shown when neither table nor alpha is given

    def _choose_source(self, table, alpha, k_max, alpha_only: dict[str, Any]) -> bool:
        """Validate the table-or-alpha choice; True when the table was given (and is set up)."""
        if table is not None and alpha is not None:
            raise PolicyError("give either table or alpha (to build the table from the profile), not both",
                              field="table")
        if table is None and alpha is None:
            raise PolicyError(f"give table = {self.table_form} or alpha (to build the table from the profile)",
                              field="table")
        self.alpha = alpha
        if table is not None:
            for param, value in {"k_max": k_max, **alpha_only}.items():
                if value is not None:
                    raise PolicyError(f"{param} applies only with alpha (a given table sets its own k)",
                                      field=param)
            self.table = self.check_table(table)
            self.k_max = max(row[-1] for row in self.table)
            self.max_k_param = "table"
            self._set_lookup(self.table)
            return True
        check_alpha(alpha)
        self.k_max = check_k_max(DEFAULT_K_MAX if k_max is None else k_max)
        self.max_k_param = "k_max"
        self.table = None  # built at bind()
        return False

    @property
    def max_k(self) -> int:
        return self.k_max

    def bind(self, k_max: int, cost_model: CostModelLike | None = None) -> None:
        super().bind(k_max, cost_model)
        if self.alpha is None:
            return
        if cost_model is None:
            raise PolicyError(f"{self.name} with alpha builds its table from a cost model, and none was given",
                              field="alpha")
        self.table = self.build_table(cost_model.step_time, max_batch_of(cost_model))
        self._set_lookup(self.table)

    def check_table(self, table: Any) -> list[list[int]]:
        raise NotImplementedError

    def build_table(self, step_time: Callable[[int, int, float], float], max_batch: int) -> list[list[int]]:
        raise NotImplementedError

    def _set_lookup(self, table: list[list[int]]) -> None:
        raise NotImplementedError


class LookupTable(TablePolicy):
    name = "lut"
    table_form = "[[start_bs, end_bs, k], ...]"

    def __init__(self, table: Sequence[Sequence[int]] | None = None, alpha: float | None = None,
                 k_max: int | None = None, context_tokens: float | None = None) -> None:
        self.context_tokens = None
        if self._choose_source(table, alpha, k_max, {"context_tokens": context_tokens}):
            return
        context_tokens = DEFAULT_CONTEXT if context_tokens is None else context_tokens
        if (isinstance(context_tokens, bool) or not isinstance(context_tokens, (int, float))
                or not (context_tokens >= 0 and math.isfinite(context_tokens))):
            raise PolicyError(f"context_tokens must be a number >= 0, got {context_tokens!r}",
                              field="context_tokens")
        self.context_tokens = context_tokens
        self._starts, self._ks = [], [0]  # k = 0 until bind() builds the table

    def check_table(self, table: Any) -> list[list[int]]:
        return check_table(table)

    def build_table(self, step_time, max_batch: int) -> list[list[int]]:
        return build_lut(step_time, self.alpha, self.k_max, max_batch, self.context_tokens)

    def _set_lookup(self, table: list[list[int]]) -> None:
        """Rows sorted by start: a batch size takes the k of the last range starting at or below it."""
        self._starts = [start for start, _, _ in table]
        self._ks = [table[0][2]] + [k for _, _, k in table]  # index 0: below the first range

    def k_for(self, batch_size: int) -> int:
        """The k for this batch size (covered, in a gap, below the first or above the last range)."""
        return self._ks[bisect_right(self._starts, batch_size)]

    def choose_k(self, view: BatchView) -> int:
        i = bisect_right(self._starts, view.batch_size)
        if view.explain is not None:  # the row used (the first one below the table's first range)
            view.explain["row"] = list(self.table[max(i - 1, 0)]) if self.table else None
        return self._ks[i]

    def k_by_batch_size(self, max_batch: int) -> list[int]:
        return [self.k_for(b) for b in range(max_batch + 1)]

    def params(self) -> dict[str, Any]:
        if self.alpha is None:
            return {"table": [list(row) for row in self.table]}
        return {"alpha": self.alpha, "k_max": self.k_max, "context_tokens": self.context_tokens}
