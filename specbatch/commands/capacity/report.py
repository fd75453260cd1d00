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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import sim
from sim.atomic_write import staged_dir
from specbatch.commands.capacity.costing import Costing
from specbatch.commands.capacity.formats import money_text, num_text, policy_text
from specbatch.commands.capacity.inputs import LONGEST, SLO, SearchSettings
from specbatch.commands.capacity.search import PolicyOutcome
from specbatch.commands.figures import NO_MATPLOTLIB, have_matplotlib, place_axes, plain_log_labels
from sim.errors import InputError
from sim.stability import CONFIDENCE

MARKER = "capacity.json"
FIGURES = ("latency_vs_rate.png", "goodput_vs_rate.png", "operating_point.png")
COMPARISON_FIGURE = "cost_by_gpu.png"   # only when several profiles are compared
COLORS = ("black", "tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink")

Outcomes = dict[str, dict[str, PolicyOutcome]]   # profile name -> policy label -> outcome
Costs = dict[str, dict[str, Costing]]


@dataclass(frozen=True)
class PricedProfile:
    facts: dict[str, Any]              # name, gpu, source, device, dtype, models
    price: float | None                # $ per GPU-hour
    price_key: str | None = None       # the --gpu-price key that priced it


@dataclass(frozen=True)
class ReportInputs:
    profiles: dict[str, PricedProfile]  # by profile name, in the order given
    workload: dict[str, Any]
    slos: tuple[SLO, ...]
    settings: SearchSettings
    target_rate: float | None
    gpus_per_replica: int | None        # --gpus-per-replica; None: each profile's own (its tensor-parallel size)
    prices: str | None = None           # the price flag as given, for the record
    # --pd-ratios / --gpu-budget: the splits searched (disaggregated.SplitAsk); each is a "profile" here, one
    # unit of P prefill and D decode replicas, beside the aggregated replica
    splits: Any = field(default=None, repr=False)

    def gpus(self, name: str) -> int:
        """GPUs one replica of profile ``name`` (one unit of a split) occupies: what it costs per hour, in
        GPU-hours."""
        facts = self.profiles[name].facts
        if "split" in facts:
            return int(facts["split"]["gpus"])
        return self.gpus_per_replica or int(facts.get("gpus", 1))

    @property
    def described(self) -> dict[str, Any]:
        """What the runs ran (specbatch.commands.described): method and acceptance, the same for every profile (its
        drafter is each profile's own, in the profiles table)."""
        return next(iter(self.profiles.values())).facts["described"]

    def ran_lines(self) -> list[str]:
        """What the runs ran, for the printed table: one line, or one per profile when their drafters differ."""
        texts = {name: p.facts["described"]["text"] for name, p in self.profiles.items()}
        if len(set(texts.values())) == 1:
            return [f"Ran: {next(iter(texts.values()))}"]
        return [f"Ran on {name}: {text}" for name, text in texts.items()]

    @property
    def title(self) -> str:
        return "Capacity report: " + " vs ".join(self.profiles)

    @property
    def priced(self) -> bool:
        return any(p.price is not None for p in self.profiles.values())


def figure_names(inputs: ReportInputs) -> tuple[str, ...]:
    from specbatch.commands.capacity.disaggregated import FIGURE

    if inputs.splits is not None:
        return FIGURES + (FIGURE,)
    return FIGURES + ((COMPARISON_FIGURE,) if len(inputs.profiles) > 1 else ())


def _compares_gpus(inputs: ReportInputs) -> bool:
    """Several profiles compared by cost (not splits of one, which have their own comparison)."""
    return len(inputs.profiles) > 1 and inputs.splits is None


