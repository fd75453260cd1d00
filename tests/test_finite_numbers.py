"""NaN and infinities where a number is read (flags, TOML configs, traces, profiles, vLLM result
files) are refused the way every bad input is (docs/errors.md): one line naming the flag or
field, the file and the line where there is one, exit 2, nothing written. ``rate inf`` keeps its
documented meaning (every request at t = 0, as ``vllm bench serve --request-rate inf``).
"""

from __future__ import annotations

import json
import math

import pytest

from sim.config import load_config
from tests.test_bad_inputs import SHAPE, TINY, TRACE_HEADER, _edit_points, here, refused  # noqa: F401  (here: fixture)
from workloads.numbers import NotFinite, read_number

# -------------------------------------------------------------------------------- numbers: the reader

@pytest.mark.parametrize("raw", ["nan", "NaN", "-nan", "inf", "-inf", "+Infinity", float("nan"), float("inf"),
                                 -math.inf, 10**400])
def test_nan_and_infinities_are_not_numbers(raw):
    with pytest.raises(NotFinite, match="is not a finite number"):
        read_number(raw)


@pytest.mark.parametrize("raw", ["inf", "+inf", "Infinity", math.inf])
def test_plus_infinity_where_a_setting_gives_it_a_meaning(raw):
    assert read_number(raw, infinite=True) == math.inf


@pytest.mark.parametrize("raw", ["nan", "-inf", "1e400", float("nan"), -math.inf])
def test_only_plus_infinity_and_only_as_a_word(raw):
    with pytest.raises(NotFinite):
        read_number(raw, infinite=True)


@pytest.mark.parametrize("raw, value", [("12", 12.0), (" 0.5 ", 0.5), ("-3e-2", -0.03), (".5", 0.5), (7, 7.0),
                                        (0.25, 0.25)])
def test_plain_numbers_read(raw, value):
    assert read_number(raw) == value


@pytest.mark.parametrize("raw", ["1_000", "0x10", "١٢", "fast", "", True, [1], None])
def test_what_is_not_a_number(raw):
    with pytest.raises(ValueError, match="is not a number"):
        read_number(raw)


# ---------------------------------------------------------------------------- numbers: every input

def test_a_nan_alpha_in_a_trace_is_refused_not_taken_for_blank(capsys, here):
    (here / "a.csv").write_text("arrival_s,prompt_tokens,output_tokens,alpha\n0,16,8,0.5\n0.5,12,8,\n1,12,8,nan\n")
    refused(capsys, here, ["run", "--trace", "a.csv", "--profile", "p", "--out", "o"], "a.csv:4", "alpha",
            "'nan' is not a finite number", "blank")


def test_a_blank_alpha_in_a_trace_still_means_the_configured_one(capsys, here):
    from workloads.trace import read_trace

    (here / "a.csv").write_text("arrival_s,prompt_tokens,output_tokens,alpha\n0,16,8,0.5\n0.5,12,8,\n")
    alpha = read_trace(here / "a.csv").alpha
    assert alpha[0] == 0.5 and math.isnan(alpha[1])


@pytest.mark.parametrize("cell", ["inf", "-inf", "Infinity"])
def test_an_infinite_alpha_or_arrival_in_a_trace_is_refused(capsys, here, cell):
    (here / "a.csv").write_text(f"arrival_s,prompt_tokens,output_tokens,alpha\n0,16,8,{cell}\n")
    refused(capsys, here, ["run", "--trace", "a.csv", "--profile", "p", "--out", "o"], "a.csv:2", "alpha")
    (here / "b.csv").write_text(f"{TRACE_HEADER}0,16,8\n{cell},12,8\n")
    refused(capsys, here, ["run", "--trace", "b.csv", "--profile", "p", "--out", "o"], "b.csv:3", "arrival_s",
            "finite")


@pytest.mark.parametrize("section, line, needle", [
    ("[workload]\nnum_requests = 4\nrate = nan\n", 3, "workload.rate"),
    ("[workload]\nnum_requests = 4\nrate = -inf\n", 3, "workload.rate"),
    ("[workload]\nnum_requests = 4\ncv = inf\n", 3, "workload.cv"),
    ("[workload]\nnum_requests = 4\nprompt_tokens = { dist = \"lognormal\", mean = nan, sigma = 0.5 }\n", 3,
     "workload.prompt_tokens"),
    ("[workload]\nnum_requests = 4\n[acceptance]\nalpha = nan\n", 4, "acceptance.alpha"),
    ("[workload]\nnum_requests = 4\n[acceptance]\nconcentration = inf\n", 4, "acceptance.concentration"),
    ("[workload]\nnum_requests = 4\n[engine]\ngpu_memory_utilization = nan\n", 4, "engine.gpu_memory_utilization"),
    ("[workload]\nnum_requests = 4\n[policy]\nname = \"lut\"\nalpha = nan\n", 5, "policy.alpha"),
])
def test_nan_and_infinities_in_a_config_file_name_the_key_and_line(capsys, here, section, line, needle):
    (here / "c.toml").write_text(section)
    refused(capsys, here, ["run", "--config", "c.toml", "--profile", "p", "--out", "o"], needle, f"c.toml:{line}")


