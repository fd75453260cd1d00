"""How fast `specbatch capacity` answers: the default profile and policies, two SLOs (issue 36).

    python benchmarks/capacity_speed.py                                  # once, this checkout
    python benchmarks/capacity_speed.py --repeat 3 --against /tmp/before  # before, after, ... x 3; medians
    python benchmarks/capacity_speed.py --repeat 3 --against /tmp/before --update   # also write the results file

Each run is a whole ``specbatch capacity --slo p99_ttft_ms=1000 --slo p90_tpot_ms=40`` process
(start-up, the saturation probes, the search on 2 worker processes, the curves, the report
with its figures) into a fresh temporary folder. Besides the wall time it prints what the
time grows with, read from the run's capacity.json: runs and requests simulated per policy
(for code older than the ``requests_simulated`` field, counted from the evidence: every
look's requests, the probe and the operating point's rerun), and each policy's max rate, which
must not move. The target (issue 36): at most 10 s on 2 cores. ``--update`` writes the lines
to benchmarks/results/capacity_speed.txt, which docs/capacity.md shows.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from alternate import cli_module, machine_line, medians, order, run_timed

RESULTS = Path(__file__).resolve().parent / "results" / "capacity_speed.txt"
SLOS = ("p99_ttft_ms=1000", "p90_tpot_ms=40")
PROBE_BATCHES = 20  # specbatch.commands.capacity.search's, for counting an older report's probe


def requests_of(policy: dict, seeds: int, min_requests: int, max_batch: int) -> tuple[int, bool]:
    """Requests a policy's search simulated, and whether that is counted from the evidence (older code)."""
    if "requests_simulated" in policy:
        return policy["requests_simulated"], False
    total = max(min_requests, PROBE_BATCHES * max_batch)
    for point in policy["points"]:
        runs = 1 if point["curve_point"] else seeds
        total += runs * (point["requests_per_seed"] + (point["first_requests_per_seed"] if point["look"] else 0))
    top = max((p for p in policy["points"] if not p["curve_point"] and p["verdict"] == "pass"),
              key=lambda p: p["rate_req_s"], default=None)
    return total + (top["requests_per_seed"] if top else 0), True  # the operating point's rerun, first seed


def describe(doc: dict, max_batch: int) -> str:
    search = doc["search"]
    parts, runs, requests, counted = [], 0, 0, False
    for profile in doc["profiles"].values():
        for label, policy in profile["policies"].items():
            n, guessed = requests_of(policy, len(search["seeds"]), search["min_requests"], max_batch)
            runs, requests, counted = runs + policy["runs"], requests + n, counted or guessed
            parts.append(f"{label} {policy['max_rate_req_s']:.4g} req/s ({policy['runs']} runs, {n:,} requests)")
    return f"{runs} runs, {'~' if counted else ''}{requests:,} requests: " + "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each checkout; medians are shown")
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout (e.g. of main) to alternate with this one: before, after, ...")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--update", action="store_true", help=f"also write the lines to {RESULTS.name}")
    args = parser.parse_args()
    from sim.config import load_config

    max_batch = load_config(None, {}).engine.max_batch_size
    command = ["specbatch capacity " + " ".join(f"--slo {s}" for s in SLOS) + f" --jobs {args.jobs}"]
    lines = [machine_line(f"--jobs {args.jobs}"), f"command: {command[0]}"]  # no "$ ": the docs show the file
    print("\n".join(lines))
    walls: dict[str, list[float]] = {}
    for name, checkout in order(args.repeat, args.against):
        with tempfile.TemporaryDirectory(prefix="capacity-speed-") as tmp:
            out = Path(tmp) / "capacity"
            argv = ["-m", cli_module(checkout), "capacity", *(w for s in SLOS for w in ("--slo", s)),
                    "--jobs", str(args.jobs), "--quiet", "--out", str(out)]
            wall = run_timed(argv, checkout)
            doc = json.loads((out / "capacity.json").read_text())
        walls.setdefault(name, []).append(wall)
        lines.append(f"{name}: {wall:.1f} s wall (whole process); {describe(doc, max_batch)}")
        print(lines[-1], flush=True)
    lines += medians(walls)
    print("\n".join(lines[-len(walls) - (len(walls) > 1):]))
    if args.update:
        from sim.atomic_write import write_file

        write_file(RESULTS, "\n".join(lines) + "\n")
        print(f"Wrote {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
