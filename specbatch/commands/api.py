"""The Python API, for notebooks and scripts: ``import specbatch`` (the top-level module re-exports this).

``run``, ``sweep`` and ``capacity`` are the commands without the command line (and
``assert_no_regression``/``check_baseline`` are ``specbatch regress``'s, from
:mod:`specbatch.commands.regress`): the same
config resolution (:func:`sim.config.load_config`), the same simulation and the same
one-line :class:`~sim.errors.InputError` for bad input, raised instead of printed. Keywords
are named like the ``specbatch run`` flags (``rate``, ``num_requests``, ``max_batch_size``,
``policy``, ``k``...), so a bad one reads as the CLI's error for that flag; ``overrides``
takes dotted config keys (``{"workload.rate": 0.2}``). Nothing is written to disk unless
asked for (``out=``, ``timeline=``).

This module lives with the commands because it is one: it composes the core (config,
simulate) and the other commands (outputs, sweep, capacity) and is imported by nothing
of the core.
"""

from __future__ import annotations

import contextlib
import html
import io
import math
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbatch.commands.figures import plain_log_labels
from specbatch.commands.regress import assert_no_regression, check_baseline
from sim.config import RunConfig, key_for, load_config
from sim.errors import InputError

__all__ = ["InputError", "Run", "RunWarning", "CapacityReport", "run", "sweep", "capacity", "compare", "validate",
           "tune", "compose", "assert_no_regression", "check_baseline"]


class RunWarning(UserWarning):
    """What ``specbatch run`` prints as a ``warning:`` line (a queue that grows without bound, a
    step priced far outside the profile's grid), raised as a Python warning by :func:`run`."""

# The summary table's rows: (label, summary key, scale, format).
_SUMMARY_ROWS = (
    ("requests completed", "completed", 1, "{:.0f}"),
    ("request throughput (req/s)", "request_throughput", 1, "{:.4g}"),
    ("output throughput (tok/s)", "output_throughput", 1, "{:.4g}"),
    ("mean / p99 TTFT (ms)", ("mean_ttft_ms", "p99_ttft_ms"), 1, "{:.1f}"),
    ("mean / p99 TPOT (ms)", ("mean_tpot_ms", "p99_tpot_ms"), 1, "{:.1f}"),
    ("mean / p99 E2EL (ms)", ("mean_e2el_ms", "p99_e2el_ms"), 1, "{:.1f}"),
    ("acceptance rate (%)", "acceptance_rate", 100, "{:.1f}"),
    ("mean acceptance length", "mean_acceptance_length", 1, "{:.3f}"),
    ("mean k", "mean_k", 1, "{:.3f}"),
    ("mean batch size (decode)", "mean_batch_size", 1, "{:.2f}"),
    ("engine steps", "num_steps", 1, "{:.0f}"),
)


# ---------------------------------------------------------------------------------------------
# run


@dataclass(frozen=True)
class Run:
    """One simulated run: its metrics, per-request and per-step records, and the resolved config."""

    summary: dict[str, Any]   # the metrics, as summary.json's "metrics" (NaN where it writes null)
    requests: pd.DataFrame    # one row per request, as requests.csv
    steps: pd.DataFrame       # one row per engine step, as steps.csv
    config: RunConfig
    warnings: tuple[str, ...]
    out: Path | None          # the run folder, when one was asked for
    result: Any = field(repr=False)  # the sim.simulate.RunResult behind it

    def document(self) -> dict[str, Any]:
        """The whole summary.json of this run (version, digest, profile, policy, metrics, ...)."""
        from specbatch.commands.outputs import summary_document

        return summary_document(self.result)

    def vllm_result(self, percentile_metrics: str = "ttft,tpot,itl", metric_percentiles: str = "99",
                    detailed: bool = False) -> dict[str, Any]:
        """This run as ``vllm bench serve --save-result`` writes its JSON (flat; ``detailed``: with
        the per-request lists of --save-detailed), statistics chosen as vLLM's flags choose them."""
        import argparse

        from specbatch.commands.vllm_bench import result_document, selection

        chosen = selection(argparse.Namespace(percentile_metrics=percentile_metrics,
                                              metric_percentiles=metric_percentiles))
        return result_document(self.result, *chosen, detailed)

    def __str__(self) -> str:
        from specbatch.commands.outputs import format_summary

        return format_summary(self.result)

    def _repr_html_(self) -> str:
        cfg = self.config
        title = (f"specbatch run: {html.escape(cfg.profile)}, policy {html.escape(cfg.policy.name)}, "
                 f"{cfg.engine.batching} batching, seed {cfg.seed}")
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
                       f"<td style='text-align:right'>{html.escape(value)}</td></tr>"
                       for label, value in summary_rows(self.summary))
        table = f"<table><caption>{title}</caption>{rows}</table>"
        figure = latency_cdf_svg(self.requests)
        if figure is None:  # no matplotlib: the table alone
            return table
        return (f"<div style='display:flex;gap:2em;align-items:flex-start'><div>{table}</div>"
                f"<div style='max-width:520px'>{figure}</div></div>")


