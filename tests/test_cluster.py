"""A cluster of replicas behind a router: equivalence with one replica, conservation, routing, queueing."""

from __future__ import annotations

import json
from bisect import bisect_right

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbatch.commands.cli import main
from sim.errors import InputError
from sim.router import ROUTERS
from sim.simulate import execute, prepare, simulate

SMALL = dict(workload__num_requests=150, workload__prompt_tokens="uniform:16:256",
             workload__output_tokens="uniform:1:64")


def same_result(a, b) -> bool:
    return (a.requests.equals(b.requests) and a.steps.equals(b.steps)
            and json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True))


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("policy,batching", [("fixed", "continuous"), ("goodput", "continuous"),
                                             ("none", "continuous"), ("adaptive", "continuous"),
                                             ("fixed", "static")])
def test_a_one_replica_cluster_is_the_single_replica(run_config, router, policy, batching):
    """The routed replica (queue fed by the router) reproduces the arrival-array replica to the bit."""
    config = run_config(**SMALL, workload__rate=6.0, cluster__router=router, policy__name=policy,
                        engine__batching=batching, engine__max_batch_size=8,
                        acceptance__distribution="beta")
    direct = execute(prepare(config))
    routed = execute(prepare(config), routed=True)
    assert same_result(direct, routed)
    assert direct.replicas is None and "replica" not in direct.requests


@pytest.mark.parametrize("limit,rate", [(1, 6.0), (3, 6.0), (8, float("inf")), (4, 30.0)])
@pytest.mark.parametrize("scheduler", ["continuous", "static", "vllm-v1"])
def test_a_one_replica_cluster_behind_a_concurrency_limit_is_the_single_replica(run_config, limit, rate, scheduler):
    """The cluster's client (its slots freed by finishes reported through the dispatcher) sends
    and serves exactly as the single replica's concurrency-limited queue."""
    overrides = dict(**SMALL, workload__rate=rate, workload__max_concurrency=limit, engine__max_batch_size=8,
                     acceptance__distribution="beta")
    if scheduler == "static":
        overrides.update(engine__batching="static")
    elif scheduler == "vllm-v1":
        overrides.update(engine__scheduler="vllm-v1", engine__kv_cache_tokens=1200)
    config = run_config(**overrides)
    direct = execute(prepare(config))
    routed = execute(prepare(config), routed=True)
    assert same_result(direct, routed)


def test_one_replica_run_folder_is_unchanged_by_cluster_settings(capsys, tmp_path, synthetic_profile):
    common = ["run", "--profile", str(synthetic_profile), "--num-requests", "80", "--rate", "5"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--replicas", "1", "--router", "least-tokens", "--out", str(tmp_path / "one")]) == 0
    for name in ("config.toml", "summary.json", "requests.csv", "steps.csv"):
        plain = (tmp_path / "plain" / name).read_text().replace(str(tmp_path / "plain"), "OUT")
        assert plain == (tmp_path / "one" / name).read_text().replace(str(tmp_path / "one"), "OUT"), name


def check_replica(req: pd.DataFrame, steps: pd.DataFrame) -> None:
    """One replica's requests and steps obey the single replica's invariants."""
    assert int(steps.emitted_tokens.sum()) == int(req.output_tokens.sum())
    assert int(steps.emitted_tokens[steps.phase == 0].sum()) == len(req)
    assert (steps.start_s.to_numpy()[1:] >= steps.end_s.to_numpy()[:-1]).all()  # one engine, never overlapping
    assert int(req.decode_steps.sum()) == int(steps.running[steps.phase == 1].sum())
    assert int(req.drafted_tokens.sum()) == int(steps.drafted_tokens.sum())
    assert (req.scheduled_s >= req.arrival_s).all() and (req.finish_s >= req.first_token_s).all()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replicas=st.integers(2, 5), router=st.sampled_from(ROUTERS), seed=st.integers(0, 1000),
       batching=st.sampled_from(["continuous", "static"]))
