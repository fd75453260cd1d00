"""A cluster's step records merged by start time while its replicas run, so that none keeps them.

A cluster's replicas (run apart, sim/cluster.py ``run_apart``, or in one compiled cluster) each hand
their finished records over a block at a time (sim/serving/records.py ``Buffers.stream_to``). A
replica's records come in start-time order, so once every replica still running has handed over a
record starting at ``t`` or later, every record before ``t`` is final in the cluster's order too:
(start time, replica), the order of :func:`sim.cluster.merge_loops`. Those are merged and handed on
to one sink (the run folder's steps file, or totals only) in blocks of :data:`sim.metrics.STEP_BLOCK`,
each added to the cluster's step totals as it goes: the same blocks, so the same summary, as the
merge after the run.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from sim import metrics
from sim.serving.records import STEP_DTYPE, StepSink, copied

REPLICA_FIELD = "replica"  # steps.csv's column naming the replica that ran the step
MERGED_DTYPE = np.dtype(STEP_DTYPE.descr + [(REPLICA_FIELD, np.int64)])
RECORD = np.dtype((np.void, STEP_DTYPE.itemsize))  # a step record as one opaque value


class StepMerge:
    """The replicas' step records, merged as they come and handed to ``sink`` (which keeps none).

    Replicas run apart hand over from their own threads (``stop``: set when the run stops). A replica
    that gets more than :attr:`ahead` blocks ahead of the others waits for them (its records wait in
    memory until the slowest catches up), so memory holds a few blocks a replica whatever the run's
    length; the replica furthest behind never waits, so every replica must be running at once
    (``run_apart`` then gives each a thread). Without ``stop``, one thread runs every replica in one
    simulated time (the compiled cluster), and none waits: they keep in step by themselves."""

    ahead = 2  # blocks a replica's records may wait for the others, at most, before it waits itself

    def __init__(self, sink: StepSink, replicas: int, columns: list[str],
                 stop: threading.Event | None = None) -> None:
        if sink.keeps:
            raise ValueError("a merged cluster's sink keeps no steps: the merge after the run keeps them")
        self.sink, self.stop = sink, stop
        self.columns = list(columns) + [REPLICA_FIELD]
        self.block = metrics.STEP_BLOCK
        self.totals = metrics.StepTotals()  # the cluster's, in blocks of the merged order
        self._waiting: list[list[np.ndarray]] = [[] for _ in range(replicas)]  # per replica: copies, in order
        self._frontier = [-math.inf] * replicas  # the start of each replica's last record handed over
        self._out = np.empty(self.block, MERGED_DTYPE)
        # the merged records' step fields (their first bytes), as whole records
        self._records = np.ndarray(self.block, RECORD, self._out, 0, (MERGED_DTYPE.itemsize,))
        self._filled = 0
        self._changed = threading.Condition()
        sink.start(self.columns)

    def feed(self, replica: int) -> "ReplicaFeed":
        """The :class:`~sim.serving.records.StepSink` replica ``replica``'s buffers stream to."""
        return ReplicaFeed(self, replica)

    def take(self, replica: int, rows: np.ndarray) -> None:
        """A replica's next records (a copy the merge owns), in its order."""
        with self._changed:
            if rows.shape[0]:
                self._waiting[replica].append(rows)
                self._frontier[replica] = float(rows["start_s"][-1])
            self._merge()
            while (self.stop is not None and not self.stop.is_set()
                   and sum(r.shape[0] for r in self._waiting[replica]) > self.ahead * self.block):
                self._changed.wait(0.05)

    def finished(self, replica: int) -> None:
        """The replica has handed over its last record: nothing it runs later can come before another's."""
        with self._changed:
            self._frontier[replica] = math.inf
            self._merge()

    def close(self) -> metrics.StepTotals:
        """Hand on the last records (every replica has finished) and set the sink's ``streamed``."""
        with self._changed:
            if not all(f == math.inf for f in self._frontier):
                raise RuntimeError("a replica had not finished when its cluster's steps were closed")
            self._merge()
            if self._filled:
                self._hand_on()
        self.sink.streamed = self.columns
        return self.totals

    def _merge(self) -> None:
        """Move every record that no replica can still precede into the merged order."""
        parts, owners = [], []
        for index, waiting in enumerate(self._waiting):
            # Before every other replica's frontier in (start, replica) order: a later record of replica j
            # starts at its frontier or later, and a tie goes to the lower replica.
            bounds = [(frontier, "right" if index < other else "left")
                      for other, frontier in enumerate(self._frontier) if other != index and frontier != math.inf]
            while waiting:
                rows = waiting[0]
                cut = min((int(np.searchsorted(rows["start_s"], frontier, side=side)) for frontier, side in bounds),
                          default=rows.shape[0])
                if cut:
                    parts.append(rows[:cut])
                    owners.append(np.full(cut, index, np.int64))
                if cut < rows.shape[0]:
                    waiting[0] = rows[cut:]
                    break
                waiting.pop(0)
        if not parts:
            return
        # Whole records moved at once, as opaque values: numpy moves a packed dtype field by field.
        records = np.concatenate([part.view(RECORD) for part in parts])
        starts, owner = np.concatenate([part["start_s"] for part in parts]), np.concatenate(owners)
        del parts, owners
        # The parts are in replica order, each replica's in its own: a stable sort by start time alone
        # gives the (start time, replica) order, a replica's own ties kept in its order.
        order = np.argsort(starts, kind="stable")
        at = 0
        while at < order.shape[0]:
            count = min(self.block - self._filled, order.shape[0] - at)
            taken = order[at:at + count]
            self._records[self._filled:self._filled + count] = records[taken]
            self._out[REPLICA_FIELD][self._filled:self._filled + count] = owner[taken]
            self._filled += count
            at += count
            if self._filled == self.block:
                self._hand_on()
        self._changed.notify_all()

    def _hand_on(self) -> None:
        """The merged block (full, or the run's last) to the totals and the sink."""
        block = self._out[:self._filled]
        self.totals.add({name: block[name] for name in STEP_DTYPE.names})
        self.sink.rows(self._out, 0, self._filled)
        self._filled = 0


class ReplicaFeed:
    """One replica's :class:`~sim.serving.records.StepSink`: its records go to the merge (copied: the
    replica's buffer reuses their room), and its own totals stay in its buffers (``Buffers.totals``)."""

    keeps = False
    streamed = None

    def __init__(self, merge: StepMerge, replica: int) -> None:
        self.merge, self.replica = merge, replica
        self.every = merge.block

    def start(self, columns: list[str]) -> None:
        pass

    def rows(self, steps: np.ndarray, lo: int, hi: int) -> None:
        self.merge.take(self.replica, copied(steps, lo, hi))
