"""A tune's runs: each (candidate, seed) is one simulated run, stored once, on the sweep's executors.

A run is a cell of the sweep's store (``specbatch.commands.sweep.store``): keyed by a hash of its
resolved config, the inputs it reads and the code, written whole to ``cells/<key>.json``
as it finishes. A tune killed at any moment therefore resumes with the same command and
runs only what is missing; the search, being a pure function of the runs' results, takes
the same path again. Runs are sent to an executor in batches (``specbatch.commands.sweep.executors``:
this process, a process pool, or Dask), and ``trials.csv`` lists every run the tune used,
in the order it asked for them.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from specbatch.commands.sweep import executors
from specbatch.commands.sweep.store import CellStore, cell_key, code_version
from specbatch.commands.tune.objective import Objective
from specbatch.commands.tune.space import Schedule
from sim.config import PolicyConfig, RunConfig
from sim.errors import InputError

EXECUTORS = ("pool", "serial", "dask")
TRIALS = "trials.csv"
# The metrics each trial's row keeps beside the objective (summary.json names).
ROW_METRICS = ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_e2el_ms", "p99_e2el_ms",
               "request_throughput", "request_goodput", "mean_k", "mean_batch_size")


@dataclass(frozen=True)
class Candidate:
    """A policy the tune runs: a searched schedule, or a baseline."""

    label: str
    policy: dict[str, Any]             # a config's [policy] table: {"name": ..., parameters...}
    schedule: Schedule | None = None   # the searched schedules only


def run_config(base: RunConfig, candidate: Candidate, seed: int) -> RunConfig:
    """The scenario with the candidate's policy, at this seed."""
    policy = dict(candidate.policy)
    return replace(base, seed=seed, policy=PolicyConfig(policy.pop("name"), policy))


class Trials:
    """Every run of a tune: (candidate, seed) -> its summary, from the store or run now."""

    def __init__(self, base: RunConfig, out_dir: Path, objective: Objective, *, executor: str = "pool",
                 workers: int | None = None, dask_address: str | None = None, progress: bool = False,
                 pool=None) -> None:
        if executor not in EXECUTORS:
            raise InputError(f"'{executor}' is not one of {', '.join(EXECUTORS)}", field="executor")
        self.base, self.objective = base, objective
        self.out_dir = Path(out_dir)
        self.executor, self.workers, self.dask_address = executor, workers, dask_address
        self.version = code_version()
        self.store = CellStore(self.out_dir)
        self.store.prepare()
        self.summaries: dict[str, dict] = {}      # cell key -> summary
        self.rows: dict[str, dict] = {}           # cell key -> its trials.csv row (first asked)
        self.ran = self.stored = 0
        from tqdm import tqdm

        # None: a bar only on a terminal (a log gets the progress lines alone)
        self.bar = tqdm(total=0, unit="run", desc="tune", disable=None if progress else True, file=sys.stderr,
                        dynamic_ncols=True)
        self.progress = progress
        self.pool = pool  # the process pool (started by the plan, or at the first batch that needs it), kept to the end
        self.dask = None  # ... or the Dask client (executors.DaskRunner), likewise


    def say(self, text: str) -> None:
        """A progress line (above the bar, on stderr)."""
        if self.progress:
            self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None
        if self.dask is not None:
            self.dask.close()
            self.dask = None

    def summaries_for(self, pairs: Sequence[tuple[Candidate, int]], phase: str) -> list[dict]:
        """Each pair's summary, in order; the missing runs go to the executor as one batch."""
        keyed = [(candidate, seed, run_config(self.base, candidate, seed)) for candidate, seed in pairs]
        keys = [cell_key(config, self.version) for _, _, config in keyed]
        todo = {}
        for (candidate, seed, config), key in zip(keyed, keys):
            if key not in self.summaries:
                record = self.store.load(key)
                if record is not None and record.get("status") == "ok":
                    self.summaries[key] = record["metrics"]
                    self.stored += 1
                else:
                    todo.setdefault(key, config)
            if key not in self.rows:
                self.rows[key] = {"phase": phase, "candidate": candidate.label, "seed": seed, "key": key,
                                  "from_store": key not in todo}
        if todo:
            self._run(todo, phase)
        for key in keys:
            row = self.rows[key]
            if "objective" not in row:
                summary = self.summaries[key]
                row["objective"] = self.objective.value(self.objective.loss(summary))
                row.update({name: summary.get(name) for name in ROW_METRICS})
        self.write()
        return [self.summaries[key] for key in keys]

    def _run(self, todo: dict[str, RunConfig], phase: str) -> None:
        self.bar.total += len(todo)
        self.bar.set_postfix_str(phase, refresh=False)
        tasks = list(todo.items())
        for key, record in self._execute(tasks):
            if self.executor == "dask" and record["code_version"] != self.version:
                raise InputError(f"a Dask worker runs specbatch {record['code_version']}, this client "
                                 f"{self.version}; install the same code on every worker", source="--dask")
            if record["status"] != "ok":
                raise InputError(f"a run of the tune failed ({todo[key].policy.name}, seed {todo[key].seed}): "
                                 f"{record['error']}")
            self.store.save(key, {**record, "config": todo[key].to_dict()})
            self.summaries[key] = record["metrics"]
            self.ran += 1
            self.bar.update(1)

    def _execute(self, tasks):
        if self.executor == "serial" or (self.executor == "pool" and (len(tasks) == 1 or self.workers == 1)):
            return executors.run_serial(tasks)  # one run: a pool would only add its start-up
        if self.executor == "dask":
            if self.dask is None:  # one cluster for the whole tune, not one per batch of runs
                self.dask = executors.DaskRunner(self.dask_address or "local", self.workers)
            return self.dask.run(tasks)
        if self.pool is None:
            from specbatch.commands.workers import worker_pool

            self.pool = worker_pool(self.workers or executors.default_workers())
        return executors.run_pool(tasks, self.workers or executors.default_workers(), pool=self.pool)

    def write(self) -> Path:
        """trials.csv: one row per run, in the order the tune asked for them (whole or absent). The standard
        library's writer: rewritten after every batch, it is not worth pandas's import to a tune's process."""
        import csv
        import io

        from sim.atomic_write import write_file

        path = self.out_dir / TRIALS
        rows = list(self.rows.values())
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(dict.fromkeys(name for row in rows for name in row)),
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows({name: _cell(value) for name, value in row.items()} for row in rows)
        write_file(path, buffer.getvalue())
        return path


def _cell(value):
    """A trials.csv cell: a missing or NaN figure is empty (as a CSV reader's null)."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def same_run(a: dict, b: dict) -> bool:
    """Two runs with identical results (NaN equal to NaN): the difference between their policies never
    acted, e.g. a band the batch size never reached."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
