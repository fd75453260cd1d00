"""Study 6: the tuned schedule (`specbatch tune`) against goodput and the best fixed k, from 10% to 95% load.

    python docs/studies/tune.py                                # the shipped H100 profile
    python docs/studies/tune.py --profile PROFILE --out DIR

At each load (a fraction of the profile's saturation throughput without speculation,
measured first as in study 3) the script runs `specbatch tune` on the default scenario
(minimise mean E2EL; 8 bands, k 0..7; 3 search seeds, 3 held-out seeds) and keeps its
held-out comparison: the tuned schedule, `goodput`, every fixed k, `lut`, `none` and
SGLang's default ladder on the same seeds. Writes tune.csv (one row per load and policy),
tune_schedules.csv (one row per load), tune.png and tune_report.png (the report's figure at
the middle load) into the output folder and returns headline numbers.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent

FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.85, 0.95)  # of the saturation rate without speculation
NUM_REQUESTS = 1000       # per run
REPORT_FRACTION = 0.5     # whose report figure the docs show


def tune_at(profile: str, rate: float, out: Path):
    """One `specbatch tune` at this rate, its folder written to ``out``."""
    from serving import max_batch_for

    from specbatch.commands.api import tune

    return tune(profile=profile, rate=rate, num_requests=NUM_REQUESTS, max_batch_size=max_batch_for(profile),
                executor="serial", out=out)


def rows_for(fraction: float, rate: float, result) -> tuple[list[dict], dict]:
    """The held-out comparison as rows, and the load's one-line summary."""
    goal = result.plan.objective
    rows = []
    for r in result.rows:
        rows.append({"fraction": fraction, "rate": rate, "policy": r.label, "mean_e2el_s": r.value(goal) / 1e3,
                     "tuned_minus_s": r.tuned_minus.mean / 1e3, "noise_s": r.tuned_minus.noise / 1e3,
                     "mean_k": r.metrics["mean_k"], "mean_batch": r.metrics["mean_batch_size"]})
    from specbatch.commands.tune.baselines import best_baseline, verdict_level

    best = best_baseline(result.rows)
    fixed = min((r for r in result.rows if r.label.startswith("fixed")), key=lambda r: sum(r.losses))
    diff, verdict = best.tuned_minus, result.verdict_category
    found = result.search
    summary = {"fraction": fraction, "rate": rate, "schedule": result.plan.space.text(result.schedule),
               "bands": len(result.plan.space.bands), "start": result.plan.space.text(found.start),
               "moves": len(found.moves), "passes": found.passes, "search_runs": found.runs,
               "best_baseline": best.label, "best_fixed": fixed.label, "verdict": verdict,
               "tuned_vs_best_rel": diff.mean / (sum(best.losses) / len(best.losses)),
               "noise_rel": diff.interval(verdict_level(result.rows)) / (sum(best.losses) / len(best.losses))}
    return rows, summary


