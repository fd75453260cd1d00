"""A hint to the memory system for compiled rules: fetch a row's cache line before it is used.

The KV-cache manager (sim/scheduler/kvcache.py) touches one row of its block table per block it
allocates or frees, a different block each time, scattered over a cache of tens of thousands of blocks:
each touch waited for memory. Its next blocks are known a few steps ahead (the free queue's next entries,
a table's next blocks), so asking for their rows early hides most of that wait.
"""

from __future__ import annotations


def prefetch(array, row) -> None:
    """Ask for the cache line that holds ``array[row]`` (its first element), to be written soon.

    Compiled (sim/jit.py registers it with numba), one prefetch instruction and no bounds check (the rules
    ask only for rows that exist; the instruction itself never faults). Interpreted, nothing: Python's own
    work dwarfs a cache miss."""
