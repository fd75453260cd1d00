"""Serving and speculation metrics (sim/metrics.py), checked against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.metrics import distribution_stats, speculation_stats, summarize, weighted_percentile

STAT_NAMES = ("mean", "median", "std", "p90", "p99")


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False), st.integers(0, 6)),
                  min_size=1, max_size=25).filter(lambda rows: sum(w for _, w in rows) > 0),
    percents=st.lists(st.floats(0, 100), min_size=1, max_size=5),
    duplicate=st.booleans(),
)
def test_weighted_percentile_equals_percentile_of_the_repeated_values(data, percents, duplicate):
    values = np.array([v for v, _ in data])
    weights = np.array([w for _, w in data], dtype=np.int64)
    if duplicate:  # ties between distinct entries must not matter
        values, weights = np.concatenate((values, values[:1])), np.concatenate((weights, [2]))
    expected = np.percentile(np.repeat(values, weights), percents)
    got = weighted_percentile(values, weights, percents)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)


def test_weighted_percentile_is_exactly_that_of_a_stable_sort_whatever_order_ties_take():
    """summary.json's bytes must not move: equal values sorted in any order give the same percentile,
    to the last bit, as the stable sort this used before (many ties, zero weights, a million gaps)."""
    rng = np.random.default_rng(3)
    values = np.round(rng.gamma(2.0, 0.01, 1_000_000), 5)  # a few thousand distinct gaps
    weights = rng.integers(0, 40, values.size)
    order = np.argsort(values, kind="stable")
    cum, ranked = np.cumsum(weights[order]), values[order]
    percents = [0, 1, 50, 90, 99, 99.9, 100]
    expected = []
    for p in percents:
        h = (int(cum[-1]) - 1) * p / 100.0
        lo, hi = int(np.floor(h)), int(np.ceil(h))
        v_lo, v_hi = ranked[np.searchsorted(cum, lo, side="right")], ranked[np.searchsorted(cum, hi, side="right")]
        expected.append(v_lo + (h - lo) * (v_hi - v_lo))
    assert weighted_percentile(values, weights, percents).tobytes() == np.asarray(expected).tobytes()


def _stable_sort_percentiles(values, weights, percents):
    order = np.argsort(values, kind="stable")
    cum, ranked = np.cumsum(weights[order]), values[order]
    out = []
    for p in percents:
        h = (int(cum[-1]) - 1) * p / 100.0
        lo, hi = int(np.floor(h)), int(np.ceil(h))
        v_lo, v_hi = ranked[np.searchsorted(cum, lo, side="right")], ranked[np.searchsorted(cum, hi, side="right")]
        out.append(v_lo + (h - lo) * (v_hi - v_lo))
    return np.asarray(out).tobytes()


@pytest.mark.parametrize("layout", ["weight-follows-value", "periodic", "sorted", "heavy-tail-weight", "inf", "nan"])
def test_bracketed_percentiles_are_those_of_a_full_sort_where_a_sample_misjudges(layout):
    """Long arrays are bracketed from a strided sample and only the bracket is sorted: samples that
    miss the weight (it grows with the value, sits on a few entries, repeats with the stride) or
    arrays holding inf or NaN still give a full sort's doubles."""
    import sim.metrics as metrics

    rng = np.random.default_rng(11)
    n = 300_000
    values = rng.gamma(2.0, 0.01, n)
    weights = rng.integers(1, 5, n)
    if layout == "weight-follows-value":
        weights = (values * 1e4).astype(np.int64) ** 2
    elif layout == "periodic":  # every sampled entry is the small one
        stride = n // metrics.SAMPLE
        values[::stride], weights[::stride] = 1e-6, 1
        weights[1::stride] = 5000
    elif layout == "sorted":
        values.sort()
    elif layout == "heavy-tail-weight":  # a handful of entries carry most of the weight
        weights[rng.integers(0, n, 5)] = 10**7
    elif layout == "inf":
        values[rng.integers(0, n, 50)] = np.inf
    elif layout == "nan":
        values[rng.integers(0, n, 50)] = np.nan
    percents = [0, 0.1, 50, 90, 99, 99.9, 100]
    assert n >= metrics.BRACKET_FROM
    with np.errstate(invalid="ignore"):  # inf - inf between two infinite ranks is NaN either way
        assert weighted_percentile(values, weights, percents).tobytes() == _stable_sort_percentiles(values, weights,
                                                                                                      percents)


