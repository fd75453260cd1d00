"""A composed GPU profile against one measured on that GPU, point by point on the same grid.

    python benchmarks/composed_vs_measured.py                      # the shipped H100 pair
    python benchmarks/composed_vs_measured.py --composed A --measured B [--figure PATH]

The composed profile (``specbatch compose``: NVIDIA's kernel microbenchmarks of vLLM's
kernels, summed per pass) is only as good as its agreement with a measurement; this prints
that agreement where both profiles have a point (status ``ok`` in both): per phase and
model the median and p90 absolute percentage error of the median latency and the median
signed error (bias, composed - measured, relative to measured); the worst regions (phase,
model, batch, query tokens, context bucket); and the measured profile's hardware sanity,
batch-1 decode against weights / HBM bandwidth and the best prefill against peak FLOP/s
(both from the sidecars, never typed). The measured pass is specbatch's own plain-torch
model (calibrate/model.py), not vLLM, so part of any difference is the implementation.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

KEYS = ["phase", "model", "batch_size", "query_tokens", "context_tokens"]


def joined(composed, measured) -> pd.DataFrame:
    """Points both profiles measured (``ok``), with the signed relative error of composed vs measured."""
    a = composed.points[composed.points.status == "ok"][KEYS + ["latency_median_s"]]
    b = measured.points[measured.points.status == "ok"][KEYS + ["latency_median_s"]]
    both = a.merge(b, on=KEYS, suffixes=("_composed", "_measured"))
    both["error"] = both.latency_median_s_composed / both.latency_median_s_measured - 1
    return both


def summary(both: pd.DataFrame) -> pd.DataFrame:
    """Per (phase, model): points, median and p90 |error|, median error."""
    rows = []
    for (phase, model), g in both.groupby(["phase", "model"], sort=True):
        ape = g.error.abs()
        rows.append({"phase": phase, "model": model, "points": len(g), "median_ape": ape.median(),
                     "p90_ape": ape.quantile(0.9), "bias": g.error.median()})
    ape = both.error.abs()
    rows.append({"phase": "all", "model": "", "points": len(both), "median_ape": ape.median(),
                 "p90_ape": ape.quantile(0.9), "bias": both.error.median()})
    return pd.DataFrame(rows)


def floor_and_scale(both: pd.DataFrame) -> pd.DataFrame:
    """Per (phase, model): measured ~ scale x composed + floor (least squares), and the median
    |error| left after it: how much of the gap is a fixed per-pass cost plus a proportional one."""
    rows = []
    for (phase, model), g in both.groupby(["phase", "model"], sort=True):
        x, y = g.latency_median_s_composed.to_numpy(), g.latency_median_s_measured.to_numpy()
        scale, floor = np.polyfit(x, y, 1)
        rows.append({"phase": phase, "model": model, "scale": scale, "floor_ms": floor * 1e3,
                     "left": np.median(np.abs((scale * x + floor) / y - 1))})
    return pd.DataFrame(rows)


def regions(both: pd.DataFrame, top: int = 8) -> pd.DataFrame:
    """Median signed error per (phase, model, batch, q, context band), the largest |error| first."""
    band = np.where(both.context_tokens <= 1024, "ctx<=1k", np.where(both.context_tokens <= 8192, "ctx 2k-8k",
                                                                       "ctx>=16k"))
    g = both.assign(band=np.where(both.phase == "decode", band, "-")).groupby(
        ["phase", "model", "batch_size", "query_tokens", "band"], sort=True).error
    out = pd.DataFrame({"points": g.size(), "error": g.median()}).reset_index()
    return out.reindex(out.error.abs().sort_values(ascending=False, kind="stable").index).head(top)


def sanity(measured, spec: dict) -> list[str]:
    """Batch-1 decode against the weight-streaming bound; the best prefill against peak FLOP/s."""
    pts = measured.points[measured.points.status == "ok"]
    target = measured.meta["models"]["target"]
    decode = pts[(pts.phase == "decode") & (pts.model == "target") & (pts.batch_size == 1) & (pts.query_tokens == 1)]
    first = decode.sort_values("context_tokens").iloc[0]
    bound = target["weight_bytes"] / spec["mem_bw"]
    prefill = pts[(pts.phase == "prefill") & (pts.model == "target")].copy()
    prefill["flops"] = 2.0 * target["params"] * prefill.batch_size * prefill.query_tokens / prefill.latency_median_s
    best = prefill.loc[prefill.flops.idxmax()]
    return [f"batch-1 decode, target, context {int(first.context_tokens)}: {first.latency_median_s * 1e3:.2f} ms; "
            f"weights {target['weight_bytes'] / 1e9:.2f} GB / {spec['mem_bw'] / 1e12:.2f} TB/s = {bound * 1e3:.2f} ms "
            f"({bound / first.latency_median_s:.0%} of the spec-sheet bandwidth reached)",
            f"best prefill, target: batch {int(best.batch_size)} x {int(best.query_tokens)} tokens in "
            f"{best.latency_median_s * 1e3:.1f} ms = {best.flops / 1e12:.0f} TFLOP/s (2 x params x tokens) of "
            f"{spec['bf16_flops'] / 1e12:.0f} peak bf16 ({best.flops / spec['bf16_flops']:.0%})"]


def facts(measured) -> str:
    meta, pts = measured.meta, measured.points
    statuses = [row.get("status") for row in meta.get("skipped", [])]
    ok = int((pts.status == "ok").sum())
    timing, overhead = meta.get("timing", {}), meta.get("engine_overhead", {})
    graphs = ", ".join(timing.get("cuda_graphs", [])) or "none"
    line = (f"{measured.path.name}: {meta['device']['name']}, {meta['dtype']}, {ok + len(statuses)} points: "
            f"{ok} ok, {statuses.count('oom')} oom, {statuses.count('error')} error; "
            f"CUDA graphs for {graphs} ({timing.get('graph_fallbacks', 0)} fallbacks)")
    if "decode_overhead_s" in overhead:
        line += (f"; engine overhead measured {overhead['decode_overhead_s'] * 1e3:.2f} ms per decode step, "
                 f"{overhead['prefill_overhead_s'] * 1e3:.2f} ms per prefill step")
    return line


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def report(composed, measured) -> str:
    both = joined(composed, measured)
    lines = [facts(measured), f"composed: {composed.path.name} ({composed.meta.get('source', 'measured')})",
             f"points in both (ok in both): {len(both)}", "",
             f"{'phase':8} {'model':7} {'points':>6} {'median |err|':>12} {'p90 |err|':>10} {'bias':>8}"]
    for r in summary(both).itertuples():
        lines.append(f"{r.phase:8} {r.model:7} {r.points:>6} {100 * r.median_ape:>11.1f}% {100 * r.p90_ape:>9.1f}% "
                     f"{pct(r.bias):>8}")
    lines += ["", "measured ~ scale x composed + floor, per phase (least squares), and the median |error| left:",
              f"{'phase':8} {'model':7} {'scale':>6} {'floor':>9} {'left':>6}"]
    for r in floor_and_scale(both).itertuples():
        lines.append(f"{r.phase:8} {r.model:7} {r.scale:>6.2f} {r.floor_ms:>6.2f} ms {100 * r.left:>5.1f}%")
    lines += ["", "largest median errors (composed vs measured) by region:",
              f"{'phase':8} {'model':7} {'batch':>5} {'q':>2} {'context':9} {'points':>6} {'error':>8}"]
    for r in regions(both).itertuples():
        lines.append(f"{r.phase:8} {r.model:7} {r.batch_size:>5} {r.query_tokens:>2} {r.band:9} {r.points:>6} "
                     f"{pct(r.error):>8}")
    lines += ["", "hardware sanity (measured):", *sanity(measured, composed.meta["device"]["spec"])]
    return "\n".join(lines)


def figure(composed, measured, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    both = joined(composed, measured)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for (phase, model), g in both.groupby(["phase", "model"], sort=True):
        left.scatter(g.latency_median_s_measured * 1e3, g.latency_median_s_composed * 1e3, s=8,
                     label=f"{phase} {model}", alpha=0.7)
    lo, hi = both[["latency_median_s_composed", "latency_median_s_measured"]].stack().agg(["min", "max"]) * 1e3
    left.plot([lo, hi], [lo, hi], "k--", lw=1)
    left.set(xscale="log", yscale="log", xlabel="measured (ms)", ylabel="composed (ms)",
             title="each grid point, median latency")
    left.legend(fontsize=8)
    decode = both[(both.phase == "decode") & (both.model == "target")]
    for q in (1, 4, 9):
        g = decode[decode.query_tokens == q].groupby("batch_size").error.median()
        right.plot(g.index, 100 * g.to_numpy(), marker="o", label=f"target decode, q = {q}")
    g = both[(both.phase == "decode") & (both.model == "draft")].groupby("batch_size").error.median()
    right.plot(g.index, 100 * g.to_numpy(), marker="s", label="draft decode, q = 1-3")
    right.axhline(0, color="k", lw=1)
    right.set(xscale="log", xlabel="batch size", ylabel="composed vs measured (%), median over contexts",
              title="signed error against batch size")
    right.legend(fontsize=8)
    fig.suptitle(f"{composed.path.name} (composed) vs {measured.path.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--composed", default="h100-llama-3.1-8b-llama-3.2-1b")
    parser.add_argument("--measured", default="h100-measured-llama-3.1-8b-llama-3.2-1b")
    parser.add_argument("--figure", help="also write a PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    from sim.profile import load_profile

    composed, measured = load_profile(args.composed), load_profile(args.measured)
    print(report(composed, measured))
    if args.figure:
        figure(composed, measured, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
