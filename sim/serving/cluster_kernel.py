"""A compiled cluster: every replica's steps and the router's decisions in one call, in simulated-time order.

The SimPy cluster (sim/serving/clock.py ``simulate_cluster``) runs each replica as a process whose
compiled runs stop at every routing decision, so a cluster of a million requests returns to
Python a million times. :func:`run_cluster` keeps that whole event order in compiled code, for the
built-in routers (their rules: sim/serving/routing.py) and replicas that run compiled
(sim/serving/compiled.py):

* each replica is a ``Replica`` state (sim/serving/step.py) run by :func:`~sim.serving.kernel.run_steps`,
  as one replica is, from its time until the first step that ends at or after the next arrival
  (that step is planned, priced and drawn, and applied at its end: the SimPy process's run);
* the next event is the earliest of the replicas' (a step in flight ending, an idle replica
  woken by a request) and the router's wake-up (``router_at``: its own chain of timeouts, one per
  arrival time); whichever comes first at or after an arrival routes every arrival up to its
  time, before any replica applies a step ending then (the Dispatcher's rule);
* a request routed to an idle replica wakes it where the SimPy clock does (``_until_routed``:
  the instant it was routed, or the float a single replica idle since then reaches), so a
  one-replica cluster is the single replica to the bit.

Replicas' events before the next arrival touch nothing another replica or the router reads, so
each replica runs ahead to it alone; round-robin reads nothing, so there each replica runs ahead
to the next request routed to it (where the router's wake-ups land on every arrival's time, as
they do unless two arrivals' difference does not add back exactly: then every replica stops at
every arrival, as above). The state each replica's run needs is the loop's; the
board (:class:`Board`) holds what the SimPy processes held between events, so that the call can
return to Python (``REFILL``: a replica's record buffers or draws need room; ``GROW``: a queue
is full) and resume exactly where it stopped.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim.scheduler.layout import (ARRIVAL, C_ARRIVED, C_HEAD, C_ITL_END, C_ITL_POS, C_REC_END, C_REC_POS, DONE, IDLE, MANY,
                                  NOW, P_BLOCK, PENDING_END, REFILL, REQ_OUTPUT, REQ_PROMPT, REQ_REMOTE)
from sim.scheduler.work import has_work
from sim.serving.kernel import finish_pending, run_steps
from sim.scheduler.kvcache import usage
from sim.serving.routing import (LEAST_REQUESTS, PREFIX_AWARE, ROUND_ROBIN, first_least, in_turn, outstanding_requests,
                                 outstanding_tokens, prefix_score, prompt_blocks, queue_score, waiting_requests,
                                 weighted_score)
from sim.serving.rules import exact_delay, routed_wake

# What :func:`run_cluster` returns besides layout.py's DONE and REFILL (then ``Board.ctl[WHO]`` names the replica)
GROW, STUCK = DONE + 1, DONE + 2
# Board.ctl (FIRST: the pool's first replica in the fleet's tuples; 0 but for a disaggregated decode pool)
ROUTED, TURN, REPLICAS, WHO, FIRST = range(5)
# Board.status: a replica's step in flight (its end in ``at``), ready to run at ``at``, idle, woken for ``at``
BUSY, READY, IDLE_WAIT, WAKING = range(4)


class Board(NamedTuple):
    """What the cluster's processes hold between events (the replicas' own state is theirs)."""

    ctl: np.ndarray  # ROUTED, TURN (round-robin's next), REPLICAS, WHO, FIRST
    status: np.ndarray  # per replica: BUSY, READY, IDLE_WAIT or WAKING
    count: np.ndarray  # per replica: requests routed to it (its queue's length)
    room: np.ndarray  # per replica: what its queue's arrays hold
    at: np.ndarray  # per replica: the time of its next event (inf: idle)
    idle_since: np.ndarray  # per replica: when it went idle
    router_at: np.ndarray  # [the router's next wake-up] (inf: every request routed)
    loads: np.ndarray  # per replica: what the router weighs (scratch)
    inbound: np.ndarray  # per replica: requests and tokens on their way to it, which the router counts as its
    # own (a disaggregated decode pool: sim.cluster.InboundSignals); zeros elsewhere


class Fleet(NamedTuple):
    """Per replica (tuples of one type, padded past the replicas): its state, records, draws, policy, proposer
    and queue (request ids, and the prompt and output tokens of the requests before each position)."""

    states: tuple
    records: tuple
    draws: tuple
    choosers: tuple
    proposers: tuple
    ids: tuple
    cum_tokens: tuple

    @property
    def pinned(self) -> "Fleet":
        """The fleet as a kernel reads it at a replica's number: compiled, each tuple kept in the kernel's
        frame, one replica's entry loaded where it lies (sim/jit.py ``_register_pinned``); here, itself."""
        return self


