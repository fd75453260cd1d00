"""Study 8: does a 1B draft on a 70B target lose to no speculation at batch 32, and why?

    python docs/studies/draft_1b_70b.py                     # -> docs/studies/figures/
    python docs/studies/draft_1b_70b.py --out DIR

vLLM's users report that Llama-3.2-1B drafting for a 70B Llama loses to no speculation
already at a batch of 32 (vLLM issue 17984). This study serves Llama-3.1-70B on four H100s
(``h100-tp4-llama-3.1-70b-llama-3.2-1b``: the 1B in the target's group, vLLM's default) to a
client that keeps 32 requests in flight (vLLM bench serve's --max-concurrency 32), for k =
0..5 and acceptance rates alpha 0.5..0.9, and compares output throughput with no speculation.
It then takes one batch-32 step apart from the profile's curves (the 70B's pass, the 1B's k
passes, verification, the engine's own work) to say why, and checks two of the reasons by
removing them: the draft on one GPU of the group instead of four (composed here when the
kernel data is installed: the gpu-data extra), and asynchronous scheduling kept (vLLM turns
it off for draft-model speculation). Writes draft_1b_70b.csv, draft_1b_70b_step.csv,
draft_1b_70b_losing_pass.csv and draft_1b_70b.png.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from plotting import output_dir, save_figure  # noqa: E402  (the studies' folder is on the path now)

PROFILE = "h100-tp4-llama-3.1-70b-llama-3.2-1b"
CONCURRENCY = 32
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
KS = (0, 1, 2, 3, 4, 5)
PROMPT, OUTPUT = 512, 256
NUM_REQUESTS = 512
SEED = 0


def serve(profile: str, k: int, alpha: float, async_scheduling: bool) -> dict:
    """32 requests in flight until NUM_REQUESTS are served: the closed loop of vllm bench serve --max-concurrency."""
    from serving import study_config
    from sim.simulate import simulate

    settings = {"workload.rate": 1e9, "workload.num_requests": NUM_REQUESTS, "workload.max_concurrency": CONCURRENCY,
                "workload.prompt_tokens": PROMPT, "workload.output_tokens": OUTPUT, "acceptance.alpha": alpha,
                "engine.async_scheduling": async_scheduling}
    if k:
        settings["policy.k"] = k
    summary = simulate(study_config(profile, "fixed" if k else "none", SEED, settings)).summary
    return {"output_tok_s": summary["output_throughput"], "mean_tpot_ms": summary["mean_tpot_ms"],
            "mean_batch": summary["mean_batch_size"], "mean_k": summary["mean_k"]}


def variants() -> dict[str, tuple[str, bool]]:
    """Label -> (profile, asynchronous scheduling for speculating runs). vLLM's setting first."""
    out = {"vLLM (draft in the group, sync)": (PROFILE, False), "async kept (what-if)": (PROFILE, True)}
    one_gpu = draft_on_one_gpu()
    if one_gpu is not None:
        out["draft on one GPU, sync"] = (one_gpu, False)
    return out


def draft_on_one_gpu() -> str | None:
    """The same pair with the draft unsplit on one GPU of the four, composed from the shipped profile's own
    command; None without the kernel data."""
    import argparse

    from specbatch.commands import compose
    from sim.errors import InputError
    from sim.costmodel.profile import load_profile

    command = load_profile(PROFILE).meta["command"].split()[2:]
    folder = Path(tempfile.mkdtemp(prefix="specbatch-study-")) / "draft-tp1"
    command[command.index("--out") + 1] = str(folder)
    parser = argparse.ArgumentParser()
    compose.add_arguments(parser)
    try:
        from sim.compose import compose as write

        write(compose.build_request(parser.parse_args(command + ["--draft-tp", "1"])), folder)
    except InputError:
        return None
    return str(folder)


def step_parts(profile: str, alpha: float) -> pd.DataFrame:
    """One batch-32 decode step at the study's mean context, taken apart from the profile's curves: per k,
    the passes, the engine's work as it adds (sync) or hides (async), and the time per emitted token."""
    from sim.costmodel.cache import fitted_profile, profile_digest
    from sim.costmodel.model import CostModel
    from sim.costmodel.profile import CSV_NAME, META_NAME, resolve_profile_path

    directory = resolve_profile_path(profile)
    _, model = fitted_profile(directory, profile_digest([directory / CSV_NAME, directory / META_NAME]), fit=CostModel)
    b, c = float(CONCURRENCY), float(PROMPT + OUTPUT / 2)
    rows = []
    for k in KS:
        target = float(model.decode_target(batch_size=b, query_tokens=k + 1.0, context_tokens=c))
        draft = float(k * model.draft_times(b, 1.0, c)) if k else 0.0
        verify = float(model.verify(batch_size=b, query_tokens=float(k)))
        sync = float(model.without_overlap().step_times(b, k, c)) if k else float(model.step_times(b, 0, c))
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha)
        rows.append({"k": k, "target_ms": 1e3 * target, "draft_ms": 1e3 * draft, "verify_ms": 1e3 * verify,
                     "engine_ms": 1e3 * (sync - target - draft - verify), "step_ms": 1e3 * sync,
                     "tokens_per_step": tokens, "ms_per_token": 1e3 * sync / tokens})
    return pd.DataFrame(rows)


def breakeven_alpha(parts: pd.DataFrame) -> dict[int, float]:
    """Per k, the acceptance rate at which speculation's time per token equals no speculation's."""
    base = float(parts.loc[parts.k == 0, "step_ms"].iloc[0])
    out = {}
    for row in parts[parts.k > 0].itertuples():
        grid = np.linspace(0.01, 0.999, 2000)
        tokens = (1 - grid ** (row.k + 1)) / (1 - grid)
        wins = grid[row.step_ms / tokens < base]
        out[int(row.k)] = float(wins.min()) if wins.size else 1.0
    return out


