"""A compiled disaggregated cluster: both pools' steps, the hand-offs and the KV transfers in one call, in
the SimPy run's event order.

The SimPy run (sim/serving/clock.py ``simulate_disaggregated``) steps every replica of both pools one step
at a time, since a prefill replica's finish starts a transfer and routes to a decode replica at its
instant, and a transfer's end may wake either side at any instant. :func:`run_pd` keeps that whole event
order in compiled code, for the vLLM proxy's flow (the decode replica chosen once the prefill is done),
queued links (sim/serving/transfer.py ``KVLinks``), built-in routers (sim/serving/routing.py) and replicas
whose steps run compiled (sim/serving/compiled.py). It follows SimPy's own rule, event by event: an event
queue ordered by time, then priority (a process's start before anything else at its instant), then the
order the events were scheduled in, with one entry per thing SimPy schedules:

* the router's wake-ups at arrival times (``EV_ROUTER``; sim/serving/clock.py ``router_process``);
* each replica's process (``EV_START``, ``EV_STEP``: a step's end, ``EV_WAKE``: an idle replica's wake
  event, ``EV_WAKE_TIMEOUT``: the wait after it to where a single replica would wake;
  clock.py ``_process`` and ``_until_routed``), whose steps are kernel.py's ``start_step`` and
  ``finish_step`` (the one step implementation);
* each transfer's process (``EV_XFER_INIT`` then ``EV_XFER_END``: clock.py ``_at``).

What the Python objects do at those events is done here with the same rules, in the same order:
the prefill pool's routing (cluster_kernel.py ``choose`` / ``enqueue``), a prefill replica's finishes
(its blocks held: kvcache ``hold_slot_into``; sim/serving/queues.py ``PrefillQueue.finished``), the decode
router and a decode replica's ``take`` (sim/disaggregated.py ``Handoff``), the link's reservation
(``KVLinks.reserve``), a transfer's end (``DecodeQueue.mark_ready``, ``PrefillQueue.kv_read``).

The call returns to Python only to make room (``REFILL``: a replica's record buffers or draws; ``GROW``:
a queue or the held blocks' store) and resumes exactly where it stopped (``Board.ctl[RESUME]``: the
replica whose next step was about to start).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim.scheduler.kvcache import hold_slot_into, release_held, remote_blocks, reserve_blocks
from sim.scheduler.layout import (C_DRAW_POS, C_HEAD, C_HELD_BLOCKS, C_ITL_END, C_ITL_POS, C_PHASE, C_PREEMPTED_NOW,
                                  C_PREFILLING, C_REC_END, C_REC_POS, C_REQUEUED, C_RESERVED, C_RUNNING, C_ARRIVED,
                                  DONE, NOTHING, P_BLOCK, P_MAX_SEQS, REFILL, REQ_OUTPUT, REQ_PROMPT, S_HELD_REQ,
                                  S_HELD_SLOT)
from sim.scheduler.work import can_step
from sim.serving.cluster_kernel import FIRST, REPLICAS, ROUTED, TURN, WHO, choose, enqueue
from sim.serving.kernel import finish_step, start_step
from sim.serving.routing import ROUND_ROBIN, in_turn
from sim.serving.rules import exact_delay

# What :func:`run_pd` returns besides DONE and REFILL (``Board.ctl[WHO]`` names the replica: fleet index)
GROW_PREFILL, GROW_DECODE, GROW_HELD, STUCK = DONE + 1, DONE + 2, DONE + 3, DONE + 4
# Board.ctl: the next event's sequence number, who, a replica to serve before the next event, events queued,
# the pools' sizes, the held store's free rows
SEQ, WHO_, RESUME, SIZE, PREFILL, DECODE, FREE_ROWS, STARTING = range(8)
# SimPy's priorities: a process's start (Initialize) before anything else at its instant
URGENT, NORMAL = 0, 1
# Events (Board.heap_k[:, KIND]); who: a replica's fleet index, or a request (a transfer's end), or -1 (the router)
EV_ROUTER, EV_START, EV_STEP, EV_WAKE, EV_WAKE_TIMEOUT, EV_XFER_END = range(6)
PRIORITY, ORDER, KIND, WHOM = range(4)
# Board.status: a step in flight, idle (its waiter set), woken (its wake event or timeout queued)
BUSY, IDLE_WAIT, WOKEN = range(3)


class Board(NamedTuple):
    """The event queue (a binary heap) and what the replicas' processes hold between events."""

    ctl: np.ndarray  # SEQ, WHO_, RESUME, SIZE, PREFILL, DECODE, FREE_ROWS
    clock: np.ndarray  # [the time RESUME's replica is served at]
    heap_t: np.ndarray  # per queued event: its time
    heap_k: np.ndarray  # per queued event: PRIORITY, ORDER, KIND, WHOM
    status: np.ndarray  # per replica (fleet index)
    started: np.ndarray  # per replica: when its step in flight started
    pending: np.ndarray  # per replica: when it ends
    idle_since: np.ndarray  # per replica: when it went idle
    routed_at: np.ndarray  # per replica: what woke it (an arrival, a transfer's end)
    carried: np.ndarray  # per replica: preemptions of a plan that ran nothing, recorded by the next step
    nothing: np.ndarray  # per replica: its step in flight planned nothing (blocks held for transfers)


