"""benchmarks/overhead_by_batch.py: the engine overhead's table and line through the batch sizes, and its
inputs refused in one line (the measuring itself needs the profile's device: the replay's tests cover it)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("benchmarks/overhead_by_batch.py", "overhead_by_batch")


def record(batch: int, decode_ms: float) -> dict:
    return {"batch_size": batch, "steps": 60, "decode_overhead_s": decode_ms / 1e3, "prefill_overhead_s": 5e-4,
            "decode_between_steps_s": decode_ms / 2e3}


def test_the_table_fits_the_line_through_the_decode_overheads(script, tmp_path, capsys):
    doc = {"profile": "/x/h200-graphs", "k": 3, "records": [record(b, 0.8 + 0.05 * b) for b in (1, 2, 4, 8, 16)]}
    path = tmp_path / "o.json"
    path.write_text(json.dumps(doc))
    assert script.main(["table", str(path)]) == 0
    text = capsys.readouterr().out
    assert "k = 3; h200-graphs" in text
    assert "decode overhead ~ 0.800 ms + 0.0500 ms x rows (least squares, all)" in text
    assert text.strip().endswith("decode overhead ~ 0.800 ms + 0.0500 ms x rows (least squares, calibration's 1, 4, 16)")
    assert "    16     60      1.600                   0.800       0.500" in text


def test_bad_batches_or_a_missing_file_is_one_line(script, tmp_path, capsys):
    assert script.main(["measure", "--profile", "p", "--batches", "1,two", "--out", str(tmp_path / "o")]) == 2
    assert script.main(["table", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("overhead_by_batch: ") for line in err)


def test_a_profile_refitted_from_a_sweep_prices_the_rows_as_calibration_now_measures_them(script, tmp_path, capsys):
    from sim.costmodel.profile import load_profile

    doc = {"profile": "x", "k": 3, "records": [record(b, 0.8 + 0.05 * b) for b in (1, 2, 4, 8, 16)]}
    doc["records"][1]["decode_overhead_s"] = 9e-3  # batch 2: not one calibration replays at, so not fitted
    path = tmp_path / "o.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "refit"
    assert script.main(["profile", str(path), "--profile", "cpu-llama-160m-llama-68m", "--out", str(out)]) == 0
    profile = load_profile(out)
    # the CPU profile's grid tops out at 8 rows: calibration replays at 1, 4 and 8
    assert profile.engine_overhead_s("decode") == pytest.approx(0.8e-3)
    assert profile.engine_overhead_per_row_s("decode") == pytest.approx(0.05e-3)
    assert [r["batch_size"] for r in profile.meta["engine_overhead"]["by_batch"]] == [1, 4, 8]
    assert "0.800 ms + 0.0500 ms x rows" in capsys.readouterr().out
    from specbatch.commands.cli import main as specbatch

    assert specbatch(["profiles", str(out)]) == 0
    assert ("overhead     0.80 ms per decode step + 0.050 ms per running row, 0.50 ms per prefill step "
            "(measured by short replays at several batch sizes)") in capsys.readouterr().out
    doc["records"] = doc["records"][:2]  # no replay at 4 or 8 rows: refused in one line
    path.write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="no replay at batch 4, 8"):
        script.main(["profile", str(path), "--profile", "cpu-llama-160m-llama-68m", "--out", str(out)])
