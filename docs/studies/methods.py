"""Study 10: speculation methods (draft model, EAGLE-3, n-gram) with measured acceptance, and published figures.

    python docs/studies/methods.py                               # the shipped H100 Llama-3.1-8B profile
    python docs/studies/methods.py --profile PROFILE --out DIR

Reads SpecDecode-Bench's measured run lengths of Llama-3.1-8B-Instruct under vLLM on H100
(``../shared/validation/acceptance-llama31-8b/``, four datasets; github.com/SpecDecode-Bench/simulator)
and replays them with ``--acceptance-model runlength`` (requests take their lengths from the
records). Four parts, each a CSV in the output folder (``methods_*.csv``) and a figure:

* ``acceptance``: the content dependence, per dataset and proposer (no simulation);
* ``batch``: draft model vs EAGLE-3 vs n-gram at a fixed number of requests in flight (1 to 256,
  closed loop; throughput while the client keeps them all in flight), fixed k = 3; the draft model
  replays EAGLE's runs, so the two differ by drafting cost alone;
* ``load``: SmartSpec's prompt-lookup question by workload: n-gram (fixed k = 3, and goodput) vs no
  speculation at 10% to 90% of the saturation rate;
* ``published``: SpecDecode-Bench's EAGLE (k = 3) speedup at batch 128 on GSM8K (1.21x) and SGLang's
  batch-1 MT-Bench throughputs (158 / 244 / 373 tokens/s without / with EAGLE-2 / with EAGLE-3).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
DATASETS = ("gsm8k", "instructcoder", "sharegpt", "cnn")
BATCHES = (1, 4, 16, 64, 128, 256)
LOADS = (0.1, 0.3, 0.6, 0.9)
K = 3
SEED = 0
# Published figures checked here (docs/studies/methods.md names the sources).
SPECDECODE_SPEEDUP_B128 = 1.21  # arXiv 2601.11580: EAGLE, k = 3, Llama-3.1-8B, GSM8K, H100, batch 128
SGLANG_TOKENS_PER_S = {"none": 158.34, "eagle": 244.10, "eagle3": 373.25}  # SGLang docs: MT-Bench, 1x H100, batch 1
SGLANG_TREE = (5, 4, 8)  # SGLang's documented defaults: --speculative-num-steps 5 --speculative-eagle-topk 4 ...


def validation_folder() -> Path:
    root = HERE.parents[1]
    for parent in root.parents:
        folder = parent / "shared" / "validation" / "acceptance-llama31-8b"
        if folder.is_dir():
            return folder
    raise SystemExit("error: ../shared/validation/acceptance-llama31-8b not found (the measured run lengths)")


def trace(dataset: str) -> str:
    return str(validation_folder() / f"{dataset}.jsonl.gz")


def config(profile: str, method: str | None, dataset: str | None, settings: dict, proposer: str | None = None):
    """A run on ``profile``: ``method`` (None: no speculation) at k = 3 unless ``settings`` name a policy,
    replaying ``dataset``'s measured runs of ``proposer`` (the method's own by default)."""
    from sim.config import load_config

    values = {"profile": profile, "seed": SEED, "engine.max_batch_size": 256, "output.records": "none", **settings}
    if method is None:
        values.setdefault("policy.name", "none")
    else:
        values["speculative.config"] = {"method": method, "num_speculative_tokens": K}
    if dataset is not None:
        proposer = proposer or ("ngram" if method in ("ngram", "suffix") else "eagle")
        values.update({"acceptance.model": "runlength", "acceptance.trace": trace(dataset),
                       "acceptance.proposer": proposer, "acceptance.trace_lengths": True})
    return load_config(None, {key: (value, "--" + key.split(".")[-1].replace("_", "-"))
                              for key, value in values.items()})


def simulate(cfg) -> dict:
    from sim.simulate import simulate as run

    return run(cfg).summary


def steady(cfg, in_flight: int) -> dict:
    """A closed-loop run's summary plus its steady throughput: output tokens per second until the last
    request is sent (the first N - in_flight requests are done), before the tail thins the batch."""
    from sim.simulate import simulate as run

    result = run(cfg)
    finish = np.sort(result.request_columns["finish_s"])
    end = finish[max(0, finish.shape[0] - in_flight - 1)]
    steps = result.step_columns
    within = steps["end_s"] <= end
    decoding = steps["phase"] != 0
    rows = steps["batch_size"][decoding].sum()
    return {**result.summary, "steady_throughput": float(steps["emitted_tokens"][within].sum() / end),
            "tokens_per_row_step": float((steps["accepted_tokens"][decoding].sum() + rows) / max(rows, 1))}


# ----------------------------------------------------------------------------- acceptance
def acceptance_table() -> pd.DataFrame:
    from sim.speculation.acceptance import read_runlength_trace, runlength_rates
    from sim.speculation.methods import RUNLENGTH_MATCH_RATE

    rows = []
    for dataset in DATASETS:
        for proposer in ("eagle", "ngram"):
            runs = read_runlength_trace(trace(dataset), proposer).runs
            match = RUNLENGTH_MATCH_RATE if proposer == "ngram" else 1.0
            proposes, reach = runlength_rates(runs, match, 5)
            rows.append({"dataset": dataset, "proposer": proposer, "mean_run": float(runs.mean()),
                         "p_run_gt_1": float(np.mean(runs > 1)), "p_proposes": proposes,
                         **{f"p_a_ge_{j}": float(reach[j - 1]) for j in range(1, 6)},
                         "tokens_per_step_k3": float(1 + proposes * reach[:K].sum())})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- batch sweep
BATCH_METHODS = (("draft model (EAGLE's runs)", "draft_model", "eagle"), ("EAGLE-3", "eagle3", "eagle"),
                 ("n-gram", "ngram", "ngram"))  # each against no speculation on its own records' lengths


def batch_sweep(profile: str, datasets=DATASETS) -> pd.DataFrame:
    rows = []
    for dataset in datasets:
        for b in BATCHES:
            settings = {"workload.rate": float("inf"), "workload.num_requests": max(32, 8 * b),
                        "workload.max_concurrency": b}
            base = {p: steady(config(profile, None, dataset, settings, p), b) for p in ("eagle", "ngram")}
            for label, method, proposer in BATCH_METHODS:
                s = steady(config(profile, method, dataset, settings, proposer), b)
                rows.append({"dataset": dataset, "batch": b, "method": label,
                             "steady_throughput": s["steady_throughput"], "mean_tpot_ms": s["mean_tpot_ms"],
                             "tokens_per_row_step": s["tokens_per_row_step"],
                             "none_steady_throughput": base[proposer]["steady_throughput"],
                             "speedup": s["steady_throughput"] / base[proposer]["steady_throughput"]})
                print(f"  {dataset} b={b} {label}: {rows[-1]['speedup']:.2f}x", flush=True)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- load sweep
def saturation(profile: str, dataset: str) -> float:
    s = simulate(config(profile, None, dataset, {"workload.rate": float("inf"), "workload.num_requests": 400},
                        "ngram"))
    return float(s["request_throughput"])


def load_sweep(profile: str) -> pd.DataFrame:
    rows = []
    for dataset in DATASETS:
        top = saturation(profile, dataset)
        for fraction in LOADS:
            settings = {"workload.rate": fraction * top, "workload.num_requests": 600}
            runs = {"none": config(profile, None, dataset, settings, "ngram"),
                    "n-gram k=3": config(profile, "ngram", dataset, settings),
                    "n-gram goodput": config(profile, "ngram", dataset,
                                             {**settings, "policy.name": "goodput", "policy.k_max": K})}
            for label, cfg in runs.items():
                s = simulate(cfg)
                rows.append({"dataset": dataset, "load": fraction, "rate": fraction * top, "policy": label,
                             "mean_tpot_ms": s["mean_tpot_ms"], "mean_e2el_ms": s["mean_e2el_ms"],
                             "mean_k": s["mean_k"], "mean_batch": s["mean_batch_size"]})
            print(f"  {dataset} load {fraction}: done", flush=True)
    frame = pd.DataFrame(rows)
    base = frame[frame.policy == "none"].set_index(["dataset", "load"]).mean_tpot_ms
    frame["tpot_vs_none"] = frame.apply(lambda r: r.mean_tpot_ms / base[(r.dataset, r.load)], axis=1)
    return frame


# ----------------------------------------------------------------------------- published figures
def published(profile: str) -> dict:
    out = {}
    closed = {"workload.rate": float("inf"), "workload.num_requests": 1024, "workload.max_concurrency": 128}
    base = steady(config(profile, None, "gsm8k", closed, "eagle"), 128)
    eagle = steady(config(profile, "eagle3", "gsm8k", closed), 128)
    out["specdecode_b128"] = {"published": SPECDECODE_SPEEDUP_B128,
                              "simulated": eagle["steady_throughput"] / base["steady_throughput"],
                              "mean_batch": eagle["mean_batch_size"],
                              "mean_acceptance_length": eagle["mean_acceptance_length"]}
    one = {"workload.rate": float("inf"), "workload.num_requests": 40, "workload.max_concurrency": 1}
    plain = simulate(config(profile, None, "sharegpt", one, "eagle"))
    chain = simulate(config(profile, "eagle3", "sharegpt", one))
    out["sglang_b1"] = {"published_none": SGLANG_TOKENS_PER_S["none"], "simulated_none": plain["output_throughput"],
                        "simulated_eagle3_chain_k3": chain["output_throughput"],
                        "chain_mean_acceptance_length": chain["mean_acceptance_length"]}
    for method in ("eagle", "eagle3"):
        out["sglang_b1"][f"needed_{method}"] = needed_acceptance(profile, method, SGLANG_TOKENS_PER_S[method], one)
    return out


def needed_acceptance(profile: str, method: str, target: float, settings: dict) -> dict:
    """The geometric alpha (and the tokens per step it gives) at which SGLang's default tree (5 steps,
    top-4, 8 tokens; siblings accepted at 0.3) reaches ``target`` tokens/s at batch 1: bisection."""
    from sim.config import load_config

    steps, topk, tokens = SGLANG_TREE

    def rate(alpha: float) -> tuple[float, float]:
        values = {"profile": profile, "seed": SEED, "output.records": "none", **settings,
                  "workload.prompt_tokens": "355", "workload.output_tokens": "730",
                  "speculative.algorithm": method.upper(), "speculative.num_steps": steps,
                  "speculative.eagle_topk": topk, "speculative.num_draft_tokens": tokens,
                  "acceptance.alpha": alpha, "acceptance.sibling_rates": [0.3]}
        s = simulate(load_config(None, {k: (v, "--" + k.split(".")[-1].replace("_", "-")) for k, v in values.items()}))
        return s["output_throughput"], s["mean_acceptance_length"]

    lo, hi = 0.05, 0.98
    if rate(hi)[0] < target:
        return {"reachable": False, "tokens_per_s_at_0.98": rate(hi)[0]}
    for _ in range(14):
        mid = (lo + hi) / 2
        if rate(mid)[0] < target:
            lo = mid
        else:
            hi = mid
    tps, length = rate(hi)
    return {"reachable": True, "alpha": hi, "mean_acceptance_length": length, "tokens_per_s": tps}


# ----------------------------------------------------------------------------- figures
def figures(batch: pd.DataFrame, load: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(batch.dataset))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.8), sharey=True)
    for ax, dataset in zip(np.atleast_1d(axes), datasets):
        sub = batch[batch.dataset == dataset]
        for label, _, _ in BATCH_METHODS:
            line = sub[sub.method == label]
            ax.plot(line.batch, line.speedup, marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests in flight (batch)")
        ax.set_title(f"{dataset} (k = {K})")
    np.atleast_1d(axes)[0].set_ylabel("output throughput / no speculation")
    np.atleast_1d(axes)[0].legend()
    fig.tight_layout()
    fig.savefig(out / "methods_batch.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(DATASETS), figsize=(4.2 * len(DATASETS), 3.6), sharey=True)
    for ax, dataset in zip(axes, DATASETS):
        sub = load[(load.dataset == dataset) & (load.policy != "none")]
        for label, line in sub.groupby("policy"):
            ax.plot(line.load, line.tpot_vs_none, marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("load (fraction of saturation)")
        ax.set_title(dataset)
    axes[0].set_ylabel("mean TPOT / no speculation")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "methods_load.png", dpi=110)
    plt.close(fig)


def run(profile: str, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    acceptance = acceptance_table()
    acceptance.to_csv(out / "methods_acceptance.csv", index=False, float_format="%.4f")
    print("[methods] batch sweep", flush=True)
    batch = batch_sweep(profile)
    batch.to_csv(out / "methods_batch.csv", index=False, float_format="%.4f")
    print("[methods] load sweep", flush=True)
    load = load_sweep(profile)
    load.to_csv(out / "methods_load.csv", index=False, float_format="%.4f")
    print("[methods] published figures", flush=True)
    checks = published(profile)
    (out / "methods_published.json").write_text(json.dumps(checks, indent=2, sort_keys=True) + "\n")
    figures(batch, load, out)
    best = batch.loc[batch.groupby(["dataset", "batch"]).speedup.idxmax()]
    return {"specdecode_b128_speedup": round(checks["specdecode_b128"]["simulated"], 3),
            "sglang_none_tokens_per_s": round(checks["sglang_b1"]["simulated_none"], 1),
            "best_method_by_batch": {f"{r.dataset}/{r.batch}": r.method for r in best.itertuples()}}


def main(argv: list[str] | None = None) -> int:
    from sim.costmodel.profile import DEFAULT_PROFILE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--out", type=Path, default=HERE / "figures")
    args = parser.parse_args(argv)
    print(run(args.profile, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
