"""A replica's waiting queue: the requests it was given, in the order it serves them.

Every queue holds the inputs of its requests by queue position (``reqi``: prompt and output
tokens, the v0 reservation and the prefix-cache keys; ``scale``: what the acceptance sampler
reads per request) and moves two of the replica's counters: ``C_ARRIVED`` (requests the replica
may see now) on :meth:`release`, ``C_HEAD`` being the scheduler's (requests taken from it).
The protocol the loop and the clock use, on every queue:

* ``release(now)``: count what has arrived by ``now``;
* ``next_arrival_s()`` / ``next_event_s()``: when the replica next has something new to see;
* ``finished(count, now)``: requests finished (a client with a concurrency limit sends more);
* ``on_grow``: called with the new capacity when the queue's arrays grew (routed queues).

Three sources:

* :class:`ArrivalQueue`: one replica, every request's arrival known up front (``timed``: a
  compiled run may release them itself, sim/serving/kernel.py);
* :class:`ConcurrencyLimitedQueue`: one replica behind a client that keeps at most N requests
  outstanding (``vllm bench serve --max-concurrency``);
* :class:`RoutedQueue`: a replica of a cluster; a :class:`Dispatcher` pushes each request at
  its arrival (or send) time, to the replica its router picks.

Disaggregated serving (sim/disaggregated.py) uses two routed kinds: a :class:`PrefillQueue` reports
which requests its replica prefilled (each starts a KV transfer), and a :class:`DecodeQueue` is pushed
a request when its KV has arrived (its source: :class:`Handoffs`).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right

import numpy as np

from sim.scheduler.layout import (C_ARRIVED, C_HEAD, REQ_OUTPUT, REQ_PREFIX_KEY, REQ_PROMPT, REQ_REMOTE, REQ_RESERVE,
                                  S_HELD_REQ, S_HELD_SLOT)
from sim.serving.records import grown

REQ_INPUTS = 8  # rows of reqi (sim/scheduler/layout.py REQ_*)


def request_inputs(prompt_tokens: np.ndarray, output_tokens: np.ndarray, reserve: np.ndarray,
                   prefix_keys: np.ndarray | None, remote_tokens: np.ndarray | None = None) -> np.ndarray:
    """The int block a queue holds per request: prompt, output, v0 reservation, prefix-cache keys
    (four rows from :func:`sim.scheduler.kvcache.prefix_keys`, or none shared) and, on a disaggregated
    decode replica, the prompt tokens whose KV a prefill replica sends (none elsewhere)."""
    n = prompt_tokens.shape[0]
    reqi = np.zeros((REQ_INPUTS, n), dtype=np.int64)
    reqi[REQ_PROMPT], reqi[REQ_OUTPUT], reqi[REQ_RESERVE] = prompt_tokens, output_tokens, reserve
    if prefix_keys is not None:
        reqi[REQ_PREFIX_KEY:REQ_REMOTE] = prefix_keys
    if remote_tokens is not None:
        reqi[REQ_REMOTE] = remote_tokens
    return reqi


class ArrivalQueue:
    """Requests with known arrival times (sorted), each in the queue once the clock passes it."""

    timed = True  # every arrival is known up front: a compiled run releases them itself
    compilable = True  # compiled runs may take many steps in one call (sim/serving/compiled.py)
    on_grow = None  # never grows

    def __init__(self, arrival_s: np.ndarray, reqi: np.ndarray, scale: np.ndarray,
                 wakes_as_routed: bool = False) -> None:
        # wakes_as_routed: a round-robin replica run apart (sim/cluster.py): idle, it wakes for its next arrival
        # where the routed cluster's replica would (sim/serving/kernel.py AS_ROUTED), which is not always where
        # a single replica's clock lands (an ulp either side, where no delay from the clock lands on the arrival)
        self.wakes_as_routed = wakes_as_routed
        self.arrival_times = np.ascontiguousarray(arrival_s, dtype=np.float64)
        self.arrival_s = array("d", self.arrival_times.tobytes())  # bisect on it is the cheapest clock check
        self.reqi = reqi
        self.scale = np.ascontiguousarray(scale, dtype=np.float64)
        self.capacity = self.count = reqi.shape[1]
        self.ctr = np.zeros(3, dtype=np.int64)  # replaced by the loop's counters (bind)
        # prompt + output tokens of the requests before each position: what a router weighs
        self.cum_tokens = np.concatenate(([0], np.cumsum(reqi[REQ_PROMPT] + reqi[REQ_OUTPUT])))

    @property
    def prompt_tokens(self) -> np.ndarray:
        return self.reqi[REQ_PROMPT, :self.count]

    @property
    def output_tokens(self) -> np.ndarray:
        return self.reqi[REQ_OUTPUT, :self.count]

    def bind(self, ctr: np.ndarray) -> None:
        """Use the replica's counters (the loop's state) for ``C_ARRIVED`` and ``C_HEAD``."""
        self.ctr = ctr

    def drop_inputs(self) -> None:
        """Let the requests' arrays go once the run is over (sim.serving.loop ``drop_inputs``)."""
        self.reqi = np.zeros((self.reqi.shape[0], 0), dtype=self.reqi.dtype)  # not a view: it would keep the block
        self.arrival_times = self.scale = self.cum_tokens = np.zeros(0)
        self.arrival_s = array("d")

    @property
    def head(self) -> int:
        return int(self.ctr[C_HEAD])

    @property
    def arrived(self) -> int:
        return int(self.ctr[C_ARRIVED])

    def release(self, now: float) -> None:
        ctr = self.ctr
        ctr[C_ARRIVED] = bisect_right(self.arrival_s, now, int(ctr[C_ARRIVED]))

    def next_arrival_s(self) -> float | None:
        """When the next request arrives; None once every one has."""
        arrived = int(self.ctr[C_ARRIVED])
        return self.arrival_s[arrived] if arrived < self.count else None

    def next_event_s(self) -> float:
        """The next time anything outside the loop can change what it does (here: an arrival)."""
        arrived = int(self.ctr[C_ARRIVED])
        return self.arrival_s[arrived] if arrived < self.count else math.inf

    def finished(self, count: int, now: float) -> None:
        """Finishes change nothing for open arrivals."""

    def waiting_tokens(self) -> int:
        """Prompt and output tokens of the requests given to the replica and not yet taken."""
        return int(self.cum_tokens[self.count] - self.cum_tokens[int(self.ctr[C_HEAD])])


