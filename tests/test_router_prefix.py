"""The prefix-aware router (llm-d's endpoint picker): its scores, its spec, affinity against load,
conservation and determinism on clusters of vllm-v1 replicas with prefix caching."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbatch.commands.cli import main
from sim.router import MAX_PREFIX_BLOCKS, PrefixAware, make_router, parse_router, prefix_scores, queue_scores
from sim.scheduler.kvcache import KVCacheManager, held_keys, key_of, request_block_keys
from sim.scheduler.layout import REQ_PREFIX_BLOCKS, REQ_PREFIX_KEY, REQ_PROMPT, REQ_PROMPT_BLOCKS, REQ_PROMPT_KEY
from sim.simulate import execute, prepare, simulate
from tests.test_cluster import same_result

V1 = dict(engine__scheduler="vllm-v1", engine__kv_cache_tokens=4096, engine__max_batch_size=8)


class FakeReplica:
    """A replica as the router sees it: a waiting queue, a KV usage and a key -> block map."""

    block_size = 16

    def __init__(self, held: list[int], waiting: int = 0, usage: float = 0.0, keys: int = 64) -> None:
        self._key_block = np.full(keys, -1, dtype=np.int64)
        self._key_block[held] = np.arange(len(held))
        self.waiting, self.usage = waiting, usage

    def waiting_requests(self) -> int:
        return self.waiting

    def kv_usage(self) -> float:
        return self.usage

    def key_block(self) -> np.ndarray:
        return self._key_block


def request(prompt: int, prefix_key: int = 0, prefix_blocks: int = 0, prompt_key: int = 0,
            prompt_blocks: int = 0) -> np.ndarray:
    col = np.zeros(7, dtype=np.int64)
    col[REQ_PROMPT], col[REQ_PREFIX_KEY], col[REQ_PREFIX_BLOCKS] = prompt, prefix_key, prefix_blocks
    col[REQ_PROMPT_KEY], col[REQ_PROMPT_BLOCKS] = prompt_key, prompt_blocks
    return col


# ------------------------------------------------------------------ the scores
def test_request_block_keys_are_key_of_for_the_shared_blocks():
    rng = np.random.default_rng(0)
    for _ in range(200):
        prefix_blocks = int(rng.integers(0, 6))
        col = request(int(rng.integers(1, 200)), int(rng.integers(0, 50)), prefix_blocks, int(rng.integers(50, 99)),
                      prefix_blocks + int(rng.integers(0, 6)))
        reqi = col[:, None]
        blocks = int(rng.integers(0, 12))
        want = [key for key in (key_of(reqi, 0, j, 16) for j in range(blocks))]
        shared = next((j for j, key in enumerate(want) if key < 0), blocks)  # up to the first of its own
        assert all(key < 0 for key in want[shared:])
        assert request_block_keys(col, blocks).tolist() == want[:shared]


def test_the_prefix_score_is_the_share_of_leading_blocks_each_replica_holds():
    # 160-token prompt: 10 full blocks; the first 4 a shared prefix (keys 0..3), the rest the
    # request's own prompt group (keys 20..25 for blocks 4..9).
    col = request(160, prefix_key=0, prefix_blocks=4, prompt_key=20, prompt_blocks=10)
    replicas = [FakeReplica([]), FakeReplica([0, 1, 2, 3]), FakeReplica([0, 1, 3]),
                FakeReplica([0, 1, 2, 3, 24, 25, 26, 27, 28, 29]), FakeReplica([1, 2, 3])]
    assert prefix_scores(replicas, col).tolist() == [0.0, 0.4, 0.2, 1.0, 0.0]
    # a prompt under one block scores 0 everywhere; a long one counts at most MAX_PREFIX_BLOCKS blocks
    assert prefix_scores(replicas, request(15, prefix_blocks=1)).tolist() == [0.0] * 5
    long_col = request(16 * 1000, prefix_key=0, prefix_blocks=4)
    assert prefix_scores(replicas[:2], long_col).tolist() == [0.0, 4 / MAX_PREFIX_BLOCKS]


def test_queue_and_kv_scores_follow_the_inference_extension():
    router = PrefixAware(prefix=0, queue=1, kv=0)
    replicas = [FakeReplica([], waiting=w) for w in (4, 0, 2, 4)]
    assert queue_scores(np.array([4.0, 0, 2, 4])).tolist() == [0.0, 1.0, 0.5, 0.0]
    assert router.scores(replicas, request(64)).tolist() == [0.0, 1.0, 0.5, 0.0]
    assert router.scores([FakeReplica([], waiting=3)] * 3, request(64)).tolist() == [1.0, 1.0, 1.0]
    kv = PrefixAware(prefix=0, queue=0, kv=1)
    assert kv.scores([FakeReplica([], usage=u) for u in (0.25, 1.0, 0.0)], request(64)).tolist() == [0.75, 0.0, 1.0]


def test_equal_loads_go_to_the_replica_that_holds_the_prefix_and_ties_to_the_lowest_index():
    col = request(160, prefix_key=0, prefix_blocks=8)
    router = make_router("prefix-aware")
    assert router.choose([FakeReplica([]), FakeReplica([0, 1]), FakeReplica(list(range(8)))], col) == 2
    assert router.choose([FakeReplica([]), FakeReplica([])], col) == 0
    assert router.choose([FakeReplica([0]), FakeReplica([0]), FakeReplica([])], col) == 0


def test_load_wins_over_affinity_when_the_weights_say_so():
    # Replica 0 holds the whole prompt but has 4 requests waiting; replica 1 holds nothing and none.
    col = request(160, prefix_key=0, prefix_blocks=10)
    replicas = [FakeReplica(list(range(10)), waiting=4, usage=0.5), FakeReplica([], waiting=0, usage=0.5)]
    assert make_router("prefix-aware").choose(replicas, col) == 0  # llm-d's 3:2:2: 3 * 1 > 2 * 1
    assert make_router("prefix-aware:prefix=1:queue=2").choose(replicas, col) == 1  # 1 * 1 < 2 * 1
    assert make_router("prefix-aware:prefix=2:queue=2").choose(replicas, col) == 0  # a tie: the lowest index
    # a fuller cache counts against the holder too: usage 0.9 against 0.1 at the default weights
    replicas = [FakeReplica(list(range(5)), usage=0.9), FakeReplica([], usage=0.1)]  # prefix share 0.5
    assert make_router("prefix-aware").choose(replicas, col) == 1  # 3 * 0.5 + 2 * 0.1 < 2 * 0.9


def test_scoring_reads_the_cache_without_moving_anything():
    manager = KVCacheManager(num_blocks=32, max_blocks_per_request=8, slots=4, num_keys=16)
    manager.key_block[[0, 1, 2]] = [5, 6, 7]
    before = (manager.kv.copy(), manager.key_block.copy())
    held = held_keys(np.array([0, 1, 2, 3]), manager.key_block)
    assert held.tolist() == [True, True, True, False]
    assert (manager.kv == before[0]).all() and (manager.key_block == before[1]).all()


# ------------------------------------------------------------------ the spec
@pytest.mark.parametrize("text,canonical", [
    ("prefix-aware", "prefix-aware"), ("prefix-aware:prefix=3:queue=2:kv=2", "prefix-aware"),
    ("prefix-aware:kv=0", "prefix-aware:prefix=3:queue=2:kv=0"),
    ("prefix-aware: queue=1.5 :prefix=1", "prefix-aware:prefix=1:queue=1.5:kv=2"),
    ("least-requests", "least-requests")])
def test_router_specs_have_one_spelling(text, canonical):
    assert parse_router(text).text == canonical


@pytest.mark.parametrize("flag,message", [
    ("prefix-aware:cache=3", "'cache=3' in 'prefix-aware:cache=3' is not one of prefix=W, queue=W, kv=W"),
    ("prefix-aware:prefix=-1", "weight prefix=-1 must be a number >= 0"),
    ("prefix-aware:prefix=x", "weight prefix=x must be a number >= 0"),
    ("prefix-aware:prefix=nan", "weight prefix=nan must be a number >= 0"),
    ("prefix-aware:kv=1:kv=2", "'prefix-aware:kv=1:kv=2' gives 'kv' twice"),
    ("prefix-aware:prefix=0:queue=0:kv=0", "at least one weight must be above 0"),
    ("least-tokens:prefix=3", "'least-tokens' takes no parameters"),
    ("prefix", "'prefix' is not one of round-robin, least-requests, least-tokens, prefix-aware")])
def test_a_bad_router_spec_is_one_line_before_any_work(capsys, tmp_path, synthetic_profile, flag, message):
    out = tmp_path / "out"
    code = main(["run", "--profile", str(synthetic_profile), "--scheduler", "vllm-v1", "--replicas", "2",
                 "--router", flag, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--router: cluster.router:" in err and message in err
    assert not out.exists()


@pytest.mark.parametrize("engine,why", [("scheduler = \"v0\"", "the scheduler is v0"),
                                        ("scheduler = \"vllm-v1\"\nenable_prefix_caching = false",
                                         "prefix caching is off")])
def test_prefix_aware_without_vllm_v1_prefix_caching_is_refused(capsys, tmp_path, synthetic_profile, engine, why):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'profile = "{synthetic_profile}"\n[engine]\n{engine}\n[cluster]\nreplicas = 2\n'
                   f'router = "prefix-aware"\n')
    line = cfg.read_text().splitlines().index('router = "prefix-aware"') + 1
    code = main(["run", "--config", str(cfg), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{cfg}:{line}" in err and "cluster.router" in err
    assert "needs --scheduler vllm-v1 with --enable-prefix-caching" in err and why in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ whole runs
def test_affinity_splits_groups_that_arrive_together(run_config, tmp_path):
    """Two system prompts (512 tokens each) behind 600-token prompts. The first of each group
    arrive together: group 1's finds replica 0 with a request waiting and goes to replica 1.
    Then one request every 5 s, groups taking turns, each finished before the next arrives: the
    replicas are idle and equally loaded at every routing and only their caches differ. The
    prefix-aware router sends each group back to the replica holding it; least-requests sends
    every one to replica 0 (a tie), whose 50 blocks cannot keep both groups' 32 (each request
    evicts part of the other group's prefix)."""
    n = 10
    arrivals = np.concatenate(([0.0, 0.0], 5.0 + 5.0 * np.arange(n - 2)))
    path = tmp_path / "pair.csv"
    pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": 600, "output_tokens": 4, "prefix_id": np.arange(n) % 2,
                  "prefix_tokens": 512}).to_csv(path, index=False)
    base = dict(V1, engine__kv_cache_tokens=800, workload__trace=str(path), cluster__replicas=2)
    aware = simulate(run_config(**base, cluster__router="prefix-aware"))
    assert aware.requests.replica.tolist() == [i % 2 for i in range(n)]
    assert aware.summary["prefix_cache_hits"] == (n - 2) * 512
    least = simulate(run_config(**base, cluster__router="least-requests"))
    assert least.requests.replica.tolist()[2:] == [0] * (n - 2)
    assert least.summary["prefix_cache_hits"] < aware.summary["prefix_cache_hits"]
    # without the prefix term (weights 0:2:2) the router is load-only: it too sends the idle-time ones to 0
    load_only = simulate(run_config(**base, cluster__router="prefix-aware:prefix=0"))
    assert load_only.requests.replica.tolist()[2:] == [0] * (n - 2)