def write_report(out_dir: str | os.PathLike[str], inputs: ReportInputs, outcomes: Outcomes, costs: Costs) -> Path:
    """The report folder, whole or not at all; without matplotlib its figures are left out and it says so."""
    out_dir = check_out_dir(out_dir)
    figures = render_figures(inputs, outcomes, costs) if have_matplotlib() else {}
    document = results_document(inputs, outcomes, costs)
    with staged_dir(out_dir) as staging:
        for name, png in figures.items():
            (staging / name).write_bytes(png)
        (staging / "report.md").write_text(markdown(inputs, outcomes, costs, figures))
        (staging / "report.html").write_text(html_page(inputs, outcomes, costs, figures))
        (staging / MARKER).write_text(json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return out_dir


NO_FIGURES = f"No figures: {NO_MATPLOTLIB}."


def check_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Refuse (before any work) to replace a folder that is not an earlier capacity report."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not (out_dir.is_dir() and (out_dir / MARKER).is_file()):
        raise InputError("exists and is not a specbatch capacity report; refusing to replace it",
                         source=f"--out {out_dir}")
    return out_dir


# ---------------------------------------------------------------- tables



def _price_text(p: PricedProfile) -> str:
    if p.price is None:
        return "—"
    return f"${p.price:g} per GPU-hour" + (f" ({p.price_key} in --gpu-price)" if p.price_key else "")


def input_rows(inputs: ReportInputs) -> list[tuple[str, str]]:
    w, s = inputs.workload, inputs.settings
    ran = inputs.described
    return [
        ("arrivals", w["arrival"]),
        ("prompt tokens", w["prompt_tokens"]),
        ("output tokens", w["output_tokens"]),
        ("batching", w["batching"]),
        ("speculation method", ran["method_text"]),
        ("acceptance", ran["acceptance_text"]),
        ("SLOs", "; ".join(str(slo) + " ms" for slo in inputs.slos)),
        ("seeds", ", ".join(str(seed) for seed in s.seeds)),
        ("tolerance", f"{s.tolerance:g} (relative width of the final bracket)"),
        ("run length", f"arrivals over {s.service_times:g} service times, and the requests the queue test needs "
                       f"(at least {s.min_requests}); while undecided, the would-be max rate rerun longer up to "
                       f"{s.extensions} time(s), "
                       f"at most {LONGEST}x; the first {s.warmup:.0%} of each run's arrival window not measured"),
        ("stable queue", f"its growth (arrivals - completions per second) below {s.max_growth:.0%} of the arrival "
                         f"rate at {CONFIDENCE:.0%} confidence (each of {s.looks} look(s) at {s.confidence:.2%})"),
        ("target traffic", "—" if inputs.target_rate is None else f"{inputs.target_rate:g} req/s"),
        ("GPU prices", "—" if inputs.prices is None else
         f"{inputs.prices}; a replica of N GPUs costs N GPU-hours an hour"),
    ]


PROFILE_HEADER = ["profile", "source", "GPU / device", "GPUs / replica", "dtype", "target model", "drafter", "price"]


def profile_header(inputs: ReportInputs) -> list[str]:
    """With splits, each row is a way of serving (a split's unit, or the aggregated replica) on one profile."""
    if inputs.splits is None:
        return PROFILE_HEADER
    return ["serving", *PROFILE_HEADER[1:3], "GPUs / replica or split", *PROFILE_HEADER[4:]]


def profile_rows(inputs: ReportInputs) -> list[list[str]]:
    rows = []
    for name, p in inputs.profiles.items():
        f = p.facts
        device = f"{f['gpu']} [{f['device'].get('type', '?')}]"
        rows.append([name, str(f.get("source", "measured")), device, str(inputs.gpus(name)), str(f.get("dtype") or "?"),
                     str(f["models"].get("target", "?")), f["described"]["drafter"],
                     _price_text(p)])
    return rows


def price_lines(inputs: ReportInputs) -> list[str]:
    """Which price costed which profile (printed under the table: prices are the user's, never defaults)."""
    if not inputs.priced:
        return []
    return [f"Prices ({inputs.prices}): " + "; ".join(f"{name} ({p.facts['gpu']}) {_price_text(p)}"
                                                     for name, p in inputs.profiles.items())]


def result_header(inputs: ReportInputs) -> list[str]:
    cols = [("serving" if inputs.splits is not None else "profile")] if len(inputs.profiles) > 1 else []
    cols += ["policy", "max rate (req/s)", "final bracket", "saturation (req/s)"]
    cols += [f"{slo.metric} at max" for slo in inputs.slos]
    cols += ["goodput at max (req/s)", "mean k", "mean batch"]
    if inputs.target_rate is not None:
        cols.append(f"replicas for {inputs.target_rate:g} req/s")
    if inputs.priced:
        if inputs.target_rate is not None:
            cols.append("$ / 1M output tokens at target")
        cols.append("$ / 1M output tokens at max rate")
    return cols



def result_rows(inputs: ReportInputs, outcomes: Outcomes, costs: Costs) -> list[list[str]]:
    rows = []
    for name, by_policy in outcomes.items():
        for label, o in by_policy.items():
            op = o.operating or {}
            row = [name] if len(inputs.profiles) > 1 else []
            row += [policy_text(label, o), num_text(o.max_rate) if o.max_rate > 0 else "none meets the SLOs",
                    f"{num_text(o.bracket[0])} – {num_text(o.bracket[1])}", num_text(o.probe.throughput)]
            row += [num_text(op.get(slo.metric)) for slo in inputs.slos]
            row += [num_text(op.get("goodput")), num_text(op.get("mean_k"), 3), num_text(op.get("mean_batch_size"), 3)]
            c = costs[name][label]
            if inputs.target_rate is not None:
                row.append("—" if c.replicas is None else str(c.replicas))
            if inputs.priced:
                if inputs.target_rate is not None:
                    row.append(money_text(c.cost_per_m_at_target))
                row.append(money_text(c.cost_per_m_at_max_rate))
            rows.append(row)
    return rows


def evidence_header(inputs: ReportInputs) -> list[str]:
    return (["rate (req/s)", "of saturation", "requests per seed", "throughput / arrivals",
             "queue growth (req/s) [bounds]", "tolerated"] + [slo.metric for slo in inputs.slos]
            + ["goodput (req/s)", "verdict"])


def evidence_rows(inputs: ReportInputs, o: PolicyOutcome) -> list[list[str]]:
    """Every rate the search (or a curve) ran for this policy, with what decided it."""
    rows = []
    for rate, point in o.points.items():
        q, st = point.queue, point.stats
        ratio = st["throughput"] / st["arrival_rate"] if st.get("arrival_rate") else None
        growth = (f"{num_text(q['growth'], 3)} [{num_text(q['low'], 3)}, {num_text(q['high'], 3)}]"
                  if "growth" in q else "—")
        runs = f"{point.requests}" + (f" ({point.look} rerun{'s' if point.look > 1 else ''}, first {point.first})"
                                      if point.look else "")
        verdict = f"{point.verdict}: {point.reason}" + (" (curve point)" if point.curve else "")
        rows.append([num_text(rate), f"{rate / o.probe.throughput:.0%}", runs, num_text(ratio, 4), growth,
                     num_text(q.get("tolerated"), 3),
                     *[f"{num_text(st.get(slo.metric))} (up to {num_text(st.get(slo.metric + '_upper'))})" for slo in inputs.slos],
                     num_text(st.get("goodput")), verdict])
    return rows


def comparison_header(inputs: ReportInputs) -> list[str]:
    target = "—" if inputs.target_rate is None else f"{inputs.target_rate:g} req/s"
    return ["profile", "GPU", "GPUs / replica", "policy", "max rate per replica (req/s)", f"replicas for {target}",
            f"GPUs for {target}", "$ / GPU-hour", "fleet $ / hour", "$ / 1M output tokens at target",
            "$ / 1M output tokens at max rate"]


def comparison_rows(inputs: ReportInputs, outcomes: Outcomes, costs: Costs) -> list[list[str]]:
    """Per profile and policy: what the same traffic needs on that GPU and what it costs."""
    rows = []
    for name, by_policy in outcomes.items():
        p = inputs.profiles[name]
        for label, o in by_policy.items():
            c = costs[name][label]
            k = o.config.policy.params.get("k")
            policy = label + (f" (k={k})" if isinstance(k, int) and ":k=" not in label else "")
            gpus = inputs.gpus(name)
            rows.append([name, p.facts["gpu"], str(gpus), policy,
                         num_text(o.max_rate) if o.max_rate > 0 else "none meets the SLOs",
                         "—" if c.replicas is None else str(c.replicas),
                         "—" if c.replicas is None else str(c.replicas * gpus),
                         "—" if p.price is None else f"${p.price:g}", money_text(c.fleet_cost_per_hour),
                         money_text(c.cost_per_m_at_target), money_text(c.cost_per_m_at_max_rate)])
    return rows


METHOD = (
    "A rate is sustained when, over the measured part of its runs (all seeds pooled), the queue is stable "
    f"(the one-sided {CONFIDENCE:.0%} upper bound of its growth, arrivals minus completions per second, is below "
    "--max-growth, 1% by default, of the arrival rate) and every SLO statistic's upper bound is within its limit. A policy's saturation "
    "throughput and a request's time in a full batch (its service time) come from a probe that sends every request at "
    "t = 0; a rate's runs last a number of service times at that rate, and are rerun longer while its verdict is "
    "undecided (still undecided at the longest, the rate fails). The search starts above saturation, steps down "
    "until a rate passes, then bisects to the tolerance; a rate undecided at its first runs counts as passing while "
    "higher rates are tried and is rerun only if it would be the max rate, the highest rate that passed. "
    "Replicas = ceil(target / max rate), assuming an even split of the traffic. Goodput = rate × the fraction of "
    "measured requests meeting every per-request limit (the tightest limit per latency), so never above the rate. "
    "The evidence tables give every rate tried with its statistics and verdict (docs/capacity.md).")

COMPARISON = (
    "Every profile serves the same traffic under the same SLOs. GPUs = replicas × GPUs per replica (a replica "
    "split over N GPUs by tensor parallelism counts N). Fleet $ / hour = replicas × GPUs per replica "
    "× the GPU's price; $ / 1M output tokens at target = fleet $ / hour over the output tokens the target "
    "traffic generates in an hour; at max rate, one replica run at its max rate (the floor, without rounding "
    "replicas up). Prices are the user's (no defaults).")


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(_md(c) for c in header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows])