def client_send_s(arrival_s, finish_order: list[float], i: int, limit: int) -> float:
    """When a client that keeps at most ``limit`` requests outstanding sends request i: once it
    has arrived and the (i - limit)-th finish (in finishing order, as the client sees it) has
    freed a slot; inf while that finish has not happened."""
    if i < limit:
        return arrival_s[i]
    j = i - limit
    return max(arrival_s[i], finish_order[j]) if j < len(finish_order) else math.inf


class ConcurrencyLimitedQueue(ArrivalQueue):
    """A client that keeps at most ``limit`` requests outstanding (``vllm bench serve --max-concurrency``).

    Request i is sent when it has arrived and a slot is free: at max(arrival_i, F[i - limit]),
    F being the finish times as the client sees them (the engine's, plus ``reply_delay_s``:
    the serving frontend's latency, a profile's ``request_latency_s``), in finishing order
    (first come, first served, as the benchmark's semaphore). ``sent_s`` holds the send
    times, which are what the server sees and what vLLM measures latencies from.
    """

    timed = False  # sends wait on finishes
    compilable = False  # ... reported step by step

    def __init__(self, arrival_s: np.ndarray, reqi: np.ndarray, scale: np.ndarray, limit: int,
                 reply_delay_s: float = 0.0) -> None:
        super().__init__(arrival_s, reqi, scale)
        self.limit = limit
        self.reply_delay_s = reply_delay_s
        self.sent_s = np.array(arrival_s, dtype=np.float64)
        self.finish_order: list[float] = []  # finish times as the client sees them, in finishing order

    def _send_s(self, i: int) -> float:
        return client_send_s(self.arrival_s, self.finish_order, i, self.limit)

    def release(self, now: float) -> None:
        ctr = self.ctr
        i = int(ctr[C_ARRIVED])
        while i < self.count and (sent := self._send_s(i)) <= now:  # once per request, not per step
            self.sent_s[i] = sent
            i += 1
        ctr[C_ARRIVED] = i

    def next_arrival_s(self) -> float | None:
        """When the next request is sent (inf while it waits on a finish); None once every one is."""
        arrived = int(self.ctr[C_ARRIVED])
        return self._send_s(arrived) if arrived < self.count else None

    def next_event_s(self) -> float:
        arrived = int(self.ctr[C_ARRIVED])
        return self._send_s(arrived) if arrived < self.count else math.inf

    def finished(self, count: int, now: float) -> None:
        """``count`` requests finished at ``now``: their slots go to the next ones waiting once
        the client has the replies."""
        self.finish_order.extend([now + self.reply_delay_s] * count)
        self.release(now)