def test_every_request_is_served_once_by_exactly_one_replica(run_config, replicas, router, seed, batching):
    result = simulate(run_config(**SMALL, workload__rate=4.0 * replicas, cluster__replicas=replicas,
                                 cluster__router=router, engine__batching=batching, engine__max_batch_size=8,
                                 seed=seed))
    req, steps = result.requests, result.steps
    assert not req[["scheduled_s", "first_token_s", "finish_s"]].isna().any().any()
    assert set(req.replica) <= set(range(replicas)) and set(steps.replica) <= set(range(replicas))
    assert int(steps.emitted_tokens.sum()) == int(req.output_tokens.sum())
    for r in range(replicas):
        check_replica(req[req.replica == r], steps[steps.replica == r])
    assert sum(m["requests"] for m in result.replicas) == len(req) == result.summary["completed"]
    assert [m["completed"] for m in result.replicas] == [int((req.replica == r).sum()) for r in range(replicas)]
    # Steps are listed by start time across replicas.
    assert (np.diff(steps.start_s.to_numpy()) >= 0).all()


def test_round_robin_sends_request_i_to_replica_i_mod_n(run_config):
    result = simulate(run_config(**SMALL, workload__rate=20.0, cluster__replicas=3, cluster__router="round-robin"))
    req = result.requests
    assert (req.replica.to_numpy() == req.request_id.to_numpy() % 3).all()


def skewed_trace(tmp_path, n: int = 40):
    """Even requests long (75 output tokens: about 1.5 s of decoding on the synthetic profile),
    odd ones a single token, one request every 0.5 s."""
    out = np.where(np.arange(n) % 2 == 0, 75, 1)
    path = tmp_path / "skewed.csv"
    pd.DataFrame({"arrival_s": 0.5 * np.arange(n), "prompt_tokens": 64, "output_tokens": out}).to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize("router", ["least-requests", "least-tokens"])
def test_least_loaded_routers_spread_long_requests_that_round_robin_piles_on_one(run_config, tmp_path, router):
    """Round-robin with two replicas sends every long request to replica 0. A short request
    finishes with its prefill, so when a long one arrives (every 1 s) the previous long one
    (1.5 s) is still running and the one before it has finished: a least-loaded router
    sends it to the other replica, and the long ones alternate."""
    trace = skewed_trace(tmp_path)
    results = {name: simulate(run_config(workload__trace=trace, cluster__replicas=2, cluster__router=name,
                                         policy__name="none"))
               for name in ("round-robin", router)}
    rr, least = results["round-robin"].requests, results[router].requests
    long_rr, long_least = rr[rr.output_tokens > 1], least[least.output_tokens > 1]
    assert (long_rr.replica == 0).all()
    assert (long_least.replica.to_numpy() == np.arange(20) % 2).all()
    assert long_least.e2el_s.max() < long_rr.e2el_s.max()  # no long one shares its batch with another
    busy_rr = [m["busy_time_s"] for m in results["round-robin"].replicas]
    busy = [m["busy_time_s"] for m in results[router].replicas]
    assert max(busy_rr) > 5 * min(busy_rr) and max(busy) < 1.1 * min(busy)


def lindley_waits(arrival: np.ndarray, service: float) -> np.ndarray:
    """FIFO single-server waits: W[n+1] = max(0, W[n] + S - (A[n+1] - A[n]))."""
    waits = np.zeros(arrival.shape[0])
    for i in range(1, arrival.shape[0]):
        waits[i] = max(0.0, waits[i - 1] + service - (arrival[i] - arrival[i - 1]))
    return waits


def test_round_robin_replicas_are_erlang_d_1_queues(run_config):
    """One sequence at a time, fixed lengths, no speculation: each replica is a FIFO server with
    deterministic service S fed every N-th Poisson arrival (Erlang-N gaps). Its waits follow
    Lindley's recursion exactly, and with gaps more regular than Poisson the mean wait is below
    the M/D/1 wait (Pollaczek-Khinchine) that one replica fed at the per-replica rate would see."""
    fixed = dict(policy__name="none", engine__batching="static", engine__max_batch_size=1,
                 workload__prompt_tokens=128, workload__output_tokens=3, workload__num_requests=6000)
    probe = simulate(run_config(**fixed, workload__rate=1.0)).requests
    service = float((probe.finish_s - probe.scheduled_s).iloc[0])
    replicas, rho = 3, 0.7
    result = simulate(run_config(**fixed, workload__rate=replicas * rho / service, cluster__replicas=replicas,
                                 cluster__router="round-robin", seed=3))
    req = result.requests
    md1_wait = rho * service / (2 * (1 - rho))
    for r in range(replicas):
        mine = req[req.replica == r]
        assert np.allclose(mine.queue_s.to_numpy(), lindley_waits(mine.arrival_s.to_numpy(), service), atol=1e-9)
    assert 0.2 * md1_wait < float(req.queue_s.mean()) < 0.75 * md1_wait