def markdown(inputs: ReportInputs, outcomes: Outcomes, costs: Costs, figures: dict[str, bytes]) -> str:
    lines = [f"# {inputs.title}", "", "## Inputs", "", "| input | value |", "|---|---|"]
    lines += [f"| {k} | {_md(v)} |" for k, v in input_rows(inputs)]
    lines += ["", "## Profiles", ""] + _md_table(profile_header(inputs), profile_rows(inputs))
    if inputs.splits is not None:
        from specbatch.commands.capacity import disaggregated as pd

        lines += ["", "## Disaggregated against aggregated", ""]
        lines += _md_table(pd.header(inputs), pd.rows(inputs, outcomes, costs))
        lines += ["", f"KV link: {inputs.splits.link}. {pd.EXPLAINED}", ""]
        lines += [f"![disaggregated frontier]({pd.FIGURE})", ""] if figures else [NO_FIGURES, ""]
    if _compares_gpus(inputs):
        lines += ["", "## Cost by GPU", ""]
        lines += _md_table(comparison_header(inputs), comparison_rows(inputs, outcomes, costs))
        lines += ["", COMPARISON, ""] + ([f"![cost by gpu]({COMPARISON_FIGURE})", ""] if figures else [])
    lines += ["", "## Results", ""] + _md_table(result_header(inputs), result_rows(inputs, outcomes, costs))
    lines += ["", f"Latencies in ms. {METHOD}", "", "## Evidence per rate", ""]
    for title, o in _evidence_sections(outcomes):
        lines += [f"### {title}", "", f"Saturation probe: {num_text(o.probe.throughput)} req/s, service time "
                  f"{num_text(o.probe.service_s, 3)} s, {o.runs} runs, {o.requests:,} requests simulated.", ""]
        lines += _md_table(evidence_header(inputs), evidence_rows(inputs, o)) + [""]
    lines += ["## Figures", ""]
    lines += [f"![{name[:-4].replace('_', ' ')}]({name})" + "\n" for name in FIGURES] if figures else [NO_FIGURES, ""]
    lines += [f"Made by specbatch {sim.__version__} (`specbatch capacity`).", ""]
    return "\n".join(lines)


