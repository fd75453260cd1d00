"""The vllm-v1 scheduler mode: chunked prefill under a token budget, mixed steps, paged KV, preemption.

Hand-worked cases stepped exactly on a profile with linear costs (tests/synthetic.py), then
queueing invariants over random small configurations (hypothesis).
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specbatch
from policies import make_policy
from sim.speculation.acceptance import AcceptanceSampler, acceptance_scale
from specbatch.commands.cli import main
from sim.config import load_config
from sim.costmodel.model import CostModel
from sim.errors import InputError
from sim.costmodel.profile import load_profile
from sim.replica import ReplicaPlan
from sim.serving.clock import simulate_replica
from sim.scheduler.layout import C_FREE_BLOCKS, C_PREFILLING, C_REQUEUED, C_RUNNING
from sim.serving.queues import arrival_queue
from sim.serving.records import DECODE, MIXED, PREFILL
from tests.synthetic import make_profile


@pytest.fixture(scope="module")
def cost_model(tmp_path_factory) -> CostModel:
    # prompts measured from 1 token: P(x) below is then exact wherever a step reaches
    return CostModel(load_profile(make_profile(tmp_path_factory.mktemp("v1") / "linear",
                                               prompts=(1, 32, 128, 512, 1024))))


class Served:
    """A finished vllm-v1 replica: its records and what its scheduler holds at the end."""

    def __init__(self, loop):
        self.loop = loop
        rec = loop.records()
        self.first_token_s, self.finish_s, self.scheduled_s = rec.first_token_s, rec.finish_s, rec.scheduled_s
        self.preemptions, self.drafted, self.accepted = rec.preemptions, rec.drafted_tokens, rec.accepted_tokens
        self.cached = rec.cached_tokens
        ctr = loop.state.ctr
        self.blocks_used = loop.scheduler.total_blocks - int(ctr[C_FREE_BLOCKS])
        self.running, self.prefilling, self.requeued = int(ctr[C_RUNNING]), int(ctr[C_PREFILLING]), int(ctr[C_REQUEUED])

    def records(self):
        return self.loop.records()


def serve(cost_model, prompts, outputs, *, arrivals=None, budget=160, block_size=16, kv_tokens=100_000,
          max_seqs=8, k=0, alpha=0.7, chunked=True, seed=0, jit="off", prompt_ids=None, caching=True,
          async_scheduling=False):
    """One replica under the vllm-v1 scheduler; returns it after the run."""
    from types import SimpleNamespace

    from sim.scheduler.kvcache import prefix_keys
    from workloads import Requests

    prompts, outputs = np.asarray(prompts, np.int64), np.asarray(outputs, np.int64)
    n = prompts.shape[0]
    arrivals = np.zeros(n) if arrivals is None else np.asarray(arrivals, float)
    policy = make_policy("fixed", {"k": k}) if k else make_policy("none", {})
    table = cost_model.tabulate(max_seqs, k, int((prompts + outputs).max()) + k, int(prompts.max()),
                                with_draft=k > 0, chunk_tokens=budget)
    policy.bind(cost_model.k_max, table)
    scale = acceptance_scale(np.full(n, alpha))
    engine = SimpleNamespace(batching="continuous", max_batch_size=max_seqs, prefill="packed", scheduler="vllm-v1",
                             max_num_batched_tokens=budget, block_size=block_size, chunked_prefill=chunked,
                             enable_prefix_caching=caching, async_scheduling=async_scheduling, jit=jit)
    requests = Requests(arrivals, prompts, outputs, prompt_id=prompt_ids)
    keys, num_keys = prefix_keys(requests, block_size)
    longest = int((prompts + outputs).max()) + 2 * k
    plan = ReplicaPlan(table, engine, kv_tokens, k, longest // block_size + 2, num_keys)
    queue = arrival_queue(arrivals, plan.inputs(prompts, outputs, keys), scale, None)
    from sim.speculation.acceptance import RecordingSampler
    sampler = RecordingSampler(AcceptanceSampler(np.random.default_rng(seed)), scale, False)
    loop = plan.loop(queue, policy, sampler)
    simulate_replica(loop)
    loop.state.kv.check(loop.state.ctr)
    return Served(loop)


def steps_of(loop):
    return loop.records().steps


def P(x):
    """tests/synthetic.py's target prefill at batch 1 (prompts of 1 to 1024 tokens)."""
    return 0.010 + 1e-5 * x


