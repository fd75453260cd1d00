"""N identical replicas behind a router, simulated together in one SimPy environment.

The router is a SimPy process that wakes at each arrival's exact time (before any
replica step ending at that instant), asks the router policy for a replica with the
replicas' state at that moment, and appends the request to that replica's queue.
Each replica is a :class:`RoutedReplica`: the engine's :class:`~sim.engine.Replica`
whose request arrays are in *its own* queue order and grow as requests are routed
to it, so every per-step operation (queue-head blocks, prefix sums, row state) is
the single replica's, unchanged. An idle replica sleeps until the router hands it
work, waking at the float time a single replica's own clock arithmetic would reach,
so that a one-replica cluster reproduces the single replica to the bit.

Each replica has its own scheduler, policy instance (policies keep state) and
acceptance random stream, so results do not depend on the order replicas run in.
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heappush

import numpy as np
import simpy
from simpy.core import NORMAL, URGENT

from sim.engine import Replica, ReplicaRecords
from sim.router import make_router


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


def schedule_at(env: simpy.Environment, event: simpy.Event, at: float, priority=NORMAL) -> None:
    """Trigger ``event`` at the absolute time ``at``.

    SimPy schedules by delay (now + delay), which can miss a float time by an ulp;
    the router must act at each arrival's exact time for routing (and a one-replica
    cluster) to match what a replica reading the arrival array sees. This is what
    ``Event.succeed`` does, with the time given instead of now.
    """
    event._ok, event._value = True, None
    heappush(env._queue, (at, priority, next(env._eid), event))


class RoutedReplica(Replica):
    """A replica fed by a router: its queue holds the request ids routed to it."""

    def __init__(self, env: simpy.Environment, *, capacity: int, prompt_tokens: list[int],
                 output_tokens: list[int], acceptance_scale: list[float], kv_reserve: list[int],
                 table, parts: ReplicaParts) -> None:
        ints = np.zeros(capacity, dtype=np.int64)
        super().__init__(env, arrival_s=np.empty(0), prompt_tokens=ints, output_tokens=ints.copy(),
                         acceptance_scale=np.zeros(capacity), kv_reserve=ints.copy(), table=table,
                         scheduler=parts.scheduler, policy=parts.policy, sampler=parts.sampler)
        self._all = (prompt_tokens, output_tokens, acceptance_scale, kv_reserve)  # by global id, as lists
        self.request_ids = np.zeros(capacity, dtype=np.int64)
        self.assigned = 0
        self._prefix = {name: [0] for name in self._prefix}  # grown one request at a time
        self._wake: simpy.Event | None = None  # set while idle, waiting for the router
        self._wake_set = False
        self._idle_since = 0.0

    def outstanding_requests(self) -> int:
        """Routed here and not finished: waiting (or being prefilled) plus running."""
        return self.assigned - self.queue_head + self.running

    def outstanding_tokens(self) -> int:
        """Prompt tokens not yet prefilled plus output tokens not yet emitted, over unfinished requests."""
        cum, head, end = self._prefix, self.queue_head, self.assigned
        waiting_prompt = cum["prompt"][end] - cum["prompt"][head]
        waiting_output = cum["remaining"][end] - cum["remaining"][head] + (end - head)
        return waiting_prompt + waiting_output + self.total_remaining

    def enqueue(self, request: int, arrival_s: float) -> None:
        """Append a request (arriving now, at ``arrival_s``) to this replica's queue."""
        prompt_all, output_all, scale_all, reserve_all = self._all
        j = self.assigned
        prompt, output, reserve = prompt_all[request], output_all[request], reserve_all[request]
        final = prompt + output - 1
        self.request_ids[j] = request
        self.prompt_tokens[j], self.output_tokens[j], self.final_context[j] = prompt, output, final
        self.acceptance_scale[j], self.kv_reserve[j] = scale_all[request], reserve
        self._joining_ints[1, j], self._joining_ints[2, j] = output - 1, final
        for name, value in (("prompt", prompt), ("reserve", reserve), ("multi", int(output > 1)),
                            ("remaining", output - 1), ("final", final)):
            cum = self._prefix[name]
            cum.append(cum[-1] + value)
        self.assigned = j + 1
        if self._wake is not None and not self._wake_set:
            # Wake where a single replica idle since _idle_since lands when it times out to
            # this arrival: now + (arrival - now), repeated while that falls short.
            t = self._idle_since
            while t < arrival_s:
                t = t + (arrival_s - t)
            schedule_at(self.env, self._wake, t)
            self._wake_set = True

    def _run(self):
        # The engine's loop with the queue fed by the router instead of an arrival array.
        env, timeout = self.env, self.env.timeout
        admit, cap = self.scheduler.admit, self.scheduler.max_batch_size
        while True:
            now = env.now
            self.arrived = self.assigned
            waiting = self.arrived - self.queue_head
            if self.running == 0 and waiting == 0:
                self._idle_since, self._wake, self._wake_set = now, env.event(), False
                yield self._wake
                self._wake = None
                continue
            n = admit(self.running, self.kv_used,
                      self.kv_reserve[self.queue_head:self.arrived]) if waiting and self.running < cap else 0
            if n:
                yield timeout(self._start_prefill(n, now))
                self._finish_prefill(n, now, env.now)
            elif self.running:
                yield timeout(self._start_decode(now))
                self._finish_decode(now, env.now)
            else:
                raise RuntimeError("a waiting request can never be admitted (checked before the run)")


def run_cluster(*, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                acceptance_scale: np.ndarray, kv_reserve: np.ndarray, table, parts: list[ReplicaParts],
                router: str) -> ClusterRecords:
    """Simulate the replicas and their router until every request has finished."""
    env = simpy.Environment()
    n = arrival_s.shape[0]
    shared = dict(prompt_tokens=prompt_tokens.tolist(), output_tokens=output_tokens.tolist(),
                  acceptance_scale=acceptance_scale.tolist(), kv_reserve=kv_reserve.tolist())
    replicas = [RoutedReplica(env, capacity=n, table=table, parts=p, **shared) for p in parts]
    chooser = make_router(router)

    def route():
        for request, at in enumerate(arrival_s.tolist()):
            if at > env.now:
                wait = env.event()
                schedule_at(env, wait, at, URGENT)  # before any replica step ending at this instant
                yield wait
            replicas[chooser.choose(replicas)].enqueue(request, at)

    env.process(route())
    env.run()
    return _merge(replicas, n)


def _merge(replicas: list[RoutedReplica], n: int) -> ClusterRecords:
    ids = [r.request_ids[:r.assigned] for r in replicas]
    local = [_trimmed(r.records(), r.assigned) for r in replicas]
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
    merged = ReplicaRecords(**per_request, steps=steps,
                            itl_values=np.concatenate([rec.itl_values for rec in local]),
                            itl_weights=np.concatenate([rec.itl_weights for rec in local]))
    return ClusterRecords(merged, replica_of, step_replica[order], ids, local)


def _trimmed(rec: ReplicaRecords, count: int) -> ReplicaRecords:
    """A routed replica's request arrays are sized for every request; keep the ones it got."""
    return ReplicaRecords(rec.scheduled_s[:count], rec.first_token_s[:count], rec.finish_s[:count],
                          rec.decode_steps[:count], rec.drafted_tokens[:count], rec.accepted_tokens[:count],
                          rec.steps, rec.itl_values, rec.itl_weights)
