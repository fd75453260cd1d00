"""The simulator against real replays on this machine: every case, its errors, one table.

    python benchmarks/validation.py [--out runs/validation-bench] [--profile DIR] [--quick]

Calibrates llama-160m / llama-68m on the CPU (unless --profile names a profile), then
runs ``specbatch validate`` for static and continuous batching x none / fixed k=3 /
goodput x a low and a high load, and prints, per case, the simulated-vs-real error of
mean E2EL, p99 E2EL and output throughput, raw and speed-corrected (the simulation on
the profile scaled by the speed the device ran the timed passes at during that replay).
Each case is stored in its own folder, so a killed run resumes with the missing cases.
Run it on a machine with nothing else running: the replays are real time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sim.commands.cli import main as specbatch

GRID = ["--target", "llama-160m", "--draft", "llama-68m", "--device", "cpu", "--batch-sizes", "1,2,4,8",
        "--k-max", "4", "--contexts", "16,64,128", "--prompts", "16,32,64", "--max-prefill-tokens", "512",
        "--repeats", "7", "--warmup", "2", "--threads", "1", "--quiet"]
WORKLOAD = ["--prompt-tokens", "uniform:16:64", "--output-tokens", "uniform:8:40", "--max-batch-size", "8",
            "--alpha", "0.7", "--seed", "1"]
POLICIES = {"none": ["--policy", "none"], "fixed-k3": ["--policy", "fixed", "--k", "3"],
            "goodput": ["--policy", "goodput"]}
LOADS = {"continuous": {"low": (0.3, 50), "high": (1.5, 60)},  # (req/s, requests)
         "static": {"low": (0.3, 50), "high": (1.0, 60)}}
SHOWN = (("mean_e2el_ms", "mean E2EL"), ("p99_e2el_ms", "p99 E2EL"), ("output_throughput", "output tput"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/validation-bench")
    parser.add_argument("--profile", help="a CPU profile of llama-160m / llama-68m (default: calibrate one)")
    parser.add_argument("--quick", action="store_true", help="a third of the requests per case")
    args = parser.parse_args()
    out = Path(args.out)
    profile = Path(args.profile) if args.profile else out / "profile"
    if not (profile / "profile.json").is_file():
        print(f"calibrating {profile} ...", file=sys.stderr)
        if specbatch(["calibrate", *GRID, "--out", str(profile)]) != 0:
            return 1
    rows, started = [], time.perf_counter()
    for batching, loads in LOADS.items():
        for load, (rate, n) in loads.items():
            for policy, flags in POLICIES.items():
                case = out / f"{batching}-{policy}-{load}"
                if not (case / "validation.json").is_file():
                    n_req = max(12, n // 3) if args.quick else n
                    code = specbatch(["validate", "--profile", str(profile), "--batching", batching, "--rate",
                                      str(rate), "--num-requests", str(n_req), *WORKLOAD, *flags,
                                      "--out", str(case)])
                    if code != 0:
                        return code
                doc = json.loads((case / "validation.json").read_text())
                rows.append((batching, policy, load, rate, doc))
    print(f"\n{'case':32} {'speed':>6}  " + "  ".join(f"{label:>19}" for _, label in SHOWN))
    print(f"{'':32} {'':>6}  " + "  ".join(f"{'raw':>9} {'corr.':>9}" for _ in SHOWN))
    for batching, policy, load, rate, doc in rows:
        metrics = {m["metric"]: m for m in doc["metrics"]}
        cells = "  ".join(f"{100 * metrics[key]['relative_error']:+8.1f}% {100 * metrics[key]['speed_corrected_error']:+8.1f}%"
                          for key, _ in SHOWN)
        name = f"{batching} {policy} {load} ({rate:g}/s)"
        print(f"{name:32} {doc['replay']['pass_speed_ratio']:6.3f}  {cells}")
    print(f"({len(rows)} cases; {time.perf_counter() - started:.0f} s this run; error = (simulated - real) / real; "
          "speed = timed passes in the replay / their calibrated time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
