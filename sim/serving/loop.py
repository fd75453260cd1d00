"""One replica's serving loop, step by step: the step (sim/serving/step.py) around a Python policy and backend.

A clock driver (:mod:`sim.serving.clock`) calls, per step (nano-vllm's ``step()``):

* :meth:`ServingLoop.start_step`: *schedule*: the scheduler's first look
  (:func:`~sim.serving.step.begin`), the policy's k for the running rows (an int, or one k per
  row: a *ragged* step, run padded to the largest, as vLLM and TensorRT-LLM run it), the plan
  (:func:`~sim.serving.step.plan`: v0's prefill or decode, vllm-v1's mixed step under a token
  budget); then *execute*: the :class:`StepBackend` runs the :class:`~sim.serving.plan.Plan`:
  prices it (the simulator: its duration is returned and the clock waits it out) or runs it
  (the real replay: the clock measures it), and says how many draft tokens each row keeps;
* :meth:`ServingLoop.finish_step`: *apply*: :func:`~sim.serving.step.update` (tokens emitted,
  prefilled requests join the rows, finished rows retire and give their KV back, the step is
  recorded), then the backend and the policy hear of it.

A compiled run (sim/serving/kernel.py) calls the same step functions with the policy's compiled
form in between, many steps per call. The rules are interpreted or compiled (``engine.jit``,
sim/jit.py); per step the Python work here is a few calls, whatever the batch's size.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from policies.base import BatchView, Policy, StepFeedback
from sim.errors import InputError
from sim.jit import compiled, direct
from sim.scheduler.layout import (C_HELD_BLOCKS, C_OFFERED_K, C_PREEMPTED_NOW, C_PREFILLING, C_RESERVED, C_RUNNING,
                                  NOTHING, REC_ACCEPTED, REC_CACHED, REC_DECODE_STEPS, REC_DRAFTED, REC_FINISH,
                                  REC_FIRST_TOKEN, REC_PREEMPTIONS, REC_SCHEDULED, ROW_CONTEXT, ROW_LAG,
                                  ROW_REMAINING)
from sim.scheduler import kvcache
from sim.scheduler.v0 import STUCK
from sim.scheduler.work import can_step, has_work
from sim.speculation import proposals as proposal_rules
from sim.serving import routing, step
from sim.serving.plan import Plan
from sim.serving.records import ReplicaRecords
from sim.serving.state import ReplicaState


class StepBackend(Protocol):
    """What executes a step: prices it (simulated time) or runs it (measured time).

    ``run`` takes the step's :class:`~sim.serving.plan.Plan` and returns its duration in seconds
    (None when the step really ran and the clock measures it) and the draft tokens each decoded
    row kept (None when no row drafted). Backends that keep per-row state of their own (KV caches)
    set ``follows_rows`` and are told what the loop applied. ``steps_compiled``: a compiled run
    (sim/serving/kernel.py) prices the steps exactly as this backend would, so it may take
    stretches of them in one call.
    """

    follows_rows: bool
    steps_compiled: bool

    def run(self, plan: Plan) -> tuple[float | None, np.ndarray | None]: ...

    def watch(self, queue) -> None:
        """Called with the replica's queue before the run (a playback releases it as recorded)."""

    def commit(self) -> None:
        """The decode step's outcome is final: write its tokens (follows_rows only)."""

    def retire(self, done: np.ndarray) -> None:
        """Rows flagged in ``done`` (over the rows before, in order) have left (follows_rows only)."""


