"""The engine policies: vllm-dynamic, sglang-adaptive, trtllm-schedule -- each engine's own semantics,
edge by edge (gaps, caps, thresholds, hysteresis), their knobs from TOML, flags and Python."""

from __future__ import annotations

import json

import pytest

from policies import BatchView, PolicyError, make_policy
from policies.sglang_adaptive import SglangAdaptive
from policies.trtllm_schedule import TrtllmSchedule
from policies.vllm_dynamic import VllmDynamic
from specbatch.commands.cli import main
from tests.synthetic import step_feedback


def _view(b: int) -> BatchView:
    view = BatchView(8)
    view.batch_size = view.running = b
    return view


def _vllm(schedule, cap=3):
    return VllmDynamic({"num_speculative_tokens": cap, "num_speculative_tokens_per_batch_size": schedule})


# ------------------------------------------------------------------ vLLM
def test_vllm_gaps_take_the_range_before_and_beyond_the_last_range_too():
    # vLLM's own test of build_dynamic_sd_schedule_lookup, case for case.
    policy = _vllm([[1, 16, 3], [32, 128, 2], [256, 2048, 0]])
    expected = {1: 3, 16: 3, 17: 3, 31: 3, 32: 2, 128: 2, 129: 2, 255: 2, 256: 0, 2048: 0, 5000: 0}
    assert {b: policy.k_for(b) for b in expected} == expected
    assert policy.k_for(0) == 0
    assert [policy.choose_k(_view(b)) for b in expected] == list(expected.values())


def test_vllm_caps_every_k_at_num_speculative_tokens():
    policy = _vllm([[1, 256, 5], [257, 512, 2]], cap=3)
    assert policy.k_for(1) == policy.k_for(256) == 3
    assert policy.k_for(300) == 2
    assert policy.max_k == 3


def test_vllm_without_a_schedule_runs_the_static_k():
    policy = VllmDynamic('{"method": "draft_model", "model": "x", "num_speculative_tokens": 4}')
    assert [policy.k_for(b) for b in (1, 64, 1024)] == [4, 4, 4]
    assert policy.params() == {"speculative_config": {"num_speculative_tokens": 4}}


@pytest.mark.parametrize("schedule, says", [
    ([[2, 16, 3]], "must start at 1"),
    ([[1, 16, 3], [16, 32, 2]], "non-overlapping and sorted"),
    ([[1, 16, 3], [40, 64, 2], [20, 30, 1]], "non-overlapping and sorted"),
    ([[1, 16, -1]], ">= 0"),
    ([[1, 16, 3], [32, 64]], "3-item sequence"),
    ([], "must not be empty"),
    ([[1, 0, 3]], ">= 1"),
    ([[1, 16, 2.5]], "whole number"),
])
def test_vllm_rejects_what_vllm_rejects(schedule, says):
    with pytest.raises(PolicyError, match=says) as info:
        _vllm(schedule)
    assert info.value.field == "speculative_config"


def test_vllm_needs_num_speculative_tokens_and_json():
    with pytest.raises(PolicyError, match="num_speculative_tokens"):
        VllmDynamic({"num_speculative_tokens_per_batch_size": [[1, 4, 2]]})
    with pytest.raises(PolicyError, match="not valid JSON"):
        VllmDynamic('{"num_speculative_tokens": 3,')
    with pytest.raises(PolicyError, match="give speculative_config"):
        VllmDynamic()


def test_vllm_config_from_a_json_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 4, 2],
                                                                                                       [5, 64, 1]]}))
    policy = make_policy("vllm-dynamic", {"speculative_config": str(path)})
    assert [policy.k_for(b) for b in (4, 5, 100)] == [2, 1, 1]
    with pytest.raises(PolicyError, match="cannot read the JSON file"):
        make_policy("vllm-dynamic", {"speculative_config": str(tmp_path / "missing.json")})


# ------------------------------------------------------------- TRT-LLM
def test_trtllm_takes_the_smallest_key_at_or_above_the_batch_and_nothing_beyond():
    # TensorRT-LLM PR #10860's example: {4: 4, 8: 2, 32: 1}.
    policy = TrtllmSchedule({4: 4, 8: 2, 32: 1})
    expected = {1: 4, 4: 4, 5: 2, 8: 2, 9: 1, 32: 1, 33: 0, 1000: 0}
    assert {b: policy.k_for(b) for b in expected} == expected
    assert [policy.choose_k(_view(b)) for b in expected] == list(expected.values())
    assert policy.max_k == 4


def test_trtllm_keys_may_be_text_as_in_toml_and_json():
    assert TrtllmSchedule('{"8": 3, "2": 5}').schedule == {2: 5, 8: 3}
    assert TrtllmSchedule({"16": 2}).params() == {"draft_len_schedule": {"16": 2}}


