"""The studies' result tables as their pages show them, read from the result files.

``docs/generate.py`` calls these for the pages' ``<!-- generated: study-... -->`` blocks, so
a page always shows what the committed results in ``figures/`` (the H100 profile) and
``figures/cpu/`` (the CPU profile) hold: rerun a study, then ``python docs/generate.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

FIGURES = Path(__file__).resolve().parent / "figures"


def _md(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---:" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


def headlines(folder: Path = FIGURES) -> dict:
    return json.loads((folder / "headlines.json").read_text())


def optimal_k_lut(folder: Path = FIGURES) -> str:
    """The batch size -> k table per alpha, as vLLM writes it: [start_bs, end_bs, k]."""
    lut = pd.read_csv(folder / "optimal_k_lut.csv")
    rows = []
    for alpha, sub in lut.groupby("alpha"):
        ranges = ", ".join(f"[{r.start_bs}, {r.end_bs}, {r.k}]" + ("*" if r.extrapolated else "")
                           for r in sub.itertuples())
        rows.append({"α": f"{alpha:g}", "table `[start_bs, end_bs, k]` (* extrapolated batch sizes)": ranges})
    return _md(pd.DataFrame(rows))


def optimal_k_headlines(folder: Path = FIGURES) -> str:
    h = headlines(folder)["optimal_k"]
    top = h["grid_max_batch"]
    rows = []
    for key in sorted(k for k in h if k.startswith("alpha_")):
        a = h[key]
        rows.append({"α": key.split("_")[1], "best k at b = 1": a["best_k_b1"], f"best k at b = {top}": a[f"best_k_b{top}"],
                     "speedup at b = 1": f"{a['speedup_b1']:.2f}", f"speedup at b = {top}": f"{a[f'speedup_b{top}']:.2f}",
                     "k = 0 best from batch": a["k0_best_from_batch"]})
    return _md(pd.DataFrame(rows))


def optimal_k_sim(folder: Path = FIGURES) -> str:
    sim = pd.read_csv(folder / "optimal_k_sim.csv")
    frame = pd.DataFrame({"batch": sim.batch_size, "simulated best k": sim.sim_best_k,
                          "analytic best k": sim.analytic_best_k,
                          "simulated TPOT at that k (ms)": (sim.sim_best_tpot_s * 1e3).map("{:.2f}".format),
                          "analytic time/token (ms)": (sim.analytic_time_per_token_s * 1e3).map("{:.2f}".format),
                          "TPOT at k = 0 (ms)": (sim.tpot_k0_s * 1e3).map("{:.2f}".format)})
    return _md(frame)


def rates_e2el(folder: Path = FIGURES) -> str:
    """Mean E2EL (s) per rate and policy, mean over seeds; goodput's mean k."""
    rates = pd.read_csv(folder / "rates.csv")
    wide = rates.pivot(index="fraction", columns="policy", values="mean_e2el_s")
    order = ["none"] + sorted(c for c in wide.columns if c.startswith("k=")) + ["goodput"]
    best = wide[order].idxmin(axis=1)
    rows = []
    for fraction, row in wide[order].iterrows():
        cells = {"rate / saturation": f"{fraction:.2f}"}
        for policy in order:
            text = f"{row[policy]:.2f}"
            cells[policy] = f"**{text}**" if best[fraction] == policy else text
        goodput = rates[(rates.fraction == fraction) & (rates.policy == "goodput")].iloc[0]
        cells["goodput's mean k"] = f"{goodput.mean_k:.2f}"
        cells["goodput's mean batch"] = f"{goodput.mean_batch:.0f}"
        rows.append(cells)
    return _md(pd.DataFrame(rows))


def rates_property(folder: Path = FIGURES) -> str:
    h = headlines(folder)["rates"]
    return (f"worst relative excess of one run: **{h['goodput_worst_excess_per_run']:+.1%}**; of the mean over "
            f"seeds: {h['goodput_worst_excess_seed_mean']:+.1%} (the margin the test allows: +5%).\n")


