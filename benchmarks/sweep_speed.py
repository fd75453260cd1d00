"""How fast a sweep runs: wall time and cells per second for a policy x rate x seed grid.

    python benchmarks/sweep_speed.py                     # 5 policies x 4 rates x 10 seeds = 200 cells, pool
    python benchmarks/sweep_speed.py --dask local        # then the same sweep on a Dask LocalCluster

The grid is written to a temporary folder (small scenarios: 40 requests of 64/64
tokens on the shipped CPU profile) and run by ``specbatch sweep`` with its default
executor, a process pool over all cores, into a fresh output folder. With --dask it
runs again on Dask into another fresh folder and checks the two tables are identical.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from specbatch.commands.cli import main as specbatch
from specbatch.commands.sweep.store import code_version

SCENARIO = """\
[workload]
num_requests = 40
prompt_tokens = 64
output_tokens = 64
[output]
records = "none"
"""

GRID = """\
base = "scenario.toml"
[axes]
policy = ["none", {{name = "fixed", k = 1}}, {{name = "fixed", k = 3}}, {{name = "fixed", k = 5}}, "goodput"]
rate = [0.05, 0.1, 0.15, 0.2]
seed = {seeds}
"""


def run(sweep: Path, out: Path, *flags: str) -> tuple[float, pd.DataFrame]:
    started = time.perf_counter()
    code = specbatch(["sweep", str(sweep), "--out", str(out), "--no-progress", *flags])
    if code != 0:
        raise SystemExit(code)
    return time.perf_counter() - started, pd.read_parquet(out / "sweep.parquet")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--seeds", type=int, default=10, help="seeds per (policy, rate): 10 gives 200 cells")
    parser.add_argument("--workers", type=int, default=None, help="default: all cores")
    parser.add_argument("--dask", metavar="ADDRESS", default=None,
                        help="also run on Dask ('local' for a LocalCluster) and compare the tables")
    args = parser.parse_args()
    workers = ["--workers", str(args.workers)] if args.workers else []
    with tempfile.TemporaryDirectory(prefix="sweep-speed-") as tmp:
        folder = Path(tmp)
        (folder / "scenario.toml").write_text(SCENARIO)
        sweep = folder / "grid.toml"
        sweep.write_text(GRID.format(seeds=list(range(args.seeds))))
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(f"{platform.machine()}, {cores} cores, Python {platform.python_version()}", file=sys.stderr)
        version = code_version()
        wall, table = run(sweep, folder / "pool", *workers)
        cells = len(table)
        print(f"pool: {cells} cells in {wall:.1f} s wall (whole command), {cells / wall:.2f} cells/s; "
              f"{int((table.status != 'ok').sum())} failed")
        if args.dask:
            dask_wall, dask_table = run(sweep, folder / "dask", "--dask", args.dask, *workers)
            same_code = version == code_version()
            if not same_code:  # the cells' keys hash the code: an edit between the runs changes every key
                table, dask_table = table.drop(columns="key"), dask_table.drop(columns="key")
            pd.testing.assert_frame_equal(table, dask_table)
            print(f"dask ({args.dask}): {cells} cells in {dask_wall:.1f} s wall, {cells / dask_wall:.2f} cells/s; "
                  f"table identical to the pool's" + ("" if same_code else
                                                       " (but for the cell keys: the code changed between the runs)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
