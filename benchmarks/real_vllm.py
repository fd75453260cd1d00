"""The simulator against real vLLM on H100: every measured run a shipped profile covers.

    python benchmarks/real_vllm.py [--data DIR] [--results FILE] [--figure PNG] [--runs PATTERN]
    python benchmarks/real_vllm.py --table FILE     # print a results file's tables, run nothing

The runs are the BLIS project's sixteen vLLM 0.15.1 runs on H100 SXM (``../shared/validation/
vllm-h100``, its README says how they were made): per request the arrival, prompt and
output length, prompt id, stage, and the measured TTFT and E2E latency. A run is simulated
when a shipped profile covers it: the profile's target model has the run's shape (layers,
widths, heads, KV heads, vocabulary), on the run's GPU, at its tensor-parallel size (all
sixteen: Llama-2-7b on one GPU, Llama-2-70b on four, Mixtral-8x7B and CodeLlama-34b on two,
the last three on target-only composed profiles). Each is simulated request for request
by ``specbatch compare`` (sim.commands.compare.compare_measured) with the run's own engine
settings from ``runs.json``: the vllm-v1 scheduler, max_num_seqs, max_num_batched_tokens,
block size, the KV cache vLLM logged (gpu_kv_blocks x block size tokens), chunked prefill,
and prefix caching with the prompt ids where the simulator has them.

It prints, per run and stage, the mean, p50, p90 and p99 of TTFT, ITL ((E2E - TTFT) /
(output tokens - 1)) and E2E, real beside simulated with the error, whether the real engine
and the simulation kept up with the stage's rate, and the medians over the stages where the
real engine kept up, against the targets (issue 32: mean E2E and mean ITL within 3%, mean
TTFT within 10%, p99 E2E within 5%). A stage the real engine did not keep up with (the
reasoning runs: most requests failed) gets no error percentage, only whether the simulation
falls behind too. Medians are also given per tensor-parallel size.

Where the error has a part no independent data prices, the results show its share: per
stage, what a target decode pass is made of at the stage's simulated batch and context
(each composed term's share, read from the kernel data the profile was composed from, and
the factor by which the collectives alone would have to grow for the mean ITL error to
vanish), and the real engines' warm-up (requests of a run's first seconds much slower than
the rest, and the first stage's p99 E2E error without them).

Results go to ``benchmarks/results/real_vllm.json`` (what docs/validation.md's
section "Against real vLLM on H100" is generated from), the figure (real vs simulated
latency CDFs per run) to ``docs/figures/real-vllm-cdf.png``.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = next((p / "shared" / "validation" / "vllm-h100" for p in ROOT.parents
             if (p / "shared" / "validation" / "vllm-h100").is_dir()), ROOT.parent / "shared" / "validation" / "vllm-h100")
RESULTS = ROOT / "benchmarks" / "results" / "real_vllm.json"
FIGURE = ROOT / "docs" / "figures" / "real-vllm-cdf.png"
TARGETS = (("e2e", "mean", 0.03), ("itl", "mean", 0.03), ("ttft", "mean", 0.10), ("e2e", "p99", 0.05))
SHAPE = {"hidden_size": "hidden_dim", "intermediate_size": "intermediate_dim", "num_layers": "num_layers",
         "num_heads": "num_heads", "num_kv_heads": "num_kv_heads", "vocab_size": "vocab_size"}


def gpu_key(name: str) -> str:
    """'h100_sxm' and 'H100-SXM-80GB' alike: lower-case letters and digits, memory size dropped."""
    return re.sub(r"\d+gb$", "", re.sub(r"[^a-z0-9]", "", name.lower()))


def covering_profile(run: dict, profiles: dict[str, dict]) -> str | None:
    """The shipped profile whose target is the run's model on the run's GPU at its TP size (composed first)."""
    found = []
    for name, meta in sorted(profiles.items()):
        config = meta.get("models", {}).get("target", {}).get("config", {})
        if (all(config.get(ours) == run["model_config"].get(theirs) for ours, theirs in SHAPE.items())
                and gpu_key(meta.get("device", {}).get("gpu") or "") == gpu_key(run["gpu"])
                and int(meta.get("tensor_parallel_size", 1)) == int(run["tensor_parallel_size"])):
            found.append((meta.get("source") != "composed", name))
    return min(found)[1] if found else None


def run_overrides(run: dict, profile: str) -> dict:
    """The run's engine settings as the simulator's config keys (prefix caching where it has the key)."""
    from sim.config import KEYS

    keys = {key.name for key in KEYS}
    settings = {"profile": profile,
                "policy.name": "none", "engine.scheduler": "vllm-v1",
                "engine.max_batch_size": run["max_num_seqs"],
                "engine.max_num_batched_tokens": run["max_num_batched_tokens"],
                "engine.block_size": run["block_size"],
                "engine.kv_cache_tokens": run["gpu_kv_blocks"] * run["block_size"],
                "engine.chunked_prefill": bool(run["chunked_prefill"])}
    if "engine.enable_prefix_caching" in keys:
        settings["engine.enable_prefix_caching"] = bool(run["prefix_caching"])
    return {key: (value, "runs.json") for key, value in settings.items() if key in keys}


def simulate_run(run: dict, profile: str, data: Path):
    from sim.commands.compare import compare_measured

    return compare_measured(data / run["file"], None, run_overrides(run, profile))


def run_document(run: dict, profile: str, comparison) -> dict:
    return {"run": run["run"], "model": run["model"], "profile": profile,
            "tensor_parallel_size": int(run["tensor_parallel_size"]),
            "settings": {key: value for key, (value, _) in run_overrides(run, profile).items()},
            "stages": _records(comparison.stages), "table": _records(comparison.table),
            "terms": pass_terms(profile, comparison), "warm_up": warm_up(comparison)}


def pass_terms(profile: str, comparison) -> list[dict] | None:
    """Per stage, what a target decode pass is made of at the stage's simulated mean decode batch and
    context: each composed term's share (GEMMs and experts, attention, small ops, LM head, and the
    collectives of a split replica). Read from the kernel data the profile was composed from; None
    for a measured profile or without the data (the gpu-data extra)."""
    from sim.commands.compose import pricers_for
    from sim.errors import InputError
    from sim.profile import load_profile

    loaded = load_profile(profile)
    if loaded.meta.get("source") != "composed":
        return None
    try:
        target = pricers_for(loaded)["target"]
    except InputError:
        return None
    steps = comparison.result.steps
    out = []
    for stage in comparison.stages.itertuples():
        decode = steps[(steps.phase != 0) & (steps.start_s >= stage.start_s)
                       & (steps.start_s < stage.start_s + stage.duration_s)]
        if decode.empty:
            continue
        batch, context = float(decode.batch_size.mean()), float(decode.mean_context_tokens.mean())
        parts = {name: float(value) for name, value in target.decode_parts(round(batch), 1, context).items()}
        total = sum(parts.values())
        out.append({"stage": int(stage.stage), "batch": batch, "context": context, "pass_s": total,
                    "shares": {name: value / total for name, value in parts.items()}})
    return out


WARM_UP_S = 10.0  # a run's first seconds, where a real engine may still compile kernels on first use


def warm_up(comparison) -> dict:
    """The real engine's start: requests of the first WARM_UP_S seconds slower than 1.5x their stage's
    median E2E, and the first stage's p99 E2E error without the requests of those seconds."""
    import numpy as np

    samples = comparison.samples
    judged = samples[samples.ok & samples.real_e2e.notna()]
    first = judged[judged.stage == judged.stage.min()]
    early = first.arrival_s < first.arrival_s.min() + WARM_UP_S
    slow = int((early & (first.real_e2e > 1.5 * first.real_e2e.median())).sum())
    later = first[~early]
    real, sim = (float(np.percentile(later[f"{side}_e2e"], 99)) for side in ("real", "sim"))
    return {"seconds": WARM_UP_S, "slow_requests": slow, "stage": int(first.stage.iloc[0]),
            "p99_e2e_error_after": sim / real - 1.0}


