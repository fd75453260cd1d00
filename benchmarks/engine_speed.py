"""How fast the simulator runs: engine steps per second, and the whole process as a user waits for it.

    python benchmarks/engine_speed.py                    # every case, into runs/benchmarks/engine_speed.json
    python benchmarks/engine_speed.py --update           # the same, into the tracked benchmarks/results/
    python benchmarks/engine_speed.py --cases real-run v0 --repeats 5
    python benchmarks/engine_speed.py --config tests/baselines/scenarios/cpu.toml --policy goodput   # your own
    python benchmarks/engine_speed.py --cases real-run --repeats 9 --against /tmp/before --update --keep

The cases run the default engine (vLLM V1 scheduling, compiled rules; docs/performance.md):

* ``real-run``: the 16,800 requests of a real vLLM run (Llama-2-7b on an H100, the ``general``
  workload of ``../shared/validation/vllm-h100``), replayed as a trace with the run's own engine
  settings (max_num_seqs 128, a 2,048-token budget, the KV cache vLLM logged, prefix caching on
  the run's prompt ids) on the composed H100 profile. Skipped, saying so, where the data is absent.
* ``fixed``, ``goodput``, ``replicas``: the default scenario's 10,000 requests at 80% of the
  saturation rate (probed first), fixed k = 3, goodput, and 4 replicas at 4x the rate.
* ``v0``: the ``fixed`` case's workload, at its rate, under ``--scheduler v0``: V1 beside V0.
* ``step-by-step``: the ``fixed`` case's workload under ``adaptive``, a policy the compiled runs
  do not take: the loop runs step by step in Python, calling the same compiled rules
  (docs/performance.md), as any policy of your own does.
* ``cpu-fixed``, ``cpu-goodput``: the CPU profile's scenario (tests/baselines/scenarios/cpu.toml).

Per case: the engine loop's steps per second (in-process, best of ``--repeats``: the machine's
noise only ever slows a run down) and the whole process, ``specbatch run --config <the case's
config.toml>`` from start to exit (imports, the workload, the engine, metrics, writing), best of
``--repeats`` fresh processes with the caches warm (the compiled engine, the fitted curves and Python's
bytecode, as an installed package has them: ``PYTHONDONTWRITEBYTECODE`` is dropped for these
processes, which otherwise compile every module of the project from source, 0.15 s a process).
``--against DIR`` times the whole process of another checkout (e.g. ``git worktree add --detach
/tmp/before main``) in turns with this one, before, after, before, after ..., and prints and
records both medians and their ratio, which the README's table quotes. That checkout is given the
case's settings that differ from the defaults and that its code knows, so that code older than a
setting runs too (a note names what it runs without). ``--update`` writes
``benchmarks/results/engine_speed.json``, from which docs/generate.py's ``engine-speed`` block
renders the README's table; otherwise the JSON goes to ``runs/benchmarks/`` (or ``--out``).
Compare two versions of the code in alternating runs on one machine (``--against``), not across runs of
this script. ``--keep`` keeps the rows of the results file that this invocation does not measure again.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "engine_speed.json"  # tracked: written with --update
SCRATCH = ROOT / "runs" / "benchmarks" / "engine_speed.json"    # otherwise
CPU_SCENARIO = "tests/baselines/scenarios/cpu.toml"
REAL_RUN = "llama-2-7b-tp1-general"
REAL_PROFILE = "h100-llama-2-7b-llama-68m"


@dataclass(frozen=True)
class Case:
    """One row of the README's table: a scenario (config file or the default) and a policy."""

    label: str
    config: str | None = None
    policy: str = "fixed"
    k: int | None = 3
    replicas: int = 1
    rate: float | None = None
    overrides: tuple[tuple[str, object], ...] = ()  # more config keys (the scheduler, jit)
    rate_of: str | None = None  # run at this other case's rate (its workload, another engine)

    @property
    def policy_label(self) -> str:
        return f"`fixed --k {self.k}`" if self.policy == "fixed" else f"`{self.policy}`"


