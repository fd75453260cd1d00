"""CUDA graphs for the real replay's decode passes, as a serving engine captures them.

vLLM runs every decode-sized pass from a CUDA graph captured at a padded batch size: the
host launches one graph instead of a thousand kernels, which is what makes a decode step
cost what its kernels cost. The replay does the same (issue 33): each decode, draft and
verification pass of a step with ``b`` running rows runs the graph captured for

* ``B`` rows: the next of vLLM V0's capture sizes up from ``b``
  (:func:`sim.costmodel.model.v0_graph_batch_sizes`; the padded rows are free cache rows whose
  lengths are reset to 0, so they add linear-layer work and almost no attention, which is
  what the cost model charges for them: :meth:`sim.costmodel.model.CostModel.padding_times`);
* ``q`` query tokens per row (k + 1 for the target, 1 or the catch-up for the draft);
* for a prefill, ``n`` prompts (not padded: a padded prompt costs a whole prompt) right-padded
  to the longest rounded up to ``prompt_bucket`` tokens, run into a scratch cache and copied
  to the sequences' rows (a graph fixes its buffers; the rows a prefill lands in vary);
* ``S`` cached tokens read by attention: the batch's longest row rounded up to
  ``span_bucket`` tokens (the attention here reads a dense ``[rows, S]`` block under a
  mask, so a graph fixes S; the rounding costs at most ``span_bucket`` keys per row, a
  term the cost model leaves out: see docs/validation.md).

A graph is captured the first time its key is met, over static input buffers and the
replay's own KV-cache tensors, and replayed from then on. Capturing takes time a real
engine spends at start-up, so :attr:`PassGraphs.capture_s` counts it and the replay's
clock leaves it out. A capture that fails is reported once in :attr:`PassGraphs.fallbacks`
and that pass runs eagerly. On a CPU nothing is captured: the same static buffers, padded
rows and bookkeeping run eagerly, so the tests exercise the graph path's logic
(tests/test_replay.py) and a CUDA machine only adds the capture itself.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

SPAN_BUCKET = 64  # tokens: attention's key block is rounded up to a multiple of this
PROMPT_BUCKET = 32  # tokens: a prefill batch's padded length is rounded up to a multiple of this


@dataclass
class Graph:
    """One pass on static buffers: write its inputs into ``inputs``, call :meth:`replay`, read ``output``.
    ``captured`` None: the pass is called instead of replayed (a CPU). ``timings``: where a captured
    replay's CUDA events go, as (``kind``, begin, end), when the owner wants the graph's own time apart
    from the staging of its inputs around it."""

    inputs: dict[str, torch.Tensor]
    fn: Callable[[], object]
    captured: object = None
    output: object = None
    kind: str = ""
    timings: list | None = None

    def replay(self) -> None:
        if self.captured is None:
            self.output = self.fn()
        elif self.timings is None:
            self.captured.replay()
        else:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            self.captured.replay()
            end.record()
            self.timings.append((self.kind, begin, end))


@dataclass
class PassGraphs:
    """Captured passes by key, and what capturing them cost."""

    device: torch.device
    batch_sizes: tuple[int, ...]  # the capture sizes (rows), ascending
    enabled: bool = True
    span_bucket: int = SPAN_BUCKET
    prompt_bucket: int = PROMPT_BUCKET
    graphs: dict[tuple, Graph] = field(default_factory=dict)
    capture_s: float = 0.0  # wall time spent capturing (and warming up for it)
    fallbacks: dict[tuple, str] = field(default_factory=dict)  # key -> why it runs eagerly
    pool: object = None
    timings: list | None = None  # a list: every captured replay's CUDA events, by its key's first item

    def __post_init__(self) -> None:
        self.enabled = bool(self.enabled) and bool(self.batch_sizes)
        self.capture = self.device.type == "cuda"  # elsewhere the static-buffer path runs its passes eagerly

    def rows(self, b: int) -> int:
        """The rows a pass over ``b`` sequences runs on: the next capture size up (itself past the largest)."""
        if not self.batch_sizes or b > self.batch_sizes[-1]:
            return b
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, b)]

    def span(self, span: int, q: int, max_len: int) -> int:
        """Cached tokens attention reads: ``span`` rounded up to the bucket, within the cache's room."""
        rounded = -(-max(span, 0) // self.span_bucket) * self.span_bucket
        return max(span, min(rounded, max_len - q))

    def prompt(self, longest: int, max_len: int) -> int:
        """A prefill's padded length: ``longest`` rounded up to the bucket, within the scratch cache's room."""
        return max(longest, min(-(-longest // self.prompt_bucket) * self.prompt_bucket, max_len))

    def get(self, key: tuple, build: Callable[[], tuple[dict[str, torch.Tensor], Callable[[], object]]],
            state: list[torch.Tensor]) -> Graph | None:
        """The graph for ``key``, captured now if new (None: run eagerly).

        ``build()`` allocates the static inputs and returns them with the pass reading them;
        ``state``: tensors the pass changes as a side effect (KV-cache lengths), put back
        after the warm-up run that capturing needs, so capturing changes nothing.
        """
        if not self.enabled or key in self.fallbacks:
            return None
        graph = self.graphs.get(key)
        if graph is not None:
            return graph
        if not self.capture:
            graph = self.graphs[key] = Graph(*build())
            return graph
        started = time.perf_counter()
        saved = [t.clone() for t in state]
        try:
            inputs, fn = build()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up off the capture stream, as torch requires
                fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
            for t, s in zip(state, saved):
                t.copy_(s)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured, pool=self.pool):
                output = fn()
            torch.cuda.synchronize(self.device)
            graph = self.graphs[key] = Graph(inputs, fn, captured, output, str(key[0]), self.timings)
        except Exception as exc:  # noqa: BLE001 - any capture problem means "run this pass eagerly"
            torch.cuda.synchronize(self.device)
            self.fallbacks[key] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            graph = None
        finally:
            for t, s in zip(state, saved):
                t.copy_(s)
            self.capture_s += time.perf_counter() - started
        return graph

    def summary(self) -> dict:
        """What the replay's record says about its graphs."""
        return {"enabled": self.enabled, "captured": len(self.graphs) if self.capture else 0, "capture_s": round(self.capture_s, 3),
                "span_bucket": self.span_bucket, "prompt_bucket": self.prompt_bucket,
                "batch_sizes": list(self.batch_sizes),
                "fallbacks": len(self.fallbacks),
                **({"first_fallback": next(iter(self.fallbacks.values()))} if self.fallbacks else {})}
