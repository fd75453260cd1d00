"""specbatch capacity: the rate search, its inputs, the replicas/cost arithmetic and the report."""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.commands.capacity.costing import cost_per_million, costing, replicas_needed
from specbatch.commands.capacity.inputs import SLO, parse_policies, parse_slo, parse_slos, policy_config
from specbatch.commands.capacity.prices import gpu_price, parse_gpu_prices, profile_gpu
from specbatch.commands.capacity.search import RateSearch, SearchSettings, search_capacity
from specbatch.commands.cli import main
from sim.errors import InputError
from tests.synthetic import make_profile
from tests.conftest import CPU_DEFAULTS

# ------------------------------------------------------------------ a profile with a known service rate

STEP_S = 0.01        # every decode step of the target, whatever the batch, query length or context
OUTPUT_TOKENS = 11   # the prefill emits the first token, then 10 decode steps
MAX_BATCH = 4
SERVICE_RATE = MAX_BATCH / ((OUTPUT_TOKENS - 1) * STEP_S)  # 40 req/s: a full batch finishes every 0.1 s


def constant_latency(phase: str, model: str, b: int, q: int, c: int) -> float:
    if phase == "prefill":
        return 1e-6
    if phase == "decode":
        return STEP_S if model == "target" else 1e-3
    return 1e-7


@pytest.fixture(scope="module")
def constant_profile(tmp_path_factory) -> Path:
    return make_profile(tmp_path_factory.mktemp("profiles") / "constant", constant_latency)


def constant_config(profile: Path, **extra):
    from sim.config import load_config

    flags = {"profile": str(profile), "policy.name": "none", "workload.arrival": "gamma",
             "workload.burstiness": 1e8,  # gaps with a CV of 1e-4: deterministic arrivals
             "workload.prompt_tokens": "32", "workload.output_tokens": str(OUTPUT_TOKENS),
             "engine.max_batch_size": MAX_BATCH, "workload.num_requests": 10, **extra}
    return load_config(CPU_DEFAULTS, {k: (v, f"--{k}") for k, v in flags.items()})


def test_search_finds_the_analytic_saturation_rate(constant_profile):
    """D/D/4 with 0.1 s of service per batch: stable exactly up to 40 req/s, so a loose SLO finds 40, and never more."""
    settings = SearchSettings(seeds=(0, 1), tolerance=0.03, min_requests=100, curve_points=0)
    outcome = search_capacity({"none": constant_config(constant_profile)}, (SLO("p99_e2el_ms", 1e6),),
                              settings, jobs=1)["none"]
    assert abs(outcome.probe.throughput / SERVICE_RATE - 1) < 0.01  # the probe measures the service rate
    assert outcome.probe.service_s == pytest.approx((OUTPUT_TOKENS - 1) * STEP_S, rel=0.05)  # 10 steps in the batch
    lo, hi = outcome.bracket
    assert (hi - lo) / lo <= settings.tolerance
    # Below 40 the queue stays level; above, it grows by (rate - 40) every second, and the test sees it.
    assert SERVICE_RATE * (1 - 2 * settings.tolerance) <= outcome.max_rate <= SERVICE_RATE
    assert outcome.operating["p99_e2el_ms"] < 1e3  # a sustained rate: latency stays near one request's service
    assert outcome.operating["goodput"] <= outcome.max_rate  # by construction
    for rate, point in outcome.points.items():  # every verdict has its evidence
        assert point.verdict in ("pass", "fail") and point.queue["verdict"] in ("stable", "grows", "undecided")
        assert (point.verdict == "pass") == (rate <= outcome.max_rate)
        if rate > SERVICE_RATE * 1.02:
            assert point.queue["verdict"] == "grows" and point.stats["throughput"] < rate


def test_search_finds_the_latency_bound(constant_profile):
    """Below saturation E2EL is 10 steps of 10 ms plus at most one step of waiting; a limit under 100 ms is unmeetable."""
    settings = SearchSettings(seeds=(0,), tolerance=0.05, min_requests=50, curve_points=0)
    config = constant_config(constant_profile)
    met = search_capacity({"none": config}, (SLO("p99_e2el_ms", 150.0),), settings, jobs=1)["none"]
    assert met.max_rate > 0 and met.operating["p99_e2el_ms"] <= 150.0
    assert met.operating["p99_e2el_ms_upper"] <= 150.0  # met with confidence, not by the estimate alone
    unmet = search_capacity({"none": config}, (SLO("p99_e2el_ms", 90.0),), settings, jobs=1)["none"]
    assert unmet.max_rate == 0.0 and unmet.operating is None and unmet.steps is None


def test_stricter_slo_never_gives_a_higher_rate(run_config):
    settings = SearchSettings(seeds=(0,), tolerance=0.1, min_requests=40, curve_points=0)
    config = run_config(policy__name="fixed", policy__k=2, workload__output_tokens="16",
                        workload__prompt_tokens="32", workload__num_requests=10)
    rates = []
    for limit in (2000.0, 600.0, 450.0, 300.0):  # 300 ms: below a lone request's
        outcome = search_capacity({"fixed": config}, (SLO("p99_e2el_ms", limit),), settings, jobs=1)["fixed"]
        rates.append(outcome.max_rate)
    assert rates == sorted(rates, reverse=True) and rates[0] > rates[-2] > rates[-1] == 0.0
    both = search_capacity({"fixed": config}, (SLO("p99_e2el_ms", 600.0), SLO("p90_tpot_ms", 25.0)),
                           settings, jobs=1)["fixed"]
    assert both.max_rate <= rates[1]  # a further SLO never raises the rate


def test_rate_search_brackets_then_bisects():
    search = RateSearch(10.0, SearchSettings(tolerance=0.01))
    truth = 3.3
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(rate, rate <= truth)
    # after the start fails, the midpoint of [start / 2, start] first; failing, the halving goes on as before
    assert rates[:5] == [10.0, 7.5, 5.0, 2.5, 3.75]
    assert search.lo <= truth < search.hi and (search.hi - search.lo) / search.lo <= 0.01


