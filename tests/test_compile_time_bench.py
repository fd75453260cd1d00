"""benchmarks/compile_time.py: its table names every warm-up run and each entry point it compiled."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import load_script


def _bench():
    """benchmarks/compile_time.py as a module (a script: it imports alternate.py from its own folder)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        return load_script("benchmarks/compile_time.py", "compile_time_bench")
    finally:
        sys.path.pop(0)
        sys.modules.pop("compile_time_bench", None)


def test_the_table_has_a_line_per_warm_up_run_with_its_entry_points_and_the_total():
    bench = _bench()
    rows = [{"run": {}, "s": 118.04, "made": [{"entry": "sim.serving.kernel.run_steps", "s": 116.0, "llvm_s": 26.1}]},
            {"run": {"engine.scheduler": "v0"}, "s": 0.6, "made": []}]
    text = bench.lines(rows)
    assert "empty compiled-code cache" in text[0]
    assert text[2].startswith("{}") and "118.0s" in text[2] and "kernel.run_steps 116 (26)" in text[2]
    assert text[3].startswith('{"engine.scheduler": "v0"}') and text[3].endswith("-")
    assert text[-1].startswith("all") and "118.6s" in text[-1]


def test_against_puts_the_code_before_beside_each_run_by_its_settings_and_says_the_ratio():
    bench = _bench()
    rows = [{"run": {}, "s": 30.0, "made": []}, {"run": {"policy.name": "goodput"}, "s": 10.0, "made": []}]
    before = [{"run": {"policy.name": "goodput"}, "s": 20.0, "made": []}, {"run": {}, "s": 100.0, "made": []}]  # another order
    text = bench.lines(rows, before, "abc1234", machine="MACHINE")
    assert text[0] == "MACHINE" and " before " in text[1]
    assert text[2].startswith("{}") and "30.0s  100.0s" in text[2]
    assert text[3].startswith('{"policy.name": "goodput"}') and "10.0s   20.0s" in text[3]
    assert text[-1].startswith("all") and "40.0s  120.0s   3.00x faster" in text[-1] and "(abc1234)" in text[-1]
    missing = bench.lines(rows + [{"run": {"x": 1}, "s": 1.0, "made": []}], before, "abc1234", machine="M")
    assert missing[4].startswith('{"x": 1}') and "1.0s       -" in missing[4]


def test_against_a_folder_that_is_not_a_checkout_is_one_error_before_any_compiling(tmp_path, monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(bench, "compile_runs", lambda checkout: (_ for _ in ()).throw(AssertionError("compiled")))
    monkeypatch.setattr(sys, "argv", ["compile_time.py", "--against", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        bench.main()
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"--against {tmp_path}: not a checkout of specbatch "
                                                            "(no sim/warm.py there)")