def test_a_burst_stays_with_its_prefix_unless_the_queue_weighs_more(run_config, tmp_path):
    """One request of a group warms replica 0's cache; 6 more of the group arrive together later,
    routed one after another at that instant. The queue score is min-max normalised, so a replica
    with any request waiting scores 0 against an empty one's 1. At llm-d's 3:2:2 the prefix share
    (32 of 37 blocks: 3 x 0.86 = 2.6) outweighs it (2): all 6 join replica 0. At prefix=1 the queue
    wins (0.86 < 2) whenever replica 0 has more waiting, and the burst alternates."""
    path = tmp_path / "burst.csv"
    pd.DataFrame({"arrival_s": [0.0] + [10.0] * 6, "prompt_tokens": 600, "output_tokens": 4, "prefix_id": 0,
                  "prefix_tokens": 512}).to_csv(path, index=False)
    base = dict(V1, workload__trace=str(path), cluster__replicas=2)
    affinity = simulate(run_config(**base, cluster__router="prefix-aware")).requests.replica.tolist()
    assert affinity == [0] * 7
    load = simulate(run_config(**base, cluster__router="prefix-aware:prefix=1")).requests.replica.tolist()
    assert load == [0, 0, 1, 0, 1, 0, 1]


@pytest.mark.parametrize("policy", ["fixed", "goodput"])
def test_a_one_replica_prefix_aware_cluster_is_the_single_replica(run_config, policy):
    config = run_config(workload__num_requests=150, workload__prompt_tokens="uniform:16:256",
                        workload__output_tokens="uniform:1:64", workload__shared_prefix="3:4:64",
                        workload__rate=6.0, cluster__router="prefix-aware", policy__name=policy, **V1)
    assert same_result(execute(prepare(config)), execute(prepare(config), routed=True))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replicas=st.integers(2, 4), seed=st.integers(0, 1000), groups=st.integers(1, 6),
       system=st.sampled_from([0, 40, 200]), kv=st.sampled_from([1024, 4096]),
       weights=st.tuples(*[st.integers(0, 4)] * 3).filter(any), limit=st.sampled_from([None, 6]))
