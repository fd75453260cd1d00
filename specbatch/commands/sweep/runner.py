"""Run a sweep: find the cells already stored, run the rest on an executor, build the table."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from sim.errors import InputError
from specbatch.commands.sweep import executors
from specbatch.commands.sweep.spec import Sweep
from specbatch.commands.sweep.store import CellStore, build_table, cell_key, code_version, write_tables

EXECUTORS = ("pool", "serial", "dask")


@dataclass
class SweepReport:
    table: pd.DataFrame
    written: list[Path]
    cells: int          # rows of the table
    distinct: int       # distinct configs among them (equal configs run once)
    stored: int         # distinct cells found in the store before this run
    ran: int            # cells run now
    failed: int         # rows whose cell failed
    wall_s: float


def run_sweep(sweep: Sweep, out_dir: str | Path, *, executor: str = "pool", workers: int | None = None,
              dask_address: str | None = None, retry_failed: bool = False, parquet: bool = True,
              csv: bool = False, progress: bool = True) -> SweepReport:
    started = time.perf_counter()
    out_dir = Path(out_dir)
    version = code_version()
    keys = [cell_key(cell.config, version) for cell in sweep.cells]
    store = CellStore(out_dir)
    store.prepare()
    configs = {}
    for cell, key in zip(sweep.cells, keys):
        configs.setdefault(key, cell.config)
    todo, stored = [], 0
    for key, config in configs.items():
        record = store.load(key)
        if record is None or (retry_failed and record["status"] != "ok"):
            todo.append((key, config))
        else:
            stored += 1
    where = "this process" if executor == "serial" else (
        f"Dask at {dask_address}" if executor == "dask" else f"a pool of {workers or executors.default_workers()}")
    print(f"{len(sweep.cells)} cells, {len(configs)} distinct: {stored} already in {store.dir}, "
          f"{len(todo)} to run on {where}", file=sys.stderr)
    failed_now = 0
    with tqdm(total=len(todo), unit="cell", desc="sweep", disable=not progress or not todo,
              file=sys.stderr, dynamic_ncols=True) as bar:
        bar.set_postfix(failed=0, left=len(todo))
        for key, record in _execute(todo, executor, workers, dask_address):
            if executor == "dask" and record["code_version"] != version:  # another machine, another install?
                raise InputError(f"a Dask worker runs specbatch {record['code_version']}, this client "
                                 f"{version}; install the same code on every worker", source="--dask")
            store.save(key, {**record, "config": configs[key].to_dict()})  # a cell file explains itself
            failed_now += record["status"] != "ok"
            bar.set_postfix(failed=failed_now, left=bar.total - bar.n - 1, refresh=False)
            bar.update(1)
    table = build_table(sweep.cells, keys, sweep.columns, store)
    written = write_tables(table, out_dir, parquet, csv)
    return SweepReport(table, written, len(sweep.cells), len(configs), stored, len(todo),
                       int((table["status"] != "ok").sum()), time.perf_counter() - started)


def _execute(todo, executor: str, workers: int | None, dask_address: str | None):
    if not todo:
        return iter(())
    if executor == "serial":
        return executors.run_serial(todo)
    if executor == "dask":
        return executors.run_dask(todo, dask_address or "local", workers)
    return executors.run_pool(todo, workers or executors.default_workers())
