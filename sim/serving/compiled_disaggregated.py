"""A disaggregated run compiled: both pools, the hand-offs and the KV transfers in one numba call
(sim/serving/pd_kernel.py).

It applies to vLLM's proxy flow (the decode replica chosen once the prefill is done) over queued links
(``kv_transfers = "queued"``) with a built-in router (sim/router.py ``compiled_rule``), where every replica
of both pools makes its steps' choices, draws and prices in compiled code (sim/serving/compiled.py
``compiled_steps_for``: a policy with a compiled form, a compilable sampler, ``engine.jit`` on). Anything
else (llm-d's decode-first flow, shared links, a Python-stepped policy, ``jit = off``) runs in SimPy
(sim/serving/clock.py ``simulate_disaggregated``), whose records these are to the bit
(tests/test_compiled_disaggregated.py).
"""

from __future__ import annotations

import math

import numpy as np

from sim.jit import direct
from sim.serving import cluster_kernel as ck
from sim.serving import pd_kernel as pk
from sim.serving.compiled import compiled_steps_for
from sim.serving.compiled_cluster import fleet_of, fleet_size
from sim.serving.routing import PREFIX_AWARE
from sim.serving.transfer import GB, KVLinks

HELD_ROWS = 64  # the held blocks' store starts with this many rows, doubling as a prefill pool needs more