class Handoffs(NamedTuple):
    """sim/disaggregated.py's Handoff and the links, as arrays: per request unless said otherwise."""

    wait_next: np.ndarray  # the next request waiting for the same decode replica (-1: the last)
    wait_head: np.ndarray  # per decode replica: its first waiting request (-1: none)
    wait_tail: np.ndarray  # per decode replica
    wait_len: np.ndarray  # per decode replica
    ready: np.ndarray  # its KV is on its decode replica
    ready_upto: np.ndarray  # per decode replica: every queue position before it is ready
    send_free: np.ndarray  # per prefill replica: when its link end is next free
    receive_free: np.ndarray  # per decode replica
    link: np.ndarray  # [latency in seconds, bandwidth in bytes per second]
    link_bytes: np.ndarray  # what each GPU's link carries
    prefill_replica: np.ndarray  # sim/disaggregated.py Transfers, written in place
    decode_replica: np.ndarray
    ready_s: np.ndarray
    reserved_s: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    held_row: np.ndarray  # the held store's row of its prefill blocks
    held_blocks: np.ndarray  # the held store: per row, a finished prefill's blocks (kvcache hold_slot_into)
    held_len: np.ndarray  # per row
    free_rows: np.ndarray  # the rows not in use (ctl[FREE_ROWS] of them)
    scratch: np.ndarray  # a prefill step's finished positions, sorted; the decode replicas it touched
    starting: np.ndarray  # the transfers reserved in this callback (ctl[STARTING] of them)


def run_pd(e, pb, db, f, pr, dr, prices, h, itl_room):
    """Run from where the boards say until every event is done (DONE) or a stop Python resolves (the
    module docstring). ``pb`` / ``db``: the pools' routing boards (cluster_kernel.Board; the decode pool's
    ``FIRST`` is the prefill pool's size), ``f``: every replica (prefill first), ``pr`` / ``dr``: the
    requests as each pool's queues copy them, ``prices``: each pool's step table, ``itl_room``: per pool.

    Each pass is one SimPy callback: an event's process runs until it waits again. The rules it calls are
    compiled into it (``INLINED``), each where one call site does, so that no call passes the fleet."""
    f = f.pinned  # f.states[g] at a run-time g reads replica g's state alone
    cap = f.states[0].batch.rows.shape[1]  # a prefill step's most finishes
    n_prefill = e.ctl[PREFILL]
    total = pr.arrivals.shape[0]
    while True:
        g = e.ctl[RESUME]  # a replica whose step was about to start when the last call stopped
        if g >= 0:
            e.ctl[RESUME] = -1
            now = e.clock[0]
        else:
            if e.ctl[SIZE] == 0:
                return DONE
            now = e.heap_t[0]
            kind, who = e.heap_k[0, KIND], e.heap_k[0, WHOM]
            code = room_for(e, pb, db, pr, h, cap, now)
            if code == 0 and kind == EV_STEP:
                code = room_to_finish(e, f.states[who].counters, itl_room, cap, who)
            if code != 0:
                return code
            pop(e)
            router = kind == EV_ROUTER or kind == EV_START and who < 0
            if kind == EV_WAKE:
                at = e.idle_since[who]
                arrival = e.routed_at[who]
                while at < arrival:  # where a single replica idle since then lands on this time
                    at = at + (arrival - at)
                if at > now:
                    schedule(e, now + exact_delay(now, at), NORMAL, EV_WAKE_TIMEOUT, who)
                    continue
            if kind == EV_XFER_END:
                transferred(e, db, f, h, who, now)
                continue
            # the router's wake-up, or a prefill replica's queue released: every arrival up to now is routed
            q = pb.ctl[ROUTED]
            if (router or who < n_prefill) and q < total and pr.arrivals[q] <= now:
                advance(e, pb, f, pr, now)
            if router:
                q = pb.ctl[ROUTED]
                if q < total:  # sleep to the next arrival (clock.py router_process)
                    schedule(e, now + exact_delay(now, pr.arrivals[q]), NORMAL, EV_ROUTER, -1)
                continue
            g = who
            s = f.states[g]
            if g < n_prefill:
                s.counters[C_ARRIVED] = pb.count[g]
            else:  # a decode replica sees the requests whose KV is there, and takes what it has room for
                s.counters[C_ARRIVED] = h.ready_upto[g - n_prefill]
                take(e, db, f, dr, h, s, g - n_prefill, now)
            if kind == EV_STEP and not e.nothing[g]:  # its step in flight is applied
                finished = finish_step(s, f.choosers[g], f.proposers[g], f.records[g], e.started[g], now)
                if finished and g < n_prefill:
                    prefilled(e, db, f, dr, h, g, s, finished, now)
                elif finished:
                    take(e, db, f, dr, h, s, g - n_prefill, now)
        pool = 0 if g < n_prefill else 1
        code = start(e, f.states[g], prices[pool], f.choosers[g], f.proposers[g], f.draws[g], itl_room[pool], g, now)
        if code != 0:
            return code
        if e.status[g] == BUSY:
            schedule(e, e.pending[g], NORMAL, EV_STEP, g)
        # the transfers this callback reserved: each one's process starts, and queues its end (clock.py ``_at``)
        for k in range(e.ctl[STARTING]):
            request = h.starting[k]
            schedule(e, now + exact_delay(now, h.end_s[request]), NORMAL, EV_XFER_END, request)
        e.ctl[STARTING] = 0