def _evidence_sections(outcomes: Outcomes):
    many = len(outcomes) > 1
    for name, by_policy in outcomes.items():
        for label, o in by_policy.items():
            yield (f"{name} / {label}" if many else label), o


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


def html_page(inputs: ReportInputs, outcomes: Outcomes, costs: Costs, figures: dict[str, bytes]) -> str:
    e = html.escape

    def table(header: list[str], rows: list[list[str]]) -> list[str]:
        return (["<table>", "<tr>" + "".join(f"<th>{e(c)}</th>" for c in header) + "</tr>"]
                + ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows] + ["</table>"])

    def image(name: str) -> str:
        data = base64.b64encode(figures[name]).decode("ascii")
        return f'<img alt="{e(name[:-4].replace("_", " "))}" src="data:image/png;base64,{data}">'

    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e(inputs.title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:4px 8px;"
             "text-align:left;font-size:90%}th{background:#eee}img{max-width:100%;display:block;margin:1em 0}"
             "</style></head><body>", f"<h1>{e(inputs.title)}</h1>", "<h2>Inputs</h2>", "<table>"]
    parts += [f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in input_rows(inputs)]
    parts += ["</table>", "<h2>Profiles</h2>"] + table(profile_header(inputs), profile_rows(inputs))
    if inputs.splits is not None:
        from specbatch.commands.capacity import disaggregated as pd

        parts += ["<h2>Disaggregated against aggregated</h2>"] + table(pd.header(inputs), pd.rows(inputs, outcomes, costs))
        parts += [f"<p>KV link: {e(inputs.splits.link)}. {e(pd.EXPLAINED)}</p>"]
        parts += [image(pd.FIGURE)] if figures else [f"<p>{e(NO_FIGURES)}</p>"]
    if _compares_gpus(inputs):
        parts += ["<h2>Cost by GPU</h2>"] + table(comparison_header(inputs), comparison_rows(inputs, outcomes, costs))
        parts += [f"<p>{e(COMPARISON)}</p>"] + ([image(COMPARISON_FIGURE)] if figures else [])
    parts += ["<h2>Results</h2>"] + table(result_header(inputs), result_rows(inputs, outcomes, costs))
    parts += [f"<p>Latencies in ms. {e(METHOD)}</p>", "<h2>Evidence per rate</h2>"]
    for title, o in _evidence_sections(outcomes):
        parts += [f"<h3>{e(title)}</h3>", f"<p>Saturation probe: {e(num_text(o.probe.throughput))} req/s, service time "
                  f"{e(num_text(o.probe.service_s, 3))} s, {o.runs} runs, {o.requests:,} requests simulated.</p>"]
        parts += table(evidence_header(inputs), evidence_rows(inputs, o))
    parts += ["<h2>Figures</h2>"]
    parts += [image(name) for name in FIGURES] if figures else [f"<p>{e(NO_FIGURES)}</p>"]
    parts += [f"<p>Made by specbatch {e(sim.__version__)} (<code>specbatch capacity</code>).</p>", "</body></html>", ""]
    return "\n".join(parts)


