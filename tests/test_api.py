"""The Python API (``import specbatch``): real runs on the shipped CPU profile, checked against the CLI."""

from __future__ import annotations

import json
import math
import os
import sys

import pandas as pd
import pytest

import specbatch
from specbatch.commands.cli import main

PROFILE = "cpu-tinyllama-1.1b-llama-68m"
SMALL = dict(profile=PROFILE, policy="goodput", rate=0.1, num_requests=12, seed=3)
SMALL_FLAGS = ["--profile", PROFILE, "--policy", "goodput", "--rate", "0.1", "--num-requests", "12", "--seed", "3"]


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
    """Run in an empty folder, to see whether anything was written."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def _json_metrics(summary: dict) -> dict:
    """Metrics as summary.json writes them (a non-finite number as null)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}


def test_run_summary_equals_the_clis_summary_json(tmp_path, empty_cwd, capsys):
    result = specbatch.run(**SMALL)
    assert list(empty_cwd.iterdir()) == []  # nothing written unless asked
    assert main(["run", *SMALL_FLAGS, "--out", str(tmp_path / "cli")]) == 0
    document = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert _json_metrics(result.summary) == document["metrics"]
    assert result.summary["completed"] == 12 == len(result.requests)
    assert isinstance(result.requests, pd.DataFrame) and isinstance(result.steps, pd.DataFrame)
    assert len(result.steps) == result.summary["num_steps"]
    assert json.loads(json.dumps(result.document(), allow_nan=True)) == json.loads(json.dumps(document))
    cli_requests = pd.read_csv(tmp_path / "cli" / "requests.csv")
    assert list(cli_requests.columns) == list(result.requests.columns)
    assert (cli_requests.request_id.to_numpy() == result.requests.request_id.to_numpy()).all()


def test_out_writes_the_same_run_folder_as_the_cli(tmp_path, capsys):
    result = specbatch.run(**SMALL, out=str(tmp_path / "api"))
    assert result.out == tmp_path / "api"
    assert main(["run", *SMALL_FLAGS, "--out", str(tmp_path / "cli")]) == 0
    for name in ("summary.json", "requests.csv", "steps.csv"):
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    api_config = (tmp_path / "api" / "config.toml").read_text()  # the same but for output.dir
    assert api_config.replace(str(tmp_path / "api"), str(tmp_path / "cli")) == (tmp_path / "cli" / "config.toml").read_text()


def test_config_file_and_plain_overrides_layer_like_the_cli(tmp_path, empty_cwd):
    config = tmp_path / "scenario.toml"
    config.write_text(f'profile = "{PROFILE}"\n[workload]\nnum_requests = 8\nrate = 5.0\n[engine]\nmax_batch_size = 4\n')
    result = specbatch.run(config=str(config), overrides={"workload.rate": 0.2, "policy.name": "fixed"}, k=2)
    assert result.config.workload.rate == 0.2 and result.config.workload.num_requests == 8
    assert result.config.engine.max_batch_size == 4
    assert result.config.policy.name == "fixed" and result.config.policy.params["k"] == 2
    assert set(result.steps.k[result.steps.phase == 1]) == {2}
    keyword = specbatch.run(config=str(config), rate=0.3)  # keywords win over the file
    assert keyword.config.workload.rate == 0.3
    table = specbatch.run(profile=PROFILE, num_requests=6, rate=0.2, policy={"name": "fixed", "k": 1})
    assert table.config.policy.params == {"k": 1}
    assert list(empty_cwd.iterdir()) == []


@pytest.mark.parametrize("kwargs,flags", [
    (dict(rate=-1.0), ["--rate", "-1.0"]),
    (dict(max_batch_size=0), ["--max-batch-size", "0"]),
    (dict(policy="nope"), ["--policy", "nope"]),
    (dict(prompt_tokens="uniform:5"), ["--prompt-tokens", "uniform:5"]),
])
def test_bad_input_raises_the_clis_one_line_error(capsys, tmp_path, kwargs, flags):
    with pytest.raises(specbatch.InputError) as info:
        specbatch.run(**{**SMALL, **kwargs})
    assert main(["run", *SMALL_FLAGS, *flags, "--out", str(tmp_path / "never")]) == 2
    assert capsys.readouterr().err == f"error: {info.value}\n"
    assert "\n" not in str(info.value) and not (tmp_path / "never").exists()


def test_unknown_keywords_and_overrides_are_input_errors():
    with pytest.raises(specbatch.InputError, match=r"^rat: unknown keyword \(known: acceptance_match_rate, acceptance_model, "):
        specbatch.run(rat=1)
    with pytest.raises(specbatch.InputError, match=r"^overrides: workload.rat: unknown setting$"):
        specbatch.run(overrides={"workload.rat": 1})


def test_repr_html_is_a_summary_table_and_a_latency_cdf(monkeypatch):
    result = specbatch.run(**SMALL)
    page = result._repr_html_()
    assert "<table>" in page and "mean / p99 TTFT (ms)" in page and "<svg" in page and "latency CDF" in page
    assert f"{result.summary['mean_ttft_ms']:.1f}" in page
    assert page == result._repr_html_()  # no date or random ids: the same run, the same page
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if matplotlib were not installed
    plain = result._repr_html_()
    assert plain.startswith("<table>") and "<svg" not in plain
    assert "Mean TTFT (ms)" in str(result)  # the CLI's printed summary


