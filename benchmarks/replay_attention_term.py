"""How much of a GPU replay's decode step the cost model leaves out by design: dense attention.

    python benchmarks/replay_attention_term.py --from WORK/validation-gpu [--profile PROFILE]

The real replay's torch model attends with a dense, masked SDPA: every row of a step,
the rows padded up to a CUDA-graph size too, reads the batch's longest context (rounded up
to the graph's key block). A calibration point holds every row at one context, and the
cost model prices paged attention, where each row reads its own. The difference is a term
of the replay's model, not of a serving engine, so the simulator does not charge it; this
script estimates it from what a validation folder holds, to show how much of the replay's
``speed`` (its passes against their calibrated time) it accounts for.

Per decode step of each replay: the running requests are those past their first token and
not finished; a request's context is its prompt plus its output so far, interpolated
linearly between its first token and its finish (the records keep no per-step lengths);
the longest, rounded up as the replay rounds it (:class:`calibrate.graphs.PassGraphs`),
read by the padded rows (:func:`sim.costmodel.model.v0_graph_batch_sizes`). The term is the
profile's passes at (padded rows, every row at the longest context) less its passes at
(rows, mean context) plus the padding it already prices. Prints per case the median
measured / priced ratio of a decode step's passes, the term's median share of the priced
passes, and the ratio once the term is added to the price.

A second term, with ``--probe FILE`` (benchmarks/replay_pass_probe.py's output on the same
GPU): the replay times each pass on the host, a ``perf_counter`` around the graph's launch
and a synchronize, where calibration reads CUDA events; the probe times one pass both ways,
and what its graph path's host time exceeds the events' by, less what its rounded span
costs (the profile), is the host's latency per pass. It is paid once per pass (k draft
passes, the target's, the verification's), and the last column adds it too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def step_contexts(requests: pd.DataFrame, steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per step: the estimated mean and longest context of the requests running in it."""
    first, finish = requests.first_token_s.to_numpy(), requests.finish_s.to_numpy()
    prompt, output = requests.prompt_tokens.to_numpy(float), requests.output_tokens.to_numpy(float)
    t = steps.start_s.to_numpy()[:, None]
    running = (first[None, :] <= t) & (t < finish[None, :])
    done = np.clip((t - first[None, :]) / np.maximum(finish - first, 1e-9)[None, :], 0.0, 1.0)
    context = prompt[None, :] + output[None, :] * done
    count = running.sum(axis=1)
    mean = np.where(count > 0, (context * running).sum(axis=1) / np.maximum(count, 1), np.nan)
    longest = np.where(running, context, 0.0).max(axis=1)
    return mean, longest


def probe_latency(path: Path, model) -> float:
    """Seconds per pass the replay's host timing adds (the module docstring), from a probe's output."""
    import re

    text = path.read_text()
    head = re.search(r"batch (\d+), q (\d+), context (\d+)", text)
    events = re.search(r"calibration: CUDA graph replay, CUDA events\s+median\s+([\d.]+) ms", text)
    host = re.search(r"replay: its graph path \((\d+) rows, span (\d+)\), perf_counter \+ sync median\s+([\d.]+) ms",
                     text)
    if not (head and events and host):
        sys.exit(f"error: --probe: {path} is not benchmarks/replay_pass_probe.py's output with its graph path")
    b, q, context = (int(x) for x in head.groups())
    span = int(host.group(2))
    rounded = float(model.decode_target(batch_size=b, query_tokens=q, context_tokens=span)
                    - model.decode_target(batch_size=b, query_tokens=q, context_tokens=context))
    return (float(host.group(3)) - float(events.group(1))) / 1e3 - rounded