def room_for(e, pb, db, pr, h, cap, t):
    """0 when an event at ``t`` can be handled without growing a queue, else which (``ctl[WHO_]`` says where):
    its arrivals fit every prefill queue, and the requests waiting for each decode replica, with a prefill
    step's finishes (at most ``cap``), fit its queue."""
    total = pr.arrivals.shape[0]
    q = pb.ctl[ROUTED]
    coming = 0
    while q + coming < total and pr.arrivals[q + coming] <= t:
        coming += 1
    for j in range(e.ctl[PREFILL]):
        if pb.count[j] + coming > pb.room[j]:
            e.ctl[WHO_] = j
            return GROW_PREFILL
    for j in range(e.ctl[DECODE]):
        if db.count[j] + h.wait_len[j] + cap > db.room[j]:
            e.ctl[WHO_] = j
            return GROW_DECODE
    return 0


def room_to_finish(e, ctr, itl_room, cap, g):
    """0 when replica ``g``'s step in flight can be applied: its records have room, and a prefill step's
    finishes fit the held blocks' store."""
    prefill = g < e.ctl[PREFILL]
    if prefill and e.ctl[FREE_ROWS] < cap:
        return GROW_HELD
    if ctr[C_REC_POS] + 1 > ctr[C_REC_END] or ctr[C_ITL_POS] + itl_room[0 if prefill else 1] > ctr[C_ITL_END]:
        e.ctl[WHO_] = g
        return REFILL
    return 0


def start(e, s, p, c, proposer, d, room, g, now):
    """Replica ``g`` (its state ``s``, prices ``p``, policy ``c``, draws ``d``) at ``now``: its next step
    starts (``status`` BUSY, its end in ``pending``, for the caller to queue), or it waits for a request, a
    transfer's KV or its held blocks back. Returns 0, or REFILL (it is served again on the next call) or STUCK."""
    ctr = s.counters
    if not can_step(s):
        e.status[g] = IDLE_WAIT
        e.idle_since[g] = now
        return 0
    n_draws = d.ints.shape[0] if d.kind == 0 else d.floats.shape[0]
    if (ctr[C_REC_POS] + 1 > ctr[C_REC_END] or ctr[C_ITL_POS] + room > ctr[C_ITL_END]
            or ctr[C_DRAW_POS] + s.batch.rows.shape[1] > n_draws):
        e.ctl[RESUME] = g
        e.clock[0] = now
        e.ctl[WHO_] = g
        return REFILL
    dt = start_step(s, p, c, proposer, d, now)
    ctr[C_PREEMPTED_NOW] += e.carried[g]  # made by a plan that ran nothing: this step records them
    e.carried[g] = 0
    e.nothing[g] = 0
    if ctr[C_PHASE] < 0:
        if ctr[C_PHASE] != NOTHING or not (ctr[C_HELD_BLOCKS] or ctr[C_RESERVED]):
            e.ctl[WHO_] = g
            return STUCK
        # Blocks held for transfers made the only running request preempt itself (ServingLoop.start_step):
        # no step runs; the replica plans again at once, or waits for a transfer to give blocks back.
        e.carried[g] = ctr[C_PREEMPTED_NOW]
        e.nothing[g] = 1
        dt = 0.0
    e.started[g] = now
    e.pending[g] = now + dt
    e.status[g] = BUSY
    return 0