class Arrivals(NamedTuple):
    """The cluster's requests, as the dispatcher holds them, and the router's rule."""

    arrivals: np.ndarray
    inputs: np.ndarray
    scale: np.ndarray
    rule: int  # sim/serving/routing.py: ROUND_ROBIN, LEAST_REQUESTS, LEAST_TOKENS or PREFIX_AWARE
    weights: np.ndarray  # prefix-aware's weights: prefix, queue, kv
    ahead: bool  # round-robin, its wake-ups landing on every arrival: a replica runs to its own next request


def run_cluster(b, f, r, p, itl_room):
    """Run the cluster from where the board says until every request has finished (DONE), or a stop
    that Python resolves (REFILL, GROW, STUCK: ``ctl[WHO]`` names the replica)."""
    f = f.pinned  # f.states[i] at a run-time i reads replica i's state alone
    n = b.ctl[REPLICAS]
    total = r.arrivals.shape[0]
    while True:
        i = -1
        t = np.inf
        for j in range(n):
            if b.at[j] < t:
                t = b.at[j]
                i = j
        wake = b.router_at[0]
        if wake <= t and wake < np.inf:  # the router's own wake-up (at a tie, first: it routes before any step applies)
            if route(b, f, r, wake) >= 0:
                return GROW
            routed = b.ctl[ROUTED]
            b.router_at[0] = wake + exact_delay(wake, r.arrivals[routed]) if routed < total else np.inf
            continue
        if i < 0:
            return DONE
        routed = b.ctl[ROUTED]
        if routed < total and r.arrivals[routed] <= t and route(b, f, r, t) >= 0:  # a replica's release
            return GROW
        s = f.states[i]
        ctr = s.counters
        if b.status[i] == BUSY:  # its step in flight ends now: applied after the routing
            if ctr[C_REC_POS] + 1 > ctr[C_REC_END] or ctr[C_ITL_POS] + itl_room > ctr[C_ITL_END]:
                b.ctl[WHO] = i
                return REFILL
            ctr[C_ARRIVED] = b.count[i]
            finish_pending(s, f.choosers[i], f.proposers[i], f.records[i])
        else:
            ctr[C_ARRIVED] = b.count[i]
            s.clocks[NOW] = t
        b.status[i] = READY
        stop_at = next_stop(b, r, i)
        reason = run_steps(s, p, f.choosers[i], f.proposers[i], f.draws[i], f.records[i], r.arrivals, 0,
                           stop_at, MANY, itl_room)
        if reason == ARRIVAL:
            b.status[i] = BUSY
            b.at[i] = s.clocks[PENDING_END]
        elif reason == IDLE:
            if has_work(ctr):
                b.ctl[WHO] = i
                return STUCK
            b.status[i] = IDLE_WAIT
            b.idle_since[i] = s.clocks[NOW]
            b.at[i] = np.inf
        else:  # REFILL: resumed from the same instant
            b.at[i] = s.clocks[NOW]
            b.ctl[WHO] = i
            return REFILL


def next_stop(b, r, i):
    """Where replica ``i``'s run stops: the next arrival (the router reads every replica then), or under
    round-robin, which reads none, the next one routed to ``i``; routed at its own time (``ahead``), it
    sees ``i`` as the SimPy cluster, which stops every replica at every arrival, shows it."""
    routed = b.ctl[ROUTED]
    if r.ahead:
        routed += (i - b.ctl[TURN]) % b.ctl[REPLICAS]
    return r.arrivals[routed] if routed < r.arrivals.shape[0] else np.inf


