"""End to end on the CPU with tiny models: profile written, resume, oom skipping, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")

import calibrate.runner as runner  # noqa: E402
from calibrate import memory  # noqa: E402
from calibrate.cli import main  # noqa: E402
from calibrate.configs import get_config  # noqa: E402
from calibrate.partial import PARTIAL_CSV, PARTIAL_JSON  # noqa: E402
from sim.costmodel.profile import CSV_NAME, META_NAME, REQUIRED_META, load_profile  # noqa: E402

TINY = ["--target", "tiny-llama", "--draft", "tiny-opt", "--device", "cpu", "--batch-sizes", "1,2",
        "--k-max", "2", "--contexts", "16,32", "--prompts", "8", "--warmup", "0", "--repeats", "1", "--quiet"]
N_POINTS = 4 + 12 + 12 + 6  # prefill 2 models x 2 batches, draft decode 2x3x2 (q 1..3), target decode 2x3x2, verify 2x3


def test_end_to_end_profile_is_loadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prof"
    assert main([*TINY[:-1], "--out", str(out)]) == 0  # not quiet: prints the summary
    printed = capsys.readouterr().out
    assert "measured" in printed and str(out) in printed
    profile = load_profile(out)
    assert len(profile.points) == N_POINTS and profile.k_max == 2
    assert sorted(p.name for p in out.iterdir()) == [CSV_NAME, META_NAME]  # partial files are gone
    meta = profile.meta
    assert set(REQUIRED_META) <= set(meta)
    assert meta["name"] == "cpu-tiny-llama-tiny-opt" and meta["dtype"] == "float32"
    assert meta["timing"]["method"] == "perf_counter" and meta["timing"]["cuda_graphs"] == []
    assert meta["models"]["target"]["config"]["num_kv_heads"] == 2 and meta["kv_capacity_tokens"] > 0
    assert meta["device"]["type"] == "cpu" and meta["versions"]["torch"] and meta["skipped"] == []
    assert (profile.points.latency_median_s > 0).all()


def test_resume_does_not_remeasure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prof"
    real, calls = runner._measure, []

    def interrupted(point, *args, **kwargs):  # Ctrl-C while measuring the 6th point
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(point.key)
        return real(point, *args, **kwargs)

    monkeypatch.setattr(runner, "_measure", interrupted)
    assert main([*TINY, "--out", str(out)]) == 130
    assert "resume" in capsys.readouterr().err
    first = pd.read_csv(out / PARTIAL_CSV)
    assert len(first) == 5 and (out / PARTIAL_JSON).is_file() and not (out / CSV_NAME).exists()

    def counting(point, *args, **kwargs):
        calls.append(point.key)
        return real(point, *args, **kwargs)

    monkeypatch.setattr(runner, "_measure", counting)
    assert main([*TINY, "--out", str(out)]) == 0
    assert len(calls) == N_POINTS and len(set(calls)) == N_POINTS  # 5 before, the other 29 now
    final = pd.read_csv(out / CSV_NAME)
    merged = first.merge(final, on=["phase", "model", "batch_size", "query_tokens", "context_tokens"])
    assert len(merged) == 5
    assert (merged.latency_median_s_x - merged.latency_median_s_y).abs().max() < 1e-12  # kept, not redone


def test_resume_with_other_settings_needs_fresh(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prof"
    out.mkdir()
    (out / PARTIAL_JSON).write_text(json.dumps({"settings": {"target": "opt-125m"}}))
    (out / PARTIAL_CSV).write_text("garbage\n")
    assert main([*TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "--fresh" in err and len(err.splitlines()) == 1
    assert not (out / CSV_NAME).exists()
    assert main([*TINY, "--out", str(out), "--fresh"]) == 0
    assert load_profile(out).meta["models"]["target"]["name"] == "tiny-llama"


def test_points_that_do_not_fit_are_skipped_as_oom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "prof"
    total = 1 << 30
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: total)
    resident = memory.resident_bytes(get_config("tiny-llama"), get_config("tiny-opt"), "float32", "cpu")
    fraction = (resident + 3_000_000) / total  # room for the small points only
    argv = [*TINY, "--batch-sizes", "1,64", "--contexts", "16,1024", "--out", str(out),
            "--memory-fraction", f"{fraction:.9f}"]
    assert main(argv) == 0
    profile = load_profile(out)
    skipped = profile.skipped
    assert len(skipped) > 0 and set(skipped.status) == {"oom"}
    assert (skipped.batch_size == 64).all()
    assert ((profile.points.batch_size == 1) & (profile.points.context_tokens == 16)).any()
    reasons = profile.meta["skipped"]
    assert len(reasons) == len(skipped) and "MiB" in reasons[0]["reason"]


def test_nothing_fits_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prof"
    assert main([*TINY, "--out", str(out), "--memory-fraction", "1e-9"]) == 1
    assert "no measured" in capsys.readouterr().err
    table = pd.read_csv(out / CSV_NAME)
    assert len(table) == N_POINTS and (table.status == "oom").all()


@pytest.mark.parametrize("argv, field", [
    (["--target", "gpt-9"], "target"),
    (["--draft", "nope"], "draft"),
    (["--contexts", "4000"], "contexts"),
    (["--memory-fraction", "0"], "memory_fraction"),
    (["--batch-sizes", "1,x"], "batch-sizes"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  argv: list[str], field: str) -> None:
    out = tmp_path / "never"
    assert main(["--device", "cpu", "--out", str(out), *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0]
    assert captured.out == "" and not out.exists()


def test_list_models_needs_no_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list-models"]) == 0
    assert "tinyllama-1.1b" in capsys.readouterr().out


def test_a_failing_point_is_recorded_as_error_and_the_run_goes_on(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "prof"
    real = runner.build_pass

    def flaky(point, *args, **kwargs):
        if point.phase == "decode" and point.model == "target" and point.batch_size == 2:
            raise ValueError("boom")
        return real(point, *args, **kwargs)

    monkeypatch.setattr(runner, "build_pass", flaky)
    assert main([*TINY, "--out", str(out)]) == 0
    profile = load_profile(out)
    assert len(profile.skipped) == 6 and set(profile.skipped.status) == {"error"}
    assert profile.meta["skipped"][0]["reason"] == "ValueError: boom"
    assert len(profile.points) == N_POINTS - 6


def test_calibration_needs_only_torch_numpy_pandas(tmp_path, monkeypatch, capsys):
    # The engine-overhead replay needs the simulator's packages; without them the grid is
    # still measured and the profile written, and the overhead is skipped with a warning.
    import sys

    for name in ("simpy", "tomli_w", "calibrate.replay", "sim.config", "sim.simulate", "sim.serving.loop"):
        monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "prof"
    assert main([*TINY[:-1], "--out", str(out), "--quiet"]) == 0
    assert "engine overhead not measured" in capsys.readouterr().err
    meta = json.loads((out / "profile.json").read_text())
    assert "not measured" in meta["engine_overhead"]["error"]
    assert load_profile(out).engine_overhead_s("decode") == 0.0
