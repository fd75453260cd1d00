"""The profile format (sim/costmodel/profile.py): writing, loading, and precise errors for bad files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim.atomic_write as atomic_write_module
import sim.costmodel.profile as profile_module
from sim.errors import InputError
from sim.costmodel.profile import (COLUMNS, CSV_NAME, FORMAT_VERSION, META_NAME, load_profile, resolve_profile_path,
                         sort_points, write_profile)
from sim.atomic_write import write_file
from tests.synthetic import make_profile

SMALL = dict(batch=(1, 4), q_max=4, contexts=(128, 1024), prompts=(32, 256))


@pytest.fixture
def profile_dir(tmp_path) -> Path:
    return make_profile(tmp_path / "synthetic", **SMALL)


def _lines(directory: Path) -> list[str]:
    return (directory / CSV_NAME).read_text().splitlines()


def _set_lines(directory: Path, lines: list[str]) -> Path:
    (directory / CSV_NAME).write_text("\n".join(lines) + "\n")
    return directory / CSV_NAME


def _set_field(directory: Path, line: int, column: str, value: str) -> Path:
    """Replace one cell, addressed by 1-based file line and column name."""
    lines = _lines(directory)
    cells = lines[line - 1].split(",")
    cells[COLUMNS.index(column)] = value
    lines[line - 1] = ",".join(cells)
    return _set_lines(directory, lines)


def _load_error(directory: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_profile(directory)
    return info.value


def _meta(directory: Path) -> dict:
    return json.loads((directory / META_NAME).read_text())


# ---------------------------------------------------------------------------------------------- round trip


def _hand_points() -> pd.DataFrame:
    rows = []
    for phase, model, b, q, c in [("verify", "target", 2, 1, 0), ("prefill", "target", 1, 64, 0),
                                  ("decode", "target", 1, 2, 256), ("decode", "draft", 1, 1, 256),
                                  ("decode", "target", 1, 1, 256), ("verify", "target", 2, 0, 0),
                                  ("prefill", "draft", 1, 64, 0)]:
        t = 0.001 * (b + q) + 1e-6 * c
        rows.append({"phase": phase, "model": model, "batch_size": b, "query_tokens": q, "context_tokens": c,
                     "status": "ok", "samples": 7, "latency_median_s": t, "latency_mean_s": t * 1.01,
                     "latency_std_s": t / 10, "latency_p10_s": t * 0.9, "latency_p90_s": t * 1.1,
                     "latency_min_s": t * 0.8})
    rows.append({**rows[0], "batch_size": 64, "status": "oom", **{c: np.nan for c in COLUMNS
                                                                 if c.startswith("latency_")}})
    return pd.DataFrame(rows)


META = {"name": "hand", "device": {"name": "test"}, "dtype": "float16", "versions": {"torch": "x"},
        "models": {"target": {}, "draft": {}}, "grid": {"batch": [1, 2]}, "timing": {"method": "t"},
        "created_utc": "2026-01-01T00:00:00Z", "kv_capacity_tokens": 4096}


def test_write_then_load_round_trips_points_and_meta(tmp_path):
    points = _hand_points()
    write_profile(tmp_path / "p", META, points)
    loaded = load_profile(tmp_path / "p")
    assert loaded.meta == {"format_version": FORMAT_VERSION, **META}
    assert loaded.name == "hand" and loaded.kv_capacity_tokens == 4096
    expected = sort_points(points[points.status == "ok"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(loaded.points, expected, check_dtype=False, rtol=1e-8)
    assert loaded.points.batch_size.dtype == np.int64
    assert list(loaded.points.phase) == ["prefill", "prefill", "decode", "decode", "decode", "verify", "verify"]
    assert len(loaded.skipped) == 1 and loaded.skipped.batch_size.iloc[0] == 64


def test_write_profile_is_byte_identical_whatever_the_row_order(tmp_path):
    points = _hand_points()
    write_profile(tmp_path / "a", META, points)
    write_profile(tmp_path / "b", META, points.sample(frac=1.0, random_state=3))
    for name in (CSV_NAME, META_NAME):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_write_profile_rejects_meta_without_required_keys(tmp_path):
    meta = {k: v for k, v in META.items() if k != "timing"}
    with pytest.raises(ValueError, match="timing"):
        write_profile(tmp_path / "p", meta, _hand_points())
    assert not (tmp_path / "p" / CSV_NAME).exists()


def test_write_leaves_only_the_two_profile_files(tmp_path):
    directory = make_profile(tmp_path / "p", **SMALL)
    make_profile(directory, **SMALL)  # overwriting as well
    assert sorted(os.listdir(directory)) == sorted([CSV_NAME, META_NAME])


def test_failed_atomic_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "data.txt"
    target.write_text("old")

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(atomic_write_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        write_file(target, b"new contents")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["data.txt"]


# ---------------------------------------------------------------------------------------------- CSV errors


@pytest.mark.parametrize("line,column,value,message", [
    (5, "phase", "prefil", "'prefil' is not one of prefill, decode, verify"),
    (6, "model", "drafter", "not one of target, draft"),
    (7, "status", "fine", "not one of ok, oom, error"),
    (9, "latency_mean_s", "abc", "'abc' is not a non-negative number of seconds"),
    (10, "latency_p90_s", "", "not a non-negative number of seconds"),  # empty latency on an ok row
    (11, "latency_std_s", "-0.5", "not a non-negative number"),
    (12, "batch_size", "-2", "'-2' is not a non-negative integer"),
    (13, "samples", "2.5", "not a non-negative integer"),
    (14, "context_tokens", "many", "not a non-negative integer"),
    (15, "batch_size", "0", "must be at least 1 for a measured point"),
])
def test_bad_csv_cell_names_file_line_and_column(profile_dir, line, column, value, message):
    csv_path = _set_field(profile_dir, line, column, value)
    err = _load_error(profile_dir)
    assert (err.source, err.line, err.field) == (str(csv_path), line, column)
    assert message in err.message


def test_line_numbers_stay_exact_after_blank_lines(profile_dir):
    lines = _lines(profile_dir)
    lines[3:3] = ["", ""]  # lines 4 and 5 are blank; old line 9 is now line 11
    csv_path = _set_lines(profile_dir, lines)
    _set_field(profile_dir, 11, "latency_min_s", "x")
    err = _load_error(profile_dir)
    assert (err.source, err.line, err.field) == (str(csv_path), 11, "latency_min_s")


def test_blank_lines_alone_are_harmless(profile_dir):
    before = load_profile(profile_dir).points
    lines = _lines(profile_dir)
    lines[5:5] = [""]
    _set_lines(profile_dir, lines + [""])
    pd.testing.assert_frame_equal(load_profile(profile_dir).points, before)


def test_duplicate_point_names_the_second_occurrence(profile_dir):
    lines = _lines(profile_dir)
    lines.insert(6, lines[2])  # the row of line 3 again, as line 7
    csv_path = _set_lines(profile_dir, lines)
    err = _load_error(profile_dir)
    assert (err.source, err.line, err.field) == (str(csv_path), 7, "phase")
    assert "duplicate measured point" in err.message


def test_missing_column_is_reported_on_line_one(profile_dir):
    table = pd.read_csv(profile_dir / CSV_NAME, dtype=str, keep_default_na=False)
    table.drop(columns=["latency_p90_s"]).to_csv(profile_dir / CSV_NAME, index=False)
    err = _load_error(profile_dir)
    assert (err.source, err.line, err.field) == (str(profile_dir / CSV_NAME), 1, "latency_p90_s")


@pytest.mark.parametrize("phase,model", [("verify", "target"), ("decode", "draft"), ("prefill", "target"),
                                         ("prefill", "draft"), ("decode", "target")])
def test_missing_required_phase_names_the_phase(profile_dir, phase, model):
    lines = _lines(profile_dir)
    _set_lines(profile_dir, [ln for ln in lines if not ln.startswith(f"{phase},{model},")])
    err = _load_error(profile_dir)
    assert err.source == str(profile_dir / CSV_NAME)
    assert f"no measured '{phase}' points for the {model} model" in err.message


def test_required_phase_present_only_as_oom_rows_is_still_missing(profile_dir):
    lines = _lines(profile_dir)
    cells = [ln.split(",") for ln in lines]
    s, lat = COLUMNS.index("status"), [COLUMNS.index(c) for c in COLUMNS if c.startswith("latency_")]
    for row in cells[1:]:
        if row[0] == "verify":
            row[s] = "oom"
            for i in lat:
                row[i] = ""
    _set_lines(profile_dir, [",".join(row) for row in cells])
    assert "'verify'" in _load_error(profile_dir).message


def test_oom_rows_with_empty_latency_are_accepted_and_skipped(profile_dir):
    before = load_profile(profile_dir)
    empty = [""] * len([c for c in COLUMNS if c.startswith("latency_")])
    extra = [",".join(["decode", "target", "512", "1", "1024", "oom", "0", *empty]),
             ",".join(["prefill", "draft", "512", "256", "0", "error", "0", *empty])]
    _set_lines(profile_dir, _lines(profile_dir) + extra)
    loaded = load_profile(profile_dir)
    assert len(loaded.points) == len(before.points)
    assert list(loaded.skipped.status) == ["oom", "error"]
    assert list(loaded.skipped.batch_size) == [512, 512]
    assert loaded.skipped.latency_median_s.isna().all()
    assert 512 not in set(loaded.points.batch_size)


def test_oom_row_with_a_non_numeric_latency_is_still_an_error(profile_dir):
    lines = _lines(profile_dir)
    lines.append(",".join(["decode", "target", "512", "1", "1024", "oom", "0", "x", "", "", "", "", ""]))
    csv_path = _set_lines(profile_dir, lines)
    err = _load_error(profile_dir)
    assert (err.source, err.line, err.field) == (str(csv_path), len(lines), "latency_median_s")


# ---------------------------------------------------------------------------------------------- JSON errors


@pytest.mark.parametrize("key", ["device", "format_version", "created_utc", "grid"])
def test_missing_meta_key_is_named(profile_dir, key):
    meta = _meta(profile_dir)
    del meta[key]
    (profile_dir / META_NAME).write_text(json.dumps(meta, indent=2))
    err = _load_error(profile_dir)
    assert (err.source, err.field) == (str(profile_dir / META_NAME), key)
    assert "missing key" in err.message


def test_bad_json_reports_the_line(profile_dir):
    (profile_dir / META_NAME).write_text('{\n  "device": "x",\n  oops\n}\n')
    err = _load_error(profile_dir)
    assert (err.source, err.line) == (str(profile_dir / META_NAME), 3)
    assert "not valid JSON" in err.message


def test_json_that_is_not_an_object_is_rejected(profile_dir):
    (profile_dir / META_NAME).write_text("[1, 2]\n")
    assert "expected a JSON object" in _load_error(profile_dir).message


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, "1", 0])
def test_unsupported_format_version_is_rejected(profile_dir, version):
    meta = _meta(profile_dir)
    meta["format_version"] = version
    (profile_dir / META_NAME).write_text(json.dumps(meta))
    err = _load_error(profile_dir)
    assert (err.source, err.field) == (str(profile_dir / META_NAME), "format_version")
    assert "unsupported format version" in err.message


@pytest.mark.parametrize("name", [CSV_NAME, META_NAME])
def test_missing_profile_file_is_named(profile_dir, name):
    (profile_dir / name).unlink()
    err = _load_error(profile_dir)
    assert name in err.message and err.source == str(profile_dir)


# ---------------------------------------------------------------------------------------------- k_max, paths


def _rewrite(src: Path, dst: Path, keep) -> Path:
    loaded = load_profile(src)
    return write_profile(dst, {k: v for k, v in loaded.meta.items() if k != "format_version"},
                         loaded.points[keep(loaded.points)])


def test_k_max_is_the_smaller_of_target_q_minus_one_and_verify_k(tmp_path):
    full = make_profile(tmp_path / "full", **{**SMALL, "q_max": 6})
    assert load_profile(full).k_max == 5  # target q 1..6, verify k 0..5
    short_verify = _rewrite(full, tmp_path / "v", lambda p: ~((p.phase == "verify") & (p.query_tokens > 3)))
    assert load_profile(short_verify).k_max == 3
    short_target = _rewrite(full, tmp_path / "t", lambda p: ~((p.phase == "decode") & (p.model == "target")
                                                               & (p.query_tokens > 2)))
    assert load_profile(short_target).k_max == 1


def test_profile_can_be_named_by_its_csv_or_json_file(profile_dir):
    assert resolve_profile_path(profile_dir / CSV_NAME) == profile_dir
    assert resolve_profile_path(profile_dir / META_NAME) == profile_dir
    assert load_profile(str(profile_dir / CSV_NAME)).path == profile_dir


class _FakeResources:
    def __init__(self, root: Path):
        self.root = root

    def files(self, package):
        assert package == "sim"
        return self.root


def test_unknown_profile_error_lists_the_shipped_names(tmp_path, monkeypatch):
    root = tmp_path / "pkg"
    make_profile(root / "profiles" / "gpu-b", **SMALL)
    make_profile(root / "profiles" / "gpu-a", **SMALL)
    (root / "profiles" / "not-a-profile").mkdir()
    monkeypatch.setattr(profile_module, "resources", _FakeResources(root))
    with pytest.raises(InputError) as info:
        resolve_profile_path("no-such-gpu")
    err = info.value
    assert err.field == "profile"
    assert "'no-such-gpu'" in err.message and "(shipped: gpu-a, gpu-b)" in err.message
    assert load_profile("gpu-a").path == root / "profiles" / "gpu-a"  # a shipped name resolves


def test_unknown_profile_error_says_none_when_nothing_ships(tmp_path, monkeypatch):
    (tmp_path / "profiles").mkdir()
    monkeypatch.setattr(profile_module, "resources", _FakeResources(tmp_path))
    with pytest.raises(InputError, match="shipped: none"):
        resolve_profile_path("missing")
