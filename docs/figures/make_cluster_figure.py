"""The cluster page's figure: python docs/figures/make_cluster_figure.py

Mean and p99 E2EL against the per-replica request rate, for 1, 2 and 4 replicas and the
three routers, on the shipped CPU profile with fixed seeds (about 30 s on two cores).
Prints the numbers it plots.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from sim.config import load_config  # noqa: E402
from sim.router import ROUTERS  # noqa: E402
from sim.simulate import simulate  # noqa: E402

# The CPU scenario that was the shipped default before the H100 profile: these rates are its.
SCENARIO = ROOT / "tests" / "baselines" / "scenarios" / "cpu.toml"
OUT = Path(__file__).resolve().parent / "cluster.png"
RATES = (0.04, 0.07, 0.10, 0.12, 0.135)  # requests/s per replica; the profile saturates near 0.15
REQUESTS_PER_REPLICA = 300


def e2el(replicas: int, router: str, rate: float) -> tuple[float, float]:
    flags = {"cluster.replicas": replicas, "cluster.router": router, "workload.rate": rate * replicas,
             "workload.num_requests": REQUESTS_PER_REPLICA * replicas, "seed": 0, "output.records": "none"}
    s = simulate(load_config(SCENARIO, {key: (value, "figure") for key, value in flags.items()})).summary
    return s["mean_e2el_ms"] / 1e3, s["p99_e2el_ms"] / 1e3


def main() -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    styles = {"round-robin": "-", "least-requests": "--", "least-tokens": ":"}
    colours = {1: "black", 2: "C0", 4: "C3"}
    print(f"{'replicas':>8} {'router':>15} " + " ".join(f"{r:>14}" for r in RATES))
    for replicas in (1, 2, 4):
        for router in (ROUTERS[:1] if replicas == 1 else ROUTERS):
            points = [e2el(replicas, router, rate) for rate in RATES]
            print(f"{replicas:>8} {router:>15} " + " ".join(f"{m:6.0f}/{p:6.0f} s" for m, p in points))
            label = "1 replica" if replicas == 1 else f"{replicas} replicas, {router}"
            for ax, values in zip(axes, zip(*points)):
                ax.plot(RATES, values, styles[router], marker="o", ms=3, color=colours[replicas], label=label)
    for ax, stat in zip(axes, ("mean", "p99")):
        ax.set_xlabel("request rate per replica (req/s)")
        ax.set_ylabel(f"{stat} E2EL (s)")
        ax.set_title(f"{stat} end-to-end latency, {REQUESTS_PER_REPLICA} requests per replica", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("cpu-tinyllama-1.1b-llama-68m, fixed k=3, lognormal 128/128 tokens, Poisson arrivals",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
