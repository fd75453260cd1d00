"""A tune's folder: the schedule in every engine's format, report.md + report.html with a figure, tune.json.

Beside ``cells/`` (one file per run, the resumable store) and ``trials.csv``:

* ``schedule.toml`` (the lut or context [policy] table), ``vllm.json`` (speculative_config),
  ``sglang.json`` (the adaptive config; only when every band drafts at least one token),
  ``trtllm.txt`` (draft_len_schedule): each read back by its policy gives the tuned runs;
* ``tuned.toml``: the whole scenario with the tuned schedule, at the first held-out seed;
  ``specbatch run --config tuned.toml`` reproduces that run;
* ``report.md`` with ``tune.png``, ``report.html`` (the figure embedded), ``tune.json``; without
  matplotlib (the README's first install) no ``tune.png``, and the report says so in one line.

Every report names what ran (method, drafter, acceptance as used: ``specbatch.commands.described``).

Everything is a function of the inputs and the runs (no dates, no wall times, PNGs without
matplotlib's Software tag), each file written atomically. ``result`` below is a
:class:`specbatch.commands.tune.plan.TuneResult` (not imported: plan imports this module).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

import sim
from sim.atomic_write import write_file
from specbatch.commands.figures import NO_MATPLOTLIB, have_matplotlib, plain_log_labels
from sim.errors import InputError

MARKER = "tune.json"
FIGURE = "tune.png"
NO_FIGURE = f"No figure: {NO_MATPLOTLIB}."
FILES = {"lut": "schedule.toml", "vllm": "vllm.json", "sglang": "sglang.json", "trtllm": "trtllm.txt"}
SCENARIO = "tuned.toml"
COLUMNS = (("mean_ttft_ms", "mean TTFT (ms)"), ("p99_ttft_ms", "p99 TTFT (ms)"), ("mean_tpot_ms", "mean TPOT (ms)"),
           ("p99_tpot_ms", "p99 TPOT (ms)"), ("mean_e2el_ms", "mean E2EL (ms)"), ("p99_e2el_ms", "p99 E2EL (ms)"),
           ("request_goodput", "goodput (req/s)"), ("mean_k", "mean k"), ("mean_batch_size", "mean batch"))
ENGINE_DEFAULTS = ("vLLM without num_speculative_tokens_per_batch_size and TensorRT-LLM without draft_len_schedule "
                   "run their static num_speculative_tokens / max_draft_len at every step: the fixed k rows. SGLang's "
                   "--speculative-adaptive with its default ladder is the sglang-adaptive row.")


def check_out_dir(out: str | Path, source: str | None = None) -> Path:
    """Refuse (before any run) a folder that is neither empty nor a tune's (finished or interrupted)."""
    out = Path(out)
    if out.exists() and out.is_dir() and any(out.iterdir()) and not ((out / MARKER).is_file() or (out / "cells").is_dir()):
        raise InputError("exists and is not a specbatch tune folder; refusing to write into it",
                         source=source or f"--out {out}")
    return out


# ---------------------------------------------------------------- tables

