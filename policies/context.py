"""``context``: a table batch size x context length -> k, for long-context serving (MagicDec, arXiv 2408.11049).

At short context a large batch is compute-bound, so the best k falls as the batch
grows (``lut``). Beyond a critical sequence length the KV cache dominates the cost of
a decode step: loading it is memory-bound, verifying k + 1 tokens per sequence costs
about as much as verifying 1, and the best k stays high -- or grows -- with batch
size. One k per batch size cannot express both, so this policy looks up k by batch
size *and* by the batch's mean context length.

The table is a list of rows ``[[min_bs, max_bs, min_ctx, max_ctx, k], ...]``, each an
inclusive rectangle of batch sizes and context lengths (tokens). Give it explicitly
(``table``), or give an acceptance rate (``alpha``) and the table is built at bind()
from the run's cost model: the context axis is cut into buckets by their upper edges
(``context_buckets``, default 512, 1024, ..., 32768 tokens; bucket i holds contexts
in (edge[i-1], edge[i]], the first from 0, and contexts beyond the last edge fall in
the last bucket), each bucket is priced at its **midpoint**, and in each bucket every
batch size 1..max_batch gets :func:`policies.lut.best_k`, the k minimising

    step_time(b, k, c_mid) / ((1 - alpha^(k+1)) / (1 - alpha)),

ties going to the smaller k. Neighbouring buckets that come out with the same k for
every batch size are merged into one, so a cost model whose context reach ends
before the last edge (it prices every longer context at its edge) does not grow the
table.

A point (b, c) that no row covers takes the k of the nearest row below it in batch
size at that context (as ``lut`` does), else of the nearest above; a context that no
row covers at all takes the nearest context band below it, else above. Below the
table's smallest batch size or context the first band applies, above the largest the
last. All of that is resolved once into a grid, so a step costs two bisections. The grid's
lookup (policies/context_rules.py) is the one a compiled run makes too, so a run under this
policy runs compiled.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Sequence

import numpy as np

from policies import context_rules as rules
from policies.base import BatchView, CompiledForm, CostModelLike, PolicyError
from policies.lut import TablePolicy, check_alpha, build_lut

DEFAULT_CONTEXT_BUCKETS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


def check_context_table(table: Any) -> list[list[int]]:
    """Validate ``[[min_bs, max_bs, min_ctx, max_ctx, k], ...]``; return it sorted. Errors name ``table``."""
    if not isinstance(table, (list, tuple)) or not table:
        raise PolicyError("table must be a non-empty list of [min_bs, max_bs, min_ctx, max_ctx, k] rows, "
                          f"got {table!r}", field="table")
    rows = []
    for i, row in enumerate(table, start=1):
        if (not isinstance(row, (list, tuple)) or len(row) != 5
                or any(isinstance(v, bool) or not isinstance(v, int) for v in row)):
            raise PolicyError(f"table row {i} must be five whole numbers [min_bs, max_bs, min_ctx, max_ctx, k], "
                              f"got {row!r}", field="table")
        min_bs, max_bs, min_ctx, max_ctx, k = row
        if min_bs < 1:
            raise PolicyError(f"table row {i} {list(row)}: min_bs must be >= 1", field="table")
        if min_bs > max_bs:
            raise PolicyError(f"table row {i} {list(row)}: min_bs {min_bs} is after max_bs {max_bs}", field="table")
        if min_ctx < 0:
            raise PolicyError(f"table row {i} {list(row)}: min_ctx must be >= 0", field="table")
        if min_ctx > max_ctx:
            raise PolicyError(f"table row {i} {list(row)}: min_ctx {min_ctx} is after max_ctx {max_ctx}",
                              field="table")
        if k < 0:
            raise PolicyError(f"table row {i} {list(row)}: k must be >= 0", field="table")
        rows.append((i, list(row)))
    rows.sort(key=lambda r: (r[1][2], r[1][0]))
    for a in range(len(rows)):
        i, r = rows[a]
        for j, s in rows[a + 1:]:
            if s[2] > r[3]:
                break  # sorted by min_ctx: no later row reaches back into r's contexts
            if s[0] <= r[1] and r[0] <= s[1]:
                raise PolicyError(f"table row {j} {s} overlaps row {i} {r} (batch size {max(r[0], s[0])}, "
                                  f"context {max(r[2], s[2])})", field="table")
    return [row for _, row in rows]


def _check_buckets(buckets: Any) -> list[int]:
    if (not isinstance(buckets, (list, tuple)) or not buckets
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in buckets)
            or any(b >= c for b, c in zip(buckets, buckets[1:]))):
        raise PolicyError("context_buckets must be a non-empty list of increasing whole numbers >= 1 (bucket "
                          f"upper edges in tokens), got {buckets!r}", field="context_buckets")
    return list(buckets)


def build_context_table(step_time, alpha: float, k_max: int, max_batch: int,
                        context_buckets: Sequence[int] = DEFAULT_CONTEXT_BUCKETS) -> list[list[int]]:
    """The auto table: per context bucket (priced at its midpoint) the ``lut`` for batch 1..max_batch.

    Rows ``[min_bs, max_bs, min_ctx, max_ctx, k]``; neighbouring buckets with equal ``lut``s merged.
    """
    check_alpha(alpha)
    edges = _check_buckets(context_buckets)
    bands: list[list] = []  # [min_ctx, max_ctx, lut]
    lo = 0
    for edge in edges:
        lut = build_lut(step_time, alpha, k_max, max_batch, (lo + edge) / 2)
        if bands and bands[-1][2] == lut:
            bands[-1][1] = edge
        else:
            bands.append([lo, edge, lut])
        lo = edge + 1
    return [[s, e, c0, c1, k] for c0, c1, lut in bands for s, e, k in lut]


class ContextTable(TablePolicy):
    name = "context"
    table_form = "[[min_bs, max_bs, min_ctx, max_ctx, k], ...]"

    def __init__(self, table: Sequence[Sequence[int]] | None = None, alpha: float | None = None,
                 k_max: int | None = None, context_buckets: Sequence[int] | None = None) -> None:
        self.context_buckets = None
        if self._choose_source(table, alpha, k_max, {"context_buckets": context_buckets}):
            return
        self.context_buckets = _check_buckets(DEFAULT_CONTEXT_BUCKETS if context_buckets is None
                                              else context_buckets)
        self._set_grid([], [], [[0]])  # k = 0 until bind()

    def check_table(self, table: Any) -> list[list[int]]:
        return check_context_table(table)

    def build_table(self, step_time, max_batch: int) -> list[list[int]]:
        return build_context_table(step_time, self.alpha, self.k_max, max_batch, self.context_buckets)

    def _set_lookup(self, table: list[list[int]]) -> None:
        """Resolve the rows into a grid of cells cut at every row's edges, gaps filled (module doc)."""
        bs_edges = sorted({r[0] for r in table} | {r[1] + 1 for r in table})
        ctx_edges = sorted({r[2] for r in table} | {r[3] + 1 for r in table})
        grid: list[list[int | None]] = [[None] * len(bs_edges) for _ in ctx_edges]
        for min_bs, max_bs, min_ctx, max_ctx, k in table:
            for j in range(bisect_right(ctx_edges, min_ctx) - 1, bisect_right(ctx_edges, max_ctx)):
                for i in range(bisect_right(bs_edges, min_bs) - 1, bisect_right(bs_edges, max_bs)):
                    grid[j][i] = k
        filled = [None if all(v is None for v in col) else self._fill(col) for col in grid]
        # a context band no row covers takes its neighbour's whole band
        self._set_grid(bs_edges, ctx_edges, self._fill(filled))

    def _set_grid(self, bs_edges: list[int], ctx_edges: list[int], grid: list[list[int]]) -> None:
        """The grid as its lookup reads it (policies/context_rules.py): the k of each context band (row) and
        batch-size band (column), and the context bands' edges."""
        self._bs_edges = bs_edges
        self._ctx_edges = np.array(ctx_edges, dtype=np.float64)
        self._grid = np.array(grid, dtype=np.float64)

    @staticmethod
    def _fill(cells: list) -> list:
        """None entries take the nearest value below, else the nearest above (all None stays None)."""
        out, last = list(cells), None
        for i, v in enumerate(out):
            if v is None:
                out[i] = last
            else:
                last = v
        first = next((v for v in out if v is not None), None)
        return [first if v is None else v for v in out]

    def k_for(self, batch_size: int, context_tokens: float) -> int:
        """The k for this batch size and mean context (covered, in a gap, or beyond the table)."""
        return rules.table_k(self._grid, self._ctx_edges, self._column(batch_size), context_tokens)

    def _column(self, batch_size: int) -> int:
        """The grid's column of a batch size: its batch-size band."""
        return max(bisect_right(self._bs_edges, batch_size) - 1, 0)

    def choose_k(self, view: BatchView) -> int:
        if view.explain is not None:
            view.explain["row"] = self.row_for(view.batch_size, view.mean_context_tokens)
        return self.k_for(view.batch_size, view.mean_context_tokens)

    def compiled_form(self, max_batch: int, cost_model: CostModelLike | None) -> CompiledForm:
        """The grid's lookup, with each batch size's column looked up once."""
        columns = np.array([self._column(b) for b in range(max_batch + 1)], dtype=np.int64)
        return CompiledForm.context(columns, self._ctx_edges, self._grid)

    def row_for(self, batch_size: int, context_tokens: float) -> list[int] | None:
        """The table row [min_bs, max_bs, min_ctx, max_ctx, k] covering this point (None in a gap)."""
        for row in self.table or ():
            if row[0] <= batch_size <= row[1] and row[2] <= context_tokens < row[3] + 1:
                return list(row)
        return None

    def params(self) -> dict[str, Any]:
        if self.alpha is None:
            return {"table": [list(row) for row in self.table]}
        return {"alpha": self.alpha, "k_max": self.k_max, "context_buckets": list(self.context_buckets)}


__all__ = ["ContextTable", "build_context_table", "check_context_table", "DEFAULT_CONTEXT_BUCKETS"]
