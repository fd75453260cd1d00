"""Study 5: vLLM-v0-style vs vLLM-v1-style scheduling, with and without speculation.

    python docs/studies/scheduling.py                               # the default (H100) profile
    python docs/studies/scheduling.py --profile PROFILE --out DIR

v0 (``--scheduler v0``) runs prefill-only steps before decode-only steps and reserves a
request's whole KV at admission; v1 (``--scheduler vllm-v1``) runs the decodes and prefill
chunks together in mixed steps under a token budget, on paged KV (docs/scheduling.md).
Rates are fractions of the profile's saturation throughput without speculation under v0
(the probe of study 3), so the script runs unchanged on any profile. Writes
scheduling.csv (latency against rate), scheduling_k.csv (every fixed k at two loads) and
scheduling.png into the output folder and returns headline numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent

FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.0)   # of the v0 saturation rate without speculation
K_FRACTIONS = (0.25, 0.75)                # where every fixed k is tried
K_MAX = 5
NUM_REQUESTS = 600                        # per run
SCHEDULERS = ("v0", "vllm-v1")
SEED = 0
# Mixed steps priced two ways (the cost model's formula, the kernel composition): decode batch, chunks
MIXED_BATCHES = (0, 8, 32, 128, 256)
MIXED_CHUNKS = (((0, 128),), ((0, 512),), ((0, 2048),), ((2048, 512),), ((0, 256), (0, 256)))
MIXED_K, MIXED_CONTEXT = 3, 700


def one_run(profile: str, scheduler: str, rate: float, k: int) -> dict:
    from rates import config_for
    from sim.simulate import simulate

    policy = "fixed" if k else "none"
    config = config_for(profile, policy, rate=rate, seed=SEED, num_requests=NUM_REQUESTS, k=k or None,
                        extra={"engine.scheduler": scheduler})
    s = simulate(config).summary
    return {"scheduler": scheduler, "k": k, "rate": rate,
            "mean_ttft_ms": s["mean_ttft_ms"], "p99_ttft_ms": s["p99_ttft_ms"], "mean_tpot_ms": s["mean_tpot_ms"],
            "p99_itl_ms": s["p99_itl_ms"], "mean_e2el_ms": s["mean_e2el_ms"], "p99_e2el_ms": s["p99_e2el_ms"],
            "mean_batch": s["mean_batch_size"], "throughput": s["request_throughput"],
            "preemptions": s.get("num_preemptions", 0)}


def sweep(profile: str, saturation: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = [{"fraction": f, **one_run(profile, scheduler, f * saturation, k)}
            for f in FRACTIONS for scheduler in SCHEDULERS for k in (0, 3)]
    from sim.costmodel.profile import load_profile

    top = min(K_MAX, load_profile(profile).k_max)
    k_rows = [{"fraction": f, **one_run(profile, scheduler, f * saturation, k)}
              for f in K_FRACTIONS for scheduler in SCHEDULERS for k in range(top + 1)]
    return pd.DataFrame(rows), pd.DataFrame(k_rows)


def mixed_check(profile: str) -> pd.DataFrame | None:
    """The target pass of mixed steps by the cost model's formula (sim/costmodel/model.py) and by the
    kernel composition (sim.compose.price.PassPricer.mixed); None for a profile not composed,
    or without its kernel data."""
    from specbatch.commands.compose import pricers_for
    from sim.costmodel.model import CostModel
    from sim.costmodel.profile import load_profile

    loaded = load_profile(profile)
    if loaded.meta.get("source") != "composed":
        return None
    try:
        target = pricers_for(loaded)["target"]
    except Exception:  # noqa: BLE001 - no kernel data here: the check is skipped, as tests/test_compose.py does
        return None
    cm = CostModel(loaded)

    def p(x: float) -> float:
        return float(cm.prefill_target(batch_size=1, query_tokens=max(x, 1.0)))

    rows = []
    for b in MIXED_BATCHES:
        for chunks in MIXED_CHUNKS:
            d, q = b * (MIXED_K + 1), sum(new for _, new in chunks)
            decode = float(cm.decode_target(batch_size=b, query_tokens=MIXED_K + 1, context_tokens=MIXED_CONTEXT)) if b \
                else 0.0
            cached = sum(c for c, _ in chunks)  # X(Q, S): the chunks' attention to their cached prefixes
            prefix = float(cm.prefix_attention(q, cached, max(MIXED_BATCHES))) if cached else 0.0
            formula = (decode + p(d + q) - p(d) if b else p(q)) + prefix
            kernels = target.mixed(b, MIXED_K + 1, MIXED_CONTEXT, list(chunks))
            rows.append({"batch": b, "chunks": " + ".join(f"{new}@{cached}" for cached, new in chunks),
                         "formula_ms": formula * 1e3, "kernels_ms": kernels * 1e3, "ratio": formula / kernels})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (metric, label) in zip(axes, (("mean_ttft_ms", "mean TTFT (ms)"), ("mean_tpot_ms", "mean TPOT (ms)"),
                                          ("mean_e2el_ms", "mean E2EL (ms)"))):
        for (scheduler, k), rows in table.groupby(["scheduler", "k"]):
            ax.plot(rows.rate, rows[metric], marker="o", linestyle="-" if scheduler == "vllm-v1" else "--",
                    label=f"{scheduler}, {'k = 3' if k else 'no speculation'}")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        ax.set_yscale("log" if metric != "mean_tpot_ms" else "linear")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def best_k(k_table: pd.DataFrame, metric: str) -> dict:
    return {f"{scheduler}@{fraction:g}": int(rows.loc[rows[metric].idxmin(), "k"])
            for (fraction, scheduler), rows in k_table.groupby(["fraction", "scheduler"])}


def run(profile: str, out_dir: Path) -> dict:
    sys.path.insert(0, str(HERE))
    from rates import saturation_rate

    out_dir.mkdir(parents=True, exist_ok=True)
    saturation = saturation_rate(profile)
    table, k_table = sweep(profile, saturation)
    table.round(6).to_csv(out_dir / "scheduling.csv", index=False)
    k_table.round(6).to_csv(out_dir / "scheduling_k.csv", index=False)
    plot(table, out_dir / "scheduling.png")
    check = mixed_check(profile)
    if check is not None:
        check.round(6).to_csv(out_dir / "scheduling_mixed_check.csv", index=False)
    top = table[table.fraction == FRACTIONS[-2]].set_index(["scheduler", "k"])
    return {"saturation_rate": round(saturation, 3),
            "best_k_by_tpot": best_k(k_table, "mean_tpot_ms"), "best_k_by_e2el": best_k(k_table, "mean_e2el_ms"),
            f"tpot_v1_over_v0_k3_at_{FRACTIONS[-2]:g}": round(top.loc[("vllm-v1", 3), "mean_tpot_ms"]
                                                            / top.loc[("v0", 3), "mean_tpot_ms"], 3),
            f"ttft_v1_over_v0_k3_at_{FRACTIONS[-2]:g}": round(top.loc[("vllm-v1", 3), "mean_ttft_ms"]
                                                            / top.loc[("v0", 3), "mean_ttft_ms"], 3)}


def main() -> int:
    import argparse

    from sim.costmodel.profile import DEFAULT_PROFILE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--out", type=Path, default=HERE / "figures")
    args = parser.parse_args()
    print(run(args.profile, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
