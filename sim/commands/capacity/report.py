"""The capacity report: capacity.json, report.md with PNG figures beside it, and a self-contained report.html.

Everything is a function of the inputs and the simulated runs: no dates, no wall
times, no paths of temporary files, and PNGs saved without matplotlib's Software
tag, so the same inputs give the same bytes. The folder is staged and renamed into
place, so it is either a complete report or absent.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import sim
from sim.atomic_write import staged_dir
from sim.commands.capacity.costing import Costing
from sim.commands.capacity.inputs import SLO
from sim.commands.capacity.search import PolicyOutcome, SearchSettings
from sim.errors import InputError

MARKER = "capacity.json"
FIGURES = ("latency_vs_rate.png", "goodput_vs_rate.png", "operating_point.png")
COLORS = ("black", "tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink")


@dataclass(frozen=True)
class ReportInputs:
    profile: dict[str, Any]            # name, device, dtype, models
    workload: dict[str, Any]
    slos: tuple[SLO, ...]
    settings: SearchSettings
    target_rate: float | None
    price: float | None
    gpus_per_replica: int


def write_report(out_dir: str | os.PathLike[str], inputs: ReportInputs, outcomes: dict[str, PolicyOutcome],
                 costs: dict[str, Costing]) -> Path:
    out_dir = check_out_dir(out_dir)
    figures = render_figures(inputs, outcomes)
    document = results_document(inputs, outcomes, costs)
    with staged_dir(out_dir) as staging:
        for name, png in figures.items():
            (staging / name).write_bytes(png)
        (staging / "report.md").write_text(markdown(inputs, outcomes, costs))
        (staging / "report.html").write_text(html_page(inputs, outcomes, costs, figures))
        (staging / MARKER).write_text(json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return out_dir


def check_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Refuse (before any work) to replace a folder that is not an earlier capacity report."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not (out_dir.is_dir() and (out_dir / MARKER).is_file()):
        raise InputError("exists and is not a specbatch capacity report; refusing to replace it",
                         source=f"--out {out_dir}")
    return out_dir


# ---------------------------------------------------------------- tables

def _num(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.{digits}g}"


def _money(value: float | None) -> str:
    return "—" if value is None else f"${value:,.2f}"


def input_rows(inputs: ReportInputs) -> list[tuple[str, str]]:
    p, w, s = inputs.profile, inputs.workload, inputs.settings
    rows = [
        ("profile", p["name"]),
        ("device", f"{p['device'].get('name', '?')} [{p['device'].get('type', '?')}], {p.get('dtype', '?')}"),
        ("models", f"target {p['models'].get('target', '?')}, draft {p['models'].get('draft', '?')}"),
        ("arrivals", w["arrival"]),
        ("prompt tokens", w["prompt_tokens"]),
        ("output tokens", w["output_tokens"]),
        ("batching", w["batching"]),
        ("acceptance", w["acceptance"]),
        ("SLOs", "; ".join(str(slo) + " ms" for slo in inputs.slos)),
        ("seeds", ", ".join(str(seed) for seed in s.seeds)),
        ("tolerance", f"{s.tolerance:g} (relative width of the final bracket)"),
        ("run length", f"{s.requests} requests at the policy's saturation rate, scaled with the rate, "
                       f"at least {s.min_requests}; first {s.warmup:.0%} of arrivals not measured"),
        ("target traffic", "—" if inputs.target_rate is None else f"{inputs.target_rate:g} req/s"),
        ("GPU price", "—" if inputs.price is None else
         f"${inputs.price:g} per GPU-hour, {inputs.gpus_per_replica} GPU(s) per replica"),
    ]
    return rows


def result_header(inputs: ReportInputs) -> list[str]:
    cols = ["policy", "max rate (req/s)", "final bracket", "per-seed max rates"]
    cols += [f"{slo.metric} at max" for slo in inputs.slos]
    cols += ["goodput at max (req/s)", "mean k", "mean batch"]
    if inputs.target_rate is not None:
        cols.append(f"replicas for {inputs.target_rate:g} req/s")
    if inputs.price is not None:
        if inputs.target_rate is not None:
            cols.append("$ / 1M output tokens at target")
        cols.append("$ / 1M output tokens at max rate")
    return cols


def result_rows(inputs: ReportInputs, outcomes: dict[str, PolicyOutcome], costs: dict[str, Costing]) -> list[list[str]]:
    rows = []
    for label, o in outcomes.items():
        op = o.operating or {}
        params = " ".join(f"{k}={v}" for k, v in o.config.policy.params.items()  # those the label does not say
                          if not isinstance(v, (list, dict)) and f":{k}=" not in label)
        row = [f"{label}" + (f" ({params})" if params else ""),
               f"{_num(o.max_rate)} ± {_num(o.uncertainty, 2)}" if o.max_rate > 0 else "none meets the SLOs",
               f"{_num(o.bracket[0])} – {_num(o.bracket[1])}",
               ", ".join(_num(r, 3) for r in o.seed_max_rates)]
        row += [_num(op.get(slo.metric)) for slo in inputs.slos]
        row += [_num(op.get("goodput")), _num(op.get("mean_k"), 3), _num(op.get("mean_batch_size"), 3)]
        c = costs[label]
        if inputs.target_rate is not None:
            row.append("—" if c.replicas is None else str(c.replicas))
        if inputs.price is not None:
            if inputs.target_rate is not None:
                row.append(_money(c.cost_per_m_at_target))
            row.append(_money(c.cost_per_m_at_max_rate))
        rows.append(row)
    return rows


METHOD = (
    "Each rate is simulated once per seed. A rate meets the SLOs when every SLO statistic over the measured "
    "requests of all seeds pooled is within its limit and every seed keeps up (when arrivals stop, at most "
    "max_batch_size + tolerance × requests are unfinished). The search starts at the policy's saturation "
    "throughput (a probe with every request arriving at once), doubles or halves to a bracket, then bisects "
    "to the tolerance. The max rate is the highest rate that passed; ± adds half the final bracket and the "
    "standard error of the per-seed maximal rates (the same search run on each seed alone) in quadrature. "
    "Replicas = ceil(target / max rate), assuming an even split of the traffic. Goodput counts requests "
    "meeting every per-request limit (the tightest limit per latency) per second, as vLLM does.")


def markdown(inputs: ReportInputs, outcomes: dict[str, PolicyOutcome], costs: dict[str, Costing]) -> str:
    lines = [f"# Capacity report: {inputs.profile['name']}", "", "## Inputs", "", "| input | value |", "|---|---|"]
    lines += [f"| {k} | {_md(v)} |" for k, v in input_rows(inputs)]
    header = result_header(inputs)
    lines += ["", "## Results", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in result_rows(inputs, outcomes, costs)]
    lines += ["", f"Latencies in ms. {METHOD}", "", "## Figures", ""]
    lines += [f"![{name[:-4].replace('_', ' ')}]({name})" + "\n" for name in FIGURES]
    lines += [f"Made by specbatch {sim.__version__} (`specbatch capacity`).", ""]
    return "\n".join(lines)


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


def html_page(inputs: ReportInputs, outcomes: dict[str, PolicyOutcome], costs: dict[str, Costing],
              figures: dict[str, bytes]) -> str:
    e = html.escape
    title = f"Capacity report: {inputs.profile['name']}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:4px 8px;"
             "text-align:left;font-size:90%}th{background:#eee}img{max-width:100%;display:block;margin:1em 0}"
             "</style></head><body>", f"<h1>{e(title)}</h1>", "<h2>Inputs</h2>", "<table>"]
    parts += [f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in input_rows(inputs)]
    parts += ["</table>", "<h2>Results</h2>", "<table>",
              "<tr>" + "".join(f"<th>{e(c)}</th>" for c in result_header(inputs)) + "</tr>"]
    parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
              for row in result_rows(inputs, outcomes, costs)]
    parts += ["</table>", f"<p>Latencies in ms. {e(METHOD)}</p>", "<h2>Figures</h2>"]
    for name in FIGURES:
        data = base64.b64encode(figures[name]).decode("ascii")
        parts.append(f'<img alt="{e(name[:-4].replace("_", " "))}" src="data:image/png;base64,{data}">')
    parts += [f"<p>Made by specbatch {e(sim.__version__)} (<code>specbatch capacity</code>).</p>", "</body></html>", ""]
    return "\n".join(parts)


def results_document(inputs: ReportInputs, outcomes: dict[str, PolicyOutcome], costs: dict[str, Costing]) -> dict:
    s = inputs.settings

    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, np.generic):
            return clean(value.item())
        return value

    policies = {}
    for label, o in outcomes.items():
        c = costs[label]
        policies[label] = {
            "policy": {"name": o.config.policy.name, **o.config.policy.params},
            "saturation_probe_req_s": o.saturation, "window_s": o.window_s,
            "max_rate_req_s": o.max_rate, "uncertainty_req_s": o.uncertainty,
            "bracket_req_s": [o.bracket[0], o.bracket[1]], "seed_max_rates_req_s": o.seed_max_rates,
            "operating_point": {k: clean(v) for k, v in (o.operating or {}).items()},
            "replicas": c.replicas, "cost_per_m_output_tokens_at_target": c.cost_per_m_at_target,
            "cost_per_m_output_tokens_at_max_rate": c.cost_per_m_at_max_rate,
            "points": [{"rate_req_s": rate, **{k: clean(v) for k, v in stats.items()}}
                       for rate, stats in o.points.items()],
        }
    return {
        "specbatch_version": sim.__version__,
        "profile": inputs.profile, "workload": inputs.workload,
        "slos": {slo.metric: slo.limit_ms for slo in inputs.slos},
        "search": {"seeds": list(s.seeds), "tolerance": s.tolerance, "requests_at_saturation": s.requests,
                   "min_requests": s.min_requests, "warmup": s.warmup, "curve_points": s.curve_points},
        "target_rate_req_s": inputs.target_rate, "gpu_hour_price": inputs.price,
        "gpus_per_replica": inputs.gpus_per_replica, "policies": policies,
    }


# ---------------------------------------------------------------- figures

def render_figures(inputs: ReportInputs, outcomes: dict[str, PolicyOutcome]) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {label: COLORS[i % len(COLORS)] for i, label in enumerate(outcomes)}
    out = {}
    with matplotlib.rc_context({"svg.hashsalt": "specbatch", "font.size": 9}):
        out[FIGURES[0]] = _png(plt, _latency_figure(plt, inputs, outcomes, colors))
        out[FIGURES[1]] = _png(plt, _goodput_figure(plt, inputs, outcomes, colors))
        out[FIGURES[2]] = _png(plt, _operating_figure(plt, outcomes, colors))
    return out


def _png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _latency_figure(plt, inputs, outcomes, colors):
    n = len(inputs.slos)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n + 0.6, 3.6), squeeze=False)
    for ax, slo in zip(axes[0], inputs.slos):
        for label, o in outcomes.items():
            rates = sorted(o.points)
            ax.plot(rates, [o.points[r][slo.metric] / 1e3 for r in rates], marker=".", color=colors[label],
                    label=label)
            if o.max_rate > 0:
                ax.axvline(o.max_rate, color=colors[label], ls=":", lw=1)
        ax.axhline(slo.limit_ms / 1e3, color="dimgrey", ls="--", lw=1.5, label="SLO")
        ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{slo.metric[:-3]} (s)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Latency vs rate (pooled over seeds); dotted: each policy's max rate")
    fig.tight_layout()
    return fig


def _goodput_figure(plt, inputs, outcomes, colors):
    fig, ax = plt.subplots(figsize=(6, 3.8))
    top = 0.0
    for label, o in outcomes.items():
        rates = sorted(o.points)
        ax.plot(rates, [o.points[r]["goodput"] for r in rates], marker=".", color=colors[label], label=label)
        top = max([top, *rates])
    ax.plot([0, top], [0, top], color="grey", ls="--", lw=1, label="offered rate")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("goodput (req/s meeting every SLO)")
    ax.set_title("Goodput vs rate (vLLM's definition, per replica)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _operating_figure(plt, outcomes, colors):
    shown = {label: o for label, o in outcomes.items() if o.steps is not None}
    fig, axes = plt.subplots(max(1, len(shown)), 2, figsize=(11, 2.2 * max(1, len(shown)) + 0.6), squeeze=False)
    if not shown:
        axes[0][0].text(0.5, 0.5, "no rate met the SLOs", ha="center", va="center")
    for row, (label, o) in zip(axes, shown.items()):
        steps = o.steps
        decode = steps["phase"] == 1
        minutes = steps["start_s"][decode] / 60.0
        window = max(1, int(decode.sum()) // 200)  # a moving mean over about 1/200 of the run
        for ax, column, name in ((row[0], "k", "k"), (row[1], "running", "batch size")):
            values = steps[column][decode].astype(float)
            if values.size >= window:  # the mean over a sliding window of steps, drawn at the window's end
                smooth = np.convolve(values, np.ones(window) / window, mode="valid")
                ax.plot(minutes[window - 1:], smooth, color=colors[label], lw=1.2)
            ax.set_ylabel(name)
            ax.set_title(f"{label} at {o.max_rate:.4g} req/s: {name}", fontsize=9)
            ax.grid(alpha=0.3)
        row[0].set_ylim(-0.3, max(1.0, float(steps["k"].max())) + 0.3)
    for ax in axes[-1]:
        ax.set_xlabel("simulated time (min)")
    fig.suptitle("At each policy's max rate (first seed): k and batch size, mean over a sliding 1/200 of the decode steps")
    fig.tight_layout()
    return fig
