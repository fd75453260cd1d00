"""Study 4: speedup of speculation against batch size at short and long contexts (MagicDec, arXiv 2408.11049).

    python docs/studies/long_context.py                    # the shipped CPU profile
    python docs/studies/long_context.py --profile h100-opt --out /tmp/studies

From the cost model alone: for each context c and batch size b, the speedup over k = 0
of the best k (policies.lut.best_k at alpha 0.8) and of a fixed k,

    speedup(b, c) = step_time(b, 0, c) / (step_time(b, k, c) / E[tokens](alpha, k)).

Contexts are the profile's measured ones plus doublings beyond them (to at least 32k
tokens); batch sizes are powers of two up to 4x the profile's largest measured batch.
Everything beyond the measured grid is the cost model's fitted roofline extrapolation
and is marked so (dashed lines, shaded band, ``extrapolated`` column).

Trend: speedup at the largest measured batch over speedup at a quarter of it. MagicDec's
inflection is where this ratio crosses 1 (falls at short context, grows at long
context); S_inflection is that context, interpolated in log2(context) between the two
evaluated contexts around the crossing.

Two drafts are priced. The profile's own (its KV grows with the context, as the shipped
model pairs run in specbatch's engine), and MagicDec's ingredient: a draft whose KV is a
fixed StreamingLLM window of ``DRAFT_WINDOW`` tokens, so its passes cost what they cost
at that context whatever the sequence length (the draft priced at min(c, window)).
Points whose KV does not fit the profile's KV capacity are flagged (``fits_kv``): they
are what the cost model says a pass would cost if it fitted (more GPUs, a smaller KV).

Then a short simulation: ``none`` vs ``lut`` vs ``context`` (both built at alpha 0.8; static
batching, so TPOT is decode alone) at one short and one long prompt length, a burst of requests.

Writes long_context.png, long_context_window.png, long_context.csv and long_context_sim.csv.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ALPHA = 0.8
FIXED_K = 3
DRAFT_WINDOW = 512       # MagicDec's StreamingLLM draft: a fixed KV budget (tokens)
MIN_TOP_CONTEXT = 32768  # extrapolate contexts by doublings to at least this
EXTRAPOLATE = 4          # batch sizes to this multiple of the grid's largest batch
SIM_OUTPUT_TOKENS = 64
SIM_RATE = 1e6
SEED = 0


def grid(cost_model) -> dict:
    curve = cost_model.decode_target
    b_top = int(curve.bounds("batch_size")[1])
    measured = sorted(int(c) for c in cost_model.profile.phase("decode", "target").context_tokens.unique())
    c_hi = measured[-1]
    contexts = list(measured)
    c = c_hi
    while c < max(MIN_TOP_CONTEXT, EXTRAPOLATE * c_hi):
        c *= 2
        contexts.append(c)
    b_max = max(64, EXTRAPOLATE * b_top)
    batches = sorted({2 ** i for i in range(int(math.log2(b_max)) + 1)}
                     | {int(b) for b in cost_model.profile.phase("decode", "target").batch_size.unique()})
    return {"grid_max_batch": b_top, "grid_max_context": c_hi, "contexts": contexts, "batches": batches,
            "k_max": int(cost_model.k_max)}


def step_times(cost_model, b, ks, c, draft_window: int | None = None) -> np.ndarray:
    """Decode step times [batch, k, context]; with ``draft_window`` the draft's KV is capped at that many tokens."""
    if draft_window is None:
        return cost_model.step_times(b, ks, c)
    b, ks, c = np.broadcast_arrays(b, ks, c)
    draft = cost_model.draft_times(b, 1, np.minimum(c, draft_window))
    target = cost_model.decode_target(batch_size=b, query_tokens=ks + 1, context_tokens=c)
    return cost_model.with_overhead(ks * draft + target + cost_model.verify(batch_size=b, query_tokens=ks),
                                    cost_model.decode_overhead)


