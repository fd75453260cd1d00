"""The simulator against real replays on this machine: every case, its error in parts, one table.

    python benchmarks/validation.py [--suite cpu|gpu|gpu-dry] [--out runs/validation-bench] [--profile DIR | --calibrate]
                                    [--requests N] [--repeat N] [--cases PATTERN] [--results FILE]
    python benchmarks/validation.py --table FILE     # print the table(s) of a results file, run nothing
    python benchmarks/validation.py --reprice PROFILE --from OUT [--results FILE]

Runs ``specbatch validate --repeat N`` (N real replays of the same scenario and seed,
pooled) for every case of a suite:

* ``--suite cpu`` (default): continuous and static batching x none / fixed k=3 / goodput x
  a low and a high load, on llama-160m / llama-68m on the CPU (the shipped profile
  ``cpu-llama-160m-llama-68m`` unless --profile names another), 5 x 60 requests a case;
* ``--suite gpu``: continuous batching x fixed k=3 / goodput x 80% and 35% of the workload's
  simulated capacity on the profile, on llama-3.1-8b / llama-3.2-1b in bf16 on CUDA, priced
  by a profile calibrated with CUDA graphs as the replay runs its passes (the shipped
  ``h100-graphs-llama-3.1-8b-llama-3.2-1b`` unless --profile names another), 2 x 150
  requests a case; results in benchmarks/results/validation-gpu.json;
* ``--suite gpu-dry``: the gpu suite's commands on the CPU with small models, in seconds (the
  dry run of benchmarks/gpu_session.sh);

and prints per case:

* the noise floor: the coefficient of variation of mean E2EL over the N replays;
* the device's speed during the replays (timed passes / their calibrated time) and its
  drift within them (the range over stretches of each replay);
* the scheduling logic alone: the simulator fed the replays' measured steps, its largest
  mean E2EL error against them, and how much of it is the engine's time between steps;
* the cost model alone: the median absolute error of a step's price (speed-corrected);
* end to end: mean E2EL, p99 E2EL and output throughput, raw and speed-corrected, and the
  TOST p-value (±5% on mean E2EL, speed-corrected).

``--calibrate`` calibrates a fresh profile on the suite's grid right before each case (into
OUT/profiles/CASE; about a minute on the CPU) and validates against it: calibration and
replays interleaved in time, so the raw errors measure the simulator and its cost model,
not how much faster or slower the machine runs than on the day the shipped profile was made.

Each case is stored in its own folder, so a killed run resumes with the missing cases;
every finished case is added to the results file (default: OUT/results.json), which is
what docs/validation.md's table is generated from. The replays are real time: run it on a
machine with nothing else running, or read the noise floor before the errors.

``--reprice PROFILE --from OUT`` runs nothing for real: it simulates each case folder under
OUT again (the scenario its replays ran, read from ``real/config.toml``, prefill padded)
priced by another profile, e.g. the composed ``h100-llama-3.1-8b-llama-3.2-1b``, and
compares it with the replays' pooled values stored in the folder's validation.json: mean
and p99 E2EL, output throughput, mean TPOT and TTFT, raw (simulated - real) / real, with
no speed correction (a user who never calibrated has none). A CPU does it in seconds; the
results file (default OUT/results.json) keeps it under ``repriced`` and ``--table`` prints
it as a second table.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import sys
import time
from pathlib import Path

# Two suites: "cpu" (the shipped CPU profile of llama-160m / llama-68m; continuous and static
# batching x none / fixed k=3 / goodput) and "gpu" (llama-3.1-8b / llama-3.2-1b in bf16 on an
# H100, profiled eagerly as the replay runs; continuous batching x fixed k=3 / goodput). Loads
# are request rates (req/s): "high" near 80% of the simulated capacity, "low" near 35%.
SUITES = {
    "cpu": {"workload": ["--prompt-tokens", "uniform:16:64", "--output-tokens", "uniform:8:40",
                         "--max-batch-size", "8", "--alpha", "0.7", "--seed", "1"],
            "policies": ("none", "fixed-k3", "goodput"),
            "loads": {"continuous": {"high": 1.5, "low": 0.3}, "static": {"high": 1.0, "low": 0.3}},
            "profile": "cpu-llama-160m-llama-68m", "requests": 60, "repeat": 5,
            "results": "benchmarks/results/validation.json",
            # every batch size the cases run (on this CPU a pass at batch 2 or 3 costs more than at 4:
            # a curve through 1, 2, 4, 8 prices 3 about a third low); ~1.5 min on this CPU
            "calibrate": ["--target", "llama-160m", "--draft", "llama-68m", "--device", "cpu",
                          "--batch-sizes", "1,2,3,4,5,6,7,8", "--k-max", "4", "--contexts", "16,64,128",
                          "--prompts", "16,32,64", "--threads", "1"]},
    # loads: fractions of this workload's capacity on the profile, simulated (fixed k=3, every request
    # at t = 0; :func:`capacity_rate`), so the cases sit at 80% and 35% of whatever GPU runs them
    "gpu": {"workload": ["--prompt-tokens", "uniform:64:512", "--output-tokens", "uniform:16:112",
                         "--max-batch-size", "16", "--alpha", "0.7", "--seed", "1"],
            "policies": ("fixed-k3", "goodput"),
            "loads": {"continuous": {"high": 0.8, "low": 0.35}}, "loads_are_fractions": True,
            "profile": "h100-graphs-llama-3.1-8b-llama-3.2-1b", "requests": 150, "repeat": 2,
            "results": "benchmarks/results/validation-gpu.json",
            # benchmarks/gpu_session.sh's "calibrate" phase: passes from CUDA graphs, as the replay runs them
            "calibrate": ["--target", "llama-3.1-8b", "--draft", "llama-3.2-1b", "--device", "cuda",
                          "--dtype", "bfloat16", "--batch-sizes", "1,2,4,8,16", "--k-max", "4",
                          "--contexts", "64,128,256,512,1024", "--prompts", "32,64,128,256,512",
                          "--max-prefill-tokens", "8192", "--warmup", "2", "--repeats", "10",
                          "--point-budget", "0.3"]},
}
# The GPU suite's commands on a CPU with small models, in seconds: a dry run of
# benchmarks/gpu_session.sh (DRY_RUN=1) before a lent GPU's minutes are spent.
SUITES["gpu-dry"] = {**SUITES["gpu"], "workload": ["--prompt-tokens", "uniform:16:64", "--output-tokens",
                                                   "uniform:8:40", "--max-batch-size", "4", "--alpha", "0.7",
                                                   "--seed", "1"],
                     "profile": "cpu-llama-160m-llama-68m", "requests": 20, "repeat": 2,
                     "results": None, "calibrate": SUITES["cpu"]["calibrate"]}
POLICIES = {"none": ["--policy", "none"], "fixed-k3": ["--policy", "fixed", "--k", "3"],
            "goodput": ["--policy", "goodput"]}
SHOWN = (("mean_e2el_ms", "mean E2EL"), ("p99_e2el_ms", "p99 E2EL"), ("output_throughput", "output tput"))
BAR = {"mean_e2el_ms": 0.02, "output_throughput": 0.02, "p99_e2el_ms": 0.05}  # the goal, speed-corrected


def cases(suite: str = "cpu", capacity: float = 1.0) -> list[tuple[str, str, str, float]]:
    """(name, batching, policy, rate), high loads first (the shortest replays). ``capacity``: the
    workload's capacity in req/s, for a suite whose loads are fractions of it."""
    spec = SUITES[suite]
    scale = capacity if spec.get("loads_are_fractions") else 1.0
    out = []
    for load in ("high", "low"):
        for batching, loads in spec["loads"].items():
            for policy in spec["policies"]:
                out.append((f"{batching}-{policy}-{load}", batching, policy, round(loads[load] * scale, 2)))
    return out