def arrival_queue(arrival_s: np.ndarray, reqi: np.ndarray, scale: np.ndarray, limit: int | None,
                  reply_delay_s: float = 0.0) -> ArrivalQueue:
    """One replica's queue: every request at its arrival, or behind a client's concurrency limit
    (whose slots free ``reply_delay_s`` after the engine finishes a request)."""
    if limit is None:
        return ArrivalQueue(arrival_s, reqi, scale)
    return ConcurrencyLimitedQueue(arrival_s, reqi, scale, limit, reply_delay_s)


class RoutedQueue:
    """A cluster replica's queue: grown one request at a time by the dispatcher, in routing order.

    ``request_ids`` maps a queue position back to the cluster's request id. Arrays grow by
    doubling as requests are pushed (a replica of four gets about a quarter of them), and
    :attr:`on_grow`, set by the replica's loop, grows its per-request arrays alike. A compiled
    cluster (sim/serving/cluster_kernel.py ``push``) fills the same arrays in compiled code and
    sets :attr:`count` when it returns.
    """

    INITIAL_CAPACITY = 1024
    timed = False  # the dispatcher routes: a compiled run stops at its next routing
    compilable = True

    def __init__(self, dispatcher: "Dispatcher") -> None:
        self.dispatcher = dispatcher
        capacity = self.capacity = min(self.INITIAL_CAPACITY, max(dispatcher.count, 1))
        self.count = 0
        self.request_ids = np.zeros(capacity, dtype=np.int64)
        self.reqi = np.zeros((dispatcher.reqi.shape[0], capacity), dtype=np.int64)
        self.scale = np.zeros(capacity)
        self.on_grow = None  # called with the new capacity after the queue's arrays grew
        self.waiter = None  # set by an idle replica's clock: called once when a request is pushed
        self.ctr = np.zeros(3, dtype=np.int64)
        self.cum_tokens = np.zeros(capacity + 1, dtype=np.int64)  # tokens of the requests before each position

    bind = ArrivalQueue.bind
    head = ArrivalQueue.head
    arrived = ArrivalQueue.arrived
    prompt_tokens = ArrivalQueue.prompt_tokens
    output_tokens = ArrivalQueue.output_tokens
    waiting_tokens = ArrivalQueue.waiting_tokens

    def release(self, now: float) -> None:
        dispatcher = self.dispatcher
        if dispatcher.next_at <= now:  # route every arrival up to now, before this replica moves on
            dispatcher.advance(now)
        self.ctr[C_ARRIVED] = self.count

    def next_event_s(self) -> float:
        """The next time anything outside the loop can change what it does or read its state:
        the dispatcher's next routing (whichever replica it picks)."""
        return self.dispatcher.next_at

    def next_arrival_s(self) -> float | None:
        return self.dispatcher.next_arrival_s()

    def finished(self, count: int, now: float) -> None:
        """Finishes change nothing for open arrivals."""

    def push(self, request: int, arrival_s: float) -> None:
        """Append a request (arriving now, at ``arrival_s``) to this queue."""
        d, j = self.dispatcher, self.count
        if j == self.capacity:
            self.grow()
        self.request_ids[j] = request
        self.reqi[:, j] = d.reqi[:, request]
        self.scale[j] = d.scale[request]
        self.cum_tokens[j + 1] = self.cum_tokens[j] + (d.reqi[REQ_PROMPT, request] + d.reqi[REQ_OUTPUT, request]
                                                       - d.reqi[REQ_REMOTE, request])  # less KV a prefill replica sent
        self.count = j + 1
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter(arrival_s)

    def grow(self) -> None:
        """Double what the queue holds (its loop's per-request arrays alike, through :attr:`on_grow`)."""
        capacity = self.capacity = 2 * self.capacity
        self.request_ids, self.reqi, self.scale = (grown(a, capacity) for a in (self.request_ids, self.reqi,
                                                                                  self.scale))
        self.cum_tokens = grown(self.cum_tokens, capacity + 1)
        if self.on_grow is not None:
            self.on_grow(capacity)