def traffic_phases(folder: Path = FIGURES) -> str:
    """Per phase: mean E2EL (s) and mean k of each policy."""
    t = pd.read_csv(folder / "traffic.csv")
    rows = []
    for (phase, load), sub in t.groupby(["phase", "load"], sort=True):
        cells = {"phase": phase, "load": f"{load:g}", "mean batch (none)": f"{sub[sub.policy == 'none'].mean_batch.iloc[0]:.0f}"}
        for r in sub.itertuples():
            cells[f"{r.policy}: E2EL s / k"] = f"{r.mean_e2el_s:.2f} / {r.mean_k:.2f}"
        rows.append(cells)
    return _md(pd.DataFrame(rows))


def long_context_trend(folder: Path = FIGURES) -> str:
    """Speedup of the best k at the two trend batches, per context, for both drafts."""
    lc = pd.read_csv(folder / "long_context.csv")
    h = headlines(folder)["long_context"]
    lo, hi = h["trend_batches"]
    capacity = h.get("kv_capacity_tokens")
    rows = []
    for ctx, sub in lc.groupby("context_tokens"):
        cells = {"context (tokens)": f"{ctx:,}" + ("*" if sub.extrapolated.any() and ctx > h["measured_contexts_to"] else "")}
        for draft, d in sub.groupby("draft", sort=False):
            s = d.set_index("batch_size").speedup_best_k
            cells[f"{draft}: speedup b={lo} / b={hi}"] = f"{s[lo]:.2f} / {s[hi]:.2f}"
            cells[f"{draft}: trend"] = f"{s[hi] / s[lo]:.2f}"
        if capacity:
            cells[f"b={hi} fits the KV"] = "yes" if hi * ctx <= capacity else "no"
        rows.append(cells)
    return _md(pd.DataFrame(rows))


def long_context_headline(folder: Path = FIGURES) -> str:
    h = headlines(folder)["long_context"]

    def tokens(v):
        return "none (the trend never stays above 1)" if v is None else f"{v:,} tokens"

    w = h["draft_window"]
    return (f"S_inflection, full-KV draft: best k {tokens(h['s_inflection_tokens'])}, fixed k = {h['fixed_k']} "
            f"{tokens(h['s_inflection_fixed_k_tokens'])}. Window-{w['tokens']} draft: best k "
            f"{tokens(w['s_inflection_tokens'])}, fixed k = {h['fixed_k']} {tokens(w['s_inflection_fixed_k_tokens'])}.\n")


def long_context_sim(folder: Path = FIGURES) -> str:
    sim = pd.read_csv(folder / "long_context_sim.csv")
    frame = pd.DataFrame({"prompt (tokens)": sim.prompt_tokens, "policy": sim.policy,
                          "mean TPOT (ms)": (sim.mean_tpot_s * 1e3).map("{:.1f}".format),
                          "throughput (tok/s)": sim.throughput_tok_s.map("{:,.0f}".format),
                          "mean k": sim.mean_k.map("{:.2f}".format)})
    return _md(frame)


def scheduling_rates(folder: Path = FIGURES) -> str:
    """v0 vs vllm-v1 scheduling against rate, with (k = 3) and without speculation."""
    t = pd.read_csv(folder / "scheduling.csv")
    frame = pd.DataFrame({"rate (req/s)": t.rate.map("{:.1f}".format), "scheduler": t.scheduler,
                          "speculation": t.k.map(lambda k: f"k = {k}" if k else "none"),
                          "mean TTFT (ms)": t.mean_ttft_ms.map("{:.1f}".format),
                          "p99 TTFT (ms)": t.p99_ttft_ms.map("{:.1f}".format),
                          "mean TPOT (ms)": t.mean_tpot_ms.map("{:.2f}".format),
                          "p99 ITL (ms)": t.p99_itl_ms.map("{:.1f}".format),
                          "mean E2EL (ms)": t.mean_e2el_ms.map("{:.0f}".format),
                          "mean decode batch": t.mean_batch.map("{:.1f}".format)})
    return _md(frame)


