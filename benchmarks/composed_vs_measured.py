"""A composed GPU profile against one measured on that GPU, point by point on the same grid.

    python benchmarks/composed_vs_measured.py                      # the shipped H100 pair
    python benchmarks/composed_vs_measured.py --composed A --measured B [--figure PATH]

Why: a composed profile (``specbatch compose``: NVIDIA's kernel microbenchmarks of vLLM's
kernels, summed per pass) is only as good as its agreement with a measurement, and a
disagreement is only useful once it is split into its causes. This prints, where both
profiles have a point (status ``ok`` in both):

* per phase and model, the median and p90 absolute percentage error of the median latency
  and the median signed error (bias: composed - measured, relative to measured);
* the worst regions (phase, model, batch, query tokens, context bands);
* the gap split into terms, each read off one slice of the grid: the batch-1 decode floor
  per layer (two models, two unknowns), the KV-cache read rate against batch size (decode
  time's slope over context), the cost per token per layer beyond the floor (passes of at
  least 1024 tokens); then how much of the error is left once composed + those terms;
* the measured profile's hardware sanity: batch-1 decode against weights / HBM bandwidth,
  the best prefill against peak bf16 FLOP/s (both from the sidecars, never typed).

The measured pass is specbatch's own plain-torch model (calibrate/model.py), not vLLM, so
the terms describe that implementation as much as the composition; docs/gpu-profiles.md
says which is which.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

KEYS = ["phase", "model", "batch_size", "query_tokens", "context_tokens"]
MIN_TOKENS = 1024  # passes at least this long give the per-token cost (the floor is small beside them)


def joined(composed, measured) -> pd.DataFrame:
    """Points both profiles measured (``ok``) of the target and the draft model (the drafter heads and
    host proposers a profile may also price are not this comparison's), with the signed relative error
    of composed vs measured."""
    a = composed.points[(composed.points.status == "ok") & composed.points.model.isin(("target", "draft"))][
        KEYS + ["latency_median_s"]]
    b = measured.points[measured.points.status == "ok"][KEYS + ["latency_median_s"]]
    both = a.merge(b, on=KEYS, suffixes=("_composed", "_measured"))
    both["error"] = both.latency_median_s_composed / both.latency_median_s_measured - 1
    return both


def heads(composed, measured) -> str:
    """The drafter heads both profiles price (EAGLE, EAGLE-3, MTP, Medusa: calibrate.heads), point by
    point: per phase and head the median and p90 |error| and the bias, then the one-token decode's
    measured and composed time by batch size and context."""
    pick = lambda p: p.points[(p.points.status == "ok") & ~p.points.model.isin(("target", "draft"))][  # noqa: E731
        KEYS + ["latency_median_s"]]
    both = pick(composed).merge(pick(measured), on=KEYS, suffixes=("_composed", "_measured"))
    if both.empty:
        return "drafter heads: none in both profiles"
    both["error"] = both.latency_median_s_composed / both.latency_median_s_measured - 1
    table = errors(both)
    lines = ["drafter heads, composed vs measured (points ok in both):",
             f"{'phase':8} {'head':8} {'points':>6} {'median |err|':>12} {'p90 |err|':>10} {'bias':>8}"]
    lines += [f"{r.phase:8} {r.model:8} {r.points:>6} {r.median_ape:>12.1%} {r.p90_ape:>10.1%} {r.bias:>+8.1%}"
              for r in table.itertuples() if r.phase != "all"]
    one = both[(both.phase == "decode") & (both.query_tokens == 1)].sort_values(["model", "context_tokens",
                                                                                  "batch_size"])
    lines += ["", "one-token decode of the head (ms): measured / composed", f"{'head':8} {'context':>7}  "
              + "  ".join(f"{'b=' + str(b):>13}" for b in sorted(one.batch_size.unique()))]
    for (model, context), g in one.groupby(["model", "context_tokens"], sort=True):
        cells = [f"{m * 1e3:6.3f}/{c * 1e3:6.3f}" for m, c in zip(g.latency_median_s_measured,
                                                                  g.latency_median_s_composed)]
        lines.append(f"{model:8} {int(context):>7}  " + "  ".join(f"{cell:>13}" for cell in cells))
    return "\n".join(lines)


def errors(both: pd.DataFrame, predicted: pd.Series | None = None) -> pd.DataFrame:
    """Per (phase, model) and over all: points, median and p90 |error|, median error (of ``predicted`` if given)."""
    error = both.error if predicted is None else predicted / both.latency_median_s_measured - 1
    groups = [((phase, model), error[g.index]) for (phase, model), g in both.groupby(["phase", "model"], sort=True)]
    return pd.DataFrame([{"phase": phase, "model": model, "points": len(e), "median_ape": e.abs().median(),
                          "p90_ape": e.abs().quantile(0.9), "bias": e.median()}
                         for (phase, model), e in groups + [(("all", ""), error)]])



def regions(both: pd.DataFrame, per_group: int = 2) -> pd.DataFrame:
    """Median signed error per (phase, model, batch band, q band, context band); the worst per (phase, model)."""
    b, q, c, decode = both.batch_size, both.query_tokens, both.context_tokens, both.phase == "decode"
    bands = both.assign(
        batch=np.select([b <= 4, b <= 32], ["1-4", "8-32"], ">=64"),
        q=np.select([both.phase == "prefill", both.phase == "verify"],
                    [np.where(q <= 512, "p<=512", "p>=1k"), np.where(q == 0, "k=0", np.where(q <= 4, "k=1-4", "k>=5"))],
                    np.where(q == 1, "q=1", np.where(q <= 4, "q=2-4", "q>=5"))),
        context=np.where(decode, np.select([c <= 1024, c <= 8192], ["<=1k", "2k-8k"], ">=16k"), "-"))
    g = bands.groupby(["phase", "model", "batch", "q", "context"], sort=True).error
    out = pd.DataFrame({"points": g.size(), "error": g.median()}).reset_index()
    out = out.assign(size=out.error.abs()).sort_values(["phase", "model", "size"], ascending=[True, True, False],
                                                       kind="stable")
    return out.groupby(["phase", "model"], sort=True).head(per_group).drop(columns="size")


def layers(profile) -> dict[str, int]:
    return {role: int(m["config"]["num_layers"]) for role, m in profile.meta["models"].items()}


def batch1_floor(both: pd.DataFrame, n_layers: dict[str, int]) -> tuple[float, float]:
    """(scale, floor per layer) with measured = scale x composed + layers x floor for both models'
    batch-1, one-token decode at their shortest context: two equations, two unknowns. The scale
    is the weight streaming (GEMMs) measured against composed, the floor a cost per layer that
    composition does not price."""
    rows = both[(both.phase == "decode") & (both.batch_size == 1) & (both.query_tokens == 1)]
    first = rows.sort_values("context_tokens", kind="stable").groupby("model").first()
    a = [[first.latency_median_s_composed[r], n_layers[r]] for r in ("target", "draft")]
    scale, floor = np.linalg.solve(a, [first.latency_median_s_measured[r] for r in ("target", "draft")])
    return float(scale), float(floor)


def kv_rates(both: pd.DataFrame, kv_bytes: dict[str, int], q: int = 1) -> pd.DataFrame:
    """Per (model, batch): the KV bytes per second a decode of ``q`` tokens reads, from its time's slope
    between the shortest and the longest context both profiles have, measured and composed."""
    rows = []
    decode = both[(both.phase == "decode") & (both.query_tokens == q)]
    for (model, batch), g in decode.groupby(["model", "batch_size"], sort=True):
        if g.context_tokens.nunique() < 2:
            continue
        g = g.sort_values("context_tokens", kind="stable")
        lo, hi = g.iloc[0], g.iloc[-1]
        read = batch * kv_bytes[model] * (hi.context_tokens - lo.context_tokens)
        rows.append({"model": model, "batch_size": int(batch), "context": int(hi.context_tokens),
                     "measured": read / (hi.latency_median_s_measured - lo.latency_median_s_measured),
                     "composed": read / (hi.latency_median_s_composed - lo.latency_median_s_composed)})
    return pd.DataFrame(rows, columns=["model", "batch_size", "context", "measured", "composed"])


def per_token(both: pd.DataFrame, n_layers: dict[str, int], floor: float) -> pd.DataFrame:
    """Per (phase, model): the gap beyond the floor per token per layer (seconds), median over passes of
    at least MIN_TOKENS tokens (decode at the shortest context, so that KV reads stay small)."""
    tokens = both.batch_size * both.query_tokens
    shortest = both.groupby(["phase", "model"]).context_tokens.transform("min")
    long = both[(both.phase != "verify") & (tokens >= MIN_TOKENS) & (both.context_tokens == shortest)]
    per_layer = long.model.map(n_layers)
    gap = (long.latency_median_s_measured - long.latency_median_s_composed - per_layer * floor) / (
        tokens[long.index] * per_layer)
    g = gap.groupby([long.phase, long.model], sort=True)
    return pd.DataFrame({"points": g.size(), "seconds": g.median()}).reset_index()


def explained(both: pd.DataFrame, n_layers: dict[str, int], kv_bytes: dict[str, int], floor: float,
              tokens_cost: pd.DataFrame, rates: pd.DataFrame) -> pd.Series:
    """Composed + the terms: floor and per-token cost per layer (prefill, decode), and the KV read
    at the measured rate instead of the composed one (decode). Verification is left as composed."""
    cost = tokens_cost.set_index(["phase", "model"]).seconds
    by_model = tokens_cost[tokens_cost.phase == "prefill"].set_index("model").seconds
    per_layer = both.model.map(n_layers)
    beta = [cost.get((p, m), by_model.get(m, 0.0)) for p, m in zip(both.phase, both.model)]
    add = per_layer * (floor + np.asarray(beta) * both.batch_size * both.query_tokens)
    rate = rates.set_index(["model", "batch_size"])
    key = list(zip(both.model, both.batch_size))
    slow = np.array([1 / rate.measured.get(k, np.inf) - 1 / rate.composed.get(k, np.inf) for k in key])
    kv = both.batch_size * (both.context_tokens + both.query_tokens) * both.model.map(kv_bytes) * slow
    decode, prefill = both.phase == "decode", both.phase == "prefill"
    return both.latency_median_s_composed + np.where(decode | prefill, add, 0) + np.where(decode, kv, 0)


# What-if for the composition itself (vLLM-side corrections, not toward this calibrator's implementation):
SMALL_KERNELS = {"llama": 5, "opt": 6}  # memory-bound kernels per layer in vLLM (compose prices their bytes only)
SAMPLER_KERNELS = 8  # cast, softmax, uniform and exponential draws, rejection, recovered tokens, bonus, scatter


def corrected(both: pd.DataFrame, composed) -> pd.Series:
    """Composed with (1) each of a layer's memory-bound kernels taking at least the spec sheet's
    constant latency, and (2) the rejection sampler's traffic: the target logits cast to fp32 and
    softmaxed (14 bytes per vocabulary entry of each of the k + 1 rows), the recovered-token draw
    over the k draft rows (8), one exponential noise row per sequence (8), in SAMPLER_KERNELS
    kernels; compose prices one fp32 read per row (4 x (2k + 1)) and one kernel."""
    spec, models = composed.meta["device"]["spec"], composed.meta["models"]
    latency, bandwidth = spec["mem_latency_s"], spec["mem_bw"] * spec["mem_bw_scaling"]
    cfg = both.model.map(lambda role: models[role]["config"])
    floor = cfg.map(lambda c: c["num_layers"] * SMALL_KERNELS.get(c["arch"], 5) * latency)
    k, vocab = both.query_tokens, cfg.map(lambda c: c["vocab_size"])
    sampler = SAMPLER_KERNELS * latency + both.batch_size * vocab * (14 * (k + 1) + 8 * k + 8) / bandwidth
    return pd.Series(np.where(both.phase == "verify", sampler, both.latency_median_s_composed + floor), both.index)


def sanity(measured, spec: dict, composed=None, floor_s: float = 0.0) -> list[str]:
    """Batch-1 decode against the weight-streaming bound; the best prefill against peak FLOP/s."""
    def ok(profile):
        return profile.points[profile.points.status == "ok"].set_index(KEYS).latency_median_s

    pts = measured.points[measured.points.status == "ok"]
    target = measured.meta["models"]["target"]
    cfg = target["config"]
    decode = pts[(pts.phase == "decode") & (pts.model == "target") & (pts.batch_size == 1) & (pts.query_tokens == 1)]
    first = decode.sort_values("context_tokens", kind="stable").iloc[0]
    bound = target["weight_bytes"] / spec["mem_bw"]
    prefill = pts[(pts.phase == "prefill") & (pts.model == "target")].copy()
    b, p = prefill.batch_size, prefill.query_tokens
    # 2 FLOPs per parameter per token, plus causal attention (QK^T and PV: 2 x 2 x p^2/2 x hidden per layer)
    prefill["work"] = b * (2.0 * target["params"] * p + 2.0 * cfg["num_layers"] * p * p * cfg["hidden_size"])
    best = prefill.loc[(prefill.work / prefill.latency_median_s).idxmax()]
    flops = best.work / best.latency_median_s
    lines = [f"batch-1 decode, target, context {int(first.context_tokens)}: {first.latency_median_s * 1e3:.2f} ms; "
             f"weights {target['weight_bytes'] / 1e9:.2f} GB / {spec['mem_bw'] / 1e12:.2f} TB/s = {bound * 1e3:.2f} ms "
             f"({bound / first.latency_median_s:.0%} of the spec-sheet bandwidth reached"
             + (f"; {bound / (first.latency_median_s - cfg['num_layers'] * floor_s):.0%} without the floor per layer)"
                if floor_s else ")"),
             f"best prefill, target: batch {int(best.batch_size)} x {int(best.query_tokens)} tokens in "
             f"{best.latency_median_s * 1e3:.1f} ms = {flops / 1e12:.0f} TFLOP/s (2 x params x tokens + causal "
             f"attention) of {spec['bf16_flops'] / 1e12:.0f} peak bf16 ({flops / spec['bf16_flops']:.0%})"]
    if composed is not None:
        other = ok(composed)
        at = tuple(first[KEYS]) if tuple(first[KEYS]) in other.index else None
        pf = tuple(best[KEYS]) if tuple(best[KEYS]) in other.index else None
        if at and pf:
            lines.append(f"the composed profile at the same points: {other[at] * 1e3:.2f} ms "
                         f"({bound / other[at]:.0%} of the bandwidth), {other[pf] * 1e3:.1f} ms "
                         f"({best.work / other[pf] / spec['bf16_flops']:.0%} of peak)")
    return lines


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


def error_table(table: pd.DataFrame) -> list[str]:
    lines = [f"{'phase':8} {'model':7} {'points':>6} {'median |err|':>12} {'p90 |err|':>10} {'bias':>8}"]
    for r in table.itertuples():
        lines.append(f"{r.phase:8} {r.model:7} {r.points:>6} {100 * r.median_ape:>11.1f}% {100 * r.p90_ape:>9.1f}% "
                     f"{pct(r.bias):>8}")
    return lines


def report(composed, measured) -> str:
    both = joined(composed, measured)
    n_layers = layers(measured)
    kv_bytes = {role: int(m["kv_bytes_per_token"]) for role, m in measured.meta["models"].items()}
    lines = [facts(measured), f"composed: {composed.path.name} ({composed.meta.get('source', 'measured')})",
             f"points in both (ok in both): {len(both)}", "", *error_table(errors(both))]
    lines += ["", "largest median errors (composed vs measured), two regions per phase and model:",
              f"{'phase':8} {'model':7} {'batch':>6} {'q':>6} {'context':>7} {'points':>6} {'error':>8}"]
    for r in regions(both).itertuples():
        lines.append(f"{r.phase:8} {r.model:7} {r.batch:>6} {r.q:>6} {r.context:>7} {r.points:>6} {pct(r.error):>8}")

    scale, floor = batch1_floor(both, n_layers)
    rates, tokens_cost = kv_rates(both, kv_bytes), per_token(both, n_layers, floor)
    lines += ["", "the gap, term by term:",
              f"batch-1 decode (target {n_layers['target']} layers, draft {n_layers['draft']}): measured = "
              f"{scale:.3f} x composed + {floor * 1e6:.1f} us per layer "
              f"({n_layers['target'] * floor * 1e3:.2f} ms target, {n_layers['draft'] * floor * 1e3:.2f} ms draft)",
              "KV-cache read rate of a one-token decode (slope over context), TB/s:",
              f"{'batch':>5} {'target measured':>16} {'composed':>9} {'draft measured':>15} {'composed':>9}"]
    for batch, g in rates.groupby("batch_size", sort=True):
        cells = []
        for model in ("target", "draft"):
            r = g[g.model == model]
            cells += [f"{r.measured.iloc[0] / 1e12:.2f}", f"{r.composed.iloc[0] / 1e12:.2f}"] if len(r) else ["-", "-"]
        lines.append(f"{batch:>5} {cells[0]:>16} {cells[1]:>9} {cells[2]:>15} {cells[3]:>9}")
    q_top = int(both[(both.phase == "decode") & (both.model == "target")].query_tokens.max())
    wide = rates.merge(kv_rates(both, kv_bytes, q_top), on=["model", "batch_size"], suffixes=("", "_q"))
    wide = wide[(wide.model == "target") & (wide.measured > 0.8 * wide.composed)]  # where the kernel fills the GPU
    if len(wide):
        lines.append(f"target, batch {wide.batch_size.min()}-{wide.batch_size.max()}: reading the KV at q = {q_top} "
                     f"takes {(wide.measured / wide.measured_q).median():.2f}x (measured) and "
                     f"{(wide.composed / wide.composed_q).median():.2f}x (composed) the time at q = 1")
    lines.append(f"beyond the floor, per token per layer (passes of >= {MIN_TOKENS} tokens; decode at the shortest "
                 "context):")
    for r in tokens_cost.itertuples():
        lines.append(f"  {r.phase:8} {r.model:7} {r.seconds * 1e6:.3f} us ({r.points} points)")
    for phase, model in sorted({(p, m) for p, m in zip(both.phase, both.model) if p != "verify"}):
        if not ((tokens_cost.phase == phase) & (tokens_cost.model == model)).any():
            lines.append(f"  {phase:8} {model:7} no pass that long: its prefill's figure is used")
    smallest = both[both.phase == "prefill"].sort_values(["model", "latency_median_s_measured"], kind="stable")
    lines.append("smallest prefill measured (eager: the host launching the pass's kernels): " + ", ".join(
        f"{r.model} {r.latency_median_s_measured * 1e3:.2f} ms (batch {r.batch_size} x {r.query_tokens}; composed "
        f"{r.latency_median_s_composed * 1e3:.2f} ms)" for r in smallest.groupby("model", sort=False).head(1)
        .sort_values("model", ascending=False).itertuples()))
    lines += ["composed + floor + per-token cost + KV read at the measured rate (verification as composed):",
              *error_table(errors(both, explained(both, n_layers, kv_bytes, floor, tokens_cost, rates)))]
    lines += ["", "what-if, the composition corrected toward vLLM (a memory-bound kernel takes at least the spec "
              "sheet's latency; the sampler's full traffic):", *error_table(errors(both, corrected(both, composed)))]
    lines += ["", "hardware sanity (measured):", *sanity(measured, composed.meta["device"]["spec"], composed, floor)]
    return "\n".join(lines)


def figure(composed, measured, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    both = joined(composed, measured)
    kv_bytes = {role: int(m["kv_bytes_per_token"]) for role, m in measured.meta["models"].items()}
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.5))
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
        middle.plot(g.index, 100 * g.to_numpy(), marker="o", label=f"target decode, q = {q}")
    g = both[(both.phase == "decode") & (both.model == "draft")].groupby("batch_size").error.median()
    middle.plot(g.index, 100 * g.to_numpy(), marker="s", label="draft decode, q = 1-3")
    middle.axhline(0, color="k", lw=1)
    middle.set(xscale="log", xlabel="batch size", ylabel="composed vs measured (%), median over contexts",
               title="signed error against batch size")
    middle.legend(fontsize=8)
    rates = kv_rates(both, kv_bytes)
    for model, marker, colour in (("target", "o", "C0"), ("draft", "s", "C3")):
        r = rates[rates.model == model]
        right.plot(r.batch_size, r.measured / 1e12, marker=marker, color=colour, label=f"{model}, measured")
        right.plot(r.batch_size, r.composed / 1e12, marker=marker, color=colour, ls="--", label=f"{model}, composed")
    right.axhline(composed.meta["device"]["spec"]["mem_bw"] / 1e12, color="k", lw=1, ls=":", label="spec sheet")
    right.set(xscale="log", xlabel="batch size", ylabel="TB/s", ylim=(0, None),
              title="KV-cache read rate of a one-token decode")
    right.legend(fontsize=8)
    fig.suptitle(f"{composed.path.name} (composed) vs {measured.path.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--composed", default="h100-llama-3.1-8b-llama-3.2-1b")
    parser.add_argument("--measured", default="h100-measured-llama-3.1-8b-llama-3.2-1b")
    parser.add_argument("--figure", help="also write a PNG (needs matplotlib)")
    parser.add_argument("--heads", action="store_true",
                        help="compare the drafter heads (EAGLE-3, MTP, ...) the two profiles price instead")
    args = parser.parse_args(argv)
    from sim.costmodel.profile import load_profile

    composed, measured = load_profile(args.composed), load_profile(args.measured)
    print(heads(composed, measured) if args.heads else report(composed, measured))
    if args.figure:
        figure(composed, measured, args.figure)
    return 0


if __name__ == "__main__":
    from sim.errors import InputError

    try:
        sys.exit(main())
    except InputError as exc:  # a bad profile name: one line, as the CLI answers
        sys.exit(f"error: {exc}")
