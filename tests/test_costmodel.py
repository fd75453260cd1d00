"""Cost model: exact at measured points, linear between them, roofline-shaped beyond them."""

from __future__ import annotations

import json
import numpy as np
import pandas as pd
import pytest

from sim.costmodel.model import CostModel
from sim.costmodel.profile import load_profile
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


def test_a_curve_evaluates_a_repeated_point_once_with_the_values_of_whole_arrays(roofline_model):
    """Broadcast coordinates (a step table's grid) repeat their points along an axis none of them varies
    on; those are evaluated once, and the values are, to the bit, those of the same points given as whole
    arrays, inside the grid and beyond it (extrapolated)."""
    curve = roofline_model.decode_target
    b = np.arange(1, 600, 7, dtype=float)[:, None, None]  # past the grid's largest batch too
    q = np.array([1.0, 2.0, 5.0])[None, :, None]
    c = np.linspace(16, 9000, 40)[None, None, :]
    evaluated = []
    interpolator = curve._interpolator()
    curve._interp = lambda points: evaluated.append(len(points)) or interpolator(points)
    try:
        repeated = curve(batch_size=b, query_tokens=np.broadcast_to(1.0, q.shape), context_tokens=c)  # q = 1 throughout
        whole = curve(batch_size=np.broadcast_to(b, (b.size, 3, c.size)).copy(),
                      query_tokens=np.ones((b.size, 3, c.size)), context_tokens=np.broadcast_to(c, (b.size, 3, c.size)).copy())
    finally:
        curve._interp = interpolator
    assert evaluated == [b.size * c.size, b.size * 3 * c.size]
    assert repeated.shape == whole.shape and repeated.tobytes() == whole.tobytes()
    assert repeated.flags.c_contiguous and repeated.flags.writeable
    assert curve(batch_size=b, query_tokens=q, context_tokens=c).shape == whole.shape  # q varies: no point repeats


def test_a_step_tables_values_do_not_depend_on_how_its_grid_is_laid_out(roofline_model):
    """The table's decode times are, to the bit, those of every point of its grid evaluated in one call on
    whole arrays (as before the curves evaluated a repeated point once, and k kept its own shape)."""
    from sim.costmodel.model import TABLE_COLUMNS

    table = roofline_model.tabulate(24, 4, 3000, 2000, True)
    shape = (25, 5, TABLE_COLUMNS + 2)
    b = np.broadcast_to(np.maximum(np.arange(25, dtype=float), 1.0)[:, None, None], shape).copy()
    k = np.broadcast_to(np.arange(5, dtype=float)[None, :, None], shape).copy()
    c = np.broadcast_to((np.arange(TABLE_COLUMNS + 2) * table.context_step).astype(float)[None, None, :], shape).copy()
    whole = roofline_model.step_times(b, k, c)
    assert np.asarray(table.decode.array)[1:].tobytes() == whole[1:].tobytes()


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


def _with_overhead(tmp_path, name, **overhead):
    path = make_profile(tmp_path / name)
    meta = json.loads((path / "profile.json").read_text())
    meta["engine_overhead"] = overhead
    (path / "profile.json").write_text(json.dumps(meta))
    return CostModel(load_profile(path))


def test_a_per_row_engine_overhead_grows_a_decode_step_with_its_running_rows(tmp_path):
    plain = CostModel(load_profile(make_profile(tmp_path / "plain")))
    rows = _with_overhead(tmp_path, "rows", decode_overhead_s=0.001, decode_overhead_per_row_s=0.0002,
                          prefill_overhead_s=0.003)
    for b, k, c in ((1, 0, 128), (4, 3, 500), (16, 5, 900)):
        assert rows.step_time(b, k, c) == pytest.approx(plain.step_time(b, k, c) + 0.001 + 0.0002 * b, rel=1e-12)
    # the step table, which compiled runs read, charges the same; a prefill step has no per-row part
    table = rows.tabulate(16, 5, 1000, 1000, with_draft=True)
    assert table.decode_time(16, 5, 900) == pytest.approx(float(rows.step_time(16, 5, 900)), rel=2e-3)
    assert float(rows.prefill_times(4, 100, True)) == pytest.approx(float(plain.prefill_times(4, 100, True)) + 0.003)
    # the profile's own reading (the replay's and validate's step prices) is the cost model's
    rows_arr = np.array([1, 4, 16])
    assert rows.profile.decode_overhead_at(rows_arr).tolist() == rows.decode_overhead_at(rows_arr).tolist()
    # the fitted model keeps it (the fit cache's state)
    assert CostModel.from_state(rows.profile, rows.state()).decode_overhead_per_row == 0.0002
    # a profile without it prices as before, to the bit
    none = _with_overhead(tmp_path, "none", decode_overhead_s=0.001, decode_overhead_per_row_s=0.0)
    same = _with_overhead(tmp_path, "same", decode_overhead_s=0.001)
    assert none.step_times(np.arange(1, 9), 3, 500).tobytes() == same.step_times(np.arange(1, 9), 3, 500).tobytes()


