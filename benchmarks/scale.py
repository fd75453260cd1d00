"""How specbatch scales: 10k, 100k and 1M requests end to end, where the time goes, peak memory.

    python benchmarks/scale.py                                   # every case, into runs/benchmarks/scale.json
    python benchmarks/scale.py --update                          # the same, into the tracked benchmarks/results/scale.json
    python benchmarks/scale.py --sizes 10000 100000 --cases fixed --out /tmp/scale.json
    python benchmarks/scale.py --cases fixed --sizes 10000 200000 1000000 --against /tmp/before --repeat 3 --update --keep

Each measurement is one fresh process running what ``specbatch run --num-requests N``
runs (the default scenario: the H100 profile, the chat workload, fixed k = 3, max batch
256, 18 req/s; records written as CSV), split into

* start-up: imports (numba's included), the config, ``prepare`` (profile, fitted curves and step
  table, the workload), with the fit cache warm, as every run after a profile's first finds it;
* engine: the serving loop;
* metrics: the summary and the request table from the records;
* writing: the run folder (requests.csv, steps.csv, summary.json, config.toml), after the engine
  and metrics (a long single replica writes most of steps.csv while its engine runs and keeps no
  steps in memory, as ``specbatch run`` does: its engine and metrics time then includes what that
  costs them);

plus steps per second of the engine and the process's peak RSS. The cases: ``fixed``
(the default), ``goodput`` (the policy that prices every step), ``replicas`` (4 replicas
round-robin at 4x the rate) and ``trace`` (the 1M default requests read back from a CSV
trace, issue 14). One cold start (no cache: imports, fit and tabulation) is measured
once. README.md quotes the tracked JSON through docs/generate.py's ``scale`` block; only
``--update`` writes it (a trial run goes to runs/benchmarks/, which git ignores).

The yardstick: a bare SimPy loop of 1M timeouts (one process yielding ``env.timeout`` a million
times, ``env.run()`` timed in a fresh process); a 200k-request run's whole run is quoted as a
multiple of it. ``--against DIR`` measures each case and size with another checkout's code too
(e.g. ``git worktree add --detach /tmp/before main``), in turns with this one's, ``--repeat`` times
each (medians), and records both, which the table quotes. Children run without
``PYTHONDONTWRITEBYTECODE`` (with Python's bytecode cached, as an installed package runs). Each
checkout's engine is compiled before the first measurement, and the benchmark stops with an error
where a checkout's rule files change under it (its runs would compile afresh, minutes in a figure).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # before any import of ours: start-up counts the imports

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
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
    try:
        from specbatch.commands import outputs
    except ImportError:  # a checkout from before the commands moved out of sim/ (0356564)
        from sim.commands import outputs
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
    from sim.jit import wants_compiled

    wants_compiled(run.config.engine.jit)  # numba's import is start-up, not the metrics after the engine
    prepared = time.perf_counter()
    peaks = {"startup": peak_mb()}
    # as specbatch run writes: steps.csv while the engine runs, where it applies (not in older checkouts)
    StepsFile = getattr(outputs, "StepsFile", None)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "run"
        folder.mkdir()
        # as specbatch run: its steps kept only in their file, the summary from their totals
        steps_file = StepsFile.for_run(run, folder, False) if StepsFile is not None else None
        result = execute(run, steps_sink=steps_file) if steps_file is not None else execute(run)
        executed = time.perf_counter()
        peaks["engine_and_metrics"] = peak_mb()
        if steps_file is not None:
            outputs.fill_run_folder(result, folder, steps_file)
            steps_file.close()
        else:
            outputs.write_run(result, Path(scratch) / "written")
        written = time.perf_counter()
    peaks["writing"] = peak_mb()
    engine = result.engine_wall_s
    steps = int(result.summary["num_steps"])
    return {"case": case, "requests": len(run.requests), "steps": steps,
            "import_s": imported - STARTED, "startup_s": prepared - STARTED, "engine_s": engine,
            "metrics_s": executed - prepared - engine, "write_s": written - executed,
            "total_s": written - STARTED, "steps_per_s": steps / engine,
            "peak_rss_mb": peak_mb(), "peak_rss_mb_after": peaks}


def bare_simpy(timeouts: int = 1_000_000) -> float:
    """Seconds of ``env.run()`` over one process yielding ``timeouts`` timeouts (in this fresh process)."""
    import simpy

    env = simpy.Environment()

    def ticks(env):
        for _ in range(timeouts):
            yield env.timeout(1)

    env.process(ticks(env))
    started = time.perf_counter()
    env.run()
    return time.perf_counter() - started


def child_env(checkout: Path | None = None, cache: str | None = None) -> dict:
    """A child's environment: this checkout's code (or ``checkout``'s), bytecode cached as installed."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(checkout), os.environ.get("PYTHONPATH"))))
    if cache is not None:
        env["SPECBATCH_CACHE_DIR"] = cache
    return env


def measure(case: str, size: int, trace: str | None = None, cache: str | None = None,
            checkout: Path | None = None) -> dict:
    env = child_env(checkout, cache)
    argv = [sys.executable, __file__, "--child", case, str(size)] + (["--trace", trace] if trace else [])
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=checkout or ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_s"] = time.perf_counter() - started  # the interpreter's own start included
    return row


def warm_compiled(checkout: Path) -> str:
    """Compile ``checkout``'s engine into its own cache folder now (nothing to do where it is warm), so
    that no measured run of that code compiles, or runs interpreted while a background warm-up does.
    Returns that folder (:func:`check_unchanged` holds the measurements to it)."""
    env = {**child_env(checkout), "SPECBATCH_BACKGROUND_COMPILE": "0"}
    subprocess.run([sys.executable, "-m", "sim.warm"], cwd=checkout, env=env, check=True, capture_output=True)
    return compiled_folder(checkout)


def compiled_folder(checkout: Path) -> str:
    """``checkout``'s compiled-code folder, which sim/jit.py keys by the bytes of its rule files."""
    done = subprocess.run([sys.executable, "-c", "from sim import jit; print(jit.cache_folder())"], cwd=checkout,
                          env=child_env(checkout), check=True, capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1]


def check_unchanged(folders: dict[Path, str]) -> None:
    """Stop where a checkout's rule files changed since :func:`warm_compiled`: its compiled code is another
    folder's, so the runs measured since compiled it afresh (minutes, in the figures) or ran interpreted."""
    for checkout, folder in folders.items():
        if compiled_folder(checkout) != folder:
            raise SystemExit(f"error: {checkout}: its engine's code changed while it was measured (the compiled "
                             f"code's folder is keyed by the rule files), so its runs compiled it afresh; "
                             f"measure again")


def alternated(case: str, size: int, trace: str | None, against: Path | None, repeat: int) -> dict:
    """The median (by whole run) of ``repeat`` measurements; with ``against``, that checkout's too, taken in
    turns with this one's (before, after, before, ...), under the row's ``before``."""
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(repeat):
        if against is not None:
            runs["before"].append(measure(case, size, trace, checkout=against))
        runs["after"].append(measure(case, size, trace))

    def median(rows: list[dict]) -> dict:
        return sorted(rows, key=lambda r: r["total_s"])[(len(rows) - 1) // 2]

    row = median(runs["after"])
    if against is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=against, capture_output=True, text=True)
        keys = ("startup_s", "engine_s", "metrics_s", "write_s", "total_s", "peak_rss_mb")
        row["before"] = {"commit": commit.stdout.strip() or None, "runs": repeat,
                         **{key: median(runs["before"])[key] for key in keys}}
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
    yardstick = next((r for r in doc["rows"] if r["case"] == "fixed" and r["requests"] == 200_000), None)
    # the SimPy loop timed beside that row (a row kept from an earlier invocation keeps its own)
    simpy_s = (yardstick or {}).get("simpy_1m_timeouts_s", doc.get("simpy_1m_timeouts_s"))
    if simpy_s and yardstick:
        rows.append(f"200,000 requests end to end take {yardstick['total_s']:.2f} s, {yardstick['total_s'] / simpy_s:.1f}× "
                    f"a bare SimPy loop of 1M timeouts ({simpy_s:.2f} s), at {yardstick['peak_rss_mb']:,.0f} MB peak.")
    checked = [r for r in sorted(doc["rows"], key=lambda r: (list(CASES).index(r["case"]), r["requests"]))
               if "before" in r]
    # Rows kept from an earlier invocation (--keep) were checked against the code before them: one note per commit.
    for commit in dict.fromkeys(r["before"]["commit"] for r in checked):
        rows.append("Checked against the code before (" + str(commit) + ") in alternating runs, "
                    "medians of the whole run, before → after: " + "; ".join(
                        f"{CASES[r['case']][0]} at {r['requests']:,}: {r['before']['total_s']:.2f} s → {r['total_s']:.2f} s "
                        f"({r['before']['total_s'] / r['total_s']:.2f}×, {r['before']['runs']} "
                        f"run{'s' if r['before']['runs'] > 1 else ''} each), peak {r['before']['peak_rss_mb']:,.0f} → "
                        f"{r['peak_rss_mb']:,.0f} MB" for r in checked if r["before"]["commit"] == commit) + ".")
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
    if len(sys.argv) > 1 and sys.argv[1] == "--simpy":
        print(json.dumps(bare_simpy()))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--out", type=Path, default=None, help=f"results JSON (default {SCRATCH.relative_to(ROOT)})")
    parser.add_argument("--update", action="store_true",
                        help=f"write the tracked {RESULTS.relative_to(ROOT)} (then run python docs/generate.py)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the rows of --out that this invocation does not measure again (and its cold "
                             "start, unless the fixed row it is quoted beside is measured again)")
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout (e.g. of main) measured in turns with this one, each case and size")
    parser.add_argument("--repeat", type=int, default=1, help="measurements of each case and size (medians)")
    args = parser.parse_args()
    if args.update and args.out is not None:
        parser.error("--update writes the tracked results; it takes no --out")
    args.out = RESULTS if args.update else args.out or SCRATCH
    kept = json.loads(args.out.read_text()) if args.keep and args.out.is_file() else {"rows": []}
    rows = [r for r in kept["rows"] if r["case"] not in args.cases or
            r["requests"] not in ([max(args.sizes)] if r["case"] == "trace" else args.sizes)]
    simpy_runs = [json.loads(subprocess.run([sys.executable, __file__, "--simpy"], env=child_env(), check=True,
                                            capture_output=True, text=True).stdout) for _ in range(3)]
    doc = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": machine(),
           "load_average_at_start": os.getloadavg()[0], "simpy_1m_timeouts_s": statistics.median(simpy_runs),
           "rows": rows}
    print(f"bare SimPy loop of 1M timeouts: {doc['simpy_1m_timeouts_s']:.2f} s (median of 3)", flush=True)
    folders = {checkout: warm_compiled(checkout) for checkout in filter(None, (ROOT, args.against))}
    with tempfile.TemporaryDirectory() as scratch:
        # the cold start is kept beside the warm start it is quoted with: both come from the smallest fixed row
        warm_row_again = "fixed" in args.cases and min(args.sizes) == kept.get("cold_start", {}).get("requests")
        if args.keep and "cold_start" in kept and not warm_row_again:
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
                row = alternated(case, size, trace, args.against, args.repeat)
                check_unchanged(folders)
                row["load_average"] = os.getloadavg()[0]  # other work on the machine slows every figure
                row["simpy_1m_timeouts_s"] = doc["simpy_1m_timeouts_s"]  # the yardstick of this invocation
                rows.append(row)
                if case == "fixed" and size == cold["requests"]:  # the warm start quoted beside the cold one
                    doc.update(warm_start_s=row["startup_s"], warm_import_s=row["import_s"])
                print(f"{case:>8} {row['requests']:>9,} requests {row['steps']:>10,} steps: start-up "
                      f"{row['startup_s']:.2f} s, engine {row['engine_s']:.1f} s, metrics {row['metrics_s']:.2f} s, "
                      f"writing {row['write_s']:.2f} s, whole {row['total_s']:.1f} s; {row['steps_per_s']:,.0f} "
                      f"steps/s; peak RSS {row['peak_rss_mb']:,.0f} MB", flush=True)
                if "before" in row:
                    b = row["before"]
                    print(f"{'before':>8} ({b['commit']}): whole {b['total_s']:.1f} s, engine {b['engine_s']:.1f} s, "
                          f"metrics {b['metrics_s']:.2f} s, writing {b['write_s']:.2f} s; peak RSS {b['peak_rss_mb']:,.0f} MB; "
                          f"before / after {b['total_s'] / row['total_s']:.2f}x", flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(doc, indent=2) + "\n")  # after each row: a long run keeps what it has
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
