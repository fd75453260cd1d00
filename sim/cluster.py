"""N identical replicas behind a router, simulated together in one SimPy environment.

Each replica is a :class:`~sim.serving.loop.ServingLoop` whose queue is a
:class:`~sim.serving.queues.RoutedQueue`: the :class:`~sim.serving.queues.Dispatcher`
routes each request at its arrival time (before any replica step ending at that
instant), asking the router policy for a replica with the replicas' state at that
moment, and pushes it to that replica's queue. Every per-step operation is the single
replica's, unchanged (:mod:`sim.serving.clock` runs them).

Each replica has its own scheduler, policy instance (policies keep state) and
acceptance random stream, so results do not depend on the order replicas run in.
The router reads each replica through a :class:`ReplicaSignals`: its load, and for the
prefix-aware router its waiting queue and KV cache, read-only.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from sim import metrics
from sim.errors import InputError
from sim.heap import release_freed
from sim.limits import usable_cores
from sim.metrics import StepTotals
from sim.replica import ReplicaPlan
from sim.router import compiled_rule, make_router
from sim.scheduler.kvcache import usage
from sim.scheduler.layout import P_BLOCK, REQ_OUTPUT
from sim.serving.clock import simulate_cluster, simulate_replica
from sim.serving.compiled_cluster import compiled_cluster_for, router_lands_on_arrivals
from sim.serving.loop import ServingLoop
from sim.serving.queues import ArrivalQueue, Dispatcher, LimitedRoutedQueue, RoutedQueue
from sim.serving.records import ReplicaRecords, StepSink
from sim.serving.step_merge import StepMerge
from sim.serving.routing import waiting_requests


@dataclass
class ReplicaParts:
    """What one replica owns besides its scheduler and queue: nothing here is shared between replicas."""

    policy: object
    sampler: object


@dataclass
class ClusterRecords:
    merged: ReplicaRecords      # request-indexed (global ids); steps of all replicas ordered by start time
    replica_of: np.ndarray      # request id -> the replica that served it
    step_replica: np.ndarray    # merged step -> its replica
    request_ids: list[np.ndarray]       # per replica: its requests, in its queue order
    itl_bounds: np.ndarray      # replica i's inter-token gaps are merged.itl_*[itl_bounds[i]:itl_bounds[i + 1]]
    sent_s: np.ndarray | None = None  # with a concurrency limit: when the client sent each request
    replica_counters: list[dict | None] | None = None  # vllm-v1: each replica's scheduler totals (prefix cache...)
    replica_totals: list[StepTotals] | None = None  # steps merged as they ran (kept nowhere): each replica's totals

    def per_replica(self, step_totals: bool = False):
        """Each replica's own records, indexed like ``request_ids``: built one at a time from the
        merged ones (a replica's steps are the merged steps it ran, in their order). ``step_totals``:
        each replica's steps as their totals (what its summary takes), gathered a block at a time
        rather than copied whole (or, where the steps were merged as they ran and kept nowhere, the totals
        each replica took of its own)."""
        m = self.merged
        if self.replica_totals is not None and not step_totals:
            raise ValueError("the cluster's steps were merged as they ran and kept nowhere: only their totals are")
        for index, ids in enumerate(self.request_ids):
            lo, hi = self.itl_bounds[index], self.itl_bounds[index + 1]
            if self.replica_totals is not None:
                steps = self.replica_totals[index]
            else:
                mine = np.flatnonzero(self.step_replica == index)  # once: a mask would be searched again per column
                steps = _step_totals_of(m.steps, mine) if step_totals else {f: v[mine] for f, v in m.steps.items()}
            yield ReplicaRecords(m.scheduled_s[ids], m.first_token_s[ids], m.finish_s[ids], m.decode_steps[ids],
                                 m.drafted_tokens[ids], m.accepted_tokens[ids],
                                 steps, m.itl_values[lo:hi], m.itl_weights[lo:hi],
                                 None if m.preemptions is None else m.preemptions[ids],
                                 None if m.cached_tokens is None else m.cached_tokens[ids],
                                 None if self.replica_counters is None else self.replica_counters[index])


def _step_totals_of(steps: dict[str, np.ndarray], rows: np.ndarray) -> StepTotals:
    """The totals of ``steps[rows]``, in sim.metrics' blocks of those rows (what step_totals of the copy gives)."""
    totals = StepTotals()
    for lo in range(0, max(rows.shape[0], 1), metrics.STEP_BLOCK):
        block = rows[lo:lo + metrics.STEP_BLOCK]
        totals.add({f: v[block] for f, v in steps.items()})
    return totals


class ReplicaSignals:
    """What a router sees of one replica (sim/router.py's ReplicaLoad and ReplicaCache), read
    from its loop's state at the routing instant and never written."""

    def __init__(self, loop: ServingLoop) -> None:
        self.loop = loop
        self.outstanding_requests = loop.outstanding_requests
        self.outstanding_tokens = loop.outstanding_tokens
        self.block_size = int(loop.state.par[P_BLOCK]) if loop.scheduler.paged else 0

    def waiting_requests(self) -> int:
        """Routed to it and not yet taken by its scheduler, plus the preempted ones waiting again."""
        return int(waiting_requests(self.loop.state.ctr, self.loop.queue.count))

    def kv_usage(self) -> float:
        return float(usage(self.loop.state.ctr, self.loop.state.par))

    def key_block(self) -> np.ndarray:
        return self.loop.state.kv.key_block


class InboundSignals(ReplicaSignals):
    """A disaggregated decode replica as a router sees it (sim/disaggregated.py): the requests whose KV is
    on its way to it count as waiting there, as vLLM's decode instance holds them (waiting for remote KV)
    from the moment the proxy sends them, before their blocks arrive."""

    def __init__(self, loop: ServingLoop, reqi: np.ndarray) -> None:
        super().__init__(loop)
        self.reqi = reqi
        self.incoming = 0  # requests whose KV is being sent here
        self.incoming_tokens = 0  # their tokens still to compute: the last prompt token and the output
        self.outstanding_requests = lambda: loop.outstanding_requests() + self.incoming
        self.outstanding_tokens = lambda: loop.outstanding_tokens() + self.incoming_tokens

    def on_way(self, request: int, count: int) -> None:
        """``request`` starts (count 1) or ends (count -1) its transfer here."""
        self.incoming += count
        self.incoming_tokens += count * int(1 + self.reqi[REQ_OUTPUT, request])

    def waiting_requests(self) -> int:
        return super().waiting_requests() + self.incoming


def run_cluster(*, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                prefix_keys: np.ndarray | None, acceptance_scale: np.ndarray, replica: ReplicaPlan,
                parts: list[ReplicaParts], router: str, max_concurrency: int | None = None,
                reply_delay_s: float = 0.0, steps_sink: StepSink | None = None) -> ClusterRecords:
    """Simulate the replicas and their router until every request has finished (the requests' lengths and
    prefix-cache keys go into the int block their queues hold: :meth:`ReplicaPlan.inputs`).
    ``max_concurrency``: the client keeps at most that many requests outstanding over the cluster, and
    sees each finish ``reply_delay_s`` after the engine. ``steps_sink``: a sink that keeps no steps, handed
    the cluster's merged steps as the replicas run (apart: :func:`run_apart`; or in one compiled cluster,
    whose replicas run in one simulated time, in step); its ``streamed`` stays None where the cluster
    could not (SimPy's cluster)."""
    if runs_apart(router, arrival_s, max_concurrency, len(parts)):
        apart = run_apart(arrival_s, prompt_tokens, output_tokens, prefix_keys, acceptance_scale, replica, parts,
                          steps_sink)
        if apart is not None:
            return apart
    inputs = replica.inputs(prompt_tokens, output_tokens, prefix_keys)
    dispatcher = Dispatcher(arrival_s, inputs, acceptance_scale, make_router(router), limit=max_concurrency,
                            reply_delay_s=reply_delay_s)
    queue_type = RoutedQueue if max_concurrency is None else LimitedRoutedQueue
    loops = []
    for p in parts:
        queue = queue_type(dispatcher)
        loop = replica.loop(queue, p.policy, p.sampler)
        dispatcher.add(queue, ReplicaSignals(loop))
        loops.append(loop)
    compiled = compiled_cluster_for(dispatcher, loops, compiled_rule(dispatcher.router))
    merge = None
    if compiled is not None and steps_sink is not None and not steps_sink.keeps:
        merge = StepMerge(steps_sink, len(loops), list(loops[0].state.buffers.step_columns(loops[0].scheduler.paged)))
        for index, loop in enumerate(loops):
            loop.state.buffers.stream_to(merge.feed(index))
    if compiled is not None:  # every replica and the router in compiled code
        compiled.run()
        del compiled
    else:
        simulate_cluster(dispatcher, loops)
    sent_s = dispatcher.sent_s
    # Reference cycles (dispatcher <-> queues and loads, queue <-> loop, loop <-> its compiled runs)
    # would keep every replica's buffers until the GC ran: break them, so that merge_loops frees each
    # replica in turn.
    dispatcher.queues.clear()
    dispatcher.loads.clear()
    dispatcher.on_unblock = None
    for index, loop in enumerate(loops):
        loop.close()
        loop.queue.waiter = None
        if merge is not None:
            loop.state.buffers.flush()
            merge.finished(index)
    merged = merge_loops(loops, arrival_s.shape[0], merged_steps=merge)
    merged.sent_s = sent_s
    return merged


RUN_APART = True  # round-robin's replicas run apart where they can (tests turn it off to compare the two ways)
THREADS_VARIABLE = "SPECBATCH_THREADS"  # how many replicas run at once when they run apart


def runs_apart(router: str, arrival_s: np.ndarray, max_concurrency: int | None, replicas: int) -> bool:
    """Whether each replica can run alone on its share of the requests, to the same records.

    Round-robin reads no replica: request i goes to replica i mod N whatever happens. Where the
    router's wake-ups land on every arrival's time (sim/serving/compiled_cluster.py
    ``router_lands_on_arrivals``), each replica is handed each of its requests at the request's own
    arrival time, which is where a single replica on an arrival array of its share takes it in (a
    one-replica cluster is the single replica to the bit). A client's concurrency limit couples the
    replicas (a finish on one frees a send to another), so it runs routed."""
    return (RUN_APART and router == "round-robin" and max_concurrency is None and replicas > 1
            and router_lands_on_arrivals(arrival_s))


def replica_threads(replicas: int) -> int:
    """How many replicas run at once: ``SPECBATCH_THREADS`` (a pool's workers set 1: their pool already
    uses every core), else the cores this process may use. A compiled run holds no lock, so
    replicas run side by side; a replica stepped in Python holds the interpreter's lock and gains nothing."""
    return max(1, min(usable_threads(), replicas))


def usable_threads() -> int:
    """Threads this process's compiled work may run on at once: ``SPECBATCH_THREADS`` where set (a pool's
    workers set 1), else the cores it may use (a cluster's replicas; a table's rows formatted after its run)."""
    threads = _threads_asked()
    return usable_cores() if threads is None else threads


def _threads_asked() -> int | None:
    """``SPECBATCH_THREADS``, where it is set."""
    value = os.environ.get(THREADS_VARIABLE, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"{value!r} is not a whole number of threads", field=THREADS_VARIABLE,
                         source="the environment") from None


def run_apart(arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
              prefix_keys: np.ndarray | None, acceptance_scale: np.ndarray, replica: ReplicaPlan,
              parts: list[ReplicaParts], steps_sink: StepSink | None = None) -> ClusterRecords | None:
    """Round-robin's replicas, each a single replica on its share (:func:`runs_apart`), side by side on
    :func:`replica_threads` threads: no replica reads another's state, so the order they run in changes
    nothing, and no replica stops at requests routed elsewhere (a million requests over four replicas: a
    quarter of a million stops fewer a replica, where the routed cluster stops at each of its own).

    Only replicas in compiled runs run apart (None otherwise, and the cluster is routed): idle, a compiled
    replica wakes for its next arrival where the routed replica would (``wakes_as_routed``), which a replica
    stepped in Python, whose SimPy clock only adds delays to its own time, cannot always reach to the bit;
    and a replica stepped in Python holds the interpreter's lock, so it gains nothing on a thread.

    With ``steps_sink`` (one that keeps no steps) and no ``SPECBATCH_THREADS`` below the replicas, every
    replica runs at once on a thread of its own and their steps are merged as they run
    (sim/serving/step_merge.py), kept nowhere: the merge needs every replica's progress."""
    count = len(parts)
    shares = [np.arange(index, arrival_s.shape[0], count) for index in range(count)]
    loops = []
    for share, p in zip(shares, parts):
        queue = ArrivalQueue(arrival_s[share], replica.inputs(prompt_tokens[share], output_tokens[share],
                                                             None if prefix_keys is None else prefix_keys[:, share]),
                             acceptance_scale[share], wakes_as_routed=True)
        loops.append(replica.loop(queue, p.policy, p.sampler))
        if loops[0].compiled_runs is None:  # every replica runs as the first does (one plan, one config)
            return None
    asked = _threads_asked()
    stop = threading.Event()
    merge = None
    if steps_sink is not None and not steps_sink.keeps and (asked is None or asked >= count):
        columns = list(loops[0].state.buffers.step_columns(loops[0].scheduler.paged))
        merge = StepMerge(steps_sink, count, columns, stop)
        for index, loop in enumerate(loops):
            loop.state.buffers.stream_to(merge.feed(index))
    threads = count if merge is not None else replica_threads(count)
    if threads == 1:
        for index, loop in enumerate(loops):
            _run_one(loop, merge, index)
    else:
        for loop in loops:
            loop.compiled_runs.stop = stop
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="replica")
        try:
            running = [pool.submit(_run_one, loop, merge, index) for index, loop in enumerate(loops)]
            done, _ = wait(running, return_when=FIRST_EXCEPTION)
            for future in running:  # the first failure, in the replicas' order
                if future in done and future.exception() is not None:
                    raise future.exception()
        finally:
            # After a failure or Ctrl-C (which only the main thread hears): replicas not yet started never
            # start, running ones stop at their compiled run's next return to Python, and waiting ones
            # (sim/serving/step_merge.py) stop waiting.
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
    for loop in loops:
        loop.close()
        loop.drop_inputs()
    return merge_loops(loops, arrival_s.shape[0], shares, merged_steps=merge)


