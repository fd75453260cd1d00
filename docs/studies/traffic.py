"""Study 2: fixed k vs `lut` vs `goodput` vs `none` under time-varying traffic.

    python docs/studies/traffic.py                               # the shipped CPU profile
    python docs/studies/traffic.py --profile PROFILE --out DIR

The offered load steps through phases of 0.2, 0.6, 0.95 and 0.4 of the profile's
saturation throughput (measured with a short overloaded run without speculation), the
phases together long enough for 16 of the profile's largest batches of arrivals, so the
script runs unchanged on any profile. For each policy it records latency by arrival time, the k chosen and the batch
size over time. Writes traffic_timeline.png, traffic_phases.png, traffic.csv (per phase)
and traffic_timeline.csv into the output folder and returns headline numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent

PHASES = (0.2, 0.6, 0.95, 0.4)   # offered rate per phase, as a fraction of saturation
FULL_BATCHES = 16                # expected arrivals over the whole run, in the profile's largest batches
SEEDS = (0, 1, 2, 3)              # pooled: every seed's requests go into the same buckets
BUCKETS_PER_PHASE = 6
FIXED_K = 3
SATURATION_REQUESTS = 300


def _config(profile: str, policy: str, seed: int, **settings):
    from serving import study_config

    return study_config(profile, policy, seed, settings)


def saturation_rate(profile: str, num_requests: int = SATURATION_REQUESTS) -> float:
    """Requests/s the profile serves without speculation when every request is waiting at once."""
    from sim.simulate import simulate

    probe = simulate(_config(profile, "none", 0, **{"workload.rate": 1e9, "workload.num_requests": num_requests}))
    return float(probe.summary["request_throughput"])


def policies_for(profile: str) -> list[tuple[str, str, dict]]:
    """(label, policy name, extra policy keys): fixed k, lut at the run's alpha, goodput, none."""
    from sim.costmodel.profile import load_profile

    k = min(FIXED_K, load_profile(profile).k_max)
    alpha = _config(profile, "none", 0).acceptance.alpha
    return [(f"fixed k={k}", "fixed", {"policy.k": k}), (f"lut (alpha={alpha:g})", "lut", {"policy.alpha": alpha}),
            ("goodput", "goodput", {}), ("none", "none", {})]


