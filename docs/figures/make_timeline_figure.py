"""The timeline page's figure: python docs/figures/make_timeline_figure.py

Writes the trace of a two-replica run (the command below) and draws a 60 s excerpt of it
with matplotlib, from the trace events themselves: per replica its engine steps, its
running-batch counter and the requests it served (queued, prefill, decode). About 3 s.

    specbatch run --num-requests 200 --rate 0.25 --replicas 2 --router least-tokens \\
        --output-tokens lognormal:64:0.5 --timeline timeline.json --timeline-window 300:360
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from sim.config import load_config  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from specbatch.commands.timeline import write_timeline  # noqa: E402

# The CPU scenario that was the shipped default before the H100 profile: these rates are its.
SCENARIO = ROOT / "tests" / "baselines" / "scenarios" / "cpu.toml"
OUT = Path(__file__).resolve().parent / "timeline.png"
WINDOW = (300.0, 360.0)
PHASE_COLOURS = {"queued": "0.75", "prefill": "C1", "decode": "C0"}


def trace() -> dict:
    flags = {"workload.num_requests": 200, "workload.rate": 0.25, "cluster.replicas": 2,
             "cluster.router": "least-tokens", "workload.output_tokens": "lognormal:64:0.5", "seed": 0}
    result = simulate(load_config(SCENARIO, {key: (value, "figure") for key, value in flags.items()}))
    with tempfile.TemporaryDirectory() as folder:
        path = write_timeline(result, Path(folder) / "timeline.json", WINDOW)
        text = path.read_text()
    print(f"trace of the window: {len(text):,} bytes, {text.count(chr(10)) - 2:,} events")
    return json.loads(text)


def main() -> None:
    events = trace()["traceEvents"]
    replicas = sorted({e["pid"] for e in events if e["ph"] == "X"})
    fig, axes = plt.subplots(2 * len(replicas), 1, figsize=(11, 7), sharex=True,
                             gridspec_kw={"height_ratios": [1, 2.4] * len(replicas)})
    for pid, (ax_steps, ax_requests) in zip(replicas, zip(axes[::2], axes[1::2])):
        steps = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
        for e in steps:
            ax_steps.broken_barh([(e["ts"] / 1e6, e["dur"] / 1e6)], (0, 1), color=PHASE_COLOURS[e["name"]],
                                 edgecolor="white", linewidth=0.3)
        running = sorted((e["ts"] / 1e6, e["args"]["running"]) for e in events
                         if e["ph"] == "C" and e["name"] == "running" and e["pid"] == pid)
        twin = ax_steps.twinx()
        twin.step([t for t, _ in running], [v for _, v in running], where="post", color="k", lw=0.8)
        twin.set_ylabel("running", fontsize=8)
        ax_steps.set_yticks([])
        ax_steps.set_ylabel(f"replica {pid}\nsteps", fontsize=8)
        spans: dict = defaultdict(dict)  # request id -> phase -> [begin, end]
        for e in events:
            if e["ph"] in "be" and e["pid"] == pid and not e["name"].startswith("request"):
                spans[e["id"]].setdefault(e["name"], [None, None])[e["ph"] == "e"] = e["ts"] / 1e6
        for lane, rid in enumerate(sorted(spans)):
            for phase, (begin, end) in spans[rid].items():
                ax_requests.broken_barh([(begin, end - begin)], (lane, 0.8), color=PHASE_COLOURS[phase])
        ax_requests.set_ylabel("requests\n(one per row)", fontsize=8)
        ax_requests.set_yticks([])
    axes[-1].set_xlim(*WINDOW)
    axes[-1].set_xlabel("simulated time (s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASE_COLOURS.values()]
    axes[1].legend(handles, ["queued", "prefill (step / request)", "decode (step / request)"], fontsize=8,
                   loc="lower right")
    fig.suptitle("specbatch --timeline, 60 s excerpt: 2 replicas, least-tokens router (black: running batch)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