def test_rate_inf_in_a_config_file_keeps_its_meaning(here):
    (here / "c.toml").write_text("[workload]\nnum_requests = 4\nrate = inf\n")
    assert load_config(here / "c.toml").workload.rate == math.inf


@pytest.mark.parametrize("argv, needle", [
    (["run", "--rate", "nan"], "--rate"),
    (["run", "--rate=-inf"], "--rate"),
    (["run", "--alpha", "inf"], "--alpha"),
    (["run", "--duration", "inf"], "--duration"),
    (["run", "--alpha-concentration", "nan"], "--alpha-concentration"),
    (["run", "--random-range-ratio", "nan"], "--random-range-ratio"),
    (["run", "--policy", "lut:alpha=nan"], "policy.alpha"),
    (["lut", "--alpha", "0.7", "--context", "inf"], "--context"),
    (["capacity", "--slo", "p99_ttft_ms=2000", "--tolerance", "nan"], "--tolerance"),
    (["capacity", "--slo", "p99_ttft_ms=2000", "--target-rate", "inf"], "--target-rate"),
    (["compose", "--gpu", "h100_sxm", "--target", "llama-3.1-8b", "--out", "c", "--engine-overhead-ms", "inf"],
     "--engine-overhead-ms"),
    (["calibrate", "--out", "c", "--point-budget", "inf"], "--point-budget"),
    (["calibrate", "--out", "c", "--memory-fraction", "nan"], "--memory-fraction"),
])
def test_nan_and_infinities_in_flags_name_the_flag(capsys, here, argv, needle):
    refused(capsys, here, [*argv, *(["--profile", "p", *TINY, "--out", "o"] if argv[0] == "run" else [])], needle,
            "finite" if not needle.startswith("policy.") else "nan")


def test_rate_inf_on_the_command_line_keeps_its_meaning(capsys, here):
    from specbatch.commands.cli import main

    assert main(["run", "--profile", str(here / "p"), *SHAPE, "--num-requests", "4", "--request-rate", "inf",
                 "--out", str(here / "o"), "--quiet"]) == 0
    assert "rate = inf" in (here / "o" / "config.toml").read_text()


def test_an_infinite_latency_of_a_skipped_profile_point_is_refused(capsys, here):
    _edit_points(here / "p", "status", "oom", row=3)
    line = _edit_points(here / "p", "latency_mean_s", "inf", row=3)
    refused(capsys, here, ["run", "--profile", "p", *TINY, "--out", "o"], f"profile.csv:{line}", "latency_mean_s",
            "skipped")


@pytest.mark.parametrize("field, value", [("burstiness", "NaN"), ("burstiness", "Infinity"), ("burstiness", "0"),
                                          ("request_rate", "NaN"), ("request_rate", "-Infinity")])
def test_a_vllm_result_files_settings_must_be_numbers_above_zero(capsys, here, field, value):
    doc = {"input_lens": [16, 12], "output_lens": [8, 8], "request_rate": 1.0, "burstiness": 1.0}
    (here / "v.json").write_text(json.dumps(doc).replace(f'"{field}": 1.0', f'"{field}": {value}'))
    refused(capsys, here, ["run", "--trace-vllm", "v.json", "--profile", "p", "--out", "o"], "v.json", field)


def test_a_vllm_result_files_infinite_rate_keeps_its_meaning(here):
    from workloads.vllm_result import read_vllm_result

    for rate in ('"inf"', "Infinity", "null"):
        (here / "v.json").write_text(f'{{"input_lens": [16], "output_lens": [8], "request_rate": {rate}}}')
        assert read_vllm_result(here / "v.json").request_rate == math.inf


def test_a_nan_inter_token_latency_in_a_vllm_result_is_refused(capsys, here):
    doc = '{"input_lens": [16, 12], "output_lens": [3, 3], "itls": [[0.01, 0.02], [0.01, NaN]], "request_rate": 1}'
    (here / "v.json").write_text(doc)
    refused(capsys, here, ["run", "--trace-vllm", "v.json", "--profile", "p", "--out", "o"], "v.json", "itls",
            "finite")