def test_overlapped_engine_work_costs_the_longer_of_it_and_the_passes(tmp_path):
    plain = CostModel(load_profile(make_profile(tmp_path / "plain")))
    passes = plain.step_time(4, 3, 500)
    for cpu in (0.25 * passes, 4.0 * passes):  # hidden behind the passes, then longer than them
        async_model = _with_overhead(tmp_path, f"async{cpu}", decode_overhead_s=cpu, prefill_overhead_s=cpu,
                                     overlap="async")
        assert async_model.step_time(4, 3, 500) == pytest.approx(max(passes, cpu), rel=1e-12)
        sync_model = _with_overhead(tmp_path, f"sync{cpu}", decode_overhead_s=cpu, prefill_overhead_s=cpu)
        assert sync_model.step_time(4, 3, 500) == pytest.approx(passes + cpu, rel=1e-12)
    # exposed time is never hidden: it adds to the passes before the overlap
    exposed = _with_overhead(tmp_path, "exposed", decode_overhead_s=0.25 * passes, overlap="async",
                             exposed_overhead_s=0.001)
    assert exposed.step_time(4, 3, 500) == pytest.approx(passes + 0.001, rel=1e-12)
    prefill = float(plain.prefill_times(2, 300, True))
    assert float(exposed.prefill_times(2, 300, True)) == pytest.approx(prefill + 0.001, rel=1e-12)
    # the step table charges a step of chunks alone the same way
    table = exposed.tabulate(8, 3, 1000, 1000, with_draft=True, chunk_tokens=512, graph_sizes=())
    assert table.chunk_time(0, 300) == pytest.approx(float(exposed.prefill_times(1, 300, True)), rel=2e-3)


def test_vllm_v1_cuda_graph_sizes_follow_vllms_defaults():
    from sim.costmodel.model import cuda_graph_sizes, padded_tokens

    sizes = cuda_graph_sizes(128, 0, 2048)  # min(2 x 128, 512) = 256
    assert sizes == (1, 2, 4, *range(8, 256, 8), 256)
    assert cuda_graph_sizes(512, 0, 8192)[-3:] == (480, 496, 512)  # every 16 past 256, up to 512
    assert cuda_graph_sizes(128, 3, 300)[-1] == 288  # capped by the token budget (and k widens it)
    assert cuda_graph_sizes(2, 0, 2048) == (1, 2, 4)
    assert [padded_tokens(t, sizes) for t in (1, 3, 5, 9, 16, 17, 250, 256, 257, 2000)] == \
        [1, 4, 8, 16, 16, 24, 256, 256, 257, 2000]


def test_a_vllm_v1_table_pads_decode_steps_to_the_graph_sizes(linear_model):
    """The padded rows run the linear layers only: what they add to a one-prompt prefill pass (the
    linear profile's prefill costs 1e-5 s per token, the target's and again the draft's)."""
    from sim.costmodel.model import cuda_graph_sizes

    sizes = cuda_graph_sizes(32, 3, 256)
    assert sizes[-1] == 256 and not linear_model.cuda_graphs  # a synthetic profile: no padding by default
    table = linear_model.tabulate(32, 3, 2000, 1000, with_draft=True, chunk_tokens=256, graph_sizes=sizes)
    unpadded = linear_model.tabulate(32, 3, 2000, 1000, with_draft=True, chunk_tokens=256)
    for b, k, c in ((9, 0, 800), (5, 1, 1200), (8, 0, 800), (24, 3, 300), (17, 2, 128), (32, 3, 900)):
        tokens = b * (k + 1)
        padded = next(s for s in sizes if s >= tokens)
        got = table.decode_time(b, k, c) - unpadded.decode_time(b, k, c)
        assert got == pytest.approx(2 * 1e-5 * (padded - tokens), rel=1e-6, abs=1e-12), (b, k, c)
        assert unpadded.decode_time(b, k, c) == pytest.approx(linear_model.step_time(b, k, c), rel=1e-9)
    assert table.padded(9) == 16 and table.padded(300) == 300 and unpadded.padded(9) == 9


def test_a_chunks_attention_to_its_cached_prefix_is_the_larger_of_reading_and_computing_it(linear_model,
                                                                                             roofline_model):
    # the linear profile's target decode reads 1e-7 s per sequence-token of context
    assert linear_model.kv_read_cost(32) == pytest.approx(1e-7, rel=1e-9)
    table = roofline_model.tabulate(32, 0, 2000, 2000, with_draft=False, chunk_tokens=2048, graph_sizes=())
    kappa, theta = roofline_model.kv_read_cost(32), roofline_model.attention_coefficient
    assert kappa > 0 and table.kv_read_cost == kappa and table.attention_coefficient == theta
    for d, q, s in ((64, 16, 560), (0, 2048, 2048), (8, 300, 0)):
        extra = table.chunk_time(d, q, s) - table.chunk_time(d, q)
        assert extra == pytest.approx(max(kappa * s, 2 * theta * q * s), rel=1e-9, abs=1e-15)
