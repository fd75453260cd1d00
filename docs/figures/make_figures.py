"""Regenerate every figure of the user guide: python docs/figures/make_figures.py

Uses only the shipped CPU profile and fixed seeds, so the PNGs (and the numbers this
script prints, which the pages quote) come out the same on every run. About 11 s on
two cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from sim.speculation.acceptance import expected_tokens_per_step  # noqa: E402
from specbatch.commands.flags import RUN_FLAGS  # noqa: E402
from sim.config import load_config  # noqa: E402
from sim.costmodel.model import CostModel  # noqa: E402
from sim.costmodel.profile import load_profile  # noqa: E402
from sim.simulate import simulate  # noqa: E402

OUT = Path(__file__).resolve().parent
SEED = 0
# These figures, and the pages that quote them, show the CPU profile and the scenario that was
# the shipped default before the H100 profile became it (docs/gpu-profiles.md).
DEFAULT_PROFILE = "cpu-tinyllama-1.1b-llama-68m"
SCENARIO = ROOT / "tests" / "baselines" / "scenarios" / "cpu.toml"
CPU_DURATION_S = 1200.0  # that scenario's run length (it leaves duration_s to the shipped defaults)


def config(**flags):
    """A RunConfig from flag-style keywords (``num_requests=30`` is ``--num-requests 30``)."""
    overrides = {}
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        overrides[RUN_FLAGS[flag][0]] = (value, flag)
    overrides.setdefault("seed", (SEED, "--seed"))
    overrides.setdefault("output.records", ("none", "--records"))
    return load_config(SCENARIO, overrides)


def cost_model_figure(cost: CostModel) -> None:
    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    batches = np.arange(1, 33)
    points = cost.profile.phase("decode", "target")
    for q, colour in zip((1, 2, 4, 8), ("C0", "C1", "C2", "C3")):
        curve = cost.decode_target(batch_size=batches, query_tokens=q, context_tokens=512)
        ax_a.plot(batches, curve, color=colour, label=f"q = {q}")
        measured = points[(points.query_tokens == q) & (points.context_tokens == 512)]
        ax_a.plot(measured.batch_size, measured.latency_median_s, "o", color=colour, ms=4)
    ax_a.set_xlabel("batch size b (sequences)")
    ax_a.set_ylabel("target forward pass (s)")
    ax_a.set_title("(a) target pass over q tokens per sequence, context 512\n"
                   "dots: measured medians, lines: interpolation", fontsize=10)
    ax_a.set_xscale("log", base=2)
    ax_a.set_xticks([1, 2, 4, 8, 16, 32], ["1", "2", "4", "8", "16", "32"])
    ax_a.legend()
    ax_a.grid(alpha=0.3)

    alpha, ks = 0.7, np.arange(0, cost.k_max + 1)
    print(f"expected seconds per token per sequence at alpha {alpha}, context 512:")
    for b, colour in zip((1, 4, 16, 32), ("C0", "C1", "C2", "C3")):
        per_token = cost.step_times(b, ks, 512) / expected_tokens_per_step(alpha, ks)
        best = int(np.argmin(per_token))
        ax_b.plot(ks, per_token * 1000, "-o", color=colour, ms=4, label=f"b = {b} (best k = {best})")
        ax_b.plot(ks[best], per_token[best] * 1000, "*", color=colour, ms=14, mec="black")
        print(f"  b {b:2}: " + " ".join(f"k{k}={t * 1000:.0f}ms" for k, t in zip(ks, per_token))
              + f"  -> best k = {best}")
    ax_b.set_xlabel("speculation length k (k = 0: plain decoding)")
    ax_b.set_ylabel("step time / E[tokens per sequence] (ms)")
    ax_b.set_title(f"(b) expected time per generated token, alpha = {alpha}, context 512\n"
                   "star: best k for the batch size", fontsize=10)
    ax_b.set_ylim(0, 1900)
    ax_b.legend(loc="upper center", ncol=2, fontsize=9)
    ax_b.grid(alpha=0.3)
    fig.suptitle(f"Cost model of the shipped profile {DEFAULT_PROFILE}", fontsize=11)
    fig.tight_layout()
    fig.savefig(OUT / "cost_model.png", dpi=110)
    plt.close(fig)


def acceptance_figure() -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ks = np.arange(1, 8)
    fine = np.linspace(1, 7, 61)
    print("mean acceptance length, simulated vs (1 - alpha^(k+1)) / (1 - alpha):")
    for alpha, colour in zip((0.5, 0.7, 0.9), ("C0", "C1", "C2")):
        simulated = []
        for k in ks:
            result = simulate(config(policy="fixed", k=int(k), alpha=alpha, num_requests=32, rate=1000.0,
                                     prompt_tokens="32", output_tokens="900"))
            s = result.summary
            simulated.append(s["mean_acceptance_length"])
            print(f"  alpha {alpha} k {k}: simulated {s['mean_acceptance_length']:.3f} over {s['num_drafts']} "
                  f"drafts, formula {expected_tokens_per_step(alpha, int(k)):.3f}")
        ax.plot(fine, expected_tokens_per_step(alpha, fine), "-", color=colour, alpha=0.6)
        ax.plot(ks, simulated, "o", color=colour, label=f"alpha = {alpha}")
    ax.plot([], [], "-", color="grey", label="formula (1 - alpha^(k+1)) / (1 - alpha)")
    ax.set_xlabel("speculation length k")
    ax.set_ylabel("mean acceptance length (tokens per draft)")
    ax.set_title("Simulated (dots, 32 requests x 900 tokens) vs formula (lines)", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "acceptance.png", dpi=110)
    plt.close(fig)


def _held(steps, column: str) -> tuple[np.ndarray, np.ndarray]:
    """x, y to draw ``column`` of the decode steps, held over each step, broken where a prefill ran."""
    decode = steps[steps.phase == 1]
    xs, ys = [], []
    last_end = None
    for start, end, value in zip(decode.start_s, decode.end_s, decode[column]):
        if last_end is not None and start != last_end:
            xs.append(np.nan)
            ys.append(np.nan)
        xs += [start, end]
        ys += [value, value]
        last_end = end
    return np.asarray(xs), np.asarray(ys)


def batching_figure() -> None:
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.6), sharex=True, sharey=True)
    workload = dict(policy="fixed", k=3, rate=0.25, num_requests=60, max_batch_size=16)
    print("continuous vs static batching (fixed k = 3, 60 requests at 0.25 req/s, max batch 16):")
    for ax, batching, colour in ((axes[0], "continuous", "C0"), (axes[1], "static", "C3")):
        result = simulate(config(batching=batching, **workload))
        steps = result.steps
        for start, end in zip(steps.start_s[steps.phase == 0], steps.end_s[steps.phase == 0]):
            ax.axvspan(start, end, color="0.85", lw=0)
        ax.plot(*_held(steps, "running"), color=colour, lw=1.3, label="sequences decoding (running)")
        if batching == "static":
            ax.plot(*_held(steps, "batch_size"), "--", color="black", lw=1,
                    label="batch size charged (finished ones stay as padding)")
        ax.axvspan(0, 0, color="0.85", label="prefill steps")
        s = result.summary
        ax.set_title(f"{batching} batching: {s['completed']} requests done at {s['duration_s']:.0f} s, "
                     f"mean TTFT {s['mean_ttft_ms'] / 1000:.0f} s", fontsize=10)
        ax.set_ylabel("batch size (sequences)")
        ax.legend(loc="upper center", ncol=3, fontsize=8)
        ax.grid(alpha=0.3)
        print(f"  {batching:10}: duration {s['duration_s']:.0f} s, mean TTFT {s['mean_ttft_ms'] / 1000:.1f} s, "
              f"p99 TTFT {s['p99_ttft_ms'] / 1000:.1f} s, mean E2EL {s['mean_e2el_ms'] / 1000:.1f} s, "
              f"output {s['output_throughput']:.2f} tok/s, mean batch {s['mean_batch_size']:.2f}")
    axes[1].set_xlabel("simulated time (s)")
    axes[0].set_ylim(0, 22)
    fig.suptitle("One workload (60 requests, Poisson 0.25 req/s, max batch 16, fixed k = 3), "
                 "decode steps from steps.csv", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT / "batching.png", dpi=110)
    plt.close(fig)


def traffic_figure() -> None:
    from workloads import parse_rate_profile, profile_arrivals

    fig, (ax_a, ax_b) = plt.subplots(2, 1, figsize=(9, 6.2))
    profile = parse_rate_profile("phases:1,4,8:60,60,60")
    edges = np.arange(0, 181, 10)
    print("phases:1,4,8:60,60,60, arrivals per 10 s (seed 0):")
    for label, kw, colour in (("Poisson (burstiness 1)", {}, "C0"), ("Gamma, cv = 2 (burstiness 0.25)",
                                                                      {"cv": 2.0}, "C3")):
        t = profile_arrivals(np.random.default_rng(SEED), profile, duration_s=180.0, **kw)
        counts = np.histogram(t, bins=edges)[0]
        ax_a.stairs(counts, edges, color=colour, lw=1.5, label=f"{label}: {t.size} requests")
        print(f"  {label:32} {t.size} requests, per 10 s: {counts.tolist()}")
    expected = 10 * profile.rate(edges[:-1])
    ax_a.stairs(expected, edges, color="black", ls="--", lw=1, label="10 s x rate(t)")
    ax_a.set_xlim(0, 180)
    ax_a.set_ylabel("arrivals per 10 s")
    ax_a.set_title("(a) --rate-profile phases:1,4,8:60,60,60 --duration 180, two arrival processes", fontsize=10)
    ax_a.legend(fontsize=8, loc="upper left")
    ax_a.grid(alpha=0.3)

    result = simulate(config(rate_profile="phases:0.05,0.1,0.2:600,600,600"))
    req = result.requests
    edges = np.arange(0, 1801, 60)
    counts = np.histogram(req.arrival_s, bins=edges)[0]
    ax_b.bar(edges[:-1], counts, width=60, align="edge", color="0.8", label="arrivals per 60 s")
    ax_b.set_ylabel("arrivals per 60 s")
    ax_b.set_xlabel("simulated time (s)")
    twin = ax_b.twinx()
    twin.plot(req.arrival_s, req.ttft_s, ".", ms=3, color="C1", label="TTFT of each request (s), by arrival")
    twin.set_ylabel("TTFT (s)")
    s = result.summary
    ax_b.set_title(f"(b) CPU scenario with phases:0.05,0.1,0.2:600,600,600: {s['completed']} requests, "
                   f"mean TTFT {s['mean_ttft_ms'] / 1000:.1f} s", fontsize=10)
    ax_b.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper center", fontsize=8)
    ax_b.set_xlim(0, 1800)
    for phase, (lo, hi) in enumerate(((0, 600), (600, 1200), (1200, 1800))):
        part = req[(req.arrival_s >= lo) & (req.arrival_s < hi)]
        print(f"  CPU run, phase {phase + 1} [{lo}, {hi}) s: {len(part)} arrivals, "
              f"mean TTFT {part.ttft_s.mean():.1f} s")
    fig.tight_layout()
    fig.savefig(OUT / "traffic.png", dpi=110)
    plt.close(fig)


# One figure per policy page (docs/policy-*.md).

def lut_figure(cost: CostModel) -> None:
    from policies.lut import DEFAULT_CONTEXT, DEFAULT_K_MAX, best_k

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    batches = np.arange(1, 33)
    print(f"lut: best k per batch size (context {DEFAULT_CONTEXT}, k_max {DEFAULT_K_MAX}):")
    for i, (alpha, colour) in enumerate(zip((0.6, 0.7, 0.8, 0.9), ("C0", "C1", "C2", "C3"))):
        ks = [best_k(cost.step_time, alpha, DEFAULT_K_MAX, int(b), DEFAULT_CONTEXT)[0] for b in batches]
        ax.step(batches, np.asarray(ks) + (i - 1.5) * 0.04, where="mid", color=colour, lw=1.8,
                label=f"alpha = {alpha}")
        print(f"  alpha {alpha}: " + " ".join(f"{b}:{k}" for b, k in zip(batches, ks)))
    ax.set_xlabel("batch size b (sequences)")
    ax.set_ylabel("k in the table")
    ax.set_yticks(range(DEFAULT_K_MAX + 1))
    ax.set_ylim(-0.3, DEFAULT_K_MAX + 0.3)
    ax.set_title(f"Auto-built lut tables, {DEFAULT_PROFILE}, context {DEFAULT_CONTEXT}, k_max {DEFAULT_K_MAX}\n"
                 "(lines nudged apart vertically where they coincide)", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "policy_lut.png", dpi=110)
    plt.close(fig)


def goodput_figure() -> None:
    from sim.simulate import execute, prepare

    run = prepare(load_config(SCENARIO, {"policy.name": ("goodput", "--policy"), "policy.alpha_init": (0.9, "figure"),
                                     "acceptance.alpha": (0.6, "--alpha"), "seed": (SEED, "--seed"),
                                     "workload.duration_s": (CPU_DURATION_S, "--duration"),
                                     "output.records": ("none", "--records"),
                                     "engine.jit": ("off", "--jit")}))  # interpreted: observe is called per step
    policy, history = run.policy, []
    observe = policy.observe

    def recording(feedback):  # alpha_hat after every decode step (k = 0 steps pull it towards alpha_init)
        observe(feedback)
        history.append(policy.alpha_hat)

    policy.observe = recording
    result = execute(run)
    decode = result.steps[result.steps.phase == 1]
    steps = np.arange(1, len(history) + 1)
    fig, (ax_a, ax_b) = plt.subplots(2, 1, figsize=(9, 5.6), sharex=True)
    ax_a.plot(steps, history, color="C0", lw=1, label="alpha_hat (after each decode step)")
    ax_a.axhline(0.6, color="black", ls="--", lw=1, label="true alpha = 0.6")
    ax_a.set_ylabel("alpha_hat")
    ax_a.set_ylim(0.3, 1.0)
    ax_a.legend(loc="upper right", fontsize=8)
    ax_a.grid(alpha=0.3)
    ks = decode.k.to_numpy()
    window = 25
    ax_b.plot(steps, ks, ".", ms=2, color="C1", alpha=0.4, label="k chosen")
    ax_b.plot(steps[window - 1:], np.convolve(ks, np.ones(window) / window, mode="valid"), color="C3", lw=1.2,
              label=f"mean over {window} steps")
    ax_b.set_ylabel("k")
    ax_b.set_xlabel("decode step")
    ax_b.legend(loc="upper right", fontsize=8)
    ax_b.grid(alpha=0.3)
    s = result.summary
    fig.suptitle(f"goodput (alpha_init 0.9) in the CPU scenario with true alpha 0.6: {s['completed']} requests, "
                 f"mean k {s['mean_k']:.2f}", fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT / "policy_goodput.png", dpi=110)
    plt.close(fig)
    first = int(np.argmax(np.abs(np.asarray(history) - 0.6) < 0.05))
    print(f"goodput: {len(history)} decode steps, alpha_hat first within 0.05 of 0.6 at step {first + 1}, "
          f"mean alpha_hat over the second half {np.mean(history[len(history) // 2:]):.3f}, "
          f"mean k {s['mean_k']:.2f}, k over the first 50 steps {ks[:50].mean():.2f}, after {ks[50:].mean():.2f}")


def context_figure(cost: CostModel) -> None:
    from policies.context import DEFAULT_CONTEXT_BUCKETS
    from policies.lut import DEFAULT_K_MAX, best_k

    alpha, batches, edges = 0.8, np.arange(1, 33), DEFAULT_CONTEXT_BUCKETS
    mids = [(lo + hi) / 2 for lo, hi in zip((0,) + tuple(e + 1 for e in edges[:-1]), edges)]
    grid = np.array([[best_k(cost.step_time, alpha, DEFAULT_K_MAX, int(b), mid)[0] for b in batches]
                     for mid in mids])
    fig, ax = plt.subplots(figsize=(9, 4.2))
    image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=DEFAULT_K_MAX,
                      extent=(0.5, batches[-1] + 0.5, -0.5, len(edges) - 0.5), interpolation="nearest")
    for i in range(len(edges)):
        for j, b in enumerate(batches):
            ax.text(b, i, str(grid[i, j]), ha="center", va="center", fontsize=6,
                    color="white" if grid[i, j] < DEFAULT_K_MAX / 2 else "black")
    ax.set_yticks(range(len(edges)), [f"<= {e}" for e in edges])
    ax.set_xlabel("batch size b (sequences)")
    ax.set_ylabel("context bucket (tokens, priced at its midpoint)")
    top = int(cost.decode_target.bounds("context_tokens")[1])
    ax.set_title(f"context table auto-built at alpha {alpha}, k_max {DEFAULT_K_MAX}, {DEFAULT_PROFILE}\n"
                 f"(the profile measured contexts up to {top}: longer buckets use the fitted extrapolation)",
                 fontsize=10)
    fig.colorbar(image, ax=ax, label="k", ticks=range(DEFAULT_K_MAX + 1))
    fig.tight_layout()
    fig.savefig(OUT / "policy_context.png", dpi=110)
    plt.close(fig)
    print(f"context: k at alpha {alpha} per bucket (batch 1..32):")
    for edge, row in zip(edges, grid):
        print(f"  <= {edge:5}: " + "".join(str(k) for k in row))


def adaptive_figure() -> None:
    result = simulate(config(policy="adaptive", duration=CPU_DURATION_S))
    decode = result.steps[result.steps.phase == 1]
    k_max = int(result.config.policy.params["k_max"])
    edges = np.arange(0, decode.end_s.max() + 60, 60)
    window = np.digitize(decode.start_s, edges) - 1
    counts = np.zeros((k_max + 1, len(edges) - 1))
    np.add.at(counts, (decode.k.to_numpy(), window), 1)
    shares = counts / np.maximum(counts.sum(axis=0), 1)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    centres = (edges[:-1] + edges[1:]) / 2
    ax.stackplot(centres, shares, labels=[f"k = {k}" for k in range(k_max + 1)],
                 colors=[plt.cm.viridis(k / k_max) for k in range(k_max + 1)], alpha=0.9)
    ax.set_xlim(centres[0], centres[-1])
    ax.set_ylim(0, 1)
    ax.set_xlabel("simulated time (s), 60 s windows")
    ax.set_ylabel("share of decode steps")
    s = result.summary
    ax.set_title(f"adaptive (defaults) in the CPU scenario: {s['completed']} requests, "
                 f"{s['num_decode_steps']} decode steps, mean k {s['mean_k']:.2f}", fontsize=10)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "policy_adaptive.png", dpi=110)
    plt.close(fig)
    total = counts.sum(axis=1) / counts.sum()
    print("adaptive: share of decode steps per k over the run: "
          + " ".join(f"k{k}={v:.2f}" for k, v in enumerate(total)))


def main() -> None:
    cost = CostModel(load_profile(DEFAULT_PROFILE))
    cost_model_figure(cost)
    acceptance_figure()
    batching_figure()
    traffic_figure()
    lut_figure(cost)
    goodput_figure()
    context_figure(cost)
    adaptive_figure()
    print("wrote " + ", ".join(sorted(p.name for p in OUT.glob("*.png"))) + f" to {OUT}")


if __name__ == "__main__":
    main()