def run(config: str | os.PathLike[str] | None = None, *, overrides: dict[str, Any] | None = None,
        **settings: Any) -> Run:
    """Simulate one run: ``specbatch.run(profile=..., policy="goodput", rate=2.0, num_requests=500)``.

    ``config``: a scenario TOML file (as ``specbatch run --config``); ``overrides``: dotted
    keys with plain values; ``settings``: keywords named like the run flags, which win over
    both. ``policy`` may also be a table, ``{"name": "lut", "table": [[1, 4, 3]]}``. With
    ``out=FOLDER`` the run folder is written as ``specbatch run --out`` writes it; with
    ``timeline=FILE`` the Chrome trace too.
    """
    from specbatch.commands.outputs import run_to_folder

    resolved = load_config(config, {**(overrides or {}), **_keywords(settings)})
    result, out = run_to_folder(resolved, default_folder=False,
                                warn=lambda text: warnings.warn(text, RunWarning, stacklevel=4))
    return Run(dict(result.summary), result.requests, result.steps, result.config, tuple(result.warnings),
               out, result)


def validate(config: str | os.PathLike[str] | None = None, *, overrides: dict[str, Any] | None = None,
             repeat: int = 1, logic: bool = True, acceptance: str = "synthetic", **settings: Any) -> dict[str, Any]:
    """Replay a scenario for real and measure the simulator's error: ``specbatch validate`` (needs torch).

    ``repeat`` replays of the same seed give the noise floor; ``logic`` plays each replay's
    measured steps back through the simulator's loop. Returns validation.json's document
    (``metrics``, ``noise_floor``, ``logic``, ``step_cost``, ``tost``, ...) with the printed
    report under ``"report"``. With ``out=FOLDER`` the folder is written as the CLI writes
    it (otherwise into a temporary folder, removed). Ctrl-C raises KeyboardInterrupt.
    """
    from specbatch.commands.validation import replay_repeats, write_validation

    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise InputError(f"must be a whole number >= 1, not {repeat!r}", field="repeat")
    resolved = load_config(config, {**(overrides or {}), **_keywords(settings)})
    if resolved.cluster.replicas != 1:
        raise resolved.error("cluster.replicas", "the real replay serves one replica")
    replays = replay_repeats(resolved, repeat, acceptance)
    if replays[-1][1].partial:
        raise KeyboardInterrupt
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(resolved.output.dir) if resolved.output.dir is not None else Path(scratch) / "validation"
        document, report = write_validation(replays, out, acceptance, logic=logic)
    return {**document, "report": report}


