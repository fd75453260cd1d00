"""A cluster run compiled: every replica and the router in one numba call (sim/serving/cluster_kernel.py).

It applies where each replica runs compiled (sim/serving/compiled.py: a policy with a compiled form,
draws and prices the kernel makes, a queue the dispatcher fills at arrival times) and the router is a
built-in one (sim/router.py ``compiled_rule``: round-robin, least-requests, least-tokens,
prefix-aware), with no client concurrency limit (its sends wait on finishes, reported step by step). Anything
else runs in SimPy (sim/serving/clock.py ``simulate_cluster``), whose records these are to the bit
(tests/test_compiled_cluster.py).

The call returns to Python only to make room (a replica's record buffers or draws, a queue that is
full) and resumes where it stopped: a handful of returns a replica, not one per routing decision.
"""

from __future__ import annotations

import math

import numpy as np

from sim.jit import direct
from sim.serving import cluster_kernel as ck
from sim.serving.queues import Dispatcher, RoutedQueue
from sim.serving.records import ITL_ROOM, RECORD_ROOM
from sim.serving.routing import PREFIX_AWARE, ROUND_ROBIN
from sim.serving.rules import exact_delay

# The replicas' tuples are padded to a power of two, at least this: numba compiles the kernel once per
# tuple length (tens of seconds on a 2-core machine: benchmarks/compile_time.py), so clusters of one to
# eight replicas share the compiled kernel sim.warm makes (its routed run); a larger one compiles its own
# once per code version.
SMALLEST_FLEET = 8


def fleet_size(replicas: int) -> int:
    """The tuples' length for ``replicas`` replicas."""
    size = SMALLEST_FLEET
    while size < replicas:
        size *= 2
    return size


def router_lands_on_arrivals(arrivals: np.ndarray) -> bool:
    """Whether the router's wake-ups (sim/serving/clock.py ``router_process``: from 0, one timeout of
    ``exact_delay`` to each arrival) land on every arrival's time: each difference adds back exactly,
    so no replica's step end can route an arrival before the router does."""
    previous = np.concatenate(([0.0], arrivals[:-1]))
    return bool(np.all(previous + (arrivals - previous) == arrivals))


class CompiledCluster:
    """The dispatcher and the replicas' loops, run by :func:`~sim.serving.cluster_kernel.run_cluster`."""

    def __init__(self, dispatcher: Dispatcher, loops: list, rule: int) -> None:
        self.dispatcher, self.loops = dispatcher, loops
        n = len(loops)
        arrivals = np.array(dispatcher.arrival_s, dtype=np.float64)
        weights = dispatcher.router.weights if rule == PREFIX_AWARE else np.zeros(3)
        self.arrivals = ck.Arrivals(arrivals, dispatcher.reqi, dispatcher.scale, rule,
                                    np.ascontiguousarray(weights, dtype=np.float64),
                                    rule == ROUND_ROBIN and router_lands_on_arrivals(arrivals))
        first = arrivals[0] if arrivals.shape[0] else math.inf
        # the router's process starts at 0: it routes what arrives then, else sleeps to the first arrival
        router_at = 0.0 if first <= 0.0 else (math.inf if first == math.inf else exact_delay(0.0, float(first)))
        self.board = ck.Board(ctl=np.array([0, 0, n, -1, 0], dtype=np.int64),
                              status=np.full(n, ck.READY, dtype=np.int64),  # every process starts at 0
                              count=np.zeros(n, dtype=np.int64),
                              room=np.array([loop.queue.capacity for loop in loops], dtype=np.int64),
                              at=np.zeros(n), idle_since=np.zeros(n), router_at=np.array([router_at]),
                              loads=np.zeros(n, dtype=np.int64), inbound=np.zeros((2, n), dtype=np.int64))
        self.size = fleet_size(n)
        self.prices = loops[0].compiled_runs.prices  # one step table for every replica
        self.itl_room = 2 * loops[0].scheduler.max_batch_size + 1
        self._run = direct(ck.run_cluster)  # its first argument, the board, is the same object every call

    def run(self) -> None:
        """Run until every request has finished; the queues and the dispatcher are left as SimPy leaves them."""
        board, loops = self.board, self.loops
        while True:
            reason = self._run(board, self._fleet(), self.arrivals, self.prices, self.itl_room)
            for index, loop in enumerate(loops):
                loop.compiled_runs.settle()
                loop.queue.count = int(board.count[index])
            if reason == ck.DONE:
                break
            who = int(board.ctl[ck.WHO])
            if reason == ck.GROW:
                loops[who].queue.grow()
                board.room[who] = loops[who].queue.capacity
            elif reason == ck.STUCK:
                raise RuntimeError("a waiting request can never be admitted (checked before the run)")
        d = self.dispatcher
        d.routed, d.next_at = d.count, math.inf

    def _fleet(self) -> ck.Fleet:
        """Each replica's part of the call, with room for its next steps; padded to the fleet's size."""
        return fleet_of(self.loops, [loop.compiled_runs for loop in self.loops], [self.itl_room] * len(self.loops),
                        self.size)


def fleet_of(loops: list, runs: list, itl_rooms: list[int], size: int) -> ck.Fleet:
    """The replicas' parts of a compiled cluster's call (each loop run by its ``runs``, with room for its next
    steps' records and ``itl_rooms`` gaps beyond one per row), padded to ``size`` with the first's."""
    states, records, draws, choosers, proposers, ids, cum = [], [], [], [], [], [], []
    for loop, run, room in zip(loops, runs, itl_rooms):
        st = loop.state
        draws.append(run.draws())
        st.buffers.room(RECORD_ROOM, ITL_ROOM + int(room))
        states.append(st.arrays())
        records.append(st.records())
        choosers.append(run.chooser)
        proposers.append(loop.proposer)
        ids.append(loop.queue.request_ids)
        cum.append(loop.queue.cum_tokens)
    pad = size - len(loops)
    return ck.Fleet(*(tuple(part + part[:1] * pad) for part in (states, records, draws, choosers, proposers, ids, cum)))


def compiled_cluster_for(dispatcher: Dispatcher, loops: list, rule: int | None) -> CompiledCluster | None:
    """The cluster's compiled run, or None where it does not apply (the module docstring)."""
    if rule is None or dispatcher.limit is not None or not loops:
        return None
    if any(type(loop.queue) is not RoutedQueue or loop.compiled_runs is None for loop in loops):
        return None
    return CompiledCluster(dispatcher, loops, rule)