def decode_cost(b, context):
    """tests/synthetic.py's k = 0 step: one target pass over 1 token plus sampling (verify at k = 0)."""
    return 0.020 + 1e-4 * b + 1e-7 * b * context + 0.0005 + 1e-6 * b


def test_two_requests_with_a_tiny_budget_step_exactly(cost_model):
    # A: prompt 200, 3 tokens out; B: prompt 150, 2 out; both at t = 0; 160 tokens a step, blocks of 16.
    loop = serve(cost_model, [200, 150], [3, 2])
    s = steps_of(loop)
    # 1: A's first chunk (160) fills the budget.  2: A's last 40, then B's first 120 (A's first token).
    # 3: A decodes (1 token) + B's last 30 (B's first token).  4: both decode; both finish.
    assert s["phase"].tolist() == [PREFILL, PREFILL, MIXED, DECODE]
    assert s["prefill_tokens"].tolist() == [160, 160, 30, 0]
    assert s["running"].tolist() == [0, 0, 1, 2]
    assert s["emitted_tokens"].tolist() == [0, 1, 2, 2]
    # blocks: A 160 -> 10; A 200 -> 13 and B 120 -> 8; B 150 -> 10 (A at 201 still 13); A 202, B 151: none new
    assert s["kv_blocks"].tolist() == [10, 21, 23, 23]
    assert s["preemptions"].tolist() == [0, 0, 0, 0]
    durations = s["end_s"] - s["start_s"]
    table = loop.loop.backend.table

    def X(q, cached):  # a chunk's attention to what its request already holds in the KV cache
        return max(table.kv_read_cost * cached, 2 * table.attention_coefficient * q * cached)

    expected = [P(160),                                   # a step of chunks alone costs as one prompt of Q
                P(40 + 120) + X(40, 160),                 # A's last 40 (after its first 160) and B's first 120
                decode_cost(1, 200) + (P(1 + 30) - P(1)) + X(30, 120),  # A's decode (D = 1) and B's last 30
                decode_cost(2, (201 + 150) / 2)]
    assert X(40, 160) > 0
    np.testing.assert_allclose(durations, expected, rtol=1e-9)
    end = s["end_s"]
    assert loop.first_token_s.tolist() == [end[1], end[2]]
    assert loop.finish_s.tolist() == [end[3], end[3]]
    assert loop.scheduled_s.tolist() == [0.0, end[0]]
    assert loop.blocks_used == 0 and loop.running == 0 and not loop.prefilling


@pytest.mark.parametrize("jit", ["off", "on"])
def test_with_asynchronous_scheduling_a_request_arriving_mid_step_waits_for_the_step_after_next(cost_model, jit):
    # A decodes alone (prompt 100, 30 tokens out). B arrives in the middle of A's 5th decode step:
    # planned synchronously, the next step admits it; with asynchronous scheduling that step was
    # planned when the 5th started, so B's prefill comes a step later.
    def first_steps(async_scheduling):
        alone = serve(cost_model, [100], [30], jit=jit, async_scheduling=async_scheduling)
        end = steps_of(alone)["end_s"]
        arrival = (end[4] + end[5]) / 2  # mid-way through A's 5th decode step (step 5)
        both = serve(cost_model, [100, 40], [30, 3], arrivals=[0.0, arrival], jit=jit,
                     async_scheduling=async_scheduling)
        s = steps_of(both)
        first_chunk = int(np.flatnonzero(s["prefill_tokens"][1:])[0]) + 1
        return first_chunk, both.scheduled_s[1], s["start_s"]

    sync_step, sync_scheduled, sync_starts = first_steps(False)
    async_step, async_scheduled, async_starts = first_steps(True)
    assert sync_step == 6 and async_step == 7
    assert sync_scheduled == sync_starts[6] and async_scheduled == async_starts[7]
    # an idle engine plans at once: a request alone is scheduled when it arrives, either way
    alone = serve(cost_model, [40], [3], arrivals=[1.0], jit=jit, async_scheduling=True)
    assert alone.scheduled_s[0] == 1.0