def _keywords(settings: dict[str, Any], allowed: set[str] | None = None) -> dict[str, tuple[Any, str]]:
    """Keywords -> load_config overrides, each sourced as its flag (so errors read as the CLI's);
    vllm bench serve's random dataset keywords (``random_input_len``...) become the lengths, its sampling
    keywords (``temperature``, ``top_p``...) the sampling."""
    from specbatch.commands.flags import RUN_FLAGS, one_name_per_setting
    from specbatch.commands.vllm_bench import DATASET_KEYWORDS, SAMPLING_KEYWORDS, dataset_overrides, sampling_overrides

    one_name_per_setting(settings, as_flag=lambda name: f"--{name.replace('_', '-')}")  # rate= and request_rate=
    flags = {key: flag for flag, (key, _, _) in RUN_FLAGS.items()}
    overrides: dict[str, tuple[Any, str]] = {}
    if allowed is None and any(name in settings for name in DATASET_KEYWORDS):
        settings = dict(settings)
        dataset = {name: settings.pop(name, None) for name in DATASET_KEYWORDS}
        lengths = any(name in settings for name in ("prompt_tokens", "output_tokens"))
        overrides.update(dataset_overrides(dataset, lengths))
    if allowed is None and any(name in settings for name in SAMPLING_KEYWORDS):
        settings = dict(settings)
        overrides.update(sampling_overrides({name: settings.pop(name, None) for name in SAMPLING_KEYWORDS},
                                            "sampling" in settings))
    for name, value in settings.items():
        key = key_for(name)
        flag = flags.get(key)
        if flag is None or "." in name or (allowed is not None and flag not in allowed):
            known = sorted(flag[2:].replace("-", "_") for flag in (allowed or RUN_FLAGS))
            raise InputError(f"unknown keyword (known: {', '.join(known)}; or overrides={{'section.key': value}})",
                             field=name)
        if key == "policy.name" and isinstance(value, dict):
            params = dict(value)
            if not isinstance(params.get("name"), str):
                raise InputError(f"a policy table needs a name, got {value!r}", source=flag)
            overrides.update({f"policy.{k}": (v, flag) for k, v in params.items()})
        elif key == "policy.name" and isinstance(value, str):
            from specbatch.commands.flags import policy_overrides
            overrides.update(policy_overrides(value, flag))  # "lut:alpha=0.7", as the CLI takes it
        else:
            overrides[key] = (value, flag)
    return overrides


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline metrics as (label, text) rows."""
    def text(key: str, scale: float, fmt: str) -> str:
        value = summary.get(key)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return "n/a"
        return fmt.format(value * scale)

    rows = []
    for label, keys, scale, fmt in _SUMMARY_ROWS:
        keys = keys if isinstance(keys, tuple) else (keys,)
        rows.append((label, " / ".join(text(k, scale, fmt) for k in keys)))
    return rows


def latency_cdf_svg(requests: pd.DataFrame) -> str | None:
    """The TTFT, TPOT and E2EL distributions as one inline SVG; None without matplotlib.

    Drawn on a bare Figure (no pyplot), so it neither needs nor changes a notebook's backend.
    """
    try:
        from matplotlib import rc_context
        from matplotlib.figure import Figure
    except ImportError:
        return None
    import numpy as np

    fig = Figure(figsize=(5.2, 3.4))
    ax = fig.subplots()
    for column, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2el_s", "E2EL")):
        values = np.sort(requests[column].to_numpy(dtype=float) * 1e3)
        values = values[np.isfinite(values)]
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=label)
    ax.set_xscale("log")
    plain_log_labels(ax.xaxis)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("latency CDF")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    buffer = io.StringIO()
    with rc_context({"svg.hashsalt": "specbatch"}):  # element ids from a fixed salt: the same run, the same SVG
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # inline: without the XML prolog and doctype


# ---------------------------------------------------------------------------------------------
# sweep


def sweep(spec: dict[str, Any], *, out: str | os.PathLike[str] | None = None, executor: str = "pool",
          workers: int | None = None, dask: str | None = None, progress: bool = False) -> pd.DataFrame:
    """Run a sweep given as a dict in the sweep file's shape; returns its table (one row per cell).

    ``{"scenario": {"workload": {"num_requests": 200}}, "axes": {"rate": [0.5, 1], "policy": ["none",
    "goodput"]}}``. Every cell is resolved before any runs (a bad axis is one InputError naming
    it). ``executor``: ``pool`` (a local process pool of ``workers``), ``serial`` (this process)
    or ``dask``, on the scheduler at ``dask`` (an address, or ``local`` for a LocalCluster, the
    default). Workers never run the calling script again, so no ``__main__`` guard is needed.
    With ``out=FOLDER`` the cells and sweep.parquet/csv are written there, and a rerun resumes;
    without, the sweep runs in a temporary folder that is removed afterwards.
    """
    from specbatch.commands.sweep.executors import have_dask
    from specbatch.commands.sweep.runner import EXECUTORS, run_sweep
    from specbatch.commands.sweep.spec import sweep_from_data
    from specbatch.commands.sweep.store import have_pyarrow

    if executor not in EXECUTORS:
        raise InputError(f"'{executor}' is not one of {', '.join(EXECUTORS)}", field="executor")
    if dask is not None and executor != "dask":
        raise InputError(f"a Dask address runs the sweep on Dask: give executor='dask', not '{executor}'", field="dask")
    if executor == "dask" and not have_dask():
        raise InputError("needs dask.distributed: pip install 'specbatch[sweep]'", field="executor")
    if workers is not None and workers < 1:
        raise InputError(f"must be at least 1, got {workers}", field="workers")
    resolved = sweep_from_data(spec)
    settings = {"executor": executor, "workers": workers, "dask_address": dask or "local", "progress": progress}
    if out is not None:
        from sim.atomic_write import check_output, output_lock

        check_output(out, folder=True, field="out")
        parquet = have_pyarrow()
        with output_lock(out, field="out"):
            return run_sweep(resolved, Path(out), parquet=parquet, csv=not parquet, **settings).table
    with tempfile.TemporaryDirectory(prefix="specbatch-sweep-") as folder:
        return run_sweep(resolved, Path(folder), parquet=False, csv=False, **settings).table


# ---------------------------------------------------------------------------------------------
# capacity


@dataclass(frozen=True)
class CapacityReport:
    """A capacity search's results: a table (one row per policy), the text the CLI prints, the search."""

    table: pd.DataFrame
    text: str
    result: Any = field(repr=False)  # specbatch.commands.capacity.cli.CapacityResult: outcomes, costs, inputs
    out: Path | None = None
    splits: pd.DataFrame | None = None  # with pd_ratios / gpu_budget: each split beside aggregated on its GPUs

    def __str__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return self.table.to_html(index=False, float_format=lambda v: f"{v:.4g}")