class PrefillQueue(RoutedQueue):
    """A disaggregated prefill replica's queue (sim/disaggregated.py): its requests ask for one token
    (vLLM's proxy sends max_tokens=1 to the prefill instance), so each finishes with its prefill, and
    the loop's report of those finishes hands each request's id to ``on_prefilled(ids, now)``, which
    starts its KV transfer at that instant. The request's blocks stay held (the replica's
    ``P_HOLD``: NIXL's delayed free) until :meth:`kv_read` says the decode side has read them.
    A compiled disaggregated run (sim/serving/pd_kernel.py) does what this queue does itself."""

    compilable = False  # finishes start transfers at their instant: no compiled runs of its own (stepped in
    # SimPy, or the whole cluster in sim/serving/pd_kernel.py)

    def __init__(self, dispatcher: "Dispatcher", on_prefilled) -> None:
        super().__init__(dispatcher)
        self.on_prefilled = on_prefilled
        self.state = None  # the loop's state (sim.serving.state.ReplicaState): its held blocks
        self.release_rule = None  # the loop's sim.scheduler.kvcache.release_held (compiled where its rules are)

    def finished(self, count: int, now: float) -> None:
        """``count`` requests finished at ``now``: the step wrote them and their block tables into
        ``S_HELD_*``; their blocks are held, by request id, and their transfers begin (in queue order)."""
        st = self.state
        positions = st.sched[S_HELD_REQ, :count].copy()
        slots = st.sched[S_HELD_SLOT, :count].copy()
        for position, slot in zip(positions.tolist(), slots.tolist()):
            st.kv.hold(int(self.request_ids[position]), slot, st.sched, st.ctr)
        self.on_prefilled(self.request_ids[np.sort(positions)], now)

    def kv_read(self, request: int, now: float) -> None:
        """The decode side has read ``request``'s KV: its blocks go back, and a replica that waited for
        room wakes."""
        st = self.state
        st.kv.release(request, st.ctr, st.par, self.release_rule)
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter(now)


class Handoffs:
    """The decode pool's source in disaggregated serving: requests are pushed into a decode replica's
    :class:`DecodeQueue` when it takes them (sim/disaggregated.py), never at a queue's release."""

    next_at = math.inf

    def __init__(self, reqi: np.ndarray, scale: np.ndarray) -> None:
        self.reqi = reqi
        self.scale = np.ascontiguousarray(scale, dtype=np.float64)
        self.count = reqi.shape[1]

    def advance(self, now: float) -> None:
        """Pushes happen when a decode replica takes a request, not at a queue's release."""

    def next_arrival_s(self) -> float | None:
        return None


class DecodeQueue(RoutedQueue):
    """A disaggregated decode replica's queue, in the order it took its requests (vLLM's waiting queue).

    A request whose KV is on its way is pushed when the replica allocates its blocks (``ready=False``,
    vLLM's ``WAITING_FOR_REMOTE_KVS``) and may be admitted only once :meth:`mark_ready` says the KV is
    there: the scheduler sees the requests up to the first one not ready (``C_ARRIVED``). ``on_step(now)``
    (sim/disaggregated.py) is told at every step's release and finish, when the replica may have room for
    the next transfer. A hand-off may come at any instant no one knows ahead, so in SimPy the replica runs
    step by step (a compiled run would stop after every step, which costs more than the step-by-step loop);
    a compiled disaggregated run (sim/serving/pd_kernel.py) does what this queue does itself, event by event."""

    compilable = False

    def __init__(self, dispatcher) -> None:
        super().__init__(dispatcher)
        self.not_ready: set[int] = set()  # positions whose KV is on its way
        self.ready_upto = 0  # every position before it is ready
        self.on_step = None

    def push(self, request: int, arrival_s: float, ready: bool = True) -> int:
        """Append a request; returns its position (for :meth:`mark_ready`)."""
        position = self.count
        if ready:
            super().push(request, arrival_s)
            self._advance()
            return position
        waiter, self.waiter = self.waiter, None  # nothing to do for the replica until the KV is there
        self.not_ready.add(position)
        super().push(request, arrival_s)
        self.waiter = waiter
        return position

    def mark_ready(self, position: int, now: float) -> None:
        self.not_ready.discard(position)
        self._advance()
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter(now)

    def _advance(self) -> None:
        upto = self.ready_upto
        while upto < self.count and upto not in self.not_ready:
            upto += 1
        self.ready_upto = upto

    def release(self, now: float) -> None:
        self.ctr[C_ARRIVED] = self.ready_upto
        if self.on_step is not None:
            self.on_step(now)

    def finished(self, count: int, now: float) -> None:
        """Finishes free blocks: a transfer waiting for room may start."""
        if self.on_step is not None:
            self.on_step(now)