def _num(value, digits: int = 4) -> str:
    """``digits`` significant digits, without an exponent: 0.0668, 27.34, 1753, 13270."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.0f}" if abs(value) >= 10 ** (digits - 1) else f"{value:.{digits}g}"


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: the first column left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(row) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
    return "\n".join([line(header), "-" * len(line(header)), *(line(row) for row in rows)])


def band_rows(result: "TuneResult") -> list[list[str]]:
    space, best = result.plan.space, result.schedule
    return [[space.cell_text(i), str(best[i]), f"{result.shares[i]:.1%}"] for i in range(space.size)]


BAND_HEADER = ["cell", "k", "share of the decode steps (first held-out seed)"]


SHORT = ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "p99_e2el_ms", "mean_k", "mean_batch_size")  # printed


def _columns(result: "TuneResult", short: bool) -> list[tuple[str, str]]:
    """The metric columns: goodput only with SLOs; the printed table a few of them."""
    shown = [(name, label) for name, label in COLUMNS if name != "request_goodput" or result.plan.base.output.goodput]
    return [(name, label) for name, label in shown if not short or name in SHORT or name == "request_goodput"]


def comparison_header(result: "TuneResult", short: bool = False) -> list[str]:
    o = result.plan.objective
    return ["policy", f"{o.metric} (objective)", "tuned − this (± 95%)", *(label for _, label in _columns(result, short))]


def comparison_rows(result: "TuneResult", short: bool = False) -> list[list[str]]:
    rows = []
    for r in result.rows:
        diff = r.tuned_minus
        shown = (-diff.mean if result.plan.objective.maximize else diff.mean) + 0.0  # the metric's sign; no -0
        versus = "—" if r.label == "tuned" else f"{_num(shown, 3)} ± {_num(diff.noise, 2)}"
        label = r.label if r.label != "tuned" or short else f"tuned: {result.plan.space.text(result.schedule)}"
        rows.append([label, _num(r.value(result.plan.objective)), versus,
                     *(_num(r.metrics.get(name)) for name, _ in _columns(result, short))])
    return rows


def input_rows(result: "TuneResult") -> list[tuple[str, str]]:
    plan, found = result.plan, result.search
    space = plan.space
    ran = result.described
    return [
        ("profile", plan.base.profile),
        ("speculation method", ran["method_text"]),
        ("drafter", ran["drafter"]),
        ("acceptance", ran["acceptance_text"]),
        ("objective", f"{plan.objective} (mean over seeds of each seed's statistic, vLLM's definitions)"),
        ("request goodput SLOs", "—" if not plan.base.output.goodput else
         " ".join(f"{k}:{v:g}" for k, v in plan.base.output.goodput.items()) + " (ms, vllm bench serve --goodput)"),
        ("bands", f"{len(space.bands)} batch-size bands" + ("" if space.contexts is None else
                                                          f" x {len(space.contexts)} context bands")
         + f", k in {space.k_values[0]}..{space.k_values[-1]}"),
        ("search seeds", ", ".join(map(str, plan.seeds))),
        ("held-out seeds", ", ".join(map(str, plan.holdout))),
        ("search", f"{found.runs} runs ({found.inferred} more known without running them), "
                   f"{_count(found.passes, 'pass', 'passes')} over the cells, {found.skipped} cells skipped as never "
                   f"reached, {_count(len(found.moves), 'move')} from the start {space.text(found.start)}"),
    ]


def result_text(result: "TuneResult") -> str:
    """What ``specbatch tune`` prints: what ran, the schedule, the held-out comparison, the verdict, the chosen
    format."""
    plan = result.plan
    lines = [f"Ran: {result.described['text']}",
             f"Tuned schedule ({plan.objective}): {plan.space.text(result.schedule)}",
             text_table(BAND_HEADER, band_rows(result)), "",
             f"On the held-out seeds ({', '.join(map(str, plan.holdout))}), means over seeds:",
             text_table(comparison_header(result, short=True), comparison_rows(result, short=True)), "",
             f"The tuned schedule is {result.verdict}.", ""]
    text = result.formats()[plan.fmt]
    lines += [f"As {plan.fmt} (--format):", text if text is not None else "(not expressible: see report.md)"]
    return "\n".join(lines)


# ---------------------------------------------------------------- files

def write_report(out: Path, result: "TuneResult") -> Path:
    """Every file of the folder but the runs' store; everything is computed before the first is written."""
    figure = render_figure(result) if have_matplotlib() else None
    formats = result.formats()
    report_md, report_html = markdown(result, formats, figure is not None), html_page(result, formats, figure)
    doc = json.dumps(document(result, formats), indent=2, sort_keys=True, allow_nan=False) + "\n"
    for fmt, text in formats.items():
        if text is not None:
            write_file(out / FILES[fmt], text + "\n")
        else:
            (out / FILES[fmt]).unlink(missing_ok=True)
    plan = result.plan
    tuned = plan.config(plan.candidate(result.schedule), plan.holdout[0])
    write_file(out / SCENARIO, f"# specbatch tune: the tuned schedule at held-out seed {plan.holdout[0]}\n"
                               + tuned.to_toml())
    if figure is not None:
        write_file(out / FIGURE, figure)
    else:  # an earlier tune's figure in a resumed folder would not be this report's
        (out / FIGURE).unlink(missing_ok=True)
    write_file(out / "report.md", report_md)
    write_file(out / "report.html", report_html)
    write_file(out / MARKER, doc)
    return out


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cells(row):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |"
    return [cells(header), "|" + "---|" * len(header), *(cells(row) for row in rows)]


def _formats_md(formats: dict[str, str | None]) -> list[str]:
    lines = []
    for fmt, text in formats.items():
        lines += [f"**{fmt}** (`{FILES[fmt]}`):", ""]
        lines += ["```", text, "```", ""] if text is not None else [
            "not written: SGLang drafts at least one step and this schedule has k = 0 somewhere (or has context "
            "bands); `specbatch tune --format sglang` searches k >= 1.", ""]
    return lines