def scheduling_k(folder: Path = FIGURES) -> str:
    """Every fixed k under both schedulers at two loads; the best per column in bold."""
    t = pd.read_csv(folder / "scheduling_k.csv")
    rows = []
    for (fraction, scheduler), sub in t.groupby(["fraction", "scheduler"], sort=True):
        best_tpot, best_e2el = sub.mean_tpot_ms.idxmin(), sub.mean_e2el_ms.idxmin()
        for i, r in sub.iterrows():
            rows.append({"load": f"{fraction:g} x saturation", "scheduler": scheduler, "k": r.k,
                         "mean TTFT (ms)": f"{r.mean_ttft_ms:.1f}",
                         "mean TPOT (ms)": f"**{r.mean_tpot_ms:.2f}**" if i == best_tpot else f"{r.mean_tpot_ms:.2f}",
                         "mean E2EL (ms)": f"**{r.mean_e2el_ms:.0f}**" if i == best_e2el else f"{r.mean_e2el_ms:.0f}"})
    return _md(pd.DataFrame(rows))


def scheduling_mixed_check(folder: Path = FIGURES) -> str:
    """A mixed step's target pass: the cost model's formula against the kernel composition."""
    t = pd.read_csv(folder / "scheduling_mixed_check.csv")
    frame = pd.DataFrame({"decode batch (k = 3)": t.batch, "chunks (new@cached)": t.chunks,
                          "formula (ms)": t.formula_ms.map("{:.2f}".format),
                          "kernels (ms)": t.kernels_ms.map("{:.2f}".format),
                          "formula / kernels": t.ratio.map("{:.3f}".format)})
    return _md(frame)


def tune_loads(folder: Path = FIGURES) -> str:
    """Per load: the tuned schedule; mean E2EL (s) on the held-out seeds of the tuned schedule, goodput, the
    best fixed k, lut and none; the tuned schedule against the best baseline (± 95%) and the verdict."""
    t = pd.read_csv(folder / "tune.csv")
    rows = []
    for r in pd.read_csv(folder / "tune_schedules.csv").itertuples():
        sub = t[t.fraction == r.fraction].set_index("policy").mean_e2el_s
        fixed = sub[[p for p in sub.index if p.startswith("fixed")]]
        pick = {name: next(p for p in sub.index if p.startswith(name)) for name in ("goodput", "lut")}
        rows.append({"load": f"{r.fraction:.0%}", "rate (req/s)": f"{r.rate:.3g}", "tuned schedule": f"`{r.schedule}`",
                     "tuned": f"{sub['tuned']:.3f}", "goodput": f"{sub[pick['goodput']]:.3f}",
                     "best fixed k": f"{fixed.min():.3f} (k={fixed.idxmin().split('=')[1]})",
                     "lut": f"{sub[pick['lut']]:.3f}", "none": f"{sub['none']:.3f}",
                     "tuned vs best baseline": f"{r.tuned_vs_best_rel:+.2%} ± {r.noise_rel:.2%}",
                     "verdict": f"{r.verdict} ({r.best_baseline})",
                     "tuned's mean batch": f"{t[(t.fraction == r.fraction) & (t.policy == 'tuned')].mean_batch.iloc[0]:.0f}"})
    return _md(pd.DataFrame(rows))


def tune_headline(folder: Path = FIGURES) -> str:
    h = headlines(folder)["tune"]
    return (f"The tuned schedule is within noise of or better than the best baseline at **{h['within_noise_or_better']} "
            f"of {len(h['fractions'])}** loads; its mean E2EL is at most {h['worst_tuned_vs_best_baseline_rel']:.2%} "
            f"above the best baseline's, and {h['tuned_vs_goodput_rel_range'][0]:+.2%} to "
            f"{h['tuned_vs_goodput_rel_range'][1]:+.2%} from goodput's; the searches moved {h['moves_total']} bands "
            f"away from their starts in all.\n")


def smartspec_70b(folder: Path = FIGURES) -> str:
    """Mean E2EL relative to `none` per draft, rate and policy (below 1: speculation helps)."""
    t = pd.read_csv(folder / "smartspec_70b.csv")
    rows = []
    for (draft, fraction), sub in t.groupby(["draft", "fraction"], sort=False):
        e2el = sub.set_index("policy").mean_e2el_s
        ratio = e2el / e2el["none"]
        best = ratio.drop("none").idxmin()
        row = {"draft": draft, "rate / saturation": f"{fraction:.2f}", "none (s)": f"{e2el['none']:.2f}"}
        for policy in ratio.index.drop("none"):
            cell = f"{ratio[policy]:.2f}"
            row[policy] = f"**{cell}**" if policy == best else cell
        row["goodput's mean k"] = f"{sub.set_index('policy').mean_k['goodput']:.2f}"
        rows.append(row)
    return _md(pd.DataFrame(rows))


