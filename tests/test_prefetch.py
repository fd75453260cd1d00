"""The KV-cache manager asks for block rows ahead of their use (sim/prefetch.py): compiled, one prefetch
instruction that changes no value; interpreted, nothing. What the rules compute must not depend on it."""

from __future__ import annotations

import numpy as np
import pytest

from sim.prefetch import prefetch

numba = pytest.importorskip("numba")

from sim import jit  # noqa: E402


def _sum_rows(table, order):
    """Rows of ``table`` summed in ``order``, each asked for two rows ahead (as the KV manager does)."""
    total = 0
    for j in range(order.shape[0]):
        if j + 2 < order.shape[0]:
            prefetch(table, order[j + 2])
        total += table[order[j], 0] + table[order[j], 1]
    return total


def test_interpreted_it_is_nothing():
    table = np.arange(8).reshape(4, 2)
    before = table.copy()
    assert prefetch(table, 3) is None
    assert prefetch(table, 10**9) is None  # interpreted, not even an index
    assert np.array_equal(table, before)


def test_compiled_it_is_a_prefetch_for_writing_and_the_results_are_the_same():
    jit.prepare()
    compiled = numba.njit(_nrt=False)(_sum_rows)
    table = np.arange(2000, dtype=np.int64).reshape(1000, 2)
    order = np.random.default_rng(0).permutation(1000)
    assert compiled(table, order) == _sum_rows(table, order) == table.sum()
    ir = compiled.inspect_llvm(compiled.signatures[0])
    assert "call void @llvm.prefetch" in ir
    assert "i32 1, i32 3, i32 1" in ir  # for writing, kept in every level, data


@pytest.mark.parametrize("rows", [np.int32(5), 5])
def test_compiled_it_takes_any_integer_row_and_any_array(rows):
    jit.prepare()

    @numba.njit(_nrt=False)
    def touch(a, b, row):
        prefetch(a, row)
        prefetch(b, row)
        return a[row, 1] + b[row]

    assert touch(np.ones((8, 3)), np.arange(8.0), rows) == 1.0 + 5.0
