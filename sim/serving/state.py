"""One replica's state as numpy arrays, laid out by sim/scheduler/layout.py and read by every rule."""

from __future__ import annotations

import numpy as np

from sim.scheduler.kvcache import KVCacheManager
from sim.scheduler.layout import (C_FREE_SLOTS, C_STATIC_BATCH, LAST_STEP_END, N_CLOCKS, N_COUNTERS, REC_FINISH,
                                  REC_FIRST_TOKEN, REC_FLOATS, REC_INTS, REC_SCHEDULED, ROW_FLOATS, ROW_INTS,
                                  S_FREE_SLOT, SCHED_FIELDS)
from sim.serving.records import Buffers, grown
from sim.serving.step import Batch, Blocks, Records, Replica, Requests


class ReplicaState:
    """The arrays a replica's scheduler, loop and compiled runs share (who writes what: layout.py).

    ``capacity``: requests the per-request arrays hold (a routed queue's grow with it).
    """

    def __init__(self, scheduler, capacity: int, max_blocks_per_request: int = 1, num_keys: int = 0) -> None:
        cap = scheduler.max_batch_size
        self.rows = np.zeros((ROW_INTS, cap), dtype=np.int64)
        self.rowf = np.zeros((ROW_FLOATS, cap))
        # int32: counts of tokens and steps of one request (< 2**31, sim.limits); half of int64's bytes
        # at a million requests, where a cluster's per-request arrays are most of its memory
        self.reci = np.zeros((REC_INTS, capacity), dtype=np.int32)
        self.recf = np.zeros((REC_FLOATS, capacity))
        self.recf[[REC_SCHEDULED, REC_FIRST_TOKEN, REC_FINISH]] = np.nan
        self.ctr = np.zeros(N_COUNTERS, dtype=np.int64)
        self.clk = np.zeros(N_CLOCKS)
        self.clk[LAST_STEP_END] = -1.0  # no step yet
        self.sched = np.zeros((SCHED_FIELDS, cap), dtype=np.int64)
        self.ks = np.zeros(cap, dtype=np.int64)  # the policy's k per running row, this step
        self.accepted = np.zeros(cap, dtype=np.int64)  # draft tokens each scheduled row kept
        self.done = np.zeros(cap, dtype=np.bool_)  # the rows a step finished (backends that follow rows)
        self.ctr[C_STATIC_BATCH] = scheduler.initial_static_batch()
        if scheduler.paged:
            self.par = scheduler.params(max_blocks_per_request)
            self.kv = KVCacheManager(scheduler.total_blocks, max_blocks_per_request, cap, num_keys)
            self.kv.start(self.ctr)
        else:
            self.par = scheduler.params()
            self.kv = KVCacheManager(0, 1, cap, 0)  # unused: v0 reserves KV per request
        self.sched[S_FREE_SLOT] = np.arange(cap)[::-1]  # slots are taken from the end: 0 first
        self.ctr[C_FREE_SLOTS] = cap
        self.buffers = Buffers(self.ctr)
        self.paged = bool(scheduler.paged)
        self.track_lag = 0
        self._arrays = None
        self._records = None
        self._queue = None

    def bind(self, queue, track_lag: int) -> None:
        """The queue whose requests this state's records follow, and how the drafter's lag moves."""
        self._queue, self.track_lag = queue, int(track_lag)
        self._arrays = None

    def arrays(self) -> Replica:
        """The state as the step reads it (sim/serving/step.py), rebuilt only when an array was replaced."""
        a = self._arrays
        q = self._queue
        if a is None or a.requests.inputs is not q.reqi or a.requests.scale is not q.scale:
            a = self._arrays = Replica(Batch(self.rows, self.rowf, self.ks, self.accepted, self.done),
                                       Requests(q.reqi, q.scale, self.reci, self.recf),
                                       Blocks(self.kv.kv, self.kv.queue, self.kv.key_block, self.kv.slot_blocks, self.kv.scratch),
                                       self.ctr, self.clk, self.sched, self.par, self.paged, self.track_lag)
        return a

    def records(self) -> Records:
        """Where the step records and gaps go, rebuilt only when the buffers were replaced (as they grow)."""
        b, r = self.buffers, self._records
        if r is None or r.steps is not b.steps or r.itl_values is not b.itl_values or r.itl_weights is not b.itl_weights:
            r = self._records = Records(b.steps, b.itl_values, b.itl_weights)
        return r

    def grow(self, capacity: int) -> None:
        """The per-request records, for a queue that now holds ``capacity`` requests."""
        self.reci = grown(self.reci, capacity)
        self.recf = grown(self.recf, capacity, np.nan)
        self._arrays = None
