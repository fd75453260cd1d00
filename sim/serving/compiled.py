"""Compiled runs: stretches of a replica's steps in one numba call, when nothing outside it needs each step.

Stepping a replica through Python costs some microseconds a step in calls and checks, most
of it spent on work no one outside the replica looks at: the same rules applied to the same
arrays step after step. :class:`CompiledRuns` hands the loop's state to
:func:`sim.serving.kernel.run_steps`, which applies those rules in a loop (one implementation:
sim/jit.py), and returns to the clock only when something outside the replica must see its
state (the next routing decision in a cluster), when its buffers need room, or when it is idle.
A single replica releases its own arrivals, so it runs from its first arrival to its last
finish in a few calls.

It runs where the kernel can make every decision the step-by-step loop would, identically
(``tests/test_decode_runs.py`` compares every record): a policy whose k depends on the batch
size alone (fixed, none, lut), ``goodput`` (batch-level, pricing with the run's own step
table), ``sglang-adaptive`` (SGLang's ladder) or ``context`` (a table by batch size and mean
context): each says so itself (:meth:`~policies.base.Policy.compiled_form`); a sampler whose draws
the kernel makes from its buffer (the shared-alpha, per-request alpha and per-position models:
``draws_compiled``, without per-request speculation metrics: ``RecordingSampler.compilable``); a
backend that prices steps as the kernel does (``steps_compiled``: the simulator's own); a queue
whose sends do not wait on finishes (not a client with a concurrency limit). Each says so itself,
and a subclass that changes how a step is executed or drawn runs step by step unless it declares
otherwise. Anything else runs step by step, with the same rules compiled.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from policies.base import BY_BATCH_SIZE, CONTEXT_RULE, GOODPUT_RULE, LADDER_RULE, CompiledForm
from sim.jit import direct
from sim.serving import kernel
from sim.serving.priced import prices_of
from sim.serving.step import Draws
from sim.scheduler.layout import ARRIVAL, C_DRAW_POS, C_STEPS, IDLE, MANY, NOW, PENDING_END, REFILL
from sim.serving.records import ITL_ROOM, RECORD_ROOM


def policy_form(policy, max_batch: int, k_max: int, cost_model=None) -> CompiledForm | None:
    """The policy's own word on how a compiled run makes its choices (:meth:`~policies.base.Policy.compiled_form`),
    with a table's ks checked as the loop checks each answer; None: it runs step by step."""
    form = policy.compiled_form(max_batch, cost_model)
    if form is not None and form.rule in (LADDER_RULE, CONTEXT_RULE) and policy.max_k > k_max:
        return None  # a k beyond what the run may draft: step by step, which refuses it when it is chosen
    if form is None or form.rule != BY_BATCH_SIZE:
        return form
    from sim.serving.loop import checked_k
    ks = np.array([checked_k(k, k_max, policy, 1) for k in form.k_by_batch.tolist()], dtype=np.int64)
    return replace(form, k_by_batch=ks)