def _records(frame) -> list[dict]:
    def plain(value):
        if hasattr(value, "item"):
            value = value.item()
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return [{key: plain(value) for key, value in row.items()} for row in frame.to_dict("records")]


def summarize(doc: dict, by_gpus: bool = True) -> dict:
    """Medians over the stages the real engine kept up with (all runs, and per tensor-parallel size),
    and the stages the simulation fell behind in."""
    errors = {f"{stat}_{metric}": [] for metric, stat, _ in TARGETS}
    behind = []
    for run in doc["runs"]:
        for stage in run["stages"]:
            if stage["real_saturated"]:
                continue
            if stage["sim_saturated"]:
                behind.append(f"{run['run']} stage {stage['stage']}")
            for metric, stat, _ in TARGETS:
                row = next(r for r in run["table"] if r["stage"] == stage["stage"] and r["metric"] == metric
                           and r["stat"] == stat)
                errors[f"{stat}_{metric}"].append(row["rel_error"])
    medians = {key: _median([abs(v) for v in values]) for key, values in errors.items()}
    by_tp = {}
    for tp in sorted({run.get("tensor_parallel_size", 1) for run in doc["runs"]}) if by_gpus else ():
        part = summarize({"runs": [run for run in doc["runs"] if run.get("tensor_parallel_size", 1) == tp]},
                         by_gpus=False)
        by_tp[str(tp)] = {"median_abs_error": part["median_abs_error"], "stages_judged": part["stages_judged"]}
    return {"median_abs_error": medians, "stages_judged": len(next(iter(errors.values()))),
            "sim_fell_behind_where_real_kept_up": behind, **({"by_tensor_parallel_size": by_tp} if by_gpus else {})}


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return float(ordered[middle]) if len(ordered) % 2 else float(sum(ordered[middle - 1:middle + 1]) / 2)


