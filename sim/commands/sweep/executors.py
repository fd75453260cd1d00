"""Where cells run: in this process, a local process pool, or a Dask distributed cluster.

Every executor calls the same pure function, :func:`run_cell`, and yields (key, record)
pairs as cells finish, in whatever order they finish; the caller stores them and builds
the table in the sweep's own order, so the executor never changes the table.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Iterator

from sim.config import RunConfig
from sim.errors import InputError

Task = tuple[str, RunConfig]  # (cell key, resolved config)


def run_cell(config: RunConfig) -> dict[str, Any]:
    """Simulate one cell. Bad inputs and crashes become a failed record, never an exception."""
    from sim.simulate import execute, prepare

    started = time.perf_counter()
    try:
        result = execute(prepare(config))
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
    from sim.commands.sweep.store import worker_code_version

    return {"status": status, "error": error, "metrics": metrics, "code_version": worker_code_version(),
            "wall_s": time.perf_counter() - started}


def run_serial(tasks: list[Task]) -> Iterator[tuple[str, dict]]:
    for key, config in tasks:
        yield key, run_cell(config)


def run_pool(tasks: list[Task], workers: int) -> Iterator[tuple[str, dict]]:
    # forkserver: workers start clean, not as forks of a parent that may hold threads (tqdm, Dask).
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                             initializer=die_with, initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(run_cell, config): key for key, config in tasks}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()


def die_with(parent_pid: int, every_s: float = 0.5) -> None:
    """A pool worker's initializer: exit as soon as the sweep's process is gone.

    A pool's workers wait on a queue that a parent killed with ``kill -9`` never closes,
    so they would run on (holding memory) forever; a watcher thread ends them instead.
    """
    def watch() -> None:
        while True:
            time.sleep(every_s)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # the pid was reused by another user's process: ours is gone
                os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def run_dask(tasks: list[Task], address: str, workers: int | None) -> Iterator[tuple[str, dict]]:
    """``address`` is a scheduler address, or ``local`` for a LocalCluster of ``workers`` processes."""
    from distributed import Client, LocalCluster
    from distributed import as_completed as dask_completed

    cluster = None
    if address == "local":
        with warnings.catch_warnings():  # no dashboard, but its HTTP server says when 8787 is taken
            warnings.filterwarnings("ignore", message="Port .* is already in use")
            cluster = LocalCluster(n_workers=workers or default_workers(), threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
    else:
        try:
            client = Client(address, timeout="20s")
        except OSError as exc:
            raise InputError(f"cannot reach the Dask scheduler: {exc}", field="dask", source="--dask") from None
    try:
        futures = {client.submit(run_cell, config, key=f"specbatch-cell-{key}", pure=False): key
                   for key, config in tasks}
        for future in dask_completed(list(futures)):
            yield futures[future], future.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def have_dask() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True