def capacity(config: str | os.PathLike[str] | None = None, *, slo: dict[str, float] | list[str],
             policies: str | list[str] = "none,fixed,goodput", seeds: int | None = None,
             tolerance: float | None = None, service_times: float | None = None, extensions: int | None = None,
             max_growth: float | None = None, min_requests: int | None = None, warmup: float | None = None,
             curve_points: int | None = None, target_rate: float | None = None, gpu_hour_price: float | None = None,
             gpus_per_replica: int | None = None, profiles: str | list[str] | None = None,
             gpu_price: str | dict[str, float] | None = None, tp: str | list[int] | None = None,
             pd_ratios: str | list[str] | None = None, gpu_budget: int | None = None,
             prefill_profile: str | None = None, jobs: int = 1, out: str | os.PathLike[str] | None = None, progress: bool = False,
             overrides: dict[str, Any] | None = None, **settings: Any) -> CapacityReport:
    """The highest request rate one replica serves within the SLOs, per policy (``specbatch capacity``).

    ``slo``: ``{"p99_ttft_ms": 2000, "p90_tpot_ms": 500}``; ``policies``: names with parameters
    as the CLI writes them (``["none", "fixed:k=2", "goodput"]``); ``settings``: the workload
    keywords of the run flags (``profile``, ``prompt_tokens``, ``alpha``, ``seed``...). With
    ``out=FOLDER`` the report (HTML, Markdown, JSON, figures) is written there. To compare
    GPUs: ``profiles=["h100-...", "h200-..."]`` and ``gpu_price={"h100": 3.9, "h200": 4.5}``;
    the table then has one row per profile and policy. ``tp=[1, 4]``: each profile split over 1 and
    4 GPUs (tensor parallelism as an axis); a replica of N GPUs costs N GPU-hours an hour.
    ``pd_ratios=["1:1", "1:2"]`` and/or ``gpu_budget=4``: disaggregated prefill:decode splits, each searched
    as one unit beside an aggregated replica (``decode_profile``, ``kv_link`` ... apply to the splits;
    ``prefill_profile`` puts their prefill pool on its own profile); the
    table then has one row per split (and ``aggregated``) and policy, and ``.splits`` compares each split
    with aggregated serving on the same GPUs. The
    search's settings (``seeds``, ``tolerance``, ``service_times``, ``extensions``, ``max_growth``,
    ``min_requests``, ``warmup``, ``curve_points``) default to the command's; ``jobs`` > 1 runs
    them on a process pool, which never runs the calling script again (no ``__main__`` guard needed).
    """
    from specbatch.commands.capacity.cli import plan_capacity, scenario_flags
    from specbatch.commands.capacity.report import check_out_dir
    from specbatch.commands.capacity.search import stderr_progress

    slos = [f"{metric}={limit}" for metric, limit in slo.items()] if isinstance(slo, dict) else list(slo)
    policy_text = policies if isinstance(policies, str) else ",".join(policies)
    profile_text = profiles if profiles is None or isinstance(profiles, str) else ",".join(profiles)
    price_text = (gpu_price if gpu_price is None or isinstance(gpu_price, str)
                  else ",".join(f"{gpu}={price:g}" for gpu, price in gpu_price.items()))
    tp_text = tp if tp is None or isinstance(tp, str) else ",".join(str(n) for n in tp)
    ratio_text = pd_ratios if pd_ratios is None or isinstance(pd_ratios, str) else ",".join(pd_ratios)
    keyword_overrides = _keywords(settings, allowed=set(scenario_flags()))
    search = {name: value for name, value in (("seeds", seeds), ("tolerance", tolerance),
                                               ("service_times", service_times), ("extensions", extensions),
                                               ("max_growth", max_growth), ("min_requests", min_requests),
                                               ("warmup", warmup),
                                               ("curve_points", curve_points)) if value is not None}
    plan = plan_capacity(config, {**(overrides or {}), **keyword_overrides}, slos=slos, policies=policy_text,
                         target_rate=_as_float(target_rate), gpu_hour_price=_as_float(gpu_hour_price),
                         gpus_per_replica=gpus_per_replica,
                         jobs=jobs, profiles=profile_text, gpu_price=price_text, tp=tp_text, pd_ratios=ratio_text,
                         gpu_budget=gpu_budget, prefill_profile=prefill_profile, **search)
    from sim.atomic_write import check_output, output_lock

    folder = check_output(check_out_dir(out), folder=True, field="out") if out is not None else None
    with output_lock(folder, field="out") if folder is not None else contextlib.nullcontext():
        result = plan.search(progress=stderr_progress if progress else None)
        if folder is not None:
            result.write(folder)
    splits = None
    if result.inputs.splits is not None:
        from specbatch.commands.capacity.disaggregated import comparisons

        splits = pd.DataFrame(comparisons(result.inputs, result.outcomes, result.costs))
    return CapacityReport(capacity_table(result), result.table_text(), result, folder, splits)


