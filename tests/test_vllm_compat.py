"""vllm bench serve's inputs, options and outputs: rate inf, max concurrency, goodput SLOs, burstiness,
--trace-vllm, summary.json's vLLM names, per-request speculation metrics, and specbatch compare."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specbatch
from specbatch.commands.cli import main
from sim.errors import InputError
from sim.metrics import parse_goodput
from workloads import gamma_arrivals, read_vllm_result

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "vllm-result-synthetic.json"
SMALL = dict(num_requests=120, seed=2)


def _max_outstanding(requests) -> int:
    events = sorted([(a, 1) for a in requests.arrival_s] + [(f, -1) for f in requests.finish_s],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


# ---------------------------------------------------------------------------------- arrivals


def test_rate_inf_sends_every_request_at_zero():
    assert gamma_arrivals(np.random.default_rng(0), math.inf, 1.0, num_requests=5).tolist() == [0.0] * 5
    run = specbatch.run(rate=math.inf, **SMALL)
    assert (run.requests.arrival_s == 0).all()
    with pytest.raises(InputError, match="give num_requests"):
        specbatch.run(rate="inf")


@pytest.mark.parametrize("burstiness", [0.3, 1.0, 4.0])
def test_gamma_gaps_have_vllms_mean_and_shape(burstiness):
    t = gamma_arrivals(np.random.default_rng(1), 5.0, burstiness, num_requests=200_001)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.03)  # CV of Gamma(shape)


# -------------------------------------------------------------------------- max concurrency


@given(st.integers(1, 12), st.sampled_from([5.0, 40.0, math.inf]))
@settings(max_examples=12, deadline=None)
def test_the_client_never_has_more_than_n_requests_outstanding(limit, rate):
    run = specbatch.run(rate=rate, max_concurrency=limit, num_requests=60, seed=limit)
    t = run.requests
    assert _max_outstanding(t) <= limit
    assert t.finish_s.notna().all()
    assert np.all(np.diff(t.arrival_s) >= 0)  # sent first come, first served


def test_a_request_is_sent_when_it_arrives_and_a_slot_is_free():
    free = specbatch.run(rate=40, **SMALL)
    limited = specbatch.run(rate=40, max_concurrency=4, **SMALL)
    sent, arrived = limited.requests.arrival_s.to_numpy(), free.requests.arrival_s.to_numpy()
    assert np.all(sent >= arrived)
    finishes = np.sort(limited.requests.finish_s.to_numpy())
    assert np.allclose(sent[4:], np.maximum(arrived[4:], finishes[:-4]))
    assert limited.summary["mean_batch_size"] <= 4


def test_a_limit_that_never_binds_changes_nothing():
    free = specbatch.run(rate=2, **SMALL)
    limited = specbatch.run(rate=2, max_concurrency=10_000, **SMALL)
    assert free.summary == limited.summary


@given(st.integers(1, 12), st.sampled_from([5.0, 40.0, math.inf]), st.integers(2, 4),
       st.sampled_from(["round-robin", "least-requests", "least-tokens"]))
@settings(max_examples=12, deadline=None)
def test_the_client_of_a_cluster_never_has_more_than_n_requests_outstanding(limit, rate, replicas, router):
    """One client in front of the whole cluster (vllm bench serve through a router): request i
    is sent at max(arrival_i, the (i - N)-th finish over every replica), and served once."""
    free = specbatch.run(rate=rate, num_requests=60, seed=limit, replicas=replicas, router=router)
    run = specbatch.run(rate=rate, max_concurrency=limit, num_requests=60, seed=limit, replicas=replicas,
                        router=router)
    t = run.requests
    assert _max_outstanding(t) <= limit
    assert t.finish_s.notna().all() and run.summary["completed"] == 60
    sent, arrived = t.arrival_s.to_numpy(), free.requests.arrival_s.to_numpy()
    finishes = np.sort(t.finish_s.to_numpy())
    assert np.array_equal(sent[:limit], arrived[:limit])
    assert np.array_equal(sent[limit:], np.maximum(arrived[limit:], finishes[:60 - limit]))
    assert int(run.steps.emitted_tokens.sum()) == int(t.output_tokens.sum())


# ---------------------------------------------------------------------------------- goodput


@pytest.mark.parametrize("raw", ["ttft:500 tpot:50", ["ttft:500", "tpot:50"], "ttft:500,tpot:50",
                                 {"tpot": 50, "ttft": 500}])
def test_goodput_slos_read_as_vllm_writes_them(raw):
    assert parse_goodput(raw) == {"ttft": 500.0, "tpot": 50.0}


@pytest.mark.parametrize("raw,message", [("ttft", "KEY:MS"), ("itl:5", "not one of"), ("ttft:-1", ">= 0"),
                                         ("ttft:x", "not a number")])
def test_bad_goodput_is_refused(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_goodput(raw)


def test_request_goodput_counts_requests_meeting_every_slo():
    run = specbatch.run(rate=30, goodput="ttft:60 tpot:8 e2el:2000", **SMALL)
    t = run.requests
    tpot = np.where(t.output_tokens > 1, t.tpot_s.fillna(0.0), 0.0)
    good = int(((t.ttft_s <= 0.060) & (tpot <= 0.008) & (t.e2el_s <= 2.0)).sum())
    assert 0 < good < len(t)
    assert run.summary["good_completed"] == good
    assert run.summary["request_goodput"] == pytest.approx(good / run.summary["duration_s"])


def test_goodput_flag_takes_vllms_words(tmp_path, capsys):
    assert main(["run", "--num-requests", "40", "--goodput", "ttft:100", "e2el:3000", "--out", str(tmp_path / "r"),
                 "--quiet"]) == 0
    doc = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert doc["request_goodput"] == doc["metrics"]["request_goodput"] is not None


# ------------------------------------------------------------------------------ summary.json


def test_summary_json_reads_as_a_vllm_result_and_keeps_todays_metrics(tmp_path):
    run = specbatch.run(rate=math.inf, max_concurrency=6, out=str(tmp_path / "r"), **SMALL)
    doc = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert doc["metrics"] == {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                              for k, v in run.summary.items()}
    assert doc["duration"] == run.summary["duration_s"] and doc["num_prompts"] == 120
    assert doc["request_rate"] == "inf" and doc["max_concurrency"] == 6 and doc["request_goodput"] is None
    for key in ("completed", "mean_ttft_ms", "median_tpot_ms", "std_itl_ms", "p99_e2el_ms", "output_throughput"):
        assert key in doc["metrics"]  # vLLM's names
    spec = doc["speculative_decoding"]
    assert spec["spec_decode_num_drafts"] == run.summary["num_drafts"]
    assert len(spec["spec_decode_num_accepted_tokens_per_pos"]) == 3
    assert not (tmp_path / "r" / "spec_decode.jsonl").exists()  # only when asked


def test_detailed_per_request_metrics_use_vllms_field_names(tmp_path):
    specbatch.run(rate=10, per_request_spec_decode_metrics="detailed", out=str(tmp_path / "r"), **SMALL)
    rows = [json.loads(line) for line in (tmp_path / "r" / "spec_decode.jsonl").read_text().splitlines()]
    assert len(rows) == 120
    fields = {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_spec_steps",
              "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens", "per_step_accepted",
              "per_step_drafted"}
    for row in rows:
        assert fields <= set(row)
        assert len(row["per_step_accepted"]) == len(row["per_step_drafted"]) == row["num_spec_steps"]
        assert sum(row["per_step_accepted"]) == row["num_accepted_draft_tokens"]


def test_default_runs_write_the_same_config_toml(tmp_path):
    run = specbatch.run(rate=2, **SMALL)
    text = run.config.to_toml()
    for key in ("model", "per_position", "trace_vllm", "max_concurrency", "goodput", "per_request_spec"):
        assert key not in text


# ------------------------------------------------------------------------------- trace-vllm


def test_the_example_result_replays_its_requests_at_their_start_times():
    real = read_vllm_result(EXAMPLE)
    run = specbatch.run(trace_vllm=str(EXAMPLE))
    assert run.requests.prompt_tokens.tolist() == real.prompt_tokens.tolist()
    assert np.allclose(run.requests.arrival_s, real.start_s)


def _result_file(tmp_path, **changes):
    data = json.loads(EXAMPLE.read_text())
    data.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del data[key]
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    return path


def test_without_start_times_arrivals_follow_the_files_rate(tmp_path):
    path = _result_file(tmp_path, start_times=None, request_rate="inf")
    assert (specbatch.run(trace_vllm=str(path)).requests.arrival_s == 0).all()
    path = _result_file(tmp_path, start_times=None, request_rate=3.0)
    arrivals = specbatch.run(trace_vllm=str(path)).requests.arrival_s
    assert len(arrivals) / arrivals.iloc[-1] == pytest.approx(3.0, rel=0.35)


def test_failed_requests_are_left_out(tmp_path):
    data = json.loads(EXAMPLE.read_text())
    errors = [""] * len(data["input_lens"])
    errors[0] = "Timeout"
    path = _result_file(tmp_path, errors=errors)
    assert len(read_vllm_result(path).prompt_tokens) == len(errors) - 1


@pytest.mark.parametrize("changes,message", [({"input_lens": None}, "--save-detailed"),
                                             ({"ttfts": [0.1]}, "entries"),
                                             ({"output_lens": [0] * 100}, "no completed request")])
def test_a_bad_result_file_is_one_clear_error(tmp_path, changes, message):
    with pytest.raises(InputError, match=message):
        specbatch.run(trace_vllm=str(_result_file(tmp_path, **changes)))


# ---------------------------------------------------------------------------------- compare


def test_compare_prints_vllms_rows_with_errors_and_ks_tests(capsys):
    assert main(["compare", str(EXAMPLE), "--k", "3"]) == 0
    out = capsys.readouterr().out
    for label in ("Successful requests:", "Benchmark duration (s):", "Mean TTFT (ms):", "P99 E2EL (ms):",
                  "Kolmogorov-Smirnov"):
        assert label in out


def test_compare_api_gives_tables_against_the_files_metrics():
    c = specbatch.compare(EXAMPLE, k=3)
    real = json.loads(EXAMPLE.read_text())
    row = c.table.set_index("metric").loc["mean_ttft_ms"]
    assert row.real == pytest.approx(real["mean_ttft_ms"])
    assert row.rel_error == pytest.approx((row.sim - row.real) / row.real)
    assert set(c.ks.metric) == {"ttft", "tpot", "itl", "e2el"}
    assert c.ks.statistic.between(0, 1).all() and c.ks.pvalue.between(0, 1).all()
    assert c.table.set_index("metric").loc["completed"].rel_error == 0


def test_compare_applies_the_files_concurrency_limit(tmp_path):
    path = _result_file(tmp_path, max_concurrency=3)
    c = specbatch.compare(path, k=3)
    assert c.result.config.workload.max_concurrency == 3
    assert _max_outstanding(c.result.requests) <= 3
    with pytest.raises(InputError, match="unknown keyword"):
        specbatch.compare(path, rate=2)


# ------------------------------------------------------------------------------- TOML errors


@pytest.mark.parametrize("section,line,message", [
    ("[acceptance]", "per_position = [0.5, 0.7]", "must not increase"),
    ("[acceptance]", 'model = "histogram"', "is not one of"),
    ("[output]", "goodput = { ttft = -5 }", ">= 0"),
    ("[workload]", "max_concurrency = 0", "at least 1"),
])
def test_a_bad_new_key_in_a_file_names_the_file_and_line(tmp_path, section, line, message):
    path = tmp_path / "s.toml"
    path.write_text(f"seed = 1\n\n{section}\n{line}\n")
    with pytest.raises(InputError, match=message) as info:
        specbatch.run(path, num_requests=5)
    assert info.value.line == 4 and str(path) in str(info.value)


def test_new_keys_round_trip_through_config_toml(tmp_path):
    run = specbatch.run(num_requests=30, rate=math.inf, max_concurrency=4, goodput="ttft:100", k=4,
                        acceptance_model="per-position", acceptance_per_position="0.8,0.5",
                        per_request_spec_decode_metrics="summary", out=str(tmp_path / "a"))
    again = specbatch.run(tmp_path / "a" / "config.toml", out=str(tmp_path / "b"))
    assert again.config.to_dict() == {**run.config.to_dict(), "output": again.config.to_dict()["output"]}
    for name in ("summary.json", "requests.csv", "spec_decode.jsonl"):
        a, b = (tmp_path / "a" / name).read_text(), (tmp_path / "b" / name).read_text()
        assert a.replace(str(tmp_path / "a"), "") == b.replace(str(tmp_path / "b"), "") or name == "summary.json"
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["metrics"] == \
        json.loads((tmp_path / "b" / "summary.json").read_text())["metrics"]


def test_an_edited_vllm_result_or_acceptance_trace_is_a_new_run(tmp_path):
    from sim.config import load_config

    result, trace = tmp_path / "r.json", tmp_path / "t.jsonl"
    result.write_text(EXAMPLE.read_text())
    trace.write_text('{"per_step_accepted": [1], "per_step_drafted": [2]}\n')
    flags = {"workload.trace_vllm": str(result), "acceptance.model": "trace", "acceptance.trace": str(trace)}
    before = load_config(None, flags).digest()
    trace.write_text('{"per_step_accepted": [2], "per_step_drafted": [2]}\n')
    after_trace = load_config(None, flags).digest()
    result.write_text(EXAMPLE.read_text().replace('"burstiness": 1.0', '"burstiness": 2.0'))
    assert len({before, after_trace, load_config(None, flags).digest()}) == 3


def test_a_simulation_compared_with_itself_has_no_error(tmp_path):
    """A vLLM-format file written from a simulated run (no metrics of its own: they are computed
    from its lists) compares at zero error: the two sides use one set of definitions."""
    sim = specbatch.run(rate=8, num_requests=80, seed=3, k=3)
    t = sim.requests
    data = {"request_rate": 8.0, "burstiness": 1.0, "max_concurrency": None, "duration": sim.summary["duration_s"],
            "input_lens": t.prompt_tokens.tolist(), "output_lens": t.output_tokens.tolist(),
            "start_times": t.arrival_s.tolist(), "ttfts": t.ttft_s.tolist(), "latencies": t.e2el_s.tolist(),
            "errors": [""] * len(t)}
    path = tmp_path / "self.json"
    path.write_text(json.dumps(data))
    c = specbatch.compare(path, seed=3, k=3)
    rows = c.table.set_index("metric")
    for key in ("completed", "duration", "request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms",
                "median_tpot_ms", "mean_e2el_ms", "p99_e2el_ms"):
        assert abs(rows.loc[key, "rel_error"]) < 1e-6, key
    ks = c.ks.set_index("metric")
    for name in ("ttft", "tpot", "e2el"):
        assert ks.loc[name, "statistic"] < 1e-9 and ks.loc[name, "pvalue"] == pytest.approx(1.0)
    assert ks.loc["itl", "n_real"] == 0  # the file has no ITLs: no test, shown as n/a