def analyse(cost_model, alpha: float = ALPHA, fixed_k: int = FIXED_K, contexts=None, batches=None,
            draft_window: int | None = None) -> dict:
    """The core computation: speedup curves, trends and S_inflection (for one kind of draft)."""
    from policies.lut import best_k, expected_tokens

    g = grid(cost_model)
    contexts = g["contexts"] if contexts is None else list(contexts)
    batches = g["batches"] if batches is None else list(batches)
    k_max = g["k_max"]
    fixed_k = min(fixed_k, k_max)
    b = np.asarray(batches, dtype=float)[:, None, None]
    ks = np.arange(k_max + 1, dtype=float)[None, :, None]
    c = np.asarray(contexts, dtype=float)[None, None, :]
    step = step_times(cost_model, b, ks, c, draft_window)  # [batch, k, context], vectorised once
    capacity = cost_model.profile.kv_capacity_tokens
    rows = []
    for ci, ctx in enumerate(contexts):
        for bi, bs in enumerate(batches):
            k, per_token = best_k(lambda _b, kk, _c: float(step[bi, kk, ci]), alpha, k_max, bs, ctx)
            t0 = float(step[bi, 0, ci])
            rows.append({"context_tokens": ctx, "batch_size": bs, "best_k": k, "step_k0_s": t0,
                         "speedup_best_k": t0 / per_token,
                         f"speedup_k{fixed_k}": t0 / (float(step[bi, fixed_k, ci]) / expected_tokens(alpha, fixed_k)),
                         "extrapolated": bool(ctx > g["grid_max_context"] or bs > g["grid_max_batch"]),
                         "fits_kv": capacity is None or bs * (ctx + k_max + 1) <= capacity})
    df = pd.DataFrame(rows)
    b_hi = max(x for x in batches if x <= g["grid_max_batch"])
    b_lo = max(x for x in batches if x <= max(1, b_hi // 4))
    trends = []
    for ctx, sub in df.groupby("context_tokens"):
        s = sub.set_index("batch_size")
        trends.append({"context_tokens": int(ctx), "trend_best_k": s.at[b_hi, "speedup_best_k"] / s.at[b_lo, "speedup_best_k"],
                       "trend_fixed_k": s.at[b_hi, f"speedup_k{fixed_k}"] / s.at[b_lo, f"speedup_k{fixed_k}"]})
    trends = pd.DataFrame(trends)
    return {"frame": df, "trends": trends, "alpha": alpha, "fixed_k": fixed_k, "b_lo": b_lo, "b_hi": b_hi,
            "draft_window": draft_window,
            "s_inflection": inflection(trends, "trend_best_k"),
            "s_inflection_fixed_k": inflection(trends, "trend_fixed_k"), **g}


def inflection(trends: pd.DataFrame, column: str) -> float | None:
    """The context from which the speedup grows (ratio > 1) with batch at every longer context evaluated; None if never.

    Interpolated in log2(context) where the trend ratio crosses 1. If it already grows at
    the shortest context evaluated, that context is returned.
    """
    t = trends.sort_values("context_tokens")
    ctx, r = t.context_tokens.to_numpy(float), t[column].to_numpy(float)
    if r[-1] <= 1.0:
        return None
    i = len(r) - 1
    while i > 0 and r[i - 1] > 1.0:
        i -= 1
    if i == 0:
        return float(ctx[0])
    x0, x1 = math.log2(ctx[i - 1]), math.log2(ctx[i])
    f = (1.0 - r[i - 1]) / (r[i] - r[i - 1])
    return float(2 ** (x0 + f * (x1 - x0)))


def simulate_check(profile: str, result: dict, kv_capacity: int | None) -> pd.DataFrame:
    from sim.config import load_config
    from sim.simulate import simulate

    b = result["grid_max_batch"]
    short = int(min(result["contexts"]))
    long_ = 2 * result["grid_max_context"]
    if kv_capacity is not None and long_ + SIM_OUTPUT_TOKENS + result["k_max"] > kv_capacity:
        long_ = result["grid_max_context"]
    n = max(2 * b, 32)
    policies = {"none": {}, "lut": {"alpha": result["alpha"], "k_max": result["k_max"]},
                "context": {"alpha": result["alpha"], "k_max": result["k_max"]}}
    rows = []
    for prompt in (short, long_):
        for name, params in policies.items():
            over = {"profile": (profile, "--profile"), "seed": (SEED, "--seed"),
                    "workload.rate": (SIM_RATE, "--rate"), "workload.num_requests": (n, "--num-requests"),
                    "workload.prompt_tokens": (prompt, "--prompt-tokens"),
                    "workload.output_tokens": (SIM_OUTPUT_TOKENS, "--output-tokens"),
                    "engine.scheduler": ("v0", "--scheduler"), "engine.batching": ("static", "--batching"), "engine.max_batch_size": (b, "--max-batch-size"),
                    "acceptance.alpha": (result["alpha"], "--alpha"), "output.records": ("none", "--records"),
                    "policy.name": (name, "--policy"), **{f"policy.{k}": (v, f"--{k}") for k, v in params.items()}}
            res = simulate(load_config(None, over))
            r = res.requests
            rows.append({"prompt_tokens": prompt, "policy": name, "num_requests": n,
                         "extrapolated_context": bool(prompt + SIM_OUTPUT_TOKENS > result["grid_max_context"]),
                         "mean_tpot_s": float(r.tpot_s.mean()), "mean_e2el_s": float(r.e2el_s.mean()),
                         "throughput_tok_s": float(r.output_tokens.sum() / r.finish_s.max()),
                         "mean_k": float(r.drafted_tokens.sum() / r.decode_steps.sum())})
    return pd.DataFrame(rows)


def plot(result: dict, out_path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = result["frame"]
    fk = result["fixed_k"]
    contexts = sorted(df.context_tokens.unique())
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = (("speedup_best_k", f"speedup of the best k over k = 0 (α = {result['alpha']:g})"),
              (f"speedup_k{fk}", f"speedup of fixed k = {fk} over k = 0"),
              ("best_k", "best k"))
    for ax, (col, label) in zip(axes, panels):
        for i, ctx in enumerate(contexts):
            sub = df[df.context_tokens == ctx]
            measured = ctx <= result["grid_max_context"]
            ax.plot(sub.batch_size, sub[col] + (0 if col != "best_k" else (i - len(contexts) / 2) * 0.04),
                    color=cmap(i / max(1, len(contexts) - 1)), ls="-" if measured else "--", marker=".",
                    label=f"{ctx} tok" + ("" if measured else " (extrap.)"))
        ax.set_xscale("log", base=2)
        ax.axvspan(result["grid_max_batch"], max(df.batch_size), color="0.9", zorder=0)
        ax.axvline(result["grid_max_batch"], color="0.5", ls="--", lw=0.8)
        ax.text(result["grid_max_batch"] * 1.08, 0.02, "extrapolated\nbatch sizes", transform=ax.get_xaxis_transform(),
                fontsize=8, color="0.35")
        ax.set_xlabel("batch size")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
        if col != "best_k":
            ax.axhline(1.0, color="k", lw=0.8)
    axes[0].legend(fontsize=7, title="context", title_fontsize=8)
    s = result["s_inflection"]
    fig.suptitle(f"{title}; solid: measured contexts, dashed: extrapolated; "
                 f"S_inflection ≈ {'none' if s is None else f'{s:.0f} tokens'}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def run(profile: str, out_dir: Path) -> dict:
    from sim.costmodel.model import CostModel
    from sim.costmodel.profile import load_profile

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof = load_profile(profile)
    cost_model = CostModel(prof)
    result = analyse(cost_model)
    windowed = analyse(cost_model, draft_window=DRAFT_WINDOW)
    frames = [result["frame"].assign(draft="full KV"), windowed["frame"].assign(draft=f"window {DRAFT_WINDOW}")]
    pd.concat(frames).to_csv(out_dir / "long_context.csv", index=False, float_format="%.6g")
    plot(result, out_dir / "long_context.png", f"profile {prof.name}, draft with its full KV")
    plot(windowed, out_dir / "long_context_window.png",
         f"profile {prof.name}, draft with a {DRAFT_WINDOW}-token KV window (MagicDec)")
    sim = simulate_check(profile, result, prof.kv_capacity_tokens)
    sim.to_csv(out_dir / "long_context_sim.csv", index=False, float_format="%.6g")
    c_lo, c_hi_meas = min(result["contexts"]), result["grid_max_context"]
    c_top = max(result["contexts"])

    def headlines(res: dict) -> dict:
        df, t = res["frame"], res["trends"].set_index("context_tokens")

        def sp(c, b):
            return round(float(df[(df.context_tokens == c) & (df.batch_size == b)].speedup_best_k.iloc[0]), 3)

        s_inf = res["s_inflection"]
        return {
            "trend_best_k": {int(c): round(float(v), 3) for c, v in t.trend_best_k.items()},
            "s_inflection_tokens": None if s_inf is None else round(s_inf),
            "s_inflection_fixed_k_tokens": (None if res["s_inflection_fixed_k"] is None
                                            else round(res["s_inflection_fixed_k"])),
            "s_inflection_measured": s_inf is not None and s_inf <= c_hi_meas,
            f"speedup_ctx{c_lo}": {f"b{b}": sp(c_lo, b) for b in (res["b_lo"], res["b_hi"])},
            f"speedup_ctx{c_top}": {f"b{b}": sp(c_top, b) for b in (res["b_lo"], res["b_hi"])},
        }

    return {
        "profile": prof.name, "alpha": result["alpha"], "fixed_k": result["fixed_k"],
        "measured_contexts_to": c_hi_meas, "measured_batch_to": result["grid_max_batch"],
        "kv_capacity_tokens": prof.kv_capacity_tokens,
        "trend_batches": [result["b_lo"], result["b_hi"]],
        **headlines(result),
        "draft_window": {"tokens": DRAFT_WINDOW, **headlines(windowed)},
        "sim": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                 if k in ("prompt_tokens", "policy", "mean_tpot_s", "throughput_tok_s", "mean_k")}
                for r in sim.to_dict("records")],
    }


if __name__ == "__main__":  # the same flags as run_all.py, for this study alone
    from run_all import main

    sys.exit(main(["--only", "long_context", *sys.argv[1:]]))
