"""The timeline's decode steps carry the policy's reasoning, recorded only when a timeline is asked for."""

from __future__ import annotations

import json

import pytest

from specbatch.commands.cli import main
from sim.simulate import simulate


def _decode_events(path):
    events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e["ph"] == "X" and e["name"] == "decode"]


def _run(tmp_path, synthetic_profile, name, *flags):
    out, timeline = tmp_path / name / "run", tmp_path / name / "trace.json"
    assert main(["run", "--profile", str(synthetic_profile), "--num-requests", "40", "--rate", "3", *flags,
                 "--timeline", str(timeline), "--out", str(out), "--quiet"]) == 0
    return out, _decode_events(timeline)


def test_goodput_steps_show_each_candidates_tokens_per_second_and_k_is_the_best(tmp_path, synthetic_profile, capsys):
    _, decode = _run(tmp_path, synthetic_profile, "goodput", "--policy", "goodput:k_max=3")
    assert decode
    for event in decode:
        why = event["args"]["policy"]
        rates = {int(k): v for k, v in why["tokens_per_s"].items()}
        assert sorted(rates) == [0, 1, 2, 3]
        assert rates[event["args"]["k"]] == pytest.approx(max(rates.values()), rel=1e-5)
        assert 0 < why["alpha_hat"] < 1 and why["max_lag"] >= 1 and why["catch_up_ms"] >= 0


@pytest.mark.parametrize("flags, key", [
    (["--policy", "lut:table=[[1, 2, 3], [3, 8, 1], [9, 64, 0]]"], "row"),
    (["--policy", 'vllm-dynamic:speculative_config={"num_speculative_tokens": 3, '
                  '"num_speculative_tokens_per_batch_size": [[1, 2, 3], [5, 64, 1]]}'], "rule"),
    (["--policy", "trtllm-schedule:draft_len_schedule={2: 3, 8: 1}"], "rule"),
    (["--policy", 'sglang-adaptive:adaptive_config={"1": [1, 2], "4": [2, 3]}'], "rule"),
])
def test_table_and_engine_policies_name_the_row_or_rule_used(tmp_path, synthetic_profile, capsys, flags, key):
    _, decode = _run(tmp_path, synthetic_profile, "table", *flags)
    assert decode and all(key in e["args"]["policy"] for e in decode)
    if key == "row":
        for e in decode:
            start, end, k = e["args"]["policy"]["row"]
            assert e["args"]["k"] == k and (start <= e["args"]["batch_size"] <= end or start == 1)


def test_reasons_change_nothing_else_and_cost_ordinary_runs_nothing(tmp_path, synthetic_profile, capsys):
    out, _ = _run(tmp_path, synthetic_profile, "with", "--policy", "goodput")
    plain = tmp_path / "plain"
    assert main(["run", "--profile", str(synthetic_profile), "--num-requests", "40", "--rate", "3", "--policy",
                 "goodput", "--out", str(plain), "--quiet"]) == 0
    for name in ("steps.csv", "requests.csv"):
        assert (out / name).read_bytes() == (plain / name).read_bytes()
    summary = [json.loads((d / "summary.json").read_text())["metrics"] for d in (out, plain)]
    assert summary[0] == summary[1]


def test_ordinary_runs_record_no_reasons(run_config):
    assert simulate(run_config(policy__name="goodput", workload__num_requests=10)).reasons is None


def test_every_replica_explains_its_own_steps(tmp_path, synthetic_profile, capsys):
    _, decode = _run(tmp_path, synthetic_profile, "cluster", "--policy", "lut:table=[[1, 3, 2], [4, 64, 1]]",
                     "--replicas", "2")
    assert {e["pid"] for e in decode} == {0, 1}
    for e in decode:
        assert e["args"]["policy"]["row"][2] == e["args"]["k"]
