"""Cost model: exact at measured points, linear between them, roofline-shaped beyond them."""

from __future__ import annotations

import json
import numpy as np
import pandas as pd
import pytest

from sim.costmodel import CostModel
from sim.profile import load_profile
from tests.synthetic import linear_latency, make_profile


def roofline_latency(phase, model, b, q, c):
    """A latency that *is* a roofline: memory-bound until the FLOPs catch up."""
    if phase == "decode":
        scale = 1.0 if model == "target" else 0.1
        return scale * max(0.02 + 2e-7 * b * c, 1e-3 * b * q + 1e-8 * b * q * c)
    return linear_latency(phase, model, b, q, c)


@pytest.fixture(scope="module")
def linear_model(tmp_path_factory):
    return CostModel(load_profile(make_profile(tmp_path_factory.mktemp("p") / "linear")))


@pytest.fixture(scope="module")
def roofline_model(tmp_path_factory):
    return CostModel(load_profile(make_profile(tmp_path_factory.mktemp("p") / "roof", roofline_latency)))


def test_speculative_step_is_k_drafts_plus_target_over_k_plus_1_plus_verify(linear_model):
    for b, k, c in [(1, 0, 128), (4, 3, 512), (32, 7, 2048), (8, 1, 1024)]:
        expected = (k * linear_latency("decode", "draft", b, 1, c) + linear_latency("decode", "target", b, k + 1, c)
                    + linear_latency("verify", "target", b, k, 0))
        assert linear_model.step_time(b, k, c) == pytest.approx(expected, rel=1e-9)


def test_interpolation_is_exact_for_costs_linear_between_grid_points(linear_model):
    rng = np.random.default_rng(0)
    b = rng.uniform(1, 32, 200)
    k = rng.integers(0, 8, 200)
    c = rng.uniform(128, 2048, 200)
    expected = (k * linear_latency("decode", "draft", b, 1, c) + linear_latency("decode", "target", b, k + 1, c)
                + linear_latency("verify", "target", b, k, 0))
    np.testing.assert_allclose(linear_model.step_times(b, k, c), expected, rtol=1e-9)


def test_prefill_adds_the_draft_only_when_speculating(linear_model):
    target = linear_latency("prefill", "target", 4, 512, 0)
    draft = linear_latency("prefill", "draft", 4, 512, 0)
    assert float(linear_model.prefill_times(4, 512, with_draft=False)) == pytest.approx(target)
    assert float(linear_model.prefill_times(4, 512, with_draft=True)) == pytest.approx(target + draft)


def test_extrapolation_recovers_a_true_roofline_far_beyond_the_grid(roofline_model):
    # The grid stops at batch 32 and context 2048; ask for 4x and 8x that.
    for b, c in [(64, 1024), (128, 2048), (32, 8192), (256, 16384)]:
        for q in (1, 4, 8):
            true = roofline_latency("decode", "target", b, q, c)
            got = float(roofline_model.decode_target(batch_size=b, query_tokens=q, context_tokens=c))
            assert got == pytest.approx(true, rel=0.02), (b, q, c)


def test_extrapolation_is_continuous_at_the_grid_edge_and_grows(roofline_model):
    curve = roofline_model.decode_target
    edge = float(curve(batch_size=32, query_tokens=4, context_tokens=2048))
    just_past = float(curve(batch_size=32.001, query_tokens=4, context_tokens=2048))
    assert just_past == pytest.approx(edge, rel=1e-4)
    values = curve(batch_size=np.array([32, 48, 64, 128, 256]), query_tokens=4, context_tokens=2048)
    assert np.all(np.diff(values) > 0)