def draft_1b_70b_throughput(folder: Path = FIGURES) -> str:
    """Output throughput at 32 requests in flight, relative to no speculation, per variant, alpha and k."""
    t = pd.read_csv(folder / "draft_1b_70b.csv")
    rows = []
    for (variant, alpha), sub in t.groupby(["variant", "alpha"], sort=False):
        sub = sub.set_index("k")
        base = sub.output_tok_s[0]
        ratio = sub.output_tok_s / base
        best = ratio.drop(0).idxmax()
        row = {"setting": variant, "α": f"{alpha:g}", "none (tok/s)": f"{base:.0f}"}
        row.update({f"k={k}": (f"**{ratio[k]:.2f}**" if k == best else f"{ratio[k]:.2f}") for k in ratio.index if k})
        rows.append(row)
    return _md(pd.DataFrame(rows))


def draft_1b_70b_step(folder: Path = FIGURES) -> str:
    """One batch-32 step taken apart from the profile's curves (alpha 0.7)."""
    t = pd.read_csv(folder / "draft_1b_70b_step.csv")
    frame = pd.DataFrame({"k": t.k, "70B pass (ms)": t.target_ms.map("{:.2f}".format),
                          "k 1B passes (ms)": t.draft_ms.map("{:.2f}".format),
                          "verification (ms)": t.verify_ms.map("{:.3f}".format),
                          "engine (ms)": t.engine_ms.map("{:.2f}".format), "step (ms)": t.step_ms.map("{:.2f}".format),
                          "tokens / step at α 0.7": t.tokens_per_step.map("{:.2f}".format),
                          "ms / token": t.ms_per_token.map("{:.2f}".format)})
    return _md(frame)


def draft_1b_70b_losing(folder: Path = FIGURES) -> str:
    """How long one 1B pass would have to take for speculation to lose at batch 32."""
    t = pd.read_csv(folder / "draft_1b_70b_losing_pass.csv")
    ks = [c for c in t.columns if c.startswith("k=")]
    frame = pd.DataFrame({"α": t.alpha.map("{:g}".format),
                          **{k: t[k].map("{:.1f}".format) for k in ks}})
    return _md(frame)


def tp_vs_replicas(folder: Path = FIGURES) -> str:
    """The two ways side by side per rate: mean TPOT and p99 TTFT, none and the best fixed k."""
    t = pd.read_csv(folder / "tp_vs_replicas.csv")
    rows = []
    for rate, sub in t.groupby("rate", sort=True):
        row = {"total req/s": f"{rate:.0f}"}
        for way in dict.fromkeys(t.way):
            w = sub[sub.way == way].set_index("policy")
            spec = w.drop("none")
            best = spec.mean_e2el_ms.idxmin()  # the fixed k with the lowest mean E2EL at this rate
            row[f"{way}: TPOT, none (ms)"] = f"{w.mean_tpot_ms['none']:.1f}"
            row[f"{way}: TPOT, best k (ms)"] = f"{spec.mean_tpot_ms[best]:.1f} ({best})"
            row[f"{way}: p99 TTFT, none (ms)"] = f"{w.p99_ttft_ms['none']:.0f}"
        rows.append(row)
    return _md(pd.DataFrame(rows))


def tp_vs_replicas_slo(folder: Path = FIGURES) -> str:
    t = pd.read_csv(folder / "tp_vs_replicas_slo.csv")
    frame = pd.DataFrame({"way": t.way, "policy": t.policy,
                          "highest total req/s meeting the SLOs": [("≥ " if top else "") + f"{r:.0f}"
                                                                   for r, top in zip(t.max_rate_meeting_slo, t.at_grid_top)]})
    return _md(frame)


