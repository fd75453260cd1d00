"""Study 7: SmartSpec's 70B setting — `none` vs fixed k vs `goodput` across load, Llama-3.1-70B on 4 H100s.

    python docs/studies/smartspec_70b.py                    # the shipped TP4 profiles -> docs/studies/figures/
    python docs/studies/smartspec_70b.py --out DIR

SmartSpec (arXiv 2406.14066) evaluates 70B targets served with tensor parallelism and reports
that a fixed speculation length cuts latency at low load and raises it near saturation, while
goodput-based k follows the better of the two. Study 3 (rates.md) did not reproduce the
crossover on one H100 with the 8B pair. Here the target is Llama-3.1-70B on four H100s
(``h100-tp4-llama-3.1-70b-*``: the draft in the target's group of four GPUs, as vLLM runs a
draft model), with a 1B and an 8B draft. Rates are fractions of each profile's saturation
throughput without speculation. As vLLM does, runs that speculate with a draft model schedule
synchronously (vLLM turns asynchronous scheduling off for draft-model speculation); runs
without speculation keep it. Writes smartspec_70b.csv and smartspec_70b.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from plotting import output_dir, save_figure  # noqa: E402  (the studies' folder is on the path now)

PROFILES = {"1B draft": "h100-tp4-llama-3.1-70b-llama-3.2-1b", "8B draft": "h100-tp4-llama-3.1-70b-llama-3.1-8b"}
FRACTIONS = (0.05, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0)
SEEDS = (0, 1, 2)
NUM_REQUESTS = 2048
K_MAX = 4
ALPHA = 0.7  # the project's default acceptance; an input, not a property of the profile (acceptance.md)


def speculating(policy: str) -> dict:
    """vLLM's rule for a draft model: no asynchronous scheduling (its config turns it off for every
    speculative method but EAGLE's); a run without speculation keeps it (vLLM V1's default)."""
    return {} if policy == "none" else {"engine.async_scheduling": False}


def sweep(profile: str, saturation: float) -> pd.DataFrame:
    from rates import config_for, policies_for
    from sim.simulate import simulate

    rows = []
    for fraction in FRACTIONS:
        for seed in SEEDS:
            for label, name, k in policies_for(profile, K_MAX):
                summary = simulate(config_for(profile, name, rate=fraction * saturation, seed=seed,
                                              num_requests=NUM_REQUESTS, k=k,
                                              extra={"acceptance.alpha": ALPHA, **speculating(name)})).summary
                rows.append({"fraction": fraction, "rate": fraction * saturation, "seed": seed, "policy": label,
                             "mean_e2el_s": summary["mean_e2el_ms"] / 1e3, "mean_tpot_ms": summary["mean_tpot_ms"],
                             "p99_e2el_s": summary["p99_e2el_ms"] / 1e3, "mean_ttft_s": summary["mean_ttft_ms"] / 1e3,
                             "mean_k": summary["mean_k"], "mean_batch": summary["mean_batch_size"],
                             "throughput": summary["request_throughput"]})
    return pd.DataFrame(rows)


def plot(tables: dict[str, pd.DataFrame], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(6 * len(tables), 4.4), squeeze=False)
    for ax, (draft, table) in zip(axes[0], tables.items()):
        base = table[table.policy == "none"].set_index("fraction").mean_e2el_s
        cmap = plt.get_cmap("Blues")
        for label in dict.fromkeys(table.policy):
            if label == "none":
                continue
            t = table[table.policy == label].set_index("fraction").mean_e2el_s
            style = (dict(color="tab:red", lw=2.2, marker="o") if label == "goodput" else
                     dict(color=cmap(0.35 + 0.15 * int(label[2:])), lw=1.3, marker=".", ls="--"))
            ax.plot(t.index, t / base, label=label, **style)
        ax.axhline(1.0, color="black", lw=1, label="none")
        ax.set_xlabel(f"request rate / saturation ({table.attrs['saturation']:.3g} req/s without speculation)")
        ax.set_ylabel("mean E2EL / mean E2EL of none")
        ax.set_title(f"Llama-3.1-70B on 4 x H100, {draft}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Speculation across load (alpha {ALPHA}; mean of {len(SEEDS)} seeds; below 1 it helps)", fontsize=10)
    return save_figure(fig, out_dir, "smartspec_70b.png")


def run(profile: str | None, out_dir: Path) -> dict:
    """``profile`` is not used: the study is about the two shipped TP4 profiles (run_all passes its own)."""
    from rates import goodput_excess, saturation_rate, summarize

    out_dir = output_dir(out_dir)
    tables, frames, headlines = {}, [], {}
    for draft, name in PROFILES.items():
        sat = saturation_rate(name)
        runs = sweep(name, sat)
        table = summarize(runs)
        table.attrs["saturation"] = sat
        tables[draft] = table
        frames.append(table.assign(draft=draft, profile=name, saturation=sat))
        wide = table.pivot_table(index="fraction", columns="policy", values="mean_e2el_s")
        fixed = [c for c in wide.columns if c.startswith("k=")]
        worse = {k: [float(f) for f in wide.index if wide.loc[f, k] > wide.loc[f, "none"]] for k in fixed}
        excess = goodput_excess(runs)
        headlines[draft] = {
            "profile": name, "saturation_req_s": round(sat, 4),
            "e2el_ratio_vs_none_at_low_load": {k: round(float(wide.loc[FRACTIONS[0], k] / wide.loc[FRACTIONS[0], "none"]), 3)
                                               for k in [*fixed, "goodput"]},
            "e2el_ratio_vs_none_at_saturation": {k: round(float(wide.loc[1.0, k] / wide.loc[1.0, "none"]), 3)
                                                 for k in [*fixed, "goodput"]},
            "fractions_where_fixed_k_is_worse_than_none": worse,
            "crossover_reproduced": any(worse.values()),
            "goodput_worst_excess_over_best_of_none_and_fixed": round(float(excess["excess"].max()), 4),
        }
    pd.concat(frames).round(6).to_csv(out_dir / "smartspec_70b.csv", index=False)
    plot(tables, out_dir)
    return {"alpha": ALPHA, "fractions": list(FRACTIONS), "seeds": list(SEEDS), **headlines}


if __name__ == "__main__":  # the same flags as run_all.py, for this study alone
    from run_all import main

    sys.exit(main(["--only", "smartspec_70b", *sys.argv[1:]]))