def test_blocks_running_out_preempt_the_newest_and_recompute_it(cost_model):
    # Two requests of prompt 30, output 40; 6 blocks of 16. Both decode until their contexts reach
    # 48 (19 tokens out each, after decode step 18): the next token needs a 4th block each, 8 > 6,
    # so B (the newest) is preempted and waits, its recompute of 30 + 19 tokens needing 4 blocks,
    # until A has finished; then B's recompute emits its 20th token and 20 decode steps follow.
    loop = serve(cost_model, [30, 30], [40, 40], kv_tokens=96, caching=False)
    s = steps_of(loop)
    assert loop.preemptions.tolist() == [0, 1]
    assert len(s["phase"]) == 1 + 39 + 1 + 20
    preempted_at = int(np.flatnonzero(s["preemptions"])[0])
    assert preempted_at == 19  # step 0 prefills both; decode step 19 is s[19]
    assert s["running"][preempted_at] == 1
    assert s["prefill_tokens"].tolist().count(49) == 1 and s["prefill_tokens"][40] == 49
    assert int(s["prefill_tokens"].sum()) == 30 + 30 + 49
    assert int(s["emitted_tokens"].sum()) == 80
    assert int(s["kv_blocks"].max()) == 6
    end = s["end_s"]
    # B's 20th token is one inter-token gap from its 19th (end of step 18) to its recompute (step 40)
    gap = end[40] - end[18]
    assert np.isclose(loop.records().itl_values, gap).sum() == 1
    assert loop.finish_s[1] == end[-1] and loop.finish_s[0] == end[39]


def test_a_resumed_request_finds_what_is_left_of_its_own_blocks_in_the_cache(cost_model):
    """The same two requests with prefix caching (vLLM's default). B's 3 full blocks (48 of its 49
    known tokens) stay cached when it is preempted, freed last block first. A then takes 2 more
    blocks from the head of the free queue as it grows to 70 tokens: B's blocks 2 and 1. B's
    recompute finds block 0 (16 tokens) and prefills the other 33."""
    loop = serve(cost_model, [30, 30], [40, 40], kv_tokens=96)
    s = steps_of(loop)
    assert loop.preemptions.tolist() == [0, 1]
    assert s["prefill_tokens"][40] == 33 and int(s["prefill_tokens"].sum()) == 30 + 30 + 33
    stats = loop.records().scheduler
    assert stats["resumed_prefix_cache_queries"] == 49 and stats["resumed_prefix_cache_hits"] == 16
    assert stats["prefix_cache_hits"] == 0 and loop.cached.tolist() == [0, 0]  # different prompts: no first hit


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_whole(cost_model):
    loop = serve(cost_model, [100, 100], [2, 2], budget=150, chunked=False)
    s = steps_of(loop)
    assert s["prefill_tokens"].tolist()[:2] == [100, 100]  # B does not take the 50 left in step 1
    chunked = steps_of(serve(cost_model, [100, 100], [2, 2], budget=150))
    assert chunked["prefill_tokens"].tolist()[:2] == [150, 50]


def test_max_num_seqs_caps_running_and_prefilling(cost_model):
    loop = serve(cost_model, [40] * 5, [5] * 5, max_seqs=2)
    s = steps_of(loop)
    assert int(s["running"].max()) <= 2
    assert loop.scheduled_s.tolist() == sorted(loop.scheduled_s.tolist())


lengths = st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40), st.floats(0, 2.0)), min_size=1, max_size=10)


@settings(max_examples=60, deadline=None)
@given(reqs=lengths, block_size=st.sampled_from([1, 4, 16]), budget=st.integers(32, 400), k=st.integers(0, 3),
       spare_blocks=st.integers(0, 40), max_seqs=st.integers(1, 6), chunked=st.booleans(), seed=st.integers(0, 9))
