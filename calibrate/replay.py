"""Real replay: serve a workload with real batched speculative decoding, in wall-clock time.

The replay is the simulator's ground truth. It takes the *same* prepared run as
``sim.simulate`` (requests, per-request alpha, the bound policy, the KV budget) and
drives the *same* scheduler and policy objects, but every step runs real torch passes
and takes the time it takes:

* requests arrive on a real clock (the replay sleeps until the next arrival when idle)
  and are admitted by the shared scheduler before each step;
* prefill: the admitted prompts run as one batch right-padded to the longest (as
  ``generate`` on a padded batch does), through the target and, if the run
  speculates, the draft; the first token is sampled from the target;
* decode: the draft runs k passes (sampling a token each), the target one pass over
  k + 1 tokens, then the verification kernel on the real logits; both KV caches are
  rolled back by the rejected tokens. The draft's first pass also feeds the tokens it
  has not seen yet (its *catch-up*: the last draft token after a fully accepted step,
  and every token emitted by k = 0 steps), as a pass over that many tokens;
* acceptance: ``synthetic`` (default) draws the accepted counts from the simulator's
  acceptance model — random-weight models rarely agree, so real rejection sampling
  would accept almost nothing — while the verification kernel still runs on the real
  logits for its cost (vLLM's synthetic rejection sampler does the same); ``real``
  keeps what rejection sampling decides.

The loop is the simulator's own (:class:`sim.serving.loop.ServingLoop`: the same
scheduling, policy calls, acceptance bookkeeping and records), driven by the wall
clock (:func:`sim.serving.clock.serve_wall_clock`); this module supplies only its step
backend, :class:`TorchBackend`. The loop's running rows are the backend's live cache
rows, each on a physical cache row of its own: a finished row leaves a hole that the last
row fills, as vLLM's persistent batch condenses, so a step's rows stay ``0..b-1`` and one
sequence's entries move per retirement (where shifting every later row up, in order, cost
a copy and a few kernels per row: up to a millisecond a step with 16 rows, which no paged
engine pays). ``order`` keeps the loop's order over the physical rows. Static batching
keeps finished rows in the batch as padding, as the simulator charges it; those rows are
not the loop's any more.

On CUDA, with a profile calibrated from CUDA graphs, every pass (prefill, draft, target,
verification) runs from a graph padded as vLLM V0 pads a batch (:mod:`calibrate.graphs`),
and the run is priced with that padding (:func:`sim.simulate.graph_padding`). As in an engine,
a step queues its passes back to back and waits for the device once, at its end: inputs go
up through pinned memory without waiting, passes are timed between CUDA events read after
that one synchronisation, and attention reads each row's own context (calibrate.attention).

Records are the simulator's (:mod:`sim.serving.records`, the request table of
``sim.simulate``), so ``sim.metrics`` summarises both alike. Ctrl-C stops the replay
between steps and what it measured so far is returned, marked partial.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch

from calibrate.attention import split_attention_notes
from calibrate.configs import check_buildable, recorded_config
from calibrate.model import TORCH_DTYPES, Transformer
from calibrate.graphs import PassGraphs
from calibrate.verify import VerifyResult, sample, verify_logits
from sim.config import RunConfig
from sim.costmodel.model import v0_graph_batch_sizes
from sim.errors import InputError
from sim.metrics import by_label, summarize
from sim.serving.clock import serve_wall_clock
from sim.serving.queues import arrival_queue
from sim.serving.recorded import RecordedSteps
from sim.serving.records import DECODE, PREFILL
from sim.simulate import (PreparedRun, RunResult, acceptance_values, graph_padding, make_sampler, prepare,
                          request_table)

ACCEPTANCE_MODES = ("synthetic", "real")


@dataclass
class ReplayResult:
    """What :func:`replay` measured, shaped like :class:`sim.simulate.RunResult`."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict
    acceptance: str
    partial: bool
    wall_s: float
    step_passes_s: np.ndarray = field(repr=False)  # per step: time inside the calibrated passes
    step_predicted_s: np.ndarray = field(repr=False)  # per step: the profile's time for those passes
    by_label: dict | None = None
    # What the logic check plays back (sim.serving.recorded): every clock reading of the loop,
    # and per step the accepted draft tokens per running row (None: prefill or k = 0).
    clock_readings: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    step_accepted: tuple = field(default=(), repr=False)
    graphs: dict = field(default_factory=dict)  # calibrate.graphs.PassGraphs.summary(): captured, capture time

    def recorded_steps(self) -> RecordedSteps:
        """The steps as :class:`sim.serving.recorded.RecordedBackend` plays them back."""
        return RecordedSteps.from_replay(self.steps, self.clock_readings, self.step_accepted)