def capacity_table(result: Any) -> pd.DataFrame:
    """One row per profile and policy, in numbers: max rate and the final bracket, the saturation
    probe, the SLO statistics and operating point at that rate, and (when asked for) replicas and cost."""
    inputs, rows = result.inputs, []
    for profile, by_policy in result.outcomes.items():
        price = inputs.profiles[profile].price
        for label, outcome in by_policy.items():
            operating, costs = outcome.operating or {}, result.costs[profile][label]
            row = {"profile": profile, "gpus_per_replica": inputs.gpus(profile), "policy": label,
                   "max_rate": outcome.max_rate, "bracket_low": outcome.bracket[0],
                   "bracket_high": outcome.bracket[1], "saturation": outcome.probe.throughput, "runs": outcome.runs}
            row.update({slo.metric: operating.get(slo.metric) for slo in inputs.slos})
            row.update({name: operating.get(name) for name in ("goodput", "mean_k", "mean_batch_size")})
            if inputs.target_rate is not None:
                row["replicas"] = costs.replicas
                row["gpus"] = None if costs.replicas is None else costs.replicas * inputs.gpus(profile)
            if price is not None:
                row["gpu_hour_price"] = price
                if inputs.target_rate is not None:
                    row["cost_per_m_at_target"] = costs.cost_per_m_at_target
                row["cost_per_m_at_max_rate"] = costs.cost_per_m_at_max_rate
            rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# tune


def tune(config: str | os.PathLike[str] | None = None, *, objective: str = "mean_e2el_ms", bands: int | list[int] = 8,
         context_bands: list[int] | None = None, k_max: int | None = None, seeds: int = 3, holdout_seeds: int = 3,
         format: str = "lut", executor: str = "pool", workers: int | None = None, dask: str | None = None,
         out: str | os.PathLike[str] | None = None, progress: bool = False, overrides: dict[str, Any] | None = None,
         **settings: Any):
    """The speculation schedule (k per batch-size band) that optimises ``objective`` for this scenario
    (``specbatch tune``): ``specbatch.tune(rate=20, num_requests=2000, objective="p99_tpot_ms")``.

    ``settings``: the scenario keywords of the run flags (``profile``, ``rate``, ``rate_profile``,
    ``trace``, ``num_requests``, ``alpha``, ``goodput`` for ``objective="request_goodput"``...).
    Returns a :class:`specbatch.commands.tune.plan.TuneResult`: ``.schedule``, ``.table`` (the held-out
    comparison), ``.formats()`` (the engines' configs), ``.verdict``; ``print()`` it for the
    CLI's text. With ``out=FOLDER`` the report and every run are written there (a rerun
    resumes); without, the runs go to a temporary folder that is removed afterwards.
    """
    from specbatch.commands.tune.cli import scenario_flags
    from specbatch.commands.tune.plan import plan_tune
    from specbatch.commands.tune.report import check_out_dir

    if executor not in ("pool", "serial") and dask is None:
        raise InputError(f"'{executor}' is not one of pool, serial (or give dask=ADDRESS)", field="executor")
    plan = plan_tune(config, {**(overrides or {}), **_keywords(settings, allowed=set(scenario_flags()))},
                     objective=objective, bands=bands, contexts=context_bands, k_max=k_max, seeds=seeds,
                     holdout=holdout_seeds, fmt=format, executor="dask" if dask is not None else executor,
                     workers=workers, dask_address=dask)
    if out is None:
        with tempfile.TemporaryDirectory(prefix="specbatch-tune-") as folder:
            return plan.run(Path(folder), progress=progress)
    from sim.atomic_write import check_output, output_lock

    folder = check_output(check_out_dir(out, source="out"), folder=True, field="out")
    with output_lock(folder, field="out"):
        return plan.run_into(folder, progress=progress)