def advance(e, pb, f, pr, now):
    """The dispatcher routes every arrival up to ``now`` (queues.py ``Dispatcher.advance``)."""
    q = pb.ctl[ROUTED]
    while q < pr.arrivals.shape[0] and pr.arrivals[q] <= now:
        pb.ctl[ROUTED] = q + 1
        j = choose(pb, f, pr, q)
        if pr.rule == ROUND_ROBIN:
            pb.ctl[TURN] = in_turn(j, pb.ctl[REPLICAS])
        enqueue(pb, f, pr, j, q)
        wake(e, j, now, pr.arrivals[q])
        q += 1


def wake(e, g, now, at):
    """An idle replica's waiter: its wake event, at ``now``, for something that came at ``at``."""
    if e.status[g] == IDLE_WAIT:
        e.status[g] = WOKEN
        e.routed_at[g] = at
        schedule(e, now, NORMAL, EV_WAKE, g)


def prefilled(e, db, f, dr, h, g, s, count, now):
    """Prefill replica ``g``'s step finished ``count`` requests (queues.py ``PrefillQueue.finished``):
    their blocks are held, in finishing order; in queue order each goes to the decode replica the router
    picks (sim/disaggregated.py ``Handoff.prefilled``), and each replica touched takes what it can."""
    sched, ctr = s.sched, s.counters
    ids = f.ids[g]
    order = h.scratch[0]
    for j in range(count):
        position, slot = sched[S_HELD_REQ, j], sched[S_HELD_SLOT, j]
        order[j] = position
        request = ids[position]
        rows = e.ctl[FREE_ROWS] - 1
        row = h.free_rows[rows]
        e.ctl[FREE_ROWS] = rows
        h.held_row[request] = row
        h.held_len[row] = hold_slot_into(slot, s.blocks.slot_blocks, sched, ctr, h.held_blocks[row])
    for j in range(1, count):  # queue order
        position = order[j]
        i = j
        while i > 0 and order[i - 1] > position:
            order[i] = order[i - 1]
            i -= 1
        order[i] = position
    touched = h.scratch[1]
    n_touched = 0
    for j in range(count):
        request = ids[order[j]]
        receiver = choose(db, f, dr, request)
        if dr.rule == ROUND_ROBIN:
            db.ctl[TURN] = in_turn(receiver, db.ctl[REPLICAS])
        on_way(db, dr, receiver, request, 1)
        h.prefill_replica[request], h.decode_replica[request], h.ready_s[request] = g, receiver, now
        h.wait_next[request] = -1
        if h.wait_len[receiver]:
            h.wait_next[h.wait_tail[receiver]] = request
        else:
            h.wait_head[receiver] = request
        h.wait_tail[receiver] = request
        h.wait_len[receiver] += 1
        seen = False
        for k in range(n_touched):
            seen = seen or touched[k] == receiver
        if not seen:
            touched[n_touched] = receiver
            n_touched += 1
    first = e.ctl[PREFILL]
    for k in range(n_touched):
        take(e, db, f, dr, h, f.states[first + touched[k]], touched[k], now)


def on_way(db, dr, receiver, request, count):
    """sim.cluster.InboundSignals.on_way: what the decode router counts as the replica's own."""
    db.inbound[0, receiver] += count
    db.inbound[1, receiver] += count * (1 + dr.inputs[REQ_OUTPUT, request])