def _halving_path(truth: float, start: float, tolerance: float) -> list[float]:
    """The rates the search tried before it looked at the midpoint of [start / 2, start] first: halve from
    the start until one passes, then bisect."""
    lo, hi, rates = None, None, []
    while True:
        rate = start if hi is None and lo is None else hi * 0.5 if lo is None else None
        if rate is None:
            if (hi - lo) / lo <= tolerance:
                return rates
            rate = (lo + hi) / 2
        rates.append(rate)
        if rate <= truth:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)


@settings(max_examples=100, deadline=None)
@given(share=st.floats(0.05, 0.99), start=st.floats(0.5, 5.0), tolerance=st.floats(0.005, 0.2))
def test_rate_search_tries_the_midpoint_first_and_saves_the_half_start_look(share, start, tolerance):
    """Where the boundary lies in [3/4, 1) of the start the search skips halving's look at start / 2 and
    otherwise walks halving's path (one look more only where the boundary is below start / 2), to the
    same bracket."""
    truth = share * start
    old = _halving_path(truth, start, tolerance)
    rates = []
    search = RateSearch(start, SearchSettings(tolerance=tolerance))
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(rate, rate <= truth)
    assert search.lo == max(r for r in old if r <= truth) and search.hi == min(r for r in old if r > truth)
    if truth >= (start * 0.5 + start) / 2:
        assert rates == [old[0]] + old[2:]
    elif truth >= start * 0.5:
        assert rates == [old[0], old[2], old[1]] + old[3:]
    else:
        assert sorted(rates) == sorted(old + [(start * 0.5 + start) / 2])


def _search_boundary(truth: float, start: float, tolerance: float) -> RateSearch:
    search = RateSearch(start, SearchSettings(tolerance=tolerance))
    while (rate := search.next_rate()) is not None:
        search.record(rate, rate <= truth)
    return search


@settings(max_examples=200, deadline=None)
@given(truth=st.floats(2 ** -9, 15.9), other=st.floats(2 ** -9, 15.9), start=st.floats(0.5, 5.0),
       tolerance=st.floats(0.001, 0.5))
def test_rate_search_invariants(truth, other, start, tolerance):
    """A monotone boundary within reach (start / 2**9 .. start * 2**4) is bracketed to the tolerance,
    and a lower boundary (a stricter SLO) never gives a higher rate."""
    truth, other = truth * start, other * start
    search = _search_boundary(truth, start, tolerance)
    assert search.lo is not None and search.hi is not None
    assert search.lo <= truth < search.hi and (search.hi - search.lo) / search.lo <= tolerance
    low, high = sorted((truth, other))
    assert _search_boundary(low, start, tolerance).lo <= _search_boundary(high, start, tolerance).lo


class _ScriptedRunner:
    """A Runner whose runs are never simulated: the scripted search below judges each look itself."""

    def __init__(self):
        self.runs, self.by_label, self.requests, self.cache = 0, {}, {}, {}
        self.progress = lambda text: None

    def run(self, wanted, then=None):
        return len(list(wanted))


def _scripted_search(verdict, mu: float = 10.0, tolerance: float = 0.02):
    """The search's rounds over a scripted verdict (rate, look) -> pass | fail | extend: what it
    records, and every look it asked for."""
    from specbatch.commands.capacity.search import Point, Probe, _Search

    asked, alone = [], []

    class Scripted(_Search):
        def probe(self):
            self.probes = {label: Probe(mu, 1.0, 1.0) for label in self.configs}

        def size(self, label, rate):
            return 100

        def looked(self, label, rate, n, look, extend=True, seeds=None, steps=False, keep=False):
            if seeds is None or len(seeds) == len(self.s.seeds):  # a look of the first seed alone is a part of one
                asked.append((rate, look))
            else:
                alone.append(rate)
            said = verdict(rate, look)
            return Point(rate, n, look, 100, {}, {}, said, said, rerun=200 * (look + 1) if said == "extend" else None)

    settings = SearchSettings(tolerance=tolerance, curve_points=0)
    outcome = Scripted(_ScriptedRunner(), {"p": None}, (), settings).run({})["p"]
    _scripted_search.alone = alone  # the rates looked at on the first seed alone
    return outcome, asked


@settings(max_examples=200, deadline=None)
@given(sure=st.floats(0.5, 9.0), unsure=st.floats(0.0, 3.0), holds=st.floats(0.0, 1.0))
def test_undecided_rates_are_rerun_only_when_they_would_be_the_max_rate(sure, unsure, holds):
    """Rates up to ``sure`` pass at their first look; up to ``sure + unsure`` they are undecided
    there, and the longer rerun passes them up to ``sure + holds * unsure``; above, they fail. The
    max rate is always a rate whose own runs passed, never above what the reruns hold; an undecided
    rate is rerun only as the bracket's lo at the end (so none below the max rate is), and no rate
    gets more looks than 1 + extensions."""
    held = sure + holds * unsure

    def verdict(rate, look):
        if rate <= sure:
            return "pass"
        if rate > sure + unsure:
            return "fail"
        if look == 0:
            return "extend"
        return "pass" if rate <= held else "fail"

    outcome, asked = _scripted_search(verdict)
    final = outcome.points[outcome.max_rate]
    assert final.verdict == "pass" and outcome.max_rate <= held
    assert outcome.bracket[1] is not None and (outcome.bracket[1] - outcome.max_rate) / outcome.max_rate <= 0.02
    reruns = [rate for rate, look in asked if look > 0]
    assert all(rate >= outcome.max_rate for rate in reruns)  # nothing below the answer was rerun
    assert all(rate not in reruns for rate, p in outcome.points.items() if p.verdict == "undecided")
    looks = {}
    for rate, look in asked:
        looks[rate] = looks.get(rate, 0) + 1
    assert max(looks.values()) <= SearchSettings().looks


@pytest.mark.parametrize("boundary", [5.0, 30.0])
def test_a_rate_above_saturation_runs_the_other_seeds_only_if_the_first_does_not_fail(boundary):
    """The start, 1.1 x the probe's 10 req/s, fails on the first seed alone when the boundary is below it
    (no other seed runs); above it, as the search doubles, each rate above saturation runs on the
    other seeds exactly when the first does not fail it, and the answer is the boundary's."""
    outcome, asked = _scripted_search(lambda rate, look: "pass" if rate <= boundary else "fail")
    alone = _scripted_search.alone
    assert alone[0] == pytest.approx(11.0) and all(rate >= 10.0 for rate in alone)
    if boundary < 11:
        assert all(rate < 10.0 for rate, _ in asked)  # the start never ran on the other seeds
    else:
        full = {rate for rate, _ in asked}
        assert all((rate in full) == (rate <= boundary) for rate in alone)  # the other seeds only after no fail
    assert boundary * 0.98 <= outcome.max_rate <= boundary


