"""A compiled cluster (sim/serving/compiled_cluster.py) gives the SimPy cluster's records to the bit.

The SimPy cluster (sim/serving/clock.py ``simulate_cluster``) is the reference: each test runs the
same config twice, once as it runs (compiled, where it applies) and once with the compiled cluster
refused, and compares every record. Where it does not apply, the SimPy cluster must still run.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.cluster as cluster
from sim.jit import numba_available
from sim.router import ROUTERS
from sim.serving import compiled_cluster
from sim.serving.routing import first_least, in_turn
from sim.simulate import execute, prepare
from tests.test_decode_runs import assert_identical

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba is not installed")

SMALL = dict(workload__num_requests=120, workload__prompt_tokens="uniform:16:256",
             workload__output_tokens="uniform:1:48", engine__max_batch_size=8, engine__jit="on")


def both(run_config, monkeypatch, **overrides):
    """(compiled, SimPy) results of one config, routed even for one replica; fails unless the first really
    ran compiled (round-robin's replicas routed, not run apart: :func:`apart_and_routed` compares those)."""
    monkeypatch.setattr(cluster, "RUN_APART", False)
    config = run_config(**{**SMALL, **overrides})
    ran = []
    run = compiled_cluster.CompiledCluster.run
    monkeypatch.setattr(compiled_cluster.CompiledCluster, "run", lambda self: (ran.append(1), run(self)))
    fast = execute(prepare(config), routed=True)
    assert ran, "the cluster did not run compiled"
    with monkeypatch.context() as m:
        m.setattr(cluster, "compiled_cluster_for", lambda *args: None)
        slow = execute(prepare(config), routed=True)
    return fast, slow


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("scheduler", ["vllm-v1", "v0"])
@pytest.mark.parametrize("replicas,rate,seed", [(2, 12.0, 0), (3, 30.0, 1), (4, 60.0, 2)])
def test_the_compiled_cluster_is_the_simpy_cluster(run_config, monkeypatch, router, scheduler, replicas, rate, seed):
    fast, slow = both(run_config, monkeypatch, cluster__router=router, engine__scheduler=scheduler,
                      cluster__replicas=replicas, workload__rate=rate, seed=seed)
    assert_identical(slow, fast)


@pytest.mark.parametrize("router", ROUTERS)
def test_a_one_replica_compiled_cluster_is_the_single_replica(run_config, monkeypatch, router):
    config = run_config(**SMALL, workload__rate=6.0, cluster__router=router, acceptance__distribution="beta")
    ran = []
    run = compiled_cluster.CompiledCluster.run
    monkeypatch.setattr(compiled_cluster.CompiledCluster, "run", lambda self: (ran.append(1), run(self)))
    routed = execute(prepare(config), routed=True)
    assert ran
    assert_identical(execute(prepare(config)), routed)


@pytest.mark.parametrize("overrides", [
    {"policy__name": "goodput", "policy__k": None},  # each replica learns its own alpha, in compiled code
    {"engine__scheduler": "vllm-v1", "engine__kv_cache_tokens": 1500},  # preemptions
    {"engine__scheduler": "vllm-v1", "engine__async_scheduling": False},
    {"workload__rate": float("inf")},  # every request routed at 0, before any replica starts
    {"workload__output_tokens": "8", "workload__prompt_tokens": "16", "policy__name": "none"},  # steps end together
    {"cluster__replicas": 5},  # a fleet of eight slots, three of them padding
    {"engine__scheduler": "v0", "engine__batching": "static"},
    {"acceptance__model": "per-position", "acceptance__per_position": [0.8, 0.5, 0.3]},
    {"acceptance__distribution": "beta", "acceptance__concentration": 4.0},
])
def test_the_compiled_cluster_is_the_simpy_cluster_where_events_tie_or_state_is_learnt(run_config, monkeypatch,
                                                                                     overrides):
    base = dict(cluster__replicas=3, workload__rate=40.0, cluster__router="least-tokens")
    fast, slow = both(run_config, monkeypatch, **{**base, **overrides})
    assert_identical(slow, fast)


@pytest.mark.parametrize("scheduler", ["vllm-v1", "v0"])
def test_round_robin_stopping_every_replica_at_every_arrival_is_the_same(run_config, monkeypatch, scheduler):
    """Round-robin's replicas run ahead to their own next request; where the router's wake-ups might
    not land on an arrival, every replica stops at every arrival instead: the same records either way."""
    monkeypatch.setattr(compiled_cluster, "router_lands_on_arrivals", lambda arrivals: False)
    fast, slow = both(run_config, monkeypatch, cluster__replicas=3, workload__rate=40.0,
                      cluster__router="round-robin", engine__scheduler=scheduler)
    assert_identical(slow, fast)


def apart_and_routed(run_config, monkeypatch, **overrides):
    """(run apart, routed) results of one round-robin config; fails unless the first ran apart."""
    config = run_config(**{**SMALL, "cluster__router": "round-robin", **overrides})
    ran = []
    apart = cluster.run_apart
    monkeypatch.setattr(cluster, "run_apart", lambda *args: (ran.append(1), apart(*args))[1])
    split = execute(prepare(config))
    assert ran, "the replicas did not run apart"
    with monkeypatch.context() as m:
        m.setattr(cluster, "RUN_APART", False)
        routed = execute(prepare(config))
    return split, routed


@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("scheduler", ["vllm-v1", "v0"])
@pytest.mark.parametrize("replicas,rate,seed", [(2, 12.0, 0), (3, 30.0, 1), (4, 60.0, 2)])
def test_round_robin_replicas_run_apart_are_the_routed_cluster(run_config, monkeypatch, scheduler, replicas, rate, seed,
                                                                 threads):
    """Each replica alone on its share, on one thread or side by side: the routed cluster's every record."""
    monkeypatch.setenv(cluster.THREADS_VARIABLE, threads)
    split, routed = apart_and_routed(run_config, monkeypatch, engine__scheduler=scheduler, cluster__replicas=replicas,
                                     workload__rate=rate, seed=seed)
    assert_identical(routed, split)


@pytest.mark.parametrize("overrides", [
    {"policy__name": "goodput", "policy__k": None},
    {"engine__scheduler": "vllm-v1", "engine__kv_cache_tokens": 1500},  # preemptions
    {"workload__rate": float("inf")},  # every request at 0
    {"workload__output_tokens": "8", "workload__prompt_tokens": "16", "policy__name": "none"},  # steps end together
    {"engine__scheduler": "v0", "engine__batching": "static"},
    {"acceptance__distribution": "beta", "acceptance__concentration": 4.0},
    {"policy__name": "adaptive"},  # stepped in Python: routed (test_replicas_stepped_in_python_run_routed)
    {"engine__jit": "off"},  # stepped in Python: routed
    {"cluster__replicas": 7, "workload__num_requests": 5},  # replicas that get no request
])
def test_round_robin_run_apart_where_events_tie_or_state_is_learnt(run_config, monkeypatch, overrides):
    split, routed = apart_and_routed(run_config, monkeypatch, **{"cluster__replicas": 3, "workload__rate": 40.0,
                                                                  **overrides})
    assert_identical(routed, split)


@pytest.mark.parametrize("requests,replicas,output,seed,idle_since,arrival", [
    # found by hypothesis: no delay from the replica's idle clock lands on the arrival, and the routed
    # replica wakes on it (t + (arrival - t) falls short, then lands) ...
    (7, 4, "1", 3, 1.4123967214068867, 3.8563598316645202),
    # ... or an ulp past it (t + (arrival - t) overshoots): a replica run apart woken on the arrival fails here
    (4, 2, "uniform:1:30", 2, None, 2.9907737404686974),
])
def test_an_idle_replica_run_apart_wakes_where_the_routed_one_does(run_config, monkeypatch, requests, replicas, output,
                                                                   seed, idle_since, arrival):
    from sim.serving.rules import exact_delay

    if idle_since is not None:
        assert idle_since + exact_delay(idle_since, arrival) != arrival
    split, routed = apart_and_routed(run_config, monkeypatch, workload__num_requests=requests,
                                     cluster__replicas=replicas, engine__scheduler="vllm-v1", workload__rate=1.0,
                                     workload__output_tokens=output, engine__max_batch_size=1, seed=seed)
    assert arrival in routed.request_columns["arrival_s"]
    assert_identical(routed, split)


def test_replicas_stepped_in_python_run_routed(run_config, monkeypatch):
    # SimPy's clock can only add a delay to its own time: a replica stepped in Python cannot be at an arrival
    # exactly as a routed one is, and gains nothing on a thread (the interpreter's lock), so it runs routed.
    ran = []
    apart = cluster.run_apart
    monkeypatch.setattr(cluster, "run_apart", lambda *args: ran.append(apart(*args)) or ran[-1])
    execute(prepare(run_config(cluster__replicas=3, workload__rate=40.0, policy__name="adaptive")))
    assert ran == [None]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.integers(1, 40), replicas=st.integers(2, 4), scheduler=st.sampled_from(["vllm-v1", "v0"]),
       rate=st.sampled_from([1.0, 20.0, 200.0, float("inf")]), output=st.sampled_from(["1", "4", "uniform:1:30"]),
       batch=st.integers(1, 6), seed=st.integers(0, 5))