def route(b, f, r, now):
    """Route every arrival up to ``now``, in order; returns -1, or a replica whose queue is full (nothing
    routed to it yet: Python grows the queue and the call resumes here)."""
    total = r.arrivals.shape[0]
    q = b.ctl[ROUTED]
    while q < total and r.arrivals[q] <= now:
        j = choose(b, f, r, q)
        if b.count[j] == b.room[j]:
            b.ctl[WHO] = j
            return j
        push(b, f, r, j, q, now)
        if r.rule == ROUND_ROBIN:
            b.ctl[TURN] = in_turn(j, b.ctl[REPLICAS])
        q += 1
        b.ctl[ROUTED] = q
    return -1


def choose(b, f, r, q):
    """The router's replica (of the board's pool) for request ``q`` (a column of ``r.inputs``), with the
    replicas' state now (sim/serving/routing.py)."""
    n = b.ctl[REPLICAS]
    if r.rule == ROUND_ROBIN:
        return b.ctl[TURN]
    if r.rule == PREFIX_AWARE:
        return best_scored(b, f, r, n, q)
    loads = b.loads
    first = b.ctl[FIRST]
    for j in range(n):
        s = f.states[first + j]
        if r.rule == LEAST_REQUESTS:
            loads[j] = outstanding_requests(s.counters, b.count[j]) + b.inbound[0, j]
        else:
            cum = f.cum_tokens[first + j]
            loads[j] = outstanding_tokens(s.counters, s.params, s.sched, s.requests.inputs, s.requests.ints,
                                          cum[b.count[j]] - cum[s.counters[C_HEAD]]) + b.inbound[1, j]
    return first_least(loads, n)


def best_scored(b, f, r, n, q):
    """prefix-aware: the replica with the first highest weighted score (sim/router.py PrefixAware)."""
    first = b.ctl[FIRST]
    waiting = b.loads
    for j in range(n):
        waiting[j] = waiting_requests(f.states[first + j].counters, b.count[j]) + b.inbound[0, j]
    longest, shortest = float(waiting[0]), float(waiting[0])
    for j in range(1, n):
        longest = max(longest, float(waiting[j]))
        shortest = min(shortest, float(waiting[j]))
    blocks = prompt_blocks(r.inputs[REQ_PROMPT, q], f.states[first].params[P_BLOCK])
    best, top = 0, -np.inf
    for j in range(n):
        s = f.states[first + j]
        score = weighted_score(r.weights, prefix_score(r.inputs, q, blocks, s.blocks.key_block),
                               queue_score(longest, shortest, float(waiting[j])), usage(s.counters, s.params))
        if score > top:
            best, top = j, score
    return best


def enqueue(b, f, r, j, q):
    """Request ``q`` joins the queue of the pool's replica ``j`` (sim/serving/queues.py RoutedQueue.push)."""
    pos = b.count[j]
    g = b.ctl[FIRST] + j
    s = f.states[g]
    inputs = s.requests.inputs
    for field in range(inputs.shape[0]):
        inputs[field, pos] = r.inputs[field, q]
    s.requests.scale[pos] = r.scale[q]
    f.ids[g][pos] = q
    cum = f.cum_tokens[g]
    cum[pos + 1] = cum[pos] + r.inputs[REQ_PROMPT, q] + r.inputs[REQ_OUTPUT, q] - r.inputs[REQ_REMOTE, q]
    b.count[j] = pos + 1


def push(b, f, r, j, q, now):
    """Request ``q`` joins replica ``j``'s queue (:func:`enqueue`); an idle replica wakes where its SimPy
    process would (sim/serving/clock.py ``_until_routed``)."""
    enqueue(b, f, r, j, q)
    if b.status[j] == IDLE_WAIT:
        t = routed_wake(b.idle_since[j], r.arrivals[q])
        b.at[j] = now + exact_delay(now, t) if t > now else now
        b.status[j] = WAKING


RULES = (run_cluster, next_stop, route, choose, best_scored, enqueue, push)
INLINED = (choose, best_scored, enqueue)  # compiled into their callers (sim/jit.py): a call would pass the fleet
