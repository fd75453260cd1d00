"""``specbatch sweep SWEEP.toml``: the command line of a sweep (registered in specbatch.commands.cli.COMMANDS)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.errors import InputError
from sim.limits import MAX_WORKERS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", help="sweep file (TOML): a base scenario and the axes to vary")
    parser.add_argument("--out", default=None,
                        help="output folder (default sweeps/<sweep file name>); rerunning resumes there")
    parser.add_argument("--executor", choices=("pool", "serial"), default=None,
                        help="pool: a local process pool (the default); serial: in this process")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes of the pool or of --dask local (default: all cores)")
    parser.add_argument("--dask", metavar="ADDRESS", default=None,
                        help="run on a Dask distributed scheduler at ADDRESS, or 'local' for a LocalCluster")
    parser.add_argument("--csv", action="store_true", help="also write sweep.csv")
    parser.add_argument("--retry-failed", action="store_true",
                        help="run again the cells stored as failed (by default they are kept)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from specbatch.commands.sweep.executors import have_dask
    from specbatch.commands.sweep.runner import run_sweep
    from specbatch.commands.sweep.spec import load_sweep
    from specbatch.commands.sweep.store import have_pyarrow

    if args.dask is not None and args.executor is not None:
        raise InputError("give either --executor or --dask, not both", source="--dask")
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise InputError(f"must be from 1 to {MAX_WORKERS}, got {args.workers}", source="--workers")
    if args.dask is not None and not have_dask():
        raise InputError("needs dask.distributed: pip install 'specbatch[sweep]'", source="--dask")
    from sim.atomic_write import check_output, output_lock

    sweep = load_sweep(args.sweep)  # every cell resolved: bad input fails here, before any cell runs
    parquet = have_pyarrow()
    if not parquet:
        print("warning: pyarrow is not installed, so the table is written as sweep.csv instead of "
              "sweep.parquet (pip install 'specbatch[sweep]' for Parquet)", file=sys.stderr)
    out = Path(args.out) if args.out else Path("sweeps") / Path(args.sweep).stem
    source = f"--out {out}" if args.out else None
    check_output(out, folder=True, field="out", source=source)
    executor = "dask" if args.dask is not None else (args.executor or "pool")
    try:
        with output_lock(out, field="out", source=source):  # two sweeps into one folder: the second is refused
            report = run_sweep(sweep, out, executor=executor, workers=args.workers, dask_address=args.dask,
                               retry_failed=args.retry_failed, parquet=parquet, csv=args.csv or not parquet,
                               progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"interrupted: the cells finished so far are in {out / 'cells'}; the same command resumes",
              file=sys.stderr)
        return 130
    for error in sorted(set(report.table.loc[report.table.status != "ok", "error"])):
        print(f"failed: {error}", file=sys.stderr)
    rate = report.ran / report.wall_s if report.wall_s > 0 else 0.0
    print(f"{report.cells} cells ({report.ran} run now, {report.stored} from the store, {report.failed} failed) "
          f"in {report.wall_s:.1f} s wall, {rate:.2f} cells/s")
    print("Wrote " + ", ".join(str(p) for p in report.written))
    return 0