def smartspec_70b_headline(folder: Path = FIGURES) -> str:
    h = headlines(folder)["smartspec_70b"]
    rows = []
    for draft in ("1B draft", "8B draft"):
        d = h[draft]
        worse = {k: v for k, v in d["fractions_where_fixed_k_is_worse_than_none"].items() if v}
        rows.append({"draft": draft, "saturation without speculation (req/s)": f"{d['saturation_req_s']:.2f}",
                     "fixed k worse than none": ("; ".join(f"{k} at {', '.join(f'{f:g}' for f in v)} x saturation"
                                                           for k, v in worse.items()) or "never"),
                     "goodput's worst excess over the better of none and the best fixed k":
                         f"{100 * d['goodput_worst_excess_over_best_of_none_and_fixed']:.1f}%"})
    return _md(pd.DataFrame(rows))


def draft_1b_70b_headline(folder: Path = FIGURES) -> str:
    """The break-even acceptance per k at batch 32, and the two passes by composed term."""
    h = headlines(folder)["draft_1b_70b"]
    rows = [{"k": k, "α below which speculation loses at batch 32": f"{v:.2f}"}
            for k, v in h["breakeven_alpha_at_batch_32"].items()]
    out = _md(pd.DataFrame(rows))
    terms = h.get("pass_terms_ms")
    if terms:
        names = list(terms["target"])
        frame = pd.DataFrame([{"pass at batch 32": role, **{n: f"{terms[role].get(n, 0.0):.3f}" for n in names},
                               "total (ms)": f"{sum(terms[role].values()):.3f}"}
                              for role in ("target", "draft")])
        out += "\n" + _md(frame.rename(columns={"gemm": "GEMMs (ms)", "attention": "attention (ms)",
                                                 "small_ops": "small ops (ms)", "lm_head": "LM head (ms)",
                                                 "communication": "collectives (ms)"}))
    return out


def tp_vs_replicas_headline(folder: Path = FIGURES) -> str:
    h = headlines(folder)["tp_vs_replicas"]
    rows = [{"way": way, "KV cache (tokens, all GPUs)": f"{kv:,}",
             "TPOT at the lowest rate, none (ms)": f"{h['low_load_mean_tpot_ms'][f'{way} none']:.2f}",
             "TPOT at the lowest rate, k=3 (ms)": f"{h['low_load_mean_tpot_ms'][f'{way} k=3']:.2f}",
             "TTFT at the lowest rate, none (ms)": f"{h['low_load_mean_ttft_ms'][f'{way} none']:.1f}"}
            for way, kv in h["kv_capacity_tokens"].items()]
    return _md(pd.DataFrame(rows))



def methods_acceptance(folder: Path = FIGURES) -> str:
    """Study 10: the measured run lengths per dataset and proposer (methods_acceptance.csv)."""
    acc = pd.read_csv(folder / "methods_acceptance.csv")
    batch = pd.read_csv(folder / "methods_batch.csv")
    one = batch[batch.batch == 1].set_index(["dataset", "method"]).tokens_per_row_step
    replayed = [one.get((d, "EAGLE-3" if p == "eagle" else "n-gram"), float("nan"))
                for d, p in zip(acc.dataset, acc.proposer)]
    frame = pd.DataFrame({"dataset": acc.dataset, "proposer": acc.proposer,
                          "mean run": acc.mean_run.map("{:.2f}".format),
                          "P(run > 1)": acc.p_run_gt_1.map("{:.3f}".format),
                          "proposes at": acc.p_proposes.map("{:.3f}".format),
                          "P(a ≥ 1, 2, 3 \\| proposed)": [f"{a:.3f}, {b:.3f}, {c:.3f}" for a, b, c in
                                                         zip(acc.p_a_ge_1, acc.p_a_ge_2, acc.p_a_ge_3)],
                          "tokens per step, k = 3": acc.tokens_per_step_k3.map("{:.2f}".format),
                          "replayed, 1 in flight": [f"{x:.2f}" for x in replayed]})
    return _md(frame)


