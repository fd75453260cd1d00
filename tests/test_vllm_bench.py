"""vllm bench serve's flags on specbatch run: aliases with vLLM's meaning, the random dataset, the
chosen statistics, the flat result file, and one-line pointers for the flags a simulation has no use for."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from specbatch.commands.cli import main
from tests.conftest import CPU_DEFAULTS

BASE = ["--config", str(CPU_DEFAULTS), "--rate", "0.1"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_request_rate_and_num_prompts_are_rate_and_num_requests(capsys, tmp_path):
    assert run(capsys, "--config", str(CPU_DEFAULTS), "--request-rate", "0.2", "--num-prompts", "30",
               "--out", str(tmp_path / "vllm"))[0] == 0
    assert run(capsys, "--config", str(CPU_DEFAULTS), "--rate", "0.2", "--num-requests", "30",
               "--out", str(tmp_path / "ours"))[0] == 0
    for name in ("summary.json", "requests.csv", "config.toml"):
        assert (tmp_path / "vllm" / name).read_text().replace("vllm", "X") == \
            (tmp_path / "ours" / name).read_text().replace("ours", "X")


@pytest.mark.parametrize("flags, prompt, output", [
    (["--dataset-name", "random"], "1024", "128"),  # vLLM's defaults
    (["--random-input-len", "100", "--random-output-len", "40", "--random-range-ratio", "0.5"],
     "uniform:50:150", "uniform:20:60"),
    (["--random-input-len", "100", "--random-prefix-len", "10", "--random-range-ratio", "0.25"],
     "uniform:85:135", "uniform:96:160"),
    (["--random-input-len", "3", "--random-output-len", "1", "--random-range-ratio", "0.9"], "uniform:0:6", "uniform:1:2"),
])
def test_the_random_dataset_draws_lengths_as_vllm_does(flags, prompt, output, capsys, tmp_path):
    from sim.config import load_config

    if prompt.startswith("uniform:0"):  # a prompt of 0 tokens is not a request: refused as any other length
        code, _, err = run(capsys, *BASE, "--num-requests", "5", *flags, "--out", str(tmp_path / "r"))
        assert code == 2 and "workload.prompt_tokens" in err
        return
    assert run(capsys, *BASE, "--num-requests", "50", *flags, "--out", str(tmp_path / "r"), "--quiet")[0] == 0
    config = load_config(tmp_path / "r" / "config.toml")
    expected = load_config(None, {"workload.prompt_tokens": prompt, "workload.output_tokens": output})
    assert config.workload.prompt_tokens == expected.workload.prompt_tokens
    assert config.workload.output_tokens == expected.workload.output_tokens
    requests = pd.read_csv(tmp_path / "r" / "requests.csv")
    spec = expected.workload.prompt_tokens
    low, high = (spec.value, spec.value) if spec.kind == "fixed" else (spec.low, spec.high)
    assert requests.prompt_tokens.between(low, high).all()


@pytest.mark.parametrize("flags, says", [
    (["--dataset-name", "sharegpt"], "error: --dataset-name: 'sharegpt' is not simulated: specbatch draws vLLM's "
                                     "random dataset (--dataset-name random); for real requests give --trace"),
    (["--random-range-ratio", "1"], "error: --random-range-ratio: must be in [0, 1), got 1"),
    (["--random-input-len", "64", "--prompt-tokens", "32"], "error: --random-input-len: give vLLM's random dataset "
                                                              "or --prompt-tokens/--output-tokens, not both"),
    (["--percentile-metrics", "ttft,latency"], "error: --percentile-metrics: 'ttft,latency': metrics are ttft, "
                                               "tpot, itl, e2el"),
    (["--metric-percentiles", "99,100"], "error: --metric-percentiles: '99,100': each percentile must be inside"),
    (["--result-filename", "r.json"], "error: --result-filename: applies only with --save-result"),
    (["--top-p", "1.5"], "error: --top-p: must be in (0, 1], got 1.5"),
    (["--temperature", "-1"], "error: --temperature: must be in [0, inf], got -1"),
    (["--temperature", "0.6", "--sampling", "greedy"], "error: --temperature: give --sampling or vllm bench serve's "
                                                       "--temperature/--top-p/--top-k/--min-p, not both"),
])
def test_bad_vllm_flags_are_one_line_before_any_work(flags, says, capsys, tmp_path):
    code, _, err = run(capsys, *BASE, "--num-requests", "5", *flags, "--out", str(tmp_path / "r"))
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, says", [
    (["--model", "meta-llama/Llama-3.1-8B"], "error: specbatch: --model is vllm bench serve's; specbatch simulates "
                                             "a profile's model pair: give --profile"),
    (["--backend", "vllm"], "--backend is vllm bench serve's; there is no server to send requests to"),
    (["--dataset-path", "sharegpt.json"], "--dataset-path is vllm bench serve's; replay real requests with --trace"),
    (["--ramp-up-strategy", "linear"], "--ramp-up-strategy is vllm bench serve's; a time-varying rate: --rate-profile"),
    (["--extra-body", "{}"], "--extra-body is vllm bench serve's; sampling is --temperature/--top-p"),
])
def test_a_vllm_flag_with_no_use_here_points_to_ours(flags, says, capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", *BASE, *flags])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and says in err, err


def test_chosen_statistics_are_printed_and_match_the_records(capsys, tmp_path):
    out = tmp_path / "r"
    code, printed, _ = run(capsys, *BASE, "--num-requests", "200", "--percentile-metrics", "ttft,e2el",
                           "--metric-percentiles", "25,99.9", "--out", str(out))
    assert code == 0
    lines = {line.split(":")[0]: float(line.split()[-1]) for line in printed.splitlines()
             if re.match(r"(Mean|Median|P[\d.]+) [A-Z0-9]+ \(ms\):", line)}
    assert set(lines) >= {"Mean TTFT (ms)", "Median TTFT (ms)", "P25 TTFT (ms)", "P99.9 TTFT (ms)", "P99.9 E2EL (ms)"}
    assert not any("TPOT" in name or "ITL" in name for name in lines)
    requests = pd.read_csv(out / "requests.csv")
    assert lines["P99.9 TTFT (ms)"] == pytest.approx(np.percentile(requests.ttft_s * 1e3, 99.9), abs=0.006)
    assert lines["P25 E2EL (ms)"] == pytest.approx(np.percentile(requests.e2el_s * 1e3, 25), abs=0.006)


def test_save_result_writes_vllm_s_flat_result_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, printed, _ = run(capsys, *BASE, "--num-requests", "60", "--goodput", "ttft:5000", "--save-result",
                           "--metric-percentiles", "50,99", "--out", "run")
    saved = tmp_path / "specbatch-0.1qps-cpu-tinyllama-1.1b-llama-68m.json"
    assert code == 0 and f"Wrote {saved.name} (vllm bench serve's result JSON)" in printed
    result = json.loads(saved.read_text())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # What a script written for vLLM's files reads, at the top level, meaning what vLLM means.
    for key in ("completed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
                "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms"):
        assert result[key] == pytest.approx(summary["metrics"][key], rel=1e-12), key
    assert result["duration"] == summary["metrics"]["duration_s"]
    assert result["request_goodput"] == summary["metrics"]["request_goodput"]
    assert (result["num_prompts"], result["request_rate"], result["burstiness"], result["failed"]) == (60, 0.1, 1.0, 0)
    assert "p50_ttft_ms" in result and "mean_e2el_ms" not in result  # vLLM's default metrics: ttft, tpot, itl
    assert result["max_concurrent_requests"] >= 1 and result["max_output_tokens_per_s"] > 0
    assert not any(isinstance(v, list) for v in result.values())  # per-request lists only with --save-detailed


def test_a_detailed_result_replays_through_trace_vllm(capsys, tmp_path):
    saved = tmp_path / "detailed.json"
    assert run(capsys, *BASE, "--num-requests", "40", "--save-result", "--save-detailed", "--result-filename",
               str(saved), "--out", str(tmp_path / "a"), "--quiet")[0] == 0
    detailed = json.loads(saved.read_text())
    assert len(detailed["input_lens"]) == len(detailed["ttfts"]) == 40
    assert run(capsys, "--config", str(CPU_DEFAULTS), "--trace-vllm", str(saved), "--out", str(tmp_path / "b"),
               "--quiet")[0] == 0
    a, b = (pd.read_csv(tmp_path / d / "requests.csv") for d in "ab")
    assert (a.prompt_tokens == b.prompt_tokens).all() and (a.output_tokens == b.output_tokens).all()


def test_the_api_takes_the_same_names():
    import specbatch

    run = specbatch.run(CPU_DEFAULTS, request_rate=0.2, num_prompts=20, random_input_len=64, random_output_len=16,
                        records="none")
    assert run.config.workload.rate == 0.2 and run.config.workload.num_requests == 20
    assert run.config.workload.prompt_tokens.value == 64 and run.config.workload.output_tokens.value == 16
    result = run.vllm_result("ttft,e2el", "50,90")
    assert result["p90_e2el_ms"] == pytest.approx(np.percentile(run.requests.e2el_s * 1e3, 90))