def fitted_terms(meta: dict) -> dict | None:
    """What of a profile's engine overhead ``specbatch fit`` set, on which runs, and its held-out errors."""
    overhead = meta.get("engine_overhead", {})
    fit, carried = overhead.get("fitted"), overhead.get("carried")
    if fit:
        return {"terms": fit["terms"], "fitted_on": fit["on"], "leave_one_out_test": fit.get("test"),
                "carried_from": None}
    if carried:
        return {"terms": carried["terms"], "fitted_on": carried.get("fitted_on"),
                "leave_one_out_test": carried.get("fit_test_errors"), "carried_from": carried["from"]}
    return None


def tables(doc: dict) -> str:
    """The results file's tables: per run the per-stage comparison, then the summary."""
    import pandas as pd

    from sim.commands.compare import StageComparison, format_stages

    out = [f"vLLM runs on H100 from {doc['source']}; simulated with specbatch's shipped profiles", ""]
    for run in doc["runs"]:
        out.append(f"{run['run']} ({run['model']}) on {run['profile']}:")
        comparison = StageComparison(pd.DataFrame(run["table"]).fillna(math.nan), pd.DataFrame(run["stages"]),
                                     None, None)
        out += [format_stages(comparison), ""]
    out.append("Per stage (error = (simulated - real) / real; none where the real engine did not keep up):")
    out.append(f"{'run':<28}{'stage':>6}{'req/s':>7}{'mean E2E':>10}{'p99 E2E':>9}{'mean ITL':>10}"
               f"{'mean TTFT':>11}  kept up: real / simulation")
    for run in doc["runs"]:
        for stage in run["stages"]:
            cells = []
            for metric, stat, _ in TARGETS:
                row = next(r for r in run["table"] if r["stage"] == stage["stage"] and r["metric"] == metric
                           and r["stat"] == stat)
                value = row["rel_error"]
                cells.append("-" if stage["real_saturated"] or value is None else f"{100 * value:+.1f}%")
            kept = {True: "no", False: "yes", None: "?"}
            out.append(f"{run['run']:<28}{stage['stage']!s:>6}{stage['rate_rps']:>7.1f}{cells[0]:>10}{cells[3]:>9}"
                       f"{cells[1]:>10}{cells[2]:>11}  {kept[stage['real_saturated']]} / {kept[stage['sim_saturated']]}")
    summary = doc["summary"]
    out.append("")
    out.append(f"median |error| over the {summary['stages_judged']} stages the real engine kept up with (target):")
    for metric, stat, target in TARGETS:
        value = summary["median_abs_error"][f"{stat}_{metric}"]
        shown = "n/a" if value is None else f"{100 * value:.1f}%"
        verdict = "" if value is None else ("  met" if value <= target else "  not met")
        out.append(f"  {stat} {metric.upper():<5} {shown:>7}  (<= {100 * target:.0f}%){verdict}")
    for tp, part in summary.get("by_tensor_parallel_size", {}).items():
        cells = "  ".join(f"{stat} {metric.upper()} {100 * part['median_abs_error'][f'{stat}_{metric}']:.1f}%"
                          for metric, stat, _ in TARGETS if part["median_abs_error"][f"{stat}_{metric}"] is not None)
        out.append(f"  TP {tp} ({part['stages_judged']} stages): {cells}")
    behind = summary["sim_fell_behind_where_real_kept_up"]
    out.append("stages the real engine kept up with but the simulation fell behind in: "
               + (", ".join(behind) if behind else "none"))
    out.append(f"not covered by a shipped profile: {', '.join(doc['not_covered']) or 'none'}")
    for name, fit in (doc.get("fitted_terms") or {}).items():
        if not fit:
            continue
        terms = ", ".join(f"{t} {1e3 * v:.3f} ms" for t, v in fit["terms"].items())
        where = f"carried over from {fit['carried_from']}, " if fit["carried_from"] else ""
        out.append(f"{name}: {terms} ({where}fitted by specbatch fit to {', '.join(fit['fitted_on'] or [])}); "
                   "runs fitted to are in-sample for these terms")
        test = fit.get("leave_one_out_test")
        if test:
            cells = ", ".join(f"{label} {100 * test[key]:.1f}%" for label, key in (
                ("mean E2E", "mean_e2e"), ("mean ITL", "mean_itl"), ("mean TTFT", "mean_ttft"), ("p99 E2E", "p99_e2e"))
                if test.get(key) is not None)
            out.append(f"  the fit's leave-one-run-out test (median |error| over the held-out runs' stages): {cells}")
    out += ["", *term_table(doc)]
    return "\n".join(out)


