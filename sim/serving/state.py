"""One replica's state as numpy arrays, laid out by sim/scheduler/layout.py and read by every rule."""

from __future__ import annotations

import numpy as np

from sim.scheduler.kvcache import KVCacheManager
from sim.scheduler.layout import (C_FREE_BLOCKS, C_FREE_SLOTS, C_STATIC_BATCH, LAST_STEP_END, N_CLOCKS, N_COUNTERS, REC_FINISH,
                                  REC_FIRST_TOKEN, REC_FLOATS, REC_INTS, REC_SCHEDULED, ROW_FLOATS, ROW_INTS,
                                  S_FREE_SLOT, SCHED_FIELDS)
from sim.serving.records import Buffers, grown


class ReplicaState:
    """The arrays a replica's scheduler, loop and compiled runs share (who writes what: layout.py).

    ``capacity``: requests the per-request arrays hold (a routed queue's grow with it).
    """

    def __init__(self, scheduler, capacity: int, max_blocks_per_request: int = 1, num_keys: int = 0) -> None:
        cap = scheduler.max_batch_size
        self.rows = np.zeros((ROW_INTS, cap), dtype=np.int64)
        self.rowf = np.zeros((ROW_FLOATS, cap))
        self.reci = np.zeros((REC_INTS, capacity), dtype=np.int64)
        self.recf = np.zeros((REC_FLOATS, capacity))
        self.recf[[REC_SCHEDULED, REC_FIRST_TOKEN, REC_FINISH]] = np.nan
        self.ctr = np.zeros(N_COUNTERS, dtype=np.int64)
        self.clk = np.zeros(N_CLOCKS)
        self.clk[LAST_STEP_END] = -1.0  # no step yet
        self.sched = np.zeros((SCHED_FIELDS, cap), dtype=np.int64)
        self.ks = np.zeros(cap, dtype=np.int64)  # the policy's k per running row, this step
        self.accepted = np.zeros(cap, dtype=np.int64)  # draft tokens each scheduled row kept
        self.ctr[C_STATIC_BATCH] = scheduler.initial_static_batch()
        if scheduler.paged:
            self.par = scheduler.params(max_blocks_per_request)
            self.kv = KVCacheManager(scheduler.total_blocks, max_blocks_per_request, cap, num_keys)
            self.ctr[C_FREE_BLOCKS] = scheduler.total_blocks
        else:
            self.par = scheduler.params()
            self.kv = KVCacheManager(0, 1, cap, 0)  # unused: v0 reserves KV per request
        self.sched[S_FREE_SLOT] = np.arange(cap)[::-1]  # slots are taken from the end: 0 first
        self.ctr[C_FREE_SLOTS] = cap
        self.buffers = Buffers(self.ctr)

    def grow(self, capacity: int) -> None:
        """The per-request records, for a queue that now holds ``capacity`` requests."""
        self.reci = grown(self.reci, capacity)
        self.recf = grown(self.recf, capacity, np.nan)