def results_document(inputs: ReportInputs, outcomes: Outcomes, costs: Costs) -> dict:
    s = inputs.settings

    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, np.generic):
            return clean(value.item())
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    profiles = {}
    for name, by_policy in outcomes.items():
        policies = {}
        for label, o in by_policy.items():
            c = costs[name][label]
            policies[label] = {
                "policy": {"name": o.config.policy.name, **o.config.policy.params},
                "saturation_probe": {"throughput_req_s": o.probe.throughput, "service_s": o.probe.service_s,
                                     "mean_batch_size": o.probe.mean_batch_size},
                "max_rate_req_s": o.max_rate, "bracket_req_s": [o.bracket[0], o.bracket[1]], "runs": o.runs,
                "requests_simulated": o.requests,
                "operating_point": {k: clean(v) for k, v in (o.operating or {}).items()},
                "replicas": c.replicas, "fleet_cost_per_hour": c.fleet_cost_per_hour,
                "cost_per_m_output_tokens_at_target": c.cost_per_m_at_target,
                "cost_per_m_output_tokens_at_max_rate": c.cost_per_m_at_max_rate,
                "points": [clean(point.document()) for point in o.points.values()],
            }
        p = inputs.profiles[name]
        profiles[name] = {**p.facts, "gpu_hour_price": p.price, "price_key": p.price_key, "policies": policies}
    return {
        "specbatch_version": sim.__version__,
        "profiles": profiles, "profile_order": list(inputs.profiles), "workload": inputs.workload,
        "slos": {slo.metric: slo.limit_ms for slo in inputs.slos},
        "search": {"seeds": list(s.seeds), "tolerance": s.tolerance, "service_times": s.service_times,
                   "extensions": s.extensions, "longest_rerun": LONGEST, "min_requests": s.min_requests,
                   "warmup": s.warmup, "curve_points": s.curve_points,
                   "stable_queue": {"max_growth_of_arrivals": s.max_growth, "confidence": CONFIDENCE,
                                    "confidence_per_look": s.confidence}},
        "target_rate_req_s": inputs.target_rate, "prices": inputs.prices,
        "gpus_per_replica": {name: inputs.gpus(name) for name in inputs.profiles},
        **(_splits_document(inputs, outcomes, costs, clean) if inputs.splits is not None else {}),
    }


