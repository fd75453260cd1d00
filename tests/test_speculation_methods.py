"""Speculation methods (issue 29): the engines' configuration, each method's cost, proposals, trees, bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import load_config
from sim.costmodel.model import CostModel, Drafter
from sim.errors import InputError
from sim.costmodel.profile import load_profile
from sim.simulate import execute, prepare
from sim.speculation.methods import (SpeculationError, from_sglang, from_vllm, kv_capacity_for, resolve, tree_capacity)
from sim.speculation.trees import build_tree, chain_rates
from tests.conftest import CPU_DEFAULTS
from tests.synthetic import linear_latency, make_profile

DRAFTERS = ("eagle", "eagle3", "mtp", "medusa", "ngram", "suffix")


@pytest.fixture(scope="module")
def methods_profile(tmp_path_factory):
    """The hand-made profile with every drafter priced (tests/synthetic.py)."""
    return make_profile(tmp_path_factory.mktemp("profiles") / "methods", drafters=DRAFTERS)


@pytest.fixture(scope="module")
def config_with(methods_profile):
    def build(**overrides):
        flags = {"profile": (str(methods_profile), "--profile")}
        for key, value in overrides.items():
            flags[key.replace("__", ".")] = (value, f"--{key}")
        return load_config(CPU_DEFAULTS, flags)
    return build


def run(config):
    return execute(prepare(config))


# ------------------------------------------------------------------------------ configuration
def test_vllm_config_as_json_text_a_file_and_a_table(tmp_path):
    text = '{"method": "eagle3", "num_speculative_tokens": 3, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}'
    path = tmp_path / "spec.json"
    path.write_text(text)
    for given in (text, str(path), json.loads(text)):
        cfg = load_config(overrides={"speculative.config": given})
        assert cfg.speculation.method == "eagle3" and cfg.speculation.num_speculative_tokens == 3
        assert (cfg.policy.name, cfg.policy.params) == ("fixed", {"k": 3})  # no policy named: vLLM's static k


def test_vllm_defaults_and_aliases():
    assert from_vllm({"method": "ngram", "num_speculative_tokens": 4}).prompt_lookup_min == 5  # vLLM: 5..5
    only_max = from_vllm({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (3, 3)
    assert from_vllm({"model": "ngram", "num_speculative_tokens": 2}).method == "ngram"
    assert from_vllm({"model": "some/draft", "num_speculative_tokens": 2}).method == "draft_model"
    assert from_vllm({"method": "deepseek_mtp"}).method == "mtp"
    assert from_vllm({"method": "mtp"}).num_speculative_tokens == 1  # DeepSeek-V3's one MTP module
    assert from_vllm({"method": "suffix"}).num_speculative_tokens == 24  # suffix_decoding_max_tree_depth
    assert from_vllm({"method": "medusa", "num_speculative_tokens": 3}).drafter == "heads"


@pytest.mark.parametrize("config, message", [
    ({"method": "lookahead", "num_speculative_tokens": 3}, "method 'lookahead' is not one of"),
    ({"method": "eagle"}, "needs num_speculative_tokens"),
    ({"method": "eagle", "num_speculative_tokens": 0}, "whole number >= 1"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min=4 must be <= prompt_lookup_max=2"),
    ({"method": "eagle", "num_speculative_tokens": 3, "prompt_lookup_max": 2}, "apply to method ngram"),
    ({"method": "eagle", "num_speculative_tokens": 3, "speculative_tokens": 2}, "unknown key 'speculative_tokens'"),
    ({"method": "eagle", "num_speculative_tokens": 3, "speculative_token_tree": "[(0,)]"}, "not modelled"),
])
def test_bad_vllm_configs_are_one_line(config, message):
    with pytest.raises(InputError, match="speculative.config") as info:
        load_config(overrides={"speculative.config": (json.dumps(config), "--speculative-config")})
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith("--speculative-config: speculative.config:")


def test_schedule_selects_vllm_dynamic_and_an_explicit_policy_wins():
    config = {"method": "eagle3", "num_speculative_tokens": 4,
              "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 256, 1]]}
    cfg = load_config(overrides={"speculative.config": config})
    assert cfg.policy.name == "vllm-dynamic" and cfg.policy.params["speculative_config"] == config
    explicit = load_config(overrides={"speculative.config": config, "policy.name": "goodput"})
    assert explicit.policy.name == "goodput"
    dyn = load_config(overrides={"speculative.config": config, "policy.name": "vllm-dynamic"})
    assert dyn.policy.params["speculative_config"] == config  # the section's config, when it has none of its own


def test_sglang_flags():
    chain = from_sglang("EAGLE3", 5, 1, None)
    assert (chain.method, chain.num_speculative_tokens, chain.topk, chain.num_draft_tokens) == ("eagle3", 5, 1, 6)
    tree = from_sglang("EAGLE", None, None, None)  # SGLang's documented defaults: 5 steps, top-4, 8 tokens
    assert (tree.num_speculative_tokens, tree.topk, tree.num_draft_tokens, tree.is_tree) == (5, 4, 8, True)
    assert from_sglang("NEXTN", 2, 1, None).method == "mtp"
    assert from_sglang("STANDALONE", 3, None, None).method == "draft_model"
    assert from_sglang("NGRAM", None, None, 6).num_speculative_tokens == 5
    assert tree_capacity(2, 2) == 6
    with pytest.raises(SpeculationError, match="at most 6 candidate"):
        from_sglang("EAGLE", 2, 2, 8)
    with pytest.raises(SpeculationError, match="applies to EAGLE") as info:
        from_sglang("STANDALONE", 3, 4, 8)
    assert info.value.key == "speculative.eagle_topk"
    with pytest.raises(SpeculationError, match="not both"):
        resolve({"method": "eagle", "num_speculative_tokens": 2}, "EAGLE", None, None, None)
    with pytest.raises(SpeculationError, match="need --speculative-algorithm"):
        resolve(None, None, 3, None, None)


def test_resolved_config_round_trips_and_default_runs_keep_their_file(tmp_path):
    plain = load_config()
    assert "speculative" not in plain.to_toml()  # nothing given: config.toml (and its digest) as before
    cfg = load_config(overrides={"speculative.config": {"method": "ngram", "num_speculative_tokens": 3}})
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml())
    again = load_config(path)
    assert again.speculation == cfg.speculation and again.acceptance == cfg.acceptance
    assert again.digest() == cfg.digest()


def test_method_defaults_apply_unless_acceptance_is_given():
    eagle = load_config(overrides={"speculative.config": {"method": "eagle", "num_speculative_tokens": 3}})
    assert eagle.acceptance.model == "per-position" and eagle.acceptance.per_position[0] == pytest.approx(0.6937)
    ngram = load_config(overrides={"speculative.config": {"method": "ngram", "num_speculative_tokens": 3}})
    assert ngram.acceptance.match_rate == pytest.approx(0.4783)
    mine = load_config(overrides={"speculative.config": {"method": "eagle", "num_speculative_tokens": 3},
                                  "acceptance.alpha": 0.5})
    assert mine.acceptance.model == "geometric" and mine.acceptance.alpha == 0.5


# --------------------------------------------------------------------------------- costs
@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_head_step_is_one_first_pass_and_k_minus_1_later_ones(methods_profile, method):
    model = CostModel(load_profile(methods_profile)).with_drafter(Drafter("head", method))
    b, k, c = 4, 3, 512
    head = lambda q: linear_latency("decode", method, b, q, c)  # noqa: E731
    expected = (head(k + 1) + (k - 1) * head(1) + linear_latency("decode", "target", b, k + 1, c)
                + linear_latency("verify", "target", b, k, 0))
    assert float(model.decode_pass_times(b, k, c)) == pytest.approx(expected, rel=1e-9)
    assert float(model.decode_pass_times(b, 0, c)) == pytest.approx(
        linear_latency("decode", "target", b, 1, c) + linear_latency("verify", "target", b, 0, 0), rel=1e-9)
    # a prompt passes the head once (its one-layer KV), not a draft model
    assert float(model.prefill_pass_times(b, 128, True)) == pytest.approx(
        linear_latency("prefill", "target", b, 128, 0) + linear_latency("prefill", method, b, 128, 0), rel=1e-9)


def test_medusa_and_host_proposers_have_no_draft_pass(methods_profile):
    base = CostModel(load_profile(methods_profile))
    b, k, c = 8, 3, 1024
    target = linear_latency("decode", "target", b, k + 1, c) + linear_latency("verify", "target", b, k, 0)
    medusa = base.with_drafter(Drafter("heads", "medusa"))
    assert float(medusa.decode_pass_times(b, k, c)) == pytest.approx(target + linear_latency("decode", "medusa", b, k, 0))
    ngram = base.with_drafter(Drafter("host", "ngram"))
    assert float(ngram.decode_pass_times(b, k, c)) == pytest.approx(
        target + linear_latency("propose", "ngram", b, k, c), rel=1e-9)
    for model in (medusa, ngram):  # no prefill of a drafter, nothing to catch up
        assert float(model.prefill_pass_times(b, 128, True)) == pytest.approx(
            linear_latency("prefill", "target", b, 128, 0))
        assert float(model.catch_up_times(b, 5, c)) == 0.0


def test_tree_verifies_its_tokens(methods_profile):
    model = CostModel(load_profile(methods_profile)).with_drafter(Drafter("head", "eagle3", 4, (1, 5, 7, 8)))
    b, c = 2, 512
    head = lambda q: linear_latency("decode", "eagle3", b, q, c)  # noqa: E731
    expected = (head(4) + 2 * head(4) + linear_latency("decode", "target", b, 8, c)
                + linear_latency("verify", "target", b, 7, 0))
    assert float(model.decode_pass_times(b, 3, c)) == pytest.approx(expected, rel=1e-9)


def test_kv_capacity_follows_the_drafter(methods_profile):
    profile = load_profile(methods_profile)
    caps = {m: kv_capacity_for(profile, from_vllm({"method": m, "num_speculative_tokens": 2}))
            for m in ("draft_model", "eagle", "ngram")}
    assert caps["draft_model"] == profile.kv_capacity_tokens
    # the draft model's 2 GiB and 32 KiB a token give way to a head's 1 GiB and 4 KiB, or to nothing
    assert caps["draft_model"] < caps["eagle"] < caps["ngram"]
    free = profile.kv_capacity_tokens * (131072 + 32768) + (2 << 30)
    assert caps["ngram"] == free // 131072


# --------------------------------------------------------------------------- runs
@pytest.mark.parametrize("method", DRAFTERS + ("draft_model",))
def test_every_method_runs_end_to_end_and_conserves_tokens(config_with, method):
    k = 3
    result = run(config_with(speculative__config={"method": method, "num_speculative_tokens": k},
                             workload__num_requests=40, workload__rate=5.0))
    req = result.request_columns
    assert np.isfinite(req["finish_s"]).all()
    assert int(result.step_columns["emitted_tokens"].sum()) == int(req["output_tokens"].sum())
    assert result.summary["num_accepted_tokens"] <= result.summary["num_draft_tokens"]


def test_lookahead_and_lag_follow_the_method(config_with):
    runs = {m: prepare(config_with(speculative__config={"method": m, "num_speculative_tokens": 3},
                                   engine__scheduler="vllm-v1"))
            for m in ("draft_model", "eagle3", "ngram", "medusa")}
    assert {m: r.replica.scheduler().lookahead for m, r in runs.items()} == \
        {"draft_model": 3, "eagle3": 3, "ngram": 0, "medusa": 0}
    assert {m: r.replica.lag_mode for m, r in runs.items()} == {"draft_model": 1, "eagle3": 2, "ngram": 0, "medusa": 0}


def test_async_scheduling_follows_the_method_as_vllm_does():
    """vLLM plans a step while the previous runs only with a draft model or an EAGLE/MTP head: for
    any other method its default turns off, and asking for it is refused (vllm/config/vllm.py)."""
    def engine(spec, **more):
        flags = {"speculative.config": (spec, "--speculative-config"), **more}
        return load_config(overrides=flags)
    for method, scheduled_async in (("draft_model", True), ("eagle", True), ("eagle3", True), ("mtp", True),
                                    ("ngram", False), ("suffix", False), ("medusa", False)):
        config = engine({"method": method, "num_speculative_tokens": 3})
        assert config.engine.async_scheduling is scheduled_async, method
    assert load_config().engine.async_scheduling  # no method given: the default draft model, async
    tree = load_config(overrides={"speculative.algorithm": ("EAGLE", "--speculative-algorithm")})
    chain = load_config(overrides={"speculative.algorithm": ("EAGLE", "--speculative-algorithm"),
                                   "speculative.eagle_topk": (1, "--speculative-eagle-topk")})
    assert not tree.engine.async_scheduling and chain.engine.async_scheduling  # SGLang overlaps chains only
    with pytest.raises(InputError, match="only with a draft model or an EAGLE/MTP chain.*--no-async-scheduling") \
            as info:
        engine({"method": "ngram", "num_speculative_tokens": 3},
               **{"engine.async_scheduling": (True, "--async-scheduling")})
    assert info.value.field == "engine.async_scheduling" and "\n" not in str(info.value)
    assert not engine({"method": "eagle3", "num_speculative_tokens": 3},
                      **{"engine.async_scheduling": (False, "--no-async-scheduling")}).engine.async_scheduling
    v0 = engine({"method": "ngram", "num_speculative_tokens": 3}, **{"engine.scheduler": ("v0", "--scheduler")})
    assert v0.engine.scheduler == "v0"  # v0 has no asynchronous scheduling to turn off


def test_ngram_proposes_where_it_matches(config_with):
    """A row proposes k or nothing; over many steps the share that proposed is the match rate."""
    result = run(config_with(speculative__config={"method": "ngram", "num_speculative_tokens": 4},
                             acceptance__match_rate=0.3, engine__scheduler="v0", workload__num_requests=200,
                             workload__rate=50.0))
    steps = result.step_columns
    decode = (steps["phase"] == 1) & (steps["batch_size"] > 0)
    rows = steps["batch_size"][decode].sum()
    proposing = steps["drafted_tokens"][decode].sum() / 4
    assert 0.25 < proposing / rows < 0.35
    assert (steps["k"][decode] == 0).any() and (steps["k"][decode] == 4).any()  # whole steps with no match


def test_runlength_keeps_min_k_and_run_minus_one(config_with, tmp_path):
    """One request, its runs known: k = 2 at batch 1 walks the record exactly."""
    runs = [3, 2, 1, 1, 5, 4, 3, 2, 1, 1]  # position i: run v_i
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps({"prompt_tokens": 40, "eagle": runs}) + "\n")
    result = run(config_with(speculative__config={"method": "eagle", "num_speculative_tokens": 2},
                             acceptance__model="runlength", acceptance__trace=str(path),
                             acceptance__proposer="eagle", acceptance__trace_lengths=True,
                             workload__num_requests=1, engine__scheduler="v0"))
    assert result.request_columns["prompt_tokens"][0] == 40 and result.request_columns["output_tokens"][0] == 10
    steps = result.step_columns
    accepted = steps["accepted_tokens"][steps["phase"] == 1].tolist()
    # after the prefill's token: position 0 (v 3) keeps 2, position 3 (v 1) 0, position 4 (v 5) 2,
    # position 7 (v 2) 1: 1 + 3 + 1 + 3 + 2 = 10 tokens
    assert accepted == [2, 0, 2, 1]


def validation_data() -> Path | None:
    """../shared/validation/acceptance-llama31-8b (relative to the project root, or a folder above it)."""
    root = Path(__file__).resolve().parents[1]
    found = [p / "shared" / "validation" / "acceptance-llama31-8b" for p in root.parents]
    return next((p for p in found if p.is_dir()), None)


def test_runlength_reads_the_shared_measurements():
    folder = validation_data()
    if folder is None:
        pytest.skip("the validation data is not here")
    path = folder / "gsm8k.jsonl.gz"
    from sim.speculation.acceptance import read_runlength_trace, runlength_rates
    from sim.speculation.methods import SHAREGPT_EAGLE, SHAREGPT_NGRAM, SHAREGPT_NGRAM_PROPOSES

    trace = read_runlength_trace(path, "ngram")
    assert len(trace) == 300 and trace.runs.mean() == pytest.approx(1.46, abs=0.01)
    # the shipped defaults are the ShareGPT measurements summed up (sim/speculation/methods.py)
    share = folder / "sharegpt.jsonl.gz"
    eagle = read_runlength_trace(share, "eagle").runs
    ngram = read_runlength_trace(share, "ngram").runs
    assert np.round(runlength_rates(eagle, 1.0, 10)[1], 4).tolist() == list(SHAREGPT_EAGLE)
    proposes, rates = runlength_rates(ngram, 0.2, 10)
    assert round(proposes, 4) == SHAREGPT_NGRAM_PROPOSES and np.round(rates, 4).tolist() == list(SHAREGPT_NGRAM)


# --------------------------------------------------------------------------------- trees
def test_a_chain_tree_is_geometric():
    tree = build_tree(np.full(4, 0.7), (0.3,), 4, 1, 4)
    assert tree.per_depth == (1, 1, 1, 1)
    assert np.allclose(tree.reach, 0.7 ** np.arange(1, 5))


def test_a_wide_tree_accepts_more_and_verifies_its_nodes():
    chain = build_tree(np.full(3, 0.6), (0.4,), 3, 1, 3)
    tree = build_tree(np.full(3, 0.6), (0.4,), 3, 2, 6)
    assert sum(tree.per_depth) == 6 and tree.target_tokens(3) == 7
    assert tree.reach[0] == pytest.approx(0.6 + 0.4 * 0.4)  # the second candidate catches what the first missed
    assert tree.expected_accepted > chain.expected_accepted


@settings(max_examples=60, deadline=None)
@given(alpha=st.floats(0.05, 0.95), sibling=st.floats(0.0, 1.0), steps=st.integers(1, 6), topk=st.integers(1, 5),
       extra=st.integers(0, 20))
def test_tree_invariants(alpha, sibling, steps, topk, extra):
    nodes = min(steps + extra, tree_capacity(steps, topk))
    tree = build_tree(np.full(steps, alpha), (sibling,), steps, topk, nodes)
    reach = np.asarray(tree.reach)
    assert sum(tree.per_depth) == nodes
    assert np.all(np.diff(reach) <= 1e-12) and reach[0] <= 1.0 and reach[0] >= alpha - 1e-12
    assert all(n <= topk * topk for n in tree.per_depth)


def test_chain_rates_from_per_position():
    assert np.allclose(chain_rates((0.8, 0.4, 0.2), 3), [0.8, 0.5, 0.5])


def test_tree_runs_and_needs_its_sibling_rates(config_with):
    base = dict(speculative__algorithm="EAGLE3", speculative__num_steps=3, speculative__eagle_topk=2,
                speculative__num_draft_tokens=6, workload__num_requests=30)
    with pytest.raises(InputError, match="acceptance.sibling_rates"):
        prepare(config_with(**base))
    result = run(config_with(**base, acceptance__sibling_rates="0.4"))
    assert result.summary["mean_acceptance_length"] > 1
    with pytest.raises(InputError, match="exceed the profile's measured query width 8"):
        prepare(config_with(**{**base, "speculative__num_steps": 5, "speculative__eagle_topk": 4,
                               "speculative__num_draft_tokens": 12}, acceptance__sibling_rates="0.4"))


# --------------------------------------------------------------------------- bad input
def test_a_method_the_profile_cannot_price(config_with, synthetic_profile):
    cfg = load_config(CPU_DEFAULTS, {"profile": (str(synthetic_profile), "--profile"),
                                     "speculative.config": ('{"method": "eagle3", "num_speculative_tokens": 3}',
                                                            "--speculative-config")})
    with pytest.raises(InputError) as info:
        prepare(cfg)
    assert "has no eagle3 passes" in str(info.value) and "--drafters eagle3" in str(info.value)


def test_a_policy_beyond_the_methods_k(config_with):
    with pytest.raises(InputError, match="beyond the method's num_speculative_tokens = 2"):
        prepare(config_with(speculative__config={"method": "eagle", "num_speculative_tokens": 2},
                            policy__name="fixed", policy__k=4))


def test_runlength_trace_problems_are_one_line(config_with, tmp_path):
    def attempt(lines, proposer="eagle", method="eagle", **extra):
        path = tmp_path / "t.jsonl.gz"
        with gzip.open(path, "wt") as handle:
            handle.write("\n".join(lines) + "\n")
        return prepare(config_with(speculative__config={"method": method, "num_speculative_tokens": 2},
                                   acceptance__model="runlength", acceptance__trace=str(path),
                                   acceptance__proposer=proposer, **extra))

    with pytest.raises(InputError, match=r"t.jsonl.gz:2: acceptance.trace: no 'eagle' run lengths"):
        attempt(['{"eagle": [1, 2]}', '{"ngram": [1]}'])
    with pytest.raises(InputError, match="whole numbers >= 1"):
        attempt(['{"eagle": [1, 0]}'])
    with pytest.raises(InputError, match="non-empty list"):
        attempt(['{"eagle": []}'])
    with pytest.raises(InputError, match="method eagle takes --acceptance-proposer eagle"):
        attempt(['{"eagle": [2], "ngram": [2]}'], proposer="ngram")
    with pytest.raises(InputError, match="the lengths come from the acceptance trace"):
        attempt(['{"eagle": [2]}'], acceptance__trace_lengths=True, workload__output_tokens="64")


def test_issue_command_line(tmp_path):
    """The issue's own attempt now runs (the shipped H100 profile prices EAGLE-3)."""
    from specbatch.commands.cli import main

    code = main(["run", "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}',
                 "--num-requests", "20", "--records", "none", "--out", str(tmp_path / "run")])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["speculation"]["method"] == "eagle3" and summary["policy"] == {"name": "fixed", "k": 3}


