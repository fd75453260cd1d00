"""Disaggregated prefill and decode (sim/disaggregated.py): conservation across the pools, the links,
determinism, a hand-worked request, compiled against step by step, and the one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.disaggregated as disaggregated
from sim.errors import InputError
from sim.router import ROUTERS
from sim.scheduler.layout import (C_FREE_BLOCKS, C_HELD_BLOCKS, C_PREFILLING, C_REQUEUED, C_RESERVED, C_RUNNING,
                                  P_BLOCKS)
from sim.serving.transfer import KV_TRANSFERS, LINKS
from sim.simulate import execute, prepare

V1 = dict(engine__scheduler="vllm-v1", engine__max_batch_size=16, engine__max_num_batched_tokens=256,
          workload__prompt_tokens="uniform:16:300", workload__output_tokens="uniform:1:48")


def disaggregated_config(run_config, prefill=2, decode=2, **overrides):
    return run_config(**{**V1, "workload__num_requests": 60, "workload__rate": 4.0,
                         "cluster__prefill_replicas": prefill, "cluster__decode_replicas": decode, **overrides})


def capture_loops(monkeypatch) -> list:
    """The loops of each pool as the run leaves them (before their records are merged)."""
    pools = []
    merge = disaggregated.merge_loops

    def keep(loops, n):
        pools.append([(loop.state, loop.scheduler) for loop in loops])
        return merge(loops, n)

    monkeypatch.setattr(disaggregated, "merge_loops", keep)
    return pools


def check_conservation(result, pools) -> None:
    """Every request prefilled once (on the prefill pool and sent, or, under llm-d's decider, on its decode
    replica), decoded to its end; tokens, times and every KV block accounted for on both sides."""
    all_req, steps = result.requests, result.steps
    n = len(all_req)
    sent = (all_req.prefill_replica >= 0).to_numpy()
    req = all_req[sent]
    on_prefill = steps.replica.to_numpy() < result.config.cluster.prefill_replicas
    # every request prefilled once, sent once (or prefilled where it decodes), decoded to its end
    assert (all_req.decode_replica >= result.config.cluster.prefill_replicas).all()
    assert (req.prefill_replica < result.config.cluster.prefill_replicas).all()
    assert int(steps.emitted_tokens[on_prefill].sum()) == len(req)  # the proxy's one token each
    assert int(steps.emitted_tokens[~on_prefill].sum()) == int(all_req.output_tokens.sum())
    assert int(steps.drafted_tokens[on_prefill].sum()) == 0  # nothing drafts on a prefill replica
    assert int(all_req.drafted_tokens.sum()) == int(steps.drafted_tokens.sum())
    # prompt tokens: computed on the prefill side (less its prefix-cache hits, more any recompute); one each on
    # the decode side unless a preemption made it recompute, plus the prompts it prefilled itself
    local = all_req[~sent]
    assert int(steps.prefill_tokens[on_prefill].sum()) >= int((req.prompt_tokens - req.num_cached_tokens).sum())
    assert int(steps.prefill_tokens[~on_prefill].sum()) >= len(req) + int(
        (local.prompt_tokens - local.num_cached_tokens).sum())
    assert local.kv_transfer_start_s.isna().all() and (local.kv_transfer_bytes == 0).all()
    assert result.extra["disaggregated"]["kv_transfer"]["transfers"] == len(req)
    assert result.extra["disaggregated"].get("prefilled_on_decode", 0) == n - len(req)
    # time runs forward through each request's stages
    assert (all_req.scheduled_s >= all_req.arrival_s).all() and (all_req.finish_s >= all_req.first_token_s).all()
    assert (all_req.first_token_s > all_req.scheduled_s).all()
    assert (req.prefill_done_s > req.scheduled_s).all()
    assert (req.kv_blocks_allocated_s >= req.prefill_done_s).all()  # blocks first, then the KV is read
    assert (req.kv_transfer_start_s >= req.kv_blocks_allocated_s).all()
    assert (req.kv_transfer_end_s > req.kv_transfer_start_s).all()
    assert (req.first_token_s > req.kv_transfer_end_s).all()
    link = result.extra["disaggregated"]["kv_transfer"]
    # a transfer alone on its link: latency + prompt tokens x bytes per token on a GPU's link / bandwidth
    tokens = req.kv_transfer_bytes / link["kv_bytes_per_token"]
    alone = link["latency_us"] * 1e-6 + tokens * link["link_bytes_per_token_per_gpu"] / (link["bandwidth_gb_s"] * 1e9)
    if result.config.cluster.kv_transfers == "queued":  # a link's end carries one transfer at a time
        for column in ("prefill_replica", "decode_replica"):
            for _, group in req.sort_values("kv_transfer_start_s").groupby(column):
                assert (group.kv_transfer_start_s.to_numpy()[1:] >= group.kv_transfer_end_s.to_numpy()[:-1]).all()
        assert np.allclose(req.kv_transfer_end_s - req.kv_transfer_start_s, alone, rtol=1e-9)
    else:  # shared: a transfer starts once its blocks are set aside, and takes at least as long as alone
        assert (req.kv_transfer_start_s == req.kv_blocks_allocated_s).all()
        assert ((req.kv_transfer_end_s - req.kv_transfer_start_s) >= alone * (1 - 1e-9)).all()
    # one engine per replica, never overlapping
    for _, group in steps.groupby("replica"):
        assert (group.start_s.to_numpy()[1:] >= group.end_s.to_numpy()[:-1]).all()
    # every block back in every replica's cache, and the caches consistent
    assert len(pools) == 2
    for pool in pools:
        for state, _ in pool:
            ctr = state.ctr
            assert ctr[C_RUNNING] == ctr[C_PREFILLING] == ctr[C_REQUEUED] == 0
            assert ctr[C_FREE_BLOCKS] == state.par[P_BLOCKS]
            assert ctr[C_HELD_BLOCKS] == ctr[C_RESERVED] == 0 and not state.kv.held  # every transfer let go
            state.kv.check(ctr)


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefill=st.integers(1, 3), decode=st.integers(1, 3), router=st.sampled_from(ROUTERS + ("prefix-aware",)),
       seed=st.integers(0, 1000), kv=st.sampled_from([None, 700]), policy=st.sampled_from(["fixed", "none"]),
       link=st.sampled_from(sorted(LINKS)), threshold=st.sampled_from([None, 0, 150, 10**6]),
       transfers=st.sampled_from(KV_TRANSFERS))
def test_requests_tokens_and_blocks_are_conserved_across_the_pools(run_config, monkeypatch, prefill, decode, router,
                                                                   seed, kv, policy, link, threshold, transfers):
    """Whatever the pools, router, link, KV budget (700 tokens: preemptions, and transfers waiting for blocks, on
    both sides) and flow (vLLM's proxy, or llm-d's decode-first with its decider), every request is prefilled
    once and decoded to its last token, and every block goes back on both sides."""
    config = disaggregated_config(run_config, prefill, decode, seed=seed, cluster__router=router,
                                  engine__kv_cache_tokens=kv, policy__name=policy, cluster__kv_link=link,
                                  workload__shared_prefix="64:4:64", cluster__pd_threshold=threshold,
                                  cluster__kv_transfers=transfers)
    with monkeypatch.context() as m:
        pools = capture_loops(m)
        result = execute(prepare(config))
    check_conservation(result, pools)


def test_same_config_and_seed_give_the_same_bytes(run_config):
    config = disaggregated_config(run_config, 2, 3, cluster__router="least-requests")
    a, b = execute(prepare(config)), execute(prepare(config))
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)
    assert json.dumps(a.extra, sort_keys=True) == json.dumps(b.extra, sort_keys=True)


def test_one_request_by_hand(run_config):
    """TTFT = the prefill step + the transfer (latency + prompt x KV bytes per token / bandwidth) + the decode
    replica's step that computes the last prompt token, on an otherwise idle cluster."""
    prompt, bandwidth, latency = 1000, 20.0, 30.0
    config = disaggregated_config(run_config, 1, 1, workload__num_requests=1, workload__prompt_tokens=prompt,
                                  workload__output_tokens=5, engine__max_num_batched_tokens=2048,
                                  cluster__kv_link_bandwidth_gb_s=bandwidth, cluster__kv_link_latency_us=latency)
    run = prepare(config)
    result = execute(run)
    req, steps = result.requests.iloc[0], result.steps
    per_token = 131072 + 32768  # the synthetic profile's target and draft (tests/synthetic.py), one GPU
    transfer = latency * 1e-6 + prompt * per_token / (bandwidth * 1e9)
    assert req.kv_transfer_end_s - req.kv_transfer_start_s == pytest.approx(transfer, rel=1e-12)
    assert req.kv_transfer_bytes == prompt * per_token
    prefill_step, first_decode_step = steps.iloc[0], steps.iloc[1]
    assert prefill_step.replica == 0 and prefill_step.prefill_tokens == prompt
    assert first_decode_step.replica == 1 and first_decode_step.prefill_tokens == 1  # the last prompt token
    assert first_decode_step.start_s == req.kv_transfer_end_s and req.kv_transfer_start_s == req.prefill_done_s
    expected = ((prefill_step.end_s - prefill_step.start_s) + transfer
                + (first_decode_step.end_s - first_decode_step.start_s) + run.profile.request_latency_s)
    assert req.ttft_s == pytest.approx(expected, rel=1e-12)
    t = result.extra["disaggregated"]["kv_transfer"]
    assert t["transfers"] == 1 and t["bytes"] == prompt * per_token and t["mean_queue_ms"] == 0