def capacity_rate(profile: str, spec: dict, requests: int) -> float:
    """The suite's workload's capacity on ``profile`` (req/s): every request at t = 0, fixed k = 3, as
    the replay runs it (v0 scheduler, padded prefill), simulated; the completed requests over the makespan."""
    import tempfile

    from specbatch.commands.cli import main as specbatch

    with tempfile.TemporaryDirectory() as folder:
        code = specbatch(["run", "--profile", profile, "--scheduler", "v0", "--prefill", "padded", "--rate", "inf",
                          "--num-requests", str(max(requests, 300)), *spec["workload"], *POLICIES["fixed-k3"],
                          "--records", "none", "--out", f"{folder}/run", "--quiet"])
        if code != 0:
            raise SystemExit(code)
        return float(json.loads((Path(folder) / "run" / "summary.json").read_text())["metrics"]["request_throughput"])


def case_row(name: str, batching: str, policy: str, rate: float, doc: dict, folder: Path | None = None) -> dict:
    """What the table shows of one case's validation.json (and, for a case validated before
    validate wrote its decode bias by batch size, of the folder's step_costs.csv)."""
    metrics = {m["metric"]: m for m in doc["metrics"]}
    floor = {m["metric"]: m for m in doc["noise_floor"]}
    logic = doc.get("logic") or {}
    step_cost = {r["group"]: r for r in doc["step_cost"]}["all steps"]
    speeds = [r["pass_speed_ratio"] for r in doc["replays"]]
    drift = [x for d in doc["drift"] for x in d["speed_ratio"]]
    row = {"case": name, "batching": batching, "policy": policy, "rate": rate, "repeats": doc["repeats"],
           "profile": doc["profile"], "profile_created_utc": doc.get("profile_created_utc"),
           "profile_batch_sizes": doc.get("profile_batch_sizes") or _grid_batch_sizes(folder),
           "requests": doc["requests_per_replay"], "speed_min": min(speeds), "speed_max": max(speeds),
           "drift_min": min(drift), "drift_max": max(drift), "noise_cv_mean_e2el": floor["mean_e2el_ms"]["cv"],
           "noise_range_mean_e2el": floor["mean_e2el_ms"]["range"],
           "logic_reproduced": bool(logic.get("passed")),
           "logic_e2el_error": (logic.get("e2el") or {}).get("mean_error"),
           "logic_overhead_term": (logic.get("e2el") or {}).get("overhead_term"),
           "step_cost_median_ape": step_cost["median_ape"],
           "step_cost_corrected_median_ape": step_cost["corrected_median_ape"],
           "tost_p_corrected": doc["tost"]["speed_corrected"].get("p_value"),
           "tost_p_raw": doc["tost"]["raw"].get("p_value"),
           "load_average": [x for r in doc["replays"] for x in (r.get("load_average") or []) if x is not None]}
    for key, _ in SHOWN:
        row[f"{key}_raw"] = metrics[key]["relative_error"]
        row[f"{key}_corrected"] = metrics[key]["speed_corrected_error"]
    if not doc.get("simulated_pooled") and doc["repeats"] > 1 and folder is not None:
        row.update(_pooled_errors(folder, doc["repeats"], {key: metrics[key]["real"] for key, _ in SHOWN}))
    row["step_cost_by_batch"] = doc.get("step_cost_by_batch") or _by_batch(folder)
    row["meets_bar"] = all(row[f"{key}_corrected"] is not None and abs(row[f"{key}_corrected"]) <= bar
                           for key, bar in BAR.items())
    return row