def term_table(doc: dict) -> list[str]:
    """Per stage the real engine kept up with: the mean ITL error beside the share of each composed term
    in a decode pass at that stage's batch and context, and the factor the collectives would need for
    the error to vanish (if they alone were off: 1 - error / share)."""
    out = ["What a decode pass is made of at each stage's simulated mean batch and context (composed terms), "
           "beside the mean ITL error:",
           f"{'run':<32}{'stage':>6}{'batch':>7}{'ITL err':>9}{'GEMMs':>8}{'attn':>7}{'other':>7}{'collect.':>9}"
           f"  collectives x to close it"]
    for run in doc["runs"]:
        for term in run.get("terms") or []:
            stage = next(s for s in run["stages"] if s["stage"] == term["stage"])
            if stage["real_saturated"]:
                continue
            error = next(r["rel_error"] for r in run["table"] if r["stage"] == term["stage"] and r["metric"] == "itl"
                         and r["stat"] == "mean")
            shares = term["shares"]
            comm = shares.get("communication", 0.0)
            other = 1.0 - shares["gemm"] - shares["attention"] - comm
            factor = f"{1 - error / comm:.2f}" if comm > 0 else "-"
            out.append(f"{run['run']:<32}{term['stage']:>6}{term['batch']:>7.1f}{100 * error:>+8.1f}%"
                       f"{100 * shares['gemm']:>7.1f}%{100 * shares['attention']:>6.1f}%{100 * other:>6.1f}%"
                       f"{100 * comm:>8.1f}%  {factor}")
    warm = [run for run in doc["runs"] if run.get("warm_up", {}).get("slow_requests")]
    if warm:
        out += ["", f"The real engines' start: requests of the first {warm[0]['warm_up']['seconds']:g} s slower than "
                    "1.5x their stage's median E2E, and the first stage's p99 E2E error without those seconds:"]
        for run in warm:
            w = run["warm_up"]
            whole = next(r["rel_error"] for r in run["table"] if r["stage"] == w["stage"] and r["metric"] == "e2e"
                         and r["stat"] == "p99")
            out.append(f"  {run['run']:<32} {w['slow_requests']:>3} slow; p99 E2E {100 * whole:+.1f}% with them, "
                       f"{100 * w['p99_e2e_error_after']:+.1f}% without")
    return out


