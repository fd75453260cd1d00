"""A cluster kernel reads one replica's state out of the fleet's tuples at a run-time index through
``fleet.pinned`` (sim/jit.py ``_register_pinned``): one load where the entry lies, not numba's switch over
every replica's copy, which was most of the cluster kernels' compilation. What is read through it must be
the caller's own arrays, written and read as numba's own indexing would."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from numba.extending import register_jitable  # noqa: E402

from sim import jit  # noqa: E402
from sim.serving.cluster_kernel import Fleet  # noqa: E402


class Pair(NamedTuple):
    """A fleet's shape in small: tuples of one type per field, and a field that is not a tuple."""

    counts: tuple
    weights: tuple
    size: int

    @property
    def pinned(self) -> "Pair":
        return self


def _add(f, i, k, amount):  # inlined, as the kernels' rules are: numba then prunes what it thinks is dead
    f.counts[i][k] += amount
    return f.weights[i][k]


def _kernel():
    jit.prepare()
    add = register_jitable(_nrt=False, inline="always")(_add)

    def kernel(f, i, k, amount):
        f = f.pinned
        return add(f, i, k, amount) + f.size

    return numba.njit(_nrt=False)(kernel)


def _pair(n: int = 4) -> Pair:
    return Pair(tuple(np.arange(5) * 10 + j for j in range(n)), tuple(np.arange(5) + 0.5 * j for j in range(n)), 7)


def test_a_pinned_fleet_reads_and_writes_the_callers_arrays_at_a_run_time_index():
    kernel = _kernel()
    pair = _pair()
    for i in range(4):
        assert kernel(pair, i, 3, 100 + i) == 3 + 0.5 * i + 7
    for j in range(4):
        assert pair.counts[j].tolist() == [j, 10 + j, 20 + j, 130 + 2 * j, 40 + j], "each write reaches its array"


@pytest.mark.parametrize("index", [4, -1, -4])
def test_a_replica_number_out_of_range_is_an_index_error_not_a_read_of_another(index):
    kernel = _kernel()
    kernel(_pair(), 0, 0, 1)
    with pytest.raises(IndexError, match="tuple index out of range"):
        kernel(_pair(), index, 0, 1)


def test_pinned_indexing_compiles_to_a_load_where_numbas_is_a_switch_over_the_entries():
    jit.prepare()

    def pinned(f, i):
        return f.pinned.counts[i][2]

    def by_value(f, i):
        return f.counts[i][2]

    pair = _pair(8)
    for fn, switches in ((pinned, False), (by_value, True)):
        compiled = numba.njit(_nrt=False)(fn)
        assert compiled(pair, 5) == 25
        llvm = compiled.inspect_llvm(compiled.signatures[0])
        assert (" switch " in llvm) is switches, fn.__name__


def test_interpreted_the_fleet_is_pinned_as_it_is():
    fleet = Fleet(*(((j,) * 8) for j in range(7)))
    assert fleet.pinned is fleet
