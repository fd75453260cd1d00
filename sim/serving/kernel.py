"""A compiled run: the step (sim/serving/step.py) in a loop, many steps of one replica in one call.

:func:`run_steps` calls :func:`sim.serving.step.begin`, the policy's compiled choice
(:func:`choose`: a k per batch size, goodput's argmax, :mod:`policies.goodput_rules`, SGLang's
ladder, :mod:`policies.ladder_rules`, or the context table's grid, :mod:`policies.context_rules`),
``plan``, ``price``, ``draw`` and ``update``: the functions the step-by-step loop
(sim/serving/loop.py) calls around a Python policy and a backend, so its records are the loop's
to the bit (tests/test_decode_runs.py). sim/serving/compiled.py says when it runs and hands it
the state.

It returns to the clock:

* ``ARRIVAL``: the next step would end at or after ``stop_at`` (a routing decision in a
  cluster: something outside the replica must see the state first); that step is planned,
  priced and drawn, its end left in ``clk[PENDING_END]``, and :func:`finish_pending` applies it
  once the clock is there;
* ``REFILL``: the record buffers or the draws need more room;
* ``IDLE``: nothing to run (a timed queue: nothing will ever arrive again; otherwise until the
  dispatcher hands the replica a request);
* ``LIMIT``: ``max_steps`` steps were taken.

A replica whose arrivals are all known (``timed``) releases them itself, so a single replica
runs from its first arrival to its last finish in a handful of calls; idle, its clock waits for
the next arrival as a single replica's SimPy clock does (``exact_delay``), or, run apart from a
round-robin cluster (``AS_ROUTED``), wakes where the routed cluster's replica would: from the time it
went idle, ``t + (arrival - t)`` repeated while short of the arrival (an ulp either side of it,
where no delay lands on it).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from policies.base import BY_BATCH_SIZE, CONTEXT_RULE, GOODPUT_RULE, LADDER_RULE
from policies.context_rules import table_k
from policies.goodput_rules import EXPECTED, MARGIN, choose_priced, fade, observe_rows
from policies.ladder_rules import learn, play
from sim.costmodel.rules import blend, catch_up_price
from sim.scheduler.layout import (ARRIVAL, C_ARRIVED, C_DRAW_POS, C_ITL_END, C_ITL_POS, C_OFFERED_K, C_PHASE, C_REC_END,
                                  C_REC_POS, C_STEP_K, C_STEPS, IDLE, LIMIT, NOW, PENDING_END, REFILL,
                                  ROW_REMAINING, S_ROW_K)
from sim.scheduler.work import has_work
from sim.serving.rules import exact_delay, routed_wake, step_rows_stats
from sim.serving.step import begin, decode_rows, draw, plan, price, update

# How a run picks k, as the policy's compiled_form says: a table by batch size, goodput's argmax, SGLang's
# adaptive ladder, or a table by batch size and mean context.
STATIC_K, GOODPUT_K, LADDER_K, CONTEXT_K = BY_BATCH_SIZE, GOODPUT_RULE, LADDER_RULE, CONTEXT_RULE
# ``timed``: the arrivals are not the run's to release (0), are (TIMED), and an idle replica wakes for the
# next as a routed replica does (AS_ROUTED: a round-robin replica run apart, sim/cluster.py).
TIMED, AS_ROUTED = 1, 2


class Chooser(NamedTuple):
    """A policy's compiled form (policies.base.CompiledForm) with the scratch its rule needs."""

    kind: int  # STATIC_K, GOODPUT_K, LADDER_K or CONTEXT_K
    k_by_batch: np.ndarray  # STATIC_K: the k of each charged batch size; LADDER_K: its slot; CONTEXT_K: its column
    scalars: np.ndarray  # goodput's and the ladder's state, read and updated in place; CONTEXT_K: the band edges
    rows: np.ndarray  # goodput's per-position rows, the ladder's slots, or CONTEXT_K's grid
    catch_up: bool  # goodput prices the draft's catch-up
    k_max: int
    prices: np.ndarray
    scratch: np.ndarray