def _method(result: "TuneResult") -> str:
    plan = result.plan
    return (f"The search is coordinate descent over the {plan.space.size} cells with successive halving over the "
            f"{len(plan.seeds)} search seeds (docs/tune.md); a cell whose k never acted (proved by one run per seed "
            f"giving the same bytes) is skipped, and a move must beat the noise (a one-sided paired t-test over the "
            f"seeds at 5%, divided by the candidates it was picked from). The comparison runs every policy on the "
            f"held-out seeds, which the search never saw, with the same workloads; 'tuned − this' is the mean over "
            f"those seeds of the difference in the objective, ± half its 95% confidence interval (Student's t); "
            f"within noise means the interval reaches zero. {ENGINE_DEFAULTS}")


def markdown(result: "TuneResult", formats: dict[str, str | None], figure: bool = True) -> str:
    plan = result.plan
    lines = [f"# Tuned speculation schedule: {plan.base.profile}", "", "## Inputs", "", "| input | value |", "|---|---|"]
    lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in input_rows(result)]
    lines += ["", "## The tuned schedule", "", f"`{plan.space.text(result.schedule)}`", ""]
    lines += _md_table(BAND_HEADER, band_rows(result))
    lines += ["", "## On the held-out seeds", "", f"The tuned schedule is {result.verdict}.", ""]
    lines += _md_table(comparison_header(result), comparison_rows(result))
    lines += ["", _method(result), "", f"![the tuned schedule, the comparison and the search]({FIGURE})"
              if figure else NO_FIGURE, "", "## Ready to use", ""]
    lines += _formats_md(formats)
    lines += [f"`{SCENARIO}` is the whole scenario with the tuned schedule at seed {plan.holdout[0]}.", "",
              "## The scenario", "", "```toml", plan.base.to_toml().rstrip("\n"), "```", "",
              f"Made by specbatch {sim.__version__} (`specbatch tune`).", ""]
    return "\n".join(lines)


def html_page(result: "TuneResult", formats: dict[str, str | None], figure: bytes | None) -> str:
    e = html.escape
    plan = result.plan

    def table(header, rows) -> str:
        return ("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in header) + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
                + "</table>")

    title = f"Tuned speculation schedule: {plan.base.profile}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:4px 8px;text-align:left;"
             "font-size:90%}th{background:#eee}img{max-width:100%}pre{background:#f4f4f4;padding:.5em}</style>",
             "</head><body>", f"<h1>{e(title)}</h1>", "<h2>Inputs</h2>",
             table(["input", "value"], input_rows(result)),
             "<h2>The tuned schedule</h2>", f"<p><code>{e(plan.space.text(result.schedule))}</code></p>",
             table(BAND_HEADER, band_rows(result)), "<h2>On the held-out seeds</h2>",
             f"<p>The tuned schedule is {e(result.verdict)}.</p>",
             table(comparison_header(result), comparison_rows(result)), f"<p>{e(_method(result))}</p>",
             f'<img alt="the tuned schedule, the comparison and the search" '
             f'src="data:image/png;base64,{base64.b64encode(figure).decode("ascii")}">' if figure is not None
             else f"<p>{e(NO_FIGURE)}</p>", "<h2>Ready to use</h2>"]
    for fmt, text in formats.items():
        parts.append(f"<p><b>{e(fmt)}</b> (<code>{e(FILES[fmt])}</code>):</p>"
                     + (f"<pre>{e(text)}</pre>" if text is not None else "<p>not written (SGLang drafts at least "
                        "one step, or the schedule has context bands).</p>"))
    parts += ["<h2>The scenario</h2>", f"<pre>{e(plan.base.to_toml())}</pre>",
              f"<p>Made by specbatch {e(sim.__version__)} (<code>specbatch tune</code>).</p>", "</body></html>", ""]
    return "\n".join(parts)