def test_transfers_queue_on_a_busy_link(run_config):
    """A slow link: transfers from the one prefill replica wait for the one before them."""
    config = disaggregated_config(run_config, 1, 2, workload__rate=50.0, cluster__kv_link_bandwidth_gb_s=0.5)
    result = execute(prepare(config))
    t = result.extra["disaggregated"]["kv_transfer"]
    assert t["queued_transfers"] > 0 and t["mean_queue_ms"] > 0
    req = result.requests.sort_values("kv_transfer_start_s")
    waited = req[req.kv_transfer_start_s > req.prefill_done_s]
    ends = req.kv_transfer_end_s.to_numpy()
    for start in waited.kv_transfer_start_s:  # a transfer that waited starts the instant another one ends
        assert (ends == start).any()


def blocks_in_flight(req, steps, side: str) -> np.ndarray:
    """Per step of the given side's replicas, the blocks of the prompts whose KV was in flight from (prefill)
    or into (decode) its replica when it started: a prefill replica holds them from its prefill's end, a
    decode replica from when it allocated them, both until the transfer's end."""
    replica = req.prefill_replica if side == "prefill" else req.decode_replica
    since = req.prefill_done_s if side == "prefill" else req.kv_blocks_allocated_s
    blocks = -(-req.prompt_tokens // 16)
    out = np.zeros(len(steps), dtype=np.int64)
    for j, (start, where) in enumerate(zip(steps.start_s.to_numpy(), steps.replica.to_numpy())):
        mine = (replica.to_numpy() == where) & (since.to_numpy() < start) & (start < req.kv_transfer_end_s.to_numpy())
        out[j] = blocks.to_numpy()[mine].sum()
    return out


def test_blocks_are_held_on_both_sides_during_a_transfer(run_config, monkeypatch):
    """A slow link (vLLM's NIXL connector): the prefill replica keeps a request's blocks until the decode
    replica has read them, and the decode replica allocated them before the read began; each step's KV
    blocks count them on both sides. (No prefix sharing and no speculation: a request holds its prompt's
    blocks exactly.)"""
    config = disaggregated_config(run_config, 2, 2, workload__rate=20.0, cluster__kv_link_bandwidth_gb_s=0.5,
                                  policy__name="none", engine__enable_prefix_caching=False)
    with monkeypatch.context() as m:
        pools = capture_loops(m)
        result = execute(prepare(config))
    check_conservation(result, pools)
    req, steps = result.requests, result.steps
    for side, pool in (("prefill", steps.replica < 2), ("decode", steps.replica >= 2)):
        held = blocks_in_flight(req, steps[pool], side)
        assert held.max() > 0, side  # transfers overlapped steps
        assert (steps[pool].kv_blocks.to_numpy() >= held).all(), side
    # the blocks were on the prefill side longer than the link took: they waited for the link, then crossed it
    assert (req.kv_transfer_end_s - req.prefill_done_s).max() > (req.kv_transfer_end_s - req.kv_transfer_start_s).max()


def test_a_decode_replica_without_room_makes_the_transfer_wait(run_config, monkeypatch):
    """A decode replica allocates a prompt's blocks before its KV is read, and only while it has room (free
    blocks, running requests under max_num_seqs, nothing ready to admit before it): a small decode KV cache
    makes transfers wait for blocks, which the summary counts; every block still comes back."""
    config = disaggregated_config(run_config, 2, 1, workload__rate=20.0, engine__kv_cache_tokens=700)
    with monkeypatch.context() as m:
        pools = capture_loops(m)
        result = execute(prepare(config))
    check_conservation(result, pools)
    t = result.extra["disaggregated"]["kv_transfer"]
    req = result.requests
    waited = req.kv_blocks_allocated_s > req.prefill_done_s
    assert t["waited_for_blocks"] == int(waited.sum()) > 0 and t["max_wait_for_blocks_ms"] > 0
    # a transfer that waited for blocks began when the decode replica ended a step or another hand-off came
    instants = np.concatenate((result.steps[result.steps.replica == 2].end_s.to_numpy(), req.prefill_done_s))
    assert np.isin(req.kv_blocks_allocated_s[waited].to_numpy(), instants).all()


def test_llm_d_decides_by_the_prompt_not_cached_on_the_chosen_decode_replica(run_config, monkeypatch):
    """--pd-threshold N (llm-d's decode-first flow): without shared prefixes nothing is cached at a decision, so
    exactly the prompts under N tokens are prefilled by their decode replica; with a shared system prompt,
    longer prompts stay there too once the decode replica holds it. 0 (llm-d's default) sends every prompt to
    the prefill pool, as vLLM's proxy does, with the decode replica chosen at arrival."""
    with monkeypatch.context() as m:
        pools = capture_loops(m)
        plain = execute(prepare(disaggregated_config(run_config, 2, 2, cluster__pd_threshold=150)))
    check_conservation(plain, pools)
    req = plain.requests
    local = req.prefill_replica < 0
    assert (local == (req.prompt_tokens < 150)).all() and 0 < local.sum() < len(req)
    assert plain.extra["disaggregated"]["flow"] == "llm-d-decode-first"
    assert plain.extra["disaggregated"]["prefilled_on_decode"] == int(local.sum())
    with monkeypatch.context() as m:
        pools = capture_loops(m)
        shared = execute(prepare(disaggregated_config(run_config, 2, 2, cluster__pd_threshold=150,
                                                      workload__shared_prefix="128:1:128")))
    check_conservation(shared, pools)
    req = shared.requests
    kept = req[(req.prefill_replica < 0) & (req.prompt_tokens >= 150)]
    assert len(kept) > 0 and (kept.num_cached_tokens > 0).all()  # their decode replica had the prefix
    everyone = execute(prepare(disaggregated_config(run_config, 2, 2, cluster__pd_threshold=0)))
    assert (everyone.requests.prefill_replica >= 0).all()
    assert everyone.extra["disaggregated"]["prefilled_on_decode"] == 0
    alone = execute(prepare(disaggregated_config(run_config, 1, 2, cluster__pd_threshold=10**6)))
    assert (alone.requests.prefill_replica < 0).all() and (alone.steps.replica >= 1).all()  # the prefill pool idles
    again = execute(prepare(disaggregated_config(run_config, 2, 2, cluster__pd_threshold=150)))
    assert again.requests.equals(plain.requests) and again.steps.equals(plain.steps)


def test_transfers_in_flight_share_a_link(run_config):
    """--kv-transfers shared: transfers start at once and move their bytes at the bandwidth over the transfers
    in flight on the busier end. Two equal prompts handed to one decode replica at once take twice as long
    as one alone and end together; the bytes moved per second never exceed a link's bandwidth per end."""
    prompt, bandwidth, latency = 1000, 1.0, 10.0
    config = disaggregated_config(run_config, 2, 1, workload__num_requests=2, workload__prompt_tokens=prompt,
                                  workload__output_tokens=2, workload__rate="inf", cluster__kv_transfers="shared",
                                  cluster__kv_link_bandwidth_gb_s=bandwidth, cluster__kv_link_latency_us=latency,
                                  cluster__router="round-robin", engine__max_num_batched_tokens=2048)
    result = execute(prepare(config))
    req = result.requests
    per_token = 131072 + 32768
    alone = prompt * per_token / (bandwidth * 1e9)
    assert (req.prefill_replica.to_numpy() == [0, 1]).all() and req.prefill_done_s.nunique() == 1
    assert (req.kv_transfer_start_s == req.prefill_done_s).all()
    assert np.allclose(req.kv_transfer_end_s - req.kv_transfer_start_s, 2 * alone + latency * 1e-6, rtol=1e-12)
    assert result.extra["disaggregated"]["kv_transfer"]["sharing"] == "shared"
    busy = execute(prepare(disaggregated_config(run_config, 2, 2, workload__rate=30.0, cluster__kv_transfers="shared",
                                                cluster__kv_link_bandwidth_gb_s=0.5)))
    queued = execute(prepare(disaggregated_config(run_config, 2, 2, workload__rate=30.0,
                                                  cluster__kv_link_bandwidth_gb_s=0.5)))
    for r in (busy.requests, queued.requests):  # per decode replica: bytes over the busy span within bandwidth
        for _, group in r.groupby("decode_replica"):
            span = group.kv_transfer_end_s.max() - group.kv_transfer_start_s.min()
            assert group.kv_transfer_bytes.sum() / span <= 0.5e9 * (1 + 1e-9)
    assert busy.extra["disaggregated"]["kv_transfer"]["queued_transfers"] < \
        queued.extra["disaggregated"]["kv_transfer"]["queued_transfers"]


@pytest.mark.parametrize("policy", ["fixed", "goodput"])
def test_compiled_rules_match_interpreted_ones(run_config, policy):
    """Both pools step with the rules compiled (numba); with every rule interpreted (engine.jit off) the
    bytes are the same."""
    compiled = execute(prepare(disaggregated_config(run_config, 2, 2, policy__name=policy, engine__jit="on",
                                                    cluster__router="least-tokens")))
    interpreted = execute(prepare(disaggregated_config(run_config, 2, 2, policy__name=policy, engine__jit="off",
                                                       cluster__router="least-tokens")))
    assert compiled.requests.equals(interpreted.requests) and compiled.steps.equals(interpreted.steps)


def test_without_the_flags_nothing_changes(run_config):
    """The new keys are left out of config.toml (and its digest) unless the run is disaggregated."""
    plain = run_config(**V1, workload__num_requests=10, workload__rate=4.0)
    assert "prefill_replicas" not in plain.to_toml() and "kv_link" not in plain.to_toml()
    split = disaggregated_config(run_config, 1, 2)
    assert "prefill_replicas = 1" in split.to_toml() and 'kv_link = "rdma"' in split.to_toml()


@pytest.mark.parametrize("overrides,key,words", [
    (dict(cluster__prefill_replicas=0, cluster__decode_replicas=2), "cluster.prefill_replicas",
     "at least one prefill replica"),
    (dict(cluster__prefill_replicas=2), "cluster.prefill_replicas", "needs a decode pool too"),
    (dict(cluster__decode_replicas=2), "cluster.decode_replicas", "needs a prefill pool too"),
    (dict(cluster__prefill_replicas=1, cluster__decode_replicas=1, engine__scheduler="v0"),
     "cluster.prefill_replicas", "vllm-v1"),
    (dict(cluster__prefill_replicas=1, cluster__decode_replicas=1, cluster__replicas=2), "cluster.replicas",
     "not both"),
    (dict(cluster__kv_link="nvlink"), "cluster.kv_link", "applies only to disaggregated serving"),
    (dict(cluster__prefill_replicas=1, cluster__decode_replicas=1, cluster__kv_link_latency_us=-1.0),
     "cluster.kv_link_latency_us", "at least 0"),
    (dict(cluster__pd_threshold=100), "cluster.pd_threshold", "applies only to disaggregated serving"),
    (dict(cluster__prefill_replicas=1, cluster__decode_replicas=1, cluster__pd_threshold=-1),
     "cluster.pd_threshold", "at least 0"),
])
def test_impossible_setups_are_one_line_errors(run_config, overrides, key, words):
    base = {**V1, "workload__num_requests": 5, "workload__rate": 1.0}
    if overrides.get("engine__scheduler") == "v0":
        del base["engine__max_num_batched_tokens"]  # a vllm-v1 key: refused under v0 before anything else
    with pytest.raises(InputError) as caught:
        run_config(**{**base, **overrides})
    assert caught.value.field == key and words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("kv,words", [(200, "prompt needs 320 tokens of KV cache on a prefill replica"),
                                      (400, "on a decode replica")])
def test_requests_that_cannot_fit_a_pool_are_refused_before_the_run(run_config, kv, words):
    config = disaggregated_config(run_config, 1, 1, workload__prompt_tokens=300, workload__output_tokens=200,
                                  engine__kv_cache_tokens=kv)
    with pytest.raises(InputError) as caught:
        prepare(config)
    assert caught.value.field == "engine.kv_cache_tokens" and words in str(caught.value)


def test_cli_and_api_run_it_and_config_toml_reruns_it(tmp_path, synthetic_profile, capsys):
    """From the command line (the summary prints the pools and the transfers), again from its config.toml
    (the same files), and from the Python API with the flags' names (the same summary)."""
    from specbatch import run
    from specbatch.commands.cli import main

    first, again = tmp_path / "first", tmp_path / "again"
    flags = ["--profile", str(synthetic_profile), "--scheduler", "vllm-v1", "--num-requests", "40", "--rate", "3",
             "--prefill-replicas", "1", "--decode-replicas", "2", "--kv-link", "nvlink"]
    assert main(["run", *flags, "--out", str(first)]) == 0
    printed = capsys.readouterr().out
    assert "Disaggregated prefill / decode" in printed and "nvlink, 450 GB/s" in printed
    assert main(["run", "--config", str(first / "config.toml"), "--out", str(again)]) == 0
    for name in ("summary.json", "requests.csv", "steps.csv"):
        assert (first / name).read_text().replace(str(first), "OUT") == \
            (again / name).read_text().replace(str(again), "OUT"), name
    summary = json.loads((first / "summary.json").read_text())
    assert summary["disaggregated"]["kv_transfer"]["transfers"] == 40
    api = run(profile=str(synthetic_profile), scheduler="vllm-v1", num_requests=40, rate=3, prefill_replicas=1,
              decode_replicas=2, kv_link="nvlink", records="none")
    assert api.summary["mean_ttft_ms"] == summary["metrics"]["mean_ttft_ms"]


def test_the_decode_pool_runs_its_own_profile(run_config, synthetic_profile, tmp_path):
    """--decode-profile: the decode replicas are priced by their own profile (here the same models at half
    the latency, a faster GPU); the prefill pool's steps stay exactly as they were; the run's own profile
    named again changes nothing; a profile of other models is refused."""
    from tests.synthetic import linear_latency, make_profile

    faster = make_profile(tmp_path / "faster", lambda *point: 0.5 * linear_latency(*point))
    base = execute(prepare(disaggregated_config(run_config, 2, 2)))
    same = execute(prepare(disaggregated_config(run_config, 2, 2, cluster__decode_profile=str(synthetic_profile))))
    assert base.requests.equals(same.requests) and base.steps.equals(same.steps)
    fast = execute(prepare(disaggregated_config(run_config, 2, 2, cluster__decode_profile=str(faster))))
    on_prefill = base.steps.replica < 2
    assert base.steps[on_prefill].reset_index(drop=True).equals(
        fast.steps[fast.steps.replica < 2].reset_index(drop=True))
    assert fast.summary["mean_tpot_ms"] < 0.75 * base.summary["mean_tpot_ms"]
    assert fast.extra["disaggregated"]["decode"]["profile"] == "faster"
    other = make_profile(tmp_path / "other", label="other")
    with pytest.raises(InputError) as caught:
        prepare(disaggregated_config(run_config, 1, 1, cluster__decode_profile=str(other)))
    assert caught.value.field == "cluster.decode_profile" and "same models" in str(caught.value)


def test_each_pool_runs_its_own_engine_settings(run_config, monkeypatch):
    """[cluster.prefill] / [cluster.decode] (--prefill-engine / --decode-engine): each pool's token budget,
    batch limit and KV budget are its own; settings equal to [engine]'s change no byte."""
    base = execute(prepare(disaggregated_config(run_config, 2, 2, workload__rate=20.0)))
    same = execute(prepare(disaggregated_config(run_config, 2, 2, workload__rate=20.0,
                                                cluster__prefill="max_num_batched_tokens=256",
                                                cluster__decode="max_batch_size=16")))
    assert base.requests.equals(same.requests) and base.steps.equals(same.steps)
    with monkeypatch.context() as m:
        pools = capture_loops(m)
        own = execute(prepare(disaggregated_config(
            run_config, 2, 2, workload__rate=20.0, cluster__prefill="max_num_batched_tokens=64,max_batch_size=4",
            cluster__decode="max_batch_size=2,kv_cache_tokens=900")))
    check_conservation(own, pools)
    steps = own.steps
    on_prefill, on_decode = steps[steps.replica < 2], steps[steps.replica >= 2]
    assert on_prefill.prefill_tokens.max() <= 64 and on_prefill.running.max() <= 4
    assert on_decode.running.max() <= 2 and on_decode.kv_blocks.max() <= 900 // 16
    assert base.steps[base.steps.replica >= 2].running.max() > 2  # the run's own batch limit is wider
    (prefill_states, decode_states) = [[state for state, _ in pool] for pool in pools]
    assert {int(s.par[P_BLOCKS]) for s in decode_states} == {900 // 16}
    assert {int(s.par[P_BLOCKS]) for s in prefill_states} != {900 // 16}


def test_pool_settings_from_a_config_file_and_their_errors(tmp_path, synthetic_profile):
    """A [cluster.decode] table is read, written back to config.toml and rerun the same; a bad entry is one
    line naming the pool's key, the file and the line of its table."""
    from sim.config import load_config

    def write(body: str):
        path = tmp_path / "pools.toml"
        path.write_text(f'profile = "{synthetic_profile}"\n[engine]\nscheduler = "vllm-v1"\n[workload]\n'
                        f'num_requests = 20\nrate = 4.0\n[cluster]\nprefill_replicas = 1\ndecode_replicas = 1\n{body}')
        return path

    config = load_config(write("[cluster.decode]\nmax_batch_size = 4\nkv_cache_tokens = 20000\n"))
    assert dict(config.cluster.decode) == {"max_batch_size": 4, "kv_cache_tokens": 20000}
    assert "[cluster.decode]" in config.to_toml()
    again = tmp_path / "again.toml"
    again.write_text(config.to_toml())
    assert load_config(again).cluster.decode == config.cluster.decode
    for body, words in (("[cluster.decode]\nmax_num_seqs = 4\n", "'max_num_seqs' is not a setting a pool sets"),
                        ("[cluster.decode]\nmax_num_batched_tokens = 0\n",
                         "max_num_batched_tokens: must be at least 1"),
                        ("[cluster.prefill]\nkv_cache_tokens = 100\ngpu_memory_utilization = 0.9\n", "not both")):
        with pytest.raises(InputError) as caught:
            load_config(write(body))
        error = caught.value
        assert error.field.startswith("cluster.") and words in str(error) and "\n" not in str(error)
        assert error.line == 10 and str(error.source).endswith("pools.toml")  # the table's header
    with pytest.raises(InputError) as caught:  # a pool too small for a request: named where the pool set it
        prepare(load_config(write("[cluster.decode]\nkv_cache_tokens = 64\n")))
    assert caught.value.field == "cluster.decode" and "on a decode replica" in str(caught.value)


def test_pool_settings_apply_only_to_disaggregated_serving(run_config):
    with pytest.raises(InputError) as caught:
        run_config(**V1, workload__num_requests=5, cluster__decode="max_batch_size=4")
    assert caught.value.field == "cluster.decode" and "only to disaggregated serving" in str(caught.value)