def test_queueing_invariants(cost_model, reqs, block_size, budget, k, spare_blocks, max_seqs, chunked, seed):
    reqs.sort(key=lambda r: r[2])
    prompts = np.array([r[0] for r in reqs])
    outputs = np.array([r[1] for r in reqs])
    arrivals = np.array([r[2] for r in reqs])
    budget = max(budget, max_seqs)  # what the config check asks (as vLLM: a token a step for every running request)
    if not chunked:
        budget = max(budget, int((prompts + outputs - 1).max()))
    one = max(math.ceil((p + o + 2 * k) / block_size) for p, o in zip(prompts, outputs))  # and the lookahead
    kv_tokens = (one + spare_blocks) * block_size
    loop = serve(cost_model, prompts, outputs, arrivals=arrivals, budget=budget, block_size=block_size,
                 kv_tokens=kv_tokens, max_seqs=max_seqs, k=k, chunked=chunked, seed=seed)
    s = steps_of(loop)
    # every request finishes, emitting exactly its output; nothing is left holding blocks
    assert not np.isnan(loop.finish_s).any()
    assert int(s["emitted_tokens"].sum()) == int(outputs.sum())
    assert loop.blocks_used == 0 and loop.running == 0 and not loop.prefilling and not loop.requeued
    # blocks in use never exceed the cache; a step never exceeds its token budget
    assert int(s["kv_blocks"].max()) <= kv_tokens // block_size
    assert (s["prefill_tokens"] + s["batch_size"] + s["drafted_tokens"] <= budget).all()
    assert (s["batch_size"] <= s["running"]).all()  # rows sit a step out when the budget is spent
    # prompt tokens are prefilled once, plus what preemption makes recomputed
    assert int(s["prefill_tokens"].sum()) >= int(prompts.sum())
    if not loop.preemptions.any():
        assert int(s["prefill_tokens"].sum()) == int(prompts.sum())
    # FCFS: requests are first scheduled, and emit their first tokens, in arrival order
    assert (np.diff(loop.scheduled_s) >= 0).all()
    assert (np.diff(loop.first_token_s) >= 0).all()
    assert (loop.first_token_s <= loop.finish_s).all() and (loop.scheduled_s >= arrivals).all()
    assert (loop.accepted <= loop.drafted).all()
    assert int(s["preemptions"].sum()) == int(loop.preemptions.sum())
    # one inter-token gap per decode step a request emits in (one per token after the first at k = 0),
    # plus one per recompute
    assert int(np.sum(loop.records().itl_weights)) <= int((outputs - 1).sum())
    if k == 0:
        assert int(np.sum(loop.records().itl_weights)) == int((outputs - 1).sum())


def test_the_default_scenario_under_vllm_v1_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--scheduler", "vllm-v1", "--num-requests", "60", "--max-num-batched-tokens", "6000",
                 "--max-num-seqs", "64", "--no-chunked-prefill", "--block-size", "32", "--out", str(out)]) == 0
    toml = (out / "config.toml").read_text()
    for line in ('scheduler = "vllm-v1"', "max_num_batched_tokens = 6000", "chunked_prefill = false",
                 "block_size = 32", 'preemption = "recompute"', "max_batch_size = 64"):
        assert line in toml
    import json
    summary = json.loads((out / "summary.json").read_text())["metrics"]
    assert summary["completed"] == 60 and summary["num_preemptions"] == 0
    assert "num_preemptions" in (out / "requests.csv").read_text().splitlines()[0]
    assert "Preemptions:" in capsys.readouterr().out


def test_each_schedulers_config_file_mentions_only_its_own_keys():
    v1 = load_config(None, {}).to_toml()
    assert 'scheduler = "vllm-v1"' in v1 and "block_size" in v1 and "enable_prefix_caching" in v1
    assert "\nprefill =" not in v1  # v0's prompt pricing
    v0 = load_config(None, {"engine.scheduler": "v0"}).to_toml()
    assert 'scheduler = "v0"' in v0 and 'prefill = "packed"' in v0
    assert "block_size" not in v0 and "chunked_prefill" not in v0 and "prefix_caching" not in v0