def _splits_document(inputs: ReportInputs, outcomes: Outcomes, costs: Costs, clean) -> dict:
    from specbatch.commands.capacity import disaggregated as pd

    ask = inputs.splits
    prefill = {"prefill_profile": ask.prefill_profile} if ask.prefill_profile is not None else {}
    return {"disaggregated": {"gpu_budget": ask.budget, "kv_link": ask.link, "decode_profile": ask.decode_profile,
                              **prefill, "aggregated_gpus_per_replica": ask.aggregated_gpus,
                              "comparison": [clean(row) for row in pd.comparisons(inputs, outcomes, costs)]}}


# ---------------------------------------------------------------- figures

def render_figures(inputs: ReportInputs, outcomes: Outcomes, costs: Costs) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(label for by_policy in outcomes.values() for label in by_policy))
    colors = {label: COLORS[i % len(COLORS)] for i, label in enumerate(policies)}  # one color per policy
    out = {}
    with matplotlib.rc_context({"svg.hashsalt": "specbatch", "font.size": 9}):
        out[FIGURES[0]] = _png(plt, _latency_figure(plt, inputs, outcomes, colors))
        out[FIGURES[1]] = _png(plt, _goodput_figure(plt, outcomes, colors))
        out[FIGURES[2]] = _png(plt, _operating_figure(plt, outcomes, colors))
        if _compares_gpus(inputs):
            out[COMPARISON_FIGURE] = _png(plt, _cost_figure(plt, inputs, outcomes, costs, colors))
        if inputs.splits is not None:
            from specbatch.commands.capacity import disaggregated as pd

            by_split = {name: COLORS[i % len(COLORS)] for i, name in enumerate(outcomes)}
            out[pd.FIGURE] = _png(plt, pd.frontier_figure(plt, inputs, outcomes, by_split))
    return out


def _png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _latency_figure(plt, inputs, outcomes, colors):
    n, rows = len(inputs.slos), len(outcomes)
    fig, axes = plt.subplots(rows, n, figsize=(4.2 * n + 0.6, 3.4 * rows + 0.2), squeeze=False)
    for ax_row, (name, by_policy) in zip(axes, outcomes.items()):
        for ax, slo in zip(ax_row, inputs.slos):
            for label, o in by_policy.items():
                rates = sorted(o.points)
                ax.plot(rates, [o.points[r].stats[slo.metric] / 1e3 for r in rates], marker=".", color=colors[label],
                        label=label)
                if o.max_rate > 0:
                    ax.axvline(o.max_rate, color=colors[label], ls=":", lw=1)
            ax.axhline(slo.limit_ms / 1e3, color="dimgrey", ls="--", lw=1.5, label="SLO")
            ax.set_yscale("log")
            plain_log_labels(ax.yaxis)
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(f"{slo.metric[:-3]} (s)")
            if rows > 1:
                ax.set_title(name, fontsize=9)
            ax.grid(alpha=0.3)
        ax_row[0].legend(fontsize=7)
    place_axes(fig, axes, "Latency vs rate (pooled over seeds); dotted: each policy's max rate",
               top=0.5 + (0.25 if rows > 1 else 0.0), row_gap=1.0)
    return fig


