"""``python -m sim.warm``: compile every entry point of the engine into this code version's cache.

sim.jit starts it in the background on a machine's first run of a code version (that run is
interpreted meanwhile); it runs small variants of the default scenario compiled, which call
every compiled entry point with every argument type a run can give it, and the run folder's CSV
row formatter (sim/csv_rows.py), then marks the cache folder ready (sim.jit.READY), or leaves why it failed (sim.jit.FAILED).
"""

from __future__ import annotations

import os
import traceback

from sim import jit
from sim.config import load_config
from sim.simulate import execute, prepare

# Both schedulers; compiled runs with a k table and with goodput; the step-by-step rules under a
# learning policy; a cluster's replicas run apart (round-robin) and routed in one compiled run (a router
# that reads the replicas: sim/serving/cluster_kernel.py); a disaggregated run's; a host drafter's proposals.
WARM_RUNS: tuple[dict, ...] = (
    {},
    {"engine.scheduler": "v0"},
    {"policy.name": "goodput"},
    {"policy.name": "adaptive"},
    {"policy.name": "adaptive", "engine.scheduler": "v0"},
    {"cluster.replicas": 2},
    {"cluster.replicas": 2, "cluster.router": "least-requests"},
    {"cluster.prefill_replicas": 1, "cluster.decode_replicas": 1},
    {"speculative.config": {"method": "ngram", "num_speculative_tokens": 3}},
)


def warm(runs: tuple[dict, ...] = WARM_RUNS) -> None:
    """Run ``runs`` compiled (40 requests each, nothing written), then mark the folder ready; the
    lock sim.jit took for this process is released whatever happens."""
    folder = jit.cache_folder()
    try:
        run_compiled(runs)
        warm_csv_rows()
        (folder / jit.READY).write_text("compiled by python -m sim.warm\n")
    except Exception:
        (folder / jit.FAILED).write_text(traceback.format_exc())
        raise
    finally:
        (folder / jit.WARMING).unlink(missing_ok=True)


def run_compiled(runs: tuple[dict, ...]) -> None:
    """Run each of ``runs`` compiled (40 requests, nothing written): what it calls is compiled, or loaded."""
    for overrides in runs:
        settings = {"workload.num_requests": 40, "output.records": "none", "engine.jit": "on", **overrides}
        execute(prepare(load_config(None, settings)))


def share(index: int, count: int) -> tuple[dict, ...]:
    """Process ``index`` of ``count``'s part of :data:`WARM_RUNS`, for processes that compile at once (a test
    session's): the kernels that take longest to compile and that only a cluster's runs call (the
    disaggregated and the routed one) apart from the single replica's, which every other run calls; a
    third process and on, none."""
    if count <= 1:
        return WARM_RUNS
    clusters = (tuple(run for run in WARM_RUNS if "cluster.prefill_replicas" in run)  # first: it needs no other's
                + tuple(run for run in WARM_RUNS if "cluster.router" in run))
    return (tuple(run for run in WARM_RUNS if run not in clusters), clusters)[index] if index < 2 else ()


def warm_csv_rows() -> None:
    """Compile the run folder's CSV row formatter (sim.csv_rows) on a table of each kind of column."""
    import numpy as np

    from sim.csv_rows import csv_rows, format_rows

    csv_rows({"i": np.arange(2), "x": np.zeros(2)}, 0, 2, {}, jit.compiled(format_rows))


if __name__ == "__main__":  # started by sim.jit.start_warm_up, at low priority
    if hasattr(os, "nice"):
        os.nice(10)
    warm()
