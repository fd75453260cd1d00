"""Regenerate the capacity reports docs/capacity.md and the README show, or check one of their searches.

    python docs/capacity_examples.py                 # every example (minutes: the GPU comparison is the longest)
    python docs/capacity_examples.py cpu gpus        # some of them

Each example is one ``specbatch capacity`` command (below) writing its report folder under
docs/ (report.html is left out: it repeats the PNGs base64-encoded). The docs' tables are
generated blocks read from those reports (``python docs/generate.py``), so after a change
that moves the simulator's numbers, rerunning this script and then docs/generate.py is all
it takes. tests/test_capacity_examples.py reruns one policy's search of each example and
fails when the committed report is no longer what the code gives.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU = "tests/baselines/scenarios/cpu.toml"
GPU_PROFILES = "h100-llama-3.1-8b-llama-3.2-1b,h200-llama-3.1-8b-llama-3.2-1b,l40s-llama-3.1-8b-llama-3.2-1b"

# name -> (report folder, the command's arguments after `specbatch capacity`), paths relative to the repository.
EXAMPLES: dict[str, tuple[str, list[str]]] = {
    # The CPU scenario on the shipped CPU profile, the default search.
    "cpu": ("docs/capacity-example",
            ["--config", CPU, "--slo", "p99_ttft_ms=20000", "--slo", "p90_tpot_ms=800", "--target-rate", "1",
             "--gpu-hour-price", "2"]),
    # Two CPU profiles (two model pairs) for the same traffic, at one price.
    "compare": ("docs/capacity-compare-example",
                ["--config", CPU, "--profiles", "cpu-tinyllama-1.1b-llama-68m,cpu-llama-160m-llama-68m",
                 "--gpu-price", "cpu=2", "--slo", "p99_ttft_ms=20000", "--slo", "p90_tpot_ms=800", "--target-rate", "1"]),
    # The chat workload of the default scenario on the shipped composed H100, H200 and L40S profiles.
    "gpus": ("docs/capacity-gpus-example",
             ["--profiles", GPU_PROFILES, "--gpu-price", "h100=3.9,h200=4.5,l40s=1.9", "--slo", "p99_ttft_ms=2000",
              "--slo", "p90_tpot_ms=40", "--target-rate", "20"]),
    # Disaggregated prefill:decode splits against aggregated serving on the default H100 profile, under a tight
    # TPOT SLO, with and without speculation on the decode side; a lighter search (2 seeds, 5%) to stay quick.
    "pd": ("docs/capacity-pd-example",
           ["--pd-ratios", "1:1,1:2,2:3", "--policies", "none,fixed", "--slo", "p99_ttft_ms=1000", "--slo",
            "p90_tpot_ms=10", "--target-rate", "100", "--gpu-hour-price", "3.9", "--seeds", "2", "--tolerance", "0.05",
            "--curve-points", "2", "--service-times", "20"]),
}


# Examples whose wall time the docs quote: regenerating one writes what the search printed last (its wall
# time, runs and requests) with the machine it ran on, under benchmarks/results/ (the report has no wall times).
TIMED = {"pd": "benchmarks/results/capacity_pd_time.txt"}


def command(name: str) -> str:
    """The example's command line, as the docs show it."""
    folder, argv = EXAMPLES[name]
    return " ".join(["specbatch capacity", *argv, "--out", folder])


def regenerate(name: str) -> Path:
    from specbatch.commands.cli import main

    folder, argv = EXAMPLES[name]
    out = ROOT / folder
    if out.exists():
        shutil.rmtree(out)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["capacity", "--quiet", *_absolute(argv), "--out", str(out)])
    if code != 0:
        raise SystemExit(f"{name}: specbatch capacity exited {code}")
    (out / "report.html").unlink()
    if name in TIMED:
        machine = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; load average "
                   f"{os.getloadavg()[0]:.1f} at the end")
        took = printed.getvalue().splitlines()[-1].split(". Wrote")[0] + "."
        (ROOT / TIMED[name]).write_text(f"{machine}\ncommand: {command(name)}\n{took}\n")
    return out


def plan(name: str, jobs: int = 1):
    """The example's checked plan (specbatch.commands.capacity.cli.CapacityPlan), without running it."""
    from specbatch.commands.capacity.cli import add_arguments, plan_from_args

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_arguments(parser)
    return plan_from_args(parser.parse_args([*_absolute(EXAMPLES[name][1]), "--jobs", str(jobs)]))


def _absolute(argv: list[str]) -> list[str]:
    """Repository files named in the arguments, as absolute paths (the scripts run from anywhere)."""
    return [str(ROOT / a) if (ROOT / a).is_file() else a for a in argv]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"examples to regenerate (default all: {', '.join(EXAMPLES)})")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in EXAMPLES]
    if unknown:
        parser.error(f"no example {', '.join(unknown)} (known: {', '.join(EXAMPLES)})")
    for name in args.names or list(EXAMPLES):
        print(f"{name}: {command(name)}", flush=True)
        print(f"  wrote {regenerate(name).relative_to(ROOT)}/", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