def _pooled_errors(folder: Path, repeats: int, real: dict[str, float]) -> dict:
    """For a case validated before ``validate`` pooled the simulated side like the replays
    (specbatch.commands.fidelity.as_pooled): its errors recomputed from the folder's simulated and
    speed-corrected runs, each over ``repeats`` copies of its requests."""
    import pandas as pd

    from specbatch.commands.fidelity import as_pooled

    out = {"simulated_pooled_from_folder": True}
    for suffix, run in (("raw", folder / "simulated"), ("corrected", folder / "speed-corrected" / "run")):
        summary = {key: math.nan if value is None else value  # JSON keeps a NaN metric as null
                   for key, value in json.loads((run / "summary.json").read_text())["metrics"].items()}
        pooled = as_pooled(summary, pd.read_csv(run / "requests.csv"), repeats)
        for key, value in real.items():
            out[f"{key}_{suffix}"] = (pooled[key] - value) / value
    return out


def _grid_batch_sizes(folder: Path | None) -> list[int] | None:
    """The batch sizes the case's profile was measured at (for a case validated before validate
    recorded them): its replay's config names the profile."""
    if folder is None or not (folder / "real" / "config.toml").is_file():
        return None
    import tomllib

    from sim.costmodel.profile import load_profile

    name = tomllib.loads((folder / "real" / "config.toml").read_text()).get("profile")
    return load_profile(name).meta.get("grid", {}).get("batch_sizes") if name else None


def _by_batch(folder: Path | None) -> list[dict] | None:
    if folder is None or not (folder / "step_costs.csv").is_file():
        return None
    import pandas as pd

    from specbatch.commands.fidelity import step_cost_by_batch

    return step_cost_by_batch(pd.read_csv(folder / "step_costs.csv"))