def take(e, db, f, dr, h, s, j, now):
    """Decode replica ``j`` (state ``s``) takes the requests waiting for it, in order, while it has room
    (sim/disaggregated.py ``Handoff.take``): their blocks set aside, each transfer reserved on the links
    (transfer.py ``KVLinks``)."""
    ctr, par = s.counters, s.params
    while h.wait_len[j]:
        request = h.wait_head[j]
        full = ctr[C_RUNNING] + ctr[C_PREFILLING] >= par[P_MAX_SEQS]
        if ctr[C_HEAD] < h.ready_upto[j] or ctr[C_REQUEUED] or full:
            return
        if not reserve_blocks(remote_blocks(dr.inputs[REQ_PROMPT, request], par[P_BLOCK]), ctr):
            return
        h.wait_head[j] = h.wait_next[request]
        h.wait_len[j] -= 1
        on_way(db, dr, j, request, -1)
        enqueue(db, f, dr, j, request)
        sender = h.prefill_replica[request]
        h.reserved_s[request] = now
        start = max(now, h.send_free[sender], h.receive_free[j])
        end = start + (h.link[0] + h.link_bytes[request] / h.link[1])
        h.send_free[sender] = end
        h.receive_free[j] = end
        h.start_s[request], h.end_s[request] = start, end
        h.starting[e.ctl[STARTING]] = request  # its process starts once this callback is done (clock.py ``_at``)
        e.ctl[STARTING] += 1


def transferred(e, db, f, h, request, now):
    """A transfer's end (sim/disaggregated.py ``Handoff.arrived``): the decode replica may admit the
    request (queues.py ``DecodeQueue.mark_ready``), the prefill replica frees its held blocks (``kv_read``)."""
    end = h.end_s[request]
    j = h.decode_replica[request]
    h.ready[request] = 1
    g = e.ctl[PREFILL] + j
    ids = f.ids[g]
    upto = h.ready_upto[j]
    while upto < db.count[j] and h.ready[ids[upto]]:
        upto += 1
    h.ready_upto[j] = upto
    wake(e, g, now, end)
    sender = h.prefill_replica[request]
    s = f.states[sender]
    row = h.held_row[request]
    release_held(h.held_blocks[row, :h.held_len[row]], s.blocks.kv, s.blocks.queue, s.counters)
    h.free_rows[e.ctl[FREE_ROWS]] = row
    e.ctl[FREE_ROWS] += 1
    wake(e, sender, now, end)


def before(t, priority, order, e, i):
    """Whether an event (t, priority, order) comes before queued event ``i`` (SimPy's order)."""
    if t != e.heap_t[i]:
        return t < e.heap_t[i]
    if priority != e.heap_k[i, PRIORITY]:
        return priority < e.heap_k[i, PRIORITY]
    return order < e.heap_k[i, ORDER]


def schedule(e, at, priority, kind, who):
    """Queue an event (SimPy's ``schedule``: its order is the count of events scheduled before it)."""
    order = e.ctl[SEQ]
    e.ctl[SEQ] = order + 1
    i = e.ctl[SIZE]
    e.ctl[SIZE] = i + 1
    while i > 0:
        parent = (i - 1) // 2
        if not before(at, priority, order, e, parent):
            break
        e.heap_t[i] = e.heap_t[parent]
        for k in range(4):
            e.heap_k[i, k] = e.heap_k[parent, k]
        i = parent
    e.heap_t[i] = at
    e.heap_k[i, PRIORITY], e.heap_k[i, ORDER], e.heap_k[i, KIND], e.heap_k[i, WHOM] = priority, order, kind, who


def pop(e):
    """Drop the first queued event."""
    n = e.ctl[SIZE] - 1
    e.ctl[SIZE] = n
    if n == 0:
        return
    t = e.heap_t[n]
    priority, order = e.heap_k[n, PRIORITY], e.heap_k[n, ORDER]
    kind, who = e.heap_k[n, KIND], e.heap_k[n, WHOM]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and not before(e.heap_t[child], e.heap_k[child, PRIORITY], e.heap_k[child, ORDER], e,
                                        child + 1):
            child += 1
        if before(t, priority, order, e, child):
            break
        e.heap_t[i] = e.heap_t[child]
        for k in range(4):
            e.heap_k[i, k] = e.heap_k[child, k]
        i = child
    e.heap_t[i] = t
    e.heap_k[i, PRIORITY], e.heap_k[i, ORDER], e.heap_k[i, KIND], e.heap_k[i, WHOM] = priority, order, kind, who


RULES = (run_pd, room_for, room_to_finish, start, advance, wake, prefilled, on_way, take, transferred, before,
         schedule, pop)
# compiled into run_pd (sim/jit.py): a call would pass the fleet's (or the hand-offs') arrays on the stack
INLINED = (room_for, start, advance, prefilled, on_way, take, transferred)
