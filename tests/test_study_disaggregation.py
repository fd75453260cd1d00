"""Study 11 (docs/studies/disaggregation.py): the goodput read from an attainment curve, the per-request SLO
test, a small sweep on the synthetic profile, and the checks that keep the page's stated directions honest."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

STUDIES = Path(__file__).resolve().parent.parent / "docs" / "studies"


def _load(name: str):
    """A fresh copy of the study's module under ``name`` (a test may change its constants on its own copy)."""
    if str(STUDIES) not in sys.path:  # the studies import their shared modules, as run_all.py lets them
        sys.path.insert(0, str(STUDIES))
    spec = importlib.util.spec_from_file_location(name, STUDIES / "disaggregation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations through the module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def study():
    return _load("study_disaggregation")


def curve(rates, attainment):
    return pd.DataFrame({"rate_per_gpu": rates, "attainment": attainment})


def test_goodput_interpolates_between_the_last_passing_and_the_first_failing_rate(study):
    value, at_top = study.goodput(curve([1.0, 2.0, 3.0], [0.99, 0.95, 0.85]))
    assert not at_top
    assert value == pytest.approx(2.5)  # 0.95 -> 0.85 crosses 0.9 halfway
    # A rate failing below a passing one ends the curve there: the later pass does not count.
    assert study.goodput(curve([1.0, 2.0, 3.0], [0.95, 0.8, 0.95]))[0] == pytest.approx(1.0 + 0.05 / 0.15)
    assert study.goodput(curve([1.0, 2.0], [0.85, 0.95])) == (0.0, False)
    assert study.goodput(curve([2.0, 1.0], [0.91, 0.99])) == (2.0, True)  # never fails: the grid's top, flagged


def test_meets_counts_both_limits_and_a_one_token_request_meets_any_tpot(study):
    requests = pd.DataFrame({"ttft_s": [0.1, 0.3, 0.1, 0.1], "tpot_s": [0.01, 0.01, 0.05, np.nan]})
    ttft, tpot = study.meets(requests, np.full(4, 0.2), np.full(4, 0.02), 1.0)
    assert ttft.tolist() == [True, False, True, True]
    assert tpot.tolist() == [True, True, False, True]
    ttft, tpot = study.meets(requests, np.full(4, 0.2), np.full(4, 0.02), 3.0)
    assert (ttft & tpot).all()


def test_lognormal_spec_has_the_stated_median(study):
    from workloads import parse_length_spec

    spec = parse_length_spec(study.lognormal(1500, 0.8, 100_000))
    lengths = spec.sample(np.random.default_rng(0), 200_000)
    assert np.median(lengths) == pytest.approx(1500, rel=0.02)


@pytest.fixture(scope="module")
def small(synthetic_profile):
    """A sweep on the synthetic profile: two units, one split, three rates, three SLO scales, short requests
    (on the study's own copy of the module, its constants made small)."""
    study = _load("study_disaggregation_small")
    study.UNITS, study.SPLITS, study.FRACTIONS = 2, ((1, 1),), (0.2, 0.6, 1.2)
    study.SCALES, study.SEEDS, study.NUM_REQUESTS = (0.5, 1.0, 4.0), (0, 1), 60
    setups = [study.Setup("absolute", "test", "-", "-", 1, "lognormal:48:0.5:96", "lognormal:24:0.5:48",
                          ttft_ms=3000.0, tpot_ms=300.0, prefill_first_baseline=True),
              study.Setup("relative", "test", "-", "-", 1, "lognormal:48:0.5:96", "lognormal:24:0.5:48",
                          ttft_slowdown=3.0, tpot_slowdown=1.5)]
    profile = str(synthetic_profile)
    sat = study.saturation(setups[0], profile)
    return study, profile, setups, sat, pd.concat([study.sweep(s, {1: profile}, sat) for s in setups])


def test_sweep_rows_and_attainment_grow_with_the_slo_scale(small):
    study, _, setups, sat, table = small
    assert sat > 0
    configs = {"absolute": 3, "relative": 2}  # aggregated (and prefill-first where asked), one split
    for setup in setups:
        sub = table[table.setup == setup.name]
        assert len(sub) == configs[setup.name] * 3 * 3
        assert set(sub.config) >= {study.V1, "1P:1D"}
    assert table[["attainment", "ttft_attainment", "tpot_attainment"]].stack().between(0, 1).all()
    assert (table.attainment <= table[["ttft_attainment", "tpot_attainment"]].min(axis=1) + 1e-12).all()
    for _, run in table.groupby(["setup", "config", "fraction"]):
        assert run.sort_values("slo_scale").attainment.is_monotonic_increasing
    frame = study.goodputs(table)
    best = frame[frame.config == "best split"]
    assert len(best) == 2 * 3 and (best.best_split == "1P:1D").all()


def test_relative_limits_are_each_requests_own_unloaded_latency(small):
    study, profile, setups, _, _ = small
    ttft, tpot = study.limits(setups[1], profile, 0)
    unloaded_ttft, unloaded_tpot = ttft / 3.0, tpot / 1.5
    assert ttft.shape == (60,) and (unloaded_ttft > 0).all()
    finite = np.isfinite(unloaded_tpot)  # a one-token request has no TPOT: an infinite limit
    assert (unloaded_tpot[finite] > 0).all()
    # Unloaded, every request meets its own limits at scale 1 (it is at most its own latency).
    alone = study.simulate_requests(setups[1], profile, {"workload.rate": 1e-3, "cluster.replicas": 1}, 0)
    assert np.all(np.concatenate(study.meets(alone, ttft, tpot, 1.0)))


def test_runs_are_deterministic(small):
    study, profile, setups, sat, _ = small
    settings = {"cluster.prefill_replicas": 1, "cluster.decode_replicas": 1, "workload.rate": sat}
    first = study.simulate_requests(setups[0], profile, settings, 0)
    assert first.equals(study.simulate_requests(setups[0], profile, settings, 0))


def test_check_holds_on_the_committed_results_and_fails_when_a_direction_turns(study):
    frame = pd.read_csv(STUDIES / "figures" / "disaggregation_goodput.csv")
    found = study.check(frame)
    rows = {r["key"]: r for r in study.published(found)}
    assert rows["conversation_tight"]["reproduced"] and not rows["distserve_tight"]["reproduced"]
    # Aggregated serving the conversation trace as well as the best split at Splitwise's SLOs turns its finding.
    turned = frame.copy()
    at = (turned.setup == "Splitwise conversation") & (turned.slo_scale == study.TIGHT)
    best = turned.loc[at & (turned.config == "best split"), "goodput_per_gpu"].iloc[0]
    turned.loc[at & (turned.config == study.V1), "goodput_per_gpu"] = best * 1.01
    with pytest.raises(AssertionError):
        study.check(turned)