def test_a_host_matchers_ragged_step_is_priced_by_its_tokens(config_with):
    """Rows without a match verify one token: a step of ks (3, 0) costs the uniform step at k = 1.5
    (interpolated between k = 1 and 2), not the padded k = 3 step a drafting model pays."""
    run = prepare(config_with(speculative__config={"method": "ngram", "num_speculative_tokens": 3}))
    table = run.table
    assert table.drafter_kind == "host"
    mid = table.decode_time_by_tokens(2, [3, 0], 512.0)
    assert mid == pytest.approx((table.decode_time(2, 1, 512.0) + table.decode_time(2, 2, 512.0)) / 2)
    assert mid < table.decode_time(2, 3, 512.0)


def test_sglang_adaptive_needs_a_chain(config_with):
    with pytest.raises(InputError, match="needs --speculative-eagle-topk 1"):
        prepare(config_with(speculative__algorithm="EAGLE3", speculative__num_steps=3, speculative__eagle_topk=2,
                            speculative__num_draft_tokens=6, acceptance__sibling_rates="0.4",
                            policy__name="sglang-adaptive"))


@pytest.mark.parametrize("policy", [{"policy__name": "lut", "policy__alpha": 0.6},
                                    {"policy__name": "goodput", "policy__k_max": 3},
                                    {"policy__name": "vllm-dynamic",
                                     "policy__speculative_config": '{"num_speculative_tokens": 3, '
                                     '"num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 256, 1]]}'},
                                    {"policy__name": "sglang-adaptive"},
                                    {"policy__name": "trtllm-schedule", "policy__draft_len_schedule": "{4: 3, 16: 1}"}])
@pytest.mark.parametrize("method", ["eagle3", "ngram", "medusa"])
def test_every_policy_works_with_every_method(config_with, method, policy):
    result = run(config_with(speculative__config={"method": method, "num_speculative_tokens": 7},
                             workload__num_requests=30, workload__rate=10.0, **policy))
    assert int(result.step_columns["emitted_tokens"].sum()) == int(result.request_columns["output_tokens"].sum())
    assert result.summary["num_draft_tokens"] > 0


def test_goodput_prices_a_matchers_misses(config_with):
    """With rare matches, goodput learns that n-gram's first position is seldom kept: its estimate
    falls towards match rate x the per-position rate, not the rate alone."""
    from sim.simulate import prepare as prep

    cfg = config_with(speculative__config={"method": "ngram", "num_speculative_tokens": 3}, policy__name="goodput",
                      policy__k_max=3, acceptance__match_rate=0.2, acceptance__model="per-position",
                      acceptance__per_position="0.9,0.8,0.7", workload__num_requests=80, workload__rate=2.0,
                      engine__jit="off")
    run_ = prep(cfg)
    execute(run_)
    assert run_.policy.position_rates[0] < 0.5  # about 0.2 x 0.9, not 0.9