def choose(s, p, c, b, charged, context):
    """The policy's k for the ``b`` rows :func:`~sim.serving.step.begin` offered (its view)."""
    if c.kind == STATIC_K:
        return c.k_by_batch[charged]
    if c.kind == LADDER_K:
        return play(c.scalars, c.rows, c.k_by_batch[charged])
    if c.kind == CONTEXT_K:
        return table_k(c.rows, c.scalars, c.k_by_batch[charged], context)
    x = context / p.context_step
    for k in range(c.k_max + 1):  # Goodput.choose_k: the step table's price of each candidate
        c.prices[k] = blend(p.decode[charged][k], x)
    catch_up = recurring = 0.0
    horizon = 0.0
    if c.catch_up and s.track_lag:
        total, lag = step_rows_stats(s.batch.rows, b, s.track_lag)
        if lag > 1:
            catch_up = catch_up_price(p.catch_up[charged], lag, x)
            recurring = catch_up if lag == 2 else catch_up_price(p.catch_up[charged], 2, x)
            remaining = 0
            for i in range(b):
                remaining += s.batch.rows[ROW_REMAINING, i]
            horizon = remaining / b
    return choose_priced(c.prices, c.rows[EXPECTED], catch_up, recurring, horizon, c.scalars[MARGIN], c.k_max)


def start_step(s, p, c, proposer, d, now):
    """Schedule, choose, plan, price and draw one step; returns its duration."""
    b, charged, context = begin(s)
    k = choose(s, p, c, b, charged, context) if b else 0
    if plan(s, b, k, False, proposer, now)[0] < 0:
        return 0.0  # NOTHING, or stuck (the caller raises)
    dt = price(s, p)
    draw(s, d)
    return dt


def finish_step(s, c, proposer, out, start, end):
    """Apply the step :func:`start_step` planned; goodput and the ladder learn from it. Returns the requests
    finished."""
    m = decode_rows(s)
    finished = update(s, out, start, end, False)[0]
    k = s.counters[C_STEP_K] if m else 0
    offered = s.counters[C_OFFERED_K] if proposer.mode else k  # a host matcher's misses are learnt from too
    if m and c.kind == GOODPUT_K:
        if offered:
            observe_rows(c.scalars, c.rows, s.batch.accepted, s.sched[S_ROW_K], m, c.k_max, c.scratch)
        else:  # a step at k = 0 tests nothing: the estimates drift back towards the prior
            fade(c.scalars, c.rows, c.k_max)
    elif m and c.kind == LADDER_K:
        kept = 0
        for i in range(m):
            kept += s.batch.accepted[i]
        learn(c.scalars, c.rows, kept / m, offered)  # (its mean as the policy's observe takes it)
    return finished


def run_steps(s, p, c, proposer, d, out, arrivals, timed, stop_at, max_steps, itl_room):
    """Steps from ``clk[NOW]`` until a stop (the module docstring); returns the reason."""
    ctr, clk = s.counters, s.clocks
    n_draws = d.ints.shape[0] if d.kind == 0 else d.floats.shape[0]
    cap = s.batch.rows.shape[1]
    while True:
        now = clk[NOW]
        if timed:
            arrived = ctr[C_ARRIVED]
            while arrived < arrivals.shape[0] and arrivals[arrived] <= now:
                arrived += 1
            ctr[C_ARRIVED] = arrived
        if not has_work(ctr):
            if timed and ctr[C_ARRIVED] < arrivals.shape[0]:
                at = arrivals[ctr[C_ARRIVED]]
                # where a routed replica wakes, or the single replica's clock lands (its idle wait, to the bit)
                clk[NOW] = routed_wake(now, at) if timed == AS_ROUTED else now + exact_delay(now, at)
                continue
            return IDLE
        if ctr[C_STEPS] >= max_steps:
            return LIMIT
        if (ctr[C_REC_POS] + 1 > ctr[C_REC_END] or ctr[C_ITL_POS] + itl_room > ctr[C_ITL_END]
                or ctr[C_DRAW_POS] + cap > n_draws):
            return REFILL
        dt = start_step(s, p, c, proposer, d, now)
        if ctr[C_PHASE] < 0:
            return IDLE  # cannot happen: has_work said there was something (the caller raises)
        end = now + dt
        if end >= stop_at:
            clk[PENDING_END] = end
            return ARRIVAL
        finish_step(s, c, proposer, out, now, end)
        clk[NOW] = end
        ctr[C_STEPS] += 1


def finish_pending(s, c, proposer, out):
    """Apply the step :func:`run_steps` left in flight (the clock is now at its end)."""
    clk = s.clocks
    end = clk[PENDING_END]
    finish_step(s, c, proposer, out, clk[NOW], end)
    clk[NOW] = end
    s.counters[C_STEPS] += 1


RULES = (choose, start_step, finish_step, run_steps, finish_pending)
INLINED = (choose, start_step, finish_step)  # compiled into their callers (sim/jit.py)
# Called by other kernels through their own cached entry points (sim/jit.py): compiled once, not into each caller
LINKED = (run_steps, finish_pending)
