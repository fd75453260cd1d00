"""Decode runs: stretches of decode steps in compiled code, when nothing outside the replica can change them.

Between two arrivals a replica mostly just decodes: the same rows, a k that depends on
the batch size alone (``fixed``, ``none``, a batch-size table) or ``goodput``'s argmax
over the step table with its acceptance estimates learnt step by step, acceptance drawn
from a stream, a price looked up. Stepping that through Python costs ~25 µs a step, most of
it numpy's per-call overhead on arrays of a few dozen rows. :func:`decode_run` runs those
steps in one numba-compiled call instead, applying each exactly as
:meth:`ServingLoop._apply_decode <sim.serving.loop.ServingLoop>` and ``_retire`` do
(same draws in the same order, same float operations), and returns to the clock:

* before a step that would end at or after the next arrival (the clock's next event:
  a request the scheduler could see, or the router's next decision in a cluster), so
  nothing outside the replica ever sees a state the step-by-step loop would not show;
* after a step in which requests finished while others wait (the scheduler may admit);
* when no row is left, or the draw buffer or the record buffers need refilling.

The clock then waits the whole run out in one timeout. Results are byte-identical to
the step-by-step loop (``tests/test_decode_runs.py`` compares every record); what a run
needs is checked by :func:`decode_runs_for`, which answers None (step by step) for
anything else: any other policy that looks at more than the batch size or learns (or
``goodput`` with ``per_request``, or a subclass of it), a timeline,
the vllm-v1 scheduler, a client with a concurrency limit, the trace acceptance model or
per-request speculation metrics, a real replay.

Compiling costs a few seconds once (cached on disk by numba) and loading the cached
code ~0.5 s per process, so ``engine.jit = "auto"`` uses it only for runs of at least
:data:`AUTO_MIN_REQUESTS` requests; ``"on"`` always (when numba is installed), ``"off"``
never.
"""

from __future__ import annotations

import math

import numpy as np

from sim.serving.decode_state import (ACCEPTED_AVG, ALPHA, ARRIVAL, DRAW_POS, EXPECTED, GOODPUT_K, ITL_POS,
                                      LAST_DECODE_END, MANY, MARGIN, N_GOODPUT_STATE, N_INT_STATE, NOW, PENDING_END,
                                      POS_ACCEPTED, POS_RATES, POS_TESTED, POSITIONS, PRICES_CATCH_UP, PRIOR, REC_POS,
                                      REFILL, SCALED, SHARED, SMOOTHING, STATIC_K, TESTED_AVG)

JIT_MODES = ("auto", "on", "off")
AUTO_MIN_REQUESTS = 20_000  # measured (docs/performance.md): below this, loading the code costs more than it saves

RECORD_ROOM = 4096  # step records one kernel call may write before it returns for more room
ITL_ROOM = 8192  # ... and inter-token gaps (plus one per running row)

_KERNEL = None


def kernel():
    """The compiled :func:`decode_run` (numba imported and the code loaded on first use)."""
    global _KERNEL
    if _KERNEL is None:
        from sim.serving._decode_kernel import decode_run
        _KERNEL = decode_run
    return _KERNEL


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def wanted(mode: str, num_requests: int) -> bool:
    """Whether a run of ``num_requests`` under ``engine.jit = mode`` should use decode runs."""
    if mode == "off" or (mode == "auto" and num_requests < AUTO_MIN_REQUESTS):
        return False
    return numba_available()


def static_k_table(policy, max_batch: int, k_max: int) -> np.ndarray | None:
    """The policy's k per charged batch size 0..max_batch, when its choice depends on nothing else
    and it learns nothing; None otherwise. A subclass that overrides ``choose_k`` (or ``observe``)
    without its own ``k_by_batch_size`` is not trusted with its parent's table."""
    from policies.base import Policy

    cls = type(policy)
    if cls.observe is not Policy.observe:
        return None
    defined = {name: next(c for c in cls.__mro__ if name in c.__dict__) for name in ("choose_k", "k_by_batch_size")}
    if not issubclass(defined["k_by_batch_size"], defined["choose_k"]):
        return None
    ks = policy.k_by_batch_size(max_batch)
    if ks is None:
        return None
    from sim.serving.loop import checked_k
    return np.array([checked_k(k, k_max, policy, 1) for k in ks], dtype=np.int64)