@pytest.mark.parametrize("flags, key", [
    (["--scheduler", "v0", "--block-size", "32"], "engine.block_size"),
    (["--scheduler", "v0", "--no-enable-prefix-caching"], "engine.enable_prefix_caching"),
    (["--scheduler", "v0", "--max-num-batched-tokens", "512"], "engine.max_num_batched_tokens"),
    (["--prefill", "padded"], "engine.prefill"),
])
def test_a_key_of_the_other_scheduler_is_refused_naming_it_and_the_scheduler(flags, key, capsys, tmp_path):
    assert main(["run", "--num-requests", "20", "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err and "applies only to --scheduler" in err
    assert not (tmp_path / "x").exists()


def test_a_config_file_written_from_the_defaults_runs_under_either_scheduler(tmp_path):
    """A file naming every key at its shipped value (config.toml of another run, a copy of the
    defaults) is not refused for naming the other scheduler's keys."""
    text = (tmp_path / "all.toml")
    from importlib import resources
    text.write_text((resources.files("sim") / "scenarios" / "default.toml").read_text().replace(
        'scheduler = "vllm-v1"', 'scheduler = "v0"'))
    assert load_config(text).engine.scheduler == "v0"


def test_the_python_api_takes_the_vllm_names():
    run = specbatch.run(scheduler="vllm-v1", max_num_seqs=32, max_num_batched_tokens=1024, kv_cache_tokens=20000,
                        num_requests=80, rate=40.0)
    assert run.summary["completed"] == 80
    assert run.config.engine.max_batch_size == 32
    assert run.summary["num_preemptions"] > 0  # a small cache at a high rate
    assert (run.requests.num_preemptions > 0).sum() == run.summary["num_preempted_requests"]
    again = specbatch.run(scheduler="vllm-v1", max_num_seqs=32, max_num_batched_tokens=1024, kv_cache_tokens=20000,
                          num_requests=80, rate=40.0)
    assert again.requests.equals(run.requests) and again.steps.equals(run.steps)


def test_a_cluster_of_v1_replicas_conserves_requests():
    run = specbatch.run(scheduler="vllm-v1", num_requests=60, rate=40.0, replicas=2, router="least-tokens",
                        kv_cache_tokens=20000)
    assert run.summary["completed"] == 60
    assert int(run.steps.emitted_tokens.sum()) == int(run.requests.output_tokens.sum())


@pytest.mark.parametrize("flags, key", [
    (["--max-num-batched-tokens", "100"], "engine.max_num_batched_tokens"),  # < 256 seqs x (1 + 3)
    (["--batching", "static"], "engine.batching"),
    (["--no-chunked-prefill", "--max-num-batched-tokens", "2048"], "engine.max_num_batched_tokens"),
    (["--kv-cache-tokens", "1000"], "engine.kv_cache_tokens"),
])
def test_bad_v1_settings_are_one_line_before_the_run(flags, key, capsys, tmp_path):
    assert main(["run", "--scheduler", "vllm-v1", "--num-requests", "20", "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err
    assert not (tmp_path / "x").exists()


def test_the_real_replay_refuses_the_v1_scheduler_asked_for():
    from calibrate.replay import replay_config

    with pytest.raises(InputError, match="v0 scheduler only") as info:
        replay_config(load_config(None, {"engine.scheduler": ("vllm-v1", "--scheduler"), "workload.num_requests": 2}))
    assert info.value.field == "engine.scheduler"


def test_the_step_table_prices_mixed_steps_as_the_cost_model_does(tmp_path):
    from sim.costmodel.model import cuda_graph_sizes
    from sim.simulate import profile_and_costs

    _, cm, _ = profile_and_costs("h100-llama-3.1-8b-llama-3.2-1b")
    table = cm.tabulate(64, 3, 6000, 4096, with_draft=True, chunk_tokens=8192)
    sizes = cuda_graph_sizes(64, 3, 8192)
    for b, k, c, q, s in [(0, 0, 0, 512, 0), (0, 0, 0, 8000, 0), (8, 3, 700, 300, 0), (64, 3, 2500, 4000, 0),
                          (32, 0, 100, 1, 0), (8, 3, 700, 17, 560), (0, 0, 0, 2048, 2048), (30, 0, 700, 3, 1700)]:
        d = b * (k + 1)
        got = (table.decode_time(b, k, c) if b else 0.0) + table.chunk_time(d, q, s)
        exact = float(cm.mixed_times(b, k, c, q, with_draft=True, prefix_tokens=s, graph_sizes=sizes, max_batch=64))
        assert got == pytest.approx(exact, rel=2e-3), (b, k, c, q, s)
    # a whole prompt alone costs what v0 charges one prompt
    assert table.chunk_time(0, 1000) == pytest.approx(float(cm.prefill_times(1, 1000, True)), rel=1e-3)


HAVE_DATA = importlib.util.find_spec("aiconfigurator_core") is not None


@pytest.mark.skipif(not HAVE_DATA, reason="aiconfigurator-core not installed (pip install -e \".[gpu-data]\")")
def test_the_mixed_step_formula_stays_close_to_the_kernel_composition():
    from specbatch.commands.compose import pricers_for
    from sim.simulate import profile_and_costs

    profile, cm, _ = profile_and_costs("h100-llama-3.1-8b-llama-3.2-1b")
    target = pricers_for(profile)["target"]

    def p(x):
        return float(cm.prefill_target(batch_size=1, query_tokens=max(x, 1)))

    assert target.mixed(0, 1, 0, [(0, 700)]) == pytest.approx(float(target.prefill(1, 700)), rel=1e-9)
    for b in (0, 4, 16, 64, 256):
        for chunks in ([(0, 64)], [(0, 1024)], [(3000, 1000)], [(0, 200), (0, 600)]):
            q = sum(new for _, new in chunks)
            d = b * 4
            formula = (float(cm.decode_target(batch_size=b, query_tokens=4, context_tokens=900)) + p(d + q) - p(d)
                       if b else p(q))
            assert formula == pytest.approx(target.mixed(b, 4, 900, chunks), rel=0.15), (b, chunks)


def test_gpu_memory_utilization_sizes_the_kv_cache_from_the_profiles_memory(capsys, tmp_path):
    from sim.costmodel.profile import load_profile
    from sim.simulate import prepare

    name = "h100-llama-3.1-8b-llama-3.2-1b"
    meta = load_profile(name).meta
    per_token = sum(meta["models"][role]["kv_bytes_per_token"] for role in ("target", "draft"))  # the draft model's run
    at = {u: prepare(load_config(None, {"engine.gpu_memory_utilization": u, "workload.num_requests": 5}))
          .kv_budget_tokens for u in (0.9, 0.5)}
    assert at[0.9] == meta["kv_capacity_tokens"]  # the profile's own fraction
    assert at[0.9] - at[0.5] == pytest.approx(0.4 * meta["memory"]["available_bytes"] / per_token, abs=1)
    assert main(["run", "--gpu-memory-utilization", "0.2", "--num-requests", "5", "--out", str(tmp_path / "x")]) == 2
    assert "engine.gpu_memory_utilization" in capsys.readouterr().err
    assert main(["run", "--gpu-memory-utilization", "0.5", "--kv-cache-tokens", "9000", "--num-requests", "5",
                 "--out", str(tmp_path / "y")]) == 2
    assert "not both" in capsys.readouterr().err


_ALTERNATING_KS = '''
import numpy as np
from policies import Policy

class Alternating(Policy):
    """k = 2 on odd rows, 0 on even ones: ragged, and after a preemption that leaves one row, uniform."""
    name, max_k = "alternating-ks", 2

    def choose_k(self, view):
        return np.array([2 * (i % 2) for i in range(view.running)], dtype=np.int64)
'''


def test_per_sequence_ks_cut_by_a_preemption_are_the_survivors(tmp_path, monkeypatch):
    """A preemption drops rows after the policy answered: the step drafts the survivors' ks, is
    charged at their largest (a single survivor: its own k)."""
    (tmp_path / "alternating_ks.py").write_text(_ALTERNATING_KS)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = specbatch.run(scheduler="vllm-v1", policy="alternating_ks:Alternating", kv_cache_tokens=6000,
                        num_requests=80, rate=40.0, max_num_seqs=16, max_num_batched_tokens=512)
    assert run.summary["num_preemptions"] > 0 and run.summary["completed"] == 80
    decoding = run.steps[run.steps.running > 0]
    rows = decoding.running.to_numpy()
    np.testing.assert_array_equal(decoding.drafted_tokens.to_numpy(), 2 * (rows // 2))
    np.testing.assert_array_equal(decoding.k.to_numpy(), np.where(rows >= 2, 2, 0))
    assert (rows == 1).any() and (rows >= 2).any()


@pytest.mark.parametrize("jit", ["off", "on"])
def test_a_closed_v1_loop_is_freed_without_the_garbage_collector(cost_model, jit):
    """Compiled runs point back at their loop (a reference cycle): close() breaks it, so that a
    finished run's per-request arrays go when the loop is dropped, not at the next full GC."""
    import gc
    import weakref

    enabled = gc.isenabled()
    gc.disable()
    try:
        loop = serve(cost_model, [40] * 6, [5] * 6, k=2, jit=jit).loop
        assert (loop.compiled_runs is not None) == (jit == "on")
        loop.close()
        gone = weakref.ref(loop)
        del loop
        assert gone() is None
    finally:
        gc.collect()
        if enabled:
            gc.enable()
