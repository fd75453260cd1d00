"""How specbatch scales: 10k, 100k and 1M requests end to end, where the time goes, peak memory.

    python benchmarks/scale.py                                   # every case, into runs/benchmarks/scale.json
    python benchmarks/scale.py --update                          # the same, into the tracked benchmarks/results/scale.json
    python benchmarks/scale.py --sizes 10000 100000 --cases fixed --out /tmp/scale.json

Each measurement is one fresh process running what ``specbatch run --num-requests N``
runs (the default scenario: the H100 profile, the chat workload, fixed k = 3, max batch
256, 18 req/s; records written as CSV), split into

* start-up: imports, the config, ``prepare`` (profile, fitted curves and step table, the
  workload), with the fit cache warm, as every run after a profile's first finds it;
* engine: the serving loop;
* metrics: the summary and the request table from the records;
* writing: the run folder (requests.csv, steps.csv, summary.json, config.toml);

plus steps per second of the engine and the process's peak RSS. The cases: ``fixed``
(the default), ``goodput`` (the policy that prices every step), ``replicas`` (4 replicas
round-robin at 4x the rate) and ``trace`` (the 1M default requests read back from a CSV
trace, issue 14). One cold start (no cache: imports, fit and tabulation) is measured
once. README.md quotes the tracked JSON through docs/generate.py's ``scale`` block; only
``--update`` writes it (a trial run goes to runs/benchmarks/, which git ignores).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # before any import of ours: start-up counts the imports

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "scale.json"  # tracked: written with --update
SCRATCH = ROOT / "runs" / "benchmarks" / "scale.json"    # otherwise
SIZES = (10_000, 100_000, 1_000_000)
CASES = {  # name: (label, run flags as config overrides)
    "fixed": ("default (`fixed`, k = 3)", {}),
    "goodput": ("`goodput`", {"policy.name": "goodput"}),
    "replicas": ("4 replicas, 4x the rate", {"cluster.replicas": 4, "workload.rate": 72.0}),
    "trace": ("from a CSV trace", {}),
}


def child(case: str, size: int, trace: str | None) -> dict:
    """One measurement, in this (fresh) process."""
    from specbatch.commands.outputs import write_run
    from sim.config import load_config
    from sim.simulate import execute, prepare

    def peak_mb() -> float:
        """This process's peak RSS: VmHWM (ru_maxrss would count the forking parent's RSS too)."""
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    imported = time.perf_counter()
    overrides = {key: (value, "scale.py") for key, value in CASES[case][1].items()}
    if trace:
        overrides["workload.trace"] = (trace, "scale.py")
    else:
        overrides["workload.num_requests"] = (size, "scale.py")
    run = prepare(load_config(None, overrides))
    prepared = time.perf_counter()
    peaks = {"startup": peak_mb()}
    result = execute(run)
    executed = time.perf_counter()
    peaks["engine_and_metrics"] = peak_mb()
    with tempfile.TemporaryDirectory() as scratch:
        write_run(result, Path(scratch) / "run")
        written = time.perf_counter()
    peaks["writing"] = peak_mb()
    engine = result.engine_wall_s
    steps = int(result.summary["num_steps"])
    return {"case": case, "requests": len(run.requests), "steps": steps,
            "import_s": imported - STARTED, "startup_s": prepared - STARTED, "engine_s": engine,
            "metrics_s": executed - prepared - engine, "write_s": written - executed,
            "total_s": written - STARTED, "steps_per_s": steps / engine,
            "peak_rss_mb": peak_mb(), "peak_rss_mb_after": peaks}


def measure(case: str, size: int, trace: str | None = None, cache: str | None = None) -> dict:
    env = dict(os.environ)
    if cache is not None:
        env["SPECBATCH_CACHE_DIR"] = cache
    argv = [sys.executable, __file__, "--child", case, str(size)] + (["--trace", trace] if trace else [])
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - started  # the interpreter's own start included
    return row


def warm(case: str, size: int, trace: str | None) -> None:
    """Fill the fit cache for this case as a previous run would have (prepare only)."""
    from sim.config import load_config
    from sim.simulate import prepare

    overrides = {key: (value, "scale.py") for key, value in CASES[case][1].items()}
    overrides.update({"workload.trace": (trace, "-")} if trace else {"workload.num_requests": (size, "-")})
    prepare(load_config(None, overrides))


def write_default_trace(size: int, path: Path) -> None:
    """The default scenario's first ``size`` requests as a trace file (what --trace replays)."""
    from sim.config import load_config
    from sim.simulate import prepare
    from workloads import write_trace

    write_trace(path, prepare(load_config(None, {"workload.num_requests": (size, "-")})).requests)


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    import numpy
    import pyarrow

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"cpu": model, "cores": os.cpu_count(), "system": platform.platform(),
            "python": platform.python_version(), "numpy": numpy.__version__, "pyarrow": pyarrow.__version__,
            "commit": commit.stdout.strip() or None}