def test_every_request_and_token_is_served_once(run_config, replicas, seed, groups, system, kv, weights, limit):
    spec = "prefix-aware:prefix={}:queue={}:kv={}".format(*weights)
    result = simulate(run_config(workload__num_requests=120, workload__prompt_tokens="uniform:16:300",
                                 workload__output_tokens="uniform:1:48", workload__rate=5.0 * replicas,
                                 workload__shared_prefix=f"{groups}:3:{system}", cluster__replicas=replicas,
                                 workload__max_concurrency=limit, cluster__router=spec, seed=seed,
                                 **dict(V1, engine__kv_cache_tokens=kv)))
    req, steps = result.requests, result.steps
    assert not req[["scheduled_s", "first_token_s", "finish_s"]].isna().any().any()
    assert sorted(req.request_id) == list(range(120)) and set(req.replica) <= set(range(replicas))
    assert int(steps.emitted_tokens.sum()) == int(req.output_tokens.sum())
    for r in range(replicas):
        check_v1_replica(req[req.replica == r], steps[steps.replica == r])
    assert 0 <= result.summary["prefix_cache_hits"] <= result.summary["prefix_cache_queries"]
    assert sum(m["requests"] for m in result.replicas) == 120 == result.summary["completed"]
    # each replica's own scheduler figures add up to the cluster's (a peak: the largest)
    for name in ("prefix_cache_queries", "prefix_cache_hits", "resumed_prefix_cache_queries", "num_preemptions"):
        assert sum(m[name] for m in result.replicas) == result.summary[name], name
    assert max(m["peak_kv_blocks"] for m in result.replicas) == result.summary["peak_kv_blocks"]
    assert all(0 <= m["prefix_cache_hits"] <= m["prefix_cache_queries"] for m in result.replicas)


