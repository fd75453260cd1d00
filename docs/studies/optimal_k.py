"""Study 1: the best speculation length k against batch size, and the lut it gives (arXiv 2310.18813).

    python docs/studies/optimal_k.py                       # the shipped CPU profile
    python docs/studies/optimal_k.py --profile h100-opt --out /tmp/studies

For each acceptance rate alpha and each batch size b = 1 .. 4x the profile's largest
measured batch (at least 64), the k in 0..k_max minimising the expected time per
generated token at a representative context (policies.lut.best_k: the rule `specbatch
lut` and the `lut` policy use), the speedup of that k over k = 0, and the resulting
table. Batch sizes beyond the profile's grid are priced by the cost model's fitted
roofline extrapolation and are marked as such in the CSV and the figure.

A simulation check then runs sim.simulate with static batching, full batches of b
requests, fixed prompt and output lengths, for every fixed k at a few batch sizes,
and reports the k with the lowest mean TPOT next to the analytic choice.

Writes optimal_k.png, optimal_k.csv, optimal_k_lut.csv and optimal_k_sim.csv.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ALPHAS = (0.6, 0.7, 0.8, 0.9)
SIM_ALPHA = 0.8
SIM_OUTPUT_TOKENS = 64
SIM_BATCHES_PER_RUN = 4   # requests per run = this many full batches (at least SIM_MIN_REQUESTS)
SIM_MIN_REQUESTS = 32
SIM_RATE = 1e6            # req/s: every request is waiting at t ~ 0, so every batch is full
SEED = 0
EXTRAPOLATE = 4           # evaluate batch sizes up to this multiple of the grid's largest batch


def grid(cost_model) -> dict:
    """Batch sizes, k range and representative context, all from the profile."""
    from policies.lut import DEFAULT_CONTEXT

    b_top = int(cost_model.decode_target.bounds("batch_size")[1])
    c_lo, c_hi = cost_model.decode_target.bounds("context_tokens")
    context = float(min(max(DEFAULT_CONTEXT, c_lo), c_hi))  # the lut default, clipped into the measured range
    return {"grid_max_batch": b_top, "max_batch": max(64, EXTRAPOLATE * b_top), "k_max": int(cost_model.k_max),
            "context": context}


def analyse(cost_model, alphas=ALPHAS, max_batch: int | None = None, k_max: int | None = None,
            context: float | None = None) -> dict:
    """The core computation: per alpha and batch size the best k, its time per token and speedup over k = 0."""
    from policies.lut import best_k, build_lut, expected_tokens

    g = grid(cost_model)
    max_batch = g["max_batch"] if max_batch is None else max_batch
    k_max = g["k_max"] if k_max is None else k_max
    context = g["context"] if context is None else context
    batches = np.arange(1, max_batch + 1)
    ks = np.arange(k_max + 1)
    step = cost_model.step_times(batches[:, None], ks[None, :], context)  # [b - 1, k], vectorised once

    def step_time(b, k, _c):
        return float(step[b - 1, k])

    rows, tables = [], {}
    for alpha in alphas:
        for b in batches:
            k, per_token = best_k(step_time, alpha, k_max, int(b), context)
            rows.append({"alpha": alpha, "batch_size": int(b), "best_k": k,
                         "time_per_token_s": per_token, "time_per_token_k0_s": step[b - 1, 0],
                         "speedup": step[b - 1, 0] / per_token,
                         "expected_tokens": expected_tokens(alpha, k),
                         "extrapolated": bool(b > g["grid_max_batch"])})
        tables[alpha] = build_lut(step_time, alpha, k_max, int(max_batch), context)
    df = pd.DataFrame(rows)
    return {"frame": df, "tables": tables, "context": context, "k_max": k_max, "max_batch": int(max_batch),
            "grid_max_batch": g["grid_max_batch"]}


def headline(result: dict) -> dict:
    df = result["frame"]
    top = result["grid_max_batch"]
    out = {"context_tokens": result["context"], "k_max": result["k_max"], "grid_max_batch": top,
           "max_batch_evaluated": result["max_batch"]}
    for alpha, sub in df.groupby("alpha"):
        sub = sub.set_index("batch_size")
        zero_from = None  # the smallest batch from which k = 0 is best for every larger batch evaluated
        for b in sub.index[::-1]:
            if sub.at[b, "best_k"] != 0:
                break
            zero_from = int(b)
        out[f"alpha_{alpha:g}"] = {
            "best_k_b1": int(sub.at[1, "best_k"]), f"best_k_b{top}": int(sub.at[top, "best_k"]),
            "best_k_max_batch": int(sub.at[result["max_batch"], "best_k"]),
            "speedup_b1": round(float(sub.at[1, "speedup"]), 3),
            f"speedup_b{top}": round(float(sub.at[top, "speedup"]), 3),
            "k0_best_from_batch": zero_from,
            "lut": result["tables"][alpha]}
    return out


def sim_batches(grid_max_batch: int) -> list[int]:
    return sorted({b for b in (1, 4, 16, grid_max_batch) if b <= grid_max_batch})


def simulate_check(profile: str, analysis: dict, batches: list[int], alpha: float = SIM_ALPHA,
                   output_tokens: int = SIM_OUTPUT_TOKENS) -> pd.DataFrame:
    """Fixed k = 0..k_max under static batching with full batches; mean TPOT per (b, k)."""
    from sim.config import load_config
    from sim.simulate import simulate

    context = analysis["context"]
    prompt = max(1, int(round(context - output_tokens / 2)))  # mean context over decode ~ the analytic context
    df = analysis["frame"]
    rows = []
    for b in batches:
        n = max(SIM_BATCHES_PER_RUN * b, SIM_MIN_REQUESTS)
        n -= n % b  # whole batches only
        for k in range(analysis["k_max"] + 1):
            over = {"profile": (profile, "--profile"), "seed": (SEED, "--seed"),
                    "workload.rate": (SIM_RATE, "--rate"), "workload.num_requests": (n, "--num-requests"),
                    "workload.prompt_tokens": (prompt, "--prompt-tokens"),
                    "workload.output_tokens": (output_tokens, "--output-tokens"),
                    "engine.scheduler": ("v0", "--scheduler"), "engine.batching": ("static", "--batching"), "engine.max_batch_size": (b, "--max-batch-size"),
                    "acceptance.alpha": (alpha, "--alpha"), "output.records": ("none", "--records")}
            if k == 0:
                over["policy.name"] = ("none", "--policy")
            else:
                over["policy.name"] = ("fixed", "--policy")
                over["policy.k"] = (k, "--k")
            res = simulate(load_config(None, over))
            rows.append({"batch_size": b, "k": k, "num_requests": n,
                         "mean_tpot_s": float(res.requests.tpot_s.mean())})
    sim = pd.DataFrame(rows)
    out = []
    for b, sub in sim.groupby("batch_size"):
        best = sub.loc[sub.mean_tpot_s.idxmin()]
        ana = df[(df.alpha == alpha) & (df.batch_size == b)].iloc[0]
        tpot_at_ana = float(sub[sub.k == ana.best_k].mean_tpot_s.iloc[0])
        out.append({"batch_size": int(b), "sim_best_k": int(best.k), "sim_best_tpot_s": float(best.mean_tpot_s),
                    "analytic_best_k": int(ana.best_k), "sim_tpot_at_analytic_k_s": tpot_at_ana,
                    "analytic_time_per_token_s": float(ana.time_per_token_s),
                    "gap_pct": 100.0 * (tpot_at_ana / float(best.mean_tpot_s) - 1.0),
                    **{f"tpot_k{int(r.k)}_s": float(r.mean_tpot_s) for r in sub.itertuples()}})
    return pd.DataFrame(out)


def plot(result: dict, out_path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df, top = result["frame"], result["grid_max_batch"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for alpha, sub in df.groupby("alpha"):
        # offset the step lines a little so that equal k at different alpha stay visible
        ax1.step(sub.batch_size, sub.best_k + (alpha - 0.75) * 0.12, where="mid", label=f"α = {alpha:g}")
        ax2.plot(sub.batch_size, sub.speedup, label=f"α = {alpha:g}")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.axvspan(top, result["max_batch"], color="0.9", zorder=0)
        ax.axvline(top, color="0.5", ls="--", lw=0.8)
        ax.text(top * 1.08, 0.97, "extrapolated\n(beyond measured\nbatch sizes)", transform=ax.get_xaxis_transform(),
                va="top", fontsize=8, color="0.35")
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("best k (least expected time per token)")
    ax1.set_yticks(range(result["k_max"] + 1))
    ax1.set_title("best k vs batch size")
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_ylabel("speedup over k = 0 (time per token)")
    ax2.set_title("speedup of the best k over no speculation")
    ax1.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def run(profile: str, out_dir: Path, simulate_batches: list[int] | None = None) -> dict:
    from sim.costmodel.model import CostModel
    from sim.costmodel.profile import load_profile

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof = load_profile(profile)
    result = analyse(CostModel(prof))
    result["frame"].to_csv(out_dir / "optimal_k.csv", index=False, float_format="%.6g")
    pd.DataFrame([{"alpha": a, "start_bs": s, "end_bs": e, "k": k,
                   "extrapolated": s > result["grid_max_batch"]}
                  for a, t in result["tables"].items() for s, e, k in t]).to_csv(out_dir / "optimal_k_lut.csv",
                                                                               index=False)
    plot(result, out_dir / "optimal_k.png",
         f"profile {prof.name}: context {result['context']:g} tokens, k in 0..{result['k_max']}")
    batches = sim_batches(result["grid_max_batch"]) if simulate_batches is None else simulate_batches
    check = simulate_check(profile, result, batches)
    check.to_csv(out_dir / "optimal_k_sim.csv", index=False, float_format="%.6g")
    out = headline(result)
    out["profile"] = prof.name
    out["sim_check"] = [{"batch_size": int(r.batch_size), "sim_best_k": int(r.sim_best_k),
                         "analytic_best_k": int(r.analytic_best_k), "gap_pct": round(float(r.gap_pct), 2)}
                        for r in check.itertuples()]
    return out


if __name__ == "__main__":  # the same flags as run_all.py, for this study alone
    from run_all import main

    sys.exit(main(["--only", "optimal_k", *sys.argv[1:]]))