def test_an_undecided_lo_that_fails_its_rerun_brings_the_bracket_down():
    """Scripted: everything up to 8 is undecided at first and only up to 5 holds when rerun; the
    search, having gone up to 8 on first looks, must come back down to a max rate of at most 5
    shown by its own rerun, with the failed reruns as the bracket's hi."""
    outcome, asked = _scripted_search(lambda rate, look: "fail" if rate > 8 else
                                      "extend" if look == 0 else "pass" if rate <= 5 else "fail")
    assert 5 * 0.98 <= outcome.max_rate <= 5
    assert outcome.points[outcome.max_rate].verdict == "pass" and outcome.points[outcome.max_rate].look == 1
    assert (outcome.bracket[1] - outcome.max_rate) / outcome.max_rate <= 0.02
    assert any(look == 1 and rate > 5 for rate, look in asked)  # it did rerun higher undecided rates, which failed


@given(target=st.floats(1e-3, 1e4), rate=st.floats(1e-3, 1e3))
def test_replicas_are_the_fewest_that_carry_the_target(target, rate):
    n = replicas_needed(target, rate)
    assert n >= 1 and n * rate >= target * (1 - 1e-9)
    assert n == 1 or (n - 1) * rate < target


# ------------------------------------------------------------------ replicas and cost

def test_replicas_and_cost_arithmetic():
    assert replicas_needed(10.0, 3.0) == 4
    assert replicas_needed(9.0, 3.0) == 3
    assert replicas_needed(0.1 + 0.2, 0.1) == 3  # 3.0000000000000004 is still 3
    assert replicas_needed(0.5, 3.0) == 1
    assert replicas_needed(1.0, 0.0) is None
    # 1 req/s of 100 tokens = 360,000 tokens an hour on one $3.60 GPU: $10 per million.
    assert cost_per_million(1.0, 100.0, 1, 3.6) == pytest.approx(10.0)
    c = costing(max_rate=3.0, mean_output_tokens=100.0, target_rate=10.0, price=3.6, gpus_per_replica=2)
    assert c.replicas == 4
    assert c.cost_per_m_at_max_rate == pytest.approx(2 * 3.6 / (3.0 * 100 * 3600) * 1e6)
    assert c.cost_per_m_at_target == pytest.approx(4 * 2 * 3.6 / (10.0 * 100 * 3600) * 1e6)
    assert costing(0.0, 100.0, 10.0, 3.6, 1).cost_per_m_at_target is None
    assert costing(3.0, 100.0, None, None, 1).replicas is None


# ------------------------------------------------------------------ inputs

def test_slo_parsing():
    assert parse_slo("p99_ttft_ms=2000") == SLO("p99_ttft_ms", 2000.0)
    assert parse_slo("p50_tpot_ms=80") == SLO("median_tpot_ms", 80.0)
    assert parse_slos(["p99_ttft_ms=2000,p90_tpot_ms=500", "mean_e2el_ms=9e3"]) == (
        SLO("p99_ttft_ms", 2000.0), SLO("p90_tpot_ms", 500.0), SLO("mean_e2el_ms", 9000.0))
    assert SLO("p99_ttft_ms", 1.0).latency == "ttft"


@pytest.mark.parametrize("text, says", [
    ("p99_ttft=2000", "unknown metric 'p99_ttft'"),
    ("p95_ttft_ms=2000", "unknown metric"),
    ("p99_ttft_ms", "is not METRIC=MILLISECONDS"),
    ("p99_ttft_ms=fast", "'fast' in 'p99_ttft_ms=fast' is not a number"),
    ("p99_ttft_ms=0", "must be a positive number"),
    ("p99_ttft_ms=inf", "must be a positive number"),
])
def test_bad_slo(text, says):
    with pytest.raises(InputError, match=says) as info:
        parse_slos([text])
    assert info.value.source == "--slo"


def test_policy_specs():
    specs = parse_policies("none,fixed:k=2,goodput:k_max=3:alpha_init=0.6,my.mod:MyPolicy:k=1")
    assert [(s.label, s.name, s.params) for s in specs] == [
        ("none", "none", {}), ("fixed:k=2", "fixed", {"k": 2}),
        ("goodput:k_max=3:alpha_init=0.6", "goodput", {"k_max": 3, "alpha_init": 0.6}),
        ("my.mod:MyPolicy:k=1", "my.mod:MyPolicy", {"k": 1})]
    for bad, says in (("none,,fixed", "empty policy"), ("fixed:k=", "is not KEY=VALUE"), (":k=2", "no policy name"),
                      ("none,none", "listed twice")):
        with pytest.raises(InputError, match=says):
            parse_policies(bad)