def test_sweep_takes_a_dict_and_returns_the_table(empty_cwd, capsys):
    spec = {"scenario": {"profile": PROFILE, "workload": {"num_requests": 6}},
            "axes": {"rate": [0.1, 0.2], "policy": ["none", {"name": "fixed", "k": 2}]}}
    table = specbatch.sweep(spec, executor="serial")
    assert list(empty_cwd.iterdir()) == []
    assert len(table) == 4 and set(table.status) == {"ok"}
    assert list(table["workload.rate"]) == [0.1, 0.1, 0.2, 0.2]
    assert list(table.policy) == ["none", "fixed k=2", "none", "fixed k=2"]
    one = specbatch.run(profile=PROFILE, num_requests=6, rate=0.2, policy="fixed", k=2)
    row = table.iloc[3]
    assert row.mean_e2el_ms == one.summary["mean_e2el_ms"] and row.completed == 6


def test_sweep_errors_name_the_axis(empty_cwd):
    with pytest.raises(specbatch.InputError, match=r"^sweep: axes.rate: empty axis"):
        specbatch.sweep({"axes": {"rate": []}})
    with pytest.raises(specbatch.InputError, match=r"^sweep: axes.workload.rat: unknown setting"):
        specbatch.sweep({"axes": {"workload.rat": [1]}})
    assert list(empty_cwd.iterdir()) == []


def test_capacity_returns_a_report_like_the_clis(tmp_path, empty_cwd, capsys):
    settings = dict(slo={"p99_ttft_ms": 60000}, policies=["none", "fixed:k=2"], seeds=1, tolerance=0.3,
                    max_growth=0.2, service_times=10, min_requests=10, curve_points=0, prompt_tokens="32",
                    output_tokens="32")
    report = specbatch.capacity(**settings)
    assert list(empty_cwd.iterdir()) == []
    assert list(report.table.policy) == ["none", "fixed:k=2"]
    assert (report.table.max_rate > 0).all() and (report.table.p99_ttft_ms <= 60000).all()
    assert main(["capacity", "--slo", "p99_ttft_ms=60000", "--policies", "none,fixed:k=2", "--seeds", "1",
                 "--tolerance", "0.3", "--max-growth", "0.2", "--service-times", "10", "--min-requests", "10",
                 "--curve-points", "0",
                 "--prompt-tokens", "32", "--output-tokens", "32", "--jobs", "1", "--quiet",
                 "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(report.text + "\n")  # the same search, the same table
    written = json.loads((tmp_path / "cli" / "capacity.json").read_text())
    assert "<table" in report._repr_html_() and str(report) == report.text
    with pytest.raises(specbatch.InputError, match=r"^--seeds: must be at least 1, got 0$"):
        specbatch.capacity(**{**settings, "seeds": 0})
    with pytest.raises(specbatch.InputError, match=r"^rate: unknown keyword"):
        specbatch.capacity(**settings, rate=2.0)  # the search chooses the rate
    assert written  # the CLI's report exists; the API wrote none
    assert sorted(os.listdir(tmp_path)) == ["cli", "cwd"]


def test_capacity_compares_profiles_with_a_price_per_gpu(empty_cwd):
    settings = dict(slo={"p99_ttft_ms": 60000}, policies=["none"], seeds=1, tolerance=0.3, max_growth=0.2,
                    service_times=10, min_requests=10, curve_points=0, prompt_tokens="32", output_tokens="32",
                    target_rate=1.0)
    profiles = ["cpu-tinyllama-1.1b-llama-68m", "cpu-llama-160m-llama-68m"]
    report = specbatch.capacity(**settings, profiles=profiles, gpu_price={"cpu": 2.0})
    table = report.table
    assert list(table.profile) == profiles and list(table.policy) == ["none", "none"]
    assert (table.gpu_hour_price == 2.0).all() and (table.replicas >= 1).all()
    # the same price per GPU-hour: the replica that serves more costs less per token
    faster, slower = table.sort_values("max_rate", ascending=False).cost_per_m_at_max_rate
    assert faster < slower
    assert "Prices" in report.text
    with pytest.raises(specbatch.InputError, match=r"^--gpu-price: comparing profiles needs"):
        specbatch.capacity(**settings, profiles=profiles)
    assert list(empty_cwd.iterdir()) == []


def test_capacity_reads_a_whole_price_or_rate_as_the_command_line_does(monkeypatch):
    """specbatch.capacity(gpu_hour_price=2) searches with 2.0, as `--gpu-hour-price 2` does, so the API's
    capacity.json has the CLI's bytes."""
    import specbatch.commands.api as api
    from specbatch.commands.capacity import cli as capacity_cli

    seen = {}

    def plan(config, overrides, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("planned")

    monkeypatch.setattr(capacity_cli, "plan_capacity", plan)
    with pytest.raises(RuntimeError, match="planned"):
        api.capacity(slo={"p99_ttft_ms": 2000}, policies=["none"], gpu_hour_price=2, target_rate=10)
    assert seen["gpu_hour_price"] == 2.0 and type(seen["gpu_hour_price"]) is float
    assert type(seen["target_rate"]) is float and seen["target_rate"] == 10.0
