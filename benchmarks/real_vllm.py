"""The simulator against real vLLM, out of sample: every dev run the project can compose.

    python benchmarks/real_vllm.py [--data DIR ...] [--results FILE] [--figure PNG] [--runs PATTERN]
    python benchmarks/real_vllm.py --table FILE     # print a results file's tables, run nothing

The dev runs are every ``runs.json`` folder given (default: ``../shared/validation/vllm-h100``,
the BLIS project's sixteen vLLM 0.15.1 runs on H100 SXM, and ``vllm-llmservingsim``, three
vLLM 0.19 runs on other GPUs; their READMEs say how they were made): per request the arrival,
prompt and output length, the measured TTFT and E2E latency, and where recorded the prompt
id and the stage. A run is simulated on the shipped profile whose target has the run's shape
(layers, widths, heads, KV heads, vocabulary) on the run's GPU at its tensor-parallel size, composed
at the sampling vLLM did for the run's requests (GENERATION_SAMPLING: the model's generation_config.json
where the client asked for none), else on the profile ``specbatch compose`` writes for the run's model,
GPU and size; either way the run asks for that sampling (``workload.sampling``, priced from the
profile's verify points for it). A run it
cannot compose (a model compose cannot read, a GPU without kernel data, data parallelism) is
listed with the reason, in one line. Each is simulated request for request by ``specbatch
compare`` (specbatch.commands.compare.compare_measured) with the run's own engine settings: the
vllm-v1 scheduler, max_num_seqs, max_num_batched_tokens, block size, the KV cache vLLM logged
(gpu_kv_blocks x block size tokens; else the profile's), chunked prefill, and prefix caching
with the prompt ids where the simulator has them (vLLM V1's defaults where a run did not log
a setting).

No fitted term is scored on the model it was fitted to. The two terms no independent data
gives (the frontend's latency per request, the engine's exposed time per step) are fitted
leaving one model out (specbatch.commands.fit.fit_on_grid: the step time over EXPOSED_GRID_S, one
simulation of every run at each value, the latency in closed form), for each of TERM_SETS;
the set whose held-out error is least is what profiles carry (its value on every model is
sim/compose/build.py's, which compose writes), and the headline scores each run with that
set fitted without its model. The physics alone (no fitted term) is summarised beside it,
and the signed median error per group of runs beside the results this file replaced.

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
section "Against real vLLM on H100" is generated from; a new file keeps the first file's
"before"), the figure (real vs simulated
latency CDFs per run) to ``docs/figures/real-vllm-cdf.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import shutil
import tempfile
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = next((p / "shared" / "validation" for p in ROOT.parents if (p / "shared" / "validation").is_dir()),
                  ROOT.parent / "shared" / "validation")
DATA = (VALIDATION / "vllm-h100", VALIDATION / "vllm-llmservingsim")  # the dev runs: every folder's runs.json
RESULTS = ROOT / "benchmarks" / "results" / "real_vllm.json"
FIGURE = ROOT / "docs" / "figures" / "real-vllm-cdf.png"
TARGETS = (("e2e", "mean", 0.03), ("itl", "mean", 0.03), ("ttft", "mean", 0.10), ("e2e", "p99", 0.05))
SHAPE = {"hidden_size": "hidden_dim", "intermediate_size": "intermediate_dim", "num_layers": "num_layers",
         "num_heads": "num_heads", "num_kv_heads": "num_kv_heads", "vocab_size": "vocab_size"}
# The engine's exposed time per step is fitted on this grid (each value one simulation of every run);
# the frontend's latency per request in closed form at each (specbatch.commands.fit.fit_on_grid).
EXPOSED_GRID_S = tuple(round(i * 5e-5, 6) for i in range(21))  # 0 to 1 ms by 0.05 ms
# What a profile may carry, tried in turn: the set whose held-out error is least is what ships.
TERM_SETS = {"none": (), "request latency": ("request_latency_s",),
             "request latency + exposed step time": ("request_latency_s", "exposed_overhead_s")}
VLLM_BLOCK_SIZE = 16  # vLLM's default KV block, where a run did not log its own
# What vLLM's sampler did each step of a run (sim/compose/sampler.py). The BLIS runs' client,
# inference-perf, sends no sampling parameters (its completion body: model, prompt, max_tokens,
# ignore_eos, stream; the runs' profile.yaml sets none), so vLLM 0.15.1 sampled as each model's
# generation_config.json says (--generation-config auto, logged as "Using default completion sampling
# params from model"), else at its own default temperature 1. By model family, first match of the
# lower-case id: CodeLlama and Mistral's models set no sampling (random sampling at temperature 1, no
# sort); Llama 2 and Llama 3 set temperature 0.6 and top_p 0.9, Qwen3 temperature 0.6, top_k 20 and
# top_p 0.95 (nucleus sampling: vLLM 0.15 sorts the vocabulary). Runs of other engines or clients (the
# vLLM 0.19 runs: their sampling was not recorded) are simulated greedy, the profiles' default.
GENERATION_SAMPLING = (("codellama", "random"), ("mistralai/", "random"), ("meta-llama/llama-2", "top-p"),
                       ("meta-llama/llama-3", "top-p"), ("meta-llama/meta-llama-3", "top-p"), ("qwen/qwen3", "top-p"))
CLIENT_WITHOUT_SAMPLING = "vllm 0.15"  # the BLIS runs' engine (their runs.json "engine"), driven by inference-perf


def run_sampling(run: dict) -> str:
    """What vLLM's sampler did each step of ``run`` (GENERATION_SAMPLING; greedy where not recorded)."""
    if not str(run.get("engine", "")).lower().startswith(CLIENT_WITHOUT_SAMPLING):
        return "greedy"
    model = str(run.get("model", "")).lower()
    return next((mode for family, mode in GENERATION_SAMPLING if family in model), "greedy")