def check_v1_replica(req: pd.DataFrame, steps: pd.DataFrame) -> None:
    """One vllm-v1 replica's books balance: every output token emitted once, every prompt token
    computed or found in its own cache (computed again only after a preemption), one engine."""
    assert int(steps.emitted_tokens.sum()) == int(req.output_tokens.sum())
    assert int(req.drafted_tokens.sum()) == int(steps.drafted_tokens.sum())
    assert (steps.start_s.to_numpy()[1:] >= steps.end_s.to_numpy()[:-1]).all()
    assert (req.scheduled_s >= req.arrival_s).all() and (req.finish_s >= req.first_token_s).all()
    fresh = int((req.prompt_tokens - req.num_cached_tokens).sum())
    computed = int(steps.prefill_tokens.sum())
    assert computed == fresh if int(req.num_preemptions.sum()) == 0 else computed >= fresh - int(
        req.num_cached_tokens.sum())


def test_same_config_and_seed_same_bytes(tmp_path, synthetic_profile, capsys):
    args = ["run", "--profile", str(synthetic_profile), "--scheduler", "vllm-v1", "--kv-cache-tokens", "3000",
            "--shared-prefix", "6:4:128", "--num-requests", "200", "--rate", "30", "--replicas", "3",
            "--router", "prefix-aware:queue=1", "--seed", "4"]
    for name in ("a", "b"):
        assert main([*args, "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    for name in ("summary.json", "requests.csv", "steps.csv", "config.toml"):
        a = (tmp_path / "a" / name).read_text().replace(str(tmp_path / "a"), "OUT")
        assert a == (tmp_path / "b" / name).read_text().replace(str(tmp_path / "b"), "OUT"), name
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["cluster"] == {"replicas": 3, "router": "prefix-aware:prefix=3:queue=1:kv=2"}
    assert 'router = "prefix-aware:prefix=3:queue=1:kv=2"' in (tmp_path / "a" / "config.toml").read_text()


def test_the_python_api_and_a_sweep_axis_take_the_same_spec(synthetic_profile):
    import specbatch

    common = dict(profile=str(synthetic_profile), scheduler="vllm-v1", kv_cache_tokens=3000, shared_prefix="4:2:128",
                  max_batch_size=8,
                  num_requests=60, rate=20, replicas=2)
    run = specbatch.run(router="prefix-aware:kv=1", **common)
    assert run.document()["cluster"]["router"] == run.config.cluster.router == "prefix-aware:prefix=3:queue=2:kv=1"
    table = specbatch.sweep({"scenario": {"profile": str(synthetic_profile), "workload": {
        "num_requests": 60, "rate": 20, "shared_prefix": "4:2:128"}, "engine": {"scheduler": "vllm-v1",
        "kv_cache_tokens": 3000, "max_batch_size": 8}, "cluster": {"replicas": 2}}, "axes": {"router": ["round-robin", "prefix-aware:kv=1"]}},
        executor="serial")
    aware = table[table["cluster.router"] == "prefix-aware:kv=1"]  # the axis value, as written
    assert aware.prefix_cache_hits.iloc[0] == run.summary["prefix_cache_hits"]


@pytest.mark.parametrize("rate,limit", [(30.0, None), (float("inf"), 8)])
def test_compiled_and_interpreted_runs_route_alike(run_config, rate, limit):
    """Compiled stretches of steps stop at each routing, so the router sees the same caches and
    queues whether the rules run compiled or interpreted: the same bytes either way."""
    from tests.test_decode_runs import _both, assert_identical

    off, on = _both(run_config, workload__num_requests=150, workload__rate=rate, workload__max_concurrency=limit,
                    workload__prompt_tokens="uniform:8:200", workload__output_tokens="uniform:1:60",
                    workload__shared_prefix="5:3:96", cluster__replicas=3, cluster__router="prefix-aware:queue=1",
                    **dict(V1, engine__kv_cache_tokens=1600))
    assert_identical(off, on)