def test_small_random_round_robin_clusters_run_apart_are_the_routed_ones(run_config, monkeypatch, requests, replicas,
                                                                         scheduler, rate, output, batch, seed):
    split, routed = apart_and_routed(run_config, monkeypatch, workload__num_requests=requests,
                                     cluster__replicas=replicas, engine__scheduler=scheduler, workload__rate=rate,
                                     workload__output_tokens=output, engine__max_batch_size=batch, seed=seed)
    assert_identical(routed, split)


def replicas_told_to_stop(run_config, monkeypatch, fail):
    """Run a 3-replica round-robin cluster on 2 threads where ``fail(loops)`` raises in the main thread or a
    replica's; returns what each replica's run came to."""
    from sim.serving.compiled import RunStopped

    monkeypatch.setenv(cluster.THREADS_VARIABLE, "2")
    monkeypatch.setattr("sim.speculation.acceptance.DRAW_BLOCK", 64)  # a compiled run returns every few steps
    outcome = {}
    started = itertools.count()
    simulate = cluster.simulate_replica

    def replica(loop):
        index = next(started)
        outcome[index] = "started"
        fail(index)
        # Run only once the cluster has told its replicas to stop: then whatever the machine's scheduling,
        # the run must stop at its first return to Python rather than finish.
        loop.compiled_runs.stop.wait(5)
        try:
            simulate(loop)
        except RunStopped:
            outcome[index] = "stopped"
            raise
        outcome[index] = "finished"

    monkeypatch.setattr(cluster, "simulate_replica", replica)
    return outcome


