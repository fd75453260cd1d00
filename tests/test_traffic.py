"""Time-varying traffic (workloads/traffic.py), its config, and traces with per-request alpha and label."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from specbatch.commands.cli import main
from sim.config import load_config
from sim.errors import InputError
from tests.conftest import CPU_DEFAULTS
from workloads import (Requests, TraceError, gamma_arrivals, parse_rate_profile, profile_arrivals, read_trace,
                       write_trace)


def _arrivals(text, seed=0, **kw):
    return profile_arrivals(np.random.default_rng(seed), parse_rate_profile(text), **kw)


def _within(count, expected, sd_per_event=1.0, z=4.0):
    """|count - expected| within z Poisson standard errors (sd_per_event^2 scales the variance)."""
    return abs(count - expected) < z * sd_per_event * math.sqrt(expected) + 1


# ---------------------------------------------------------------------------------------------- shapes


def test_each_phase_arrives_at_its_own_rate():
    rates, d = (1.0, 4.0, 8.0), 300.0
    t = _arrivals("phases:1,4,8:300,300,300", duration_s=900.0)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0) and t[-1] < 900.0
    counts = np.histogram(t[1:], bins=[0, 300, 600, 900])[0]  # the t = 0 request is not part of the process
    for count, rate in zip(counts, rates):
        assert _within(count, rate * d), (count, rate * d)
    # and the phases differ: a flat rate would fail the check above
    assert counts[2] > 4 * counts[0]


@pytest.mark.parametrize("text", ["ramp:1:8", "ramp-exp:1:8", "ramp:8:0.5"])
def test_ramp_counts_per_tenth_follow_the_integral_of_the_rate(text):
    T = 1000.0
    profile = parse_rate_profile(text).bind(T)
    t = profile_arrivals(np.random.default_rng(5), profile, duration_s=T)
    edges = np.linspace(0, T, 11)
    counts = np.histogram(t[1:], bins=edges)[0]
    expected = np.diff(profile.cumulative(edges))
    for c, e in zip(counts, expected):
        assert _within(c, e), (text, counts, expected.round())
    assert not np.allclose(expected, expected.mean(), rtol=0.2)  # the ramp really ramps


def test_exponential_ramp_rate_and_intensity_formulas():
    p = parse_rate_profile("ramp-exp:1:8:30")
    assert p.rate([0, 10, 20, 30, 60]).tolist() == pytest.approx([1, 2, 4, 8, 8])
    assert float(p.cumulative(30)) == pytest.approx(7 * 30 / math.log(8))


@pytest.mark.parametrize("phase", [0.0, 1.3])
def test_sine_count_over_a_period_is_mean_times_period(phase):
    mean, amp, period = 4.0, 3.0, 600.0
    t = _arrivals(f"sine:{mean}:{amp}:{period}:{phase}", seed=2, duration_s=3 * period)
    counts = np.histogram(t[1:], bins=[0, period, 2 * period, 3 * period])[0]
    for c in counts:
        assert _within(c, mean * period), counts
    # the first half-period (sin > 0 when phase = 0) carries mean*P/2 + amp*P/pi arrivals
    p = parse_rate_profile(f"sine:{mean}:{amp}:{period}:{phase}")
    half = np.histogram(t[1:], bins=[0, period / 2])[0][0]
    assert _within(half, float(p.cumulative(period / 2)))
    if phase == 0.0:
        assert float(p.cumulative(period / 2)) == pytest.approx(mean * period / 2 + amp * period / math.pi)


def test_onoff_bursts_arrive_in_the_on_windows():
    t = _arrivals("onoff:8:0.5:30:90", seed=4, duration_s=1200.0)[1:]
    on = np.mod(t, 120.0) < 30.0
    assert _within(on.sum(), 8 * 30 * 10) and _within((~on).sum(), 0.5 * 90 * 10)


def test_inverse_inverts_the_cumulative_intensity_for_every_shape():
    y = np.linspace(0, 500, 2001)
    for text in ("phases:1,0,2:10,10,10", "ramp:0:8:100", "ramp-exp:1:8:100", "sine:4:4:60:0.5", "onoff:8:0:5:5"):
        p = parse_rate_profile(text)
        t = p.inverse(y)
        assert np.all(np.diff(t) >= 0), text
        np.testing.assert_allclose(p.cumulative(t), y, atol=1e-6, err_msg=text)


def test_a_single_phase_is_exactly_the_constant_rate_gamma_process():
    a = _arrivals("phases:2.5:100", seed=9, burstiness=0.5, num_requests=200)
    b = gamma_arrivals(np.random.default_rng(9), 2.5, 0.5, num_requests=200)
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_cv_is_one_over_sqrt_burstiness():
    for cv in (0.5, 2.0):
        a = _arrivals("sine:3:2:100", seed=1, cv=cv, num_requests=500)
        b = _arrivals("sine:3:2:100", seed=1, burstiness=1 / cv**2, num_requests=500)
        np.testing.assert_array_equal(a, b)
    gaps = np.diff(_arrivals("phases:3:10", seed=1, cv=2.0, num_requests=40_001))
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.08)
    with pytest.raises(ValueError, match="not both"):
        _arrivals("phases:3:10", cv=2.0, burstiness=0.25, num_requests=5)


@pytest.mark.parametrize("mode", [{"num_requests": 300}, {"duration_s": 200.0}])
def test_same_seed_same_arrays_other_seed_other_arrays(mode):
    for text in ("phases:1,4:100,100", "ramp:1:8:200", "sine:4:3:50", "onoff:8:0.5:10:20"):
        a, b = _arrivals(text, seed=3, **mode), _arrivals(text, seed=3, **mode)
        np.testing.assert_array_equal(a, b)
        assert a[0] == 0.0
        if "num_requests" in mode:
            assert a.shape == (300,)
        assert not np.array_equal(a, _arrivals(text, seed=4, **mode))


def test_a_profile_that_dies_out_cannot_give_num_requests():
    with pytest.raises(ValueError, match="falls to 0"):
        _arrivals("phases:1,0:10,10", num_requests=10_000)


@pytest.mark.parametrize("text, message", [
    ("phases:1,2:10", "as many rates as durations_s"),
    ("phases:1,x:10,10", "not a number"),
    ("ramp-exp:0:8", "start > 0"),
    ("sine:4:5:60", "amplitude must be in"),
    ("onoff:0:1:5:5", "on_rate > 0"),
    ("square:1", "is not a rate profile"),
    ("ramp:1", "malformed"),
])
def test_bad_compact_profiles_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_rate_profile(text)


# ---------------------------------------------------------------------------------------------- config


def _file(tmp_path, text, name="run.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_rate_profile_table_in_a_file_and_phases_set_the_duration(tmp_path):
    cfg = load_config(_file(tmp_path, '[workload]\nrate_profile = { shape = "phases", rates = [1, 4, 8], '
                                      'durations_s = [60, 60, 60] }\n'))
    assert cfg.workload.rate_profile.rates == (1.0, 4.0, 8.0)
    assert cfg.workload.duration_s == 180.0  # the phases' total, not the default 1200
    again = load_config(_file(tmp_path, cfg.to_toml(), "resolved.toml"))
    assert again == cfg and again.to_toml() == cfg.to_toml()
    assert load_config(CPU_DEFAULTS, {"workload.rate_profile": ("phases:1,4:10,10", "--rate-profile"),
                              "workload.duration_s": (50.0, "--duration")}).workload.duration_s == 50.0


@pytest.mark.parametrize("flag", ["ramp:1:8", "ramp-exp:1:8:60", "sine:4:3:600", "onoff:8:0.5:30:90"])
def test_rate_profile_flag_round_trips(tmp_path, flag):
    cfg = load_config(CPU_DEFAULTS, {"workload.rate_profile": (flag, "--rate-profile")})
    assert cfg.workload.rate_profile == parse_rate_profile(flag)
    assert load_config(_file(tmp_path, cfg.to_toml())) == cfg


def test_cv_config_sets_burstiness_and_round_trips(tmp_path):
    cfg = load_config(_file(tmp_path, '[workload]\narrival = "gamma"\ncv = 2.0\n'))
    assert cfg.workload.burstiness == 0.25 and cfg.workload.cv == 2.0
    assert load_config(_file(tmp_path, cfg.to_toml(), "resolved.toml")) == cfg


@pytest.mark.parametrize("text, key, line, message", [
    ('seed = 1\n[workload]\nrate_profile = { shape = "sine", mean = 2, amplitude = 3, period_s = 60 }\n',
     "workload.rate_profile", 3, "amplitude must be in"),
    ('[workload]\n\nrate_profile = { shape = "wave" }\n', "workload.rate_profile", 3, "'shape' must be one of"),
    ('[workload]\nrate_profile = { shape = "onoff", on_rate = 8 }\n', "workload.rate_profile", 2, "needs"),
    ('[workload]\nrate_profile = "ramp:1:8"\nnum_requests = 10\n', "workload.rate_profile", 2, "own duration"),
    ('[workload]\nburstiness = 0.5\ncv = 2\n', "workload.cv", 3, "not both"),
])
def test_bad_rate_profile_names_field_file_and_line(tmp_path, text, key, line, message):
    path = _file(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_config(path)
    err = str(info.value)
    assert f"{path}:{line}" in err and key in err and message in err, err


def test_bad_rate_profile_flag_names_the_flag():
    with pytest.raises(InputError) as info:
        load_config(CPU_DEFAULTS, {"workload.rate_profile": ("phases:1,2:10", "--rate-profile")})
    assert "--rate-profile" in str(info.value) and "durations_s" in str(info.value)


# ---------------------------------------------------------------------------------------------- traces


def test_trace_alpha_and_label_columns_round_trip(tmp_path):
    path = _file(tmp_path, "arrival_s,prompt_tokens,output_tokens,alpha,label\n1,8,4,0.9,code\n0,8,4,,chat\n",
                 "t.csv")
    r = read_trace(path)
    assert r.label.tolist() == ["chat", "code"]
    assert math.isnan(r.alpha[0]) and r.alpha[1] == 0.9
    write_trace(tmp_path / "w.csv", r)
    again = read_trace(tmp_path / "w.csv")
    np.testing.assert_array_equal(again.alpha, r.alpha)
    assert again.label.tolist() == r.label.tolist()
    assert read_trace(_file(tmp_path, "arrival_s,prompt_tokens,output_tokens\n0,1,1\n", "p.csv")).alpha is None


@pytest.mark.parametrize("cell, message", [("1.0", "inside (0, 1)"), ("0", "inside (0, 1)"), ("high", "not a number")])
def test_bad_trace_alpha_names_line_and_column(tmp_path, cell, message):
    path = _file(tmp_path, f"arrival_s,prompt_tokens,output_tokens,alpha\n0,8,4,0.5\n1,8,4,{cell}\n", "t.csv")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert (info.value.line, info.value.field) == (3, "alpha") and message in info.value.message


def test_requests_reject_alpha_outside_the_unit_interval():
    with pytest.raises(ValueError, match="inside"):
        Requests([0.0], [1], [1], alpha=[1.5])


def test_trace_alpha_and_label_end_to_end(capsys, tmp_path, synthetic_profile):
    rows = ["arrival_s,prompt_tokens,output_tokens,alpha,label"]
    for i in range(6):
        rows.append(f"{i * 0.5},16,200,{0.95 if i % 2 else 0.05},{'easy' if i % 2 else 'hard'}")
    rows.append("3.0,16,50,,mixed")  # no alpha: the configured acceptance applies
    trace = _file(tmp_path, "\n".join(rows) + "\n", "trace.csv")
    out = tmp_path / "run"
    assert main(["run", "--profile", str(synthetic_profile), "--trace", str(trace), "--policy", "fixed",
                 "--k", "4", "--alpha", "0.5", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    req = pd.read_csv(out / "requests.csv")
    assert req.label.tolist() == ["hard", "easy"] * 3 + ["mixed"]
    assert req.alpha.tolist() == [0.05, 0.95] * 3 + [0.5]
    ratio = req.accepted_tokens / req.drafted_tokens
    easy, hard = ratio[req.label == "easy"], ratio[req.label == "hard"]
    assert easy.min() > 0.6 and hard.max() < 0.2
    summary = json.loads((out / "summary.json").read_text())
    by = summary["by_label"]
    assert sorted(by) == ["easy", "hard", "mixed"] and by["easy"]["completed"] == 3
    assert by["easy"]["mean_acceptance_length"] > 2 * by["hard"]["mean_acceptance_length"]
    assert by["hard"]["mean_e2el_ms"] > by["easy"]["mean_e2el_ms"]
    for key in ("p99_e2el_ms", "mean_ttft_ms"):
        assert by["mixed"][key] > 0