def figure(comparisons: dict, path: Path) -> None:
    """Real vs simulated latency CDFs: one row per run, TTFT / ITL / E2E."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FuncFormatter, NullFormatter

    names = list(comparisons)
    fig, axes = plt.subplots(len(names), 3, figsize=(12, 2.6 * len(names)), squeeze=False)
    for row, name in enumerate(names):
        samples = comparisons[name].samples
        judged = samples[samples.ok & samples.real_e2e.notna()]
        for col, (metric, label) in enumerate((("ttft", "TTFT (ms)"), ("itl", "ITL (ms)"), ("e2e", "E2E (ms)"))):
            ax = axes[row][col]
            for side, style in (("real", "-"), ("sim", "--")):
                values = np.sort(judged[f"{side}_{metric}"].dropna().to_numpy()) * 1e3
                if values.size:
                    ax.plot(values, np.arange(1, values.size + 1) / values.size, style,
                            label="real vLLM" if side == "real" else "simulated")
            low, high = ax.get_xlim()
            if high > 10 * max(low, 1e-9):  # a wide range (an overloaded run): log scale, plain labels
                ax.set_xscale("log")
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
            if col == 0:
                ax.set_ylabel(f"{name}\nCDF", fontsize=8)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    fig.suptitle("vLLM 0.15.1 on H100 (real, requests that succeeded) against specbatch (simulated, same requests)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))  # room for the title above the first row
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    from sim.atomic_write import write_file

    write_file(path, buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder of runs.json and the runs (default: %(default)s)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results file to write (default: %(default)s)")
    parser.add_argument("--figure", type=Path, default=FIGURE, help="CDF figure to write (default: %(default)s)")
    parser.add_argument("--runs", default="*", help="only runs matching this pattern (default: all covered)")
    parser.add_argument("--table", type=Path, metavar="FILE", help="print the tables of a results file and stop")
    args = parser.parse_args(argv)
    if args.table:
        print(tables(json.loads(args.table.read_text())))
        return 0
    sys.path.insert(0, str(ROOT))
    from sim.atomic_write import write_file
    from sim.profile import resolve_profile_path, shipped_profiles

    index = json.loads((args.data / "runs.json").read_text())
    profiles = {name: json.loads((resolve_profile_path(name) / "profile.json").read_text())
                for name in shipped_profiles()}
    doc = {"source": index["source"], "runs": [], "not_covered": []}
    comparisons = {}
    for run in index["runs"]:
        if not fnmatch.fnmatch(run["run"], args.runs):
            continue
        profile = covering_profile(run, profiles)
        if profile is None:
            doc["not_covered"].append(run["run"])
            continue
        print(f"simulating {run['run']} on {profile} ...", file=sys.stderr, flush=True)
        comparisons[run["run"]] = comparison = simulate_run(run, profile, args.data)
        doc["runs"].append(run_document(run, profile, comparison))
    doc["summary"] = summarize(doc)
    doc["fitted_terms"] = {name: fitted_terms(profiles[name]) for name in sorted({r["profile"] for r in doc["runs"]})}
    write_file(args.results, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    if comparisons:
        figure(comparisons, args.figure)
    print(tables(doc))
    print(f"wrote {args.results}" + (f" and {args.figure}" if comparisons else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
