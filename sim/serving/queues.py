"""A replica's waiting queue: the requests it was given, in the order it serves them.

The loop reads a queue's per-position arrays and prefix sums directly (admitting a
block of the queue head costs O(1) arithmetic), advances ``head`` as it admits, and
calls :meth:`release` whenever its clock moves, so that ``arrived`` counts the
requests it may see now. Two sources:

* :class:`ArrivalQueue`: one replica, every request's arrival time known up front; a
  request is there once the clock has passed its arrival.
* :class:`RoutedQueue`: a replica of a cluster; a :class:`Dispatcher` pushes each
  request at its arrival time (with a concurrency limit, at its send time), to the
  replica its router picks.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right

import numpy as np

from sim.scheduler import kv_reserve
from sim.serving.records import grown

PREFIX_FIELDS = ("prompt", "reserve", "multi", "remaining", "final")


# Per-request values the loop reads one at a time live in array.array: indexing one costs
# about what a list's does (and far less than a numpy scalar's), at 8 bytes an entry where a
# list of Python ints or floats takes 36 (a million requests: ~0.2 GB less per run).
def _floats(values: np.ndarray) -> array:
    return array("d", np.ascontiguousarray(values, dtype=np.float64).tobytes())


def _ints(values: np.ndarray) -> array:
    return array("q", np.ascontiguousarray(values, dtype=np.int64).tobytes())


class ArrivalQueue:
    """Requests with known arrival times (sorted), each in the queue once the clock passes it."""

    def __init__(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                 acceptance_scale: np.ndarray, max_k: int) -> None:
        self.arrival_s = _floats(arrival_s)  # bisect on it is the cheapest clock check
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        # A sequence's context is final_context - remaining, so only `remaining` moves per step.
        self.final_context = prompt_tokens + output_tokens - 1
        self.acceptance_scale = acceptance_scale
        self.kv_reserve = kv_reserve(prompt_tokens, output_tokens, max_k)
        self.capacity = self.count = prompt_tokens.shape[0]
        # What a request brings to its row when it joins (request, remaining, final context, accepted).
        self.joining_ints = np.stack([np.arange(self.count), output_tokens - 1, self.final_context,
                                      np.zeros(self.count, np.int64)])
        self.prefix = {name: _ints(np.concatenate(([0], np.cumsum(values)))) for name, values in zip(
            PREFIX_FIELDS, (prompt_tokens, self.kv_reserve, output_tokens > 1, output_tokens - 1, self.final_context))}
        self.head = 0  # requests admitted so far
        self.arrived = 0

    def release(self, now: float) -> None:
        self.arrived = bisect_right(self.arrival_s, now, self.arrived)

    def next_arrival_s(self) -> float | None:
        """When the next request arrives; None once every one has."""
        return self.arrival_s[self.arrived] if self.arrived < self.count else None

    def next_event_s(self) -> float:
        """The next time anything outside the loop can change what it does (here: an arrival)."""
        return self.arrival_s[self.arrived] if self.arrived < self.count else math.inf


def client_send_s(arrival_s, finish_order: list[float], i: int, limit: int) -> float:
    """When a client that keeps at most ``limit`` requests outstanding sends request i: once it
    has arrived and the (i - limit)-th finish (in finishing order) has freed a slot; inf while
    that finish has not happened."""
    if i < limit:
        return arrival_s[i]
    j = i - limit
    return max(arrival_s[i], finish_order[j]) if j < len(finish_order) else math.inf


class ConcurrencyLimitedQueue(ArrivalQueue):
    """A client that keeps at most ``limit`` requests outstanding (``vllm bench serve --max-concurrency``).

    Request i is sent when it has arrived and a slot is free: at max(arrival_i, F[i - limit]),
    F being the finish times in the order requests finish (first come, first served, as
    the benchmark's semaphore). ``sent_s`` holds the send times, which are what the
    server sees and what vLLM measures latencies from. The loop reports finishes through
    :meth:`finished`.
    """

    def __init__(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                 acceptance_scale: np.ndarray, max_k: int, limit: int) -> None:
        super().__init__(arrival_s, prompt_tokens, output_tokens, acceptance_scale, max_k)
        self.limit = limit
        self.sent_s = np.array(arrival_s, dtype=np.float64)
        self.finish_order: list[float] = []  # finish times, in finishing order

    def release(self, now: float) -> None:
        reached = min(bisect_right(self.arrival_s, now, self.arrived), len(self.finish_order) + self.limit)
        for i in range(self.arrived, reached):  # once per request, not per step
            self.sent_s[i] = client_send_s(self.arrival_s, self.finish_order, i, self.limit)
        self.arrived = max(reached, self.arrived)

    def finished(self, count: int, now: float) -> None:
        """``count`` requests finished at ``now``: their slots go to the next ones waiting."""
        self.finish_order.extend([now] * count)
        self.release(now)


def arrival_queue(arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                  acceptance_scale: np.ndarray, max_k: int, limit: int | None) -> ArrivalQueue:
    """One replica's queue: every request at its arrival, or behind a client's concurrency limit."""
    args = (arrival_s, prompt_tokens, output_tokens, acceptance_scale, max_k)
    return ArrivalQueue(*args) if limit is None else ConcurrencyLimitedQueue(*args, limit)


class RoutedQueue:
    """A cluster replica's queue: grown one request at a time by the dispatcher, in routing order.

    ``request_ids`` maps a queue position back to the cluster's request id. Arrays grow
    by doubling as requests are pushed (a replica of four gets about a quarter of them),
    and :attr:`on_grow`, set by the replica's loop, grows its per-request arrays alike.
    """

    INITIAL_CAPACITY = 1024

    def __init__(self, dispatcher: "Dispatcher") -> None:
        self.dispatcher = dispatcher
        capacity = self.capacity = min(self.INITIAL_CAPACITY, max(dispatcher.count, 1))
        self.count = 0
        self.request_ids, self.prompt_tokens, self.output_tokens, self.final_context, self.kv_reserve = (
            np.zeros(capacity, dtype=np.int64) for _ in range(5))
        self.acceptance_scale = np.zeros(capacity)
        self.joining_ints = np.zeros((4, capacity), dtype=np.int64)
        self.on_grow = None  # called with the new capacity after the queue's arrays grew
        self.prefix = {name: array("q", [0]) for name in PREFIX_FIELDS}
        self.head = 0
        self.arrived = 0
        self.waiter = None  # set by an idle replica's clock: called once when a request is pushed

    def release(self, now: float) -> None:
        dispatcher = self.dispatcher
        if dispatcher.next_at <= now:  # route every arrival up to now, before this replica moves on
            dispatcher.advance(now)
        self.arrived = self.count

    def next_event_s(self) -> float:
        """The next time anything outside the loop can change what it does or read its state:
        the dispatcher's next routing (whichever replica it picks)."""
        return self.dispatcher.next_at

    def push(self, request: int, arrival_s: float) -> None:
        """Append a request (arriving now, at ``arrival_s``) to this queue."""
        d, j = self.dispatcher, self.count
        if j == self.capacity:
            self._grow()
        prompt, output, reserve = d.prompt_tokens[request], d.output_tokens[request], d.kv_reserve[request]
        final = prompt + output - 1
        self.request_ids[j] = request
        self.prompt_tokens[j], self.output_tokens[j], self.final_context[j] = prompt, output, final
        self.acceptance_scale[j], self.kv_reserve[j] = d.acceptance_scale[request], reserve
        self.joining_ints[0, j], self.joining_ints[1, j], self.joining_ints[2, j] = j, output - 1, final
        for name, value in zip(PREFIX_FIELDS, (prompt, reserve, int(output > 1), output - 1, final)):
            cum = self.prefix[name]
            cum.append(cum[-1] + value)
        self.count = j + 1
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter(arrival_s)

    def _grow(self) -> None:
        capacity = self.capacity = 2 * self.capacity
        for name in ("request_ids", "prompt_tokens", "output_tokens", "final_context", "kv_reserve",
                     "acceptance_scale", "joining_ints"):
            setattr(self, name, grown(getattr(self, name), capacity))
        if self.on_grow is not None:
            self.on_grow(capacity)


class LimitedRoutedQueue(RoutedQueue):
    """A replica's queue behind a client with a concurrency limit over the whole cluster: the
    loop reports its finishes (which free the client's slots) through :meth:`finished`.

    What is sent at an instant is routed once every replica's step ending then is applied
    and before any replica starts its next step (the clock's ``settle``, in
    :func:`sim.serving.clock.simulate_cluster`, calls :meth:`release` only then), so the router sees every replica in the same state
    whatever order SimPy runs them in.
    """

    def finished(self, count: int, now: float) -> None:
        self.dispatcher.finished(count, now)


class Dispatcher:
    """Routes each request, at its arrival time, to one replica's :class:`RoutedQueue`.

    Routing is lazy and exact: whichever comes first at or after an arrival's time (the
    clock's router wake-up or a replica's step ending) routes it, before any replica
    applies a step ending at that instant, with the replicas' state at that moment.

    With ``limit`` (``vllm bench serve --max-concurrency`` in front of the cluster), request i
    is sent, and routed, at max(arrival_i, F[i - limit]), F being the cluster's finish times
    in finishing order (as :class:`ConcurrencyLimitedQueue` for one replica); ``sent_s`` holds
    the send times. Until enough requests have finished, the next send time is unknown
    (``next_at`` is inf) and :attr:`on_unblock`, set by the clock's router process, is called
    when a finish makes it known.
    """

    def __init__(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                 acceptance_scale: np.ndarray, max_k: int, router, limit: int | None = None) -> None:
        self.arrival_s = _floats(arrival_s)
        self.prompt_tokens, self.output_tokens = _ints(prompt_tokens), _ints(output_tokens)
        self.acceptance_scale = _floats(acceptance_scale)
        self.kv_reserve = _ints(kv_reserve(prompt_tokens, output_tokens, max_k))
        self.count = len(self.arrival_s)
        self.router = router
        self.routed = 0
        self.next_at = self.arrival_s[0] if self.count else math.inf  # the next send not yet routed
        self.queues: list[RoutedQueue] = []
        self.loads: list = []  # what the router reads: one per queue, with outstanding_requests/_tokens
        self.limit = limit
        self.sent_s = np.array(arrival_s, dtype=np.float64) if limit is not None else None
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
            self.queues[self.router.choose(self.loads)].push(i, arrivals[i])
            i += 1

    def _advance_limited(self, now: float) -> None:
        i = self.routed
        while i < self.count and (sent := self._send_s(i)) <= now:
            self.sent_s[i] = sent
            self.routed = i + 1
            self.next_at = self._send_s(i + 1) if i + 1 < self.count else math.inf
            self.queues[self.router.choose(self.loads)].push(i, sent)
            i += 1

    def finished(self, count: int, now: float) -> None:
        """``count`` requests finished at ``now`` (limit only): their slots go to the next ones,
        routed at the next :meth:`advance` (not here, in the middle of a replica's step)."""
        self.finish_order.extend([now] * count)
        if self.routed < self.count and self.next_at == math.inf:
            self.next_at = self._send_s(self.routed)
            if self.on_unblock is not None and self.next_at < math.inf:
                wake, self.on_unblock = self.on_unblock, None
                wake()

    def next_arrival_s(self) -> float | None:
        """When the next request is routed (inf: when enough finish); None once every one is."""
        return self.next_at if self.routed < self.count else None