def jsq_waits(arrival: np.ndarray, service: float, servers: int) -> tuple[np.ndarray, np.ndarray]:
    """Join-the-shortest-queue by hand: each arrival goes to the server with the fewest
    requests not yet finished (lowest index on a tie), FIFO, deterministic service."""
    finishes: list[list[float]] = [[] for _ in range(servers)]
    waits, chosen = np.zeros(arrival.shape[0]), np.zeros(arrival.shape[0], dtype=np.int64)
    for i, t in enumerate(arrival):
        counts = [len(f) - bisect_right(f, t) for f in finishes]  # each server's finishes are increasing
        s = counts.index(min(counts))
        start = max(t, finishes[s][-1] if finishes[s] else 0.0)
        finishes[s].append(start + service)
        waits[i], chosen[i] = start - t, s
    return waits, chosen


def test_least_requests_is_join_the_shortest_queue(run_config):
    """With one sequence at a time and fixed lengths, least-requests routing is JSQ: every
    routing decision and every wait matches a hand-written JSQ of FIFO deterministic servers."""
    fixed = dict(policy__name="none", engine__batching="static", engine__max_batch_size=1,
                 workload__prompt_tokens=128, workload__output_tokens=3, workload__num_requests=3000)
    probe = simulate(run_config(**fixed, workload__rate=1.0)).requests
    service = float((probe.finish_s - probe.scheduled_s).iloc[0])
    req = simulate(run_config(**fixed, workload__rate=3 * 0.8 / service, cluster__replicas=3,
                              cluster__router="least-requests", seed=5)).requests
    waits, chosen = jsq_waits(req.arrival_s.to_numpy(), service, 3)
    assert (req.replica.to_numpy() == chosen).all()
    assert np.allclose(req.queue_s.to_numpy(), waits, atol=1e-9)


def test_cluster_runs_are_deterministic_and_replicas_draw_their_own_acceptance(run_config):
    config = run_config(**SMALL, workload__rate=12.0, cluster__replicas=3, cluster__router="least-tokens",
                        policy__name="goodput")
    a, b = simulate(config), simulate(config)
    assert same_result(a, b) and a.replicas == b.replicas
    # Same requests, same batches on every replica: only the acceptance streams differ.
    trace_cfg = dict(workload__num_requests=6, workload__rate=1e-3, workload__prompt_tokens=64,
                     workload__output_tokens=64, cluster__replicas=3, cluster__router="round-robin")
    req = simulate(run_config(**trace_cfg)).requests
    assert req.accepted_tokens.iloc[:3].nunique() > 1