# ---------------------------------------------------------------------------------------------
# compare


def compare(result: str | os.PathLike[str], config: str | os.PathLike[str] | None = None, *,
            overrides: dict[str, Any] | None = None, **settings: Any):
    """A real run against the simulation of its requests, as ``specbatch compare FILE``:
    ``specbatch.compare("result.json", k=3)`` or ``specbatch.compare("requests.csv", max_batch_size=128)``.

    FILE is a ``vllm bench serve --save-result --save-detailed`` JSON, or a per-request
    measurement file (.csv, .csv.gz, .parquet: arrival_s, prompt_tokens, output_tokens and
    optionally prompt_id, stage, ttft_s, e2e_s, ok; docs/compare.md). Keywords are the run flags
    that do not define the workload (the file does): the engine's settings. Returns a
    :class:`specbatch.commands.compare.Comparison` for a JSON (``.table``: metric, real, sim,
    rel_error; ``.ks``: Kolmogorov-Smirnov tests), a :class:`specbatch.commands.compare.StageComparison`
    for a measurement file (``.table`` per stage, metric and statistic; ``.stages``: rate and
    whether each side kept up; ``.samples``: per request); ``print()`` either for its table.
    """
    from specbatch.commands.compare import COMPARE_FLAGS, compare_file

    return compare_file(str(result), config, {**(overrides or {}), **_keywords(settings, allowed=set(COMPARE_FLAGS))})


# ---------------------------------------------------------------------------------------------
# compose


def compose(gpu: str, target: str, out: str | os.PathLike[str], *, draft: str | None = None, tp: int = 1,
            draft_tp: int | None = None, **options: Any):
    """``specbatch compose`` from Python: write a composed profile at ``out`` and return it loaded
    (:class:`sim.costmodel.profile.Profile`). ``target`` and ``draft`` are what ``--target`` takes: a built-in
    name, a Hugging Face ``config.json`` or its folder, or a Hugging Face id (in the local cache or
    shipped with aiconfigurator-core). ``draft=None`` composes a target-only profile; ``tp`` is the
    GPUs per replica, ``draft_tp`` the draft's (its group or 1). Other keywords are the command's
    flags with underscores (``dtype="fp8"``, ``moe_routing=...``, ``batch_sizes=[1, 8, 64]``,
    ``k_max=4``...); a bad one raises the command's one-line :class:`InputError`. Needs the
    kernel data (``pip install -e ".[gpu-data]"``), docs/gpu-profiles.md."""
    import argparse

    from specbatch.commands import compose as command
    from sim.compose import compose as write
    from sim.costmodel.profile import load_profile

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):  # the command line's message, raised rather than printed
            raise InputError(message, field="compose")

    parser = Parser(prog="specbatch compose", allow_abbrev=False)
    command.add_arguments(parser)
    argv = ["--gpu", gpu, "--target", target, "--out", str(out), "--tp", str(tp)]
    argv += ["--draft", draft] if draft is not None else []
    argv += ["--draft-tp", str(draft_tp)] if draft_tp is not None else []
    for key, value in options.items():
        argv += ["--" + key.replace("_", "-"),
                 ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]
    args = parser.parse_args(argv)
    return load_profile(write(command.build_request(args), out))


def _as_float(value):
    """A whole number given where a rate or a price is read as that float (as the command line reads ``2``),
    so that the report's bytes do not depend on how it was typed; anything else is checked as given."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value
