"""One replica's serving loop, step by step: the scheduler decides, a backend runs the step, the loop applies it.

A clock driver (:mod:`sim.serving.clock`) calls, per step (nano-vllm's ``step()``):

* :meth:`ServingLoop.start_step`: *schedule*: the policy picks k for the running rows (an int,
  or one k per row: a *ragged* step, run padded to the largest, as vLLM and TensorRT-LLM run
  it) and the scheduler plans the step (sim/scheduler/: v0's prefill or decode, vllm-v1's
  mixed step under a token budget), then *execute*: the :class:`StepBackend` prices the step
  (the simulator: its duration is returned and the clock waits it out) or runs it (the real
  replay: the clock measures it), and says how many draft tokens each row keeps;
* :meth:`ServingLoop.finish_step`: *apply*: tokens are emitted, prefilled requests join the
  rows, finished rows retire and give their KV back, the policy observes the step, and the
  step is recorded.

The state lives in arrays (sim/serving/state.py) and the rules that read and write it are
functions (sim/serving/rules.py, sim/scheduler/), interpreted or compiled (``engine.jit``,
sim/jit.py); compiled runs (sim/serving/compiled.py) call the same rules many steps at a
time when nothing outside the replica needs to see each step. Per step the Python work here
is a few calls, whatever the batch's size.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from policies.base import BatchView, Policy, StepFeedback
from sim.errors import InputError
from sim.jit import compiled
from sim.scheduler import v0, v1
from sim.scheduler.work import has_work
from sim import proposals as proposal_rules
from sim.serving import rules
from sim.scheduler.layout import (C_ADMIT, C_ARRIVED, C_CHUNK_TOKENS, C_CHUNKS, C_DECODE_TOKENS, C_HEAD, C_PREEMPTED_NOW,
                                  C_PREFILLING, C_RAGGED, C_REQUEUED, C_REQUEUED_AT, C_RUNNING, C_STEP_BLOCKS,
                                  C_OFFERED_K, C_STEP_K, C_STEP_ROWS, C_STEP_RUNNING, C_TOTAL_CONTEXT,
                                  C_TOTAL_REMAINING, DECODE,
                                  LAST_STEP_END,
                                  MIXED, NOTHING, P_MAX_SEQS, PREFILL, REC_ACCEPTED, REC_CACHED, REC_DECODE_STEPS,
                                  REC_DRAFTED, REC_EMITTED, REC_FINISH, REC_FIRST_TOKEN, REC_PREEMPTIONS, REC_SCHEDULED,
                                  REQ_OUTPUT, REQ_PROMPT, ROW_CONTEXT, ROW_LAG, ROW_REMAINING, ROW_SCALE, S_CHUNK_PREFIX,
                                  S_CHUNK_TOKENS, S_PF_DONE,
                                  S_PF_REQ, S_PF_TARGET, S_REQUEUED, S_ROW_K)
from sim.serving.records import ReplicaRecords
from sim.serving.state import ReplicaState


class StepBackend(Protocol):
    """What executes a step: prices it (simulated time) or runs it (measured time).

    ``prefill`` (v0: n prompts at the head of the queue, priced at the length the scheduler says,
    their mean or, right-padded, their longest) and ``decode`` return the step's duration in seconds, or None when the step
    really ran and the clock measures it; ``decode`` also returns the draft tokens each of the
    step's rows kept (None at k = 0). ``chunks`` (vllm-v1) is what a step's prefill chunks add.
    Backends that keep per-row state of their own (KV caches) set ``follows_rows`` and are told
    what the loop applied. ``steps_compiled``: a compiled run (sim/serving/kernel.py) prices the
    steps exactly as this backend would, so it may take stretches of them in one call.
    """

    follows_rows: bool
    steps_compiled: bool

    def prefill(self, queue, head: int, n: int, prompt_tokens: float) -> float | None: ...

    def decode(self, view: BatchView, k: int, ragged: np.ndarray | None, scale: np.ndarray,
               max_lag: int) -> tuple[float | None, np.ndarray | None]: ...

    def chunks(self, decode_tokens: int, tokens: np.ndarray, prefixes: np.ndarray) -> float: ...

    def watch(self, queue) -> None:
        """Called with the replica's queue before the run (a playback releases it as recorded)."""

    def commit(self) -> None:
        """The decode step's outcome is final: write its tokens (follows_rows only)."""

    def retire(self, done: np.ndarray) -> None:
        """Rows flagged in ``done`` (over the rows before, in order) have left (follows_rows only)."""


