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
