"""The queue-growth test (sim/stability.py): known answers, its error rates on M/M/1 queues, and the
warning a run whose queue grows prints."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specbatch.commands.cli import main
from sim.stability import MAX_GROWTH, in_windows, measured_windows, queue_growth
from tests.conftest import CPU_DEFAULTS


def mm1(rng: np.random.Generator, arrival_rate: float, service_rate: float, n: int, replications: int):
    """(arrival_s, finish_s) of first-come first-served M/M/1 queues, one row per replication
    (Lindley's recursion, vectorised over the replications)."""
    arrival = np.cumsum(rng.exponential(1 / arrival_rate, (replications, n)), axis=1)
    arrival -= arrival[:, :1]
    service = rng.exponential(1 / service_rate, (replications, n))
    finish = np.empty_like(arrival)
    free = np.zeros(replications)
    for i in range(n):
        free = np.maximum(free, arrival[:, i]) + service[:, i]
        finish[:, i] = free
    return arrival, finish


def test_window_counts_are_those_of_the_sorted_times():
    """Counted per window without sorting: the same counts as searching the sorted times, unfinished
    requests (NaN), times before the first edge and at the last counted in no window."""
    rng = np.random.default_rng(4)
    times = np.concatenate((rng.uniform(0, 100, 5000), [np.nan] * 7, [-1.0, 200.0]))
    edges = measured_windows(times[:5000])
    edges = np.concatenate((edges[:3], [edges[3]] * 2, edges[4:]))  # an empty window too
    expected = np.diff(np.searchsorted(np.sort(times), edges))
    assert in_windows(times, edges).tolist() == expected.tolist()
    assert in_windows(times, np.array([times[0], times[0]])).tolist() == [0]


def test_the_t_quantile_is_scipys_and_comes_back_from_the_cache_without_importing_scipy(tmp_path, monkeypatch):
    """A constant-rate run's growth check needs one t quantile: stored in the fit cache, it is read
    back, to the bit, by a process that has not imported scipy.special (0.2 s), and computed where
    nothing is stored."""
    import subprocess
    import sys

    from scipy.special import stdtrit

    import sim.stability as stability

    monkeypatch.setenv("SPECBATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(stability, "_T_QUANTILES", {})
    assert stability.t_quantile(0.95, 9) == float(stdtrit(9, 0.95))
    assert len(list(tmp_path.glob("stdtrit-*.npz"))) == 1
    script = ("import sys; from sim.stability import t_quantile; v = t_quantile(0.95, 9); "
              "print(v.hex(), 'scipy.special' in sys.modules)")
    env = {**__import__("os").environ, "SPECBATCH_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [float(stdtrit(9, 0.95)).hex(), "False"]
    for entry in tmp_path.glob("stdtrit-*.npz"):
        entry.write_bytes(b"not an npz")  # unreadable: computed again (importing scipy), and stored again
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [float(stdtrit(9, 0.95)).hex(), "True"]


def test_known_answers():
    arrival = np.arange(1000) / 2.0                          # 2 req/s
    served = arrival + 0.25                                  # each done 0.25 s after it came: kept up
    growth = queue_growth([(arrival, served)])
    assert growth.arrival_rate == pytest.approx(2, rel=0.01) and growth.throughput == pytest.approx(2, rel=0.01)
    assert abs(growth.growth) < 0.01 and growth.verdict == "stable"
    backlog = np.arange(1000) / 1.0                          # one served per second: half stays behind
    growth = queue_growth([(arrival, backlog)])
    assert growth.growth == pytest.approx(1.0, rel=0.01) and growth.verdict == "grows"
    assert growth.low <= growth.growth <= growth.high
    assert queue_growth([(np.zeros(10), np.ones(10))]) is None  # every request at once: nothing to test


def test_an_overloaded_queue_passes_as_stable_at_most_five_percent_of_the_time():
    """At a growth of exactly the tolerated 1% of the arrivals the test says 'stable' about 5% of the
    time (the one-sided confidence), and beyond it less: the error that would overstate capacity."""
    rng = np.random.default_rng(0)
    rate = 10.0
    for service, most in ((rate * (1 - MAX_GROWTH), 0.08), (rate * 0.97, 0.01)):
        arrival, finish = mm1(rng, rate, service, 4000, 600)
        verdicts = [queue_growth([(arrival[3 * i + j], finish[3 * i + j]) for j in range(3)]).stable
                    for i in range(200)]
        assert np.mean(verdicts) <= most, service


def test_a_queue_that_keeps_up_is_shown_stable_given_a_long_enough_run():
    rng = np.random.default_rng(1)
    arrival, finish = mm1(rng, 8.0, 10.0, 20000, 90)
    verdicts = [queue_growth([(arrival[3 * i + j], finish[3 * i + j]) for j in range(3)]).verdict
                for i in range(30)]
    assert verdicts.count("stable") >= 27 and "grows" not in verdicts


def test_a_run_whose_queue_grows_says_so_once_and_in_summary_json(tmp_path, capsys):
    out = tmp_path / "overloaded"
    assert main(["run", "--config", str(CPU_DEFAULTS), "--rate", "2", "--duration", "600", "--records", "none",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "queue grows" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: the queue grows without bound")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["queue"]["verdict"] == "grows" and any("queue grows" in w for w in summary["warnings"])
    light = tmp_path / "light"
    assert main(["run", "--config", str(CPU_DEFAULTS), "--rate", "0.02", "--num-requests", "400",
                 "--records", "none", "--out", str(light)]) == 0
    assert "queue grows" not in capsys.readouterr().err
    assert json.loads((light / "summary.json").read_text())["queue"]["verdict"] != "grows"


def test_the_api_warns_too():
    import specbatch

    with pytest.warns(specbatch.RunWarning, match="the queue grows without bound"):
        run = specbatch.run(CPU_DEFAULTS, rate=2, num_requests=1200, records="none")
    assert run.document()["queue"]["verdict"] == "grows"


def test_runs_without_a_constant_open_loop_rate_are_not_tested(tmp_path):
    import specbatch

    closed = specbatch.run(CPU_DEFAULTS, rate=2, num_requests=200, max_concurrency=4, records="none")
    assert "queue" not in closed.document()
