"""How fast `specbatch tune` runs: a 10,000-request scenario, 8 batch-size bands x k 0..7.

    python benchmarks/tune_speed.py                          # the default scenario, a process pool
    python benchmarks/tune_speed.py --executor serial        # in one process
    python benchmarks/tune_speed.py --rate 6 --repeat 3      # another load; the median of 3 runs
    python benchmarks/tune_speed.py --repeat 3 --update      # also write benchmarks/results/tune_speed.txt
    python benchmarks/tune_speed.py --rate 20 --requests 3000 --repeat 3 --against /tmp/before
                                                             # issue 36's tune, alternating with another checkout

Each run is a whole `specbatch tune` process (start-up, the search on 3 seeds, the held-out
check of the tuned schedule and 11 baselines on 3 more, the report) into a fresh temporary
folder, so nothing comes from a store. The scenario is the shipped default (the H100
profile, Poisson arrivals at 18 req/s, chat-like lengths, max batch 256) with 10,000
requests per run. The target (issue 30): under 2 minutes on a 2-core machine; issue 36's, for
``--rate 20 --requests 3000``: at most 10 s. ``--against DIR`` alternates runs of another
checkout's code (before) with this one's (after) and prints both medians
(benchmarks/alternate.py). The figures are printed; ``--update`` also writes them to
benchmarks/results/tune_speed.txt (or, with ``--results``, another file), which docs/tune.md shows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from alternate import cli_module, machine_line, medians, order, run_timed


def tune(folder: Path, args: argparse.Namespace, checkout: Path | None) -> tuple[float, dict]:
    command = ["-m", cli_module(checkout), "tune", "--num-requests", str(args.requests), "--bands", "8",
               "--k-max", "7", "--no-progress", "--out", str(folder)]
    if args.rate is not None:
        command += ["--rate", str(args.rate)]
    command += ["--executor", args.executor] + (["--workers", str(args.workers)] if args.workers else [])
    wall = run_timed(command, checkout)
    return wall, json.loads((folder / "tune.json").read_text())


RESULTS = Path(__file__).resolve().parent / "results" / "tune_speed.txt"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests per run (default 10,000)")
    parser.add_argument("--rate", type=float, default=None, help="req/s (default: the scenario's, 18)")
    parser.add_argument("--executor", choices=("pool", "serial"), default="pool")
    parser.add_argument("--workers", type=int, default=None, help="pool processes (default: all cores)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the whole command; the median is shown")
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout (e.g. of main) to alternate with this one: before, after, ...")
    parser.add_argument("--update", action="store_true", help=f"also write the figures to {RESULTS.name}")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the file --update writes")
    args = parser.parse_args()
    lines = [machine_line(f"executor {args.executor}")]
    print(lines[0])
    walls: dict[str, list[float]] = {}
    for name, checkout in order(args.repeat, args.against):
        with tempfile.TemporaryDirectory(prefix="tune-speed-") as tmp:
            wall, doc = tune(Path(tmp) / "tune", args, checkout)
        walls.setdefault(name, []).append(wall)
        search = doc["search"]
        holdout = len(doc["holdout"]) * len(doc["seeds"]["holdout"])
        runs = search["runs"] + holdout
        who = "" if args.against is None else f"{name}: "
        for line in (f"{who}{args.requests:,} requests per run, {len(doc['space']['bands'])} bands x k "
                     f"{doc['space']['k_values'][0]}..{doc['space']['k_values'][-1]}: {runs} runs ({search['runs']} in "
                     f"the search, {holdout} held-out) in {wall:.1f} s wall (whole process), {runs / wall:.2f} runs/s; "
                     f"passes {search['passes']}, moves {len(search['moves'])}, cells skipped {search['skipped_cells']}",
                     f"  tuned: {doc['schedule']['text']}; {doc['verdict']}"):
            print(line, flush=True)
            lines.append(line)
    summary = medians(walls) if args.against is not None else \
        [f"median of {args.repeat} whole-process runs: {statistics.median(walls[name]):.1f} s wall"] \
        if args.repeat > 1 else []
    lines += summary
    print("\n".join(summary))
    if args.update:
        from sim.atomic_write import write_file

        write_file(args.results, "\n".join(lines) + "\n")
        print(f"Wrote {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