def _run_one(loop: ServingLoop, merge: StepMerge | None, index: int) -> None:
    """One replica run apart, its last steps handed to the merge."""
    simulate_replica(loop)
    if merge is not None:
        loop.state.buffers.flush()
        merge.finished(index)


def merge_loops(loops: list[ServingLoop], n: int, shares: list[np.ndarray] | None = None,
                merged_steps: StepMerge | None = None) -> ClusterRecords:
    """The replicas' records as the cluster's (or one pool's: sim/disaggregated.py); each loop's records are moved out and the loop
    dropped from ``loops`` in turn, so that memory holds about one copy of the steps, not two. ``shares``: each
    loop's request ids, where its queue does not hold them (a replica run apart on an arrival array).
    ``merged_steps``: the steps were merged as the replicas ran and kept nowhere; the records then hold
    their totals (the cluster's, and each replica's)."""
    ids = shares if shares is not None else [loop.queue.request_ids[:loop.queue.count] for loop in loops]
    replica_of = np.zeros(n, dtype=np.int32)
    counts_dtype = loops[0].state.reci.dtype  # the replicas' own (and a one-replica run's) per-request counts
    per_request = {name: np.full(n, np.nan) for name in ("scheduled_s", "first_token_s", "finish_s")}
    per_request.update({name: np.zeros(n, dtype=counts_dtype)
                        for name in ("decode_steps", "drafted_tokens", "accepted_tokens")})
    v1 = loops[0].scheduler.paged
    preemptions = np.zeros(n, dtype=counts_dtype) if v1 else None
    cached = np.zeros(n, dtype=counts_dtype) if v1 else None
    counters: dict = {}
    replica_counters: list[dict | None] = []
    kept = merged_steps is None
    counts = [len(loop.state.buffers) for loop in loops]
    itl_counts = [loop.state.buffers.itl()[0].shape[0] for loop in loops]
    step_replica = np.repeat(np.arange(len(loops), dtype=np.int64), counts) if kept else None
    replica_totals = None if kept else [loop.state.buffers.totals for loop in loops]
    itl_bounds = np.concatenate(([0], np.cumsum(itl_counts)))
    steps = itl_values = itl_weights = None
    row = 0
    for index, req in enumerate(ids):
        loop = loops[index]
        rec = _trimmed(loop.records(), loop.queue.count)
        replica_of[req] = index
        for name, values in per_request.items():
            values[req] = getattr(rec, name)
        if v1:
            preemptions[req] = rec.preemptions
            cached[req] = rec.cached_tokens
            replica_counters.append(rec.scheduler)
            for name, value in rec.scheduler.items():  # totals over the replicas (a peak: the largest)
                counters[name] = max(counters.get(name, 0), value) if name.startswith("peak") else \
                    counters.get(name, 0) + value
        if itl_values is None:
            itl_values = np.empty(itl_bounds[-1], rec.itl_values.dtype)
            itl_weights = np.empty(itl_bounds[-1], rec.itl_weights.dtype)
        if kept:
            if steps is None:
                steps = {f: np.empty(step_replica.shape[0], v.dtype) for f, v in rec.steps.items()}
            for f, v in rec.steps.items():
                steps[f][row:row + v.shape[0]] = v
            row += counts[index]
        itl_values[itl_bounds[index]:itl_bounds[index + 1]] = rec.itl_values
        itl_weights[itl_bounds[index]:itl_bounds[index + 1]] = rec.itl_weights
        del rec, loop
        loops[index] = None  # its buffers go now
        release_freed()  # and their pages, before the next replica's are moved
    if kept:
        order = np.lexsort((step_replica, steps["start_s"]))  # by start time, then replica
        for f in steps:
            steps[f] = steps[f][order]
        step_replica = step_replica[order]
    else:
        steps = merged_steps.close()
    merged = ReplicaRecords(**per_request, steps=steps, itl_values=itl_values, itl_weights=itl_weights,
                            preemptions=preemptions, cached_tokens=cached, scheduler=counters if v1 else None)
    return ClusterRecords(merged, replica_of, step_replica, ids, itl_bounds,
                          replica_counters=replica_counters if v1 else None, replica_totals=replica_totals)


def _trimmed(rec: ReplicaRecords, count: int) -> ReplicaRecords:
    """A routed replica's request arrays are sized for every request; keep the ones it got."""
    return ReplicaRecords(rec.scheduled_s[:count], rec.first_token_s[:count], rec.finish_s[:count],
                          rec.decode_steps[:count], rec.drafted_tokens[:count], rec.accepted_tokens[:count],
                          rec.steps, rec.itl_values, rec.itl_weights,
                          None if rec.preemptions is None else rec.preemptions[:count],
                          None if rec.cached_tokens is None else rec.cached_tokens[:count], rec.scheduler)
