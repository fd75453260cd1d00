"""Where cells run: in this process, a local process pool, or a Dask distributed cluster.

Every executor calls the same pure function, :func:`run_cell`, and yields (key, record)
pairs as cells finish, in whatever order they finish; the caller stores them and builds
the table in the sweep's own order, so the executor never changes the table.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import traceback
import warnings
from concurrent.futures import as_completed
from typing import Any, Iterator

from specbatch.commands.workers import default_workers, hidden_main, worker_pool
from sim.config import RunConfig
from sim.errors import InputError

Task = tuple[str, RunConfig]  # (cell key, resolved config)


def run_cell(config: RunConfig) -> dict[str, Any]:
    """Simulate one cell. Bad inputs and crashes become a failed record, never an exception."""
    from sim.serving.records import TotalsOnly
    from sim.simulate import execute, prepare

    started = time.perf_counter()
    try:
        result = execute(prepare(config), steps_sink=TotalsOnly())  # a cell's record is its summary
    except InputError as exc:
        return _record("failed", str(exc), {}, started)
    except Exception as exc:  # noqa: BLE001 - one broken corner must not stop the sweep
        from policies import plugin_failure

        where = traceback.extract_tb(exc.__traceback__)[-1]
        return _record("failed", plugin_failure(exc) or f"{type(exc).__name__}: {exc} (at "
                       f"{os.path.basename(where.filename)}:{where.lineno})", {}, started)
    record = _record("ok", "", dict(result.summary), started)
    record["warnings"] = list(result.warnings)
    return record


def _record(status: str, error: str, metrics: dict, started: float) -> dict[str, Any]:
    from specbatch.commands.sweep.store import worker_code_version

    return {"status": status, "error": error, "metrics": metrics, "code_version": worker_code_version(),
            "wall_s": time.perf_counter() - started}


def run_serial(tasks: list[Task]) -> Iterator[tuple[str, dict]]:
    for key, config in tasks:
        yield key, run_cell(config)


def run_pool(tasks: list[Task], workers: int, pool=None) -> Iterator[tuple[str, dict]]:
    """A local process pool (specbatch.commands.workers: safe from a script without a __main__ guard).

    ``pool``: one the caller keeps across batches (a tune sends a dozen): each new pool's workers
    pay again for their imports and for loading the compiled engine, about a second each, which
    for short runs cost more than the runs themselves."""
    with contextlib.nullcontext(pool) if pool is not None else worker_pool(workers) as pool:
        futures = {pool.submit(run_cell, config): key for key, config in tasks}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()


def run_dask(tasks: list[Task], address: str, workers: int | None) -> Iterator[tuple[str, dict]]:
    """``address`` is a scheduler address, or ``local`` for a LocalCluster of ``workers`` processes."""
    dask = DaskRunner(address, workers)
    try:
        yield from dask.run(tasks)
    finally:
        dask.close()


class DaskRunner:
    """A Dask client, opened once for several batches of runs (a tune's) and closed at the end:
    of a LocalCluster of ``workers`` processes (``local``), or of the scheduler at ``address``."""

    def __init__(self, address: str, workers: int | None) -> None:
        from distributed import Client, LocalCluster

        self.cluster = None
        if address == "local":
            with warnings.catch_warnings():  # no dashboard, but its HTTP server says when 8787 is taken
                warnings.filterwarnings("ignore", message="Port .* is already in use")
                with hidden_main():  # its worker processes must not run the caller's script again
                    self.cluster = LocalCluster(n_workers=workers or default_workers(), threads_per_worker=1,
                                                processes=True, dashboard_address=None, silence_logs=logging.ERROR,
                                                env={"SPECBATCH_THREADS": os.environ.get("SPECBATCH_THREADS", "1")})
            self.client = Client(self.cluster)
        else:
            try:
                self.client = Client(address, timeout="20s")
            except OSError as exc:
                raise InputError(f"cannot reach the Dask scheduler: {exc}", field="dask", source="--dask") from None

    def run(self, tasks: list[Task]) -> Iterator[tuple[str, dict]]:
        """(key, record) of each task as it finishes."""
        from distributed import as_completed as dask_completed

        futures = {self.client.submit(run_cell, config, key=f"specbatch-cell-{key}", pure=False): key
                   for key, config in tasks}
        for future in dask_completed(list(futures)):
            yield futures[future], future.result()

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def have_dask() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True
