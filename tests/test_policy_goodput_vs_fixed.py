"""benchmarks/goodput_vs_fixed.py: goodput against the best of none and fixed k (issue 41, item 6).

The committed results must show the issue's bar on the issue's grid; a small run of the script
checks what it measures; its linear profile is tests/test_tune.py's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    module = load_script("benchmarks/goodput_vs_fixed.py", "goodput_vs_fixed")
    yield module


def test_the_committed_results_meet_the_bar_on_the_issues_grid(bench):
    doc = json.loads(bench.RESULTS.read_text())
    cases = doc["cases"]
    for profile in ("linear", "h100"):
        for scheduler in ("vllm-v1", "v0"):
            mine = [c for c in cases if c["profile"] == profile and c["scheduler"] == scheduler]
            loads = {c["load"] for c in mine}
            assert min(loads) <= 0.1 and max(loads) >= 0.9 and len(loads) >= 5, (profile, scheduler, loads)
            for case in mine:
                assert len(case["seeds"]) >= 3
                assert set(case["seeds"][0]["mean_e2el_ms"]) >= {"none", "goodput", *(f"k={k}" for k in range(1, 8))}
                s = bench.summarise(case)
                assert s["vs_best"] <= doc["bar"], (profile, scheduler, case["load"], s)
    for case in (c for c in cases if c["profile"] == "gpu-like"):  # none wins there only by the draft's prefill
        s = bench.summarise(case)
        assert s["vs_kept"] <= doc["bar"], (case["scheduler"], case["load"], s)


def test_a_small_run_measures_what_the_table_says(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "REQUESTS", 150)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the runs load goodput_vs_fixed:DraftIdle
    doc = bench.measure(["gpu-like"], ["v0"], [0.7], [0], tmp_path, progress=lambda m: None)
    (case,) = doc["cases"]
    (cell,) = case["seeds"]
    e2el = cell["mean_e2el_ms"]
    assert set(e2el) == {"none", "draft-idle", "goodput", *(f"k={k}" for k in range(1, 8))}
    # draft-idle runs none's steps and pays the draft's prefill besides: never faster
    assert e2el["draft-idle"] > e2el["none"]
    assert 0.0 <= cell["k0_share"] <= 1.0 and 0.0 < cell["mean_k"] <= 4.0
    s = bench.summarise(case)
    assert s["vs_best"] == pytest.approx(e2el["goodput"] / min(v for k, v in e2el.items()
                                                                  if k not in ("goodput", "draft-idle")) - 1)
    table = bench.table(doc)
    assert f"| gpu-like | v0 | 70% | {e2el['goodput'] / 1e3:.3f} |" in table


def test_the_linear_profile_is_test_tunes():
    from tests.test_tune import linear_latency

    bench = load_script("benchmarks/goodput_vs_fixed.py", "goodput_vs_fixed_profile")
    for phase in ("prefill", "decode", "verify"):
        for model in ("target", "draft"):
            for b, q, c in [(1, 1, 0), (8, 3, 512), (64, 8, 2048)]:
                assert math.isclose(bench.linear_latency(phase, model, b, q, c), linear_latency(phase, model, b, q, c),
                                    rel_tol=1e-12)
