"""The ``context`` table's lookup (policies/context.py) as rules: plain functions over its grid's arrays.

:class:`policies.context.ContextTable` resolves its rows once into a grid of k, cut at every row's
batch-size and context edges; a step's k is that grid's cell at the step's batch-size column and
mean-context band. The policy calls these step by step and the simulator's compiled runs
(sim/serving/kernel.py) call them compiled, on the same arrays, so there is one lookup, as for
goodput (policies/goodput_rules.py).
"""

from __future__ import annotations


def band(edges, x):
    """The band ``x`` falls in, of the bands starting at the sorted ``edges``: the last edge at or below
    ``x``, or the first band where ``x`` is below every edge (``bisect_right(edges, x) - 1``, at least 0)."""
    j = 0
    for i in range(1, edges.shape[0]):
        if edges[i] > x:
            break
        j = i
    return j


def table_k(grid, context_edges, column, context):
    """The k of the grid's cell at batch-size ``column`` and the band of mean context ``context``."""
    return int(grid[band(context_edges, context), column])


RULES = (band, table_k)