class TorchBackend:
    """Runs each step of ``run``'s serving loop with ``target`` (and ``draft``) on their device.

    Follows the loop's rows (:class:`sim.serving.loop.StepBackend` with ``follows_rows``):
    physical rows ``0..used-1`` of the caches are in the batch; ``live`` marks the loop's
    running rows among them and ``order`` gives each of the loop's rows, in its order, its
    physical row.
    """

    follows_rows = True
    steps_compiled = False  # every step runs on the device

    def __init__(self, run: PreparedRun, target: Transformer, draft: Transformer | None, *,
                 acceptance: str = "synthetic", seed: int = 0, static: bool = False,
                 cuda_graphs: bool = False) -> None:
        if acceptance not in ACCEPTANCE_MODES:
            raise ValueError(f"acceptance must be one of {', '.join(ACCEPTANCE_MODES)}")
        config, requests = run.config, run.requests
        self.prepared, self.acceptance, self.static = run, acceptance, static
        self.speculates = run.policy.max_k > 0
        if self.speculates and draft is None:
            raise ValueError("the policy speculates (max_k > 0) but no draft model was given")
        if self.speculates and draft.cfg.vocab_size != target.cfg.vocab_size:
            raise config.error("profile", f"its draft {draft.cfg.name} and target {target.cfg.name} have different "
                                          "vocabularies, so the target cannot verify the draft's tokens")
        self.target, self.draft = target, draft if self.speculates else None
        self.device = target.device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        # synthetic acceptance: the simulator's draws
        self.sampler = make_sampler(config, run.alphas, k_max=run.table.k_max)
        self.table = run.table
        self.k_max = run.table.k_max
        slots = config.engine.max_batch_size
        prompt, output = requests.prompt_tokens.astype(np.int64), requests.output_tokens.astype(np.int64)
        # A padding row of a static batch keeps its length; a live one grows to prompt + output,
        # plus one step's k + 1 appended before the rollback and the draft's catch-up.
        self.max_len = int((prompt + output).max()) + 2 * (self.k_max + 2)
        for model in (target, self.draft):
            limit = model.cfg.max_position_embeddings if model is not None else None
            if limit is not None and self.max_len > limit:
                raise config.error("workload.output_tokens", f"{model.cfg.name} accepts {limit} positions; prompt "
                                   f"+ output + speculation slots of this workload reach {self.max_len}: give "
                                   f"shorter lengths (--prompt-tokens, --output-tokens: prompt + output up to "
                                   f"{limit - 2 * (self.k_max + 2)} tokens), e.g. --config "
                                   f"tests/baselines/scenarios/cpu.toml")
        # Decode passes run from CUDA graphs padded to vLLM V0's batch sizes (calibrate.graphs), as the
        # run is priced (sim.simulate.graph_padding): the caches hold the padded rows too.
        self.graphs = PassGraphs(self.device, v0_graph_batch_sizes(slots), enabled=cuda_graphs)
        rows = self.graphs.rows(slots) if self.graphs.enabled else slots
        self.t_cache = target.new_cache(rows, self.max_len)
        self.d_cache = self.draft.new_cache(rows, self.max_len) if self.draft is not None else None
        # A graphed prefill runs into a scratch cache of fixed rows, then its entries move to the rows it serves.
        prompt_room = self.graphs.prompt(int(prompt.max()), self.max_len)
        self.scratch = {id(m): m.new_cache(slots, prompt_room) for m in (target, self.draft)
                        if m is not None and self.graphs.enabled}
        self.history = torch.zeros(slots, self.max_len, dtype=torch.long, device=self.device)
        self.t_frozen = torch.zeros(slots, dtype=torch.long, device=self.device)  # padding rows' cache lengths
        self.d_frozen = torch.zeros(slots, dtype=torch.long, device=self.device)
        vocab = target.cfg.vocab_size
        self.prompt_tokens = np.random.default_rng(seed).integers(0, vocab, size=int(prompt.max()))
        self.row_len = np.zeros(slots, np.int64)  # prompt + emitted tokens
        self.row_live = np.zeros(slots, bool)
        self.order = np.zeros(0, np.int64)  # the loop's running rows, in its order: their physical rows
        self.used = 0
        self.passes_s: list[float] = []  # per step: time inside the passes calibration times
        self.predicted_s: list[float] = []  # ... and what the profile says they take
        self.accepted_rows: list[np.ndarray | None] = []  # per step: accepted per running row
        self._events: list = []  # this step's (kind, begin, end) CUDA events around each pass
        if self.device.type == "cuda":  # and around each graph's replay alone, inside those spans
            self.graphs.timings = []
        self.by_kind: dict[str, dict[str, float]] = {}  # per kind of pass: passes, span_s, graph_s
        self.prefill_overhead = run.profile.engine_overhead_s("prefill")
        self.decode_overhead_at = run.profile.decode_overhead_at

    def _sync(self) -> None:
        if self.device.type == "cuda":  # a step ends when its kernels have, not when they are queued
            torch.cuda.synchronize(self.device)

    def warm_up(self) -> None:
        """A few untimed passes first, as calibration warms up: the first ones pay one-off costs."""
        tokens = torch.zeros(1, 16, dtype=torch.long, device=self.device)
        for model, cache in ((self.target, self.t_cache), (self.draft, self.d_cache)):
            if model is None:
                continue
            for q in (16, 1, 2, self.k_max + 1):
                cache.lengths[:1] = 0
                model(tokens[:, :q], cache.rows(0, 1, 0))
            cache.lengths.zero_()
        self._sync()

    def run(self, plan) -> tuple[None, np.ndarray | None]:
        """Run the plan's step on the device (the clock measures it): the accepted drafts per row."""
        if plan.chunks:
            raise RuntimeError("the real replay runs the v0 scheduler only (checked before the run)")
        if plan.prefill:
            return self.prefill(plan.queue, plan.prefill_head, plan.prefill_count), None
        return self.decode(plan, plan.k, plan.ragged_ks, plan.scale)

    # ---------------------------------------------------------------- prefill
    def prefill(self, queue, head: int, n: int) -> None:
        if self.static:  # a new static batch: the previous one has ended
            self.used, self.order = 0, self.order[:0]
        lo, hi = self.used, self.used + n
        lengths = queue.prompt_tokens[head:head + n].astype(np.int64)
        longest = int(lengths.max())
        tokens = np.zeros((n, longest), np.int64)
        for i, p in enumerate(lengths.tolist()):
            tokens[i, :p] = self.prompt_tokens[:p]
        tokens_t = self._upload(tokens)
        last = self._upload(lengths - 1)
        self._passes = 0.0
        self.predicted_s.append(self.table.prefill_time(n, float(longest)) - self.prefill_overhead)
        self.accepted_rows.append(None)
        logits = self._timed(self._prefill, self.target, self.t_cache, tokens_t, last, lo, hi, lengths)
        if self.draft is not None:
            self._timed(self._prefill, self.draft, self.d_cache, tokens_t, last, lo, hi, lengths)
        first = sample(torch.softmax(logits[:, -1].float(), dim=-1), self.generator)
        self.history[lo:hi, :longest] = tokens_t
        self.history[torch.arange(lo, hi, device=self.device), self._upload(lengths)] = first
        self._sync()
        self._passes_done()
        self.row_len[lo:hi], self.row_live[lo:hi] = lengths + 1, True
        self.order = np.concatenate((self.order, np.arange(lo, hi)))
        self.used = hi
        self.passes_s.append(self._passes)
        return None

    def _prefill(self, model: Transformer, cache, tokens: torch.Tensor, last: torch.Tensor, lo: int, hi: int,
                 lengths: np.ndarray) -> torch.Tensor:
        graph = None
        if self.graphs.enabled:
            n, longest = tokens.shape
            scratch = self.scratch[id(model)]
            padded = self.graphs.prompt(longest, scratch.max_len)
            name = "prefill-target" if model is self.target else "prefill-draft"
            graph = self.graphs.get((name, n, padded), lambda: self._build_prefill(model, scratch, n, padded),
                                    [scratch.lengths])
        if graph is not None:
            graph.inputs["tokens"].zero_()
            graph.inputs["tokens"][:, :longest].copy_(tokens)
            graph.inputs["last"].copy_(last)
            graph.replay()
            cache.k[:, lo:hi, :longest].copy_(scratch.k[:, :n, :longest])
            cache.v[:, lo:hi, :longest].copy_(scratch.v[:, :n, :longest])
            cache.lengths[lo:hi] = self._upload(lengths)
            return graph.output.clone()  # a later replay may reuse the graph's memory
        cache.lengths[lo:hi] = 0
        view = cache.rows(lo, hi, 0)
        logits = model(tokens, view, last_positions=last)
        cache.lengths[lo:hi] = self._upload(lengths)  # padding is stale, masked
        return logits

    def _build_prefill(self, model: Transformer, scratch, n: int, padded: int):
        tokens = torch.zeros(n, padded, dtype=torch.long, device=self.device)
        last = torch.zeros(n, dtype=torch.long, device=self.device)

        def prefill():
            scratch.lengths[:n].zero_()
            return model(tokens, scratch.rows(0, n, 0), last_positions=last)
        return {"tokens": tokens, "last": last}, prefill

    # ----------------------------------------------------------------- decode
    def decode(self, view, k: int, ragged: np.ndarray | None, scale: np.ndarray) -> tuple[None, np.ndarray | None]:
        """``view``: the step's plan (sim.serving.plan.Plan: its rows' lags, remaining tokens, charged
        batch size and mean context)."""
        b = self.used  # rows in the batch: live ones, plus a static batch's finished padding
        lag = view.lag_tokens if self.speculates else None
        live, order = self.row_live[:b].copy(), self.order
        # The loop's per-row values, onto the batch's rows (padding rows: k 0, lag 1, nothing left).
        ragged_rows = None
        if ragged is not None:
            ragged_rows = np.zeros(b, np.int64)
            ragged_rows[order] = ragged
        lag_rows = np.ones(b, np.int64)
        if lag is not None:
            lag_rows[order] = lag
        remaining = np.zeros(b, np.int64)
        remaining[order] = view.remaining_tokens
        self._passes = 0.0
        worst = int(np.maximum.reduce(lag)) if k and lag is not None else 1
        self.predicted_s.append(self.table.decode_time_at_lag(view.batch_size, k, view.mean_context_tokens, worst)
                                - float(self.decode_overhead_at(view.batch_size)))
        if k:
            accepted, final = self._speculate(b, k, ragged_rows, lag_rows, scale, ragged)
        else:
            accepted, final = None, self._plain(b)
        self._sync()  # the step's one synchronisation: its passes are done
        self._passes_done()
        self._step = (b, k, live, accepted, final, remaining)
        self.accepted_rows.append(accepted[order] if k else None)  # in the loop's order
        return None, (accepted[order] if k else None)

    def _plain(self, b: int) -> torch.Tensor:
        """k = 0: one target pass over each sequence's newest token, then sampling (verify at k = 0)."""
        rows = torch.arange(b, device=self.device)
        last = self.history[rows, self._upload(self.row_len[:b] - 1)][:, None]
        logits = self._timed(self._target_pass, last, int(self.row_len[:b].max()) - 1)
        empty = torch.empty(b, 0, dtype=torch.long, device=self.device)
        result = self._timed(self._verify, logits, torch.empty(b, 0, logits.shape[-1], device=self.device), empty)
        return result.tokens[:, 0]

    def _speculate(self, b: int, k: int, ragged: np.ndarray | None, lag: np.ndarray,
                   scale: np.ndarray, loop_ragged: np.ndarray | None):
        dev = self.device
        row_len = self.row_len[:b]
        # Draft: its first pass feeds each row the `lag` tokens it has not seen, right-padded to
        # the batch's largest lag (`catch_up`); the padding is rolled back and each row's next
        # token is read at its own last real position, so every row ends the pass at row_len.
        catch_up = int(lag.max())
        d_len = row_len - lag
        positions = np.minimum(d_len[:, None] + np.arange(catch_up), row_len[:, None] - 1)
        feed = self.history[:b].gather(1, self._upload(positions))
        last = self._upload(lag - 1)
        junk = np.zeros(self.d_cache.batch, np.int64)
        junk[:b] = catch_up - lag
        junk = self._upload(junk)
        draft_tokens, draft_probs = [], []
        span = int(d_len.max())
        for j in range(k):
            probs, token = self._timed(self._draft_step, feed, span, last if j == 0 else None,
                                       junk if j == 0 and catch_up > 1 else None)
            span = int(row_len.max()) + j
            feed = token[:, None]
            draft_tokens.append(feed)
            draft_probs.append(probs)
        drafts = torch.cat(draft_tokens, 1)
        # Target: one pass over the newest emitted token (not yet in its cache) and the k drafts.
        t_len = row_len - 1
        rows = torch.arange(b, device=dev)
        newest = self.history[rows, self._upload(t_len)]
        logits = self._timed(self._target_pass, torch.cat((newest[:, None], drafts), 1), int(t_len.max()))
        result = self._timed(self._verify, logits, torch.stack(draft_probs, 1), drafts)
        if self.acceptance == "synthetic":  # drawn for the live rows, as the simulator draws
            accepted = np.zeros(b, np.int64)
            accepted[self.order] = self.sampler.accepted(scale, k if loop_ragged is None else loop_ragged)
        else:
            accepted = result.accepted.cpu().numpy()
            if ragged is not None:
                accepted = np.minimum(accepted, ragged)
        # The token after the kept drafts: the kernel's where it stopped there; otherwise (a
        # synthetic or truncated count) any valid token will do, as values do not change timing.
        stop = self._upload(accepted)
        kernel = result.tokens[rows, stop]
        final = torch.where(kernel >= 0, kernel, drafts[rows, stop.clamp(max=k - 1)])
        tokens = torch.cat((drafts, final[:, None]), 1)
        tokens[rows, stop] = final
        self._drafts = tokens
        return accepted, final

    def _target_pass(self, tokens: torch.Tensor, span: int) -> torch.Tensor:
        """The target's pass over ``tokens [b, q]`` on rows ``0..b-1``, which hold ``span`` tokens at most:
        from its CUDA graph when there is one (calibrate.graphs), else eagerly."""
        b, q = tokens.shape
        rows, graph = self._graph("target", b, q, span, self.t_cache)
        if graph is None:
            return self.target(tokens, self.t_cache.rows(0, b, span))
        graph.inputs["tokens"][:b].copy_(tokens)
        self.t_cache.lengths[b:rows].zero_()  # padded rows: free, empty
        graph.replay()
        return graph.output[:b]

    def _graph(self, model: str, b: int, q: int, span: int, cache):
        """(padded rows, the graph of this pass) or (b, None) when it runs eagerly."""
        if not self.graphs.enabled:
            return b, None
        rows, cached = self.graphs.rows(b), self.graphs.span(span, q, self.max_len)
        build = self._build_target if model == "target" else self._build_draft
        return rows, self.graphs.get((model, rows, q, cached), lambda: build(rows, q, cached), [cache.lengths])

    def _build_target(self, rows: int, q: int, span: int):
        tokens = torch.zeros(rows, q, dtype=torch.long, device=self.device)
        return {"tokens": tokens}, lambda: self.target(tokens, self.t_cache.rows(0, rows, span))

    def _build_draft(self, rows: int, q: int, span: int):
        feed = torch.zeros(rows, q, dtype=torch.long, device=self.device)
        last = torch.full((rows,), q - 1, dtype=torch.long, device=self.device)
        junk = torch.zeros(rows, dtype=torch.long, device=self.device)
        index = torch.arange(rows, device=self.device)

        def step():  # as the eager step below; the default generator is the one a graph can replay
            logits = self.draft(feed, self.d_cache.rows(0, rows, span))[index, last]
            self.d_cache.lengths[:rows].sub_(junk)
            probs = torch.softmax(logits.float(), dim=-1)
            return probs, sample(probs)
        return {"feed": feed, "last": last, "junk": junk}, step

    def _verify(self, logits: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor):
        """The verification kernel on ``b`` rows: from its graph (padded rows of zeros) when there is one."""
        b, k = drafts.shape
        if not self.graphs.enabled:
            return verify_logits(logits, draft_probs, drafts, self.generator)
        rows = self.graphs.rows(b)

        def build():
            inputs = {"logits": torch.zeros((rows,) + tuple(logits.shape[1:]), dtype=logits.dtype, device=self.device),
                      "probs": torch.zeros((rows,) + tuple(draft_probs.shape[1:]), dtype=draft_probs.dtype,
                                           device=self.device),
                      "drafts": torch.zeros(rows, k, dtype=torch.long, device=self.device)}
            return inputs, lambda: verify_logits(inputs["logits"], inputs["probs"], inputs["drafts"])
        graph = self.graphs.get(("verify", rows, k), build, [])
        if graph is None:
            return verify_logits(logits, draft_probs, drafts, self.generator)
        for name, value in (("logits", logits), ("probs", draft_probs), ("drafts", drafts)):
            graph.inputs[name][:b].copy_(value)
            graph.inputs[name][b:].zero_()
        graph.replay()
        return VerifyResult(graph.output.accepted[:b].clone(), graph.output.tokens[:b].clone())

    def _draft_step(self, feed: torch.Tensor, span: int, last: torch.Tensor | None = None,
                    junk: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft pass and the sampling of its token: what calibration times as a draft step.

        A catch-up pass reads each row's logits at its own ``last`` position and then drops
        the ``junk`` right-padding it wrote to the cache.
        """
        b, q = feed.shape
        rows, graph = self._graph("draft", b, q, span, self.d_cache)
        if graph is not None:
            graph.inputs["feed"][:b].copy_(feed)
            graph.inputs["feed"][b:].zero_()
            graph.inputs["last"].fill_(q - 1)
            if last is not None:
                graph.inputs["last"][:b].copy_(last)
            if junk is None:
                graph.inputs["junk"].zero_()
            else:
                graph.inputs["junk"].copy_(junk[:rows])
            self.d_cache.lengths[b:rows].zero_()  # padded rows: free, empty
            graph.replay()
            probs, token = graph.output
            return probs[:b].clone(), token[:b].clone()  # the next replay overwrites the graph's outputs
        logits = self.draft(feed, self.d_cache.rows(0, feed.shape[0], span))
        if last is None:
            logits = logits[:, -1]
        else:
            logits = logits[torch.arange(feed.shape[0], device=feed.device), last]
        if junk is not None:
            self.d_cache.rollback(junk)
        probs = torch.softmax(logits.float(), dim=-1)
        return probs, sample(probs, self.generator)

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """Host values onto the device without waiting for the queued passes, as an engine stages its
        inputs: a plain copy from pageable memory synchronises the stream, so on a GPU the copy goes
        through pinned memory, asynchronously (torch's pinned allocator keeps the buffer until it is done)."""
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type != "cuda":
            return tensor.to(self.device)
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _timed(self, fn, *args):
        """Run one calibrated pass and add its time to this step's model-pass time (not a graph's capture).

        On a GPU the pass is timed between two CUDA events and read after the step's one
        synchronisation (:meth:`_passes_done`), so the host queues the step's passes back to
        back as an engine does; a pass that captured its graph just now is timed on the host
        instead, less the capture. Elsewhere, the host clock around the pass.
        """
        captured, started = self.graphs.capture_s, time.perf_counter()
        if self.device.type != "cuda":
            out = fn(*args)
            self._passes += time.perf_counter() - started
            return out
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        replays = len(self.graphs.timings)
        begin.record()
        out = fn(*args)
        end.record()
        if self.graphs.capture_s != captured:
            self._sync()
            self._passes += time.perf_counter() - started - (self.graphs.capture_s - captured)
            del self.graphs.timings[replays:]  # a pass timed on the host: its graph's replay is not counted either
        else:
            self._events.append((self._kind(fn, args), begin, end))
        return out

    def _kind(self, fn, args) -> str:
        """A pass's kind, named as its graph's key names it: target, draft, verify, prefill-target/-draft."""
        if fn == self._prefill:
            return "prefill-target" if args[0] is self.target else "prefill-draft"
        return {self._target_pass: "target", self._draft_step: "draft", self._verify: "verify"}.get(fn, "other")

    def _passes_done(self) -> None:
        """After the step's synchronisation: the passes' event times into this step's model-pass time, and
        into :attr:`by_kind` with the time of their graphs' replays alone (what calibration times)."""
        for kind, begin, end in self._events:
            span = begin.elapsed_time(end) / 1e3
            self._passes += span
            entry = self.by_kind.setdefault(kind, {"passes": 0, "span_s": 0.0, "graph_s": 0.0})
            entry["passes"] += 1
            entry["span_s"] += span
        for kind, begin, end in self.graphs.timings or ():
            self.by_kind.setdefault(kind, {"passes": 0, "span_s": 0.0, "graph_s": 0.0})["graph_s"] += \
                begin.elapsed_time(end) / 1e3
        self._events.clear()
        if self.graphs.timings is not None:
            self.graphs.timings.clear()

    def watch(self, queue) -> None:
        """The real clock releases the queue."""

    def commit(self) -> None:
        """Write the step's tokens and roll both caches back to what each row kept."""
        b, k, live, accepted, final, remaining = self._step
        row_len = self.row_len[:b]
        if k:
            a = np.where(live, accepted, -1)  # padding rows keep nothing
            emitted = np.where(live, np.minimum(a + 1, remaining), 0)
            new_tokens = self._drafts
        else:
            a = np.where(live, 0, -1)
            emitted = live.astype(np.int64)
            new_tokens = final[:, None]
        width = new_tokens.shape[1]
        positions = self._upload(np.minimum(row_len[:, None] + np.arange(width), self.max_len - 1))
        self.history[:b].scatter_(1, positions, new_tokens)
        # Target cache: it took width tokens (the newest emitted one, then the drafts); keep a + 1 of them.
        t_pad = np.zeros(self.t_cache.batch, np.int64)
        t_pad[:b] = np.where(live, width - (a + 1), 0)
        self.t_cache.rollback(self._upload(t_pad), known=True)
        if self.d_cache is not None and k:  # the draft holds row_len - lag + k - 1 tokens; keep min(a, k - 1) drafts
            d_pad = np.zeros(self.d_cache.batch, np.int64)
            d_pad[:b] = np.where(live, (k - 1) - np.minimum(a, k - 1), 0)
            self.d_cache.rollback(self._upload(d_pad), known=True)
        self.row_len[:b] += emitted
        self.passes_s.append(self._passes)
        if not live.all():
            self._freeze_padding(b, live)

    def _freeze_padding(self, b: int, live: np.ndarray) -> None:
        """A static batch's finished rows ride along as padding; their caches keep their final lengths."""
        pad = self._upload(np.flatnonzero(~live))
        self.t_cache.lengths[pad] = self.t_frozen[pad]
        if self.d_cache is not None:
            self.d_cache.lengths[pad] = self.d_frozen[pad]

    def retire(self, done: np.ndarray) -> None:
        """The loop's rows flagged in ``done`` have finished: padding (static) or gone (continuous)."""
        rows = self.order[done]
        self.row_live[rows] = False
        self.order = self.order[~done]
        if self.static:
            index = self._upload(rows)
            self.t_frozen[index] = self.t_cache.lengths[index]
            if self.d_cache is not None:
                self.d_frozen[index] = self.d_cache.lengths[index]
            if not self.order.size:
                self.used = 0
            return
        n = self.order.size  # the rows that stay fill 0..n-1: the last ones move into the holes below n
        holes = np.flatnonzero(~self.row_live[:n])
        movers = np.flatnonzero(self.row_live[n:self.used])[::-1] + n
        for dst, src in zip(holes.tolist(), movers.tolist()):
            self._move(src, dst)
        self.used = n

    def _move(self, src: int, dst: int) -> None:
        """Sequence ``src`` to the free row ``dst``: its entries in both caches, its history, its place in order."""
        length = int(self.row_len[src]) + 1
        self.t_cache.move(src, dst, length)
        if self.d_cache is not None:
            self.d_cache.move(src, dst, length)
        self.history[dst, :length] = self.history[src, :length]
        self.row_len[dst], self.row_live[dst], self.row_live[src] = self.row_len[src], True, False
        self.order[self.order == src] = dst


def step_overheads(measured: ReplayResult) -> dict[str, float]:
    """Time per step outside the calibrated passes, per phase: what the cost model's t_overhead charges.

    Two parts. *In the step* (scheduling, the policy, sampling bookkeeping), the median: a
    typical step's, robust to a step the OS descheduled. *Between steps* (the loop applying
    the step, and the backend retiring finished rows: moving their successors' KV-cache
    entries), the mean: it is rare and heavy (a retirement), and the queue feels its total;
    a simulator that leaves it out runs fast by it (the logic check of ``specbatch
    validate`` shows it as its own term).
    """
    steps = measured.steps
    phases = steps.phase.to_numpy()
    inside = (steps.end_s - steps.start_s).to_numpy() - measured.step_passes_s
    recorded = measured.recorded_steps() if measured.clock_readings.size else None
    between = (recorded.until_s - steps.end_s.to_numpy()) if recorded is not None else np.zeros(len(steps))
    out = {}
    for phase, name in ((PREFILL, "prefill"), (DECODE, "decode")):
        chosen = phases == phase
        if chosen.any():
            out[f"{name}_overhead_s"] = float(np.median(inside[chosen]) + np.mean(between[chosen]))
            out[f"{name}_between_steps_s"] = float(np.mean(between[chosen]))
        else:
            out[f"{name}_overhead_s"] = out[f"{name}_between_steps_s"] = 0.0
    # How fast the device ran the timed passes here, against calibration: a machine whose
    # speed drifts (shared CPUs, clocks) shows it here, apart from any modelling error.
    n = len(measured.step_passes_s)
    predicted = float(measured.step_predicted_s[:n].sum())
    out["pass_speed_ratio"] = float(measured.step_passes_s.sum()) / predicted if predicted > 0 else float("nan")
    return out


def replay(run: PreparedRun, target: Transformer, draft: Transformer | None, *, acceptance: str = "synthetic",
           seed: int = 0, on_start=None, cuda_graphs: bool | None = None) -> ReplayResult:
    """Serve ``run`` for real; returns what was measured (partial if interrupted with Ctrl-C).

    ``on_start`` is called once every input has been checked, just before the real clock starts.
    ``cuda_graphs``: run every pass from CUDA graphs (calibrate.graphs; default: as the run is
    priced, :func:`sim.simulate.graph_padding`); capturing one stops the replay's clock.
    """
    requests = run.requests
    if cuda_graphs is None:
        cuda_graphs = "graph_batch_sizes" in graph_padding(run.config, run.cost_model)
    backend = TorchBackend(run, target, draft, acceptance=acceptance, seed=seed,
                           static=run.config.engine.batching == "static", cuda_graphs=cuda_graphs)
    graphs = backend.graphs
    # With a concurrency limit the client sends a request when a finish frees a slot, as the
    # simulation's client does (the loop reports finishes to the queue, in real time here).
    limit = run.config.workload.max_concurrency
    queue = arrival_queue(requests.arrival_s, run.replica.inputs(requests.prompt_tokens, requests.output_tokens, None),
                          acceptance_values(run.config, run.alphas), limit)
    loop = run.replica.loop(queue, run.policy, backend.sampler, backend)
    if on_start is not None:
        on_start()
    backend.warm_up()
    readings: list[float] = []  # every time the loop reads the clock: the logic check replays them

    def clock() -> float:  # real time, less the time spent capturing graphs (an engine's start-up work)
        now = time.perf_counter() - started - graphs.capture_s
        readings.append(now)
        return now

    started = time.perf_counter()
    partial = False
    try:
        serve_wall_clock(loop, clock)
    except KeyboardInterrupt:
        partial = True
    wall_s = time.perf_counter() - started
    rec = loop.records()
    if limit is not None:  # latencies run from when the client sent each request, as vLLM measures them
        # (after Ctrl-C, a request never sent keeps its planned arrival: it has no latency either way)
        requests = replace(requests, arrival_s=np.array(queue.sent_s))
    summary = summarize(requests.arrival_s, requests.prompt_tokens, requests.output_tokens, rec.first_token_s,
                        rec.finish_s, rec.itl_values, rec.itl_weights, rec.steps)
    table = request_table(requests, run.alphas, rec)
    steps = len(loop.state.buffers)  # an interrupted step has no record: drop its timings too
    return ReplayResult(table, pd.DataFrame(rec.steps), summary, acceptance, partial, wall_s,
                        np.asarray(backend.passes_s[:steps]), np.asarray(backend.predicted_s[:steps]),
                        by_label(table), np.asarray(readings, dtype=np.float64),
                        tuple(backend.accepted_rows[:steps]),
                        graphs.summary() | {"attention": split_attention_notes(), "passes_by_kind": pass_kinds(backend)})


def pass_kinds(backend: TorchBackend) -> dict[str, dict[str, float]]:
    """Per kind of pass, on a GPU: how many ran, the time between their events (staging of inputs
    included) and that of their graphs' replays alone, in seconds, rounded to the microsecond."""
    return {kind: {"passes": int(v["passes"]), "span_s": round(v["span_s"], 6), "graph_s": round(v["graph_s"], 6)}
            for kind, v in sorted(backend.by_kind.items())}


def replay_config(config: RunConfig, *, acceptance: str = "synthetic",
                  on_start=None) -> tuple[RunResult, ReplayResult]:
    """Replay ``config`` on the device and model pair its profile was calibrated with.

    The replay runs the v0 scheduler (its torch backend runs prefill-only and decode-only steps,
    not vllm-v1's mixed ones; a scheduler left at the default is v0 here, vllm-v1 asked for is an
    error) and pads a prefill batch to its longest prompt, so the run is priced that way too
    (``engine.prefill = "padded"``); threads, dtype and denormal flushing follow calibration.
    """
    if config.engine.scheduler != "v0":  # TorchBackend runs prefill-only and decode-only steps
        if config.sources.get("engine.scheduler") is not None and config.sources["engine.scheduler"].where != "defaults":
            raise config.error("engine.scheduler", "the real replay runs the v0 scheduler only (no mixed steps "
                                                   "of decodes and prefill chunks yet); give --scheduler v0")
        config = replace(config, engine=replace(config.engine, scheduler="v0"))  # its own default
    config = replace(config, engine=replace(config.engine, prefill="padded"))
    run = prepare(config)
    meta = run.profile.meta
    device = meta.get("device", {}).get("type")
    if device not in ("cpu", "cuda"):
        raise config.error("profile", f"was not measured on a device this replay can use (device type {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise config.error("profile", "was calibrated on CUDA, and no CUDA device is available here")
    models = meta.get("models", {})
    try:  # a target-only profile: no draft
        cfgs = {role: recorded_config(models[role], role) for role in ("target", "draft") if role in models}
        for role, cfg in cfgs.items():
            check_buildable(cfg, role)
    except InputError as exc:
        raise config.error("profile", f"names a model this replay cannot build: {exc.message}") from None
    threads, threads_before = meta.get("timing", {}).get("threads"), torch.get_num_threads()
    if device == "cpu" and threads:
        torch.set_num_threads(int(threads))
    flushing = device == "cpu" and torch.set_flush_denormal(True)
    try:
        dtype = TORCH_DTYPES[meta.get("dtype", "float32")]
        target = Transformer(cfgs["target"], device=device, dtype=dtype, seed=config.seed)
        draft = Transformer(cfgs["draft"], device=device, dtype=dtype, seed=config.seed + 1) \
            if run.policy.max_k > 0 else None
        load_before = _load_average()
        measured = replay(run, target, draft, acceptance=acceptance, seed=config.seed, on_start=on_start)
        load = [load_before, _load_average()]  # the machine's 1-minute load: how shared it was
    finally:
        torch.set_num_threads(threads_before)
        if flushing:
            torch.set_flush_denormal(False)
    extra = {"replay": {"acceptance": acceptance, "partial": measured.partial,
                        "completed": int(measured.summary["completed"]), "requests": len(run.requests),
                        "device": meta.get("device", {}), "dtype": meta.get("dtype"), "load_average": load,
                        "cuda_graphs": measured.graphs,
                        **step_overheads(measured)}}
    result = RunResult(config, run.profile, measured.requests, measured.steps, measured.summary,
                       list(run.warnings), measured.wall_s, measured.wall_s, measured.by_label, extra=extra)
    return result, measured


def _load_average() -> float | None:
    """The machine's 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None