class CompiledDisaggregated:
    """The dispatcher, the hand-off and both pools' loops, run by :func:`~sim.serving.pd_kernel.run_pd`."""

    def __init__(self, dispatcher, handoff, prefill: list, decode: list, runs: list, rule: int) -> None:
        self.dispatcher, self.handoff, self.prefill, self.decode, self.runs = dispatcher, handoff, prefill, decode, runs
        self.loops = prefill + decode
        n_prefill, n_decode = len(prefill), len(decode)
        total = dispatcher.count
        arrivals = np.array(dispatcher.arrival_s, dtype=np.float64)
        weights = np.ascontiguousarray(dispatcher.router.weights if rule == PREFIX_AWARE else np.zeros(3),
                                       dtype=np.float64)
        self.prefill_requests = ck.Arrivals(arrivals, dispatcher.reqi, dispatcher.scale, rule, weights, False)
        self.decode_requests = ck.Arrivals(np.zeros(0), handoff.reqi, decode[0].queue.dispatcher.scale, rule, weights,
                                           False)
        self.prefill_board = self._pool_board(prefill, 0)
        self.decode_board = self._pool_board(decode, n_prefill)
        size = n_prefill + n_decode
        events = total + size + 2  # at most one per process: the router, each replica, each transfer
        self.board = pk.Board(ctl=np.array([0, -1, -1, 0, n_prefill, n_decode, HELD_ROWS, 0], dtype=np.int64),
                              clock=np.zeros(1), heap_t=np.zeros(events), heap_k=np.zeros((events, 4), dtype=np.int64),
                              status=np.full(size, pk.BUSY, dtype=np.int64), started=np.zeros(size), pending=np.zeros(size),
                              idle_since=np.zeros(size), routed_at=np.zeros(size),
                              carried=np.zeros(size, dtype=np.int64), nothing=np.zeros(size, dtype=np.int64))
        # Every process starts at 0 (clock.py simulate_disaggregated: the router, then the replicas in order)
        start = self.board
        pk.schedule(start, 0.0, pk.URGENT, pk.EV_START, -1)
        for g in range(size):
            pk.schedule(start, 0.0, pk.URGENT, pk.EV_START, g)
        links, t = handoff.links, handoff.transfers
        prefill_cap = prefill[0].scheduler.max_batch_size
        widest = int(prefill[0].state.kv.slot_blocks.shape[1])  # a block table's room (past its counts)
        self.handoffs = pk.Handoffs(
            wait_next=np.full(total, -1, dtype=np.int64), wait_head=np.full(n_decode, -1, dtype=np.int64),
            wait_tail=np.full(n_decode, -1, dtype=np.int64), wait_len=np.zeros(n_decode, dtype=np.int64),
            ready=np.zeros(total, dtype=np.int64), ready_upto=np.zeros(n_decode, dtype=np.int64),
            send_free=np.array(links.send_free, dtype=np.float64), receive_free=np.array(links.receive_free, dtype=np.float64),
            link=np.array([links.link.latency_us * 1e-6, links.link.bandwidth_gb_s * GB]),
            link_bytes=np.ascontiguousarray(handoff.link_bytes, dtype=np.float64),
            prefill_replica=t.prefill_replica, decode_replica=t.decode_replica, ready_s=t.ready_s,
            reserved_s=t.reserved_s, start_s=t.start_s, end_s=t.end_s,
            held_row=np.full(total, -1, dtype=np.int64), held_blocks=np.zeros((HELD_ROWS, widest), dtype=np.int64),
            held_len=np.zeros(HELD_ROWS, dtype=np.int64), free_rows=np.arange(HELD_ROWS, dtype=np.int64)[::-1].copy(),
            scratch=np.zeros((2, max(prefill_cap, n_decode)), dtype=np.int64), starting=np.zeros(total, dtype=np.int64))
        self.size = fleet_size(size)
        self.prices = (runs[0].prices, runs[n_prefill].prices)
        self.itl_room = np.array([2 * prefill_cap + 1, 2 * decode[0].scheduler.max_batch_size + 1], dtype=np.int64)
        self._run = direct(pk.run_pd)  # its first argument, the board, is the same object every call

    @staticmethod
    def _pool_board(loops: list, first: int) -> ck.Board:
        n = len(loops)
        return ck.Board(ctl=np.array([0, 0, n, -1, first], dtype=np.int64), status=np.zeros(n, dtype=np.int64),
                        count=np.zeros(n, dtype=np.int64),
                        room=np.array([loop.queue.capacity for loop in loops], dtype=np.int64),
                        at=np.zeros(n), idle_since=np.zeros(n), router_at=np.zeros(1), loads=np.zeros(n, dtype=np.int64),
                        inbound=np.zeros((2, n), dtype=np.int64))

    def run(self) -> None:
        """Run until every event is done; the queues, the links and the dispatcher are left as SimPy leaves them."""
        board = self.board
        while True:
            reason = self._run(board, self.prefill_board, self.decode_board, self._fleet(), self.prefill_requests,
                               self.decode_requests, self.prices, self.handoffs, self.itl_room)
            for runs in self.runs:
                runs.settle()
            for pool, b in ((self.prefill, self.prefill_board), (self.decode, self.decode_board)):
                for index, loop in enumerate(pool):
                    loop.queue.count = int(b.count[index])
            if reason == ck.DONE:
                break
            who = int(board.ctl[pk.WHO_])
            if reason == pk.GROW_PREFILL:
                self._grow(self.prefill[who].queue, self.prefill_board, who)
            elif reason == pk.GROW_DECODE:
                self._grow(self.decode[who].queue, self.decode_board, who)
            elif reason == pk.GROW_HELD:
                self._grow_held()
            elif reason == pk.STUCK:
                raise RuntimeError("a waiting request can never be admitted (checked before the run)")
        d = self.dispatcher
        d.routed, d.next_at = d.count, math.inf
        links = self.handoff.links
        links.send_free[:] = self.handoffs.send_free.tolist()
        links.receive_free[:] = self.handoffs.receive_free.tolist()

    @staticmethod
    def _grow(queue, board: ck.Board, who: int) -> None:
        queue.grow()
        board.room[who] = queue.capacity

    def _grow_held(self) -> None:
        """Double the held blocks' store; the new rows are free."""
        h, board = self.handoffs, self.board
        rows = h.held_blocks.shape[0]
        free = np.concatenate((np.arange(2 * rows - 1, rows - 1, -1), h.free_rows[:board.ctl[pk.FREE_ROWS]]))
        blocks = np.zeros((2 * rows, h.held_blocks.shape[1]), dtype=np.int64)
        blocks[:rows] = h.held_blocks
        self.handoffs = h._replace(held_blocks=blocks, held_len=np.concatenate((h.held_len, np.zeros(rows, np.int64))),
                                   free_rows=np.concatenate((free, np.zeros(2 * rows - free.shape[0], np.int64))))
        board.ctl[pk.FREE_ROWS] = free.shape[0]

    def _fleet(self) -> ck.Fleet:
        """Each replica's part of the call (prefill pool first), with room for its next steps; padded."""
        rooms = [self.itl_room[0]] * len(self.prefill) + [self.itl_room[1]] * len(self.decode)
        return fleet_of(self.loops, self.runs, rooms, self.size)


def compiled_disaggregated_for(dispatcher, handoff, prefill: list, decode: list, tables: tuple, samplers: list,
                               rule: int | None, decode_rule: int | None, flow_compiled: bool):
    """The run compiled, or None where it does not apply (the module docstring). ``tables``: each pool's
    step table; ``samplers``: each loop's (prefill pool first); ``flow_compiled``: vLLM's proxy flow."""
    if not flow_compiled or rule is None or rule != decode_rule or dispatcher.limit is not None:
        return None
    if type(handoff.links) is not KVLinks or not prefill or not decode:
        return None
    runs = []
    for index, (loop, sampler) in enumerate(zip(prefill + decode, samplers)):
        if not loop.rules.compiled:
            return None
        r = compiled_steps_for(loop, tables[0 if index < len(prefill) else 1], sampler, True)
        if r is None:
            return None
        runs.append(r)
    return CompiledDisaggregated(dispatcher, handoff, prefill, decode, runs, rule)