@pytest.mark.parametrize("flags,needle", [
    (["--replicas", "0"], "--replicas: cluster.replicas: must be at least 1, got 0"),
    (["--router", "random"], "--router: cluster.router: 'random' is not one of round-robin, least-requests"),
])
def test_bad_cluster_flags_are_one_line_and_write_nothing(capsys, tmp_path, synthetic_profile, flags, needle):
    out = tmp_path / "run"
    code = main(["run", "--profile", str(synthetic_profile), "--num-requests", "10", *flags, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_bad_cluster_setting_in_a_file_names_file_and_line(capsys, tmp_path, synthetic_profile):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'profile = "{synthetic_profile}"\n[cluster]\nreplicas = 2\nrouter = "fastest"\n')
    code = main(["run", "--config", str(cfg), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and f"{cfg}:4" in err and "cluster.router" in err


def test_cli_cluster_run_reports_replicas(capsys, tmp_path, synthetic_profile):
    out = tmp_path / "run"
    assert main(["run", "--profile", str(synthetic_profile), "--num-requests", "120", "--rate", "12",
                 "--replicas", "2", "--router", "least-requests", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "2 replicas, least-requests" in stdout and "mean E2EL ms" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cluster"] == {"replicas": 2, "router": "least-requests"}
    assert [m["replica"] for m in summary["replicas"]] == [0, 1]
    requests, steps = pd.read_csv(out / "requests.csv"), pd.read_csv(out / "steps.csv")
    assert sorted(requests.replica.unique()) == [0, 1] and sorted(steps.replica.unique()) == [0, 1]
    assert sum(m["requests"] for m in summary["replicas"]) == summary["metrics"]["completed"] == 120
    assert 'router = "least-requests"' in (out / "config.toml").read_text()
    # The resolved config reruns the same cluster.
    assert main(["run", "--config", str(out / "config.toml"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "requests.csv").read_bytes() == (out / "requests.csv").read_bytes()


@pytest.mark.parametrize("scheduler,jit", [("continuous", "off"), ("continuous", "on"), ("vllm-v1", "off"),
                                           ("vllm-v1", "on")])
def test_queues_that_grow_change_nothing(run_config, monkeypatch, scheduler, jit):
    """A routed queue and its loop's per-request arrays start small and double as requests come:
    from two entries, a one-replica cluster still reproduces the arrival-array replica to the bit."""
    from sim.jit import numba_available
    from sim.serving.queues import RoutedQueue

    if jit == "on" and not numba_available():
        pytest.skip("numba is not installed")
    overrides = dict(**SMALL, workload__rate=6.0, engine__max_batch_size=8, engine__jit=jit)
    if scheduler == "vllm-v1":  # preemptions: the v1 loop's own per-request arrays grow too
        overrides.update(engine__scheduler="vllm-v1", engine__kv_cache_tokens=1200)
    config = run_config(**overrides)
    direct = execute(prepare(config))
    monkeypatch.setattr(RoutedQueue, "INITIAL_CAPACITY", 2)
    routed = execute(prepare(config), routed=True)
    assert same_result(direct, routed)


def test_each_replicas_records_are_rebuilt_from_the_merged_ones(run_config, monkeypatch):
    """The per-replica breakdown reads each replica's records back from the merged ones (the
    loops' own are freed as they merge): they are the loops' records, value for value."""
    import sim.cluster as cluster

    own, rebuilt = [], []
    merge = cluster.merge_loops

    def keep(loops, n, shares=None, **merging):
        for loop in loops:
            rec = cluster._trimmed(loop.records(), loop.queue.count)
            own.append({name: np.array(getattr(rec, name), copy=True) if name != "steps" else
                        {f: v.copy() for f, v in rec.steps.items()}
                        for name in ("first_token_s", "finish_s", "decode_steps", "steps", "itl_values",
                                     "itl_weights")})
        records = merge(loops, n, shares, **merging)
        rebuilt.extend(records.per_replica())
        return records

    monkeypatch.setattr(cluster, "merge_loops", keep)
    execute(prepare(run_config(**SMALL, workload__rate=30.0, cluster__replicas=3, engine__max_batch_size=4)))
    assert len(own) == len(rebuilt) == 3
    for mine, back in zip(own, rebuilt):
        for name, values in mine.items():
            if name == "steps":
                assert all(np.array_equal(v, back.steps[f]) for f, v in values.items())
            else:
                assert np.array_equal(values, getattr(back, name), equal_nan=True), name


@pytest.mark.parametrize("block", [7, 1 << 16])
def test_each_replicas_step_totals_are_those_of_its_steps(run_config, monkeypatch, block):
    """The breakdown takes each replica's steps as totals gathered a block at a time: the totals of the copy."""
    import sim.cluster as cluster
    from sim import metrics

    monkeypatch.setattr(metrics, "STEP_BLOCK", block)
    records = []
    merge = cluster.merge_loops
    monkeypatch.setattr(cluster, "merge_loops", lambda *args, **merging: records.append(merge(*args, **merging))
                        or records[-1])
    execute(prepare(run_config(**SMALL, workload__rate=30.0, cluster__replicas=3, engine__max_batch_size=4,
                               engine__scheduler="vllm-v1")))
    whole = [metrics.step_totals(rec.steps) for rec in records[0].per_replica()]
    assert [rec.steps for rec in records[0].per_replica(step_totals=True)] == whole
    assert sum(t.steps for t in whole) == len(records[0].step_replica)
    assert block > 7 or min(t.steps for t in whole) > 3 * block  # several blocks a replica


@pytest.mark.parametrize("limit", [None, 2, 3, 5])
@pytest.mark.parametrize("output", ["8", "uniform:1:6"])
@pytest.mark.parametrize("router", ["least-requests", "least-tokens"])
@pytest.mark.parametrize("scheduler", ["continuous", "vllm-v1"])
def test_results_do_not_depend_on_the_order_simpy_runs_replicas_in(run_config, monkeypatch, limit, output, router,
                                                                   scheduler):
    """Replicas' steps that end at the same instant (equal fixed lengths make many) are applied in
    SimPy's order; what the router sees must not depend on it, with or without a client limit
    (whose finishes free sends at those very instants)."""
    import sim.cluster as cluster
    from sim.serving.clock import simulate_cluster

    overrides = dict(workload__num_requests=30, workload__rate=float("inf"), workload__prompt_tokens="16",
                     workload__output_tokens=output, engine__max_batch_size=4, policy__name="none",
                     cluster__replicas=2, cluster__router=router, workload__max_concurrency=limit)
    if scheduler == "vllm-v1":
        overrides.update(engine__scheduler="vllm-v1")
    config = run_config(**overrides)
    monkeypatch.setattr(cluster, "compiled_cluster_for", lambda *args: None)  # the SimPy cluster, whose order this is
    forward = execute(prepare(config))
    monkeypatch.setattr(cluster, "simulate_cluster", lambda dispatcher, loops: simulate_cluster(dispatcher, loops[::-1]))
    backward = execute(prepare(config))
    assert same_result(forward, backward)


@pytest.mark.parametrize("limit", [None, 3])
@pytest.mark.parametrize("scheduler", ["continuous", "vllm-v1"])
def test_each_replica_is_freed_as_it_merges_without_the_garbage_collector(run_config, monkeypatch, limit, scheduler):
    """No cycle keeps a finished replica: not the dispatcher's, the loop's hooks, nor an idle
    replica's clock process still waiting for a request when the run ends (its generator is closed)."""
    import gc
    import weakref

    import sim.cluster as cluster

    refs = []
    merge = cluster.merge_loops

    def watching(loops, n, shares=None, **merging):
        refs.extend(weakref.ref(loop) for loop in loops)
        return merge(loops, n, shares, **merging)

    monkeypatch.setattr(cluster, "merge_loops", watching)
    overrides = dict(**SMALL, workload__rate=2.0, cluster__replicas=4, engine__max_batch_size=4,
                     workload__max_concurrency=limit)
    if scheduler == "vllm-v1":
        overrides.update(engine__scheduler="vllm-v1", engine__kv_cache_tokens=4000)
    config = run_config(**overrides)
    enabled = gc.isenabled()
    gc.disable()
    try:
        execute(prepare(config))
        assert len(refs) == 4 and all(ref() is None for ref in refs)
    finally:
        gc.collect()
        if enabled:
            gc.enable()


def test_request_counts_are_int32_alike_for_one_replica_and_a_cluster(run_config):
    """A request's counts are int32 (half the memory of a million requests); a cluster's merged records
    keep the replicas' type, so a one-replica run's tables are the single replica's, types included."""
    config = run_config(**SMALL, workload__rate=12.0, cluster__replicas=3)
    cluster = execute(prepare(config))
    single = execute(prepare(run_config(**SMALL, workload__rate=4.0)))
    for result in (cluster, single):
        for column in ("decode_steps", "drafted_tokens", "accepted_tokens"):
            assert result.requests[column].dtype == np.int32
        assert result.itl[1].dtype == np.int32 and result.itl[1].min() >= 1
    assert cluster.requests["replica"].tolist() == [i % 3 for i in range(150)]


@pytest.mark.parametrize("prompt,output,k,why", [
    ("16", str(2**31 // 3 + 1), 3, "may draft up to 3 tokens a step"),  # drafts: at most k a step
    (str(2**30), str(2**30), 0, "prompt and output tokens"),  # cached tokens: at most prompt and output
])
def test_a_request_whose_counts_could_pass_int32_is_refused(run_config, prompt, output, k, why):
    """A request's counts are int32: a request that could overflow one is refused before the run."""
    config = run_config(workload__num_requests=2, workload__prompt_tokens=prompt, workload__output_tokens=output,
                        policy__name="fixed" if k else "none", **({"policy__k": k} if k else {}))
    with pytest.raises(InputError, match=f"workload.output_tokens.*{why}: beyond the 2147483647"):
        prepare(config)