def test_base_policy_parameters_apply_only_to_the_same_policy(run_config):
    base = run_config(policy__name="fixed", policy__k=4)
    fixed, goodput = parse_policies("fixed,goodput")
    assert policy_config(base, fixed).policy.params == {"k": 4}
    assert policy_config(base, goodput).policy.params == {}


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["capacity", "--quiet", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("args, says", [
    (["--slo", "p99_latency_ms=10"], "--slo: unknown metric 'p99_latency_ms'"),
    (["--slo", "p99_ttft_ms:10"], "--slo: 'p99_ttft_ms:10' is not METRIC=MILLISECONDS"),
    (["--policies", "none,nope"], "--policies: policy.name: nope: unknown policy"),
    (["--policies", "fixed:k=99"], "--policies: policy.k: fixed:k=99:"),
    (["--target-rate", "0"], "--target-rate: must be greater than 0, got 0"),
    (["--gpu-hour-price", "-2"], "--gpu-hour-price: must be greater than 0, got -2"),
    (["--seeds", "0"], "--seeds: must be at least 1"),
    (["--tolerance", "1.5"], "--tolerance: must be inside (0, 1)"),
    (["--alpha", "1.5"], "--alpha: acceptance.alpha: must be inside (0, 1)"),
    (["--speculative-config", '{"method": "nope", "num_speculative_tokens": 2}'],
     "--speculative-config: speculative.config: method 'nope' is not one of"),
    # a method the profile cannot price, under the default policies (none, which never drafts, first)
    (["--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 2}'],
     "--speculative-config: speculative.config: profile 'synthetic' has no eagle3 passes"),
    (["--speculative-config", '{"method": "draft_model", "num_speculative_tokens": 2}', "--policies",
      "sglang-adaptive"], "beyond the method's num_speculative_tokens = 2"),
])
def test_bad_inputs_fail_first_with_one_line(args, says, synthetic_profile, tmp_path, capsys):
    out = tmp_path / "report"
    base = ["--profile", str(synthetic_profile), "--out", str(out)]
    if "--slo" not in args:
        base += ["--slo", "p99_ttft_ms=1000"]
    code, _, err = _cli(base + args, capsys)
    assert code == 2 and says in err and err.count("\n") == 1, err
    assert not out.exists() and not any(p.name.startswith(".report") for p in tmp_path.iterdir())


def test_trace_scenarios_are_refused(synthetic_profile, tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,8\n")
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'profile = "{synthetic_profile}"\n[workload]\ntrace = "{trace}"\n')
    code, _, err = _cli(["--config", str(scenario), "--slo", "p99_ttft_ms=1000"], capsys)
    assert code == 2 and f"{scenario}:3: workload.trace: a capacity search needs generated arrivals" in err


def test_cluster_scenarios_are_refused(synthetic_profile, tmp_path, capsys):
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'profile = "{synthetic_profile}"\n\n[cluster]\nreplicas = 4\n')
    code, _, err = _cli(["--config", str(scenario), "--slo", "p99_ttft_ms=1000"], capsys)
    assert code == 2 and f"{scenario}:4: cluster.replicas: a capacity search sizes one replica" in err


def test_without_matplotlib_the_report_has_no_figures_and_says_so(monkeypatch, capsys, synthetic_profile, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    out = tmp_path / "plain"
    code, printed, _ = _cli(["--quiet", "--profile", str(synthetic_profile), "--out", str(out), *REPORT_ARGS], capsys)
    assert code == 0 and "no figures: matplotlib is not installed, pip install 'specbatch[report]'" in printed
    assert sorted(p.name for p in out.iterdir()) == ["capacity.json", "report.html", "report.md"]
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert "No figures: matplotlib is not installed" in text and ".png" not in text


def test_the_rate_is_the_search_s_to_choose(capsys):
    with pytest.raises(SystemExit) as info:
        main(["capacity", "--slo", "p99_ttft_ms=1000", "--rate", "3"])
    assert info.value.code == 2 and "unrecognized arguments: --rate 3" in capsys.readouterr().err


# ------------------------------------------------------------------ the report

REPORT_ARGS = ["--policies", "none,fixed:k=2", "--slo", "p99_e2el_ms=1500", "--slo", "p90_tpot_ms=80",
               "--output-tokens", "16", "--prompt-tokens", "32", "--seeds", "2", "--min-requests", "30",
               "--service-times", "10", "--max-growth", "0.1", "--tolerance", "0.15", "--curve-points", "2",
               "--target-rate", "100", "--gpu-hour-price", "2.5"]


@pytest.fixture(scope="module")
def report(synthetic_profile, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("capacity") / "report"
    assert main(["capacity", "--quiet", "--profile", str(synthetic_profile), "--jobs", "2", "--out", str(out),
                 *REPORT_ARGS]) == 0
    return out


def test_report_files(report):
    names = sorted(p.name for p in report.iterdir())
    assert names == ["capacity.json", "goodput_vs_rate.png", "latency_vs_rate.png", "operating_point.png",
                     "report.html", "report.md"]
    md = (report / "report.md").read_text()
    for text in ("| synthetic | measured | hand-made [synthetic] | 1 | float32 | synthetic-target | synthetic-draft | "
                 "$2.5 per GPU-hour |", "p99_e2el_ms <= 1500 ms; p90_tpot_ms <= 80 ms", "| seeds | 0, 1 |",
                 "![latency vs rate](latency_vs_rate.png)", "replicas for 100 req/s", "$ / 1M output tokens",
                 "| GPU prices | --gpu-hour-price 2.5; a replica of N GPUs costs N GPU-hours an hour |"):
        assert text in md
    assert "Cost by GPU" not in md  # one profile: nothing to compare
    html = (report / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 3
    assert "http" not in html.replace("http-equiv", "")  # nothing external to fetch
    import json

    doc = json.loads((report / "capacity.json").read_text())
    assert doc["profile_order"] == ["synthetic"] and doc["profiles"]["synthetic"]["gpu_hour_price"] == 2.5
    for label in ("none", "fixed:k=2"):
        result = doc["profiles"]["synthetic"]["policies"][label]
        rate = result["max_rate_req_s"]
        assert rate > 0 and result["replicas"] == math.ceil(100 / rate)
        assert result["operating_point"]["p99_e2el_ms"] <= 1500 and result["operating_point"]["p90_tpot_ms"] <= 80
        # The evidence of every rate tried: the queue test, the SLOs' bounds, the verdict; goodput never above the rate.
        assert result["saturation_probe"]["throughput_req_s"] > 0 and result["runs"] > 0
        for point in result["points"]:
            assert point["verdict"] in ("pass", "fail", "undecided") and point["reason"]
            assert point["goodput"] <= point["rate_req_s"] * (1 + 1e-12)
            assert point["queue"]["verdict"] in ("stable", "grows", "undecided")
            assert point["queue"]["low"] <= point["queue"]["growth"] <= point["queue"]["high"]
            if point["verdict"] == "pass":
                assert point["queue"]["high"] < point["queue"]["tolerated"]
                assert point["p99_e2el_ms_upper"] <= 1500 and point["p90_tpot_ms_upper"] <= 80
        passed = [p["rate_req_s"] for p in result["points"] if p["verdict"] == "pass" and not p["curve_point"]]
        assert max(passed) == rate
    assert "## Evidence per rate" in md and "queue growth (req/s) [bounds]" in md
    assert doc["search"]["stable_queue"] == {"max_growth_of_arrivals": 0.1, "confidence": 0.95,
                                             "confidence_per_look": pytest.approx(1 - 0.05 / 3)}


def test_report_is_deterministic_in_process_or_on_a_pool(report, synthetic_profile, tmp_path):
    again = tmp_path / "again"
    assert main(["capacity", "--quiet", "--profile", str(synthetic_profile), "--jobs", "1", "--out", str(again),
                 *REPORT_ARGS]) == 0
    for path in report.iterdir():
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name


def test_the_console_script_ends_without_teardown_once_the_report_is_written(synthetic_profile, tmp_path):
    """After a search its process ends by os._exit (the interpreter's teardown took 0.27-0.32 s after the
    default search's last line): exit status 0, the report whole, the output flushed, the exit handlers
    (here one that would print) never run, and the pool's workers and fork server gone without a leaked
    semaphore's warning."""
    import subprocess
    import sys

    out = tmp_path / "report"
    code = ("import atexit, sys; from specbatch.commands.cli import entry_point; "
            "atexit.register(lambda: print('teardown ran')); sys.argv = ['specbatch', *sys.argv[1:]]; entry_point()")
    done = subprocess.run([sys.executable, "-c", code, "capacity", "--quiet", "--profile", str(synthetic_profile),
                           "--jobs", "2", "--out", str(out), *REPORT_ARGS], capture_output=True, text=True, timeout=300)
    # (stderr may carry a fresh machine's one-time notes, matplotlib's font cache say: not the tracker's warning)
    assert done.returncode == 0 and "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "teardown ran" not in done.stdout and done.stdout.splitlines()[-1].startswith("Search took")
    assert (out / "capacity.json").is_file() and (out / "report.html").is_file()


def test_a_folder_that_is_not_a_report_is_refused_before_any_work(synthetic_profile, tmp_path, capsys, monkeypatch):
    from specbatch.commands.capacity import search

    monkeypatch.setattr(search, "_Search", lambda *a: pytest.fail("searched before checking --out"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    code = main(["capacity", "--quiet", "--profile", str(synthetic_profile), "--out", str(other), *REPORT_ARGS])
    assert code == 2
    assert capsys.readouterr().err == f"error: --out {other}: exists and is not a specbatch capacity report; " \
                                      "refusing to replace it\n"
    assert [p.name for p in other.iterdir()] == ["keep.txt"]


def test_a_report_is_replaced_whole(report, tmp_path):
    from specbatch.commands.capacity.report import write_report

    target = tmp_path / "r"
    write_report(target, *_small_outcome(report))
    (target / "stale.png").write_bytes(b"old")
    write_report(target, *_small_outcome(report))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    assert not (target / "stale.png").exists() and (target / "report.html").is_file()


def test_report_is_written_whole_or_not_at_all(report, monkeypatch, tmp_path):
    from specbatch.commands.capacity import report as report_module

    def broken(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report_module, "html_page", broken)
    inputs, outcomes, costs = _small_outcome(report)
    with pytest.raises(RuntimeError):
        report_module.write_report(tmp_path / "r", inputs, outcomes, costs)
    assert list(tmp_path.iterdir()) == []


def _small_outcome(report: Path):
    """A hand-made result to write without searching (the report writer alone)."""
    import numpy as np

    from specbatch.commands.capacity.costing import Costing
    from specbatch.commands.capacity.report import PricedProfile, ReportInputs
    from specbatch.commands.capacity.search import PolicyOutcome
    from specbatch.commands.described import describe
    from sim.config import load_config

    from specbatch.commands.capacity.search import Point, Probe

    stats = {"p99_e2el_ms": 10.0, "p99_e2el_ms_upper": 11.0, "goodput": 1.0, "mean_k": 0.0, "mean_batch_size": 1.0,
             "throughput": 1.0, "arrival_rate": 1.0}
    queue = {"growth": 0.0, "low": -0.001, "high": 0.001, "tolerated": 0.01, "verdict": "stable"}
    config = load_config(CPU_DEFAULTS)
    outcome = PolicyOutcome("none", config, Probe(2.0, 10.0, 20.0), 1.0, (1.0, 1.1),
                            points={1.0: Point(1.0, 100, 0, 100, stats, queue, "pass", "shown")},
                            steps={"start_s": np.arange(3.0), "phase": np.ones(3), "running": np.ones(3),
                                   "k": np.zeros(3)})
    facts = {"name": "p", "gpu": "?", "source": "measured", "device": {}, "dtype": None, "models": {},
             "described": describe(config)}
    inputs = ReportInputs({"p": PricedProfile(facts, None)},
                          {"arrival": "a", "prompt_tokens": "1", "output_tokens": "1", "batching": "b"},
                          (SLO("p99_e2el_ms", 20.0),), SearchSettings(), None, 1)
    return inputs, {"p": {"none": outcome}}, {"p": {"none": Costing(None, None, None)}}


# ------------------------------------------------------------------ the HTML in a real browser

def _chromium() -> tuple[str, str] | None:
    browser = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def test_html_report_renders_its_figures_in_headless_chromium(report):
    title, sizes = _render_in_chromium(report / "report.html")
    assert title == "Capacity report: synthetic"
    assert len(sizes) == 3
    for complete, width, height, shown in sizes:
        assert complete and width > 0 and height > 0 and shown > 0


def test_comparison_html_renders_its_four_figures_in_headless_chromium(comparison):
    title, sizes = _render_in_chromium(comparison[0] / "report.html")
    assert title == "Capacity report: slow-h100 vs fast-h200"
    assert len(sizes) == 4
    for complete, width, height, shown in sizes:
        assert complete and width > 0 and height > 0 and shown > 0


def _render_in_chromium(page: Path) -> tuple[str, list]:
    """The page's title and, per <img>, (loaded, natural width, natural height, shown width)."""
    found = _chromium()
    if found is None:
        pytest.skip("no chromium and chromedriver on PATH (Debian: apt-get install -y chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    profile_dir = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile_dir}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        driver.set_page_load_timeout(60)
        driver.get(page.resolve().as_uri())
        sizes = driver.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight,"
            " i.getBoundingClientRect().width]);")
        title = driver.title
    finally:
        driver.quit()
        shutil.rmtree(profile_dir, ignore_errors=True)
    return title, sizes


# ------------------------------------------------------------------ GPUs and their prices

COMPOSED_H100 = {"source": "composed", "gpu": "h100_sxm", "device": {"type": "cuda", "name": "h100_sxm"}}
MEASURED_H100 = {"device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}}
MEASURED_CPU = {"device": {"type": "cpu", "name": "AMD EPYC"}}


def test_profile_gpu_reads_composed_and_measured_sidecars():
    assert profile_gpu(COMPOSED_H100) == "h100_sxm"
    assert profile_gpu({"source": "composed", "device": {"gpu": "l40s", "type": "cuda"}}) == "l40s"
    assert profile_gpu({"source": "composed", "composition": {"gpu": "h200_sxm"},
                        "device": {"type": "cuda", "name": "NVIDIA H200"}}) == "h200_sxm"
    assert profile_gpu(MEASURED_H100) == "NVIDIA H100 80GB HBM3"
    assert profile_gpu(MEASURED_CPU) == "AMD EPYC"
    assert profile_gpu({"device": {"type": "cuda"}}) == "cuda"
    assert profile_gpu({}) == "unknown device"


def test_a_price_key_matches_by_its_words():
    prices = parse_gpu_prices("h100=3.9,h200=4.5,l40s=1.9,cpu=0.2")
    assert gpu_price(COMPOSED_H100, prices, "p") == ("h100", 3.9)
    assert gpu_price(MEASURED_H100, prices, "p") == ("h100", 3.9)
    assert gpu_price({"gpu": "h200_sxm"}, prices, "p") == ("h200", 4.5)
    assert gpu_price({"gpu": "l40s"}, prices, "p") == ("l40s", 1.9)
    assert gpu_price(MEASURED_CPU, prices, "p") == ("cpu", 0.2)
    # the most specific key wins; h20 is not h200
    assert gpu_price(COMPOSED_H100, {"h100": 3.0, "h100_sxm": 4.0}, "p") == ("h100_sxm", 4.0)
    with pytest.raises(InputError, match="no price for the GPU of profile big .'h200_sxm'.; prices given for: "
                                         "h20; add one, e.g. --gpu-price h200_sxm=PRICE") as info:
        gpu_price({"gpu": "h200_sxm"}, {"h20": 1.0}, "big")
    assert info.value.source == "--gpu-price"
    with pytest.raises(InputError, match="'h100' and 'nvidia' both match the GPU of profile p"):
        gpu_price(MEASURED_H100, {"h100": 3.0, "nvidia": 4.0}, "p")


def test_gpu_prices_from_a_toml_file(tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text('# $ per GPU-hour\nh100_sxm = 3.9\n"h200" = 4.5\nl40s = 2\n')
    assert parse_gpu_prices(str(path)) == {"h100_sxm": 3.9, "h200": 4.5, "l40s": 2.0}


@pytest.mark.parametrize("text, says", [
    ("h100", "'h100' is neither GPU=PRICE pairs"),
    ("h100=", "'h100=' is not GPU=PRICE"),
    ("h100=3,,h200=4", "'' is not GPU=PRICE"),
    ("h100=cheap", "'cheap' for h100 is not a price"),
    ("h100=0", "the price of h100 must be a positive number per GPU-hour, got 0"),
    ("h100=nan", "must be a positive number"),
    ("h100=3,H100=4", "H100 is given twice ('h100' and 'H100')"),
    ("_=3", "'_' names no GPU"),
])
def test_bad_gpu_prices(text, says):
    with pytest.raises(InputError, match=re.escape(says)) as info:
        parse_gpu_prices(text)
    assert info.value.source == "--gpu-price"


@pytest.mark.parametrize("body, says", [
    ("h100 = 3.9\nh200 = -1\n", ":2: the price of h200 must be a positive number"),
    ("h100 = 3.9\nh200 = 'cheap'\n", ":2: h200: expected a price per GPU-hour (a number), got 'cheap'"),
    ("h100 = 3.9\nh200 = \n", ":2: not valid TOML"),
    ("# nothing\n", "no prices"),
])
def test_bad_gpu_price_files_name_the_line(body, says, tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text(body)
    with pytest.raises(InputError, match=re.escape(says)) as info:
        parse_gpu_prices(str(path))
    assert info.value.source == f"--gpu-price {path}"


@given(rate=st.floats(1e-3, 1e3), tokens=st.floats(1.0, 1e4), target=st.floats(1e-3, 1e4),
       price=st.floats(1e-2, 1e2), more=st.floats(1.0, 10.0), gpus=st.integers(1, 8))
def test_cost_invariants(rate, tokens, target, price, more, gpus):
    """Cost per token is linear (so monotone) in the price, falls as a replica sustains more, the fleet
    costs replicas x GPUs x price, and serving the target never costs less per token than the floor."""
    c = costing(rate, tokens, target, price, gpus)
    dearer = costing(rate, tokens, target, price * more, gpus)
    faster = costing(rate * more, tokens, target, price, gpus)
    assert dearer.cost_per_m_at_target == pytest.approx(more * c.cost_per_m_at_target)
    assert dearer.cost_per_m_at_max_rate == pytest.approx(more * c.cost_per_m_at_max_rate)
    assert faster.cost_per_m_at_max_rate == pytest.approx(c.cost_per_m_at_max_rate / more)
    assert faster.replicas <= c.replicas and faster.cost_per_m_at_target <= c.cost_per_m_at_target * (1 + 1e-9)
    assert c.fleet_cost_per_hour == pytest.approx(c.replicas * gpus * price)
    assert c.cost_per_m_at_target >= c.cost_per_m_at_max_rate * (1 - 1e-9)
    # the fleet's hourly cost over the tokens the target generates in an hour
    assert c.cost_per_m_at_target == pytest.approx(c.fleet_cost_per_hour / (target * tokens * 3600) * 1e6)


# ------------------------------------------------------------------ several profiles, one per GPU

def _retag(profile: Path, **meta) -> Path:
    import json

    sidecar = profile / "profile.json"
    doc = json.loads(sidecar.read_text())
    doc.update({k: v for k, v in meta.items() if k != "device"})
    doc["device"].update(meta.get("device", {}))
    sidecar.write_text(json.dumps(doc))
    return profile


@pytest.fixture(scope="module")
def gpu_profiles(tmp_path_factory) -> tuple[Path, Path]:
    """Two constant-step profiles: a 'composed H100' at 10 ms a step (40 req/s a replica) and a 'measured
    H200' twice as fast (80 req/s)."""
    root = tmp_path_factory.mktemp("gpus")
    slow = make_profile(root / "slow-h100", constant_latency)
    fast = make_profile(root / "fast-h200", lambda *a: constant_latency(*a) / 2)
    return (_retag(slow, source="composed", gpu="h100_sxm", device={"type": "cuda", "name": "h100_sxm"}),
            _retag(fast, device={"type": "cuda", "name": "NVIDIA H200"}))


COMPARE_ARGS = ["--policies", "none", "--slo", "p99_e2el_ms=100000", "--arrival", "gamma", "--burstiness", "1e8",
                "--scheduler", "v0",  # the known answer's engine: a prefill step costs nothing, 10 decode steps do
                "--prompt-tokens", "32", "--output-tokens", str(OUTPUT_TOKENS), "--max-batch-size", str(MAX_BATCH),
                "--seeds", "1", "--min-requests", "60", "--tolerance", "0.04",
                "--curve-points", "2", "--target-rate", "100", "--gpu-price", "h100=2,h200=3"]


@pytest.fixture(scope="module")
def comparison(gpu_profiles, tmp_path_factory) -> tuple[Path, str]:
    import contextlib
    import io

    out = tmp_path_factory.mktemp("compare") / "report"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["capacity", "--quiet", "--profiles", ",".join(map(str, gpu_profiles)), "--jobs", "2",
                     "--out", str(out), *COMPARE_ARGS]) == 0
    return out, printed.getvalue()


def test_profiles_are_sized_for_the_same_traffic_and_priced_per_gpu(comparison):
    """Known answers: 40 and 80 req/s a replica, so 100 req/s needs 3 H100s ($6/h) or 2 H200s ($6/h)."""
    import json

    out, printed = comparison
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["profile_order"] == ["slow-h100", "fast-h200"]
    slow, fast = doc["profiles"]["slow-h100"], doc["profiles"]["fast-h200"]
    assert (slow["gpu"], slow["source"], slow["gpu_hour_price"], slow["price_key"]) == ("h100_sxm", "composed", 2, "h100")
    assert (fast["gpu"], fast["source"], fast["gpu_hour_price"], fast["price_key"]) == ("NVIDIA H200", "measured", 3,
                                                                                       "h200")
    slow, fast = slow["policies"]["none"], fast["policies"]["none"]
    assert abs(slow["max_rate_req_s"] / SERVICE_RATE - 1) <= 0.08
    assert abs(fast["max_rate_req_s"] / (2 * SERVICE_RATE) - 1) <= 0.08
    assert (slow["replicas"], fast["replicas"]) == (3, 2)
    assert slow["fleet_cost_per_hour"] == 6 and fast["fleet_cost_per_hour"] == 6
    # the same traffic, so the same fleet cost is the same cost per token; at max rate the H200 is cheaper
    assert slow["cost_per_m_output_tokens_at_target"] == pytest.approx(fast["cost_per_m_output_tokens_at_target"])
    expected = 6 / (100 * OUTPUT_TOKENS * 3600) * 1e6
    assert slow["cost_per_m_output_tokens_at_target"] == pytest.approx(expected)
    assert fast["cost_per_m_output_tokens_at_max_rate"] < slow["cost_per_m_output_tokens_at_max_rate"]
    # the printed output: the results, the comparison and the prices used
    assert "profile    GPU          GPUs / replica  policy  max rate per replica (req/s)  replicas for 100 req/s" in printed
    assert "Prices (--gpu-price h100=2,h200=3): slow-h100 (h100_sxm) $2 per GPU-hour (h100 in --gpu-price); " \
           "fast-h200 (NVIDIA H200) $3 per GPU-hour (h200 in --gpu-price)" in printed


def test_comparison_report_has_the_cost_figure_and_table(comparison):
    out, _ = comparison
    assert sorted(p.name for p in out.iterdir()) == [
        "capacity.json", "cost_by_gpu.png", "goodput_vs_rate.png", "latency_vs_rate.png", "operating_point.png",
        "report.html", "report.md"]
    md = (out / "report.md").read_text()
    assert md.startswith("# Capacity report: slow-h100 vs fast-h200\n")
    for text in ("## Cost by GPU", "![cost by gpu](cost_by_gpu.png)", "| slow-h100 | h100_sxm | 1 | none |",
                 "| 3 | 3 | $2 | $6.00 |", "| fast-h200 | NVIDIA H200 | 1 | none |", "| 2 | 2 | $3 | $6.00 |",
                 "| slow-h100 | composed | h100_sxm [cuda] | 1 |", "$2 per GPU-hour (h100 in --gpu-price)"):
        assert text in md, text
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 4 and "<h2>Cost by GPU</h2>" in html
    from PIL import Image

    with Image.open(out / "cost_by_gpu.png") as image:
        assert image.size[0] > 500 and image.size[1] > 300


@pytest.mark.parametrize("args, says", [
    (["--profile", "X"], "--profiles: give --profile or --profiles, not both"),
    (["--gpu-price", None], "--gpu-price: comparing profiles needs each GPU's price per hour"),
    (["--gpu-price", "h100=2"], "--gpu-price: no price for the GPU of profile fast-h200 ('NVIDIA H200'); "
                                "prices given for: h100; add one, e.g. --gpu-price nvidia_h200=PRICE"),
    (["--gpu-price", "h100=2,h200=3", "--gpu-hour-price", "2"], "--gpu-price: give one price for every GPU"),
    (["--gpu-price", "h100=2;h200=3"], "--gpu-price: '2;h200=3' for h100 is not a price"),
    (["--profiles", "nope"], "--profiles: no profile directory 'nope' and no shipped profile of that name"),
    (["--profiles", "A,,B"], "--profiles: empty profile name in '"),
    (["--profiles", "A,A"], "--profiles: profile slow-h100 is listed twice"),
    (["--policies", "fixed:k=9"], "--policies: policy.k: slow-h100 / fixed:k=9: k = 9 is beyond"),
])
def test_bad_comparison_inputs_fail_first_with_one_line(args, says, gpu_profiles, tmp_path, capsys):
    slow, fast = map(str, gpu_profiles)
    given = ["--profiles", f"{slow},{fast}", "--gpu-price", "h100=2,h200=3", "--slo", "p99_ttft_ms=1000"]
    for flag, value in zip(args[::2], args[1::2]):
        at = given.index(flag) if flag in given else None
        value = None if value is None else value.replace("X", slow).replace("A", slow).replace("B", fast)
        if at is not None:
            del given[at:at + 2]
        if value is not None:
            given += [flag, value]
    out = tmp_path / "report"
    code, _, err = _cli(given + ["--out", str(out)], capsys)
    assert code == 2 and says in err and err.count("\n") == 1, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_one_profile_is_priced_by_gpu_price_too(gpu_profiles, tmp_path, capsys):
    out = tmp_path / "report"
    code, _, err = _cli(["--profile", str(gpu_profiles[1]), "--gpu-price", "h100=2", "--slo", "p99_ttft_ms=1000",
                         "--out", str(out)], capsys)
    assert code == 2 and err == ("error: --gpu-price: no price for the GPU of profile fast-h200 ('NVIDIA H200'); "
                                 "prices given for: h100; add one, e.g. --gpu-price nvidia_h200=PRICE\n")
    assert list(tmp_path.iterdir()) == []


def _point_run(ttft_ms, tpot_ms) -> "PointRun":
    from specbatch.commands.capacity.search import PointRun

    ttft, tpot = np.asarray(ttft_ms, float) / 1e3, np.asarray(tpot_ms, float) / 1e3
    return PointRun(rate=1.0, seed=0, num_requests=ttft.size, growth=None, window=np.zeros(ttft.size, np.int64),
                    ttft_s=ttft, tpot_s=tpot, e2el_s=ttft + tpot, output_tokens=np.ones(ttft.size), mean_k=0.0,
                    mean_batch_size=1.0)


@settings(max_examples=300, deadline=None)
@given(first=st.lists(st.floats(1.0, 3000.0), min_size=1, max_size=60),
       others=st.lists(st.lists(st.floats(0.0, 3000.0), max_size=40), min_size=1, max_size=3),
       stat=st.sampled_from(["mean", "median", "p90", "p99"]), limit=st.floats(10.0, 2500.0))
def test_a_certain_miss_is_missed_whatever_the_other_seeds_hold(first, others, stat, limit):
    """certain_miss says an SLO is missed from the first seed alone only where the pooled statistic is over
    the limit for any other seeds' values (each seed at most ``per_run`` measured requests): the search may
    then leave them unrun, and the pooled estimate of the fail it would have judged is over the limit too."""
    from specbatch.commands.capacity.search import certain_miss
    from sim.metrics import distribution_stats

    slo = SLO(f"{stat}_ttft_ms", limit)
    per_run = max(len(o) for o in others)
    run = _point_run(first, [np.nan] * len(first))
    if certain_miss(run, (slo,), len(others), per_run) is not None:
        pooled = np.concatenate([np.asarray(first), *[np.asarray(o, float) for o in others]]) / 1e3
        assert distribution_stats("ttft", pooled)[slo.metric] > limit
        assert distribution_stats("ttft", run.ttft_s)[slo.metric] > limit  # the first seed alone fails it too


def test_a_certain_miss_needs_enough_of_the_first_seed_over_the_limit():
    from specbatch.commands.capacity.search import certain_miss

    slo = SLO("p99_ttft_ms", 1000.0)
    # 100 requests, 2 more runs of at most 100: at most 300 pooled, so 300 - floor(0.99 x 299) + 1 = 5 must be over
    assert certain_miss(_point_run([2000.0] * 5 + [10.0] * 95, [np.nan] * 100), (slo,), 2, 100) == slo.metric
    assert certain_miss(_point_run([2000.0] * 4 + [10.0] * 96, [np.nan] * 100), (slo,), 2, 100) is None
    # a one-token request has no TPOT: it counts neither way
    tpot = SLO("p90_tpot_ms", 40.0)
    assert certain_miss(_point_run([10.0] * 6, [50.0] * 4 + [np.nan] * 2), (tpot,), 0, 0) == tpot.metric
    assert certain_miss(_point_run([10.0] * 6, [50.0] * 2 + [10.0] * 2 + [np.nan] * 2), (tpot,), 0, 0) is None


def test_the_report_figures_keep_every_label_inside_and_apart(report, monkeypatch):
    """The figures are placed by fixed margins (no tight_layout): with two profiles, rates up to 1000 req/s and
    latencies over five decades, every label stays inside its figure and clear of the others."""
    from dataclasses import replace

    from specbatch.commands.capacity import report as report_module
    from specbatch.commands.capacity.search import Point
    from tests.test_figures import labels_fit

    inputs, outcomes, costs = _small_outcome(report)
    (base,) = outcomes["p"].values()
    queue = {"growth": 0.0, "low": -0.001, "high": 0.001, "tolerated": 0.01, "verdict": "stable"}
    points = {rate: Point(rate, 100, 0, 100, {**base.points[1.0].stats, "p99_e2el_ms": rate ** 1.6, "goodput": rate,
                                              "throughput": rate}, queue, "pass", "shown")
              for rate in (1.0, 10.0, 100.0, 1000.0)}
    wide = replace(base, points=points, max_rate=1000.0)
    outcomes = {"p": {"none": wide, "fixed": replace(wide, label="fixed")},
                "h100-llama-3.1-8b-eagle3-second": {"none": wide, "fixed": replace(wide, label="fixed")}}
    inputs = replace(inputs, profiles={name: inputs.profiles["p"] for name in outcomes})
    drawn = []
    real_png = report_module._png

    def checked_png(plt, fig):
        labels_fit(fig)
        drawn.append(fig)
        return real_png(plt, fig)

    monkeypatch.setattr(report_module, "_png", checked_png)
    from specbatch.commands.capacity.costing import Costing

    costs = {name: {label: Costing(None, None, 0.25) for label in by_policy} for name, by_policy in outcomes.items()}
    report_module.render_figures(inputs, outcomes, costs)
    assert len(drawn) >= 3