class Rules:
    """The rules a loop calls, interpreted or compiled (sim/jit.py): one source either way."""

    def __init__(self, compile_them: bool) -> None:
        self.compiled = compile_them
        pick = compiled if compile_them else _as_written
        self.plan_v0, self.prefill_prompt, self.plan_v1 = pick(v0.plan_v0), pick(v0.prefill_prompt), pick(v1.plan_v1)
        self.apply_decode, self.apply_prefill = pick(rules.apply_decode), pick(rules.apply_prefill)
        self.apply_chunks, self.retire, self.write_step = pick(rules.apply_chunks), pick(rules.retire), pick(rules.write_step)
        self.step_rows_stats, self.count_accepted = pick(rules.step_rows_stats), pick(proposal_rules.count_accepted)
        self.propose_rows, self.runlength_accepted = pick(proposal_rules.propose_rows), pick(proposal_rules.runlength_accepted)


def _as_written(rule):
    """A rule interpreted: the plain function."""
    return rule


class ServingLoop:
    """One replica: a queue (:mod:`sim.serving.queues`), a scheduler, a policy and a step backend."""

    def __init__(self, queue, *, scheduler, policy: Policy, backend: StepBackend, k_max: int, rules: Rules,
                 max_blocks_per_request: int = 1, num_keys: int = 0, lag_mode: int = 1, proposals=None) -> None:
        self.queue = queue
        self.scheduler = scheduler
        self.policy = policy
        self.backend = backend
        self.k_max = k_max
        self.rules = rules
        self.state = state = ReplicaState(scheduler, queue.capacity, max_blocks_per_request, num_keys)
        queue.bind(state.ctr)
        queue.on_grow = state.grow
        self.view = BatchView(k_max)
        self.feedback = StepFeedback()
        self._final = np.zeros(scheduler.max_batch_size, dtype=np.int64)  # the view's final contexts
        self._observes = policy.observes  # feedback is filled in only for policies that listen
        self.tracks_lag = lag_mode if policy.max_k > 0 else 0  # a run with a drafter that lags pays its catch-up
        self.proposals = proposals  # sim.acceptance.ProposalModel: rows propose only where they match (None: always)
        self._follows = backend.follows_rows
        self.compiled_runs = None  # sim.serving.compiled.CompiledRuns, when stretches of steps run compiled
        self._phase = NOTHING

    def close(self) -> None:
        """Break the references that point back at this loop (its compiled runs, the queue's growth
        hook), so that dropping the loop frees its arrays at once, not at the next full collection."""
        self.compiled_runs = None
        self.queue.on_grow = None

    # ------------------------------------------------------------ schedule + execute
    def has_work(self) -> bool:
        """Whether a step can start now (else the replica waits for an arrival): sim.scheduler.work."""
        return bool(has_work(self.state.ctr))

    def start_step(self, now: float) -> float | None:
        """Plan the next step and run it: its duration (None: it ran and the clock measures it)."""
        st, r = self.state, self.rules
        ctr = st.ctr
        st.buffers.room(1, 2 * self.scheduler.max_batch_size + 1)
        if self.scheduler.paged:
            b = int(ctr[C_RUNNING])
            if b:
                self._choose_k(now, b, b)
                self._propose(st.ks, b)
            phase = r.plan_v1(st.ks, st.rows, st.rowf, self.queue.reqi, st.reci, st.recf, ctr, st.clk, st.sched,
                              st.kv.kv, st.kv.key_block, st.kv.slot_blocks, st.kv.scratch, st.par, now)
        else:
            phase = r.plan_v0(self.queue.reqi, ctr, st.par)
            if phase == PREFILL:
                self._phase = phase
                n = int(ctr[C_ADMIT])
                priced, self._mean_prompt = r.prefill_prompt(self.queue.reqi, ctr, st.par)
                return self.backend.prefill(self.queue, int(ctr[C_HEAD]), n, float(priced))
            if phase == v0.STUCK:
                raise RuntimeError("a waiting request can never be admitted (checked before the run)")
            if phase == DECODE:
                b = int(ctr[C_RUNNING])
                ctr[C_STEP_K], ctr[C_RAGGED] = self._choose_k(now, b, v0.charged_batch(ctr, b))
                st.sched[S_ROW_K, :b] = st.ks[:b]
                proposed = self._propose(st.sched[S_ROW_K], b)
                if proposed is not None:
                    ctr[C_STEP_K], ctr[C_RAGGED] = proposed
        if phase == NOTHING:
            raise RuntimeError("a step with nothing to run (the clock checks has_work first)")
        self._phase = phase
        m = int(ctr[C_STEP_ROWS]) if phase != PREFILL else 0
        dt = 0.0
        if m:
            dt = self._decode(m)
        if self.scheduler.paged and ctr[C_CHUNK_TOKENS]:
            n = int(ctr[C_CHUNKS])
            dt += self.backend.chunks(int(ctr[C_DECODE_TOKENS]) if m else 0, st.sched[S_CHUNK_TOKENS, :n],
                                      st.sched[S_CHUNK_PREFIX, :n])
        return dt

    def _choose_k(self, now: float, b: int, charged: int) -> tuple[int, bool]:
        """The policy's k for the b running rows, checked and spread into ``state.ks``: (largest k, ragged)."""
        st = self.state
        rows = st.rows
        view = self.view
        view.now_s, view.step, view.batch_size, view.running = now, len(st.buffers), charged, b
        view.mean_context_tokens = int(st.ctr[C_TOTAL_CONTEXT]) / b
        view.remaining_tokens = rows[ROW_REMAINING, :b]
        view.final_context_tokens = np.add(rows[ROW_CONTEXT, :b], rows[ROW_REMAINING, :b], out=self._final[:b])
        view.lag_tokens = rows[ROW_LAG, :b]
        k = self.policy.choose_k(view)
        if k.__class__ is not int or not 0 <= k <= self.k_max:
            k = checked_k(k, self.k_max, self.policy, b)
            if k.__class__ is not int:  # ragged: one k per sequence, charged padded to the largest
                st.ks[:b] = k
                return int(np.maximum.reduce(k)), True
        st.ks[:b] = k
        return k, False

    def _propose(self, ks: np.ndarray, b: int):
        """Cut the rows' ks to what each proposes (a host matcher: only where the context matches;
        sim.proposals); (largest k, ragged), or None when every row proposes its k."""
        p = self.proposals
        if p is None or not p.partial:
            return None
        st = self.state
        st.ctr[C_OFFERED_K] = int(np.maximum.reduce(ks[:b]))
        return self.rules.propose_rows(ks, b, st.rows, st.rowf, self.queue.reqi, p.mode, p.match_rate, p.seed,
                                       p.runs, p.start, p.length)

    def _decode(self, m: int) -> float | None:
        """Execute the planned step's decodes: rows [0, m) at their ks."""
        st, ctr = self.state, self.state.ctr
        k, ragged = int(ctr[C_STEP_K]), bool(ctr[C_RAGGED])
        total, lag = self.rules.step_rows_stats(st.rows, m, self.tracks_lag)
        view = self.view
        charged = v0.charged_batch(ctr, m)
        self._charged, self._mean_context, self._step_k, self._m = charged, total / m, k, m
        if view.running != m or view.batch_size != charged:  # vllm-v1 scheduled fewer rows than run
            view.running, view.batch_size = m, charged
            view.remaining_tokens = st.rows[ROW_REMAINING, :m]
            view.final_context_tokens = self._final[:m]
            view.lag_tokens = st.rows[ROW_LAG, :m]
        view.mean_context_tokens = self._mean_context
        ks = st.sched[S_ROW_K, :m]
        self._ragged = ks.copy() if ragged else None
        dt, accepted = self.backend.decode(view, k, self._ragged, st.rowf[ROW_SCALE, :m], int(lag))
        if accepted is not None:
            st.accepted[:m] = accepted
        self._dt = dt
        return dt

    # ------------------------------------------------------------------- apply
    def finish_step(self, start: float, end: float) -> None:
        """Apply the step started by :meth:`start_step` (it ran from ``start`` to ``end``)."""
        st, r, ctr = self.state, self.rules, self.state.ctr
        st.clk[LAST_STEP_END] = end
        if self._phase == PREFILL and not self.scheduler.paged:
            n, head, running = int(ctr[C_ADMIT]), int(ctr[C_HEAD]), int(ctr[C_RUNNING])
            alone = self.queue.reqi[REQ_OUTPUT, head:head + n] == 1  # one-token requests end with their prefill
            finished = r.apply_prefill(n, st.rows, st.rowf, self.queue.reqi, self.queue.scale, st.reci, st.recf,
                                       ctr, start, end)
            if finished and self._follows:
                self.backend.retire(np.concatenate((np.zeros(running, bool), alone)))
            r.write_step(st.buffers.steps, ctr, start, end, PREFILL, n, int(ctr[C_RUNNING]), 0, self._mean_prompt,
                         0, 0, 0, n, 0, 0, 0)
            if finished:
                self.queue.finished(finished, end)
            return
        m = int(ctr[C_STEP_ROWS]) if self._phase in (DECODE, MIXED) else 0
        emitted = accepted = drafted = drafts = 0
        finishing = False
        if m:
            if self._follows:
                self.backend.commit()
            ks = st.sched[S_ROW_K]
            emitted, accepted, drafted, drafts, finishing = r.apply_decode(
                st.rows, st.rowf, m, ks, st.accepted, st.reci, st.buffers.itl_values, st.buffers.itl_weights, ctr,
                st.clk, end, self.tracks_lag)
        finished = 0
        prefill_tokens = 0
        if self.scheduler.paged:
            more, prefill_tokens, finished = r.apply_chunks(st.rows, st.rowf, self.queue.reqi, self.queue.scale,
                                                           st.reci, st.recf, ctr, st.sched, st.kv.kv,
                                                           st.kv.slot_blocks, st.par, st.buffers.itl_values,
                                                           st.buffers.itl_weights, end)
            emitted += more
        if finishing:
            if self._follows:
                self.backend.retire(st.rows[ROW_REMAINING, :int(ctr[C_RUNNING])] == 0)
            finished += r.retire(st.rows, st.rowf, self.queue.reqi, st.recf, ctr, end, self.scheduler.paged,
                                 st.kv.kv, st.kv.key_block, st.kv.slot_blocks, st.sched, st.par)
        if m and self._observes:
            fb = self.feedback
            fb.now_s, fb.step, fb.batch_size, fb.k = end, len(st.buffers), self._charged, self._step_k
            partial = self.proposals is not None and self.proposals.partial
            if partial:  # what was offered, and each row's proposal (none: a miss the policy learns from)
                fb.k = int(ctr[C_OFFERED_K])
            fb.step_time_s = self._dt if self._dt is not None else end - start
            fb.drafted_tokens, fb.accepted_tokens = drafted, accepted
            fb.accepted_per_sequence = st.accepted[:m] if self._step_k or partial else None
            fb.k_per_sequence = st.sched[S_ROW_K, :m].copy() if partial else self._ragged
            self.policy.observe(fb)
        if self.scheduler.paged:
            r.write_step(st.buffers.steps, ctr, start, end, self._phase, m, int(ctr[C_STEP_RUNNING]),
                         self._step_k if m else 0, self._mean_context if m else 0.0, drafted, drafts, accepted,
                         emitted, prefill_tokens, int(ctr[C_STEP_BLOCKS]), int(ctr[C_PREEMPTED_NOW]))
        else:
            r.write_step(st.buffers.steps, ctr, start, end, DECODE, self._charged, m, self._step_k,
                         self._mean_context, drafted, drafts, accepted, emitted, 0, 0, 0)
        if finished:
            self.queue.finished(finished, end)

    # ------------------------------------------------------------- results
    def outstanding_requests(self) -> int:
        """Given to this replica and not finished: waiting (or being prefilled) plus running."""
        ctr = self.state.ctr
        return int(self.queue.count - ctr[C_HEAD] + ctr[C_RUNNING] + ctr[C_PREFILLING] + ctr[C_REQUEUED])

    def outstanding_tokens(self) -> int:
        """Prompt tokens not yet prefilled plus output tokens not yet emitted, over unfinished requests."""
        st, ctr, reqi = self.state, self.state.ctr, self.queue.reqi
        tokens = self.queue.waiting_tokens() + int(ctr[C_TOTAL_REMAINING])
        for j in range(int(ctr[C_PREFILLING])):  # vllm-v1: prompts (or recomputes) not yet in, and their outputs
            req = st.sched[S_PF_REQ, j]
            tokens += int(st.sched[S_PF_TARGET, j] - st.sched[S_PF_DONE, j] + reqi[REQ_OUTPUT, req]
                          - st.reci[REC_EMITTED, req])
        cap = int(st.par[P_MAX_SEQS])
        for j in range(int(ctr[C_REQUEUED])):
            req = st.sched[S_REQUEUED, (int(ctr[C_REQUEUED_AT]) + j) % cap]
            tokens += int(reqi[REQ_PROMPT, req] + reqi[REQ_OUTPUT, req])
        return tokens

    def records(self) -> ReplicaRecords:
        st = self.state
        paged = self.scheduler.paged
        values, weights = st.buffers.itl()
        return ReplicaRecords(st.recf[REC_SCHEDULED], st.recf[REC_FIRST_TOKEN], st.recf[REC_FINISH],
                              st.reci[REC_DECODE_STEPS], st.reci[REC_DRAFTED], st.reci[REC_ACCEPTED],
                              st.buffers.step_columns(paged), values, weights,
                              st.reci[REC_PREEMPTIONS] if paged else None,
                              st.reci[REC_CACHED] if paged else None,
                              scheduler_counters(st.ctr, st.par) if paged else None)


