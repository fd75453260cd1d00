"""Worker processes for sweeps and capacity searches, safe to start from any caller.

A pool's workers are started by a fork server (spawn where there is none), never forked
from the caller, which may hold threads (a notebook's kernel, tqdm's monitor, Dask). Both
start methods would normally run the caller's ``__main__`` again in every worker, to find
functions defined there: a plain script without an ``if __name__ == "__main__":`` guard
would then run itself once per worker and fail ("An attempt has been made to start a new
process before the current process has finished its bootstrapping phase"). Our workers
only ever run functions of ``sim``, so while one starts the caller's ``__main__`` is
hidden (swapped for an empty module, under a lock) and nothing of it is run again. The
same holds for a Dask LocalCluster's worker processes, started inside :func:`hidden_main`.

The fork server imports what every worker needs first (numba and the simulator, :data:`PRELOAD`) once,
and forks each worker from there; a command may start it early (:func:`start_fork_server`) so that it
imports while the command checks its inputs.

Every worker also exits as soon as the process that started it is gone (``die_with``), so
``kill -9`` of a sweep or a search leaves no pool behind, and runs a cluster's replicas one at a
time (``SPECBATCH_THREADS=1``, sim/cluster.py): the pool already keeps every core busy.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import time
import types
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import context as mp_context

METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
_BASE = mp_context.ForkServerProcess if METHOD == "forkserver" else mp_context.SpawnProcess
_BASE_CONTEXT = mp_context.ForkServerContext if METHOD == "forkserver" else mp_context.SpawnContext
_HIDING = threading.Lock()


@contextlib.contextmanager
def hidden_main():
    """The caller's ``__main__`` replaced by an empty module for the duration: processes started
    meanwhile are not told to import it (multiprocessing records the main module's file or name
    in what a new process prepares from)."""
    with _HIDING:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is not None:
                sys.modules["__main__"] = main


class WorkerProcess(_BASE):
    """A pool worker that starts with the caller's ``__main__`` hidden."""

    @staticmethod
    def _Popen(process_obj):
        with hidden_main():
            return _BASE._Popen(process_obj)


class WorkerContext(_BASE_CONTEXT):
    """The start method's context, whose processes are :class:`WorkerProcess`."""

    Process = WorkerProcess


# What every worker imports before its first run (numba alone is half a second): the fork server imports
# them once and forks each worker from there, so a pool of n pays for them once instead of n times.
PRELOAD = ("numba", "sim.simulate", "specbatch.commands.sweep.executors", "specbatch.commands.capacity.search")


def start_fork_server() -> None:
    """Start the fork server now, without waiting for it: it imports :data:`PRELOAD` while the caller
    prepares, and a pool made afterwards forks its workers from it at once. (Where there is no fork
    server, or one runs already, nothing happens.)"""
    if METHOD != "forkserver":
        return
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(list(PRELOAD))
    with hidden_main():  # as a worker's start: the server is told nothing of the caller's __main__
        forkserver.ensure_running()


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool of ``workers`` for functions of ``sim`` (their arguments pickled)."""
    context = WorkerContext()
    if METHOD == "forkserver":  # the fork server's imports, should this pool be the one that starts it
        context.set_forkserver_preload(list(PRELOAD))
    return ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=start_worker,
                               initargs=(os.getpid(),))


def start_worker(parent_pid: int) -> None:
    """A pool worker's initializer: one thread of runs per worker (the pool is the parallelism), and gone
    with its parent (:func:`die_with`)."""
    os.environ.setdefault("SPECBATCH_THREADS", "1")
    die_with(parent_pid)


def warmed_pool(workers: int, config=None) -> ProcessPoolExecutor:
    """:func:`worker_pool`, its workers started now: each pays for its imports and for loading the
    compiled engine (a run of ``config``, a few requests, where given) while the caller goes on, so
    the caller's own work before its first batch (a tune's plan) hides their start-up."""
    pool = worker_pool(workers)
    for _ in range(workers):
        pool.submit(warm_worker, config)
    return pool


def warm_worker(config=None) -> None:
    """Import the simulator and, given a (small) config, run it once: what a worker's first run pays."""
    from sim.simulate import execute, prepare

    if config is not None:
        execute(prepare(config))


def die_with(parent_pid: int, every_s: float = 0.5) -> None:
    """A pool worker's initializer: exit as soon as the process that started it is gone.

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


def default_workers() -> int:
    """The cores this process may run on."""
    from sim.limits import usable_cores

    return usable_cores()