def test_a_replica_that_fails_stops_the_others(run_config, monkeypatch):
    def fail(index):
        if index == 1:
            raise ValueError("replica 1 broke")

    outcome = replicas_told_to_stop(run_config, monkeypatch, fail)
    with pytest.raises(ValueError, match="replica 1 broke"):
        execute(prepare(run_config(**{**SMALL, "workload__num_requests": 6000, "workload__rate": 600.0},
                                   cluster__router="round-robin", cluster__replicas=3)))
    assert outcome[0] == "stopped" and outcome.get(2, "never started") in ("stopped", "never started")
    assert "finished" not in outcome.values()


def test_an_interrupt_stops_replicas_running_on_threads(run_config, monkeypatch):
    outcome = replicas_told_to_stop(run_config, monkeypatch, lambda index: None)

    def interrupted(futures, return_when):
        raise KeyboardInterrupt  # what Ctrl-C does to the main thread waiting on the replicas

    monkeypatch.setattr(cluster, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        execute(prepare(run_config(**{**SMALL, "workload__num_requests": 6000, "workload__rate": 600.0},
                                   cluster__router="round-robin", cluster__replicas=3)))
    assert "finished" not in outcome.values() and "stopped" in outcome.values()


def test_what_runs_routed_rather_than_apart():
    arrivals = np.array([0.0, 0.1, 0.2])
    assert cluster.runs_apart("round-robin", arrivals, None, 2)
    assert not cluster.runs_apart("least-requests", arrivals, None, 2)  # reads the replicas' load
    assert not cluster.runs_apart("round-robin", arrivals, 4, 2)  # a finish frees a send to any replica
    assert not cluster.runs_apart("round-robin", arrivals, None, 1)  # one replica routed: tests compare the two
    # a wake-up that cannot land on an arrival (0.907... + (5.803... - 0.907...) falls short of it): the routed
    # cluster routes that request later than a lone replica would see it arrive
    assert not cluster.runs_apart("round-robin", np.array([0.907530456191219, 5.803323859868507]), None, 2)


def test_replica_threads_follow_the_variable(monkeypatch):
    monkeypatch.setenv(cluster.THREADS_VARIABLE, "3")
    assert cluster.replica_threads(8) == 3 and cluster.replica_threads(2) == 2
    monkeypatch.setenv(cluster.THREADS_VARIABLE, "0")
    assert cluster.replica_threads(4) == 1
    monkeypatch.setenv(cluster.THREADS_VARIABLE, "many")
    with pytest.raises(ValueError, match="the environment: SPECBATCH_THREADS: 'many' is not a whole number"):
        cluster.replica_threads(4)
    monkeypatch.delenv(cluster.THREADS_VARIABLE)
    assert 1 <= cluster.replica_threads(4) <= 4


def test_the_router_lands_on_arrivals_it_can_reach_by_one_timeout():
    assert compiled_cluster.router_lands_on_arrivals(np.array([0.0, 0.0, 0.1, 0.30000000000000004, 7.5]))
    assert compiled_cluster.router_lands_on_arrivals(np.zeros(0))


@pytest.fixture(scope="module")
def methods_profile(tmp_path_factory):
    from tests.synthetic import make_profile

    return make_profile(tmp_path_factory.mktemp("profiles") / "methods", drafters=("ngram", "eagle"))


@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_the_compiled_cluster_is_the_simpy_cluster_for_other_drafters(run_config, monkeypatch, methods_profile,
                                                                      method):
    """A host matcher's proposals (rows that propose only where the context matches) and a head's lag."""
    fast, slow = both(run_config, monkeypatch, profile=str(methods_profile), cluster__replicas=3,
                      workload__rate=40.0, cluster__router="least-tokens",
                      speculative__config={"method": method, "num_speculative_tokens": 3})
    assert_identical(slow, fast)


@pytest.mark.parametrize("router", ["prefix-aware", "prefix-aware:prefix=1:queue=2:kv=0.5", "prefix-aware:queue=0"])
@pytest.mark.parametrize("replicas", [1, 3])
def test_prefix_aware_compiled_is_the_simpy_cluster(run_config, monkeypatch, tmp_path, router, replicas):
    """Groups sharing system prompts and repeated prompts, in bursts: the prefix, queue and KV scores all vary."""
    import pandas as pd

    rng = np.random.default_rng(replicas)
    n = 150
    path = tmp_path / "shared.csv"
    pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 20, n)).round(2), "prompt_tokens": rng.integers(300, 900, n),
                  "output_tokens": rng.integers(1, 40, n), "prefix_id": rng.integers(0, 4, n),
                  "prefix_tokens": 256, "prompt_id": rng.integers(0, 30, n)}).to_csv(path, index=False)
    fast, slow = both(run_config, monkeypatch, workload__trace=str(path), cluster__replicas=replicas,
                      cluster__router=router, engine__scheduler="vllm-v1", engine__kv_cache_tokens=3000)
    assert_identical(slow, fast)
    assert fast.summary["prefix_cache_hits"] > 0