@pytest.mark.parametrize("schedule, extra, says", [
    ({}, {}, "at least one batch size"),
    ({0: 2}, {}, ">= 1"),
    ({"x": 2}, {}, "batch-size key"),
    ({4: -1}, {}, ">= 0"),
    ({4: 4, 8: 2}, {"max_draft_len": 3}, "above max_draft_len = 3"),
    ([[1, 2]], {}, "JSON object"),
])
def test_trtllm_rejects_bad_schedules(schedule, extra, says):
    with pytest.raises(PolicyError, match=says):
        TrtllmSchedule(schedule, **extra)


# -------------------------------------------------------------- SGLang

def _step(policy, b: int, accepted_each: int) -> int:
    k = policy.choose_k(_view(b))
    policy.observe(step_feedback(k, [min(accepted_each, k)] * b))
    return k


def test_sglang_starts_mid_ladder_and_holds_through_warmup_then_moves_every_interval():
    policy = SglangAdaptive({"candidate_steps": [1, 3, 7], "warmup_batches": 3, "update_interval": 2,
                             "ema_alpha": 1.0})  # ema_alpha 1: the EMA is the last batch's mean
    assert policy.ladders[0].current == 3 and policy.ladders[0].ema == 2.0
    # Everything accepted: EMA 3 > 3 - 0.5 (rise threshold of step 3), but no move before warmup ends.
    assert [_step(policy, 4, 3) for _ in range(4)] == [3, 3, 3, 3]
    assert _step(policy, 4, 7) == 3  # the 5th verify = 2nd after warmup: re-evaluated -> 7
    assert policy.choose_k(_view(4)) == 7


def test_sglang_steps_down_through_the_ladder_while_below_the_drop_thresholds():
    policy = SglangAdaptive({"candidate_steps": [1, 3, 7], "warmup_batches": 0, "update_interval": 1,
                             "ema_alpha": 1.0}, initial_steps=7)
    assert policy.ladders[0].current == 7
    _step(policy, 2, 0)  # EMA 0 <= 3 - 0.5 - 0.25 and <= 1 - 0.5 - 0.25: two steps down at once
    assert policy.ladders[0].current == 1


def test_sglang_hysteresis_thresholds_are_exact():
    # Rise from 3 when EMA > 3 - 0.5 + up; drop to 1 when EMA <= 1 - 0.5 + down.
    for ema, up, down, expected in [(2.5, 0.0, -0.25, 3), (2.5001, 0.0, -0.25, 7), (2.7, 0.25, -0.25, 3),
                                    (2.76, 0.25, -0.25, 7), (0.25, 0.0, -0.25, 1), (0.2501, 0.0, -0.25, 3),
                                    (0.9, 0.5, 0.5, 1), (1.01, 0.5, 0.5, 3),
                                    # overlapping thresholds: SGLang steps down, then up again in the same pass
                                    (0.9, 0.0, 0.5, 3)]:
        policy = SglangAdaptive({"candidate_steps": [1, 3, 7], "warmup_batches": 0, "update_interval": 1,
                                 "ema_alpha": 1.0, "up_hysteresis": up, "down_hysteresis": down})
        ladder = policy.ladders[0]
        ladder.update(ema, 1.0, 0, 1)
        assert ladder.current == expected, (ema, up, down)


def test_sglang_ema_and_initial_steps():
    policy = SglangAdaptive({"ema_alpha": 0.5, "warmup_batches": 100}, initial_steps=5)
    assert policy.ladders[0].current == 3  # 5 is not on the default ladder [1, 3, 7]: the middle step
    _step(policy, 2, 1)
    assert policy.ladders[0].ema == pytest.approx(0.5 * 2.0 + 0.5 * 1.0)


def test_sglang_per_batch_size_slots_keep_their_own_state():
    config = {"1": {"steps": [1, 3, 7]}, "64": [1, 2, 5], "warmup_batches": 0, "update_interval": 1,
              "ema_alpha": 1.0}
    policy = SglangAdaptive(json.dumps(config))
    assert [policy.choose_k(_view(b)) for b in (1, 63, 64, 500)] == [3, 3, 2, 2]
    assert [ladder.down for ladder in policy.ladders] == [-0.25, 0.0]  # SGLang's per-slot defaults
    _step(policy, 80, 0)  # only slot 64 sees this batch: its EMA 0 -> down to 1
    assert policy.choose_k(_view(64)) == 1 and policy.choose_k(_view(8)) == 3
    policy.bind(8)
    assert policy.choose_k(_view(64)) == 2  # a new run starts afresh


def test_sglang_slot_below_every_key_is_the_first():
    policy = SglangAdaptive({"8": [2, 4], "32": [1]})
    assert policy.slot(1) == 0 and policy.choose_k(_view(1)) == 4  # [2, 4]: the middle is index 1
    assert policy.choose_k(_view(40)) == 1