def simulate_traffic(profile: str, saturation: float, phases=PHASES, requests_per_run: int | None = None,
                     seeds=SEEDS) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """Every policy and seed on the same phased rate profile: (requests, decode steps, phase length in s).
    The phases' length sets about ``requests_per_run`` arrivals in all (default: FULL_BATCHES of the
    profile's largest batch)."""
    from serving import max_batch_for
    from sim.serving.records import DECODE
    from sim.simulate import simulate

    requests_per_run = requests_per_run or FULL_BATCHES * max_batch_for(profile)
    rates = [f * saturation for f in phases]
    phase_s = requests_per_run / sum(rates)  # equal phases, about requests_per_run arrivals in all
    spec = "phases:" + ",".join(f"{r:.6g}" for r in rates) + ":" + ",".join(f"{phase_s:.6g}" for _ in rates)
    requests, steps = [], []
    for label, name, extra in policies_for(profile):
        for seed in seeds:
            result = simulate(_config(profile, name, seed, **{"workload.rate_profile": spec}, **extra))
            r = result.requests.assign(policy=label, seed=seed)
            r["phase"] = np.minimum((r["arrival_s"] // phase_s).astype(int), len(phases) - 1)
            requests.append(r)
            s = result.steps
            decode = s["phase"].isin([DECODE, "decode"])  # the engine's code, or its name in a CSV
            steps.append(s[decode].assign(policy=label, seed=seed))
    return pd.concat(requests, ignore_index=True), pd.concat(steps, ignore_index=True), phase_s


def per_phase(requests: pd.DataFrame, steps: pd.DataFrame, phases, phase_s: float) -> pd.DataFrame:
    """Per policy and phase: latency of the requests arriving in it; k and batch of the steps starting in it."""
    steps = steps.assign(phase=np.minimum((steps["start_s"] // phase_s).astype(int), len(phases) - 1),
                         dur=steps["end_s"] - steps["start_s"])
    rows = []
    for (policy, phase), r in requests.groupby(["policy", "phase"], sort=False):
        s = steps[(steps["policy"] == policy) & (steps["phase"] == phase)]
        w = s["dur"].sum()
        rows.append({"policy": policy, "phase": int(phase) + 1, "load": phases[phase], "requests": len(r),
                     "mean_e2el_s": r["e2el_s"].mean(), "p99_e2el_s": r["e2el_s"].quantile(0.99),
                     "mean_ttft_s": r["ttft_s"].mean(), "mean_tpot_ms": 1e3 * r["tpot_s"].mean(),
                     "mean_k": s["k"].mean() if len(s) else np.nan,
                     "mean_batch": (s["batch_size"] * s["dur"]).sum() / w if w > 0 else np.nan})
    order = {p: i for i, p in enumerate(dict.fromkeys(requests["policy"]))}
    return pd.DataFrame(rows).sort_values(["phase", "policy"], key=lambda c: c.map(order) if c.name == "policy"
                                          else c).reset_index(drop=True)


def timeline(requests: pd.DataFrame, steps: pd.DataFrame, bucket_s: float) -> pd.DataFrame:
    """Per policy and time bucket: E2EL by arrival time, mean k and time-weighted batch size by step start."""
    r = requests.assign(bucket=(requests["arrival_s"] // bucket_s).astype(int))
    lat = r.groupby(["policy", "bucket"]).agg(mean_e2el_s=("e2el_s", "mean"),
                                              p99_e2el_s=("e2el_s", lambda x: x.quantile(0.99)),
                                              arrivals=("e2el_s", "size"))
    s = steps.assign(bucket=(steps["start_s"] // bucket_s).astype(int), dur=steps["end_s"] - steps["start_s"])
    s["bdur"] = s["batch_size"] * s["dur"]
    g = s.groupby(["policy", "bucket"])
    eng = pd.DataFrame({"mean_k": g["k"].mean(), "mean_batch": g["bdur"].sum() / g["dur"].sum()})
    out = lat.join(eng, how="outer").reset_index()
    out["t_s"] = (out["bucket"] + 0.5) * bucket_s
    return out


def colors_for(policies) -> dict:
    """The same colour for a policy in every figure."""
    colors = {"none": "black", "goodput": "tab:red"}
    for p, c in zip([p for p in policies if p not in colors], ("tab:blue", "tab:green", "tab:purple", "tab:olive")):
        colors[p] = c
    return colors


def plot(tl: pd.DataFrame, phases, phase_s: float, saturation: float, profile_name: str, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(tl["policy"]))
    colors = colors_for(policies)
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    panels = (("mean_e2el_s", "mean E2EL (s)\nby arrival time"), ("p99_e2el_s", "p99 E2EL (s)\nby arrival time"),
              ("mean_k", "k chosen\n(mean over decode steps)"), ("mean_batch", "batch size\n(time-weighted)"))
    end = len(phases) * phase_s
    for ax, (col, ylabel) in zip(axes, panels):
        for p in policies:
            t = tl[(tl["policy"] == p)].dropna(subset=[col])
            if col.endswith("e2el_s"):
                t = t[t["t_s"] < end]
            ax.plot(t["t_s"], t[col], label=p, color=colors[p], lw=1.8 if p in ("none", "goodput") else 1.3,
                    marker="." if col.endswith("e2el_s") else None, drawstyle="default" if col.endswith("e2el_s")
                    else "steps-mid")
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
        for j, f in enumerate(phases):
            ax.axvspan(j * phase_s, (j + 1) * phase_s, color="tab:orange", alpha=0.04 + 0.14 * f, lw=0)
    for j, f in enumerate(phases):
        axes[0].text((j + 0.5) * phase_s, 1.02, f"{f:g} x sat", transform=axes[0].get_xaxis_transform(),
                     ha="center", fontsize=9)
    axes[0].legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel(f"time (s); shading = offered load per phase (saturation {saturation:.3g} req/s); "
                        "steps after the last phase drain the queue")
    fig.suptitle(f"Time-varying traffic on {profile_name}", y=0.995, fontsize=11)
    fig.tight_layout()
    first = out_dir / "traffic_timeline.png"
    fig.savefig(first, dpi=100)
    plt.close(fig)
    return [first]


def plot_phases(table: pd.DataFrame, profile_name: str, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(table["policy"]))
    colors = colors_for(policies)
    phases = sorted(table["phase"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(policies)
    for i, p in enumerate(policies):
        t = table[table["policy"] == p].set_index("phase").reindex(phases)
        x = np.arange(len(phases)) + (i - (len(policies) - 1) / 2) * width
        axes[0].bar(x, t["mean_e2el_s"], width, label=p, color=colors[p])
        axes[1].bar(x, t["p99_e2el_s"], width, label=p, color=colors[p])
    loads = table.drop_duplicates("phase").set_index("phase")["load"]
    for ax, title in zip(axes, ("mean E2EL (s)", "p99 E2EL (s)")):
        ax.set_xticks(np.arange(len(phases)), [f"phase {ph}\n{loads[ph]:g} x sat" for ph in phases])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Latency of the requests arriving in each phase, {profile_name}", fontsize=10)
    fig.tight_layout()
    path = out_dir / "traffic_phases.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(profile: str, out_dir: Path) -> dict:
    from sim.costmodel.profile import load_profile

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = load_profile(profile).name
    sat = saturation_rate(profile)
    requests, steps, phase_s = simulate_traffic(profile, sat)
    table = per_phase(requests, steps, PHASES, phase_s)
    tl = timeline(requests, steps, phase_s / BUCKETS_PER_PHASE)
    table.round(4).to_csv(out_dir / "traffic.csv", index=False)
    tl.round(4).to_csv(out_dir / "traffic_timeline.csv", index=False)
    plot(tl, PHASES, phase_s, sat, name, out_dir)
    plot_phases(table, name, out_dir)

    overall = requests.groupby("policy", sort=False)["e2el_s"].agg(["mean", lambda x: x.quantile(0.99)])
    overall.columns = ["mean", "p99"]
    k_by_phase = table.pivot(index="policy", columns="phase", values="mean_k")
    return {
        "profile": name,
        "saturation_req_s": round(sat, 6),
        "phase_loads": list(PHASES),
        "phase_s": round(phase_s, 1),
        "mean_e2el_s": {p: round(float(v), 2) for p, v in overall["mean"].items()},
        "p99_e2el_s": {p: round(float(v), 2) for p, v in overall["p99"].items()},
        "best_policy_by_mean_e2el": str(overall["mean"].idxmin()),
        "mean_k_by_phase": {p: [round(float(x), 2) for x in row] for p, row in k_by_phase.iterrows()},
    }


if __name__ == "__main__":  # the same flags as run_all.py, for this study alone
    from run_all import main

    sys.exit(main(["--only", "traffic", *sys.argv[1:]]))