CASES = {
    "real-run": Case("a real vLLM run's 16,800 requests (Llama-2-7b, H100)", policy="none", k=None),
    "fixed": Case("default (H100 profile, chat traffic)"),
    "v0": Case("the same, `--scheduler v0`", overrides=(("engine.scheduler", "v0"),), rate_of="fixed"),
    "step-by-step": Case("the same, a policy run step by step", policy="adaptive", k=None, rate_of="fixed"),
    "goodput": Case("default", policy="goodput", k=None),
    "replicas": Case("default, `--replicas 4` (round-robin, 4× the rate)", replicas=4),
    "cpu-fixed": Case(f"CPU profile (`--config {CPU_SCENARIO}`, v0)", config=CPU_SCENARIO),
    "cpu-goodput": Case("CPU profile", config=CPU_SCENARIO, policy="goodput", k=None),
}


def real_run_config(data: Path, folder: Path):
    """The real run's requests as a trace (its own file, decompressed: the extra columns are ignored)
    and its engine settings, as benchmarks/real_vllm.py simulates it; None without the data."""
    from sim.config import load_config

    runs = data / "runs.json"
    if not runs.is_file():
        return None
    run = next(r for r in json.loads(runs.read_text())["runs"] if r["run"] == REAL_RUN)
    trace = folder / f"{REAL_RUN}.csv"
    with gzip.open(data / run["file"], "rb") as src, trace.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    sys.path.insert(0, str(Path(__file__).parent))
    from real_vllm import run_overrides  # the run's engine settings, as that benchmark gives them

    return load_config(None, {**run_overrides(run, REAL_PROFILE), "workload.trace": (str(trace), "benchmark"),
                              "seed": (0, "benchmark")})


def flags_of(case: Case, requests: int) -> dict:
    flags = {"workload.num_requests": (requests, "--num-requests"), "policy.name": (case.policy, "--policy"),
             "seed": (0, "--seed"), "cluster.replicas": (case.replicas, "--replicas")}
    if case.policy == "fixed":
        flags["policy.k"] = (case.k, "--k")
    if case.rate is not None:
        flags["workload.rate"] = (case.rate, "--rate")
    flags.update({key: (value, "benchmark") for key, value in case.overrides})
    return flags


def configure(case: Case, requests: int, rate: float | None = None):
    """The case's config; without a rate, one that loads the server: 80% of a saturated probe's throughput."""
    from sim.config import load_config
    from sim.simulate import execute, prepare

    flags = flags_of(case, requests)
    if rate is not None:
        flags["workload.rate"] = (rate, "--rate")
    if "workload.rate" in flags:
        return load_config(case.config, flags)
    probe = execute(prepare(load_config(case.config, {**flags, "workload.num_requests": (200, "--num-requests"),
                                                      "workload.rate": (1e6, "--rate"),
                                                      "cluster.replicas": (1, "--replicas")})))
    return load_config(case.config, {**flags, "workload.rate": (0.8 * probe.summary["request_throughput"]
                                                                * case.replicas, "--rate")})


def fastest(config, repeats: int):
    """The best of ``repeats`` in-process runs, after one that loads the compiled rules."""
    from sim.simulate import execute, prepare

    best = None
    for _ in range(repeats + 1):
        result = execute(prepare(config))
        if best is None or result.engine_wall_s < best.engine_wall_s:
            best = result
    return best


def away_from(settings: dict, defaults: dict) -> dict:
    """The settings (``table.key``, each value whole: a length distribution is one setting) of ``settings``
    whose values differ from ``defaults``, by table."""
    kept: dict = {}
    for table, values in settings.items():
        if not isinstance(values, dict):  # a top-level setting (seed, profile)
            if defaults.get(table) != values:
                kept[table] = values
            continue
        for key, value in values.items():
            if defaults.get(table, {}).get(key) != value:
                kept.setdefault(table, {})[key] = value
    return kept


