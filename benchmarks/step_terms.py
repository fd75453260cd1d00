"""What a composed decode step costs, term by term, before and after the running-model terms (issue 40).

    python benchmarks/step_terms.py [--target llama-3.1-8b] [--gpu h100_sxm] [--batch 32] [--context 1024]
                                    [--tp 1 2] [--sampling top-p]

One target decode step at batch b (one query token per sequence, context c) on one GPU and
on a tensor-parallel group, priced by the composition the shipped profiles come from
(sim.compose.price.PassPricer, its collectives and its sampler), with each term apart, in
three columns per group: before issue 40, after it at temperature 0 (greedy: what
``specbatch compose`` prices by default, ``vllm bench serve``'s requests), and after it with
the sampling ``--sampling`` names (default top-p: nucleus sampling, what vLLM did for the
requests of runs whose client sends no sampling parameters to a Llama 2 or 3, whose
generation_config.json sets temperature 0.6 and top_p 0.9; sim/compose/sampler.py):

* the GEMMs, attention, small ops and LM head of the pass (unchanged);
* the all-reduces: before, the framework's table alone (replayed back to back on GPUs that
  reach each barrier together); after, each at least a synchronising NCCL all-reduce of its
  message (nccl-tests), as in a running model where each follows GPU-local work;
* the sampler: before, one fp32 read of the logits; after, vLLM V1's sampler: the bf16 logits
  cast to fp32 (read 2 bytes, write 4) and a greedy argmax (read 4), two kernels' latency, or
  at temperature > 0 the temperature, softmax and exponential race, and for top-p the sort of
  every sequence's logits over the vocabulary (measured on an H100, vLLM PRs #42191 / #33538);
* the engine's own work per step (1.21 ms, hidden under asynchronous scheduling where the
  passes are longer) and the exposed time per step (0: leaving one model out, it did not help).

Needs the kernel data (the gpu-data extra). Nothing is fitted here; the numbers are the
composition's own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pricer(target: str, gpu: str, tp: int, sampling: str = "greedy"):
    """The target's pass pricer as ``specbatch compose`` builds it for this GPU, group size and sampling."""
    from specbatch.commands.compose import add_arguments, build_request
    from sim.compose.build import load_tables, make_pricers

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    request = build_request(parser.parse_args(["--gpu", gpu, "--target", target, "--tp", str(tp), "--out", "-",
                                               "--sampling", sampling]))
    tables, root, _ = load_tables(request)
    return make_pricers(request, tables, root)["target"], request


def terms(target: str, gpu: str, tp: int, batch: int, context: int, sampling: str) -> dict[str, tuple[float, ...]]:
    """Each term of the step in seconds: (before issue 40, after it greedy, after it with ``sampling``)."""
    import numpy as np

    from sim.compose.build import ENGINE_OVERHEAD_S
    from sim.compose.sampler import PROB_BYTES

    p, _ = pricer(target, gpu, tp)
    sampled, _ = pricer(target, gpu, tp, sampling)
    parts = {k: float(v) for k, v in p.decode_parts(batch, 1, context).items()}
    out = {name: (parts[name],) * 3 for name in ("gemm", "attention", "small_ops", "lm_head")}
    if p.collectives is not None:
        layers, hidden = p.model.num_layers, p.model.hidden_size
        kernel = float(p.collectives.kernel_all_reduce(batch, hidden)) * (2 * layers + 1)
        out["all_reduces"] = (kernel, parts["communication"], parts["communication"])
    spec = p.tables.spec
    before_sampler = spec.mem_latency_s + batch * p.model.vocab_size * PROB_BYTES / p.bw
    out["sampler"] = (before_sampler, float(np.asarray(p.verify(batch, 0))), float(np.asarray(sampled.verify(batch, 0))))
    hidden_overhead = []
    for side in (0, 1, 2):
        passes = sum(v[side] for v in out.values())
        hidden_overhead.append(max(ENGINE_OVERHEAD_S - passes, 0.0))
    out["engine_hidden"] = tuple(hidden_overhead)
    return out


LABELS = {"gemm": "GEMMs (all layers)", "attention": "attention (decode, KV read)",
          "small_ops": "small ops (norms, rotary, KV write)", "lm_head": "LM head (+ logits all-gather)",
          "all_reduces": "all-reduces (2 a layer + 1)", "sampler": "sampler over the vocabulary",
          "engine_hidden": "engine's 1.21 ms beyond the passes"}


def table(target: str, gpu: str, tps: list[int], batch: int, context: int, sampling: str) -> str:
    rows = {tp: terms(target, gpu, tp, batch, context, sampling) for tp in tps}
    columns = ("before", "greedy", sampling)
    head = f"{'term (ms)':<38}" + "".join(f"{f'TP {tp} ' + columns[0]:>14}{columns[1]:>8}{columns[2]:>8}" for tp in tps)
    lines = [f"{target} decode step on {gpu}, batch {batch}, context {context} tokens, one token per sequence",
             head]
    for name, label in LABELS.items():
        if not any(name in r for r in rows.values()):
            continue
        cells = "".join(f"{1e3 * rows[tp][name][0]:>14.3f}{1e3 * rows[tp][name][1]:>8.3f}{1e3 * rows[tp][name][2]:>8.3f}"
                        if name in rows[tp] else f"{'-':>14}{'-':>8}{'-':>8}" for tp in tps)
        lines.append(f"{label:<38}{cells}")
    steps = {tp: [sum(v[side] for v in rows[tp].values()) for side in (0, 1, 2)] for tp in tps}
    lines.append(f"{'step':<38}" + "".join(f"{1e3 * steps[tp][0]:>14.3f}{1e3 * steps[tp][1]:>8.3f}"
                                          f"{1e3 * steps[tp][2]:>8.3f}" for tp in tps))
    lines.append(f"{'change from before':<38}" + "".join(
        f"{'':>14}{100 * (steps[tp][1] / steps[tp][0] - 1):>+7.1f}%{100 * (steps[tp][2] / steps[tp][0] - 1):>+7.1f}%"
        for tp in tps))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h100_sxm")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sampling", default="top-p", choices=("greedy", "random", "top-p"),
                        help="the last column's sampling (default: %(default)s)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    print(table(args.target, args.gpu, args.tp, args.batch, args.context, args.sampling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
