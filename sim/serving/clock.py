"""What keeps a serving loop's time: SimPy (simulated time) or the wall clock (a real replay).

This is the only module that uses SimPy, and only through its public API
(``Environment``, ``timeout``, ``event``, ``Event.succeed``, ``process``, ``run``);
``tests/test_serving_loop.py`` pins the SimPy versions this was checked against.

Simulated time: each replica is one SimPy process, one event per step: a step's start
(schedule + execute) prices it, the process waits the price out, then the step is
applied. An idle replica sleeps until its next arrival (one replica) or until the
dispatcher hands it a request (a cluster); a routed replica then wakes at the float
time a single replica's own clock arithmetic would reach, so a one-replica cluster
reproduces the single replica to the bit.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import simpy

from sim.serving.loop import ServingLoop
from sim.serving.rules import exact_delay, routed_wake
from sim.serving.queues import ArrivalQueue, Dispatcher


def _process(env: simpy.Environment, loop: ServingLoop, idle, settle: bool = False):
    """Run ``loop``'s steps; when it has nothing to do, ``yield from idle(env)`` (which returns
    False once no request will ever come).

    ``settle`` (a cluster behind a concurrency limit, stepped one at a time): after applying a
    step, wait out a zero delay, by which time every replica's step ending at this instant is
    applied (their events were queued before it), then release: the sends their finishes
    freed are routed before any replica starts its next step."""
    timeout, release = env.timeout, loop.queue.release
    before = (lambda now: None) if settle else release
    release(env.now)
    # Steps are split into a start (schedule, execute) and a finish (apply) around one
    # timeout, in one flat generator, to keep SimPy's per-step overhead minimal. The queue
    # is released (routed to, or read up to the clock) before a step is applied.
    while True:
        now = env.now
        if not loop.has_work():
            more = yield from idle(env, loop)
            if not more:
                return
            release(env.now)
            continue
        runs = loop.compiled_runs
        if runs is not None:  # a stretch of steps in compiled code (the last may be in flight)
            end = runs.run(now, math.inf if loop.queue.timed else loop.queue.next_event_s())
            delay = exact_delay(now, end)
            if now + delay != end:  # no one delay lands on `end` exactly: two hops (delay_short_of)
                yield timeout(delay_short_of(now, end))
                delay = end - env.now
            yield timeout(delay)
            release(env.now)
            runs.finish()
            continue
        yield timeout(loop.start_step(now))
        before(env.now)
        loop.finish_step(now, env.now)
        if settle:
            yield timeout(0)
            release(env.now)


def _until_arrival(env: simpy.Environment, loop: ServingLoop):
    """Idle on an arrival array: sleep until the next request arrives."""
    at = loop.queue.next_arrival_s()
    if at is None:
        return False
    yield env.timeout(exact_delay(env.now, at))
    return True


def _until_routed(env: simpy.Environment, loop: ServingLoop):
    """Idle in a cluster: sleep until the dispatcher hands this replica a request."""
    idle_since, wake, routed_at = env.now, env.event(), []
    loop.queue.waiter = lambda arrival_s: (routed_at.append(arrival_s), wake.succeed())
    yield wake  # resumed at the instant the request was routed here
    t = routed_wake(idle_since, routed_at[0])
    if t > env.now:
        yield env.timeout(exact_delay(env.now, t))
    return True


def router_process(env: simpy.Environment, dispatcher: Dispatcher):
    """Wake at every arrival's time so that it is routed even while every replica is idle.
    Behind a concurrency limit the next send time may wait on a finish: sleep until one
    makes it known."""
    while True:
        at = dispatcher.next_arrival_s()
        if at is None:
            return
        if at == math.inf:
            unblocked = env.event()
            dispatcher.on_unblock = unblocked.succeed
            yield unblocked
            continue
        if at > env.now:
            yield env.timeout(exact_delay(env.now, at))
        if dispatcher.limit is not None:  # after the replicas' steps ending now (see _process's settle)
            yield env.timeout(0)
        dispatcher.advance(env.now)


def delay_short_of(now: float, at: float) -> float:
    """A delay landing on the float just short of ``at`` (or on it), for when none lands on ``at``.

    From there ``at - landed`` is exact (the two are within an ulp, Sterbenz) and lands on
    ``at``: two timeouts reach any time the step-by-step chain of timeouts reached.
    """
    d = exact_delay(now, at)
    while d > 0.0 and now + d > at:
        d = math.nextafter(d, 0.0)
    return d


def simulate_replica(loop: ServingLoop) -> None:
    """Run one replica on an arrival array in simulated time."""
    env = simpy.Environment()
    env.process(_process(env, loop, _until_arrival))
    env.run()


def simulate_cluster(dispatcher: Dispatcher, loops: list[ServingLoop]) -> None:
    """Run routed replicas and their dispatcher in one simulated time."""
    env = simpy.Environment()
    processes = [router_process(env, dispatcher)]
    processes += [_process(env, loop, _until_routed, settle=dispatcher.limit is not None) for loop in loops]
    for process in processes:
        env.process(process)
    env.run()
    for process in processes:  # a replica idle at the end waits on an event forever: let its frame go
        process.close()


def simulate_disaggregated(dispatcher: Dispatcher, prefill: list[ServingLoop], decode: list[ServingLoop],
                           handoff) -> None:
    """Run a disaggregated cluster in one simulated time: the prefill replicas behind their dispatcher,
    the decode replicas fed by ``handoff`` (sim/disaggregated.py), which is given ``later(at, call)``:
    ``call()`` runs at simulated time ``at`` (a KV transfer's end)."""
    env = simpy.Environment()
    handoff.later = lambda at, call: env.process(_at(env, at, call))
    processes = [router_process(env, dispatcher)]
    processes += [_process(env, loop, _until_routed) for loop in prefill + decode]
    for process in processes:
        env.process(process)
    env.run()
    for process in processes:
        process.close()
    handoff.later = None


def _at(env: simpy.Environment, at: float, call: Callable[[], None]):
    """``call()`` at simulated time ``at``."""
    yield env.timeout(exact_delay(env.now, at))
    call()


def serve_wall_clock(loop: ServingLoop, clock: Callable[[], float], sleep: Callable[[float], None] = time.sleep
                     ) -> None:
    """Run one replica on an arrival array in real time: the backend runs each step; the clock measures it."""
    queue: ArrivalQueue = loop.queue
    while True:
        now = clock()
        queue.release(now)
        if loop.has_work():
            loop.start_step(now)
            loop.finish_step(now, clock())
        else:
            at = queue.next_arrival_s()
            if at is None:
                return
            sleep(max(0.0, at - now))
