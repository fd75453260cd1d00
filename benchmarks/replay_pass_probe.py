"""Why a real replay's passes can run slower than calibration timed them: one pass, timed seven ways.

    python benchmarks/replay_pass_probe.py [--target llama-3.1-8b] [--batch 16] [--query 4] [--context 330]

Times the same target forward pass (random weights, bf16 on CUDA, float32 on CPU) as
calibration does (CUDA events, eager and from a CUDA graph), as the replay does
(``perf_counter`` around the pass plus a synchronize), the host's launch time alone (no
synchronize), the pass on a replay-shaped cache (a view of a larger, per-slot cache), and
the replay's way again with a large Python heap and the garbage collector on, and the replay's
CUDA-graph path (calibrate.graphs: static inputs, rows padded to vLLM V0's batch sizes, the
span rounded up; eager on a CPU). Prints the median and the worst of each, in ms. Written
for issue 16's GPU validation, extended for issue 33's.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from calibrate.configs import get_config
from calibrate.graphs import PassGraphs
from calibrate.model import Transformer
from calibrate.timing import _capture, _event_time
from sim.costmodel.model import v0_graph_batch_sizes


def timed(name: str, fn, n: int) -> None:
    values = [fn() for _ in range(n)]
    print(f"{name:58} median {statistics.median(values) * 1e3:8.2f} ms   max {max(values) * 1e3:8.2f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--target", default="llama-3.1-8b")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--query", type=int, default=4)
    parser.add_argument("--context", type=int, default=330)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    model = Transformer(get_config(args.target), device=device, dtype=dtype)
    b, q, ctx, n = args.batch, args.query, args.context, args.repeats
    tokens = torch.randint(0, model.cfg.vocab_size, (b, q), device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def on(cache):
        def run():
            out = model(tokens, cache)
            cache.rollback(q)
            return out
        return run

    exact = model.new_cache(b, ctx + q)
    exact.fill(ctx)
    run_exact = on(exact)
    for _ in range(3):
        run_exact()
    sync()
    print(f"{args.target} on {device} ({torch.cuda.get_device_name(0) if cuda else 'CPU'}), batch {b}, "
          f"q {q}, context {ctx}, {n} repeats")

    def wall(fn):
        def once():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            return time.perf_counter() - start
        return once

    def launch(fn):
        def once():
            sync()
            start = time.perf_counter()
            fn()
            spent = time.perf_counter() - start
            sync()
            return spent
        return once

    if cuda:
        timed("calibration: CUDA events, eager", lambda: _event_time(run_exact), n)
    timed("replay: perf_counter + synchronize, eager", wall(run_exact), n)
    timed("host launch time alone (no synchronize)", launch(run_exact), n)
    slots = model.new_cache(max(b, 16), ctx + q + 300)
    slots.fill(ctx)
    view = slots.rows(0, b, ctx)
    timed("replay-shaped cache (rows of a larger cache), eager", wall(on(view)), n)
    heap = [(i, str(i)) for i in range(3_000_000)]  # a replay's records and the loop's objects, roughly
    gc.enable()
    timed("perf_counter, eager, 3M-object heap, gc on", wall(run_exact), n)
    gc.disable()
    timed("perf_counter, eager, 3M-object heap, gc off", wall(run_exact), n)
    gc.enable()
    del heap
    if cuda:
        replay = _capture(run_exact, 2)
        timed("calibration: CUDA graph replay, CUDA events", lambda: _event_time(replay), n)
    graphs = PassGraphs(torch.device(device), v0_graph_batch_sizes(b))
    rows = graphs.rows(b)
    padded = model.new_cache(rows, ctx + q + 300)
    padded.fill(ctx)
    span = graphs.span(ctx, q, padded.max_len)

    def build():
        static = torch.zeros(rows, q, dtype=torch.long, device=device)
        return {"tokens": static}, lambda: model(static, padded.rows(0, rows, span))
    graph = graphs.get(("target", rows, q, span), build, [padded.lengths])

    def replay_step():
        graph.inputs["tokens"][:b].copy_(tokens)
        padded.lengths[b:rows].zero_()
        graph.replay()
        padded.lengths[:b].sub_(q)
    timed(f"replay: its graph path ({rows} rows, span {span}), perf_counter + sync", wall(replay_step), n)
    print(f"graph capture: {graphs.capture_s * 1e3:.0f} ms" + (f"; fell back: {graphs.fallbacks}" if graphs.fallbacks
                                                              else ""))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")


if __name__ == "__main__":
    main()