@pytest.mark.parametrize("config, extra, says", [
    ({"candidate_step": [1, 3]}, {}, "unknown key 'candidate_step'"),
    ({"candidate_steps": []}, {}, "non-empty list"),
    ({"candidate_steps": [0, 2]}, {}, ">= 1"),
    ({"ema_alpha": 0}, {}, "ema_alpha must be in"),
    ({"update_interval": 0}, {}, ">= 1"),
    ({"1": [1, 3], "candidate_steps": [1, 3]}, {}, "ignored by SGLang"),
    ({"1": {"step": [1]}}, {}, "unknown key 'step'"),
    ({"1": [1, 3]}, {"initial_steps": 3}, "single ladder"),
])
def test_sglang_rejects_bad_configs(config, extra, says):
    with pytest.raises(PolicyError, match=says):
        SglangAdaptive(config, **extra)


def test_sglang_ignores_k_zero_steps_and_learns_from_speculative_ones():
    policy = SglangAdaptive({"warmup_batches": 0, "update_interval": 1, "ema_alpha": 1.0})
    policy.choose_k(_view(3))
    policy.observe(step_feedback(0, [0, 0, 0]))
    assert policy.ladders[0].verifies == 0


# ------------------------------------------------------- end to end
ENGINE_POLICIES = {
    "vllm-dynamic": ("speculative_config",
                     '{"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 8, 1]]}'),
    "sglang-adaptive": ("adaptive_config", '{"candidate_steps": [1, 2, 3], "warmup_batches": 2}'),
    "trtllm-schedule": ("draft_len_schedule", '{"4": 3, "16": 1}'),
}


@pytest.mark.parametrize("name", sorted(ENGINE_POLICIES))
def test_engine_policies_run_from_toml_flags_and_python(name, tmp_path, synthetic_profile, capsys):
    import specbatch

    param, value = ENGINE_POLICIES[name]
    common = ["--profile", str(synthetic_profile), "--num-requests", "30", "--rate", "4", "--records", "none"]
    toml = tmp_path / "c.toml"
    toml.write_text(f"[policy]\nname = \"{name}\"\n{param} = '{value}'\n")
    assert main(["run", "--config", str(toml), *common, "--out", str(tmp_path / "toml"), "--quiet"]) == 0
    spec = f"{name}:{param}={value}"
    assert main(["run", "--policy", spec, *common, "--out", str(tmp_path / "flag"), "--quiet"]) == 0
    capsys.readouterr()
    from_toml = json.loads((tmp_path / "toml" / "summary.json").read_text())
    from_flag = json.loads((tmp_path / "flag" / "summary.json").read_text())
    result = specbatch.run(profile=str(synthetic_profile), policy={"name": name, param: value}, num_requests=30,
                           rate=4.0)
    for key in ("mean_e2el_ms", "mean_k", "num_decode_steps"):
        assert from_toml["metrics"][key] == from_flag["metrics"][key] == result.summary[key]
    assert from_toml["metrics"]["mean_k"] > 0


# ------------------------------------------------- specbatch lut --format
@pytest.mark.parametrize("fmt, name, param", [("vllm", "vllm-dynamic", "speculative_config"),
                                              ("sglang", "sglang-adaptive", "adaptive_config"),
                                              ("trtllm", "trtllm-schedule", "draft_len_schedule")])
def test_lut_format_prints_a_config_that_the_matching_policy_reads_back_as_the_lut(
        fmt, name, param, synthetic_profile, tmp_path, capsys):
    from policies.lut import LookupTable
    from sim.costmodel.model import CostModel
    from sim.costmodel.profile import load_profile

    args = ["lut", "--profile", str(synthetic_profile), "--alpha", "0.6", "--k-max", "5", "--max-batch", "64"]
    assert main([*args, "--format", fmt, "--out", str(tmp_path / "engine.txt")]) == 0
    printed, err = capsys.readouterr()
    text = printed.strip()
    assert (tmp_path / "engine.txt").read_text().strip() == text
    lut = LookupTable(alpha=0.6, k_max=5)
    lut.bind(7, type("Costs", (), {"step_time": CostModel(load_profile(str(synthetic_profile))).step_time,
                                   "max_batch": 64})())
    assert len({lut.k_for(b) for b in range(1, 65)}) >= 2  # the table has more than one row
    engine = make_policy(name, {param: text})
    for b in range(1, 65):
        want = max(lut.k_for(b), 1) if fmt == "sglang" else lut.k_for(b)  # SGLang drafts at least 1
        assert engine.choose_k(_view(b)) == want, (fmt, b)
    if fmt == "sglang" and 0 in {lut.k_for(b) for b in range(1, 65)}:
        assert "at least one step" in err
    if fmt == "trtllm":
        assert text.startswith("{") and ": " in text and '"' not in text  # {4: 4, ...}: Python and YAML


def test_lut_format_rejects_unknown_formats(capsys, synthetic_profile):
    with pytest.raises(SystemExit):
        main(["lut", "--profile", str(synthetic_profile), "--alpha", "0.6", "--format", "tgi"])
    assert "invalid choice" in capsys.readouterr().err
