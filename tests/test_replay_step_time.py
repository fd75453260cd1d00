"""benchmarks/replay_step_time.py: a GPU validation's decode steps taken apart (docs/validation.md), on
hand-made records with known answers and on the shipped H200 records."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "benchmarks" / "results" / "validation-gpu-h200-records"
PROFILE = ROOT / "benchmarks" / "results" / "h200-graphs-llama-3.1-8b-llama-3.2-1b"


@pytest.fixture(scope="module")
def script():
    return load_script("benchmarks/replay_step_time.py", "replay_step_time")


def case(folder: Path, rows: list[tuple[str, int, float, float, float]]) -> None:
    """(group, batch, price incl. overhead, measured step, measured passes) per step, in seconds."""
    folder.mkdir(parents=True)
    pd.DataFrame(rows, columns=["group", "batch_size", "predicted_s", "measured_s", "measured_passes_s"]).to_csv(
        folder / "step_costs.csv", index=False)


def test_known_steps_give_known_speed_and_time_outside(script, tmp_path):
    overhead = 1e-3
    # passes priced 10 ms each (11 ms with the overhead); measured 10.5 and 11 ms: speed 1.075 over the two
    # decode steps; outside the passes 1 ms (2 rows) and 2 ms (14 rows); the prefill is left out
    case(tmp_path / "a", [("prefill", 1, 0.02, 0.03, 0.025), ("decode k=3", 2, 0.011, 0.0115, 0.0105),
                          ("decode k=3", 14, 0.011, 0.013, 0.011)])
    text = script.tables(tmp_path, lambda rows: overhead + 0 * rows, "p")
    first = text.splitlines()[2].split()
    assert first == ["a", "2", "1.075", "1.500", "1.500", "50%"]
    # a profile that charges part of its overhead per row: each step's own is taken off its price
    per_row = script.tables(tmp_path, lambda rows: 0.0005 + 0.0005 / 8 * rows, "p").splitlines()
    assert per_row[0].endswith("against the 0.56 (1 row) to 1.50 ms (16 rows) the profile charges (p)")
    assert per_row[2].split()[2] == f"{0.0215 / (0.022 - 0.0005 * 2 - 0.0005 / 8 * 16):.3f}"
    by_rows = text.splitlines()[-1]
    assert by_rows.split() == ["a", "1.000", "(1)", "-", "-", "2.000", "(1)"]


def test_the_shipped_h200_records_show_the_overhead_growing_with_the_rows(script, capsys):
    assert script.main(["--from", str(SHIPPED), "--profile", str(PROFILE)]) == 0
    text = capsys.readouterr().out
    assert "against the 0.97 ms the profile charges" in text
    rows = [line.split() for line in text.split("\n\n")[1].splitlines()[2:]]
    assert len(rows) == 4
    for row in rows:  # the median outside the passes rises from the smallest steps to the largest measured
        medians = [float(x) for x in row[1::2] if x != "-"]
        assert medians[-1] > medians[0]


def test_a_missing_records_folder_or_profile_is_one_line(script, tmp_path, capsys):
    assert script.main(["--from", str(tmp_path / "none"), "--profile", str(PROFILE)]) == 2
    assert script.main(["--from", str(SHIPPED), "--profile", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("replay_step_time: ") for line in err)


def test_passes_by_kind_are_read_from_each_cases_validation_json(script, tmp_path):
    import json

    case(tmp_path / "a", [("decode k=3", 2, 0.011, 0.0115, 0.0105)])
    kinds = {"draft": {"passes": 4, "span_s": 0.008, "graph_s": 0.0076}, "target": {"passes": 0, "span_s": 0.0,
                                                                                     "graph_s": 0.0}}
    (tmp_path / "a" / "validation.json").write_text(json.dumps({"replay": {"cuda_graphs": {"passes_by_kind": kinds}}}))
    text = script.tables(tmp_path, lambda rows: 1e-3 + 0 * rows, "p")
    last = text.splitlines()[-1].split()
    assert last[:4] == ["a", "2.000", "/", "1.900"] and last[4:] == ["-"] * 4  # a kind with no passes shows none
    case(tmp_path / "b", [("decode k=3", 2, 0.011, 0.0115, 0.0105)])  # an older case: no such record
    assert script.passes_by_kind(tmp_path / "b") == {}