def format_by_batch(results: dict) -> str | None:
    """Per case, the decode steps' speed-corrected price bias at each batch size."""
    rows = [r for r in results["cases"] if r.get("step_cost_by_batch")]
    if not rows:
        return None
    sizes = sorted({b["batch_size"] for r in rows for b in r["step_cost_by_batch"]})
    lines = ["Decode steps by batch size: the price's median error against the measured step, speed-corrected "
             "(a size the curve misprices stands out):",
             f"{'case':26} " + " ".join(f"{f'b={b}':>7}" for b in sizes) + "  calibrated at batch"]
    for r in rows:
        bias = {b["batch_size"]: b["corrected_median_error"] for b in r["step_cost_by_batch"]}
        grid = ",".join(map(str, r.get("profile_batch_sizes") or [])) or "?"
        lines.append(f"{r['case']:26} " + " ".join(f"{_pct(bias.get(b)):>7}" for b in sizes) + f"  {grid}")
    return "\n".join(lines)


def _pct(x, digits: int = 1, sign: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:{'+' if sign else ''}.{digits}f}%"


def format_table(results: dict) -> str:
    rows = results["cases"]
    suite = results.get("suite", "cpu")
    lines = [f"{'case':26} {'replays':>7} {'speed':>11} {'drift':>11} {'noise':>6} {'logic':>14} {'step':>6}  "
             + "  ".join(f"{label:>15}" for _, label in SHOWN) + f"  {'TOST':>5} {'bar':>4}",
             f"{'':26} {'':>7} {'':>11} {'':>11} {'CV':>6} {'E2EL (ovh.)':>14} {'cost':>6}  "
             + "  ".join(f"{'raw':>7} {'corr.':>7}" for _ in SHOWN) + f"  {'p':>5} {'met':>4}"]
    for r in rows:
        logic = (f"{_pct(r['logic_e2el_error'], 2)} ({_pct(r['logic_overhead_term'], 2, False)})"
                 if r["logic_reproduced"] else "NOT REPRODUCED")
        cells = "  ".join(f"{_pct(r[f'{key}_raw']):>7} {_pct(r[f'{key}_corrected']):>7}" for key, _ in SHOWN)
        p = r["tost_p_corrected"]
        lines.append(f"{r['case']:26} {r['repeats']:>3}x{r['requests']:<3} "
                     f"{r['speed_min']:5.2f}-{r['speed_max']:<5.2f} {r['drift_min']:5.2f}-{r['drift_max']:<5.2f} "
                     f"{_pct(r['noise_cv_mean_e2el'], 1, False):>6} {logic:>14} "
                     f"{_pct(r['step_cost_corrected_median_ape'], 1, False):>6}  {cells}  "
                     f"{'n/a' if p is None else f'{p:.2f}':>5} {'yes' if r['meets_bar'] else 'no':>4}")
    met = sum(r["meets_bar"] for r in rows)
    lines.append(f"({len(rows)} cases, {met} meeting the bar: speed-corrected mean E2EL and output throughput within "
                 "2%, p99 E2EL within 5%. error = (simulated - real) / real over the replays pooled; speed = timed "
                 "passes / their calibrated time, per replay; drift = the same over stretches of each replay; noise "
                 "= CV of mean E2EL over the replays; logic = mean E2EL error of the loop fed the measured steps, "
                 "(of which engine overhead between steps); step cost = median |error| of a step's price, "
                 "speed-corrected; TOST p < 0.05: speed-corrected mean E2EL equivalent within 5%)")
    calibrated: dict[str, set] = {}
    for r in rows:
        if r.get("profile"):
            calibrated.setdefault(r["profile"], set()).add(r.get("profile_created_utc") or "at an unrecorded time")
    if calibrated:
        lines.append("priced by " + "; ".join(
            f"{name} (calibrated {min(when)})" if len(when) == 1 else
            f"{name} (calibrated before each case: {len(when)} times, {min(when)} to {max(when)})"
            for name, when in sorted(calibrated.items())))
    missing = [name for name, *_ in cases(suite) if name not in {r["case"] for r in rows}]
    if missing:
        lines.append(f"not run: {', '.join(missing)} (python benchmarks/validation.py runs what is missing)")
    return "\n".join(lines)


# ------------------------------------------------------------ repricing: the same cases, another profile
# What --reprice compares: (summary key, label, unit), each the replays' pooled value.
REPRICED = (("mean_e2el_ms", "mean E2EL", "ms"), ("p99_e2el_ms", "p99 E2EL", "ms"),
            ("output_throughput", "output tput", "tok/s"), ("mean_tpot_ms", "mean TPOT", "ms"),
            ("mean_ttft_ms", "mean TTFT", "ms"))


