"""End-to-end: the specbatch command line, its files, and its answers to bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from specbatch.commands.cli import main
from sim.costmodel.profile import DEFAULT_PROFILE, shipped_profiles
from tests.conftest import CPU_DEFAULT_FLAGS, CPU_DEFAULTS

SHORT = [*CPU_DEFAULT_FLAGS, "--duration", "60", "--rate", "2"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_writes_summary_records_and_resolved_config(capsys, tmp_path, synthetic_profile):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(capsys, "run", "--profile", str(synthetic_profile), "--policy", "fixed", "--k", "3",
                              *SHORT, "--out", str(out))
    assert code == 0
    assert "Mean TTFT (ms)" in stdout and "Mean acceptance length" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "requests.csv", "steps.csv", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    requests = pd.read_csv(out / "requests.csv")
    assert summary["metrics"]["completed"] == len(requests)
    assert summary["policy"] == {"name": "fixed", "k": 3}
    for name in ("mean_ttft_ms", "p99_e2el_ms", "median_itl_ms", "std_tpot_ms", "p90_tpot_ms",
                 "request_throughput", "output_throughput", "acceptance_rate", "mean_acceptance_length", "mean_k"):
        assert name in summary["metrics"]
    # The resolved config reruns to the same results.
    again = tmp_path / "again"
    assert main(["run", "--config", str(out / "config.toml"), "--out", str(again)]) == 0
    assert (again / "requests.csv").read_bytes() == (out / "requests.csv").read_bytes()


def test_same_config_and_seed_give_byte_identical_files(capsys, tmp_path, synthetic_profile):
    dirs = []
    for name in ("a", "b"):
        dirs.append(tmp_path / name)
        assert main(["run", "--profile", str(synthetic_profile), *SHORT, "--alpha-distribution", "beta",
                     "--out", str(dirs[-1])]) == 0
    for file in ("requests.csv", "steps.csv", "summary.json"):
        assert (dirs[0] / file).read_bytes() == (dirs[1] / file).read_bytes(), file
    # The resolved configs differ only in the output folder they name.
    configs = [(d / "config.toml").read_text().replace(str(d), "OUT") for d in dirs]
    assert configs[0] == configs[1]
    assert main(["run", "--profile", str(synthetic_profile), *SHORT, "--alpha-distribution", "beta",
                 "--seed", "1", "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "requests.csv").read_bytes() != (dirs[0] / "requests.csv").read_bytes()


def test_parquet_and_no_records(capsys, tmp_path, synthetic_profile):
    pq = tmp_path / "pq"
    assert main(["run", "--profile", str(synthetic_profile), *SHORT, "--records", "parquet", "--out", str(pq)]) == 0
    assert len(pd.read_parquet(pq / "requests.parquet")) > 0
    bare = tmp_path / "bare"
    assert main(["run", "--profile", str(synthetic_profile), *SHORT, "--records", "none", "--out", str(bare)]) == 0
    assert sorted(p.name for p in bare.iterdir()) == ["config.toml", "summary.json"]


def test_flags_override_the_config_file(capsys, tmp_path, synthetic_profile):
    config = tmp_path / "scenario.toml"
    config.write_text(f'profile = "{synthetic_profile}"\n[workload]\nrate = 1.0\nnum_requests = 50\n'
                      '[policy]\nname = "fixed"\nk = 2\n')
    out = tmp_path / "run"
    assert main(["run", "--config", str(config), "--k", "4", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"]["k"] == 4
    assert summary["metrics"]["completed"] == 50


@pytest.mark.parametrize("flags,needle", [
    (["--rate", "0"], "--rate: workload.rate: must be greater than 0"),
    (["--rate", "-3"], "--rate: workload.rate: must be greater than 0"),
    (["--alpha", "1.0"], "--alpha: acceptance.alpha: must be inside (0, 1)"),
    (["--alpha", "0"], "--alpha: acceptance.alpha: must be inside (0, 1)"),
    (["--k", "9"], "--k: policy.k: k = 9 is beyond the profile's measured k_max = 7"),
    (["--policy", "nonesuch"], "--policy: policy.name: unknown policy 'nonesuch'"),
    (["--batching", "dynamic"], "--batching: engine.batching: 'dynamic' is not one of continuous, static"),
    (["--prompt-tokens", "uniform:9"], "--prompt-tokens: workload.prompt_tokens:"),
    (["--rate", "abc"], "argument --rate/--request-rate: 'abc' is not a valid float"),
])
def test_bad_flags_fail_with_one_line_and_write_nothing(capsys, tmp_path, synthetic_profile, flags, needle):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) if "abc" in flags else _no_raise():
        code, _, err = run_cli(capsys, "run", "--profile", str(synthetic_profile), *SHORT, *flags, "--out", str(out))
        assert code == 2
        assert err.count("\n") == 1 and err.startswith("error: ")
        assert needle in err
    if "abc" in flags:
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1
    assert not out.exists()


def test_bad_config_file_names_file_and_line(capsys, tmp_path, synthetic_profile):
    config = tmp_path / "bad.toml"
    config.write_text(f'profile = "{synthetic_profile}"\n\n[workload]\nrate = 2.0\nnum_requests = 10\n'
                      '\n[acceptance]\nalpha = 1.7\n')
    code, _, err = run_cli(capsys, "run", "--config", str(config), "--out", str(tmp_path / "x"))
    assert code == 2
    assert err.strip() == f"error: {config}:8: acceptance.alpha: must be inside (0, 1), got 1.7"
    config.write_text("[workload]\nrat = 2.0\n")
    code, _, err = run_cli(capsys, "run", "--config", str(config))
    assert err.strip() == f"error: {config}:2: workload.rat: unknown setting"


def test_malformed_trace_line_is_named(capsys, tmp_path, synthetic_profile):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,ten,5\n")
    out = tmp_path / "never"
    code, _, err = run_cli(capsys, "run", "--profile", str(synthetic_profile), "--trace", str(trace),
                           "--out", str(out))
    assert code == 2
    assert err.strip() == f"error: {trace}:3: prompt_tokens: 'ten' is not a whole number of tokens"
    assert not out.exists()


def test_trace_replay_runs_the_trace(capsys, tmp_path, synthetic_profile):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.25,20,1\n1.5,30,40\n")
    out = tmp_path / "run"
    assert main(["run", "--profile", str(synthetic_profile), "--trace", str(trace), "--out", str(out)]) == 0
    requests = pd.read_csv(out / "requests.csv")
    assert requests.output_tokens.tolist() == [5, 1, 40]
    assert requests.arrival_s.tolist() == [0.0, 0.25, 1.5]


def test_profile_missing_a_phase_is_refused(capsys, tmp_path, synthetic_profile):
    broken = tmp_path / "broken"
    broken.mkdir()
    table = pd.read_csv(synthetic_profile / "profile.csv")
    table[table.phase != "verify"].to_csv(broken / "profile.csv", index=False)
    (broken / "profile.json").write_text((synthetic_profile / "profile.json").read_text())
    code, _, err = run_cli(capsys, "run", "--profile", str(broken), *SHORT, "--out", str(tmp_path / "x"))
    assert code == 2
    assert "profile.csv: phase: profile has no measured 'verify' points for the target model" in err


def test_refuses_to_replace_a_folder_that_is_not_a_run(capsys, tmp_path, synthetic_profile):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    code, _, err = run_cli(capsys, "run", "--profile", str(synthetic_profile), *SHORT, "--out", str(precious))
    assert code == 2 and "not a specbatch run folder" in err
    assert (precious / "thesis.tex").read_text() == "do not delete"


@pytest.mark.skipif(DEFAULT_PROFILE not in shipped_profiles(), reason="shipped profile not built yet")
def test_run_without_arguments_simulates_the_shipped_default(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, stdout, _ = run_cli(capsys, "run")
    assert code == 0
    assert DEFAULT_PROFILE in stdout
    written = list((tmp_path / "runs").iterdir())
    assert len(written) == 1 and (written[0] / "summary.json").is_file()


def test_profiles_lists_and_describes(capsys, synthetic_profile):
    code, out, _ = run_cli(capsys, "profiles")
    assert code == 0 and set(out.split()) >= set(shipped_profiles())
    code, out, _ = run_cli(capsys, "profiles", str(synthetic_profile))
    assert code == 0 and "k_max        7" in out and "decode" in out


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_policy_returning_a_bad_k_mid_run_is_one_line_and_writes_nothing(capsys, tmp_path, monkeypatch,
                                                                           synthetic_profile):
    (tmp_path / "wild.py").write_text(
        "from policies import Policy\n"
        "class Wild(Policy):\n"
        "    name = 'wild'\n"
        "    max_k = 3\n"
        "    def choose_k(self, view):\n"
        "        return 3 if view.step < 5 else 4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "never"
    code, _, err = run_cli(capsys, "run", "--profile", str(synthetic_profile), *SHORT, "--policy", "wild:Wild",
                           "--out", str(out))
    assert code == 2
    assert err == "error: policy.name: policy 'wild' returned k = 4, outside 0..3 (its max_k, within what the " \
                  "profile measured)\n"
    assert not out.exists()


def test_the_resolved_config_records_policy_defaults(capsys, tmp_path, synthetic_profile):
    out = tmp_path / "run"
    assert main(["run", "--profile", str(synthetic_profile), *SHORT, "--policy", "fixed", "--out", str(out)]) == 0
    assert 'name = "fixed"\nk = 3\n' in (out / "config.toml").read_text()


def test_a_policy_without_max_k_is_refused_before_running(capsys, tmp_path, monkeypatch, synthetic_profile):
    (tmp_path / "vague.py").write_text(
        "from policies import Policy\n"
        "class Vague(Policy):\n"
        "    def choose_k(self, view):\n"
        "        return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_cli(capsys, "run", "--profile", str(synthetic_profile), *SHORT, "--policy", "vague:Vague",
                           "--out", str(tmp_path / "never"))
    assert code == 2
    assert "policy.name: policy 'vague:Vague' must define max_k" in err and err.count("\n") == 1


def test_records_keep_full_precision_after_a_long_simulated_time(capsys, tmp_path):
    """After 1e5 s of simulated time a step's start and end still carry every bit in steps.csv:
    the durations summed from the file give summary.json's busy time (9 digits gave 2e-6 off)."""
    out = tmp_path / "long"
    assert main(["run", "--config", str(CPU_DEFAULTS), "--rate", "0.01", "--num-requests", "1100",
                 "--out", str(out), "--quiet"]) == 0
    steps = pd.read_csv(out / "steps.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert steps.end_s.max() > 1e5
    busy = float((steps.end_s.to_numpy() - steps.start_s.to_numpy()).sum())
    assert busy == pytest.approx(summary["metrics"]["busy_time_s"], rel=1e-9)


@pytest.mark.parametrize("argv", [["run", "--num-req", "100"], ["run", "--num-request", "100"],
                                  ["run", "--rat", "2"], ["capacity", "--slo", "p99_ttft_ms=100", "--seed", "0",
                                                          "--polic", "none"],
                                  ["sweep", "x.toml", "--work", "2"]])
def test_abbreviated_flags_are_refused(argv, capsys):
    """argparse would take a unique prefix of a flag for the flag: a typo must not run something else."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_calibrate_refuses_abbreviated_flags():
    from calibrate.cli import build_parser
    from sim.errors import InputError

    with pytest.raises(InputError, match="unrecognized arguments: --tar"):
        build_parser().parse_args(["--tar", "opt-125m", "--out", "x"])


def test_the_summary_names_the_profile_the_user_gave(capsys, tmp_path, synthetic_profile):
    """A folder's sidecar may carry another profile's name (a calibration writes its device and models);
    the summary names the folder as given, and summary.json keeps the sidecar's name beside it."""
    import shutil

    folder = tmp_path / "my-profile"
    shutil.copytree(synthetic_profile, folder)
    out = tmp_path / "run"
    code, stdout, _ = run_cli(capsys, "run", "--profile", str(folder), *SHORT, "--out", str(out))
    assert code == 0 and any(line.startswith("Profile:") and line.endswith(str(folder)) for line in stdout.splitlines())
    profile = json.loads((out / "summary.json").read_text())["profile"]
    assert profile["name"] == str(folder) and profile["sidecar_name"] == "synthetic"
