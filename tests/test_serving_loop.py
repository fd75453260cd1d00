"""The one serving loop: its clocks, its step-backend protocol, and SimPy used through its public API only."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from sim.speculation.acceptance import acceptance_scale
from sim.serving.clock import exact_delay, serve_wall_clock, simulate_replica
from sim.scheduler.layout import ROW_LAG
from sim.serving.loop import ServingLoop
from sim.serving.priced import PricedBackend
from sim.serving.queues import arrival_queue
from sim.serving.records import STEP_FIELDS
from sim.simulate import make_sampler, prepare

CLOCK = Path(__file__).resolve().parent.parent / "sim" / "serving" / "clock.py"

# SimPy releases sim/serving/clock.py was checked against: Environment, Environment.timeout,
# Environment.event, Event.succeed, Environment.process (a generator using ``yield from``),
# Environment.run, and the (time, priority, insertion) order of events. A new release: read its
# changelog for these, run this file, and add it here.
CHECKED_SIMPY = ("4.1.1", "4.1.2")


def test_simpy_is_a_version_the_clock_was_checked_against():
    assert simpy.__version__ in CHECKED_SIMPY, (
        f"SimPy {simpy.__version__} is not one sim/serving/clock.py was checked against {CHECKED_SIMPY}")


def test_the_public_simpy_calls_the_clock_relies_on():
    env = simpy.Environment()
    seen = []

    def sleeper(name, delay):
        yield env.timeout(delay)
        seen.append((name, env.now))

    def waiter():
        wake = env.event()
        env.process(waker(wake))
        yield wake  # succeed() wakes it at the waker's instant, after events already due then
        seen.append(("woken", env.now))
        yield from sub()

    def waker(wake):
        yield env.timeout(2.0)
        wake.succeed()

    def sub():
        yield env.timeout(0.5)
        seen.append(("sub", env.now))

    env.process(sleeper("a", 2.0))
    env.process(waiter())
    env.process(sleeper("b", 1.0))
    env.run()
    assert seen == [("b", 1.0), ("a", 2.0), ("woken", 2.0), ("sub", 2.5)]


def test_the_clock_touches_no_private_simpy_attribute():
    tree = ast.parse(CLOCK.read_text())
    private = [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
               and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert private == []


@given(st.floats(0.0, 1e6), st.floats(0.0, 1e6))
def test_exact_delay_lands_on_the_time_asked_for(now, later):
    at = now + later
    d = exact_delay(now, at)
    assert d >= 0.0 and now + d >= at
    assert now + d <= math.nextafter(at, math.inf)
    assert now + d == at or not any(now + x == at for x in (d, math.nextafter(d, 0.0), math.nextafter(d, math.inf)))


class VirtualWallClock:
    """A wall clock that a step moves forward by its priced duration: the wall driver then
    sees exactly the times SimPy would."""

    follows_rows = False
    steps_compiled = False  # the wall driver steps it one step at a time

    def __init__(self, priced: PricedBackend) -> None:
        self.priced, self.t = priced, 0.0

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t = self.t + seconds

    def run(self, plan):
        dt, accepted = self.priced.run(plan)
        self.t = self.t + dt
        return None, accepted

    def watch(self, queue):
        pass

    def commit(self):
        pass

    def retire(self, done):
        pass


def _loop(run, backend_of) -> ServingLoop:
    r = run.requests
    queue = arrival_queue(r.arrival_s, run.replica.inputs(r.prompt_tokens, r.output_tokens, None),
                          acceptance_scale(run.alphas), None)
    sampler = make_sampler(run.config, run.alphas)
    return run.replica.loop(queue, run.policy, sampler,
                            backend_of(PricedBackend(run.table, sampler)))


@pytest.mark.parametrize("batching,policy", [("continuous", "goodput"), ("static", "fixed"), ("continuous", "none")])
def test_one_loop_two_clocks_same_records(run_config, batching, policy):
    """The same loop under SimPy and under the wall-clock driver (whose clock a step moves by
    its price) records the same steps and requests, to the bit."""
    config = run_config(workload__num_requests=120, workload__rate=3.0, engine__batching=batching,
                        engine__max_batch_size=8, policy__name=policy, workload__output_tokens="uniform:1:40")
    simulated = _loop(prepare(config), lambda priced: priced)
    simulate_replica(simulated)
    wall = []
    walled = _loop(prepare(config), lambda priced: wall.append(VirtualWallClock(priced)) or wall[0])
    serve_wall_clock(walled, wall[0].clock, wall[0].sleep)
    a, b = simulated.records(), walled.records()
    assert set(a.steps) == set(STEP_FIELDS) and a.steps["start_s"].shape[0] > 100
    for name in STEP_FIELDS:
        assert np.array_equal(a.steps[name], b.steps[name]), name
    for name in ("scheduled_s", "first_token_s", "finish_s", "decode_steps", "drafted_tokens", "accepted_tokens",
                 "itl_values", "itl_weights"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert not np.isnan(a.finish_s).any()


def test_draft_lag_counts_unseen_tokens(run_config):
    """After a prefill the draft has not seen 1 token; after a step that kept every draft, 2."""
    run = prepare(run_config(workload__num_requests=1, policy__name="fixed", policy__k=2, acceptance__alpha=0.99,
                             workload__output_tokens=50))
    loop = _loop(run, lambda priced: priced)
    loop.queue.release(0.0)
    assert loop.has_work()
    loop.finish_step(0.0, loop.start_step(0.0))  # the prefill
    assert loop.state.rows[ROW_LAG, 0] == 1
    loop.start_step(1.0)
    kept = int(loop.state.accepted[0])
    loop.finish_step(1.0, 2.0)
    assert loop.state.rows[ROW_LAG, 0] == (2 if kept == 2 else 1)


@pytest.mark.parametrize("scheduler", ["v0", "vllm-v1"])
def test_the_plan_a_backend_reads_is_the_step_that_is_recorded(run_config, scheduler):
    """sim.serving.plan.Plan, what every backend reads: each step's kind, rows, k, charged batch, chunks,
    blocks and preemptions are the step's record, under both schedulers (preemption included)."""
    from sim.simulate import execute

    seen = []

    class Reader(PricedBackend):  # the simulator's backend, noting what the plan said
        def run(self, plan):
            seen.append((plan.phase, plan.rows, plan.k, plan.batch_size if plan.rows else None,
                         int(plan.chunk_tokens.sum()), plan.kv_blocks, plan.preempted, plan.prefill_count,
                         None if plan.ragged_ks is None else plan.ragged_ks.shape[0]))
            return super().run(plan)

    run = prepare(run_config(policy__name="fixed", policy__k=3, workload__rate=20.0, workload__num_requests=80,
                             workload__prompt_tokens="uniform:8:200", workload__output_tokens="uniform:1:60",
                             engine__max_batch_size=6, engine__scheduler=scheduler,
                             **({"engine__kv_cache_tokens": 700} if scheduler == "vllm-v1" else {})))
    sampler = make_sampler(run.config, run.alphas)
    steps = execute(run, backend=Reader(run.table, sampler)).steps
    assert len(seen) == len(steps)
    for (phase, rows, k, charged, chunk_tokens, blocks, preempted, admitted, ragged), step in zip(
            seen, steps.itertuples()):
        assert phase == step.phase
        if scheduler == "v0" and phase == 0:  # a prefill of whole prompts
            assert (rows, admitted, step.batch_size) == (0, step.batch_size, admitted)
            continue
        running = step.running if scheduler == "v0" else step.batch_size
        assert (rows, k) == (running, step.k) and charged == (step.batch_size if rows else None)
        v1 = (getattr(step, name, 0) for name in ("prefill_tokens", "kv_blocks", "preemptions"))  # v0 has none
        assert (chunk_tokens, blocks, preempted) == tuple(v1)
        assert ragged is None or ragged == rows
    if scheduler == "vllm-v1":
        assert steps.preemptions.sum() > 0 and (steps.phase == 2).any()  # the case covers both
