"""Study 9: four H100s for the 8B pair — one replica split over four GPUs (TP 4 x 1) or four replicas of one (TP 1 x 4)?

    python docs/studies/tp_vs_replicas.py                   # -> docs/studies/figures/
    python docs/studies/tp_vs_replicas.py --out DIR

The same four GPUs serve the same traffic two ways: ``h100-tp4-llama-3.1-8b-llama-3.2-1b``
(Llama-3.1-8B and its 1B draft split over four GPUs, one replica) or four replicas of
``h100-llama-3.1-8b-llama-3.2-1b`` behind a round-robin router. Total rates are fractions of
a probe's throughput of the four replicas without speculation (every request sent at once); at
each, no speculation and
fixed k = 1..3 (draft-model speculation schedules synchronously, as vLLM runs it; no
speculation keeps asynchronous scheduling). Mean TTFT, TPOT and E2EL and the p99 E2EL are
compared, and the largest rate each way keeps p99 TTFT under 1 s and mean TPOT under 30 ms.
Writes tp_vs_replicas.csv and tp_vs_replicas.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from plotting import output_dir, save_figure  # noqa: E402  (the studies' folder is on the path now)

WAYS = {"TP 4 x 1": ("h100-tp4-llama-3.1-8b-llama-3.2-1b", 1), "TP 1 x 4": ("h100-llama-3.1-8b-llama-3.2-1b", 4)}
FRACTIONS = (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0)
POLICIES = ((0, "none"), (1, "k=1"), (2, "k=2"), (3, "k=3"))
SEEDS = (0, 1)
REQUESTS_PER_GPU = 512
SLO = {"p99_ttft_ms": 1000.0, "mean_tpot_ms": 30.0}


def config(profile: str, replicas: int, k: int, rate: float, seed: int, num_requests: int):
    from serving import study_config

    settings = {"workload.rate": rate, "workload.num_requests": num_requests, "cluster.replicas": replicas,
                "cluster.router": "round-robin", "engine.async_scheduling": k == 0}
    if k:
        settings["policy.k"] = k
    return study_config(profile, "fixed" if k else "none", seed, settings)


def saturation() -> float:
    """Requests/s four TP-1 replicas serve without speculation with every request waiting at once."""
    from sim.simulate import simulate

    profile, replicas = WAYS["TP 1 x 4"]
    probe = simulate(config(profile, replicas, 0, 1e9, 0, 4 * REQUESTS_PER_GPU))
    return float(probe.summary["request_throughput"])


def sweep(sat: float) -> pd.DataFrame:
    from sim.simulate import simulate

    rows = []
    for way, (profile, replicas) in WAYS.items():
        for fraction in FRACTIONS:
            for k, label in POLICIES:
                for seed in SEEDS:
                    s = simulate(config(profile, replicas, k, fraction * sat, seed, 4 * REQUESTS_PER_GPU)).summary
                    rows.append({"way": way, "fraction": fraction, "rate": fraction * sat, "policy": label,
                                 "seed": seed, "mean_ttft_ms": s["mean_ttft_ms"], "p99_ttft_ms": s["p99_ttft_ms"],
                                 "mean_tpot_ms": s["mean_tpot_ms"], "mean_e2el_ms": s["mean_e2el_ms"],
                                 "p99_e2el_ms": s["p99_e2el_ms"], "throughput": s["request_throughput"]})
    return pd.DataFrame(rows)


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    metrics = ["mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "p99_e2el_ms", "throughput"]
    table = runs.groupby(["way", "fraction", "rate", "policy"], sort=False)[metrics].mean().reset_index()
    table["meets_slo"] = (table.p99_ttft_ms <= SLO["p99_ttft_ms"]) & (table.mean_tpot_ms <= SLO["mean_tpot_ms"])
    return table


def best_rates(table: pd.DataFrame) -> pd.DataFrame:
    """Per way and policy: the highest rate of the grid meeting the SLOs at it and at every lower rate
    (``at_grid_top``: it met them at the grid's highest rate, so its own maximum lies further)."""
    rows = []
    for (way, policy), sub in table.groupby(["way", "policy"], sort=False):
        ok = sub.sort_values("fraction").meets_slo.to_numpy()
        upto = ok.argmin() if not ok.all() else len(ok)
        rate = float(sub.sort_values("fraction").rate.iloc[upto - 1]) if upto else 0.0
        rows.append({"way": way, "policy": policy, "max_rate_meeting_slo": rate, "at_grid_top": bool(ok.all())})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, sat: float, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    colors = {"none": "black", "k=1": "tab:blue", "k=2": "tab:green", "k=3": "tab:red"}
    for way, style in (("TP 4 x 1", "-"), ("TP 1 x 4", "--")):
        for policy, color in colors.items():
            t = table[(table.way == way) & (table.policy == policy)]
            for ax, col in zip(axes, ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms")):
                ax.plot(t.rate, t[col], style, color=color, marker=".", label=f"{way}, {policy}")
    for ax, label in zip(axes, ("mean TTFT (ms)", "mean TPOT (ms)", "mean E2EL (ms)")):
        ax.set_xlabel("total request rate (req/s)")
        ax.set_ylabel(label)
        if label != "mean TPOT (ms)":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Llama-3.1-8B + Llama-3.2-1B on four H100s: one replica over four GPUs (solid) or four replicas "
                 f"(dashed); mean of {len(SEEDS)} seeds; rates up to {FRACTIONS[-1]:g} x the probe's {sat:.3g} req/s",
                 fontsize=10)
    return save_figure(fig, out_dir, "tp_vs_replicas.png")


def run(profile: str | None, out_dir: Path) -> dict:
    """``profile`` is not used: the study compares its two shipped profiles."""
    from sim.costmodel.profile import load_profile

    out_dir = output_dir(out_dir)
    sat = saturation()
    table = summarize(sweep(sat))
    table.round(4).to_csv(out_dir / "tp_vs_replicas.csv", index=False)
    best = best_rates(table)
    best.round(4).to_csv(out_dir / "tp_vs_replicas_slo.csv", index=False)
    plot(table, sat, out_dir)
    low = table[table.fraction == FRACTIONS[0]].set_index(["way", "policy"])
    return {"saturation_4_replicas_req_s": round(sat, 4), "slo": SLO,
            "kv_capacity_tokens": {way: load_profile(p).kv_capacity_tokens * replicas
                                   for way, (p, replicas) in WAYS.items()},
            "max_rate_meeting_slo": {f"{r.way} {r.policy}": (">=" if r.at_grid_top else "") + f"{r.max_rate_meeting_slo:.1f}"
                                     for r in best.itertuples()},
            "low_load_mean_tpot_ms": {f"{w} {p}": round(float(v), 3) for (w, p), v in low.mean_tpot_ms.items()},
            "low_load_mean_ttft_ms": {f"{w} {p}": round(float(v), 3) for (w, p), v in low.mean_ttft_ms.items()}}


if __name__ == "__main__":  # the same flags as run_all.py, for this study alone
    from run_all import main

    sys.exit(main(["--only", "tp_vs_replicas", *sys.argv[1:]]))
