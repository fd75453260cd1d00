"""Prefix caching in the vllm-v1 scheduler's KV-cache manager (sim/scheduler/kvcache.py).

Worked cases stepped by hand on a profile with linear costs, then the cache's invariants over
random traffic of repeated prompts and shared prefixes under KV pressure (hypothesis), stepped
one step at a time with the manager's own consistency check after every step.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specbatch
from specbatch.commands.cli import main
from sim.costmodel.model import CostModel
from sim.costmodel.profile import load_profile
from sim.scheduler.kvcache import key_of, prefix_keys
from sim.scheduler.layout import C_FREE_BLOCKS
from tests.synthetic import make_profile
from tests.test_scheduling_v1 import serve, steps_of
from workloads import Requests


@pytest.fixture(scope="module")
def cost_model(tmp_path_factory) -> CostModel:
    return CostModel(load_profile(make_profile(tmp_path_factory.mktemp("pc") / "linear",
                                               prompts=(1, 32, 128, 512, 1024))))


def test_a_prompt_sent_again_skips_all_but_its_last_partial_block(cost_model):
    # Prompt 100 tokens (6 full blocks of 16 + 4), sent at t = 0 and again at t = 50 (after the
    # first finished). The second finds the 6 full blocks (96 tokens) and computes the last 4.
    loop = serve(cost_model, [100, 100], [3, 3], arrivals=[0.0, 50.0], prompt_ids=[7, 7])
    s = steps_of(loop)
    assert loop.cached.tolist() == [0, 96]
    assert s["prefill_tokens"].tolist().count(4) == 1 and int(s["prefill_tokens"].sum()) == 100 + 4
    stats = loop.records().scheduler
    assert stats["prefix_cache_queries"] == 200 and stats["prefix_cache_hits"] == 96
    assert loop.blocks_used == 0


def test_the_last_token_is_always_computed(cost_model):
    # A prompt of exactly two blocks: at most (32 - 1) // 16 = 1 block can hit.
    loop = serve(cost_model, [32, 32], [2, 2], arrivals=[0.0, 50.0], prompt_ids=[0, 0])
    assert loop.cached.tolist() == [0, 16]


def test_requests_admitted_in_one_step_share_the_blocks_the_first_registers(cost_model):
    # vLLM registers a request's full blocks when it schedules them, so the second request of the
    # same step finds them: both prompts in one step cost 100 + 4 tokens and hold 7 + 1 blocks.
    loop = serve(cost_model, [100, 100], [5, 5], budget=512, prompt_ids=[1, 1])
    s = steps_of(loop)
    assert s["prefill_tokens"][0] == 104 and loop.cached.tolist() == [0, 96]
    assert s["kv_blocks"][0] == 7 + 1  # the 6 shared blocks once, each request's own last block
    without = serve(cost_model, [100, 100], [5, 5], budget=512, prompt_ids=[1, 1], caching=False)
    assert steps_of(without)["kv_blocks"][0] == 14


def test_a_shared_system_prompt_is_found_by_every_prompt_of_its_group(cost_model):
    from sim.scheduler.kvcache import prefix_keys as keys_of

    requests = Requests(np.array([0.0, 50.0, 60.0]), np.array([120, 90, 200]), np.array([2, 2, 2]),
                        prefix_id=np.array([0, 0, -1]), prefix_tokens=np.array([40, 40, 0]))
    keys, num_keys = keys_of(requests, 16)
    assert num_keys == 2  # floor(40 / 16): the prefix's 2 full blocks
    served = _serve_with(cost_model, requests)
    assert served.cached.tolist() == [0, 32, 0]


def _serve_with(cost_model, requests, budget=160, block_size=16, kv_tokens=100_000, max_seqs=8, k=0, jit="off"):
    from types import SimpleNamespace

    from policies import make_policy
    from sim.speculation.acceptance import AcceptanceSampler, RecordingSampler, acceptance_scale
    from sim.replica import ReplicaPlan
    from sim.serving.clock import simulate_replica
    from sim.serving.queues import arrival_queue
    from tests.test_scheduling_v1 import Served

    prompts, outputs = requests.prompt_tokens, requests.output_tokens
    policy = make_policy("fixed", {"k": k}) if k else make_policy("none", {})
    table = cost_model.tabulate(max_seqs, k, int((prompts + outputs).max()) + k, int(prompts.max()),
                                with_draft=k > 0, chunk_tokens=budget)
    policy.bind(cost_model.k_max, table)
    scale = acceptance_scale(np.full(len(requests), 0.7))
    engine = SimpleNamespace(batching="continuous", max_batch_size=max_seqs, prefill="packed", scheduler="vllm-v1",
                             max_num_batched_tokens=budget, block_size=block_size, chunked_prefill=True,
                             enable_prefix_caching=True, async_scheduling=False, jit=jit)
    keys, num_keys = prefix_keys(requests, block_size)
    plan = ReplicaPlan(table, engine, kv_tokens, k, int((prompts + outputs).max() + 2 * k) // block_size + 2,
                       num_keys)
    queue = arrival_queue(requests.arrival_s, plan.inputs(prompts, outputs, keys), scale, None)
    sampler = RecordingSampler(AcceptanceSampler(np.random.default_rng(0)), scale, False)
    loop = plan.loop(queue, policy, sampler)
    simulate_replica(loop)
    loop.state.kv.check(loop.state.ctr)
    return Served(loop)


def test_freed_blocks_stay_cached_until_evicted_least_recently_freed_first(cost_model):
    # A cache of 10 blocks. A (prompt 64: 4 blocks, and a 5th for its output) runs and finishes; its
    # blocks stay cached, freed last first: the free queue is the 5 never-used blocks, then A's
    # blocks 4, 3, 2, 1, 0. B (another prompt, of 120 tokens: 8 blocks) takes the 5 never used and
    # A's blocks 4, 3 and 2, evicting them. A sent again may find 3 blocks ((64 - 1) // 16) and
    # finds the 2 left: 32 tokens.
    requests = Requests(np.array([0.0, 10.0, 20.0]), np.array([64, 120, 64]), np.array([2, 2, 2]),
                        prompt_id=np.array([0, 1, 0]))
    served = _serve_with(cost_model, requests, kv_tokens=160)
    assert served.cached.tolist() == [0, 0, 32]
    roomy = _serve_with(cost_model, requests, kv_tokens=1600)  # nothing evicted: all 3 found
    assert roomy.cached.tolist() == [0, 0, 48]


def test_without_prefix_caching_nothing_is_found(cost_model):
    loop = serve(cost_model, [100, 100], [3, 3], arrivals=[0.0, 50.0], prompt_ids=[7, 7], caching=False)
    assert loop.cached.tolist() == [0, 0]
    assert int(steps_of(loop)["prefill_tokens"].sum()) == 200


def test_prefix_keys_share_a_groups_blocks_up_to_its_shortest_prompt():
    # The same prompt id sent at lengths 100 and 98 (a tokenizer's difference): 6 shared blocks.
    requests = Requests(np.zeros(3), np.array([100, 98, 50]), np.ones(3, np.int64), prompt_id=np.array([3, 3, -1]))
    keys, num_keys = prefix_keys(requests, 16)
    assert num_keys == 6
    reqi = np.zeros((7, 3), np.int64)
    reqi[3:] = keys
    assert [key_of(reqi, 0, j, 100) for j in range(7)] == [0, 1, 2, 3, 4, 5, -2 - 6]
    assert [key_of(reqi, 1, j, 100) for j in range(6)] == [0, 1, 2, 3, 4, 5]
    assert key_of(reqi, 2, 0, 100) == -2 - 200  # no id: its own


prompt_sets = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40), st.floats(0, 3.0)), min_size=1, max_size=14)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=prompt_sets, block_size=st.sampled_from([1, 4, 16]), budget=st.integers(16, 300), k=st.integers(0, 2),
       spare_blocks=st.integers(0, 30), max_seqs=st.integers(1, 5), system=st.integers(0, 60), seed=st.integers(0, 9))
def test_cache_invariants_under_pressure(cost_model, reqs, block_size, budget, k, spare_blocks, max_seqs, system,
                                         seed):
    """Stepped one step at a time: the manager's counts, free queue, tables and key map agree after
    every step; blocks never exceed the cache; a hit never reaches a prompt's last token; every
    prompt token is either found or prefilled; at the end nothing is held."""
    from sim.scheduler.layout import C_RUNNING

    reqs.sort(key=lambda r: r[2])
    ids = np.array([r[0] for r in reqs])
    prompts = system + 20 + 9 * ids  # a prompt id always has the same length, behind a system prompt
    outputs = np.array([r[1] for r in reqs])
    arrivals = np.array([r[2] for r in reqs])
    requests = Requests(arrivals, prompts, outputs, prompt_id=ids, prefix_id=np.zeros(len(reqs), np.int64),
                        prefix_tokens=np.full(len(reqs), system))
    budget = max(budget, max_seqs)
    one = max(-(-(p + o + 2 * k) // block_size) for p, o in zip(prompts, outputs))
    kv_tokens = (one + spare_blocks) * block_size
    served = _serve_stepwise(cost_model, requests, budget=budget, block_size=block_size, kv_tokens=kv_tokens,
                             max_seqs=max_seqs, k=k, seed=seed)
    rec = served.records()
    s = rec.steps
    assert not np.isnan(rec.finish_s).any()
    assert int(s["emitted_tokens"].sum()) == int(outputs.sum())
    assert int(s["kv_blocks"].max()) <= kv_tokens // block_size
    assert ((rec.cached_tokens <= prompts - 1) & (rec.cached_tokens % block_size == 0)).all()
    assert served.loop.state.ctr[C_RUNNING] == 0 and served.blocks_used == 0
    if not rec.preemptions.any():  # each prompt token found in the cache or prefilled once
        assert int(s["prefill_tokens"].sum()) + int(rec.cached_tokens.sum()) == int(prompts.sum())


def _serve_stepwise(cost_model, requests, *, budget, block_size, kv_tokens, max_seqs, k, seed):
    """One replica driven by hand (the clock's loop), checking the KV-cache manager after every step."""
    from types import SimpleNamespace

    from policies import make_policy
    from sim.speculation.acceptance import AcceptanceSampler, RecordingSampler, acceptance_scale
    from sim.replica import ReplicaPlan
    from sim.serving.queues import arrival_queue
    from tests.test_scheduling_v1 import Served

    prompts, outputs = requests.prompt_tokens, requests.output_tokens
    policy = make_policy("fixed", {"k": k}) if k else make_policy("none", {})
    table = cost_model.tabulate(max_seqs, k, int((prompts + outputs).max()) + 2 * k, int(prompts.max()),
                                with_draft=k > 0, chunk_tokens=budget)
    policy.bind(cost_model.k_max, table)
    scale = acceptance_scale(np.full(len(requests), 0.7))
    engine = SimpleNamespace(batching="continuous", max_batch_size=max_seqs, prefill="packed", scheduler="vllm-v1",
                             max_num_batched_tokens=budget, block_size=block_size, chunked_prefill=True,
                             enable_prefix_caching=True, async_scheduling=False, jit="off")
    keys, num_keys = prefix_keys(requests, block_size)
    plan = ReplicaPlan(table, engine, kv_tokens, k, int((prompts + outputs).max() + 2 * k) // block_size + 2,
                       num_keys)
    queue = arrival_queue(requests.arrival_s, plan.inputs(prompts, outputs, keys), scale, None)
    sampler = RecordingSampler(AcceptanceSampler(np.random.default_rng(seed)), scale, False)
    loop = plan.loop(queue, policy, sampler)
    now, kv, ctr = 0.0, loop.state.kv, loop.state.ctr
    total = kv_tokens // block_size
    while True:
        queue.release(now)
        if not loop.has_work():
            at = queue.next_arrival_s()
            if at is None:
                break
            now = at
            continue
        dt = loop.start_step(now)
        assert 0 <= total - ctr[C_FREE_BLOCKS] <= total
        loop.finish_step(now, now + dt)
        now += dt
        kv.check(ctr)
    return Served(loop)


def test_shared_prefix_traffic_end_to_end_from_the_command_line_and_the_api(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--shared-prefix", "4:8:256", "--num-requests", "300", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Prefix cache hit rate (%):" in printed
    import json

    metrics = json.loads((out / "summary.json").read_text())["metrics"]
    assert 0.5 < metrics["prefix_cache_hit_rate"] < 1.0  # 32 prompts sent again and again
    assert "num_cached_tokens" in (out / "requests.csv").read_text().splitlines()[0]
    assert "shared_prefix" in (out / "config.toml").read_text()
    off = specbatch.run(shared_prefix="4:8:256", num_requests=300, enable_prefix_caching=False)
    on = specbatch.run(shared_prefix="4:8:256", num_requests=300)
    assert "prefix_cache_hits" not in off.summary and on.summary["prefix_cache_hits"] == metrics["prefix_cache_hits"]
    assert on.summary["mean_ttft_ms"] < off.summary["mean_ttft_ms"]  # prefill skipped for what was found
    assert (on.requests.num_cached_tokens > 0).mean() > 0.8


def test_a_trace_with_prompt_ids_is_cached_and_a_bad_prefix_is_one_line(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens,prompt_id\n0,300,4,a\n5,300,4,a\n")
    run = specbatch.run(trace=str(trace))
    assert run.requests.num_cached_tokens.tolist() == [0, 288]
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0,30,4,s,20\n1,30,4,s,40\n")
    assert main(["run", "--trace", str(bad), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.csv:3" in err and "prefix_tokens" in err