def repriced_row(name: str, doc: dict, simulated: dict) -> dict:
    """One case repriced: per metric of REPRICED, the replays' pooled value (validation.json's
    ``real``), the simulated one and the raw relative error (simulated - real) / real."""
    real = {m["metric"]: m["real"] for m in doc["metrics"]}
    row = {"case": name, "repeats": doc["repeats"], "requests": doc["requests_per_replay"]}
    for key, _, _ in REPRICED:
        r, sim = real.get(key), simulated.get(key)
        ok = r is not None and sim is not None and r != 0 and math.isfinite(r) and math.isfinite(sim)
        row[key] = {"real": r, "simulated": float(sim) if sim is not None and math.isfinite(sim) else None,
                    "error": (sim - r) / r if ok else None}
    return row


def reprice_case(case: Path, profile: str) -> dict:
    """Simulate the scenario the case folder's replays ran (``real/config.toml``; prefill padded,
    as the replay runs it), priced by ``profile``, against the replays' pooled values."""
    from sim.config import load_config
    from sim.simulate import simulate

    doc = json.loads((case / "validation.json").read_text())
    scenario = case / "real" / "config.toml"
    digest = load_config(scenario).digest()
    if digest != doc["config_digest"]:
        raise SystemExit(f"{scenario} is not the scenario {case / 'validation.json'} validated "
                         f"(digest {digest}, not {doc['config_digest']})")
    config = load_config(scenario, {"profile": profile, "engine.scheduler": "v0", "engine.prefill": "padded"})
    return repriced_row(case.name, doc, simulate(config).summary)


def reprice(source: Path, profile: str, suite: str) -> dict:
    """Every case folder of ``suite`` under ``source`` (those with a validation.json), repriced."""
    from sim.costmodel.profile import load_profile

    loaded = load_profile(profile)
    rows = [reprice_case(source / name, profile) for name, *_ in cases(suite)
            if (source / name / "validation.json").is_file()]
    if not rows:
        raise SystemExit(f"no case folder with a validation.json under {source}")
    return {"profile": profile, "name": loaded.name, "composed": "composition" in loaded.meta, "cases": rows}


def format_repriced(name: str, entry: dict) -> str:
    kind = "the composed profile" if entry.get("composed") else "the profile"
    named = f" ({entry['name']})" if entry.get("name") not in (None, name) else ""
    lines = [f"The same cases priced by {kind} {name}{named}, raw (no speed correction):",
             f"{'case':26} " + "  ".join(f"{f'{label} ({unit})':>25}" for _, label, unit in REPRICED),
             f"{'':26} " + "  ".join(f"{'real':>8} {'sim.':>7} {'error':>8}" for _ in REPRICED)]
    for row in entry["cases"]:
        cells = "  ".join(f"{_num(row[key]['real']):>8} {_num(row[key]['simulated']):>7} {_pct(row[key]['error']):>8}"
                          for key, _, _ in REPRICED)
        lines.append(f"{row['case']:26} {cells}")
    lines.append("(error = (simulated - real) / real; real = the replays pooled, as in the table above; "
                 "simulated = the same scenario and seed priced by this profile)")
    return "\n".join(lines)


