"""One policy syntax everywhere: NAME:KEY=VALUE in run, sweep, capacity, regress and the Python API,
and bad keys or values as one line naming the policy, the key and where."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from specbatch.commands.capacity.inputs import parse_policies
from specbatch.commands.cli import main
from specbatch.commands.flags import policy_spec
from sim.errors import InputError


@pytest.mark.parametrize("text, name, params", [
    ("lut:alpha=0.7", "lut", {"alpha": 0.7}),
    ("goodput:k_max=6", "goodput", {"k_max": 6}),
    ("goodput:k_max=3:per_request=true", "goodput", {"k_max": 3, "per_request": True}),
    ("lut:table=[[1, 4, 3], [5, 64, 1]]", "lut", {"table": [[1, 4, 3], [5, 64, 1]]}),
    ("my.module:MyPolicy:rate=2", "my.module:MyPolicy", {"rate": 2}),
    ('vllm-dynamic:speculative_config={"num_speculative_tokens": 3}', "vllm-dynamic",
     {"speculative_config": '{"num_speculative_tokens": 3}'}),
    ("trtllm-schedule:draft_len_schedule={4: 4, 8: 2}", "trtllm-schedule", {"draft_len_schedule": "{4: 4, 8: 2}"}),
    ("sglang-adaptive:adaptive_config=conf/adaptive.json", "sglang-adaptive", {"adaptive_config": "conf/adaptive.json"}),
    ("none", "none", {}),
])
def test_policy_spec(text, name, params):
    assert policy_spec(text, "--policy") == (name, params)


@pytest.mark.parametrize("text, says", [(":k=2", "no policy name"), ("fixed:k=", "is not KEY=VALUE"),
                                        ("fixed:k=1:k=2", "gives 'k' twice")])
def test_bad_specs(text, says):
    with pytest.raises(InputError, match=says):
        policy_spec(text, "--policy")


def test_capacity_splits_policies_outside_brackets():
    specs = parse_policies('none,lut:table=[[1, 4, 3], [5, 64, 1]],vllm-dynamic:speculative_config='
                           '{"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 8, 2]]}')
    assert [s.name for s in specs] == ["none", "lut", "vllm-dynamic"]
    assert specs[1].params == {"table": [[1, 4, 3], [5, 64, 1]]}


def _summary(folder):
    return json.loads((folder / "summary.json").read_text())


def test_run_and_api_take_the_spec(tmp_path, synthetic_profile, capsys):
    import specbatch

    common = ["--profile", str(synthetic_profile), "--num-requests", "20", "--records", "none", "--quiet"]
    assert main(["run", *common, "--policy", "goodput:k_max=2:alpha_init=0.6", "--out", str(tmp_path / "a")]) == 0
    toml = tmp_path / "c.toml"
    toml.write_text("[policy]\nname = \"goodput\"\nk_max = 2\nalpha_init = 0.6\n")
    assert main(["run", *common, "--config", str(toml), "--out", str(tmp_path / "b")]) == 0
    a, b = _summary(tmp_path / "a"), _summary(tmp_path / "b")
    assert a["metrics"] == b["metrics"] and a["config_digest"] == b["config_digest"]
    result = specbatch.run(profile=str(synthetic_profile), num_requests=20, policy="goodput:k_max=2:alpha_init=0.6")
    assert result.summary["mean_e2el_ms"] == a["metrics"]["mean_e2el_ms"]


def test_sweep_axis_takes_the_spec(tmp_path, synthetic_profile, capsys):
    (tmp_path / "scenario.toml").write_text(f'profile = "{synthetic_profile}"\n[workload]\nnum_requests = 16\n'
                                            'prompt_tokens = 32\noutput_tokens = 24\n[output]\nrecords = "none"\n')
    grid = tmp_path / "grid.toml"
    grid.write_text('base = "scenario.toml"\n[axes]\npolicy = ["lut:alpha=0.7", {name = "lut", alpha = 0.7}, '
                    '"fixed:k=2"]\n')
    assert main(["sweep", str(grid), "--out", str(tmp_path / "out"), "--no-progress", "--csv"]) == 0
    assert "3 cells, 2 distinct" in capsys.readouterr().err  # the spec and the table are the same cell
    table = pd.read_csv(tmp_path / "out" / "sweep.csv")
    lut = table[table.policy.str.startswith("lut")]
    assert len(lut) == 2 and lut.mean_e2el_ms.nunique() == 1


def test_regress_takes_the_spec(tmp_path, synthetic_profile, capsys):
    baseline = tmp_path / "b.toml"
    baseline.write_text(f'format = 1\n[tolerance]\ndefault = {{ abs = 0.0, rel = 0.0 }}\n[[scenario]]\nname = "s"\n'
                        f'[scenario.overrides]\nprofile = "{synthetic_profile}"\nworkload.num_requests = 15\n'
                        'policy.name = "lut:alpha=0.7"\n')
    assert main(["regress", "--baseline", str(baseline), "--update"]) == 0
    assert main(["regress", "--baseline", str(baseline)]) == 0
    assert main(["regress", "--baseline", str(baseline), "--policy", "lut:alpha=0.7"]) == 0
    assert main(["regress", "--baseline", str(baseline), "--policy", "lut:alpha=0.3"]) == 1  # another table
    capsys.readouterr()
    assert main(["regress", "--baseline", str(baseline), "--policy", "lut:alpha=1.5"]) == 2
    assert "--policy: policy.alpha: alpha must be a number inside (0, 1), got 1.5" in capsys.readouterr().err


@pytest.mark.parametrize("flags, line", [
    (["--policy", "goodput:k_maxx=6"], "error: --policy: policy.k_maxx: policy 'goodput' takes no parameter 'k_maxx'"),
    (["--policy", "goodput:smoothing=0"], "error: --policy: policy.smoothing: smoothing must be a number in (0, 1], "
                                          "got 0"),
    (["--policy", "trtllm-schedule", "--draft-len-schedule", "{4: -1}"],
     "error: --draft-len-schedule: policy.draft_len_schedule: trtllm-schedule: draft_len_schedule: the draft length of "
     "batch size 4 must be a whole number >= 0, got -1"),
    (["--policy", "vllm-dynamic:speculative_config={\"num_speculative_tokens\": 2, "
                  "\"num_speculative_tokens_per_batch_size\": [[1, 4, 2], [3, 8, 1]]}"],
     "error: --policy: policy.speculative_config: vllm-dynamic: speculative_config.num_speculative_tokens_per_batch_size"
     ": ranges must be non-overlapping and sorted, but entry 2 [3, 8, 1] starts at or before the end of [1, 4, 2]"),
])
def test_bad_policy_input_is_one_line_naming_policy_key_and_where(flags, line, tmp_path, synthetic_profile, capsys):
    out = tmp_path / "never"
    assert main(["run", "--profile", str(synthetic_profile), "--num-requests", "5", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == line
    assert not out.exists()


def test_bad_engine_knob_in_toml_names_file_and_line(tmp_path, synthetic_profile, capsys):
    toml = tmp_path / "bad.toml"
    toml.write_text('[policy]\nname = "sglang-adaptive"\nadaptive_config = { candidate_steps = [1, 3], ema_alpha = 2 }\n')
    assert main(["run", "--config", str(toml), "--profile", str(synthetic_profile), "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {toml}:3: policy.adaptive_config: sglang-adaptive: "
                                               "adaptive_config: ema_alpha must be in (0, 1], got 2")