def plot(table: pd.DataFrame, schedules: pd.DataFrame, name: str, sat: float, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_k) = plt.subplots(1, 2, figsize=(13, 4.6))
    wide = table.pivot_table(index="fraction", columns="policy", values="mean_e2el_s")
    fixed = [c for c in wide.columns if c.startswith("fixed")]
    best_fixed = wide[fixed].min(axis=1)
    lut = next(c for c in wide.columns if c.startswith("lut"))
    goodput = next(c for c in wide.columns if c.startswith("goodput"))
    noise = table[table.policy.isin(fixed)].copy()
    noise["best"] = noise.apply(lambda r: wide.loc[r.fraction, fixed].idxmin() == r.policy, axis=1)
    band = noise[noise.best].set_index("fraction")["noise_s"] / best_fixed
    for label, column, style in (("tuned", "tuned", dict(color="tab:red", lw=2.2, marker="o")),
                                 ("goodput", goodput, dict(color="tab:green", lw=1.6, marker="s")),
                                 ("lut", lut, dict(color="tab:grey", lw=1.4, marker="^", ls="--"))):
        ax.plot(wide.index, wide[column] / best_fixed, label=label, **style)
    ax.fill_between(band.index, 1 - band, 1 + band, color="tab:blue", alpha=0.15, lw=0,
                    label="best fixed k ± 95% of the tuned difference")
    ax.axhline(1.0, color="tab:blue", lw=1)
    ax.set_xlabel(f"request rate / saturation ({sat:.3g} req/s without speculation)")
    ax.set_ylabel("mean E2EL / best fixed k's (held-out seeds)")
    ax.set_title("tuned vs goodput vs lut, relative to the best fixed k", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)

    cmap = plt.get_cmap("viridis")
    for i, row in enumerate(schedules.itertuples()):
        xs, ys = [], []
        for part in row.schedule.split():
            batch, k = part.split(":")
            lo, _, hi = batch.partition("-")
            xs += [int(lo), int(hi or lo) + 1]
            ys += [int(k)] * 2
        ax_k.plot(xs, [y + 0.04 * (i - len(schedules) / 2) for y in ys], color=cmap(i / max(1, len(schedules) - 1)),
                  lw=1.8, label=f"{row.fraction:.0%}")
    ax_k.set_xscale("log", base=2)
    ax_k.set_xlabel("batch size")
    ax_k.set_ylabel("k (lines offset slightly to separate them)")
    ax_k.set_title("the tuned schedule at each load", fontsize=10)
    ax_k.grid(alpha=0.3)
    ax_k.legend(fontsize=7, title="load", title_fontsize=7)
    fig.suptitle(f"specbatch tune across load, {name} (mean E2EL, 3 held-out seeds)", fontsize=10)
    fig.tight_layout()
    path = out_dir / "tune.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(profile: str, out_dir: Path) -> dict:
    from rates import saturation_rate

    from sim.costmodel.profile import load_profile

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = load_profile(profile).name
    sat = saturation_rate(profile)
    rows, summaries = [], []
    with tempfile.TemporaryDirectory(prefix="study-tune-") as scratch:
        for fraction in FRACTIONS:
            folder = Path(scratch) / f"load-{fraction}"
            result = tune_at(profile, fraction * sat, folder)
            load_rows, summary = rows_for(fraction, fraction * sat, result)
            rows += load_rows
            summaries.append(summary)
            print(f"  {fraction:.0%}: {summary['schedule']} ({summary['verdict']} vs {summary['best_baseline']})",
                  flush=True)
            if fraction == REPORT_FRACTION:
                shutil.copyfile(folder / "tune.png", out_dir / "tune_report.png")
    table, schedules = pd.DataFrame(rows), pd.DataFrame(summaries)
    table.round(6).to_csv(out_dir / "tune.csv", index=False)
    schedules.round(6).to_csv(out_dir / "tune_schedules.csv", index=False)
    plot(table, schedules, name, sat, out_dir)
    wide = table.pivot_table(index="fraction", columns="policy", values="mean_e2el_s")
    goodput = next(c for c in wide.columns if c.startswith("goodput"))
    return {
        "profile": name,
        "saturation_req_s": round(sat, 6),
        "fractions": list(FRACTIONS),
        "num_requests": NUM_REQUESTS,
        "verdicts": dict(zip(map(str, FRACTIONS), schedules.verdict)),
        "within_noise_or_better": int((schedules.verdict != "worse").sum()),
        "worst_tuned_vs_best_baseline_rel": round(float(schedules.tuned_vs_best_rel.max()), 4),
        "tuned_vs_goodput_rel_range": [round(float(v), 4) for v in (wide["tuned"] / wide[goodput] - 1).agg(["min", "max"])],
        "moves_total": int(schedules.moves.sum()),
    }


if __name__ == "__main__":  # the same flags as run_all.py, for this study alone
    from run_all import main

    sys.exit(main(["--only", "tune", *sys.argv[1:]]))
