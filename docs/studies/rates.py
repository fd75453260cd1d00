"""Study 3: `none` vs fixed k vs `goodput` across request rates, from low load to saturation.

    python docs/studies/rates.py                               # the shipped CPU profile
    python docs/studies/rates.py --profile PROFILE --out DIR

SmartSpec (arXiv 2406.14066) reports that a fixed speculation length cuts latency at low
load and raises it near saturation, while choosing k by goodput follows the better of the
two. Every rate here is a fraction of the profile's own saturation throughput (measured
with a short overloaded run without speculation), so the script runs unchanged on any
profile. Writes rates_e2el_tpot.png, rates_relative.png and rates.csv into the output
folder and returns headline numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent

FRACTIONS = (0.05, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0)  # of the saturation rate
SEEDS = (0, 1, 2)
FULL_BATCHES = 8            # requests per run: this many of the profile's largest batch (2,048 at 256)
FIXED_K_MAX = 4             # fixed k = 1..min(this, profile k_max); goodput's default k_max is 4 too
SATURATION_REQUESTS = 300   # the overloaded probe


def config_for(profile: str, policy: str, *, rate: float | None = None, seed: int = 0, num_requests: int | None = None,
               k: int | None = None, rate_profile: str | None = None, duration_s: float | None = None,
               alpha: float | None = None, extra: dict | None = None):
    from serving import study_config

    settings = {}
    if rate_profile is not None:
        settings.update({"workload.rate_profile": rate_profile, "workload.duration_s": duration_s})
    else:
        settings["workload.rate"] = rate
        if num_requests is not None:  # else the default scenario's duration
            settings["workload.num_requests"] = num_requests
    if k is not None:
        settings["policy.k"] = k
    if alpha is not None:
        settings["policy.alpha"] = alpha
    return study_config(profile, policy, seed, {**settings, **(extra or {})})  # extra: e.g. shorter outputs


def saturation_rate(profile: str, num_requests: int = SATURATION_REQUESTS, extra: dict | None = None) -> float:
    """Requests/s the profile serves without speculation when every request is waiting at once."""
    from sim.simulate import simulate

    probe = simulate(config_for(profile, "none", rate=1e9, num_requests=num_requests, seed=0, extra=extra))
    return float(probe.summary["request_throughput"])


def policies_for(profile: str, k_max: int = FIXED_K_MAX) -> list[tuple[str, str, int | None]]:
    """(label, policy name, k): none, fixed k = 1..K, goodput."""
    from sim.costmodel.profile import load_profile

    top = min(k_max, load_profile(profile).k_max)
    return [("none", "none", None)] + [(f"k={k}", "fixed", k) for k in range(1, top + 1)] + [("goodput", "goodput", None)]


def sweep(profile: str, fractions=FRACTIONS, seeds=SEEDS, num_requests: int | None = None,
          k_max: int = FIXED_K_MAX, saturation: float | None = None, extra: dict | None = None) -> pd.DataFrame:
    """One row per (rate, seed, policy) with the run's mean E2EL and TPOT; `extra`: more config overrides.
    Runs have FULL_BATCHES of the profile's largest batch unless ``num_requests`` says otherwise, so a
    loaded run reaches a loaded server's steady state rather than one burst."""
    from serving import max_batch_for
    from sim.simulate import simulate

    num_requests = num_requests or FULL_BATCHES * max_batch_for(profile)
    sat = saturation_rate(profile, extra=extra) if saturation is None else saturation
    rows = []
    for fraction in fractions:
        for seed in seeds:
            for label, name, k in policies_for(profile, k_max):
                s = simulate(config_for(profile, name, rate=fraction * sat, seed=seed, num_requests=num_requests,
                                        k=k, extra=extra)).summary
                rows.append({"fraction": fraction, "rate": fraction * sat, "seed": seed, "policy": label,
                             "mean_e2el_s": s["mean_e2el_ms"] / 1e3, "p99_e2el_s": s["p99_e2el_ms"] / 1e3,
                             "mean_tpot_ms": s["mean_tpot_ms"], "mean_ttft_s": s["mean_ttft_ms"] / 1e3,
                             "mean_k": s["mean_k"], "mean_batch": s["mean_batch_size"],
                             "throughput": s["request_throughput"]})
    return pd.DataFrame(rows)