def _goodput_figure(plt, outcomes, colors):
    n = len(outcomes)
    fig, axes = plt.subplots(1, n, figsize=(6 if n == 1 else 4.6 * n, 3.8), squeeze=False)
    for ax, (name, by_policy) in zip(axes[0], outcomes.items()):
        top = 0.0
        for label, o in by_policy.items():
            rates = sorted(o.points)
            ax.plot(rates, [o.points[r].stats["goodput"] for r in rates], marker=".", color=colors[label], label=label)
            ax.plot(rates, [o.points[r].stats.get("throughput", math.nan) for r in rates], ls=":", lw=1,
                    color=colors[label])
            top = max([top, *rates])
        ax.plot([0, top], [0, top], color="grey", ls="--", lw=1, label="offered rate")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("goodput (req/s meeting every SLO)")
        ax.set_title("Goodput vs rate, per replica (dotted: throughput)" if n == 1 else name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    title = "Goodput vs rate, per replica (dotted: throughput over the measured window)" if n > 1 else None
    place_axes(fig, axes, title, top=0.55 if n > 1 else 0.3)
    return fig


def _operating_figure(plt, outcomes, colors):
    many = len(outcomes) > 1
    shown = [(f"{name} / {label}" if many else label, label, o) for name, by_policy in outcomes.items()
             for label, o in by_policy.items() if o.steps is not None]
    fig, axes = plt.subplots(max(1, len(shown)), 2, figsize=(11, 2.2 * max(1, len(shown)) + 0.6), squeeze=False)
    if not shown:
        axes[0][0].text(0.5, 0.5, "no rate met the SLOs", ha="center", va="center")
    for row, (title, label, o) in zip(axes, shown):
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
            ax.grid(alpha=0.3)
        # one title a row, from the left panel's edge: room for a long profile name across both panels
        row[0].set_title(f"{title} at {o.max_rate:.4g} req/s", fontsize=9, loc="left")
        row[0].set_ylim(-0.3, max(1.0, float(steps["k"].max())) + 0.3)
    for ax in axes[-1]:
        ax.set_xlabel("simulated time (min)")
    place_axes(fig, axes, "At each policy's max rate (first seed): k and batch size, mean over a sliding 1/200 of the "
               "decode steps", top=0.6, row_gap=0.55, column_gap=0.75)
    return fig


def _cost_figure(plt, inputs, outcomes, costs, colors):
    """Per profile (x) and policy (bars): $ per 1M output tokens, and the replicas the target needs."""
    names = list(outcomes)
    policies = list(colors)
    at_target = inputs.target_rate is not None
    panels = [("$ per 1M output tokens" + (" at target" if at_target else " at max rate"),
               lambda c: c.cost_per_m_at_target if at_target else c.cost_per_m_at_max_rate, money_text)]
    if at_target:
        panels.append((f"replicas for {inputs.target_rate:g} req/s", lambda c: c.replicas, str))
    else:
        panels.append(("max rate per replica (req/s)", None, num_text))
    width = 0.8 / len(policies)
    x = np.arange(len(names))
    fig, axes = plt.subplots(1, len(panels), figsize=(max(8.0, 2.4 * len(names) * len(panels)), 4.2), squeeze=False)
    for ax, (title, pick, fmt) in zip(axes[0], panels):
        for i, label in enumerate(policies):
            for j, name in enumerate(names):
                if label not in outcomes[name]:
                    continue
                value = (outcomes[name][label].max_rate or None) if pick is None else pick(costs[name][label])
                pos = x[j] + (i - (len(policies) - 1) / 2) * width
                if value is None:
                    ax.text(pos, 0, "none", ha="center", va="bottom", fontsize=7, rotation=90)
                    continue
                ax.bar(pos, value, width * 0.9, color=colors[label], label=label if j == 0 else None)
                ax.text(pos, value, fmt(value), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [f"{n}\n{inputs.profiles[n].facts['gpu']}, {_price_tick(inputs.profiles[n])}"
                          for n in names], fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.margins(y=0.15)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Cost by GPU for the same traffic and SLOs" + (f" ({inputs.target_rate:g} req/s)" if at_target else ""))
    fig.tight_layout()
    return fig


def _price_tick(p: PricedProfile) -> str:
    return "no price" if p.price is None else f"${p.price:g}/GPU-h"