def case_terms(case: Path, model, span_bucket: int, max_batch: int, per_pass: float = 0.0) -> dict:
    """The median ratios of one case folder's decode steps (every replay pooled)."""
    from sim.costmodel.model import padded_tokens, v0_graph_batch_sizes

    costs = pd.read_csv(case / "step_costs.csv")
    sizes = v0_graph_batch_sizes(max_batch)
    rows = []
    for replay, folder in enumerate(sorted(p for p in case.glob("real*") if p.is_dir()), start=1):
        requests = pd.read_csv(folder / "requests.csv")
        steps = pd.read_csv(folder / "steps.csv")
        mean, longest = step_contexts(requests, steps)
        steps = steps.assign(est_mean=mean, longest=longest, step=np.arange(len(steps)))
        mine = costs[(costs.replay == replay) & (costs.group != "prefill")].merge(
            steps[["step", "est_mean", "longest"]], on="step")
        b, k = mine.batch_size.to_numpy(), mine.k.to_numpy()
        padded = np.array([padded_tokens(int(x), sizes) for x in b])
        span = np.ceil(mine.longest.to_numpy() / span_bucket) * span_bucket
        priced = model.decode_pass_times(b, k, mine.context.to_numpy()) + model.padding_times(b, k, padded, True)
        dense = model.decode_pass_times(padded, k, span)
        passes = np.where(k > 0, k + 2, 2)  # k draft passes, the target's, the verification's
        rows.append(pd.DataFrame({"measured": mine.measured_passes_s, "priced": priced, "dense": dense,
                                  "host": passes * per_pass, "mean_error": mine.est_mean / mine.context - 1}))
    frame = pd.concat(rows)
    term = frame.dense - frame.priced
    return {"steps": len(frame), "context_estimate_error": float(frame.mean_error.abs().median()),
            "measured_over_priced": float((frame.measured / frame.priced).median()),
            "term_share": float((term / frame.priced).median()),
            "measured_over_priced_plus_term": float((frame.measured / (frame.priced + term.clip(lower=0))).median()),
            "measured_over_priced_plus_both": float((frame.measured / (frame.priced + term.clip(lower=0)
                                                                        + frame.host)).median())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--from", dest="source", required=True, help="a benchmarks/validation.py --suite gpu output")
    parser.add_argument("--profile", default="h100-graphs-llama-3.1-8b-llama-3.2-1b",
                        help="the profile the replays were priced by (default %(default)s)")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--probe", type=Path, help="benchmarks/replay_pass_probe.py's output on the same GPU: "
                                                   "also add the host's latency per pass")
    args = parser.parse_args(argv)
    from calibrate.graphs import SPAN_BUCKET
    from sim.costmodel.model import CostModel
    from sim.costmodel.profile import load_profile

    profile = load_profile(args.profile)
    model = CostModel(profile)
    source = Path(args.source)
    cases = sorted(p for p in source.iterdir() if (p / "step_costs.csv").is_file())
    if not cases:
        sys.exit(f"error: --from: {source} holds no validation case folder (step_costs.csv)")
    per_pass = probe_latency(args.probe, model) if args.probe else 0.0
    print(f"decode steps' passes: measured / priced, the dense-attention term's share of the price, and "
          f"measured / (priced + term) (medians; {profile.path.name})"
          + (f"; host latency per pass {per_pass * 1e3:.3f} ms ({args.probe})" if args.probe else ""))
    print(f"{'case':28} {'steps':>6} {'meas/priced':>12} {'term':>7} {'meas/(priced+term)':>19} "
          + (f"{'+ host latency':>15} " if args.probe else "") + f"{'context est.':>13}")
    for case in cases:
        r = case_terms(case, model, SPAN_BUCKET, args.max_batch, per_pass)
        print(f"{case.name:28} {r['steps']:>6} {r['measured_over_priced']:>12.3f} {r['term_share']:>+7.1%} "
              f"{r['measured_over_priced_plus_term']:>19.3f} "
              + (f"{r['measured_over_priced_plus_both']:>15.3f} " if args.probe else "")
              + f"{r['context_estimate_error']:>13.1%}")
    print("(context est.: the estimated mean context's median |error| against the recorded one)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
