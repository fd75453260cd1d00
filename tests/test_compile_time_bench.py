"""benchmarks/compile_time.py: its table names every warm-up run and each entry point it compiled."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import load_script


def test_the_table_has_a_line_per_warm_up_run_with_its_entry_points_and_the_total():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # it imports alternate.py
    try:
        bench = load_script("benchmarks/compile_time.py", "compile_time_bench")
    finally:
        sys.path.pop(0)
        sys.modules.pop("compile_time_bench", None)
    rows = [{"run": {}, "s": 118.04, "made": [{"entry": "sim.serving.kernel.run_steps", "s": 116.0, "llvm_s": 26.1}]},
            {"run": {"engine.scheduler": "v0"}, "s": 0.6, "made": []}]
    text = bench.lines(rows)
    assert "empty compiled-code cache" in text[0]
    assert text[2].startswith("{}") and "118.0s" in text[2] and "kernel.run_steps 116 (26)" in text[2]
    assert text[3].startswith('{"engine.scheduler": "v0"}') and text[3].endswith("-")
    assert text[-1].startswith("all") and "118.6s" in text[-1]


def test_against_puts_the_code_before_beside_each_run_by_its_settings_and_says_the_ratio():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        bench = load_script("benchmarks/compile_time.py", "compile_time_bench")
    finally:
        sys.path.pop(0)
        sys.modules.pop("compile_time_bench", None)
    rows = [{"run": {}, "s": 30.0, "made": []}, {"run": {"policy.name": "goodput"}, "s": 10.0, "made": []}]
    before = [{"run": {"policy.name": "goodput"}, "s": 20.0, "made": []}, {"run": {}, "s": 100.0, "made": []}]  # another order
    text = bench.lines(rows, before, "abc1234", machine="MACHINE")
    assert text[0] == "MACHINE" and " before " in text[1]
    assert text[2].startswith("{}") and "30.0s  100.0s" in text[2]
    assert text[3].startswith('{"policy.name": "goodput"}') and "10.0s   20.0s" in text[3]
    assert text[-1].startswith("all") and "40.0s  120.0s   3.00x faster" in text[-1] and "(abc1234)" in text[-1]
    missing = bench.lines(rows + [{"run": {"x": 1}, "s": 1.0, "made": []}], before, "abc1234", machine="M")
    assert missing[4].startswith('{"x": 1}') and "1.0s       -" in missing[4]