def profile_sampling(meta: dict) -> str:
    """The sampling a profile was composed at (its ``verify / target`` points; a composed sidecar says where it is
    not greedy)."""
    return meta.get("composition", {}).get("sampling", "greedy")


def gpu_key(name: str) -> str:
    """'h100_sxm' and 'H100-SXM-80GB' alike: lower-case letters and digits, memory size dropped."""
    return re.sub(r"\d+gb$", "", re.sub(r"[^a-z0-9]", "", name.lower()))


def normalise(run: dict, folder: Path) -> dict:
    """A run of either folder's runs.json with the keys the benchmark reads (vLLM V1's defaults where
    a run did not log a setting: prefix caching and chunked prefill on, blocks of 16)."""
    prefix = run.get("prefix_caching", run.get("enable_prefix_caching"))
    return {**run, "folder": str(folder), "prefix_caching": True if prefix is None else bool(prefix),
            "chunked_prefill": True if run.get("chunked_prefill") is None else bool(run["chunked_prefill"]),
            "block_size": run.get("block_size") or VLLM_BLOCK_SIZE,
            "tensor_parallel_size": int(run.get("tensor_parallel_size") or 1)}


def covering_profile(run: dict, profiles: dict[str, dict]) -> str | None:
    """The shipped profile whose target is the run's model on the run's GPU at its TP size, composed at the
    run's sampling as benchmarks/compose_profiles.sh composes the real runs' targets (composed first); the
    others, such as a speculation pair sized for its draft, leave the run to :func:`compose_for`."""
    if "model_config" not in run:
        return None
    found = []
    for name, meta in sorted(profiles.items()):
        config = meta.get("models", {}).get("target", {}).get("config", {})
        if (all(config.get(ours) == run["model_config"].get(theirs) for ours, theirs in SHAPE.items())
                and gpu_key(meta.get("device", {}).get("gpu") or "") == gpu_key(run["gpu"])
                and int(meta.get("tensor_parallel_size", 1)) == int(run["tensor_parallel_size"])
                and profile_sampling(meta) == run_sampling(run)):
            found.append((meta.get("source") != "composed", name))
    return min(found)[1] if found else None


