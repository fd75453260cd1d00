"""What a run can honour, checked before it starts: integer ranges, simulated time, memory.

The time and token bounds live in :mod:`workloads.limits` (traces are checked against them
too); here are the bounds that depend on the machine. A run that would need more memory
than the machine has is refused with one line before it draws a single arrival, rather
than swapping for an hour and being killed (see docs/errors.md for the figures).
"""

from __future__ import annotations

import os
from pathlib import Path

from workloads.limits import MAX_TIME_S, MAX_TOKENS

__all__ = ["COUNT_MAX", "INT64_MAX", "MAX_BATCH", "MAX_REPLICAS", "MAX_WORKERS", "MAX_TIME_S", "MAX_TOKENS", "SEED_MAX", "format_bytes",
           "machine_memory_bytes", "memory_problem", "request_bytes", "table_bytes"]

INT64_MAX = 2**63 - 1
COUNT_MAX = 2**31 - 1  # a request's counts (tokens emitted, drafted, kept; steps) are int32 (sim/serving/state.py)
SEED_MAX = INT64_MAX  # TOML integers are signed 64-bit: a larger seed could not be written to config.toml

# Sequences in one batch: beyond any serving engine's (vLLM's default max_num_seqs is 256), and
# the pre-tabulated step costs grow with it (table_bytes).
MAX_BATCH = 16384

# Worker processes of a sweep's or a capacity search's pool: each holds a copy of the simulator.
MAX_WORKERS = 1024

# One replica is one simulated engine in this process; the router looks at every replica for
# every arrival, so thousands of replicas make a run crawl long before memory runs out.
MAX_REPLICAS = 1024

# Peak memory of a simulated run: what every run holds (Python, numpy, pandas, scipy and the
# curve fit of a profile's first run on a machine, SimPy, the step table of the default
# scenario) plus a share per request (its columns, its steps' records in typed column
# buffers, the summary's sorted copies, the written slices). Measured on the default scenario
# with GNU time (`/usr/bin/time -f %M specbatch run --num-requests N --rate 1000 --records csv`,
# the fit cache off, i.e. the worst start-up): 20,000 requests peak at 298 MB, 200,000 at
# 337 MB, 500,000 at 496 MB (before the column records: 291 MB at 20,000, 1.09 GB at
# 1,000,000). The line through the 20,000 and 500,000 points is within 10% of the 200,000 one,
# above it. The estimate is meant to be close, not cautious: a refusal must not turn away a
# run that would fit.
BASE_BYTES = 276 * 2**20
BYTES_PER_REQUEST = 410
# One cell of the pre-tabulated step costs: a Python float in a list (sim.costmodel.model.StepTable).
BYTES_PER_TABLE_CELL = 32
TABLE_CONTEXT_COLUMNS = 258     # sim.costmodel.model.TABLE_COLUMNS + 2
TABLE_CATCH_UP_LAGS = 10        # sim.costmodel.model.CATCH_UP_LAGS + 1


def request_bytes(requests: float) -> float:
    """A run's peak memory for ``requests`` requests (the step table is counted apart: table_bytes)."""
    return BASE_BYTES + requests * BYTES_PER_REQUEST


def table_bytes(max_batch: int, k_max: int) -> float:
    """The step table's size: decode and decode-after-catch-up [b][k][ctx], catch-up [b][lag][ctx], prefill [b][ctx]."""
    per_batch = (2 * (k_max + 1) + TABLE_CATCH_UP_LAGS + 1) * TABLE_CONTEXT_COLUMNS
    return (max_batch + 1) * per_batch * BYTES_PER_TABLE_CELL


def machine_memory_bytes() -> int:
    """Physical memory, or the container's (cgroup) limit where that is smaller."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"


def memory_problem(need: float) -> str | None:
    """None if ``need`` bytes fit this machine, else the one-line reason."""
    have = machine_memory_bytes()
    if need <= have:
        return None
    return f"needs about {format_bytes(need)} of memory, more than this machine's {format_bytes(have)}"
