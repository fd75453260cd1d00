"""Arrival processes, length distributions, traces and the request table (workloads/)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workloads import (LengthSpec, Requests, TraceError, gamma_arrivals, parse_length_spec, poisson_arrivals,
                       read_trace, write_trace)

# ---------------------------------------------------------------------------------------------- arrivals


@pytest.mark.parametrize("make", [
    lambda rng, **kw: poisson_arrivals(rng, 4.0, **kw),
    lambda rng, **kw: gamma_arrivals(rng, 4.0, 0.3, **kw),
], ids=["poisson", "gamma"])
@pytest.mark.parametrize("mode", [{"num_requests": 500}, {"duration_s": 100.0}], ids=["count", "duration"])
def test_arrivals_start_at_zero_sorted_and_bounded(make, mode):
    times = make(np.random.default_rng(1), **mode)
    assert times[0] == 0.0
    assert np.all(np.diff(times) >= 0)
    if "num_requests" in mode:
        assert times.shape == (500,)
    else:
        assert times.size > 1 and np.all(times < mode["duration_s"])


@pytest.mark.parametrize("n", [1, 2, 17])
def test_num_requests_gives_exactly_that_many_arrivals(n):
    assert poisson_arrivals(np.random.default_rng(0), 2.0, num_requests=n).shape == (n,)
    assert gamma_arrivals(np.random.default_rng(0), 2.0, 0.5, num_requests=n).shape == (n,)


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_mean_gap_is_one_over_rate(burstiness):
    rate, n = 5.0, 40_001
    gaps = np.diff(gamma_arrivals(np.random.default_rng(7), rate, burstiness, num_requests=n))
    sd = 1.0 / (rate * math.sqrt(burstiness))  # Gamma(shape=b, mean=1/rate) has sd = mean / sqrt(b)
    assert abs(gaps.mean() - 1.0 / rate) < 5 * sd / math.sqrt(gaps.size)


def test_poisson_arrivals_are_gamma_with_burstiness_one():
    a = poisson_arrivals(np.random.default_rng(3), 2.5, num_requests=100)
    b = gamma_arrivals(np.random.default_rng(3), 2.5, 1.0, num_requests=100)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gap_coefficient_of_variation_is_one_over_sqrt_burstiness(burstiness):
    n = 40_000
    gaps = np.diff(gamma_arrivals(np.random.default_rng(11), 3.0, burstiness, num_requests=n + 1))
    cv = gaps.std() / gaps.mean()
    expected = 1.0 / math.sqrt(burstiness)
    # Delta method: the sample variance of Gamma(s) has relative sd sqrt((2 + 6/s) / n) (excess kurtosis
    # 6/s), the sample mean relative sd 1/sqrt(s n); cv's relative sd is at most half the first plus the second.
    rel_se = 0.5 * math.sqrt((2 + 6 / burstiness) / n) + 1 / math.sqrt(burstiness * n)
    assert abs(cv / expected - 1) < 5 * rel_se


def test_duration_mode_count_matches_rate_times_duration():
    rate, duration = 20.0, 500.0
    times = poisson_arrivals(np.random.default_rng(5), rate, duration_s=duration)
    # First arrival at 0, then a Poisson process on (0, T): count = 1 + Poisson(rate T).
    expected = 1 + rate * duration
    assert abs(times.size - expected) < 5 * math.sqrt(rate * duration)


def test_duration_mode_stays_sorted_and_unbiased_when_it_needs_several_chunks():
    # Very bursty, small runs: the first chunk of gaps (rate*T*1.1 + 16 = 27) often ends before T.
    rate, burst, duration, seeds = 1.0, 0.1, 10.0, 400
    by_duration, by_count, longest = [], [], 0
    for seed in range(seeds):
        t = gamma_arrivals(np.random.default_rng(seed), rate, burst, duration_s=duration)
        assert t[0] == 0.0 and np.all(np.diff(t) >= 0) and np.all(t < duration)
        longest = max(longest, t.size)
        by_duration.append(t.size)
        ref = gamma_arrivals(np.random.default_rng(10_000 + seed), rate, burst, num_requests=2_000)
        by_count.append(int(np.sum(ref < duration)))
    assert longest > 28, "no run crossed a chunk boundary; the test does not exercise it"
    a, b = np.asarray(by_duration, float), np.asarray(by_count, float)
    se = math.sqrt(a.var() / seeds + b.var() / seeds)
    assert abs(a.mean() - b.mean()) < 5 * se


@pytest.mark.parametrize("mode", [{"num_requests": 300}, {"duration_s": 50.0}])
def test_same_seed_gives_identical_arrivals(mode):
    a = gamma_arrivals(np.random.default_rng(42), 3.0, 0.5, **mode)
    b = gamma_arrivals(np.random.default_rng(42), 3.0, 0.5, **mode)
    c = gamma_arrivals(np.random.default_rng(43), 3.0, 0.5, **mode)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("rate,burstiness", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, -2.0),
                                             (math.nan, 1.0), (1.0, math.nan)])  # rate inf: tests/test_vllm_compat.py
def test_bad_rate_or_burstiness_is_rejected(rate, burstiness):
    with pytest.raises(ValueError, match="rate and burstiness"):
        gamma_arrivals(np.random.default_rng(0), rate, burstiness, duration_s=10.0)
    with pytest.raises(ValueError, match="rate and burstiness"):
        gamma_arrivals(np.random.default_rng(0), rate, burstiness, num_requests=10)


def test_exactly_one_of_duration_and_num_requests_is_required():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="exactly one"):
        poisson_arrivals(rng, 1.0)
    with pytest.raises(ValueError, match="exactly one"):
        poisson_arrivals(rng, 1.0, duration_s=5.0, num_requests=5)


# ---------------------------------------------------------------------------------------------- lengths


def test_plain_number_is_a_fixed_length():
    for value in ("128", " 128 ", 128):
        spec = parse_length_spec(value)
        assert spec == LengthSpec("fixed", value=128)
        np.testing.assert_array_equal(spec.sample(np.random.default_rng(0), 5), np.full(5, 128))
    assert spec.upper_bound == 128


def test_uniform_spec_samples_inclusive_bounds():
    spec = parse_length_spec("uniform:64:256")
    assert (spec.kind, spec.low, spec.high, spec.upper_bound) == ("uniform", 64, 256, 256)
    small = parse_length_spec("uniform:3:5").sample(np.random.default_rng(0), 2000)
    assert set(np.unique(small).tolist()) == {3, 4, 5}
    wide = spec.sample(np.random.default_rng(1), 5000)
    assert wide.min() >= 64 and wide.max() <= 256 and wide.dtype == np.int64


def test_lognormal_spec_fields_and_optional_max():
    assert parse_length_spec("lognormal:128:0.5") == LengthSpec("lognormal", mean=128.0, sigma=0.5)
    capped = parse_length_spec("lognormal:128:0.5:200")
    assert capped.max == 200 and capped.upper_bound == 200
    assert parse_length_spec("lognormal:128:0.5").upper_bound is None
    sample = capped.sample(np.random.default_rng(0), 20_000)
    assert sample.min() >= 1 and sample.max() == 200  # the clip is reached at 200 with this many draws


def test_lognormal_sample_mean_is_the_given_mean():
    n, mean, sigma = 100_000, 128.0, 0.5
    sample = parse_length_spec(f"lognormal:{mean}:{sigma}").sample(np.random.default_rng(2), n)
    sd = mean * math.sqrt(math.exp(sigma**2) - 1)
    assert abs(sample.mean() - mean) < 5 * sd / math.sqrt(n) + 0.01  # + rounding to whole tokens


def test_lognormal_sigma_is_the_std_of_log_lengths():
    n, sigma = 50_000, 0.8
    sample = parse_length_spec(f"lognormal:20000:{sigma}").sample(np.random.default_rng(3), n)
    assert abs(np.log(sample).std() - sigma) < 5 * sigma / math.sqrt(2 * n)


@pytest.mark.parametrize("table,expected", [
    ({"dist": "fixed", "value": 64}, LengthSpec("fixed", value=64)),
    ({"dist": "uniform", "low": 1, "high": 9}, LengthSpec("uniform", low=1, high=9)),
    ({"dist": "lognormal", "mean": 256, "sigma": 0.6, "max": 1024},
     LengthSpec("lognormal", mean=256.0, sigma=0.6, max=1024)),
    ({"dist": "uniform", "low": 2.0, "high": 4.0}, LengthSpec("uniform", low=2, high=4)),
])
def test_toml_table_forms_parse_and_round_trip(table, expected):
    spec = parse_length_spec(table)
    assert spec == expected
    assert parse_length_spec(spec.to_dict()) == spec


@pytest.mark.parametrize("value,message", [
    ("uniform:64", "uniform:LOW:HIGH"),
    ("uniform:a:b", "not a length"),
    ("lognormal:128", "lognormal:MEAN:SIGMA"),
    ("lognormal:x:0.5", "not a length"),
    ("lognormal:128:0.5:1.5", "not a length"),
    ("normal:1:2", "not a length"),
    ("1.5", "not a length"),
    ("", "not a length"),
    ("0", "at least 1"),
    ("-3", "at least 1"),
    ("uniform:256:64", "low <= high"),
    ("uniform:0:4", "low <= high"),
    ("lognormal:0.5:0.5", "mean >= 1"),
    ("lognormal:128:-1", "sigma >= 0"),
    ("lognormal:inf:0.5", "mean >= 1"),
    ("lognormal:128:0.5:0", "max must be at least 1"),
    (True, "boolean"),
    (3.5, "got float"),
    (None, "got NoneType"),
])
def test_malformed_compact_specs_raise_a_clear_value_error(value, message):
    with pytest.raises(ValueError, match=message):
        parse_length_spec(value)


@pytest.mark.parametrize("table,message", [
    ({"dist": "uniform", "low": 1, "high": 2, "mean": 3}, "unknown key\\(s\\) mean for dist 'uniform'"),
    ({"dist": "fixed", "value": 4, "max": 9, "sigma": 1}, "unknown key\\(s\\) max, sigma for dist 'fixed'"),
    ({"dist": "normal", "mean": 3}, "'dist' must be one of fixed, uniform, lognormal"),
    ({"value": 3}, "'dist' must be one of"),
    ({"dist": "lognormal", "mean": 128}, "dist 'lognormal' needs mean, sigma"),
    ({"dist": "uniform", "low": 64}, "dist 'uniform' needs high, low"),
    ({"dist": "fixed"}, "dist 'fixed' needs value"),
    ({"dist": "fixed", "value": 1.5}, "'value' must be a whole number"),
    ({"dist": "fixed", "value": math.inf}, "'value' must be a whole number"),
    ({"dist": "fixed", "value": "128"}, "'value' must be a number"),
    ({"dist": "fixed", "value": True}, "'value' must be a number"),
    ({"dist": "lognormal", "mean": 128, "sigma": 0.5, "max": 10.5}, "'max' must be a whole number"),
    ({"dist": "uniform", "low": 9, "high": 3}, "low <= high"),
])
def test_malformed_tables_raise_a_clear_value_error(table, message):
    with pytest.raises(ValueError, match=message):
        parse_length_spec(table)


def test_length_spec_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown length distribution 'zipf'"):
        LengthSpec("zipf")


# ---------------------------------------------------------------------------------------------- traces


def _write(tmp_path, text, name="trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_read_trace_ignores_extra_columns_skips_blank_lines_and_sorts_stably(tmp_path):
    path = _write(tmp_path, "id,output_tokens,arrival_s,prompt_tokens,note\n"
                            "a,5,2.0,10,x\n"
                            "b,6,0.0,20,y\n"
                            "\n"
                            "   \n"
                            "c,7,1.0,30,z\n"
                            "d,8,1.0,40,w\n")
    requests = read_trace(path)
    np.testing.assert_array_equal(requests.arrival_s, [0.0, 1.0, 1.0, 2.0])
    np.testing.assert_array_equal(requests.prompt_tokens, [20, 30, 40, 10])  # c before d: file order on ties
    np.testing.assert_array_equal(requests.output_tokens, [6, 7, 8, 5])
    assert requests.prompt_tokens.dtype == np.int64 and len(requests) == 4


HEADER = "arrival_s,prompt_tokens,output_tokens\n"


@pytest.mark.parametrize("body,line,field,message", [
    ("0.0,1,1\n\nabc,1,1\n", 4, "arrival_s", "'abc' is not a number"),
    ("0.0,1,1\n-1.5,1,1\n", 3, "arrival_s", "must be a finite number >= 0"),
    ("0.0,1,1\nnan,1,1\n", 3, "arrival_s", "finite"),
    ("0.0,1,1\n1.0,4,0\n", 3, "output_tokens", "'0' must be at least 1"),
    ("0.0,0,1\n", 2, "prompt_tokens", "'0' must be at least 1"),
    ("0.0,1,1\n\n\n1.0,2.5,3\n", 5, "prompt_tokens", "not a whole number"),
    ("0.0,1,1\n1.0,2\n", 3, None, "expected 3 fields, found 2"),
    ("0.0,1,1,9\n", 2, None, "expected 3 fields, found 4"),
])
def test_bad_trace_rows_name_the_exact_line_and_column(tmp_path, body, line, field, message):
    path = _write(tmp_path, HEADER + body)
    with pytest.raises(TraceError, match=message) as info:
        read_trace(path)
    err = info.value
    assert (err.line, err.field, err.path) == (line, field, path)
    assert str(err).startswith(f"{path}:{line}: " + (f"{field}: " if field else ""))


def test_trace_missing_column_is_reported_on_line_one(tmp_path):
    path = _write(tmp_path, "arrival_s,prompt_tokens\n0.0,4\n")
    with pytest.raises(TraceError, match="missing column\\(s\\) output_tokens") as info:
        read_trace(path)
    assert (info.value.line, info.value.field) == (1, "output_tokens")


def test_empty_trace_file_is_an_error_on_line_one(tmp_path):
    with pytest.raises(TraceError, match="empty trace file") as info:
        read_trace(_write(tmp_path, ""))
    assert info.value.line == 1


def test_trace_with_only_a_header_has_no_requests(tmp_path):
    with pytest.raises(TraceError, match="no requests"):
        read_trace(_write(tmp_path, HEADER + "\n"))


def test_missing_trace_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "nope.csv")


def test_trace_error_is_a_value_error():
    assert issubclass(TraceError, ValueError)


def test_write_trace_then_read_trace_round_trips_exactly(tmp_path):
    rng = np.random.default_rng(0)
    requests = Requests(gamma_arrivals(rng, 3.0, 0.5, num_requests=200), rng.integers(1, 4000, 200),
                        rng.integers(1, 900, 200))
    path = tmp_path / "out.csv"
    write_trace(path, requests)
    back = read_trace(path)
    np.testing.assert_array_equal(back.arrival_s, requests.arrival_s)  # repr() keeps every bit
    np.testing.assert_array_equal(back.prompt_tokens, requests.prompt_tokens)
    np.testing.assert_array_equal(back.output_tokens, requests.output_tokens)


# ---------------------------------------------------------------------------------------------- Requests


def test_requests_converts_columns_to_contiguous_typed_arrays():
    r = Requests([0, 1, 1], [3, 4, 5], (1, 2, 3))
    assert r.arrival_s.dtype == np.float64 and r.prompt_tokens.dtype == np.int64
    assert r.output_tokens.dtype == np.int64 and len(r) == 3


@pytest.mark.parametrize("arrival,prompt,output,message", [
    ([0.0, 2.0, 1.0], [1, 1, 1], [1, 1, 1], "sorted"),
    ([-0.5, 1.0], [1, 1], [1, 1], "non-negative"),
    ([0.0, 1.0], [1, 0], [1, 1], "at least one prompt token"),
    ([0.0, 1.0], [1, 1], [0, 1], "one output token"),
    ([0.0, 1.0], [1, 1], [1], "one length"),
])
def test_requests_rejects_unsorted_arrivals_and_zero_lengths(arrival, prompt, output, message):
    with pytest.raises(ValueError, match=message):
        Requests(np.asarray(arrival), np.asarray(prompt), np.asarray(output))