def _num(x) -> str:
    if x is None:
        return "n/a"
    return f"{x:.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def format_results(results: dict) -> str:
    """The table of the cases, then one per repriced profile."""
    parts = [format_table(results)]
    by_batch = format_by_batch(results)
    if by_batch:
        parts.append(by_batch)
    for name, entry in sorted((results.get("repriced") or {}).items()):
        parts.append(format_repriced(name, entry))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], allow_abbrev=False,
        epilog="e.g. --suite gpu on an H100 (benchmarks/gpu_session.sh phase validate); then, on any machine, "
               "--reprice h100-llama-3.1-8b-llama-3.2-1b --from OUT --results benchmarks/results/validation-gpu.json "
               "prices the same cases by the composed profile (docs/validation.md, 'On an H100 GPU')")
    parser.add_argument("--suite", choices=sorted(SUITES), default="cpu",
                        help="cpu (default): llama-160m / llama-68m on the CPU, continuous and static batching; "
                             "gpu: llama-3.1-8b / llama-3.2-1b in bf16 on CUDA, continuous batching, on a profile "
                             "calibrated from CUDA graphs, as the replay runs its passes; gpu-dry: its commands on "
                             "the CPU")
    parser.add_argument("--out", default="runs/validation-bench", help="one folder per case (default %(default)s)")
    parser.add_argument("--profile", help="the suite's profile (default: cpu-llama-160m-llama-68m for cpu, "
                                          "h100-graphs-llama-3.1-8b-llama-3.2-1b for gpu)")
    parser.add_argument("--calibrate", action="store_true",
                        help="calibrate a fresh profile on this machine right before each case runs (the suite's "
                             "grid, into OUT/profiles/CASE) and validate against it, so the raw errors are not the "
                             "shipped profile's age; ~1 min a case on the CPU")
    parser.add_argument("--requests", type=int, help="requests per replay (default 60 for cpu, 150 for gpu)")
    parser.add_argument("--repeat", type=int, help="replays per case, pooled (default 5 for cpu, 2 for gpu)")
    parser.add_argument("--cases", default="*", help="run only the cases matching this pattern (e.g. 'continuous-*')")
    parser.add_argument("--results", help="the results file to add finished cases to (default OUT/results.json)")
    parser.add_argument("--table", metavar="FILE", help="print the table(s) of this results file and stop")
    parser.add_argument("--reprice", metavar="PROFILE",
                        help="run nothing for real: simulate each case folder under --from again priced by PROFILE "
                             "(e.g. the composed h100-llama-3.1-8b-llama-3.2-1b) and store its raw errors against "
                             "the folder's replays in the results file")
    parser.add_argument("--from", dest="source", metavar="OUT",
                        help="with --reprice: the folder of a finished run (its case folders; default --out)")
    args = parser.parse_args(argv)
    if args.table:
        print(format_results(json.loads(Path(args.table).read_text())))
        return 0
    if args.reprice:
        source = Path(args.source or args.out)
        results_path = Path(args.results) if args.results else source / "results.json"
        results = json.loads(results_path.read_text()) if results_path.is_file() else {"cases": []}
        suite = results.get("suite", args.suite)
        results.setdefault("repriced", {})[Path(args.reprice).name] = reprice(source, args.reprice, suite)
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(format_results(results))
        print(f"(results in {results_path})")
        return 0
    from specbatch.commands.cli import main as specbatch

    spec = SUITES[args.suite]
    if args.calibrate and args.profile:
        parser.error("--calibrate calibrates each case's profile: leave out --profile")
    profile = args.profile or spec["profile"]
    requests = spec["requests"] if args.requests is None else args.requests
    repeat = spec["repeat"] if args.repeat is None else args.repeat
    if requests < 1 or repeat < 1:
        parser.error(f"--{'requests' if requests < 1 else 'repeat'} must be at least 1")

    out = Path(args.out)
    results_path = Path(args.results) if args.results else out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {"cases": []}
    results["suite"] = args.suite
    started = time.perf_counter()
    capacity = 1.0
    if spec.get("loads_are_fractions"):
        capacity = results["capacity_req_s"] = round(capacity_rate(profile, spec, requests), 3)
        print(f"capacity of the workload on {profile}: {capacity:.2f} req/s (simulated); loads "
              + ", ".join(f"{load} {frac:g}x" for load, frac in next(iter(spec["loads"].values())).items()),
              file=sys.stderr)
    for name, batching, policy, rate in cases(args.suite, capacity):
        if not fnmatch.fnmatch(name, args.cases):
            continue
        case = out / name
        if not (case / "validation.json").is_file():
            if args.calibrate:
                profile = str(out / "profiles" / name)
                print(f"[{name}] calibrating {profile} (load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
                code = specbatch(["calibrate", *spec["calibrate"], "--fresh", "--quiet", "--out", profile])
                if code != 0:
                    return code
            load = os.getloadavg()[0]
            print(f"[{name}] {repeat} x {requests} requests at {rate:g}/s (load average {load:.1f})",
                  file=sys.stderr)
            code = specbatch(["validate", "--profile", profile, "--batching", batching, "--rate", str(rate),
                              "--num-requests", str(requests), "--repeat", str(repeat), *spec["workload"],
                              *POLICIES[policy], "--out", str(case)])
            if code != 0:
                return code
        row = case_row(name, batching, policy, rate, json.loads((case / "validation.json").read_text()), case)
        results["cases"] = [r for r in results["cases"] if r["case"] != name] + [row]
        order = [c[0] for c in cases(args.suite, capacity)]
        results["cases"].sort(key=lambda r: order.index(r["case"]))
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(format_results(results))
    print(f"({time.perf_counter() - started:.0f} s this run; results in {results_path})")
    return 0


if __name__ == "__main__":
    from sim.errors import InputError

    try:
        sys.exit(main())
    except InputError as exc:  # a bad profile name or scenario: one line, as the CLI answers
        sys.exit(f"error: {exc}")