def test_growing_queues_and_buffers_change_nothing(run_config, monkeypatch):
    """The call returns to Python to grow a full queue or make room for records and resumes where it was."""
    from sim.serving.queues import RoutedQueue

    monkeypatch.setattr(RoutedQueue, "INITIAL_CAPACITY", 2)
    monkeypatch.setattr(compiled_cluster, "RECORD_ROOM", 3)
    monkeypatch.setattr(compiled_cluster, "ITL_ROOM", 5)
    fast, slow = both(run_config, monkeypatch, cluster__replicas=3, workload__rate=50.0,
                      cluster__router="least-requests", engine__scheduler="vllm-v1")
    assert_identical(slow, fast)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.integers(1, 40), replicas=st.integers(1, 4), router=st.sampled_from(ROUTERS + ("prefix-aware",)),
       scheduler=st.sampled_from(["vllm-v1", "v0"]), rate=st.sampled_from([1.0, 20.0, 200.0, float("inf")]),
       output=st.sampled_from(["1", "4", "uniform:1:30"]), batch=st.integers(1, 6), seed=st.integers(0, 5))
def test_small_random_clusters_are_the_simpy_clusters(run_config, monkeypatch, requests, replicas, router,
                                                      scheduler, rate, output, batch, seed):
    if router == "prefix-aware":  # it reads vllm-v1's prefix cache
        scheduler = "vllm-v1"
    fast, slow = both(run_config, monkeypatch, workload__num_requests=requests, cluster__replicas=replicas,
                      cluster__router=router, engine__scheduler=scheduler, workload__rate=rate,
                      workload__output_tokens=output, engine__max_batch_size=batch, seed=seed)
    assert_identical(slow, fast)