def losing_draft_pass(parts: pd.DataFrame, alphas=ALPHAS) -> pd.DataFrame:
    """Per alpha and k: how long one draft pass would have to take for speculation to lose at batch 32,
    everything else as priced (the 70B's pass, verification, the engine's work), against its composed time."""
    base = float(parts.loc[parts.k == 0, "step_ms"].iloc[0])
    pass_ms = float(parts.loc[parts.k == 1, "draft_ms"].iloc[0])
    rows = []
    for alpha in alphas:
        row = {"alpha": alpha}
        for r in parts[parts.k > 0].itertuples():
            tokens = (1 - alpha ** (r.k + 1)) / (1 - alpha)
            rest = r.step_ms - r.draft_ms  # the step without its draft passes
            row[f"k={r.k}"] = (tokens * base - rest) / r.k
        rows.append(row)
    return pd.DataFrame(rows).assign(composed_pass_ms=pass_ms)


def draft_pass_terms(profile: str) -> dict | None:
    """The 1B's decode pass at batch 32 by composed term (needs the kernel data): where its time goes."""
    from specbatch.commands.compose import pricers_for
    from sim.errors import InputError
    from sim.costmodel.profile import load_profile

    try:
        pricers = pricers_for(load_profile(profile))
    except InputError:
        return None
    c = PROMPT + OUTPUT / 2
    out = {}
    for role, logits in (("draft", 1), ("target", None)):
        parts = pricers[role].decode_parts(CONCURRENCY, 1, c, logits)
        out[role] = {name: round(1e3 * float(v), 4) for name, v in parts.items()}
    return out


def plot(runs: pd.DataFrame, parts: pd.DataFrame, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    vllm = runs[runs.variant == next(iter(dict.fromkeys(runs.variant)))]
    for alpha, sub in vllm.groupby("alpha"):
        base = float(sub.loc[sub.k == 0, "output_tok_s"].iloc[0])
        axes[0].plot(sub.k, sub.output_tok_s / base, marker="o", label=f"alpha {alpha:g}")
    axes[0].axhline(1.0, color="black", lw=1)
    axes[0].set_xlabel("k (draft tokens per step)")
    axes[0].set_ylabel("output throughput / no speculation")
    axes[0].set_title(f"{CONCURRENCY} requests in flight, Llama-3.1-70B + 1B on 4 x H100 (vLLM's settings)", fontsize=9)
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    ax = axes[1]
    bottom = np.zeros(len(parts))
    for column, label in (("target_ms", "70B pass over k + 1 tokens"), ("draft_ms", "k passes of the 1B"),
                          ("verify_ms", "verification"), ("engine_ms", "engine's own work (sync)")):
        ax.bar(parts.k, parts[column], bottom=bottom, label=label)
        bottom += parts[column].to_numpy()
    ax.set_xlabel("k")
    ax.set_ylabel(f"one step at batch {CONCURRENCY} (ms)")
    ax.set_title("Where a step's time goes (the profile's curves)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return save_figure(fig, out_dir, "draft_1b_70b.png")


def run(profile: str | None, out_dir: Path) -> dict:
    """``profile`` is not used: the study is about the shipped 70B + 1B TP4 profile."""
    out_dir = output_dir(out_dir)
    rows = []
    for variant, (profile_path, async_spec) in variants().items():
        for alpha in ALPHAS:
            for k in KS:  # k = 0 is no speculation: vLLM keeps asynchronous scheduling then
                result = serve(profile_path, k, alpha, True if k == 0 else async_spec)
                rows.append({"variant": variant, "alpha": alpha, "k": k, **result})
    runs = pd.DataFrame(rows)
    runs.round(6).to_csv(out_dir / "draft_1b_70b.csv", index=False)
    parts = step_parts(PROFILE, 0.7)
    parts.round(6).to_csv(out_dir / "draft_1b_70b_step.csv", index=False)
    losing = losing_draft_pass(parts)
    losing.round(4).to_csv(out_dir / "draft_1b_70b_losing_pass.csv", index=False)
    plot(runs, parts, out_dir)
    gains = {}
    for (variant, alpha), sub in runs.groupby(["variant", "alpha"], sort=False):
        base = float(sub.loc[sub.k == 0, "output_tok_s"].iloc[0])
        best = sub[sub.k > 0].sort_values("output_tok_s").iloc[-1]
        gains.setdefault(variant, {})[f"{alpha:g}"] = {"best_k": int(best.k),
                                                      "best_vs_none": round(float(best.output_tok_s / base), 3)}
    return {"profile": PROFILE, "concurrency": CONCURRENCY, "prompt": PROMPT, "output": OUTPUT,
            "best_k_and_throughput_vs_none": gains,
            "breakeven_alpha_at_batch_32": {str(k): round(v, 3) for k, v in breakeven_alpha(parts).items()},
            "draft_pass_ms_to_lose_at_alpha_0.7": {c: round(float(losing.loc[losing.alpha == 0.7, c].iloc[0]), 2)
                                                   for c in losing.columns if c.startswith("k=")},
            "step_at_alpha_0.7": parts.round(4).to_dict("records"),
            "pass_terms_ms": draft_pass_terms(PROFILE)}


if __name__ == "__main__":  # the same flags as run_all.py, for this study alone
    from run_all import main

    sys.exit(main(["--only", "draft_1b_70b", *sys.argv[1:]]))