def test_skipped_points_are_filled_from_the_fit(tmp_path):
    directory = make_profile(tmp_path / "holes", roofline_latency)
    csv = directory / "profile.csv"
    table = pd.read_csv(csv)
    hole = (table.phase == "decode") & (table.model == "target") & (table.batch_size == 16) & (
        table.context_tokens == 1024) & (table.query_tokens == 4)
    assert hole.sum() == 1
    table.loc[hole, "status"] = "oom"
    for col in [c for c in table.columns if c.startswith("latency_")]:
        table[col] = table[col].astype(object)
        table.loc[hole, col] = ""
    table.to_csv(csv, index=False)
    profile = load_profile(directory)
    assert len(profile.skipped) == 1
    got = float(CostModel(profile).decode_target(batch_size=16, query_tokens=4, context_tokens=1024))
    assert got == pytest.approx(roofline_latency("decode", "target", 16, 4, 1024), rel=0.03)


def test_step_table_agrees_with_exact_evaluation(roofline_model):
    table = roofline_model.tabulate(max_batch=64, k_max=5, max_context=5000, max_prompt=3000, with_draft=True)
    rng = np.random.default_rng(1)
    for _ in range(300):
        b, k, c = int(rng.integers(1, 65)), int(rng.integers(0, 6)), float(rng.uniform(0, 5000))
        exact = roofline_model.step_time(b, k, c)
        assert table.decode_time(b, k, c) == pytest.approx(exact, rel=5e-3)
        p = float(rng.uniform(1, 3000))
        exact_prefill = float(roofline_model.prefill_times(b, p, with_draft=True))
        assert table.prefill_time(b, p) == pytest.approx(exact_prefill, rel=5e-3)


def test_step_table_rows_become_lists_only_when_used(roofline_model):
    """A table's rows are made lists per batch size on first look-up (memory); their values are the
    array's, and what the cache stores is the array itself, visited rows or not."""
    table = roofline_model.tabulate(max_batch=64, k_max=3, max_context=5000, max_prompt=3000, with_draft=True)
    assert len(table.decode) == len(table.catch_up) == 0  # nothing converted yet
    before = table.arrays()
    t = table.decode_time_at_lag(7, 2, 1234.5, 5)
    assert set(table.decode) == set(table.catch_up) == {7} and len(table.decode_lag2) == 0
    assert table.decode[7] == before["decode"][7].tolist()
    assert t == table.decode_time(7, 2, 1234.5) + table.catch_up_time(7, 5, 1234.5)
    after = table.arrays()
    assert all(np.array_equal(before[name], after[name]) for name in ("decode", "catch_up", "decode_lag2"))
    assert after["decode"].shape == (65, 4, before["decode"].shape[2])


def test_range_warnings_name_the_axis_beyond_the_grid(linear_model):
    inside = linear_model.range_warnings(max_batch=32, k_max=7, max_context=2048, max_prompt=1024, with_draft=True)
    assert inside == []
    just_past = linear_model.range_warnings(max_batch=33, k_max=7, max_context=2100, max_prompt=1100,
                                            with_draft=True)
    assert just_past == []  # within 10% of the edge the extrapolation is negligible
    outside = linear_model.range_warnings(max_batch=128, k_max=3, max_context=8192, max_prompt=1024,
                                          with_draft=True)
    text = "\n".join(outside)
    assert "batch_size up to 128 is beyond the measured 32" in text
    assert "context_tokens up to 8192 is beyond the measured 2048" in text


def test_the_profiles_engine_overhead_is_charged_per_step(tmp_path):
    plain = CostModel(load_profile(make_profile(tmp_path / "plain")))
    with_overhead = make_profile(tmp_path / "overhead")
    meta_path = with_overhead / "profile.json"
    meta = json.loads(meta_path.read_text())
    meta["engine_overhead"] = {"decode_overhead_s": 0.004, "prefill_overhead_s": 0.007}
    meta_path.write_text(json.dumps(meta))
    charged = CostModel(load_profile(with_overhead))
    for b, k, c in ((1, 0, 128), (4, 3, 500), (16, 5, 900)):
        assert charged.step_time(b, k, c) == pytest.approx(plain.step_time(b, k, c) + 0.004)
    for with_draft in (False, True):
        assert float(charged.prefill_times(4, 100, with_draft)) == pytest.approx(
            float(plain.prefill_times(4, 100, with_draft)) + 0.007)