class Rules:
    """The step's functions as a loop calls them, interpreted or compiled (sim/jit.py): one source either way."""

    def __init__(self, compile_them: bool) -> None:
        self.compiled = compile_them
        pick = compiled if compile_them else _as_written
        # The step's functions take the replica's state first, the same object step after step.
        per_step = direct if compile_them else _as_written
        self.begin, self.plan, self.update = per_step(step.begin), per_step(step.plan), per_step(step.update)
        self.count_accepted = pick(proposal_rules.count_accepted)
        self.release_held = pick(kvcache.release_held)  # a disaggregated prefill replica's blocks, once read
        self.runlength_accepted = pick(proposal_rules.runlength_accepted)


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
        self.tracks_lag = lag_mode if policy.max_k > 0 else 0  # a run with a drafter that lags pays its catch-up
        self.state = state = ReplicaState(scheduler, queue.capacity, max_blocks_per_request, num_keys)
        state.bind(queue, self.tracks_lag)
        queue.bind(state.ctr)
        queue.on_grow = state.grow
        self.plan = Plan(state, queue)
        self.view = BatchView(k_max)
        self.feedback = StepFeedback()
        self._final = np.zeros(scheduler.max_batch_size, dtype=np.int64)  # the view's final contexts
        self._observes = policy.observes  # feedback is filled in only for policies that listen
        self.proposals = proposals  # sim.speculation.acceptance.ProposalModel: rows propose only where they match (None: always)
        self.proposer = proposer_of(proposals)
        self._follows = backend.follows_rows
        self.compiled_runs = None  # sim.serving.compiled.CompiledRuns, when stretches of steps run compiled
        self._dt = None
        self._carried_preemptions = 0

    def close(self) -> None:
        """Break the references that point back at this loop (its compiled runs, the queue's growth
        hook), so that dropping the loop frees its arrays at once, not at the next full collection."""
        self.compiled_runs = None
        self.queue.on_grow = None

    def drop_inputs(self) -> None:
        """The run is over and only its records are read from here on: let its requests' inputs go (the
        queue keeps its count). A cluster whose replicas ran apart, each on a copy of its share, merges
        their records in the room."""
        self.state.bind(None, self.state.track_lag)
        self.queue.drop_inputs()

    # ------------------------------------------------------------ schedule + execute
    def has_work(self) -> bool:
        """Whether a step can start now (else the replica waits for an arrival): sim.scheduler.work."""
        ctr = self.state.ctr
        if not has_work(ctr):
            return False
        if (ctr[C_HELD_BLOCKS] or ctr[C_RESERVED]) and not (ctr[C_RUNNING] or ctr[C_PREFILLING]):
            return bool(can_step(self.state.arrays()))  # blocks held for KV transfers (sim/disaggregated.py)
        return True

    def start_step(self, now: float) -> float | None:
        """Plan the next step and run it: its duration (None: it ran and the clock measures it)."""
        st, r = self.state, self.rules
        st.buffers.room(1, 2 * self.scheduler.max_batch_size + 1)
        s = st.arrays()
        b, charged, context = r.begin(s)
        k, ragged = self._choose_k(now, int(b), int(charged), float(context)) if b else (0, False)
        phase, m = r.plan(s, b, k, ragged, self.proposer, float(now))
        if self._carried_preemptions:  # made by a plan that ran nothing (below): this step records them
            st.ctr[C_PREEMPTED_NOW] += self._carried_preemptions
            self._carried_preemptions = 0
        self.plan.planned(phase, m)
        if phase == STUCK:
            raise RuntimeError("a waiting request can never be admitted (checked before the run)")
        if phase == NOTHING:
            if st.ctr[C_HELD_BLOCKS] or st.ctr[C_RESERVED]:
                # Blocks held for KV transfers (sim/disaggregated.py) made the only running request preempt
                # itself: no step runs now; the replica plans again at once, or waits (has_work says which)
                # for a transfer to give blocks back.
                self._carried_preemptions = int(st.ctr[C_PREEMPTED_NOW])  # with any carried before
                self._dt = 0.0
                return 0.0
            raise RuntimeError("a step with nothing to run (the clock checks has_work first)")
        dt, accepted = self.backend.run(self.plan)
        if accepted is not None:
            st.accepted[:accepted.shape[0]] = accepted
        self._dt = dt
        return dt

    def _choose_k(self, now: float, b: int, charged: int, context: float) -> tuple[int, bool]:
        """The policy's k for the b running rows (the view :func:`~sim.serving.step.begin` gives), checked;
        a ragged answer is written into the rows' ks: (largest k, ragged)."""
        st = self.state
        rows = st.rows
        view = self.view
        view.now_s, view.step, view.batch_size, view.running = now, len(st.buffers), charged, b
        view.mean_context_tokens = context
        view.remaining_tokens = rows[ROW_REMAINING, :b]
        view.final_context_tokens = np.add(rows[ROW_CONTEXT, :b], rows[ROW_REMAINING, :b], out=self._final[:b])
        view.lag_tokens = rows[ROW_LAG, :b]
        k = self.policy.choose_k(view)
        if k.__class__ is not int or not 0 <= k <= self.k_max:
            k = checked_k(k, self.k_max, self.policy, b)
            if k.__class__ is not int:  # ragged: one k per sequence, charged padded to the largest
                st.ks[:b] = k
                return int(np.maximum.reduce(k)), True
        return k, False

    # ------------------------------------------------------------------- apply
    def finish_step(self, start: float, end: float) -> None:
        """Apply the step started by :meth:`start_step` (it ran from ``start`` to ``end``)."""
        st, plan = self.state, self.plan
        if plan.phase == NOTHING:  # the step that never was (start_step)
            return
        m = plan.rows
        if m and self._follows:
            self.backend.commit()
        finished, _, accepted, drafted, _, flagged = self.rules.update(st.arrays(), st.records(), float(start),
                                                                      float(end), self._follows)
        if flagged:
            self.backend.retire(st.done[:flagged].copy())
        if m and self._observes:
            self._observe(plan, m, start, end, drafted, accepted)
        if finished:
            self.queue.finished(finished, end)

    def _observe(self, plan: Plan, m: int, start: float, end: float, drafted: int, accepted: int) -> None:
        """The policy hears of the step it chose k for."""
        st = self.state
        fb = self.feedback
        fb.now_s, fb.step, fb.batch_size, fb.k = end, len(st.buffers) - 1, plan.batch_size, plan.k
        partial = self.proposer.mode != 0
        if partial:  # what was offered, and each row's proposal (none: a miss the policy learns from)
            fb.k = int(st.ctr[C_OFFERED_K])
        fb.step_time_s = self._dt if self._dt is not None else end - start
        fb.drafted_tokens, fb.accepted_tokens = drafted, accepted
        fb.accepted_per_sequence = st.accepted[:m] if plan.k or partial else None
        fb.k_per_sequence = plan.ks.copy() if partial else plan.ragged_ks
        self.policy.observe(fb)

    # ------------------------------------------------------------- results
    def outstanding_requests(self) -> int:
        """Given to this replica and not finished (sim/serving/routing.py, the routers' rule)."""
        return int(routing.outstanding_requests(self.state.ctr, self.queue.count))

    def outstanding_tokens(self) -> int:
        """Prompt tokens not yet prefilled plus output tokens not yet emitted, over unfinished requests
        (sim/serving/routing.py)."""
        st = self.state
        return int(routing.outstanding_tokens(st.ctr, st.par, st.sched, self.queue.reqi, st.reci,
                                              self.queue.waiting_tokens()))

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


def proposer_of(proposals) -> step.Proposer:
    """How the step's rows propose (sim.speculation.acceptance.ProposalModel; None: every row proposes its k)."""
    if proposals is None:
        from sim.speculation.acceptance import ALWAYS_PROPOSE
        proposals = ALWAYS_PROPOSE
    p = proposals
    return step.Proposer(int(p.mode), float(p.match_rate), int(p.seed), p.runs, p.start, p.length)


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