def methods_batch(folder: Path = FIGURES) -> str:
    """Study 10: output throughput over no speculation, per requests in flight (methods_batch.csv)."""
    batch = pd.read_csv(folder / "methods_batch.csv")
    rows = []
    for (dataset, b), sub in batch.groupby(["dataset", "batch"], sort=False):
        cells = {"dataset": dataset, "in flight": b,
                 "none, EAGLE's lengths (tok/s)": f"{sub.none_steady_throughput.iloc[0]:.0f}"}
        best = sub.speedup.max()
        for r in sub.itertuples():
            text = f"{r.speedup:.2f}x"
            cells[r.method] = f"**{text}**" if r.speedup == best else text
        rows.append(cells)
    return _md(pd.DataFrame(rows))


def methods_load(folder: Path = FIGURES) -> str:
    """Study 10: n-gram's mean TPOT over no speculation's, by workload and load (methods_load.csv)."""
    load = pd.read_csv(folder / "methods_load.csv")
    rows = []
    for (dataset, fraction), sub in load.groupby(["dataset", "load"], sort=False):
        by = sub.set_index("policy")
        rows.append({"dataset": dataset, "load": f"{fraction:.1f}",
                     "none TPOT (ms)": f"{by.loc['none', 'mean_tpot_ms']:.2f}",
                     "n-gram k = 3": f"{by.loc['n-gram k=3', 'tpot_vs_none']:.2f}",
                     "n-gram goodput": f"{by.loc['n-gram goodput', 'tpot_vs_none']:.2f}",
                     "goodput's mean k": f"{by.loc['n-gram goodput', 'mean_k']:.2f}",
                     "mean batch (none)": f"{by.loc['none', 'mean_batch']:.0f}"})
    return _md(pd.DataFrame(rows))


def methods_published(folder: Path = FIGURES) -> str:
    """Study 10: the published figures against the simulation (methods_published.json)."""
    p = json.loads((folder / "methods_published.json").read_text())
    spec, sg = p["specdecode_b128"], p["sglang_b1"]
    rows = [{"figure": "SpecDecode-Bench: EAGLE k = 3, GSM8K, 128 in flight, throughput / none",
             "published": f"{spec['published']:.2f}x", "simulated": f"{spec['simulated']:.2f}x"},
            {"figure": "SGLang: no speculation, batch 1 (tokens/s)", "published": f"{sg['published_none']:.1f}",
             "simulated": f"{sg['simulated_none']:.1f}"},
            {"figure": "EAGLE-3 chain, k = 3, ShareGPT's measured runs, batch 1 (tokens/s)", "published": "",
             "simulated": f"{sg['simulated_eagle3_chain_k3']:.1f} (acceptance length "
                          f"{sg['chain_mean_acceptance_length']:.2f})"}]
    for method, label in (("eagle", "EAGLE-2"), ("eagle3", "EAGLE-3")):
        need = sg[f"needed_{method}"]
        published = {"eagle": 244.10, "eagle3": 373.25}[method]
        simulated = (f"needs α {need['alpha']:.2f}: acceptance length {need['mean_acceptance_length']:.2f}"
                     if need["reachable"] else f"out of reach (α 0.98 gives {need['tokens_per_s_at_0.98']:.0f})")
        rows.append({"figure": f"SGLang: {label}, default tree (5 steps, top-4, 8 tokens), batch 1 (tokens/s)",
                     "published": f"{published:.1f}", "simulated": simulated})
    return _md(pd.DataFrame(rows))

def _split_order(configs) -> list[str]:
    """Aggregated first, then the splits from prefill-light to prefill-heavy, then the best split."""
    configs = list(dict.fromkeys(configs))
    splits = sorted((c for c in configs if "P:" in c), key=lambda c: int(c.split("P")[0]))
    return [c for c in configs if c.startswith("aggregated")] + splits + ["best split"]


