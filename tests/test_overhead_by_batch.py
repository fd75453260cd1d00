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
    assert text.strip().endswith("decode overhead ~ 0.800 ms + 0.0500 ms x rows (least squares)")
    assert "    16     60      1.600                   0.800       0.500" in text


def test_bad_batches_or_a_missing_file_is_one_line(script, tmp_path, capsys):
    assert script.main(["measure", "--profile", "p", "--batches", "1,two", "--out", str(tmp_path / "o")]) == 2
    assert script.main(["table", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("overhead_by_batch: ") for line in err)