def test_weighted_stats_are_to_the_bit_those_of_the_milliseconds_computed_first():
    """distribution_stats finds the ranks on the seconds and scales only the values at them; the mean and
    std square in place: every figure is the double the plain formulas over milliseconds give."""
    rng = np.random.default_rng(5)
    seconds = np.round(rng.gamma(2.0, 0.01, 200_000), 6)
    weights = rng.integers(0, 9, seconds.size)
    ms = seconds * 1000.0
    order = np.argsort(ms, kind="stable")
    cum, ranked = np.cumsum(weights[order]), ms[order]
    expected = {}
    for name, p in (("median", 50), ("p90", 90), ("p99", 99)):
        h = (int(cum[-1]) - 1) * p / 100.0
        lo, hi = int(np.floor(h)), int(np.ceil(h))
        v_lo, v_hi = ranked[np.searchsorted(cum, lo, side="right")], ranked[np.searchsorted(cum, hi, side="right")]
        expected[f"{name}_itl_ms"] = float(v_lo + (h - lo) * (v_hi - v_lo))
    mean = float(np.average(ms, weights=weights))
    expected.update(mean_itl_ms=mean, std_itl_ms=float(np.sqrt(np.average((ms - mean) ** 2, weights=weights))))
    assert distribution_stats("itl", seconds, weights) == expected


def test_weighted_percentile_skips_zero_weight_values():
    got = weighted_percentile(np.array([5.0, 1.0, 100.0, 3.0]), np.array([1, 2, 0, 1]), [0, 50, 100])
    np.testing.assert_allclose(got, [1.0, 2.0, 5.0])  # over [1, 1, 3, 5]


def test_distribution_stats_names_and_millisecond_conversion():
    stats = distribution_stats("ttft", np.array([0.004, 0.001, 0.003, 0.002]))
    assert set(stats) == {f"{s}_ttft_ms" for s in STAT_NAMES}
    assert stats["mean_ttft_ms"] == pytest.approx(2.5)
    assert stats["median_ttft_ms"] == pytest.approx(2.5)
    assert stats["std_ttft_ms"] == pytest.approx(math.sqrt(1.25))  # population std (ddof 0), as vLLM
    assert stats["p90_ttft_ms"] == pytest.approx(3.7)
    assert stats["p99_ttft_ms"] == pytest.approx(3.97)


def test_weighted_distribution_stats_equal_the_repeated_values():
    weighted = distribution_stats("itl", np.array([0.001, 0.003, 0.010]), np.array([3, 1, 0]))
    repeated = distribution_stats("itl", np.array([0.001, 0.001, 0.001, 0.003]))
    assert weighted.keys() == repeated.keys()
    for name in weighted:
        assert weighted[name] == pytest.approx(repeated[name]), name
    assert weighted["mean_itl_ms"] == pytest.approx(1.5)


@pytest.mark.parametrize("values,weights", [(np.array([]), None), (np.array([0.1, 0.2]), np.array([0, 0]))])
def test_distribution_stats_of_nothing_are_nan(values, weights):
    stats = distribution_stats("e2el", values, weights)
    assert set(stats) == {f"{s}_e2el_ms" for s in STAT_NAMES}
    assert all(math.isnan(v) for v in stats.values())


def _steps() -> dict[str, np.ndarray]:
    """Two prefill steps (phase 0) and four decode steps (phase 1), one of them with k = 0; in the
    last, one of the four rows proposed nothing (a host matcher's miss)."""
    return {
        "phase": np.array([0, 1, 1, 1, 0, 1]),
        "k": np.array([0, 3, 0, 2, 0, 3]),
        "running": np.array([8, 2, 3, 1, 8, 4]),
        "drafted_tokens": np.array([0, 6, 0, 2, 0, 9]),
        "drafts": np.array([0, 2, 0, 1, 0, 3]),
        "accepted_tokens": np.array([0, 4, 0, 1, 0, 5]),
        "emitted_tokens": np.array([1, 6, 3, 2, 2, 9]),
        "start_s": np.array([0.25, 0.75, 1.0, 1.2, 1.6, 2.5]),
        "end_s": np.array([0.75, 1.0, 1.2, 1.6, 2.0, 3.5]),
    }


