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

Running sequences occupy the first rows of preallocated caches; a finished row's
slot is refilled by moving the last row into it (a copy of that sequence's entries,
as cheap as a paged engine's bookkeeping is not, but small next to a step). Static
batching keeps finished rows in the batch as padding, as the simulator charges it.

Records are the simulator's (``sim.engine.STEP_FIELDS``, the request table of
``sim.simulate``), so ``sim.metrics`` summarises both alike. Ctrl-C stops the replay
between steps and what it measured so far is returned, marked partial.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch

from calibrate.configs import get_config
from calibrate.model import TORCH_DTYPES, Transformer
from calibrate.verify import sample, verify_logits
from policies.base import BatchView, Policy, StepFeedback
from sim.acceptance import acceptance_scale
from sim.serving.loop import checked_k
from sim.serving.records import DECODE, PREFILL, ReplicaRecords, step_columns
from sim.metrics import by_label, summarize
from sim.config import RunConfig
from sim.errors import InputError
from sim.simulate import PreparedRun, RunResult, make_sampler, prepare, request_table, scheduler_for

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


class ReplayEngine:
    """One replica serving ``run``'s requests with ``target`` (and ``draft``) on their device."""

    def __init__(self, run: PreparedRun, target: Transformer, draft: Transformer | None, *,
                 acceptance: str = "synthetic", seed: int = 0) -> None:
        if acceptance not in ACCEPTANCE_MODES:
            raise ValueError(f"acceptance must be one of {', '.join(ACCEPTANCE_MODES)}")
        config, requests = run.config, run.requests
        self.run, self.policy, self.acceptance = run, run.policy, acceptance
        self.speculates = run.policy.max_k > 0
        if self.speculates and draft is None:
            raise ValueError("the policy speculates (max_k > 0) but no draft model was given")
        if self.speculates and draft.cfg.vocab_size != target.cfg.vocab_size:
            raise config.error("profile", f"its draft {draft.cfg.name} and target {target.cfg.name} have different "
                                          "vocabularies, so the target cannot verify the draft's tokens")
        self.target, self.draft = target, draft if self.speculates else None
        self.device = target.device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        n = len(requests)
        self.arrivals = requests.arrival_s.tolist()
        self.prompt = requests.prompt_tokens.astype(np.int64)
        self.output = requests.output_tokens.astype(np.int64)
        self.scale = acceptance_scale(run.alphas)
        self.kv_reserve = self.prompt + self.output + run.policy.max_k
        self.scheduler = scheduler_for(run)
        self.sampler = make_sampler(config, run.alphas)
        self.k_max = run.table.k_max
        slots = config.engine.max_batch_size
        # A padding row of a static batch keeps its length; a live one grows to prompt + output,
        # plus one step's k + 1 appended before the rollback and the draft's catch-up.
        self.max_len = int((self.prompt + self.output).max()) + 2 * (self.k_max + 2)
        for model in (target, self.draft):
            limit = model.cfg.max_position_embeddings if model is not None else None
            if limit is not None and self.max_len > limit:
                raise config.error("workload.output_tokens", f"{model.cfg.name} accepts {limit} positions; prompt "
                                   f"+ output + speculation slots of this workload reach {self.max_len}")
        self.t_cache = target.new_cache(slots, self.max_len)
        self.d_cache = self.draft.new_cache(slots, self.max_len) if self.draft is not None else None
        self.history = torch.zeros(slots, self.max_len, dtype=torch.long, device=self.device)
        self.t_frozen = torch.zeros(slots, dtype=torch.long, device=self.device)  # padding rows' cache lengths
        self.d_frozen = torch.zeros(slots, dtype=torch.long, device=self.device)
        vocab = target.cfg.vocab_size
        self.prompt_tokens = np.random.default_rng(seed).integers(0, vocab, size=int(self.prompt.max()))
        # Per-row host state (rows 0..used-1 are in the batch; `live` marks unfinished ones).
        self.row_req = np.zeros(slots, np.int64)
        self.row_len = np.zeros(slots, np.int64)  # prompt + emitted tokens
        self.row_remaining = np.zeros(slots, np.int64)
        self.row_lag = np.zeros(slots, np.int64)  # emitted tokens the draft has not seen yet
        self.row_last = np.zeros(slots)  # time of the row's latest token
        self.row_live = np.zeros(slots, bool)
        self.used = 0
        # Per-request records.
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.decode_steps = np.zeros(n, np.int64)
        self.drafted = np.zeros(n, np.int64)
        self.accepted = np.zeros(n, np.int64)
        self.step_rows: list[tuple] = []
        self.passes_s: list[float] = []  # per step: time inside the passes calibration times
        self.predicted_s: list[float] = []  # ... and what the profile says they take
        self.overheads = (run.profile.engine_overhead_s("prefill"), run.profile.engine_overhead_s("decode"))
        self.itl: list[np.ndarray] = []
        self.view = BatchView(self.k_max)
        self.feedback = StepFeedback()
        self._observes = type(self.policy).observe is not Policy.observe
        self.kv_used = 0
        self.queue_head = 0

    @property
    def running(self) -> int:
        return int(self.row_live[:self.used].sum())

    # The loop mirrors sim.engine.Replica._run: admit at step boundaries, else decode, else wait.
    def serve(self) -> ReplayResult:
        started = time.perf_counter()
        self.t0 = started
        arrived, total, partial = 0, len(self.arrivals), False
        cap = self.scheduler.max_batch_size
        try:
            while True:
                now = self.clock()
                arrived = bisect_right(self.arrivals, now, arrived)
                waiting = arrived - self.queue_head
                running = self.running
                if running == 0 and waiting == 0:
                    if arrived == total:
                        break
                    time.sleep(max(0.0, self.arrivals[arrived] - now))
                    continue
                n = self.scheduler.admit(running, self.kv_used, self.kv_reserve[self.queue_head:arrived]) \
                    if waiting and running < cap else 0
                if n:
                    self.prefill_step(n, now)
                elif running:
                    self.decode_step(now)
                else:
                    raise RuntimeError("a waiting request can never be admitted (checked before the run)")
        except KeyboardInterrupt:
            partial = True
        return self.result(partial, time.perf_counter() - started)

    def clock(self) -> float:
        return time.perf_counter() - self.t0

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

    # ---------------------------------------------------------------- prefill
    def prefill_step(self, n: int, start: float) -> None:
        head = self.queue_head
        req = np.arange(head, head + n)
        if self.scheduler.name == "static":  # a new static batch: the previous one has ended
            self.used = 0
        lo, hi = self.used, self.used + n
        rows = np.arange(lo, hi)
        lengths = self.prompt[req]
        longest = int(lengths.max())
        tokens = np.zeros((n, longest), np.int64)
        for i, p in enumerate(lengths.tolist()):
            tokens[i, :p] = self.prompt_tokens[:p]
        tokens_t = torch.from_numpy(tokens).to(self.device)
        last = torch.from_numpy(lengths - 1).to(self.device)
        self._passes = 0.0
        self.predicted_s.append(self.run.table.prefill_time(n, float(longest)) - self.overheads[0])
        logits = self._timed(self._prefill, self.target, self.t_cache, tokens_t, last, lo, hi, lengths)
        if self.draft is not None:
            self._timed(self._prefill, self.draft, self.d_cache, tokens_t, last, lo, hi, lengths)
        first = sample(torch.softmax(logits[:, -1].float(), dim=-1), self.generator)
        self.history[lo:hi, :longest] = tokens_t
        self.history[torch.arange(lo, hi, device=self.device), torch.from_numpy(lengths).to(self.device)] = first
        self._sync()
        self.queue_head += n
        self.kv_used += int(self.kv_reserve[req].sum())
        end = self.clock()
        self.scheduled_s[req] = start
        self.first_token_s[req] = end
        self.row_req[rows], self.row_len[rows] = req, lengths + 1
        self.row_remaining[rows] = self.output[req] - 1
        self.row_lag[rows], self.row_last[rows], self.row_live[rows] = 1, end, True
        self.used = hi
        one_token = rows[self.row_remaining[rows] == 0]
        if one_token.size:  # requests of one output token end with their prefill
            self._finish(one_token, end)
        self.scheduler.on_admit(n, self.running)
        self.step_rows.append((start, end, PREFILL, n, self.running, 0, float(lengths.mean()), 0, 0, n))
        self.passes_s.append(self._passes)

    def _prefill(self, model: Transformer, cache, tokens: torch.Tensor, last: torch.Tensor, lo: int, hi: int,
                 lengths: np.ndarray) -> torch.Tensor:
        cache.lengths[lo:hi] = 0
        view = cache.rows(lo, hi, 0)
        logits = model(tokens, view, last_positions=last)
        cache.lengths[lo:hi] = torch.from_numpy(lengths).to(cache.lengths.device)  # padding is stale, masked
        return logits

    # ----------------------------------------------------------------- decode
    def decode_step(self, start: float) -> None:
        b = self.used  # rows in the batch: live ones, plus a static batch's finished padding
        live = self.row_live[:b]
        running = int(live.sum())
        charged = self.scheduler.charged_batch_size(running)
        remaining = self.row_remaining[:b]
        view = self.view
        view.now_s, view.step, view.batch_size, view.running = start, len(self.step_rows), charged, running
        view.mean_context_tokens = float((self.row_len[:b][live] - 1).mean())
        view.remaining_tokens = remaining[live]
        view.final_context_tokens = (self.row_len[:b] - 1 + remaining)[live]
        k = self.policy.choose_k(view)
        ragged = None
        if k.__class__ is not int or not 0 <= k <= self.k_max:
            k = checked_k(k, self.k_max, self.policy, running)
            if k.__class__ is not int:
                ragged = np.zeros(b, np.int64)
                ragged[live] = k
                k = int(k.max())
        self._passes = 0.0
        context = view.mean_context_tokens
        predicted = self.run.table.decode_time(charged, k, context) - self.overheads[1]
        lag = int(self.row_lag[:b][live].max()) if k and self.draft is not None else 1
        if lag > 1:
            predicted += self.run.table.catch_up_time(charged, lag, context)
        self.predicted_s.append(predicted)
        if k:
            accepted, final = self._speculate(b, k, live, ragged)
        else:
            accepted, final = None, self._plain(b)
        self._sync()
        end = self.clock()
        self._emit(b, k, live, ragged, accepted, final, start, end, charged, running)

    def _plain(self, b: int) -> torch.Tensor:
        """k = 0: one target pass over each sequence's newest token, then sampling (verify at k = 0)."""
        rows = torch.arange(b, device=self.device)
        last = self.history[rows, torch.from_numpy(self.row_len[:b] - 1).to(self.device)][:, None]
        logits = self._timed(self.target, last, self.t_cache.rows(0, b, int(self.row_len[:b].max()) - 1))
        empty = torch.empty(b, 0, dtype=torch.long, device=self.device)
        result = self._timed(verify_logits, logits, torch.empty(b, 0, logits.shape[-1], device=self.device), empty,
                             self.generator)
        return result.tokens[:, 0]

    def _speculate(self, b: int, k: int, live: np.ndarray, ragged):
        dev = self.device
        row_len = self.row_len[:b]
        # Draft: its first pass feeds each row the `lag` tokens it has not seen, right-padded to
        # the batch's largest lag (`catch_up`); the padding is rolled back and each row's next
        # token is read at its own last real position, so every row ends the pass at row_len.
        lag = np.where(live, self.row_lag[:b], 1)  # static padding rows: see _freeze_padding
        catch_up = int(lag.max())
        d_len = row_len - lag
        positions = np.minimum(d_len[:, None] + np.arange(catch_up), row_len[:, None] - 1)
        feed = self.history[:b].gather(1, torch.from_numpy(positions).to(dev))
        last = torch.from_numpy(lag - 1).to(dev)
        junk = np.zeros(self.d_cache.batch, np.int64)
        junk[:b] = catch_up - lag
        junk = torch.from_numpy(junk).to(dev)
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
        newest = self.history[rows, torch.from_numpy(t_len).to(dev)]
        logits = self._timed(self.target, torch.cat((newest[:, None], drafts), 1),
                             self.t_cache.rows(0, b, int(t_len.max())))
        result = self._timed(verify_logits, logits, torch.stack(draft_probs, 1), drafts, self.generator)
        if self.acceptance == "synthetic":  # drawn for the live rows, as the simulator draws
            accepted = np.zeros(b, np.int64)
            accepted[live] = self.sampler.accepted(self.scale[self.row_req[:b][live]],
                                                   k if ragged is None else ragged[live])
        else:
            accepted = result.accepted.cpu().numpy()
            if ragged is not None:
                accepted = np.minimum(accepted, ragged)
        # The token after the kept drafts: the kernel's where it stopped there; otherwise (a
        # synthetic or truncated count) any valid token will do, as values do not change timing.
        stop = torch.from_numpy(accepted).to(dev)
        kernel = result.tokens[rows, stop]
        final = torch.where(kernel >= 0, kernel, drafts[rows, stop.clamp(max=k - 1)])
        tokens = torch.cat((drafts, final[:, None]), 1)
        tokens[rows, stop] = final
        self._drafts = tokens
        return accepted, final

    def _draft_step(self, feed: torch.Tensor, span: int, last: torch.Tensor | None = None,
                    junk: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft pass and the sampling of its token: what calibration times as a draft step.

        A catch-up pass reads each row's logits at its own ``last`` position and then drops
        the ``junk`` right-padding it wrote to the cache.
        """
        logits = self.draft(feed, self.d_cache.rows(0, feed.shape[0], span))
        if last is None:
            logits = logits[:, -1]
        else:
            logits = logits[torch.arange(feed.shape[0], device=feed.device), last]
        if junk is not None:
            self.d_cache.rollback(junk)
        probs = torch.softmax(logits.float(), dim=-1)
        return probs, sample(probs, self.generator)

    def _timed(self, fn, *args):
        """Run one calibrated pass, adding its time to this step's model-pass time."""
        started = time.perf_counter()
        out = fn(*args)
        self._sync()
        self._passes += time.perf_counter() - started
        return out

    def _emit(self, b, k, live, ragged, accepted, final, start, end, charged, running) -> None:
        dev = self.device
        row_len, remaining = self.row_len[:b], self.row_remaining[:b]
        if k:
            a = np.where(live, accepted, -1)  # padding rows keep nothing
            emitted = np.where(live, np.minimum(a + 1, remaining), 0)
            new_tokens = self._drafts
        else:
            a = np.where(live, 0, -1)
            emitted = live.astype(np.int64)
            new_tokens = final[:, None]
        width = new_tokens.shape[1]
        positions = torch.from_numpy(np.minimum(row_len[:, None] + np.arange(width), self.max_len - 1)).to(dev)
        self.history[:b].scatter_(1, positions, new_tokens)
        # Target cache: it took width tokens (the newest emitted one, then the drafts); keep a + 1 of them.
        t_pad = np.zeros(self.t_cache.batch, np.int64)
        t_pad[:b] = np.where(live, width - (a + 1), 0)
        self.t_cache.rollback(torch.from_numpy(t_pad).to(dev))
        if self.d_cache is not None:
            if k:  # the draft holds row_len - lag' + k - 1 tokens; keep min(a, k - 1) drafts
                d_pad = np.zeros(self.d_cache.batch, np.int64)
                d_pad[:b] = np.where(live, (k - 1) - np.minimum(a, k - 1), 0)
                self.d_cache.rollback(torch.from_numpy(d_pad).to(dev))
                lag = np.where(a == k, 2, 1)
                self.row_lag[:b] = np.where(live, lag, 1)
            else:
                self.row_lag[:b] += live
        self.row_len[:b] += emitted
        drafted_rows = (ragged if ragged is not None else np.full(b, k)) * live
        req = self.row_req[:b][live]
        self.decode_steps[req] += 1
        self.drafted[req] += drafted_rows[live]
        if k:
            self.accepted[req] += accepted[live]
        gaps = end - self.row_last[:b][live]
        self.itl.append(gaps)
        self.row_last[:b][live] = end
        remaining -= emitted
        accepted_total = int(accepted[live].sum()) if k else 0
        ended = np.flatnonzero(live & (remaining == 0))
        if self._observes:
            fb = self.feedback
            fb.now_s, fb.step, fb.batch_size, fb.k, fb.step_time_s = end, len(self.step_rows), charged, k, end - start
            fb.drafted_tokens, fb.accepted_tokens = int(drafted_rows.sum()), accepted_total
            fb.accepted_per_sequence = accepted[live] if k else None
            fb.k_per_sequence = ragged[live] if ragged is not None else None
            self.policy.observe(fb)
        context = float((row_len[live] - 1).mean())
        self.step_rows.append((start, end, DECODE, charged, running, k, context, int(drafted_rows.sum()),
                               accepted_total, int(emitted.sum())))
        self.passes_s.append(self._passes)
        if not live.all():
            self._freeze_padding(b, live)
        if ended.size:
            self._finish(ended, end)

    def _freeze_padding(self, b: int, live: np.ndarray) -> None:
        """A static batch's finished rows ride along as padding; their caches keep their final lengths."""
        pad = torch.from_numpy(np.flatnonzero(~live)).to(self.device)
        self.t_cache.lengths[pad] = self.t_frozen[pad]
        if self.d_cache is not None:
            self.d_cache.lengths[pad] = self.d_frozen[pad]

    def _finish(self, rows: np.ndarray, end: float) -> None:
        req = self.row_req[rows]
        if self.scheduler.name == "static":
            index = torch.from_numpy(rows).to(self.device)
            self.t_frozen[index] = self.t_cache.lengths[index]
            if self.d_cache is not None:
                self.d_frozen[index] = self.d_cache.lengths[index]
        self.finish_s[req] = end
        self.kv_used -= int(self.kv_reserve[req].sum())
        self.row_live[rows] = False
        if self.scheduler.name == "static":
            if not self.row_live[:self.used].any():
                self.used = 0
            return
        for row in sorted(rows.tolist(), reverse=True):  # fill each hole with the last row
            last = self.used - 1
            if row != last:
                self._move(last, row)
            self.used -= 1

    def _move(self, src: int, dst: int) -> None:
        length = int(self.row_len[src]) + 1
        self.t_cache.move(src, dst, length)
        if self.d_cache is not None:
            self.d_cache.move(src, dst, length)
        self.history[dst, :length] = self.history[src, :length]
        for arr in (self.row_req, self.row_len, self.row_remaining, self.row_lag, self.row_last, self.row_live):
            arr[dst] = arr[src]
        self.row_live[src] = False

    # ---------------------------------------------------------------- records
    def records(self) -> ReplicaRecords:
        steps = step_columns(self.step_rows)
        itl = np.concatenate(self.itl) if self.itl else np.zeros(0)
        return ReplicaRecords(self.scheduled_s, self.first_token_s, self.finish_s, self.decode_steps, self.drafted,
                              self.accepted, steps, itl, np.ones(itl.shape, np.int64))

    def result(self, partial: bool, wall_s: float) -> ReplayResult:
        r = self.run.requests
        rec = self.records()
        summary = summarize(r.arrival_s, r.prompt_tokens, r.output_tokens, rec.first_token_s, rec.finish_s,
                            rec.itl_values, rec.itl_weights, rec.steps)
        table = request_table(r, self.run.alphas, rec)
        return ReplayResult(table, pd.DataFrame(rec.steps), summary, self.acceptance, partial, wall_s,
                            np.asarray(self.passes_s), np.asarray(self.predicted_s), by_label(table))


def step_overheads(measured: ReplayResult) -> dict[str, float]:
    """Mean time per step outside the calibrated passes (bookkeeping, sampling, cache moves), per phase."""
    steps = measured.steps
    outside = (steps.end_s - steps.start_s).to_numpy() - measured.step_passes_s
    out = {}
    for phase, name in ((PREFILL, "prefill"), (DECODE, "decode")):
        chosen = steps.phase.to_numpy() == phase
        out[f"{name}_overhead_s"] = float(np.median(outside[chosen])) if chosen.any() else 0.0
    # How fast the device ran the timed passes here, against calibration: a machine whose
    # speed drifts (shared CPUs, clocks) shows it here, apart from any modelling error.
    n = len(measured.step_passes_s)
    predicted = float(measured.step_predicted_s[:n].sum())
    out["pass_speed_ratio"] = float(measured.step_passes_s.sum()) / predicted if predicted > 0 else float("nan")
    return out


def replay(run: PreparedRun, target: Transformer, draft: Transformer | None, *, acceptance: str = "synthetic",
           seed: int = 0, on_start=None) -> ReplayResult:
    """Serve ``run`` for real; returns what was measured (partial if interrupted with Ctrl-C).

    ``on_start`` is called once every input has been checked, just before the real clock starts.
    """
    engine = ReplayEngine(run, target, draft, acceptance=acceptance, seed=seed)
    if on_start is not None:
        on_start()
    engine.warm_up()
    return engine.serve()


def replay_config(config: RunConfig, *, acceptance: str = "synthetic",
                  on_start=None) -> tuple[RunResult, ReplayResult]:
    """Replay ``config`` on the device and model pair its profile was calibrated with.

    The replay pads a prefill batch to its longest prompt, so the run is priced that way too
    (``engine.prefill = "padded"``); threads, dtype and denormal flushing follow calibration.
    """
    config = replace(config, engine=replace(config.engine, prefill="padded"))
    run = prepare(config)
    meta = run.profile.meta
    device = meta.get("device", {}).get("type")
    if device not in ("cpu", "cuda"):
        raise config.error("profile", f"was not measured on a device this replay can use (device type {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise config.error("profile", "was calibrated on CUDA, and no CUDA device is available here")
    models = meta.get("models", {})
    names = {role: models.get(role, {}).get("name") for role in ("target", "draft")}
    try:
        cfgs = {role: get_config(name, role) for role, name in names.items()}
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
        measured = replay(run, target, draft, acceptance=acceptance, seed=config.seed, on_start=on_start)
    finally:
        torch.set_num_threads(threads_before)
        if flushing:
            torch.set_flush_denormal(False)
    extra = {"replay": {"acceptance": acceptance, "partial": measured.partial,
                        "completed": int(measured.summary["completed"]), "requests": len(run.requests),
                        "device": meta.get("device", {}), "dtype": meta.get("dtype"),
                        **step_overheads(measured)}}
    result = RunResult(config, run.profile, measured.requests, measured.steps, measured.summary,
                       list(run.warnings), measured.wall_s, measured.wall_s, measured.by_label, extra=extra)
    return result, measured