def disaggregation_goodput(folder: Path = FIGURES) -> str:
    """Study 11: per-GPU goodput (req/s) per setup, SLO scale and configuration; the best split over aggregated."""
    g = pd.read_csv(folder / "disaggregation_goodput.csv")
    order = _split_order(g.config)
    rows = []
    for (setup, scale), sub in g.groupby(["setup", "slo_scale"], sort=False):
        at = sub.set_index("config")
        row = {"setup": setup, "SLO scale": f"{scale:g}"}
        for config in order:
            if config in at.index:
                value = at.goodput_per_gpu[config]
                best = config == "best split" and value > 0  # no split meets the limits: none is named
                row[config] = f"{value:.2f}" + (f" ({at.best_split[config]})" if best else "")
        v1 = at.goodput_per_gpu["aggregated (vLLM V1)"]
        row["best split / aggregated"] = f"{at.goodput_per_gpu['best split'] / v1:.2f}x" if v1 > 0 else "—"
        rows.append(row)
    return _md(pd.DataFrame(rows).fillna("—"))


def disaggregation_binding(folder: Path = FIGURES) -> str:
    """Study 11: at the paper's SLOs, per-GPU goodput with both limits, the TTFT limit alone and the TPOT limit
    alone: the smaller of the two alone is the limit that binds."""
    g = pd.read_csv(folder / "disaggregation_goodput.csv")
    tight = headlines(folder)["disaggregation"]["tight_scale"]
    g = g[(g.slo_scale == tight) & (g.config != "best split")]
    def cell(values, at_top):  # "≥": the limit still held at the sweep's highest rate
        return [("≥ " if top else "") + f"{v:.2f}" for v, top in zip(values, at_top)]

    frame = pd.DataFrame({"setup": g.setup, "configuration": g.config,
                          "both limits": cell(g.goodput_per_gpu, g.at_grid_top),
                          "TTFT limit alone": cell(g.ttft_only_per_gpu, g.ttft_only_at_grid_top),
                          "TPOT limit alone": cell(g.tpot_only_per_gpu, g.tpot_only_at_grid_top)})
    return _md(frame)


def disaggregation_published(folder: Path = FIGURES) -> str:
    """Study 11: each published finding beside the ratio that checks it (disaggregation_published.json)."""
    rows = []
    for r in json.loads((folder / "disaggregation_published.json").read_text()):
        value = r["simulated"] if isinstance(r["simulated"], str) else f"{r['simulated']:.2f}x"
        rows.append({"finding": r["finding"], "source": r["source"], "published": r["published"],
                     "specbatch: what is compared": r["ours"], "specbatch": value,
                     "direction": "reproduced" if r["reproduced"] else "**not reproduced**"})
    return _md(pd.DataFrame(rows))


TABLES = {
    "study-optimal-k-lut": optimal_k_lut,
    "study-optimal-k-headlines": optimal_k_headlines,
    "study-optimal-k-sim": optimal_k_sim,
    "study-optimal-k-headlines-cpu": lambda: optimal_k_headlines(FIGURES / "cpu"),
    "study-rates-e2el": rates_e2el,
    "study-rates-property": rates_property,
    "study-traffic-phases": traffic_phases,
    "study-long-context-trend": long_context_trend,
    "study-long-context-headline": long_context_headline,
    "study-long-context-sim": long_context_sim,
    "study-scheduling-rates": scheduling_rates,
    "study-scheduling-k": scheduling_k,
    "study-scheduling-mixed-check": scheduling_mixed_check,
    "study-tune-loads": tune_loads,
    "study-tune-headline": tune_headline,
    "study-smartspec-70b": smartspec_70b,
    "study-smartspec-70b-headline": smartspec_70b_headline,
    "study-draft-1b-70b-headline": draft_1b_70b_headline,
    "study-tp-vs-replicas-headline": tp_vs_replicas_headline,
    "study-draft-1b-70b-throughput": draft_1b_70b_throughput,
    "study-draft-1b-70b-step": draft_1b_70b_step,
    "study-draft-1b-70b-losing": draft_1b_70b_losing,
    "study-tp-vs-replicas": tp_vs_replicas,
    "study-tp-vs-replicas-slo": tp_vs_replicas_slo,
    "study-methods-acceptance": methods_acceptance,
    "study-methods-batch": methods_batch,
    "study-methods-load": methods_load,
    "study-methods-published": methods_published,
    "study-disaggregation-goodput": disaggregation_goodput,
    "study-disaggregation-binding": disaggregation_binding,
    "study-disaggregation-published": disaggregation_published,
}