def test_speculation_stats_follow_vllm_definitions():
    stats = speculation_stats(_steps())
    assert (stats["num_steps"], stats["num_decode_steps"], stats["num_prefill_steps"]) == (6, 4, 2)
    assert stats["num_draft_tokens"] == 17 and stats["num_accepted_tokens"] == 10
    assert stats["acceptance_rate"] == pytest.approx(10 / 17)
    # A draft is one sequence that proposed tokens in a step: 2 + 1 + 3 (not the row that missed).
    assert stats["num_drafts"] == 6
    assert stats["mean_acceptance_length"] == pytest.approx(1 + 10 / 6)
    assert stats["mean_k"] == pytest.approx((3 + 0 + 2 + 3) / 4)  # decode steps only, k = 0 included
    assert stats["mean_batch_size"] == pytest.approx((2 + 3 + 1 + 4) / 4)
    busy = 0.5 + 0.25 + 0.2 + 0.4 + 0.4 + 1.0
    assert stats["busy_time_s"] == pytest.approx(busy)
    assert stats["token_goodput"] == pytest.approx(23 / busy)


def test_speculation_stats_without_speculation_are_nan_not_errors():
    steps = _steps()
    steps["k"][:] = 0
    steps["drafted_tokens"][:] = 0
    steps["drafts"][:] = 0
    steps["accepted_tokens"][:] = 0
    stats = speculation_stats(steps)
    assert stats["num_drafts"] == 0 and stats["mean_k"] == 0.0
    assert math.isnan(stats["acceptance_rate"]) and math.isnan(stats["mean_acceptance_length"])


def _three_requests():
    return dict(
        arrival_s=np.array([0.25, 1.0, 2.0]),
        prompt_tokens=np.array([10, 20, 30]),
        output_tokens=np.array([1, 3, 5]),
        first_token_s=np.array([0.75, 1.2, 2.5]),
        finish_s=np.array([0.75, 1.6, 3.5]),
        itl_values=np.array([0.2, 0.25]),
        itl_weights=np.array([2, 4]),
        steps=_steps(),
    )


def test_summarize_hand_computed_three_request_case():
    s = summarize(**_three_requests())
    # TTFT = [0.5, 0.2, 0.5] s; E2EL = [0.5, 0.6, 1.5] s
    assert s["mean_ttft_ms"] == pytest.approx(400.0)
    assert s["median_ttft_ms"] == pytest.approx(500.0)
    assert s["std_ttft_ms"] == pytest.approx(1000 * math.sqrt(0.02))
    assert s["p90_ttft_ms"] == pytest.approx(500.0)
    assert s["mean_e2el_ms"] == pytest.approx(1000 * 2.6 / 3)
    assert s["median_e2el_ms"] == pytest.approx(600.0)
    assert s["p99_e2el_ms"] == pytest.approx(600 + 0.98 * 900)
    # TPOT only over requests with more than one output token: (0.6-0.2)/2 and (1.5-0.5)/4.
    assert s["mean_tpot_ms"] == pytest.approx(225.0)
    assert s["median_tpot_ms"] == pytest.approx(225.0)
    assert s["std_tpot_ms"] == pytest.approx(25.0)
    assert s["mean_itl_ms"] == pytest.approx(1000 * (2 * 0.2 + 4 * 0.25) / 6)
    assert s["median_itl_ms"] == pytest.approx(250.0)
    # The run lasts from t = 0 (not the first arrival at 0.25) to the last finish at 3.5.
    assert s["duration_s"] == pytest.approx(3.5)
    assert s["completed"] == 3
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (60, 9)
    assert s["request_throughput"] == pytest.approx(3 / 3.5)
    assert s["output_throughput"] == pytest.approx(9 / 3.5)
    assert s["total_token_throughput"] == pytest.approx(69 / 3.5)
    assert s["mean_acceptance_length"] == pytest.approx(1 + 10 / 6)  # speculation stats are merged in


def test_summarize_leaves_unfinished_requests_out():
    base = _three_requests()
    extra = dict(base)
    for key, fill in (("arrival_s", 3.0), ("prompt_tokens", 1000), ("output_tokens", 7), ("first_token_s", 3.3),
                      ("finish_s", np.nan)):
        extra[key] = np.append(base[key], fill)
    full, partial = summarize(**base), summarize(**extra)
    assert partial["completed"] == 3 and partial["total_input_tokens"] == 60
    for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "duration_s",
                "output_throughput"):
        assert partial[key] == pytest.approx(full[key]), key


def test_int32_weights_summing_past_2_to_the_31_give_the_int64_answer():
    """The engine's gap counts are int32; their running sums must not wrap (a long run's total)."""
    from sim.metrics import distribution_stats

    values = np.array([0.003, 0.001, 0.002])
    big = np.array([2**30, 2**30, 2**30 + 5], dtype=np.int32)
    assert distribution_stats("itl", values, big) == distribution_stats("itl", values, big.astype(np.int64))
    assert distribution_stats("itl", values, big)["median_itl_ms"] == 2.0