@functools.lru_cache(maxsize=None)
def known_settings(checkout: Path) -> frozenset[str]:
    """The settings ``checkout``'s code knows (its config's ``KNOWN``), asked once per checkout."""
    from alternate import checkout_env

    return frozenset(json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from sim.config import KNOWN; print(json.dumps(sorted(KNOWN)))"],
        cwd=checkout, env=checkout_env(checkout), check=True, capture_output=True, text=True).stdout))


def known_to(checkout: Path, settings: dict) -> tuple[dict, list[str]]:
    """``settings`` less the keys ``checkout``'s code does not know (:func:`known_settings`; a policy's options
    are the policy's), and those keys with their values."""
    known = known_settings(checkout)
    kept: dict = {}
    unknown = []
    for table, values in settings.items():
        if not isinstance(values, dict):
            kept[table] = values
            continue
        for key, value in values.items():
            if table == "policy" or f"{table}.{key}" in known:
                kept.setdefault(table, {})[key] = value
            else:
                unknown.append(f"{table}.{key} = {value!r}")
    return kept, unknown


def whole_process(config, folder: Path, repeats: int, against: Path | None = None) -> dict[str, list[float]]:
    """Wall seconds of ``repeats`` fresh processes of ``specbatch run --config`` (after one warm-up
    each), from this checkout ("after") and, with ``against``, from that one ("before") in turns."""
    from alternate import cli_module  # (here: docs/generate.py loads this file by its path for its table)

    path = folder / "config.toml"
    path.write_text(config.to_toml())
    if against is not None:  # the code before may predate some settings: it reads those set away from the defaults
        import tomli_w
        from sim.config import load_config

        settings, unknown = known_to(against, away_from(config.to_dict(), load_config(None, {}).to_dict()))
        if unknown:
            print(f"note: the code before ({against}) runs without {', '.join(unknown)}: it has no such setting")
        (folder / "before.toml").write_text(tomli_w.dumps(settings))
    arguments = ["run", "--out", str(folder / "out"), "--quiet",
                 "--jit", config.engine.jit]  # (config.toml leaves out how the rules run)
    sides = {"before": against, "after": ROOT} if against is not None else {"after": ROOT}
    commands = {name: [sys.executable, "-m", cli_module(checkout), *arguments, "--config",
                       str(folder / "before.toml" if name == "before" else path)] for name, checkout in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(repeats + 1):
        for name, checkout in sides.items():
            env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(checkout), os.environ.get("PYTHONPATH"))))
            shutil.rmtree(folder / "out", ignore_errors=True)
            started = time.perf_counter()
            subprocess.run(commands[name], cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
            if i:
                times[name].append(time.perf_counter() - started)
    return times


def measure(name: str, case: Case, config, args, folder: Path) -> dict:
    """One case: print what the README quotes and return its row."""
    best = fastest(config, args.repeats)
    s = best.summary
    steps = int(s["num_steps"])
    walls = whole_process(config, folder, args.repeats, args.against)
    whole = min(walls["after"])
    requests = int(s["completed"])
    row = {"case": name, "label": case.label, "policy": case.policy_label, "config": case.config,
           "scheduler": config.engine.scheduler, "jit": config.engine.jit, "replicas": config.cluster.replicas,
           "requests": requests, "rate": config.workload.rate, "profile": best.profile.name, "steps": steps,
           "mean_batch": float(s["mean_batch_size"]), "engine_s": best.engine_wall_s,
           "engine_steps_per_s": steps / best.engine_wall_s, "whole_process_s": whole,
           "requests_per_s": requests / whole, "load_average": os.getloadavg()[0]}
    if args.against is not None:
        before, after = (statistics.median(walls[name]) for name in ("before", "after"))
        row["against"] = {"commit": _commit(args.against), "runs": args.repeats, "before_median_s": before,
                          "after_median_s": after, "before_over_after": before / after}
    print(f"case           {name}: {case.label}")
    print(f"workload       {requests:,} requests on {row['profile']}, policy {case.policy}, scheduler "
          f"{row['scheduler']}, jit {row['jit']}, mean batch {row['mean_batch']:.1f}"
          + (f", {row['replicas']} replicas" if row["replicas"] > 1 else ""))
    print(f"engine loop    {steps:,} steps in {row['engine_s']:.3f} s -> {row['engine_steps_per_s']:,.0f} steps/s")
    print(f"whole process  {whole:.3f} s -> {row['requests_per_s']:,.0f} simulated requests/s", flush=True)
    if "against" in row:
        a = row["against"]
        print(f"before/after   medians {a['before_median_s']:.3f} s ({a['commit']}) / {a['after_median_s']:.3f} s "
              f"(this checkout) = {a['before_over_after']:.2f}x over {a['runs']} alternating runs each", flush=True)
    return row


def _commit(checkout: Path) -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    return done.stdout.strip() or None


def rounded(x: float) -> str:
    """Three significant figures: the machine's noise is larger than the rest."""
    return f"{float(f'{x:.3g}'):,.0f}"


def table(doc: dict) -> str:
    """The README's Speed table (docs/generate.py's ``engine-speed`` block)."""
    rows = ["| scenario | policy | requests | engine steps | engine loop | whole process |",
            "|---|---|---:|---:|---:|---:|"]
    for r in sorted(doc["rows"], key=lambda r: list(CASES).index(r["case"])):
        bold = "**" if r["case"] in ("real-run", "fixed") else ""
        rows.append(f"| {r['label']} | {r['policy']} | {r['requests']:,} | {r['steps']:,} "
                    f"| {rounded(r['engine_steps_per_s'])} steps/s | {bold}{r['whole_process_s']:.2f} s{bold} |")
    by = {r["case"]: r for r in doc["rows"]}
    notes = []
    if "fixed" in by and "v0" in by:
        notes.append(f"vllm-v1 runs {by['fixed']['engine_steps_per_s'] / by['v0']['engine_steps_per_s']:.2f}× the "
                     f"v0 scheduler's engine steps/s on the same requests")
    if "fixed" in by and "step-by-step" in by:
        notes.append(f"a whole run compiled runs {by['fixed']['engine_steps_per_s'] / by['step-by-step']['engine_steps_per_s']:.0f}× "
                     f"the engine steps/s of one stepped in Python")
    if "fixed" in by and "goodput" in by:
        notes.append(f"`goodput` runs {by['goodput']['engine_steps_per_s'] / by['fixed']['engine_steps_per_s']:.2f}× "
                     f"fixed k's engine steps/s")
    machine = doc["machine"]
    low, high = (f"{f(r['load_average'] for r in doc['rows']):.1f}" for f in (min, max))
    out = "\n".join(rows) + "\n\n"
    if notes:
        out += "On these runs " + "; ".join(notes) + ".\n"
    checked = [r for r in sorted(doc["rows"], key=lambda r: list(CASES).index(r["case"])) if "against" in r]
    if checked:
        out += ("Checked against the code before in alternating runs (medians of the whole process, before / after): "
                + "; ".join(f"{r['case']} {r['against']['before_median_s']:.2f} s ({r['against']['commit']}) / "
                            f"{r['against']['after_median_s']:.2f} s = {r['against']['before_over_after']:.2f}×"
                            f" over {r['against']['runs']} runs each" for r in checked) + ".\n")
    kept = doc.get("kept")
    if kept:
        out += (f"Rows {', '.join(kept['cases'])} measured {kept['date']} with `{kept['command']}` (best of "
                f"{kept['repeats']}); the others as follows. ")
    out += (f"Measured {doc['date']} with `{doc['command']}` (best of {doc['repeats']}) on {machine['cpu']} "
            f"({machine['cores']} cores), Python {machine['python']}, numpy {machine['numpy']}, with a 1-minute "
            f"load average of {low if low == high else f'{low}–{high}'} during the runs.\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--requests", type=int, default=10_000, help="requests of the generated cases")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=None,
                        help="measure only these of the README's cases (default: all)")
    parser.add_argument("--data", type=Path, default=None,
                        help="the real runs' folder (default: ../shared/validation/vllm-h100)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results JSON (default {SCRATCH.relative_to(ROOT)}; none for a scenario of your own)")
    parser.add_argument("--update", action="store_true",
                        help=f"write the README's cases to the tracked {RESULTS.relative_to(ROOT)} (then run "
                             "python docs/generate.py)")
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout (e.g. of main) whose whole process is timed in turns with this one's")
    parser.add_argument("--keep", action="store_true",
                        help="keep the rows of the results file that this invocation does not measure again")
    own = parser.add_argument_group("a scenario of your own (measures it alone)")
    own.add_argument("--config", default=None, help="scenario TOML under the flags (default: the shipped default)")
    own.add_argument("--policy", default=None, help="default: fixed")
    own.add_argument("--k", type=int, default=None, help="default: 3")
    own.add_argument("--replicas", type=int, default=None,
                     help="a cluster of N replicas (round-robin), at N times the rate")
    own.add_argument("--rate", type=float, default=None,
                     help="request rate (default: 80%% of the saturation rate on the profile)")
    args = parser.parse_args()

    custom = any(getattr(args, name) is not None for name in ("config", "policy", "k", "replicas", "rate"))
    if custom and args.cases:
        parser.error("--cases measures the README's cases; it does not combine with a scenario of your own")
    if args.update and (custom or args.out is not None):
        parser.error("--update writes the README's cases to the tracked results; it takes no --out or scenario")
    if custom:
        cases = {"custom": Case("custom", config=args.config, policy=args.policy or "fixed", k=args.k or 3,
                                replicas=args.replicas or 1, rate=args.rate)}
        out = args.out
    else:
        cases = {name: CASES[name] for name in (args.cases or CASES)}
        out = RESULTS if args.update else args.out or SCRATCH
    sys.path.insert(0, str(Path(__file__).parent))
    from real_vllm import VALIDATION

    DATA = VALIDATION / "vllm-h100"  # the folder holding REAL_RUN
    from scale import check_unchanged, machine, warm_compiled  # one description of the machine for the benchmarks

    # No measured process compiles, or runs interpreted meanwhile (check_unchanged: nor after an edit mid-run).
    folders = {checkout: warm_compiled(checkout) for checkout in filter(None, (ROOT, args.against))}

    about = machine()
    print(f"machine        {about['cpu']}, {about['cores']} cores, Python {about['python']}, numpy {about['numpy']}")
    rows, configs = [], {}
    with tempfile.TemporaryDirectory(prefix="engine-speed-") as scratch:
        for name, case in cases.items():
            folder = Path(scratch) / name
            folder.mkdir()
            if name == "real-run":
                config = real_run_config(args.data or DATA, folder)
                if config is None:
                    print(f"case           real-run: skipped, no {(args.data or DATA) / 'runs.json'}\n")
                    continue
            else:
                source = case.rate_of and CASES[case.rate_of]
                rate = None
                if source:
                    configs.setdefault(case.rate_of, configure(source, args.requests))
                    rate = configs[case.rate_of].workload.rate
                config = configs.setdefault(name, configure(case, args.requests, rate))
            rows.append(measure(name, case, config, args, folder))
            check_unchanged(folders)
            print()
    if out is not None and rows:
        command = shlex.join(["python", "benchmarks/engine_speed.py", *sys.argv[1:]])
        doc = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": about, "command": command,
               "requests": args.requests, "repeats": args.repeats, "rows": rows}
        if args.keep and out.is_file():
            kept = json.loads(out.read_text())
            older = [r for r in kept["rows"] if r["case"] not in {r["case"] for r in rows}]
            if older:  # the rows left as they were say when and how they were measured
                doc["rows"] = older + rows
                cases = [r["case"] for r in older]
                earlier = kept.get("kept")
                if not (earlier and set(cases) <= set(earlier["cases"])):
                    earlier = {key: kept[key] for key in ("date", "command", "repeats")}
                doc["kept"] = {**earlier, "cases": cases}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