def test_the_compiled_cluster_is_the_step_by_step_cluster(run_config):
    """Against every rule interpreted step by step (``engine.jit = off``), not only the SimPy cluster."""
    config = dict(**SMALL, cluster__replicas=3, workload__rate=40.0, cluster__router="least-requests")
    on = execute(prepare(run_config(**config)))
    off = execute(prepare(run_config(**{**config, "engine__jit": "off"})))
    assert_identical(off, on)


@pytest.mark.parametrize("overrides", [
    {"workload__max_concurrency": 4},  # sends wait on finishes
    {"policy__name": "adaptive"},  # a policy stepped in Python
    {"engine__jit": "off"},  # stepped in Python: routed
    {"output__timeline": "timeline.html"},  # the timeline explains each k, stepped in Python
])
def test_what_the_compiled_cluster_leaves_to_simpy(run_config, monkeypatch, tmp_path, overrides):
    if "output__timeline" in overrides:
        overrides = {"output__timeline": str(tmp_path / "timeline.html")}
    monkeypatch.setattr(cluster, "RUN_APART", False)  # round-robin's replicas would run apart, each in SimPy
    simpy_runs = []
    simulate = cluster.simulate_cluster
    monkeypatch.setattr(cluster, "simulate_cluster", lambda d, loops: (simpy_runs.append(1), simulate(d, loops)))
    monkeypatch.setattr(compiled_cluster.CompiledCluster, "run",
                        lambda self: pytest.fail("the compiled cluster ran"))
    execute(prepare(run_config(**{**SMALL, "cluster__replicas": 2, "workload__rate": 20.0, **overrides})))
    assert simpy_runs == [1]


def test_the_routers_rules_are_one_rule_each():
    """sim/router.py's routers pick by the rules the kernel runs: the lowest index wins a tie."""
    assert first_least([3, 1, 1, 2], 4) == 1 and first_least([0], 1) == 0 and first_least(np.array([2, 2]), 2) == 0
    assert [in_turn(i, 3) for i in range(3)] == [1, 2, 0]
    assert compiled_cluster.fleet_size(1) == compiled_cluster.fleet_size(8) == 8
    assert compiled_cluster.fleet_size(9) == 16 and compiled_cluster.fleet_size(17) == 32
