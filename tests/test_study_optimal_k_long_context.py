"""Studies 1 (optimal k vs batch) and 4 (long-context speedup): core computations on hand-made costs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from sim.costmodel.model import CostModel
from sim.costmodel.profile import load_profile
from tests.synthetic import linear_latency, make_profile
from tests.test_costmodel import roofline_latency

STUDIES = Path(__file__).resolve().parents[1] / "docs" / "studies"


def _study(name):
    if str(STUDIES) not in sys.path:
        sys.path.insert(0, str(STUDIES))
    return importlib.import_module(name)


def kv_dominated_latency(phase, model, b, q, c):
    """MagicDec-style: target decode memory-bound on the KV cache at long context, cheap draft."""
    if phase == "decode":
        if model == "target":
            return max(0.010 + 1e-6 * b * c, 0.001 * b * q)
        return 0.006 + 1e-5 * b
    if phase == "verify":
        return 1e-6 * (q + 1)
    return linear_latency(phase, model, b, q, c)


@pytest.fixture(scope="module")
def roofline_dir(tmp_path_factory):
    return make_profile(tmp_path_factory.mktemp("p") / "roof", roofline_latency)


@pytest.fixture(scope="module")
def kv_dir(tmp_path_factory):
    return make_profile(tmp_path_factory.mktemp("p") / "kv", kv_dominated_latency, contexts=(256, 4096, 24000),
                        prompts=(32, 128, 512, 4096))


def test_optimal_k_falls_with_batch_on_a_roofline(roofline_dir):
    study = _study("optimal_k")
    result = study.analyse(CostModel(load_profile(roofline_dir)), alphas=(0.7, 0.9), max_batch=64)
    for alpha, sub in result["frame"].groupby("alpha"):
        ks = sub.sort_values("batch_size").best_k.to_numpy()
        assert all(a >= b for a, b in zip(ks, ks[1:])), f"best k must not rise with batch at alpha {alpha}"
        assert ks[0] > ks[-1]
    head = study.headline(result)
    assert head["grid_max_batch"] == 32 and head["max_batch_evaluated"] == 64
    assert head["alpha_0.9"]["best_k_b1"] >= head["alpha_0.7"]["best_k_b1"]
    # the table is build_lut's, covering 1..64 without gaps
    for table in result["tables"].values():
        assert table[0][0] == 1 and table[-1][1] == 64
        assert all(r[1] + 1 == s[0] for r, s in zip(table, table[1:]))
    assert result["frame"].extrapolated.sum() == 2 * 32  # batches 33..64 for each alpha


def test_long_context_speedup_falls_short_and_grows_long(kv_dir):
    study = _study("long_context")
    result = study.analyse(CostModel(load_profile(kv_dir)), alpha=0.8, contexts=(256, 4096, 24000),
                           batches=(1, 2, 4, 8, 16, 32, 64))
    trends = result["trends"].set_index("context_tokens").trend_best_k
    assert trends[256] <= 1.0 < trends[24000]
    s = result["s_inflection"]
    assert s is not None and 256 <= s <= 4096
    df = result["frame"]
    short = df[df.context_tokens == 256].sort_values("batch_size").speedup_best_k.to_numpy()
    long_ = df[df.context_tokens == 24000].sort_values("batch_size").speedup_best_k.to_numpy()
    assert short[-1] < short[0] and long_[-1] > long_[0]


def test_inflection_interpolates_where_the_trend_crosses_one():
    import pandas as pd
    study = _study("long_context")
    t = pd.DataFrame({"context_tokens": [1024, 4096], "trend_best_k": [0.5, 1.5]})
    assert study.inflection(t, "trend_best_k") == pytest.approx(2048)
    assert study.inflection(t.assign(trend_best_k=[0.5, 1.0]), "trend_best_k") is None


def test_optimal_k_run_writes_its_files(roofline_dir, tmp_path):
    head = _study("optimal_k").run(str(roofline_dir), tmp_path, simulate_batches=[4])
    for name in ("optimal_k.png", "optimal_k.csv", "optimal_k_lut.csv", "optimal_k_sim.csv"):
        assert (tmp_path / name).stat().st_size > 0
    assert [c["batch_size"] for c in head["sim_check"]] == [4]
    assert head["alpha_0.8"]["lut"][0][0] == 1


def test_long_context_run_writes_its_files(kv_dir, tmp_path):
    head = _study("long_context").run(str(kv_dir), tmp_path)
    for name in ("long_context.png", "long_context.csv", "long_context_sim.csv"):
        assert (tmp_path / name).stat().st_size > 0
    assert head["s_inflection_tokens"] is not None
    assert {r["policy"] for r in head["sim"]} == {"none", "lut", "context"}