def data_gpu(name: str, gpus: list[str]) -> str | None:
    """The kernel data's GPU a run's GPU name is ('NVIDIA RTX PRO 6000 Blackwell Server Edition' ->
    rtx_pro_6000_server): every word of the data's name among the run's, the most words first (SXM4 and
    SXM5 read as SXM). A name that gives no form factor ('NVIDIA H100 80GB HBM3', torch's name for the
    SXM part, which names PCIe parts as such; 'H200') is the family's SXM GPU, or its one GPU; a form
    factor the data lacks (PCIe) is none."""
    words = {re.sub(r"^sxm\d$", "sxm", w) for w in re.findall(r"[a-z0-9]+", name.lower())}
    matches = [(len(g.split("_")), g) for g in gpus if set(g.split("_")) <= words]
    if matches:
        return max(matches)[1]
    if words & {"sxm", "pcie", "nvl", "server"}:
        return None
    # the family is a model number (h100, l40s; not 'rtx'); torch names PCIe parts so: no form factor is SXM
    family = [g for g in gpus if re.search(r"\d", g.split("_")[0]) and g.split("_")[0] in words]
    return next((g for g in family if g.endswith("_sxm")), family[0] if len(family) == 1 else None)


def compose_for(run: dict, scratch: Path) -> tuple[str | None, str | None]:
    """A run no shipped profile covers: the profile ``specbatch compose`` writes for its model, GPU and TP
    size (in ``scratch``; every sampling priced), or None and why it cannot be composed (one line)."""
    from specbatch.commands.compose import add_arguments, main as compose_main
    from sim.compose import data
    from sim.errors import InputError

    if int(run.get("data_parallel_size") or 1) > 1:
        ep = " with expert parallelism" if run.get("enable_expert_parallel") else ""
        return None, (f"data parallelism ({run['data_parallel_size']} ranks{ep}) is not simulated: vLLM runs each "
                      "rank as its own engine and, with expert parallelism, exchanges tokens between them "
                      "every MoE layer (all-to-all); specbatch prices a replica as one tensor-parallel group")
    root = data.systems_dir(None)
    gpus = [g.name for g in (root / "data").iterdir() if (root / f"{g.name}.yaml").is_file()
            and (g / "gemm").is_dir()]
    gpu = data_gpu(run["gpu"], gpus)
    if gpu is None:
        return None, f"no kernel data for {run['gpu']} in aiconfigurator-core {data.package_version()}"
    out = scratch / re.sub(r"[^a-z0-9.-]+", "-", run["run"].lower())
    errors = []
    for target in (run["model"], run["model"].split("/")[-1].lower(), *built_in_of(run)):  # an id, then built-ins
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        argv = ["--gpu", gpu, "--target", target, "--tp", str(run["tensor_parallel_size"]), "--out", str(out)]
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                compose_main(parser.parse_args(argv))
            return str(out), None
        except InputError as exc:
            errors.append(str(exc).splitlines()[0])
    if errors[0].startswith("target: unknown model"):
        return None, (f"model {run['model']} is not readable yet (compose knows built-in names; reading a "
                      "model from its Hugging Face config.json is issue 40's first item)")
    return None, f"not composable: {_short(errors[0])}"


def built_in_of(run: dict) -> list[str]:
    """The built-in models (calibrate --list-models) whose shape is the run's model_config's."""
    from calibrate.configs import get_config, known_models

    shape = run.get("model_config") or {}
    return [name for name in known_models()
            if shape and all(getattr(get_config(name), ours, None) == shape.get(theirs) for ours, theirs in SHAPE.items())]


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def run_overrides(run: dict, profile: str) -> dict:
    """The run's engine settings as the simulator's config keys (prefix caching where it has the key;
    the KV cache vLLM logged, else the profile's)."""
    from sim.config import KEYS

    keys = {key.name for key in KEYS}
    settings = {"profile": profile, "workload.sampling": run_sampling(run),
                "policy.name": "none", "engine.scheduler": "vllm-v1",
                "engine.max_batch_size": run["max_num_seqs"],
                "engine.max_num_batched_tokens": run["max_num_batched_tokens"],
                "engine.block_size": run.get("block_size") or VLLM_BLOCK_SIZE,
                "engine.chunked_prefill": bool(run.get("chunked_prefill", True))}
    if run.get("gpu_kv_blocks"):
        settings["engine.kv_cache_tokens"] = run["gpu_kv_blocks"] * settings["engine.block_size"]
    if "engine.enable_prefix_caching" in keys:
        settings["engine.enable_prefix_caching"] = bool(run.get("prefix_caching", True))
    return {key: (value, "runs.json") for key, value in settings.items() if key in keys}