def goodput_excess(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (rate, seed): goodput's mean E2EL over min(none, best fixed k), as a relative excess."""
    wide = runs.pivot_table(index=["fraction", "seed"], columns="policy", values="mean_e2el_s")
    fixed = [c for c in wide.columns if c.startswith("k=")]
    out = pd.DataFrame({"none": wide["none"], "best_fixed": wide[fixed].min(axis=1),
                        "best_fixed_k": wide[fixed].idxmin(axis=1), "goodput": wide["goodput"]})
    out["baseline"] = out[["none", "best_fixed"]].min(axis=1)
    out["excess"] = out["goodput"] / out["baseline"] - 1.0
    return out.reset_index()


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and spread (min, max over seeds) per (rate, policy)."""
    g = runs.groupby(["fraction", "rate", "policy"], sort=False)
    table = g[["mean_e2el_s", "mean_tpot_ms", "p99_e2el_s", "mean_k", "mean_batch"]].mean()
    table["e2el_min_s"] = g["mean_e2el_s"].min()
    table["e2el_max_s"] = g["mean_e2el_s"].max()
    table["tpot_min_ms"] = g["mean_tpot_ms"].min()
    table["tpot_max_ms"] = g["mean_tpot_ms"].max()
    return table.reset_index()


def plot(table: pd.DataFrame, profile_name: str, sat: float, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(table["policy"]))
    styles = {"none": dict(color="black", lw=2.2, marker="s"), "goodput": dict(color="tab:red", lw=2.2, marker="o")}
    fixed = [p for p in labels if p.startswith("k=")]
    cmap = plt.get_cmap("Blues")
    for i, p in enumerate(fixed):
        styles[p] = dict(color=cmap(0.4 + 0.6 * i / max(1, len(fixed) - 1)), lw=1.3, marker=".", ls="--")

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for p in labels:
        t = table[table["policy"] == p]
        for ax, col, lo, hi, scale in ((axes[0], "mean_e2el_s", "e2el_min_s", "e2el_max_s", 1.0),
                                       (axes[1], "mean_tpot_ms", "tpot_min_ms", "tpot_max_ms", 1.0)):
            ax.plot(t["fraction"], t[col] * scale, label=p, **styles[p])
            ax.fill_between(t["fraction"], t[lo], t[hi], color=styles[p]["color"], alpha=0.12, lw=0)
    axes[0].set_ylabel("mean E2EL (s)")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("mean TPOT (ms)")
    for ax in axes:
        ax.set_xlabel(f"request rate / saturation ({sat:.3g} req/s without speculation)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Latency vs request rate, {profile_name} (mean over {table.attrs.get('seeds', '?')} seeds; "
                 "band = min..max)", fontsize=10)
    fig.tight_layout()
    first = out_dir / "rates_e2el_tpot.png"
    fig.savefig(first, dpi=110)
    plt.close(fig)

    # Relative to `none`: below 1 speculation helps, above 1 it hurts.
    fig, ax = plt.subplots(figsize=(7, 4.4))
    base = table[table["policy"] == "none"].set_index("fraction")["mean_e2el_s"]
    for p in labels:
        if p == "none":
            continue
        t = table[table["policy"] == p].set_index("fraction")["mean_e2el_s"]
        ax.plot(t.index, t / base, label=p, **styles[p])
    ax.axhline(1.0, color="black", lw=1)
    ax.set_xlabel("request rate / saturation")
    ax.set_ylabel("mean E2EL / mean E2EL of `none`")
    ax.set_title(f"Speculation's effect on mean E2EL across load, {profile_name}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    second = out_dir / "rates_relative.png"
    fig.savefig(second, dpi=110)
    plt.close(fig)
    return [first, second]


def run(profile: str, out_dir: Path) -> dict:
    from sim.costmodel.profile import load_profile

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = load_profile(profile).name
    sat = saturation_rate(profile)
    runs = sweep(profile, saturation=sat)
    table = summarize(runs)
    table.attrs["seeds"] = len(SEEDS)
    excess = goodput_excess(runs)
    table.round(6).to_csv(out_dir / "rates.csv", index=False)
    excess.round(6).to_csv(out_dir / "rates_goodput_excess.csv", index=False)
    plot(table, name, sat, out_dir)

    wide = table.pivot_table(index="fraction", columns="policy", values="mean_e2el_s")
    fixed = [c for c in wide.columns if c.startswith("k=")]
    high = wide.index.max()
    low = wide.index.min()
    # SmartSpec's crossover: a fixed k beats `none` at low load, and is worse than `none` at high load.
    helps_low = bool(wide.loc[low, fixed].min() < wide.loc[low, "none"])
    hurts_high = [k for k in fixed if wide.loc[high, k] > wide.loc[high, "none"]]
    # The lowest rate at which the best fixed k is worse than `none` (mean over seeds).
    worse = [f for f in wide.index if wide.loc[f, fixed].min() > wide.loc[f, "none"]]
    mean_excess = excess.groupby("fraction")[["goodput", "baseline"]].mean()
    return {
        "profile": name,
        "saturation_req_s": round(sat, 6),
        "fractions": list(FRACTIONS),
        "seeds": list(SEEDS),
        "fixed_k_at_low_load_e2el_ratio_vs_none": {k: round(float(wide.loc[low, k] / wide.loc[low, "none"]), 3) for k in fixed},
        "fixed_k_at_saturation_e2el_ratio_vs_none": {k: round(float(wide.loc[high, k] / wide.loc[high, "none"]), 3) for k in fixed},
        "goodput_at_saturation_e2el_ratio_vs_none": round(float(wide.loc[high, "goodput"] / wide.loc[high, "none"]), 3),
        "fixed_k_helps_at_low_load": helps_low,
        "fixed_k_worse_than_none_at_saturation": hurts_high,
        "best_fixed_k_worse_than_none_at_fractions": worse,
        "crossover_reproduced": helps_low and bool(hurts_high),
        "goodput_worst_excess_per_run": round(float(excess["excess"].max()), 4),
        "goodput_worst_excess_seed_mean": round(float((mean_excess["goodput"] / mean_excess["baseline"] - 1).max()), 4),
    }


if __name__ == "__main__":  # the same flags as run_all.py, for this study alone
    from run_all import main

    sys.exit(main(["--only", "rates", *sys.argv[1:]]))