def document(result: "TuneResult", formats: dict[str, str | None]) -> dict:
    plan, found = result.plan, result.search
    space, goal = plan.space, plan.objective

    def clean(value):
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return {
        "specbatch_version": sim.__version__,
        "profile": plan.base.profile,
        "described": result.described,
        "objective": {"metric": goal.metric, "maximize": goal.maximize},
        "goodput_slos_ms": plan.base.output.goodput,
        "space": {"bands": [list(b) for b in space.bands],
                  "context_bands": None if space.contexts is None else [list(c) for c in space.contexts],
                  "k_values": list(space.k_values)},
        "seeds": {"search": list(plan.seeds), "holdout": list(plan.holdout)},
        "schedule": {"cells": list(result.schedule), "text": space.text(result.schedule),
                     "table": space.table(result.schedule), "decode_step_share": result.shares,
                     "formats": formats},
        "search": {"start": list(found.start), "start_text": space.text(found.start), "passes": found.passes,
                   "runs": found.runs, "inferred_runs": found.inferred, "skipped_cells": found.skipped,
                   "loss": clean(found.loss),
                   "moves": [{"cell": m.cell, "cell_text": space.cell_text(m.cell), "from_k": m.old_k, "to_k": m.new_k,
                              "objective_before": clean(goal.value(m.loss_before)),
                              "objective_after": clean(goal.value(m.loss_after)), "after_runs": m.runs}
                             for m in found.moves],
                   "history": [[runs, clean(goal.value(loss))] for runs, loss in found.history]},
        "holdout": [{"label": r.label, "policy": r.policy, "objective": clean(r.value(goal)),
                     "per_seed_objective": [clean(goal.value(v)) for v in r.losses],
                     "tuned_minus_this": clean(r.tuned_minus.mean), "standard_error": clean(r.tuned_minus.se),
                     "noise_95": clean(r.tuned_minus.noise),
                     "metrics": {k: clean(v) for k, v in r.metrics.items()}} for r in result.rows],
        "verdict": result.verdict,
        "lut_table": plan.lut_table,
        "scenario": plan.base.to_dict(),
    }


# ---------------------------------------------------------------- the figure

def render_figure(result: "TuneResult") -> bytes:
    """k by batch size (tuned, lut) with each band's share of steps; the held-out objective per policy;
    the incumbent's objective as the search went."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan, found = result.plan, result.search
    space, goal = plan.space, plan.objective
    with matplotlib.rc_context({"font.size": 9}):
        fig, (ax_k, ax_cmp, ax_search) = plt.subplots(1, 3, figsize=(15, 4.2))
        shares = ax_k.twinx()
        for c, ctx in enumerate(space.contexts or (None,)):
            xs, ys = [], []
            for i, (lo, hi) in enumerate(space.bands):
                xs += [lo, hi + 1]
                ys += [result.schedule[c * len(space.bands) + i]] * 2
            label = "tuned" if ctx is None else f"tuned, {space.cell_text(c * len(space.bands)).split(', ')[1]}"
            ax_k.plot(xs, ys, lw=2, label=label)
        xs, ys = [], []
        for start, end, k in plan.lut_table:
            xs += [start, end + 1]
            ys += [k, k]
        ax_k.plot(xs, ys, color="grey", ls="--", lw=1.2, label="lut (analytic, at alpha)")
        for i, (lo, hi) in enumerate(space.bands):
            share = sum(result.shares[c * len(space.bands) + i] for c in range(len(space.contexts or (None,))))
            shares.bar(lo, share, width=hi + 1 - lo, align="edge", color="tab:blue", alpha=0.12)
        shares.set_ylabel("share of decode steps (tuned, bars)")
        shares.set_ylim(0, 1)
        ax_k.set_xscale("log", base=2)
        plain_log_labels(ax_k.xaxis)
        ax_k.set_xlabel("batch size")
        ax_k.set_ylabel("k")
        ax_k.set_ylim(-0.3, space.k_values[-1] + 0.3)
        ax_k.set_title("k per batch-size band")
        ax_k.legend(fontsize=7, loc="upper right")
        ax_k.grid(alpha=0.3)

        labels = [r.label for r in result.rows]
        values = [r.value(goal) for r in result.rows]
        errors = [r.tuned_minus.noise for r in result.rows]
        colors = ["tab:red" if label == "tuned" else "tab:grey" for label in labels]
        positions = range(len(labels))
        ax_cmp.barh(positions, values, xerr=errors, color=colors, alpha=0.8)
        ax_cmp.set_yticks(list(positions), labels, fontsize=7)
        ax_cmp.invert_yaxis()
        finite = [v for v in values if math.isfinite(v)]
        if finite:
            ax_cmp.set_xlim(min(finite) * 0.9, max(finite) * 1.05)
        ax_cmp.set_xlabel(f"{goal.metric} ({goal.unit}), held-out seeds")
        ax_cmp.set_title("held-out seeds (error bar: 95% interval of the paired difference)")
        ax_cmp.grid(alpha=0.3, axis="x")

        runs = [r for r, _ in found.history]
        ax_search.step(runs, [goal.value(loss) for _, loss in found.history], where="post", color="tab:red",
                       marker="o")
        ax_search.set_xlabel("runs")
        ax_search.set_ylabel(f"{goal.metric} of the incumbent (search seeds)")
        ax_search.set_title(f"search: {_count(found.passes, 'pass', 'passes')}, {_count(len(found.moves), 'move')}")
        ax_search.grid(alpha=0.3)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
        plt.close(fig)
    return buffer.getvalue()