def table(doc: dict) -> str:
    """The README's table (docs/generate.py's ``scale`` block)."""
    rows = ["| case | requests | engine steps | start-up | engine | metrics | writing | whole run "
            "| engine steps/s | peak RSS |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(doc["rows"], key=lambda r: (list(CASES).index(r["case"]), r["requests"])):
        rows.append(f"| {CASES[r['case']][0]} | {r['requests']:,} | {r['steps']:,} | {r['startup_s']:.2f} s "
                    f"| {r['engine_s']:.1f} s | {r['metrics_s']:.2f} s | {r['write_s']:.2f} s "
                    f"| **{r['total_s']:.1f} s** | {r['steps_per_s']:,.0f} | {r['peak_rss_mb']:,.0f} MB |")
    cold = doc.get("cold_start")
    loads = [f"{r['load_average']:.1f}" for r in doc["rows"] if "load_average" in r]
    low, high = (min(loads, key=float), max(loads, key=float)) if loads else (None, None)
    rows.append("")
    if cold:
        rows.append(f"Start-up without the fit cache (a profile's first run on a machine): {cold['startup_s']:.2f} s "
                    f"(imports {cold['import_s']:.2f} s); with it: {doc['warm_start_s']:.2f} s "
                    f"(imports {doc['warm_import_s']:.2f} s).")
    machine = doc["machine"]
    rows.append(f"Measured {doc['date']} with `python benchmarks/scale.py` on {machine['cpu']} ({machine['cores']} "
                f"cores), Python {machine['python']}, numpy {machine['numpy']}, pyarrow {machine['pyarrow']}"
                + (f"; the machine was shared, with a 1-minute load average of {low if low == high else f'{low}–{high}'} "
                   f"during the runs, so times are upper bounds (peak RSS does not depend on load)" if loads else "")
                + ".")
    return "\n".join(rows) + "\n"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        trace = sys.argv[sys.argv.index("--trace") + 1] if "--trace" in sys.argv else None
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), trace)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", type=Path, default=None, help=f"results JSON (default {SCRATCH.relative_to(ROOT)})")
    parser.add_argument("--update", action="store_true",
                        help=f"write the tracked {RESULTS.relative_to(ROOT)} (then run python docs/generate.py)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the rows of --out that this invocation does not measure again (and its cold start)")
    args = parser.parse_args()
    if args.update and args.out is not None:
        parser.error("--update writes the tracked results; it takes no --out")
    args.out = RESULTS if args.update else args.out or SCRATCH
    kept = json.loads(args.out.read_text()) if args.keep and args.out.is_file() else {"rows": []}
    rows = [r for r in kept["rows"] if r["case"] not in args.cases or
            r["requests"] not in ([max(args.sizes)] if r["case"] == "trace" else args.sizes)]
    doc = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": machine(),
           "load_average_at_start": os.getloadavg()[0], "rows": rows}
    with tempfile.TemporaryDirectory() as scratch:
        if args.keep and "cold_start" in kept:
            cold = kept["cold_start"]
            doc.update({key: kept.get(key) for key in ("cold_start", "warm_start_s", "warm_import_s")})
        else:
            cold = measure("fixed", min(args.sizes), cache="")
            doc.update(cold_start=cold, warm_start_s=None, warm_import_s=None)
        print(f"cold start (no fit cache): start-up {cold['startup_s']:.2f} s, imports {cold['import_s']:.2f} s",
              flush=True)
        for case in args.cases:
            sizes = [max(args.sizes)] if case == "trace" else args.sizes
            for size in sizes:
                trace = None
                if case == "trace":
                    trace = str(Path(scratch) / f"trace-{size}.csv")
                    write_default_trace(size, Path(trace))
                warm(case, size, trace)
                row = measure(case, size, trace)
                row["load_average"] = os.getloadavg()[0]  # other work on the machine slows every figure
                rows.append(row)
                if case == "fixed" and size == min(args.sizes):
                    doc.update(warm_start_s=row["startup_s"], warm_import_s=row["import_s"])
                print(f"{case:>8} {row['requests']:>9,} requests {row['steps']:>10,} steps: start-up "
                      f"{row['startup_s']:.2f} s, engine {row['engine_s']:.1f} s, metrics {row['metrics_s']:.2f} s, "
                      f"writing {row['write_s']:.2f} s, whole {row['total_s']:.1f} s; {row['steps_per_s']:,.0f} "
                      f"steps/s; peak RSS {row['peak_rss_mb']:,.0f} MB", flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(doc, indent=2) + "\n")  # after each row: a long run keeps what it has
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
