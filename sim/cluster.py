"""N identical replicas behind a router, simulated together in one SimPy environment.

Each replica is a :class:`~sim.serving.loop.ServingLoop` whose queue is a
:class:`~sim.serving.queues.RoutedQueue`: the :class:`~sim.serving.queues.Dispatcher`
routes each request at its arrival time (before any replica step ending at that
instant), asking the router policy for a replica with the replicas' state at that
moment, and pushes it to that replica's queue. Every per-step operation is the single
replica's, unchanged (:mod:`sim.serving.clock` runs them).

Each replica has its own scheduler, policy instance (policies keep state) and
acceptance random stream, so results do not depend on the order replicas run in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.router import make_router
from sim.serving.clock import simulate_cluster
from sim.serving.compiled import decode_runs_for
from sim.serving.loop import ServingLoop
from sim.serving.priced import PricedBackend
from sim.serving.queues import Dispatcher, RoutedQueue
from sim.serving.records import ReplicaRecords


@dataclass
class ReplicaParts:
    """What one replica owns: nothing here is shared between replicas."""

    scheduler: object
    policy: object
    sampler: object


@dataclass
class ClusterRecords:
    merged: ReplicaRecords      # request-indexed (global ids); steps of all replicas ordered by start time
    replica_of: np.ndarray      # request id -> the replica that served it
    step_replica: np.ndarray    # merged step -> its replica
    request_ids: list[np.ndarray]       # per replica: its requests, in its queue order
    per_replica: list[ReplicaRecords]   # per replica, indexed like request_ids


def run_cluster(*, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                acceptance_scale: np.ndarray, max_k: int, table, parts: list[ReplicaParts],
                router: str, jit: str = "off") -> ClusterRecords:
    """Simulate the replicas and their router until every request has finished."""
    dispatcher = Dispatcher(arrival_s, prompt_tokens, output_tokens, acceptance_scale, max_k, make_router(router))
    loops = []
    for p in parts:
        queue = RoutedQueue(dispatcher)
        loop = ServingLoop(queue, scheduler=p.scheduler, policy=p.policy, k_max=table.k_max,
                           backend=PricedBackend(table, p.sampler, p.scheduler.prefill))
        loop.decode_runs = decode_runs_for(loop, table, p.sampler, jit, arrival_s.shape[0])
        dispatcher.add(queue, loop)
        loops.append(loop)
    simulate_cluster(dispatcher, loops)
    return _merge(loops, arrival_s.shape[0])


def _merge(loops: list[ServingLoop], n: int) -> ClusterRecords:
    ids = [loop.queue.request_ids[:loop.queue.count] for loop in loops]
    local = [_trimmed(loop.records(), loop.queue.count) for loop in loops]
    replica_of = np.zeros(n, dtype=np.int64)
    per_request = {name: np.full(n, np.nan) for name in ("scheduled_s", "first_token_s", "finish_s")}
    per_request.update({name: np.zeros(n, dtype=np.int64)
                        for name in ("decode_steps", "drafted_tokens", "accepted_tokens")})
    for index, (req, rec) in enumerate(zip(ids, local)):
        replica_of[req] = index
        for name, values in per_request.items():
            values[req] = getattr(rec, name)
    step_replica = np.concatenate([np.full(rec.steps["start_s"].shape[0], i, dtype=np.int64)
                                   for i, rec in enumerate(local)])
    steps = {f: np.concatenate([rec.steps[f] for rec in local]) for f in local[0].steps}
    order = np.lexsort((step_replica, steps["start_s"]))  # by start time, then replica
    steps = {f: v[order] for f, v in steps.items()}
    preemptions = None
    if local[0].preemptions is not None:  # vllm-v1
        preemptions = np.zeros(n, dtype=np.int64)
        for req, rec in zip(ids, local):
            preemptions[req] = rec.preemptions
    merged = ReplicaRecords(**per_request, steps=steps,
                            itl_values=np.concatenate([rec.itl_values for rec in local]),
                            itl_weights=np.concatenate([rec.itl_weights for rec in local]), preemptions=preemptions)
    return ClusterRecords(merged, replica_of, step_replica[order], ids, local)


def _trimmed(rec: ReplicaRecords, count: int) -> ReplicaRecords:
    """A routed replica's request arrays are sized for every request; keep the ones it got."""
    return ReplicaRecords(rec.scheduled_s[:count], rec.first_token_s[:count], rec.finish_s[:count],
                          rec.decode_steps[:count], rec.drafted_tokens[:count], rec.accepted_tokens[:count],
                          rec.steps, rec.itl_values, rec.itl_weights,
                          None if rec.preemptions is None else rec.preemptions[:count])