def with_terms(profile: str, terms: dict[str, float], scratch: Path) -> Path:
    """A copy of ``profile`` (in ``scratch``) whose overhead terms are exactly ``terms`` (the others 0):
    the physics alone, or the physics with terms fitted elsewhere."""
    from sim.costmodel.profile import CSV_NAME, META_NAME, resolve_profile_path

    source = resolve_profile_path(profile)
    values = {t: float(terms.get(t, 0.0)) for t in ("exposed_overhead_s", "request_latency_s")}
    folder = scratch / (source.name + "".join(f"-{v:.7f}" for v in values.values()))
    if not folder.is_dir():
        folder.mkdir(parents=True)
        shutil.copyfile(source / CSV_NAME, folder / CSV_NAME)
        meta = json.loads((source / META_NAME).read_text())
        overhead = meta.setdefault("engine_overhead", {})
        for key in ("carried", "fitted"):
            overhead.pop(key, None)
        overhead.update(values)
        (folder / META_NAME).write_text(json.dumps(meta))
    return folder


def simulate_run(run: dict, profile: str, terms: dict[str, float], scratch: Path):
    from specbatch.commands.compare import compare_measured

    return compare_measured(Path(run["folder"]) / run["file"], None,
                            run_overrides(run, str(with_terms(profile, terms, scratch))))


def judged_rows(comparison) -> list[dict]:
    """The comparison's rows (real, simulated) of the stages the real engine kept up with."""
    kept = set(comparison.stages[comparison.stages.real_saturated == False].stage)  # noqa: E712 (None: unknown)
    return [{"stage": r["stage"], "metric": r["metric"], "stat": r["stat"], "real": r["real"], "sim": r["sim"]}
            for r in _records(comparison.table) if r["stage"] in kept and r["real"] and r["sim"] is not None]


def scored(table: list[dict], latency_s: float) -> list[dict]:
    """A run's table with the frontend's latency added (its errors recomputed)."""
    from specbatch.commands.fit import shifted_error

    return [{**r, "sim": None if r["sim"] is None else r["sim"] + (latency_s if r["metric"] in ("ttft", "e2e") else 0),
             "rel_error": None if r["sim"] is None or not r["real"] else shifted_error(r["real"], r["sim"], r["metric"],
                                                                                      latency_s)}
            for r in table]


def leave_one_model_out(rows: dict[str, dict[float, list[dict]]], model_of: dict[str, str],
                        term_set: tuple[str, ...]) -> dict[str, dict]:
    """Per model: the terms of ``term_set`` fitted on every other model's runs (stages at each grid
    value of the exposed step time) and the models they were fitted on; terms outside the set are 0."""
    from specbatch.commands.fit import fit_on_grid

    out = {}
    for model in sorted(set(model_of.values())):
        train = [run for run in rows if model_of[run] != model]
        grid = EXPOSED_GRID_S if "exposed_overhead_s" in term_set else (0.0,)
        pooled = {e: [row for run in train for row in rows[run][e]] for e in grid}
        if not term_set or not any(pooled.values()):
            out[model] = {"terms": {}, "fitted_on": []}
            continue
        terms, _ = fit_on_grid(pooled)
        out[model] = {"terms": {t: v for t, v in terms.items() if t in term_set},
                      "fitted_on": sorted({model_of[run] for run in train if rows[run][0.0]})}
    return out


def held_out_rms(rows: dict[str, dict[float, list[dict]]], model_of: dict[str, str], folds: dict[str, dict]) -> float:
    """RMS of the held-out runs' relative errors of mean ITL, mean E2E and mean TTFT, each run scored with
    the terms fitted without its model (what fit_on_grid minimises, on runs it never saw)."""
    from specbatch.commands.fit import shifted_error

    errors = []
    for run, by_grid in rows.items():
        terms = folds[model_of[run]]["terms"]
        for r in by_grid[terms.get("exposed_overhead_s", 0.0)]:
            if r["stat"] == "mean" and r["metric"] in ("itl", "e2e", "ttft"):
                errors.append(shifted_error(r["real"], r["sim"], r["metric"], terms.get("request_latency_s", 0.0)))
    return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else math.nan


def group_name(run: dict) -> str:
    """'Llama-2-70b-hf TP 4 on H100-SXM-80GB' (results written before runs recorded their GPU: H100 SXM)."""
    model = re.sub(r"-hf$", "", run["model"].split("/")[-1], flags=re.I)
    return f"{model} TP {run['tensor_parallel_size']} on {run.get('gpu', 'H100-SXM-80GB')}"