class CompiledRuns:
    """One loop's compiled runs: the kernel's arguments besides the loop's own state."""

    def __init__(self, loop, table, sampler, form: CompiledForm) -> None:
        self.loop = loop
        self.sampler = sampler  # the RecordingSampler: its source's draw buffer is read in place
        self.source = sampler.inner
        # The policy's choice as the kernel makes it: a k by batch size, or a rule the kernel knows over the
        # policy's own arrays (goodput's, SGLang's ladder, the context grid: the kernel chooses and learns).
        k_max = form.k_max if form.rule == GOODPUT_RULE else table.k_max
        self.chooser = kernel.Chooser(form.rule, form.k_by_batch, form.scalars, form.rows, form.catch_up, k_max,
                                      np.zeros(k_max + 1), np.zeros((2, k_max + 2), dtype=np.int64))
        self.prices = prices_of(table)
        self.counts = np.zeros(table.k_max + 1, dtype=np.int64)  # accepted-count tally, folded into the sampler's
        sampler.add_tally(self.counts)
        queue = loop.queue
        self.arrivals = queue.arrival_times if queue.timed else np.zeros(0)
        self.timing = (kernel.AS_ROUTED if queue.wakes_as_routed else kernel.TIMED) if queue.timed else 0
        self._pending = False
        self._no_ints, self._no_floats = np.zeros(0, np.int64), np.zeros(0)
        self._draws = None  # the draws as the kernel reads them, rebuilt when the sampler's buffer is replaced
        self.stop = None  # a threading.Event: set, the run stops at its next return (replicas run on threads)
        # Called at every routing decision of a cluster: straight to the compiled entry points (sim.jit).
        self._run, self._finish = direct(kernel.run_steps), direct(kernel.finish_pending)

    def run(self, now: float, stop_at: float) -> float:
        """Step from ``now`` until the kernel stops (the module docstring). Returns the end of the last
        step taken: applied, or still in flight when it would end at or after ``stop_at`` (then
        :meth:`finish`, called once the clock is there, applies it)."""
        loop, st = self.loop, self.loop.state
        st.clk[NOW] = now
        st.ctr[C_STEPS] = 0
        cap = loop.scheduler.max_batch_size
        itl_room = 2 * cap + 1
        while True:
            draws = self.draws()
            st.buffers.room(RECORD_ROOM, ITL_ROOM + itl_room)
            reason = self._run(st.arrays(), self.prices, self.chooser, loop.proposer, draws, st.records(),
                               self.arrivals, self.timing, stop_at, MANY, itl_room)
            self.settle()
            if reason != REFILL:
                break
            if self.stop is not None and self.stop.is_set():
                raise RunStopped("stopped: another replica failed, or the run was interrupted")
        if reason == IDLE and loop.has_work():
            raise RuntimeError("a waiting request can never be admitted (checked before the run)")
        self._pending = reason == ARRIVAL
        return float(st.clk[PENDING_END] if self._pending else st.clk[NOW])

    def draws(self) -> Draws:
        """The draws as the kernel reads them, with room for a step of the largest batch from
        ``C_DRAW_POS`` on (the sampler's buffer, refilled as drawing would)."""
        st = self.loop.state
        buffer, pos = self.source.reserve(self.loop.scheduler.max_batch_size)
        st.ctr[C_DRAW_POS] = pos
        draws = self._draws
        if draws is None or (draws.ints is not buffer and draws.floats is not buffer):
            shared = buffer.dtype.kind == "i"
            draws = self._draws = Draws(self.source.kind, buffer if shared else self._no_ints,
                                        self._no_floats if shared else buffer, self.source.negative_rates,
                                        self.counts)
        return draws

    def settle(self) -> None:
        """The sampler's next draw is where the kernel left ``C_DRAW_POS``."""
        self.source.advance(int(self.loop.state.ctr[C_DRAW_POS]))

    def finish(self) -> None:
        """Apply the step left in flight by :meth:`run`, if any (its plan and draws are as they were)."""
        if self._pending:
            self._pending = False
            loop, st = self.loop, self.loop.state
            st.buffers.room(1, 2 * loop.scheduler.max_batch_size + 1)
            self._finish(st.arrays(), self.chooser, loop.proposer, st.records())


class RunStopped(Exception):
    """A compiled run told to stop (:attr:`CompiledRuns.stop`) while its cluster was ending."""


def compiled_runs_for(loop, table, sampler, jit: bool) -> CompiledRuns | None:
    """The loop's compiled runs, or None where they do not apply (module docstring) or are not wanted."""
    return compiled_steps_for(loop, table, sampler, jit) if loop.queue.compilable else None


def compiled_steps_for(loop, table, sampler, jit: bool) -> CompiledRuns | None:
    """:func:`compiled_runs_for` whatever the queue: for a caller that runs the queue's part itself, in
    compiled code (a disaggregated cluster: sim/serving/pd_kernel.py)."""
    if not jit or not loop.backend.steps_compiled or not sampler.compilable:
        return None
    form = policy_form(loop.policy, loop.scheduler.max_batch_size, loop.k_max, table)
    return None if form is None else CompiledRuns(loop, table, sampler, form)