def scheduler_counters(ctr: np.ndarray, par: np.ndarray) -> dict:
    """The vllm-v1 scheduler's run totals: the prefix cache's queries and hits, the peak KV blocks."""
    from sim.scheduler.layout import C_CACHE_HITS, C_CACHE_QUERIES, C_PEAK_BLOCKS, C_RESUME_HITS, C_RESUME_QUERIES

    return {"prefix_cache_queries": int(ctr[C_CACHE_QUERIES]), "prefix_cache_hits": int(ctr[C_CACHE_HITS]),
            "resumed_prefix_cache_queries": int(ctr[C_RESUME_QUERIES]),
            "resumed_prefix_cache_hits": int(ctr[C_RESUME_HITS]), "peak_kv_blocks": int(ctr[C_PEAK_BLOCKS])}


def checked_k(k, k_max: int, policy: Policy, running: int):
    """A policy's bad answer ends the run with one line naming it (and nothing written).

    Returns an int k, or for a per-sequence answer an int64 array of ``running`` values
    (collapsed to an int when they are all equal, which runs exactly as that int).
    """
    if isinstance(k, np.ndarray):
        return checked_ks(k, k_max, policy, running)
    if isinstance(k, (bool, float)) or not isinstance(k, (int, np.integer)):
        raise InputError(f"policy '{policy.name}' returned k = {k!r}; it must return an int", field="policy.name")
    if not 0 <= int(k) <= k_max:
        raise InputError(f"policy '{policy.name}' returned k = {int(k)}, outside 0..{k_max} "
                         "(its max_k, within what the profile measured)", field="policy.name")
    return int(k)


def checked_ks(ks: np.ndarray, k_max: int, policy: Policy, running: int):
    """:func:`checked_k` for a per-sequence answer."""
    where = f"policy '{policy.name}' returned per-sequence k"
    if ks.dtype.kind not in "iu":
        raise InputError(f"{where} of dtype {ks.dtype}; it must be an integer array", field="policy.name")
    if ks.shape != (running,):
        raise InputError(f"{where} of shape {ks.shape}; it must have one k per running sequence, "
                         f"shape ({running},)", field="policy.name")
    lo, hi = int(np.minimum.reduce(ks)), int(np.maximum.reduce(ks))
    if lo < 0 or hi > k_max:
        raise InputError(f"{where} in {lo}..{hi}, outside 0..{k_max} "
                         "(its max_k, within what the profile measured)", field="policy.name")
    if lo == hi:
        return hi
    return ks.astype(np.int64)  # a copy: the policy may reuse its array