def group_medians(doc: dict) -> dict[str, dict[str, float | None]]:
    """Per group of runs (model, GPU, GPUs) the signed median error of each target statistic over the
    stages the real engine kept up with."""
    groups: dict[str, dict[str, list[float]]] = {}
    for run in doc["runs"]:
        name = group_name(run)
        errors = groups.setdefault(name, {f"{stat}_{metric}": [] for metric, stat, _ in TARGETS})
        for stage in run["stages"]:
            if stage["real_saturated"]:
                continue
            for metric, stat, _ in TARGETS:
                row = next(r for r in run["table"] if r["stage"] == stage["stage"] and r["metric"] == metric
                           and r["stat"] == stat)
                if row["rel_error"] is not None:
                    errors[f"{stat}_{metric}"].append(row["rel_error"])
    return {name: {key: _median(values) for key, values in errors.items()} for name, errors in sorted(groups.items())}


def run_document(run: dict, profile: str, comparison, physics: list[dict], fold: dict) -> dict:
    """A run's entry: ``table`` is the headline (scored with the shipped terms fitted without its model),
    ``physics_table`` the same simulation without any fitted term."""
    tp = int(run["tensor_parallel_size"])
    return {"run": run["run"], "model": run["model"], "profile": Path(profile).name, "tensor_parallel_size": tp,
            "gpu": run["gpu"], "source": Path(run["folder"]).name,
            "settings": {key: Path(value).name if key == "profile" else value  # a composed one's scratch folder: its name
                         for key, (value, _) in run_overrides(run, profile).items()},
            "stages": _records(comparison.stages), "table": scored(_records(comparison.table),
                                                                  fold["terms"].get("request_latency_s", 0.0)),
            "physics_table": physics, "fitted": fold,
            "terms": pass_terms(profile, comparison, run_sampling(run)), "warm_up": warm_up(comparison)}


def pass_terms(profile: str, comparison, sampling: str) -> list[dict] | None:
    """Per stage, what a target decode pass is made of at the stage's simulated mean decode batch and
    context: each composed term's share (GEMMs and experts, attention, small ops, LM head, the sampler at
    the run's ``sampling``, and the collectives of a split replica). Read from the kernel data the profile was composed from; None
    for a measured profile or without the data (the gpu-data extra)."""
    from specbatch.commands.compose import pricers_for
    from sim.errors import InputError
    from sim.costmodel.profile import load_profile

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
        parts["sampler"] = float(target.verify(round(batch), 0, sampling))
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


def fitted_on(fold: dict | None) -> str:
    """'request_latency_s 7.110 ms (fitted on A, B)', or 'none' for the physics alone."""
    if not fold or not fold.get("terms"):
        return "none (physics only)"
    terms = ", ".join(f"{t} {1e3 * v:.3f} ms" for t, v in sorted(fold["terms"].items()))
    return f"{terms} (fitted on {', '.join(fold['fitted_on'])})"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def _summary_lines(summary: dict, label: str) -> list[str]:
    out = [f"{label}: median |error| over the {summary['stages_judged']} stages the real engine kept up with (target):"]
    for metric, stat, target in TARGETS:
        value = summary["median_abs_error"][f"{stat}_{metric}"]
        shown = "n/a" if value is None else f"{100 * value:.1f}%"
        verdict = "" if value is None else ("  met" if value <= target else "  not met")
        out.append(f"  {stat} {metric.upper():<5} {shown:>7}  (<= {100 * target:.0f}%){verdict}")
    for tp, part in summary.get("by_tensor_parallel_size", {}).items():
        cells = "  ".join(f"{stat} {metric.upper()} {100 * part['median_abs_error'][f'{stat}_{metric}']:.1f}%"
                          for metric, stat, _ in TARGETS if part["median_abs_error"][f"{stat}_{metric}"] is not None)
        out.append(f"  TP {tp} ({part['stages_judged']} stages): {cells}")
    return out


