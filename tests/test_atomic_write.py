"""sim/atomic_write.py: whole or absent, by the umask, nothing left behind on failure."""

from __future__ import annotations

import os
import stat

import pytest

from sim.atomic_write import staged_dir, staged_file, write_file


def test_write_file_replaces_whole_with_umask_permissions(tmp_path):
    target = tmp_path / "sub" / "a.txt"
    write_file(target, "one")
    write_file(target, b"two")
    assert target.read_text() == "two" and os.listdir(target.parent) == ["a.txt"]
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask


def test_keep_mode_keeps_the_old_files_permissions(tmp_path):
    target = tmp_path / "baseline.toml"
    target.write_text("old")
    target.chmod(0o640)
    write_file(target, "new", keep_mode=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640 and target.read_text() == "new"


def test_a_failed_staged_file_leaves_the_old_file_and_no_staging(tmp_path):
    target = tmp_path / "t.csv"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with staged_file(target) as staging:
            staging.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["t.csv"]


def test_staged_dir_replaces_a_folder_whole_or_not_at_all(tmp_path):
    out = tmp_path / "run"
    with staged_dir(out) as staging:
        (staging / "a").write_text("1")
    with pytest.raises(RuntimeError):
        with staged_dir(out) as staging:
            (staging / "b").write_text("2")
            raise RuntimeError("killed")
    assert os.listdir(out) == ["a"] and os.listdir(tmp_path) == ["run"]
    with staged_dir(out) as staging:
        (staging / "b").write_text("2")
    assert os.listdir(out) == ["b"] and os.listdir(tmp_path) == ["run"]