def compiled_goodput(policy, table) -> bool:
    """Whether the kernel can stand in for this policy: ``goodput`` itself (not a subclass), batch-level
    (``per_request`` answers per sequence), pricing with this very step table."""
    from policies.goodput import Goodput

    return (type(policy) is Goodput and not policy.per_request and policy._step_time == table.step_time
            and policy._catch_up in (None, table.catch_up_time))


class GoodputState:
    """Goodput's learnt state as the kernel reads and updates it, and back (:meth:`store`)."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.scalars = np.zeros(N_GOODPUT_STATE)
        self.rows = np.zeros((4, policy.k_max + 1))
        self.kept = np.zeros(policy.k_max + 2, dtype=np.int64)  # the kernel's per-step tally
        self.load()

    def load(self) -> None:
        p, g, rows = self.policy, self.scalars, self.rows
        g[ACCEPTED_AVG], g[TESTED_AVG], g[ALPHA] = p._accepted_avg, p._tested_avg, p._alpha
        g[SMOOTHING], g[PRIOR], g[MARGIN] = p.smoothing, p._prior, p._margin
        g[PRICES_CATCH_UP] = p._catch_up is not None
        k_max = p.k_max
        rows[POS_ACCEPTED, :k_max], rows[POS_TESTED, :k_max] = p._position_accepted, p._position_tested
        rows[POS_RATES, :k_max] = p._rates
        rows[EXPECTED] = p._expected

    def store(self) -> None:
        p, g, rows = self.policy, self.scalars, self.rows
        p._accepted_avg, p._tested_avg, p._alpha = float(g[ACCEPTED_AVG]), float(g[TESTED_AVG]), float(g[ALPHA])
        k_max = p.k_max
        p._position_accepted[:], p._position_tested[:] = rows[POS_ACCEPTED, :k_max], rows[POS_TESTED, :k_max]
        p._rates = rows[POS_RATES, :k_max].copy()
        p._expected = rows[EXPECTED].tolist()


class DecodeRuns:
    """One loop's compiled decode runs: what the kernel needs besides the loop's own arrays."""

    def __init__(self, loop, table, sampler, k_by_batch: np.ndarray | None) -> None:
        self.loop = loop
        self.sampler = sampler  # the RecordingSampler: its inner sampler's buffer is read in place
        self.inner = sampler.inner
        from sim.acceptance import AcceptanceSampler, PositionSampler, SharedAlphaSampler

        self.kind = {SharedAlphaSampler: SHARED, AcceptanceSampler: SCALED, PositionSampler: POSITIONS}[type(self.inner)]
        if k_by_batch is None:  # goodput: the kernel makes the policy's choices and does its learning
            self.goodput = GoodputState(loop.policy)
            self.policy_kind, self.k_by_batch = GOODPUT_K, np.zeros(1, dtype=np.int64)
            self._goodput_args = (self.goodput.scalars, self.goodput.rows, self.goodput.kept)
        else:  # k by the batch size
            self.goodput = None
            self.policy_kind, self.k_by_batch = STATIC_K, k_by_batch
            self._goodput_args = (np.zeros(N_GOODPUT_STATE), np.zeros((4, 1)), np.zeros(2, dtype=np.int64))
        self.decode, self.lag2, self.catch_up = table.decode.array, table.decode_lag2.array, table.catch_up.array
        self.context_step = float(table.context_step)
        self.neg_rates = getattr(self.inner, "_neg_rates", np.zeros(0))
        self.counts = np.zeros(table.k_max + 1, dtype=np.int64)  # accepted-count tally, folded into the sampler's
        sampler.add_tally(self.counts)
        self.ints = np.zeros(N_INT_STATE, dtype=np.int64)
        self.floats = np.zeros(3)
        self._pending = False
        self._empty_i, self._empty_f = np.zeros(0, np.int64), np.zeros(0)
        self.static = loop.scheduler.name == "static"
        self._run = kernel()

    def run(self, now: float, stop_at: float) -> float:
        """Decode from ``now`` until the kernel stops (module docstring). Returns the end of the last
        step taken: applied, or still in flight when the next one would end at or after ``stop_at``
        (then :meth:`finish`, called once the clock is there, applies it)."""
        floats = self.floats
        floats[NOW], floats[LAST_DECODE_END] = now, self.loop.last_decode_end
        self._pending = self._steps(stop_at, MANY) == ARRIVAL
        return float(floats[PENDING_END] if self._pending else floats[NOW])

    def finish(self) -> None:
        """Apply the step left in flight by :meth:`run`, if any (its start and draws are as they were)."""
        if self._pending:
            self._pending = False
            self._steps(math.inf, 1)

    def _steps(self, stop_at: float, max_steps: int) -> int:
        loop, inner, ints, floats = self.loop, self.inner, self.ints, self.floats
        queue, steps, itl_values, itl_weights = loop.queue, loop.step_rows, loop.itl_values, loop.itl_weights
        static = loop.scheduler.charged_batch_size(loop.running) if self.static else 0
        waiting = max_steps > 1 and not self.static and queue.arrived > queue.head  # static admits only when empty
        while True:
            b = loop.running
            if inner._pos + b > inner._buffer.shape[0]:
                inner._take(b)  # refill exactly as the sampler would, then give the slice back
                inner._pos -= b
            rec_start, records = steps.open_rows(RECORD_ROOM)
            itl_start, values = itl_values.open_rows(ITL_ROOM + b)
            _, weights = itl_weights.open_rows(ITL_ROOM + b)
            ints[:] = (b, loop.kv_used, loop.fresh, loop.total_remaining, loop.total_final_context,
                       loop.decode_count, loop.k_sum, inner._pos, rec_start, rec_start + RECORD_ROOM,
                       itl_start, itl_start + ITL_ROOM + b, 0)
            draws = inner._buffer
            reason = self._run(
                loop._int_rows, loop._float_rows, ints, floats, self.k_by_batch, static,
                self.decode, self.lag2, self.catch_up, self.context_step, self.kind,
                draws if self.kind == SHARED else self._empty_i, self._empty_f if self.kind == SHARED else draws,
                self.neg_rates, self.counts, loop._tracks_lag,
                loop.finish_s, loop.decode_steps, loop.drafted, loop.accepted, queue.kv_reserve,
                records, values["value"], weights["value"], stop_at, waiting, max_steps, self.policy_kind,
                *self._goodput_args)
            if self.goodput is not None:
                self.goodput.store()
            (loop.running, loop.kv_used, loop.fresh, loop.total_remaining, loop.total_final_context,
             loop.decode_count, loop.k_sum, inner._pos) = ints[:DRAW_POS + 1].tolist()
            written = int(ints[REC_POS]) - rec_start
            steps.close_rows(written)
            itl_values.close_rows(int(ints[ITL_POS]) - itl_start)
            itl_weights.close_rows(int(ints[ITL_POS]) - itl_start)
            if written:
                loop.last_decode_end = float(floats[LAST_DECODE_END])
            if reason != REFILL:
                return reason
            max_steps -= written


def decode_runs_for(loop, table, sampler, mode: str, num_requests: int) -> DecodeRuns | None:
    """The loop's decode runs, or None where they do not apply (module docstring) or are not wanted."""
    from sim.acceptance import AcceptanceSampler, PositionSampler, RecordingSampler, SharedAlphaSampler
    from sim.serving.priced import PricedBackend

    if mode == "on" and not numba_available():
        from sim.errors import InputError
        raise InputError("engine.jit = on needs numba (pip install numba), which is not installed",
                         field="engine.jit")
    if not wanted(mode, num_requests):
        return None
    if type(loop.backend) is not PricedBackend:
        return None
    if loop.scheduler.name not in ("continuous", "static") or loop._on_finish is not None:
        return None
    if not isinstance(sampler, RecordingSampler) or sampler.keyed:
        return None
    if type(sampler.inner) not in (SharedAlphaSampler, AcceptanceSampler, PositionSampler):
        return None
    if compiled_goodput(loop.policy, table):
        return DecodeRuns(loop, table, sampler, None)
    ks = static_k_table(loop.policy, loop.scheduler.max_batch_size, loop.k_max)
    if ks is None:
        return None
    return DecodeRuns(loop, table, sampler, ks)
