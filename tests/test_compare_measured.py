"""specbatch compare with a per-request measurement file, and specbatch fit: worked cases with known answers.

The measurements here are made by the simulator itself, so the answers are known: a
simulation compared with itself has no error, and a fit to measurements made with a known
overhead finds that overhead.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import specbatch
from specbatch.commands.cli import main
from specbatch.commands.compare import StageComparison, saturated
from workloads import TraceError
from workloads.measured import read_measured

PROFILE = "h100-llama-2-7b-llama-68m"
ENGINE = {"profile": PROFILE, "policy": "none", "scheduler": "vllm-v1", "max_num_batched_tokens": 2048,
          "max_batch_size": 32, "block_size": 16, "kv_cache_tokens": 60000}
ENGINE_FLAGS = ["--profile", PROFILE, "--policy", "none", "--scheduler", "vllm-v1", "--max-num-batched-tokens", "2048",
                "--max-num-seqs", "32", "--block-size", "16", "--kv-cache-tokens", "60000"]


def simulated_measurements(path: Path, profile: str = PROFILE, rates=(4.0, 12.0), seconds: float = 8.0,
                           seed: int = 1) -> Path:
    """A measurement file made by simulating two constant-rate stages: (arrival, lengths, prompt ids, stage,
    the simulated TTFT and E2E as if measured)."""
    rng = np.random.default_rng(seed)
    arrivals, stages, start = [], [], 0.0
    for stage, rate in enumerate(rates):
        gaps = rng.exponential(1 / rate, int(rate * seconds * 2))
        times = start + np.cumsum(gaps)
        times = times[times < start + seconds]
        arrivals.append(times)
        stages += [stage] * len(times)
        start += seconds
    arrival = np.concatenate(arrivals)
    n = len(arrival)
    ids = np.arange(n) % 7
    prompts = (300 + 37 * ids).astype(int)
    outputs = rng.integers(20, 80, n)
    trace = path.with_suffix(".trace.csv")
    pd.DataFrame({"arrival_s": arrival, "prompt_tokens": prompts, "output_tokens": outputs,
                  "prompt_id": ids}).to_csv(trace, index=False)
    run = specbatch.run(**{**ENGINE, "profile": profile}, trace=str(trace))
    frame = pd.DataFrame({"arrival_s": arrival + 100.0, "prompt_tokens": prompts, "output_tokens": outputs,
                          "prompt_id": ids, "stage": stages, "ok": 1, "ttft_s": run.requests.ttft_s.to_numpy(),
                          "e2e_s": run.requests.e2el_s.to_numpy()})
    frame.to_csv(path, index=False)
    return path


# --------------------------------------------------------------------------------- reading

def test_a_measurement_file_reads_the_same_from_csv_and_parquet_sorted_from_zero(tmp_path):
    rows = pd.DataFrame({"arrival_s": [12.0, 10.0, 11.0], "prompt_tokens": [5, 7, 0], "output_tokens": [3, 4, 5],
                         "prompt_id": [1, 2, 1], "stage": ["b", "a", "b"], "ok": [1, 1, 0],
                         "ttft_s": [0.1, 0.2, None], "e2e_s": [0.5, 0.6, None], "extra": ["x", "y", "z"]})
    rows.to_csv(tmp_path / "m.csv", index=False)
    rows.to_parquet(tmp_path / "m.parquet")
    a, b = read_measured(tmp_path / "m.csv").frame, read_measured(tmp_path / "m.parquet").frame
    pd.testing.assert_frame_equal(a, b, check_like=True)
    assert a.arrival_s.tolist() == [0.0, 1.0, 2.0] and a.stage.tolist() == ["a", "b", "b"]
    assert a.prompt_tokens.tolist() == [7, 5, 5]  # the failed request's prompt from its prompt_id
    assert "extra" not in a


@pytest.mark.parametrize("column, value, line, message", [
    ("arrival_s", "soon", 3, "not a finite number"),
    ("prompt_tokens", "2.5", 3, "not a whole number"),
    ("output_tokens", "0", 3, "from 1"),
    ("ok", "2", 3, "1 (succeeded) or 0"),
    ("ttft_s", "", 3, "empty for a request with ok = 1"),
    ("e2e_s", "0.01", 3, "below the request's ttft_s"),
    ("prompt_tokens", "0", 3, "at least 1 for a request with ok = 1"),
])
def test_a_bad_cell_names_the_file_line_and_column(tmp_path, column, value, line, message):
    frame = pd.DataFrame({"arrival_s": ["0", "1"], "prompt_tokens": ["5", "5"], "output_tokens": ["3", "3"],
                          "ok": ["1", "1"], "ttft_s": ["0.1", "0.1"], "e2e_s": ["0.5", "0.5"]})
    frame.loc[1, column] = value
    frame.to_csv(tmp_path / "m.csv", index=False)
    with pytest.raises(TraceError) as info:
        read_measured(tmp_path / "m.csv")
    assert (info.value.line, info.value.field) == (line, column) and message in info.value.message


def test_compare_refuses_a_bad_measurement_file_in_one_line(tmp_path, capsys):
    (tmp_path / "m.csv").write_text("arrival_s,prompt_tokens\n0,5\n")
    assert main(["compare", str(tmp_path / "m.csv"), *ENGINE_FLAGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "m.csv:1" in err[0] and "output_tokens" in err[0]


# --------------------------------------------------------------------------------- comparing

@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    return simulated_measurements(tmp_path_factory.mktemp("measured") / "run.csv")


def test_a_simulation_compared_with_itself_has_no_error_in_any_stage(measured, capsys):
    comparison = specbatch.compare(measured, **{k: v for k, v in ENGINE.items()})
    assert isinstance(comparison, StageComparison)
    assert list(comparison.stages.stage) == [0, 1]
    assert comparison.table.rel_error.abs().max() < 1e-6  # arrivals written to the nanosecond
    assert not comparison.stages.real_saturated.any() and not comparison.stages.sim_saturated.any()
    assert main(["compare", str(measured), *ENGINE_FLAGS]) == 0
    out = capsys.readouterr().out
    assert out == str(comparison) + "\n"  # deterministic: the same bytes from the CLI and the API
    assert "stage 0" in out and "stage 1" in out and "+0.0%" in out and "real kept up, simulation kept up" in out


def test_the_comparison_is_of_the_same_requests_stage_by_stage(measured):
    comparison = specbatch.compare(measured, **{**ENGINE, "kv_cache_tokens": 60000, "max_batch_size": 32})
    samples = comparison.samples
    assert len(samples) == len(pd.read_csv(measured))
    for stage, part in samples.groupby("stage"):
        row = comparison.table[(comparison.table.stage == stage) & (comparison.table.metric == "e2e")
                               & (comparison.table.stat == "p90")].iloc[0]
        assert row.real == pytest.approx(np.percentile(part.real_e2e, 90))
    # ITL as the issue defines it: (E2E - TTFT) / (output - 1)
    frame = pd.read_csv(measured)
    itl = (frame.e2e_s - frame.ttft_s) / (frame.output_tokens - 1)
    assert samples.real_itl.to_numpy() == pytest.approx(itl.to_numpy())


def test_a_slower_engine_shows_as_a_positive_error(measured, tmp_path):
    slow = with_exposed_overhead(tmp_path / "slow", 0.002)
    comparison = specbatch.compare(measured, **{**ENGINE, "profile": str(slow)})
    assert (comparison.error("itl", "mean") > 0.05).all() and (comparison.error("e2e", "mean") > 0.05).all()


def specbatch_profile_path(name: str) -> Path:
    from sim.costmodel.profile import resolve_profile_path

    return resolve_profile_path(name)


def with_exposed_overhead(folder: Path, seconds: float) -> Path:
    """A copy of the shipped profile whose steps each cost ``seconds`` more (exposed overhead)."""
    shutil.copytree(specbatch_profile_path(PROFILE), folder)
    meta = json.loads((folder / "profile.json").read_text())
    meta["engine_overhead"]["exposed_overhead_s"] = seconds
    (folder / "profile.json").write_text(json.dumps(meta))
    return folder


def test_saturation_is_a_growing_ttft():
    t = np.linspace(0, 600, 601)
    assert not saturated(t, 0.05 + 0.01 * np.sin(t))  # steady, noisy
    assert saturated(t, 0.05 + 0.3 * t)  # the queue grows: 0.3 s more per second
    assert not saturated(t, 0.05 + 0.005 * t)  # below 1% of elapsed time: not called
    assert not saturated([1.0], [0.5])


# --------------------------------------------------------------------------------- fitting

def test_fit_recovers_a_known_exposed_overhead_and_tests_on_the_file_left_out(tmp_path, capsys):
    truth = with_exposed_overhead(tmp_path / "truth", 0.0008)
    files = [simulated_measurements(tmp_path / f"run{i}.csv", str(truth), rates=(3.0 + 3 * i,), seconds=6.0, seed=i)
             for i in range(2)]
    out = tmp_path / "fitted"
    assert main(["fit", "--profile", PROFILE, "--measured", *map(str, files), "--out", str(out),
                 *ENGINE_FLAGS[2:]]) == 0
    printed = capsys.readouterr().out
    fitted = json.loads((out / "profile.json").read_text())
    overhead = fitted["engine_overhead"]
    assert overhead["exposed_overhead_s"] == pytest.approx(0.0008, abs=3e-5)
    record = overhead["fitted"]
    shipped = json.loads((specbatch_profile_path(PROFILE) / "profile.json").read_text())["engine_overhead"]
    assert record["on"] == ["run0.csv", "run1.csv"]
    assert record["before"] == {"exposed_overhead_s": shipped.get("exposed_overhead_s", 0.0)}
    assert [f["left_out"] for f in record["leave_one_out"]] == ["run0.csv", "run1.csv"]
    assert record["test"]["mean_itl"] < 0.01 and record["train"]["mean_e2e"] < 0.01
    assert (out / "profile.csv").read_bytes() == (specbatch_profile_path(PROFILE) / "profile.csv").read_bytes()
    assert fitted["name"] == "fitted" and overhead["overlap"] == "async"
    assert "test on run0.csv" in printed and "exposed_overhead_s = 0.8" in printed
    # the fitted profile runs, and its overhead shows in `specbatch profiles`
    assert main(["profiles", str(out)]) == 0
    assert "fitted (specbatch fit)" in capsys.readouterr().out


@pytest.mark.parametrize("terms, needle", [("latency", "not an overhead term"),
                                           ("exposed_overhead_s,exposed_overhead_s", "twice")])
def test_fit_refuses_unknown_terms_before_any_work(tmp_path, capsys, measured, terms, needle):
    assert main(["fit", "--profile", PROFILE, "--measured", str(measured), "--out", str(tmp_path / "o"),
                 "--terms", terms]) == 2
    assert needle in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_fit_needs_measured_latencies(tmp_path, capsys):
    (tmp_path / "m.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,5,3\n")
    assert main(["fit", "--profile", PROFILE, "--measured", str(tmp_path / "m.csv"), "--out",
                 str(tmp_path / "o")]) == 2
    assert "ttft_s and e2e_s" in capsys.readouterr().err and not (tmp_path / "o").exists()