def tables(doc: dict) -> str:
    """The results file's tables: per run the per-stage comparison, then the summaries."""
    import pandas as pd

    from specbatch.commands.compare import StageComparison, format_stages

    out = [f"Real vLLM runs ({doc['source']}) against specbatch's composed profiles; every fitted term fitted "
           "leaving out the model it is scored on", ""]
    for run in doc["runs"]:
        out.append(f"{run['run']} ({run['model']}) on {run['profile']}; terms: {fitted_on(run.get('fitted'))}:")
        comparison = StageComparison(pd.DataFrame(run["table"]).fillna(math.nan), pd.DataFrame(run["stages"]),
                                     None, None)
        out += [format_stages(comparison), ""]
    out.append("Per stage (error = (simulated - real) / real; none where the real engine did not keep up):")
    out.append(f"{'run':<33}{'stage':>6}{'req/s':>7}{'mean E2E':>10}{'p99 E2E':>9}{'mean ITL':>10}"
               f"{'mean TTFT':>11}  kept up: real / simulation")
    for run in doc["runs"]:
        for stage in run["stages"]:
            cells = []
            for metric, stat, _ in TARGETS:
                row = next(r for r in run["table"] if r["stage"] == stage["stage"] and r["metric"] == metric
                           and r["stat"] == stat)
                cells.append("-" if stage["real_saturated"] else _cell(row["rel_error"]))
            kept = {True: "no", False: "yes", None: "?"}
            out.append(f"{run['run']:<33}{stage['stage']!s:>6}{stage['rate_rps']:>7.1f}{cells[0]:>10}{cells[3]:>9}"
                       f"{cells[1]:>10}{cells[2]:>11}  {kept[stage['real_saturated']]} / {kept[stage['sim_saturated']]}")
    out.append("")
    out += _summary_lines(doc["summary"], "Out of sample (each run with the terms fitted without its model)")
    if doc.get("summary_physics"):
        out += _summary_lines(doc["summary_physics"], "The physics alone (no fitted term)")
    behind = doc["summary"]["sim_fell_behind_where_real_kept_up"]
    out.append("stages the real engine kept up with but the simulation fell behind in: "
               + (", ".join(behind) if behind else "none"))
    lomo = doc.get("leave_one_model_out")
    if lomo:
        out += ["", "Leave one model out: RMS of the held-out runs' mean ITL, E2E and TTFT errors, per set of "
                    "fitted terms (the least is what profiles carry):"]
        for label, value in lomo["held_out_rms"].items():
            out.append(f"  {label:<40} {100 * value:6.2f}%" + ("  <- carried" if label == lomo["chosen"] else ""))
            for model, fold in (lomo.get("trials") or {}).get(label, {}).items():
                if fold["terms"]:
                    out.append(f"    {model} held out: {fitted_on(fold)}")
        if lomo["all_models"]:
            out.append("  fitted on every model (what a composed profile carries): "
                       + ", ".join(f"{t} {1e3 * v:.3f} ms" for t, v in sorted(lomo["all_models"].items())))
    groups, before = doc.get("group_medians") or {}, ((doc.get("before") or {}).get("group_medians") or {})
    if groups:
        out += ["", "Per group, signed median error (before: the in-sample results this replaced; after: out of sample):",
                f"{'group':<52}{'E2E before':>11}{'after':>8}{'ITL before':>11}{'after':>8}{'TTFT after':>11}"]
        for name, medians in groups.items():
            old = before.get(name, {})
            out.append(f"{name:<52}{_cell(old.get('mean_e2e')):>11}{_cell(medians['mean_e2e']):>8}"
                       f"{_cell(old.get('mean_itl')):>11}{_cell(medians['mean_itl']):>8}{_cell(medians['mean_ttft']):>11}")
    out.append("")
    not_covered = doc.get("not_covered") or {}
    if isinstance(not_covered, list):
        not_covered = {name: "no shipped profile covers it" for name in not_covered}
    out.append("Runs not simulated: " + ("none" if not not_covered else ""))
    out += [f"  {name}: {reason}" for name, reason in not_covered.items()]
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
    parser.add_argument("--data", type=Path, nargs="+", default=list(DATA),
                        help="folders of runs.json and the runs (default: %(default)s)")
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
    from sim.costmodel.profile import resolve_profile_path, shipped_profiles

    profiles = {name: json.loads((resolve_profile_path(name) / "profile.json").read_text())
                for name in shipped_profiles()}
    runs, sources, not_covered = [], [], {}
    missing = [folder for folder in args.data if not (folder / "runs.json").is_file()]
    if missing:
        print(f"error: --data: {missing[0]} holds no runs.json (a folder of real runs, as ../shared/validation's)",
              file=sys.stderr)
        return 2
    for folder in args.data:
        index = json.loads((folder / "runs.json").read_text())
        sources.append(f"{folder.name}: {index.get('source', folder.name)}")
        runs += [normalise(run, folder) for run in index["runs"] if fnmatch.fnmatch(run["run"], args.runs)]
    with tempfile.TemporaryDirectory(prefix="specbatch-real-vllm-") as scratch:
        scratch = Path(scratch)
        covered = {}
        for run in runs:
            profile = covering_profile(run, profiles)
            if profile is None:
                profile, reason = compose_for(run, scratch / "composed")
                if profile is None:
                    not_covered[run["run"]] = reason
                    continue
            covered[run["run"]] = (run, profile)
        model_of = {name: _target_name(profile) for name, (_, profile) in covered.items()}
        comparisons, rows = {}, {}
        for name, (run, profile) in covered.items():  # the physics alone, then each grid value where it is judged
            print(f"simulating {name} on {Path(profile).name} ...", file=sys.stderr, flush=True)
            comparisons[name] = {0.0: simulate_run(run, profile, {}, scratch)}
            rows[name] = {0.0: judged_rows(comparisons[name][0.0])}
            for exposed in EXPOSED_GRID_S[1:]:
                if rows[name][0.0]:
                    comparisons[name][exposed] = simulate_run(run, profile, {"exposed_overhead_s": exposed}, scratch)
                rows[name][exposed] = judged_rows(comparisons[name][exposed]) if rows[name][0.0] else []
        trials = {label: leave_one_model_out(rows, model_of, terms) for label, terms in TERM_SETS.items()}
        scores = {label: held_out_rms(rows, model_of, folds) for label, folds in trials.items()}
        chosen = min(TERM_SETS, key=lambda label: (scores[label], len(TERM_SETS[label])))
        from specbatch.commands.fit import fit_on_grid

        everything = {e: [r for run in rows for r in rows[run][e]] for e in EXPOSED_GRID_S}
        whole = fit_on_grid(everything if "exposed_overhead_s" in TERM_SETS[chosen] else {0.0: everything[0.0]})[0] \
            if TERM_SETS[chosen] else {}
        previous = json.loads(args.results.read_text()) if args.results.is_file() else None
        doc = {"source": "; ".join(sources), "runs": [], "not_covered": not_covered,
               "leave_one_model_out": {"grid_exposed_s": list(EXPOSED_GRID_S),
                                       "held_out_rms": scores, "chosen": chosen,
                                       "folds": trials[chosen], "trials": trials,
                                       "all_models": {t: v for t, v in whole.items() if t in TERM_SETS[chosen]}}}
        shown = {}
        for name, (run, profile) in covered.items():
            fold = trials[chosen][model_of[name]]
            exposed = fold["terms"].get("exposed_overhead_s", 0.0)
            if exposed not in comparisons[name]:  # a run with no judged stage was simulated at 0 only
                comparisons[name][exposed] = simulate_run(run, profile, {"exposed_overhead_s": exposed}, scratch)
            comparison = comparisons[name][exposed]
            physics = _records(comparisons[name][0.0].table)
            doc["runs"].append(run_document(run, profile, comparison, physics, fold))
            shown[name] = comparison
        doc["summary"] = summarize(doc)
        doc["summary_physics"] = summarize({"runs": [{**r, "table": r["physics_table"]} for r in doc["runs"]]})
        doc["group_medians"] = group_medians(doc)
        doc["before"] = (previous or {}).get("before") or ({"group_medians": group_medians(previous),
                                                           "summary": previous["summary"]} if previous else None)
    write_file(args.results, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    if shown:
        figure({name: c for name, c in shown.items()}, args.figure)
    print(tables(doc))
    print(f"wrote {args.results}" + (f" and {args.figure}" if shown else ""))
    return 0


def _target_name(profile: str) -> str:
    """The model a profile's target is (runs are grouped by it when one model is left out)."""
    from sim.costmodel.profile import load_profile

    return load_profile(profile).meta["models"]["target"]["name"]


if __name__ == "__main__":
    sys.exit(main())
