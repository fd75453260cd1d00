"""benchmarks/validation.py --calibrate, without torch: the order of what it asks specbatch to do.

A fresh profile must be calibrated right before each case it runs, into OUT/profiles/CASE,
and that case validated against it (not against the shipped profile); a failed calibration
stops the benchmark before any replay.
"""

from __future__ import annotations

import json

import pytest

import specbatch.commands.cli



@pytest.fixture()
def bench(validation_bench):
    return validation_bench


def _recording(monkeypatch, answers: dict[str, int]) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake(argv):
        calls.append(list(argv))
        return answers[argv[0]]

    monkeypatch.setattr(specbatch.commands.cli, "main", fake)
    return calls


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_each_case_is_validated_against_a_profile_calibrated_just_before_it(bench, monkeypatch, tmp_path):
    # validate "fails" so the benchmark stops after the first case: what matters is what it asked.
    calls = _recording(monkeypatch, {"calibrate": 0, "validate": 3})
    code = bench.main(["--calibrate", "--out", str(tmp_path), "--cases", "static-none-low"])
    assert code == 3
    assert [c[0] for c in calls] == ["calibrate", "validate"]
    calibrate, validate = calls
    profile = str(tmp_path / "profiles" / "static-none-low")
    # the suite's grid, from scratch (--fresh: no earlier partial calibration is resumed)
    assert calibrate == ["calibrate", *bench.SUITES["cpu"]["calibrate"], "--fresh", "--quiet", "--out", profile]
    assert _value(calibrate, "--target") == "llama-160m" and _value(calibrate, "--draft") == "llama-68m"
    assert _value(validate, "--profile") == profile
    assert _value(validate, "--out") == str(tmp_path / "static-none-low")


def test_a_failed_calibration_stops_before_any_replay(bench, monkeypatch, tmp_path):
    calls = _recording(monkeypatch, {"calibrate": 2, "validate": 0})
    assert bench.main(["--calibrate", "--out", str(tmp_path), "--cases", "continuous-*"]) == 2
    assert [c[0] for c in calls] == ["calibrate"]


def test_without_calibrate_the_shipped_profile_is_validated(bench, monkeypatch, tmp_path):
    calls = _recording(monkeypatch, {"calibrate": 0, "validate": 3})
    assert bench.main(["--out", str(tmp_path), "--cases", "static-none-low"]) == 3
    assert [c[0] for c in calls] == ["validate"]
    assert _value(calls[0], "--profile") == bench.SUITES["cpu"]["profile"]


def test_calibrate_and_a_named_profile_are_refused_together(bench, monkeypatch, tmp_path, capsys):
    calls = _recording(monkeypatch, {"calibrate": 0, "validate": 0})
    with pytest.raises(SystemExit) as exc:
        bench.main(["--calibrate", "--profile", "cpu-llama-160m-llama-68m", "--out", str(tmp_path)])
    assert exc.value.code == 2 and calls == []
    assert "--calibrate" in capsys.readouterr().err


@pytest.mark.parametrize("suite", ["cpu", "gpu"])
def test_each_suite_calibrates_with_flags_calibrate_accepts(bench, tmp_path, suite):
    from calibrate.cli import build_parser

    args = build_parser().parse_args([*bench.SUITES[suite]["calibrate"], "--fresh", "--quiet", "--out", str(tmp_path)])
    assert args.target and args.draft and args.device == ("cpu" if suite == "cpu" else "cuda")


def test_the_decode_bias_by_batch_size_is_read_from_a_case_folder_and_tabled(bench, tmp_path):
    import pandas as pd

    pd.DataFrame({"group": ["decode k=0", "decode k=0", "prefill", "decode k=3"], "batch_size": [1, 3, 3, 3],
                  "predicted_s": [1.0, 0.5, 1.0, 0.7], "corrected_s": [1.1, 0.6, 1.0, 0.8],
                  "measured_s": [1.0, 1.0, 1.0, 1.0]}).to_csv(tmp_path / "step_costs.csv", index=False)
    rows = bench._by_batch(tmp_path)
    assert [(r["batch_size"], r["steps"]) for r in rows] == [(1, 1), (3, 2)]
    assert bench._by_batch(tmp_path / "absent") is None
    table = bench.format_by_batch({"cases": [{"case": "static-none-low", "step_cost_by_batch": rows},
                                             {"case": "static-none-high", "step_cost_by_batch": None}]})
    lines = table.splitlines()
    assert lines[1].split() == ["case", "b=1", "b=3", "calibrated", "at", "batch"] and len(lines) == 3
    assert lines[2].split() == ["static-none-low", "+10.0%", "-30.0%", "?"]
    assert bench.format_by_batch({"cases": [{"case": "x"}]}) is None


def test_a_case_validated_before_pooling_the_simulation_gets_its_errors_recomputed(bench, tmp_path):
    import numpy as np
    import pandas as pd

    e2el = np.concatenate((np.linspace(1.0, 2.0, 58), [3.0, 10.0]))
    for run in (tmp_path / "simulated", tmp_path / "speed-corrected" / "run"):
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"metrics": {"output_throughput": 7.0,
                                                                  "mean_acceptance_length": None}}))
        pd.DataFrame({"e2el_s": e2el, "ttft_s": e2el / 10, "tpot_s": e2el / 100}).to_csv(run / "requests.csv",
                                                                                          index=False)
    real = {"mean_e2el_ms": 1e3 * e2el.mean(), "p99_e2el_ms": 10_000.0, "output_throughput": 7.0}
    errors = bench._pooled_errors(tmp_path, 5, real)
    for suffix in ("raw", "corrected"):
        assert errors[f"p99_e2el_ms_{suffix}"] == pytest.approx(0.0)  # the worst request, as pooled replays
        assert errors[f"mean_e2el_ms_{suffix}"] == pytest.approx(0.0)
        assert errors[f"output_throughput_{suffix}"] == 0.0