class LimitedRoutedQueue(RoutedQueue):
    """A replica's queue behind a client with a concurrency limit over the whole cluster: the
    loop reports its finishes (which free the client's slots) through :meth:`finished`.

    What is sent at an instant is routed once every replica's step ending then is applied
    and before any replica starts its next step (the clock's ``settle``, in
    :func:`sim.serving.clock.simulate_cluster`, calls :meth:`release` only then), so the router
    sees every replica in the same state whatever order SimPy runs them in.
    """

    compilable = False  # finishes free the client's slots, reported step by step

    def finished(self, count: int, now: float) -> None:
        self.dispatcher.finished(count, now)


class Dispatcher:
    """Routes each request, at its arrival time, to one replica's :class:`RoutedQueue`.

    Routing is lazy and exact: whichever comes first at or after an arrival's time (the
    clock's router wake-up or a replica's step ending) routes it, before any replica
    applies a step ending at that instant, with the replicas' state at that moment.

    With ``limit`` (``vllm bench serve --max-concurrency`` in front of the cluster), request i
    is sent, and routed, at max(arrival_i, F[i - limit]), F being the cluster's finish times
    in finishing order as the client sees them (as :class:`ConcurrencyLimitedQueue` for one
    replica, ``reply_delay_s`` after the engine's); ``sent_s`` holds
    the send times. Until enough requests have finished, the next send time is unknown
    (``next_at`` is inf) and :attr:`on_unblock`, set by the clock's router process, is called
    when a finish makes it known.
    """

    def __init__(self, arrival_s: np.ndarray, reqi: np.ndarray, scale: np.ndarray, router,
                 limit: int | None = None, reply_delay_s: float = 0.0) -> None:
        self.arrival_s = array("d", np.ascontiguousarray(arrival_s, dtype=np.float64).tobytes())
        self.reqi = reqi
        self.scale = np.ascontiguousarray(scale, dtype=np.float64)
        self.count = len(self.arrival_s)
        self.router = router
        self.routed = 0
        self.next_at = self.arrival_s[0] if self.count else math.inf  # the next send not yet routed
        self.queues: list[RoutedQueue] = []
        self.loads: list = []  # what the router reads: one per queue (sim/router.py: ReplicaLoad, ReplicaCache)
        self.limit = limit
        self.sent_s = np.array(arrival_s, dtype=np.float64) if limit is not None else None
        self.reply_delay_s = reply_delay_s  # with a limit: when the client sees a finish, after the engine
        self.finish_order: list[float] = []  # with a limit: the cluster's finish times, in finishing order
        self.on_unblock = None

    def _send_s(self, i: int) -> float:
        return client_send_s(self.arrival_s, self.finish_order, i, self.limit)

    def add(self, queue: RoutedQueue, load) -> None:
        self.queues.append(queue)
        self.loads.append(load)

    def advance(self, now: float) -> None:
        if self.limit is not None:
            return self._advance_limited(now)
        arrivals, i = self.arrival_s, self.routed
        while i < self.count and arrivals[i] <= now:
            self.routed = i + 1
            self.next_at = arrivals[i + 1] if i + 1 < self.count else math.inf
            self.route(i, arrivals[i])
            i += 1

    def _advance_limited(self, now: float) -> None:
        i = self.routed
        while i < self.count and (sent := self._send_s(i)) <= now:
            self.sent_s[i] = sent
            self.routed = i + 1
            self.next_at = self._send_s(i + 1) if i + 1 < self.count else math.inf
            self.route(i, sent)
            i += 1

    def route(self, request: int, at: float) -> None:
        """Send ``request`` (arriving at ``at``) to the replica the router picks."""
        self.queues[self.router.choose(self.loads, self.reqi[:, request])].push(request, at)

    def finished(self, count: int, now: float) -> None:
        """``count`` requests finished at ``now`` (limit only): their slots go to the next ones,
        routed at the next :meth:`advance` (not here, in the middle of a replica's step)."""
        self.finish_order.extend([now + self.reply_delay_s] * count)
        if self.routed < self.count and self.next_at == math.inf:
            self.next_at = self._send_s(self.routed)
            if self.on_unblock is not None and self.next_at < math.inf:
                wake, self.on_unblock = self.on_unblock, None
                wake()

    def next_arrival_s(self) -> float | None:
        """When the next request is routed (inf: when enough finish); None once every one is."""
        return self.next_at if self.routed < self.count else None
