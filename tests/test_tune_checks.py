"""specbatch tune checks what it can before any run and leaves nothing behind when it fails.

A speculation method's num_speculative_tokens is the largest k of every baseline and trial (as vLLM
sizes every step by it), a baseline or trial that cannot run is refused in one line before the
first run, a run failing mid-tune removes what the tune wrote, and without matplotlib (the README's
first install) the report is written without its figure and says so.
"""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path

import pytest

from specbatch.commands.cli import main
from tests.synthetic import make_profile

SCENARIO = ["--prompt-tokens", "64", "--output-tokens", "24", "--max-batch-size", "8", "--rate", "4",
            "--num-requests", "40"]
SMALL = ["--bands", "1", "--seeds", "1", "--holdout-seeds", "1", "--executor", "serial", "--no-progress"]
EAGLE3_K2 = '{"method": "eagle3", "num_speculative_tokens": 2}'


@pytest.fixture(scope="module")
def eagle_profile(tmp_path_factory) -> Path:
    """k_max 7 measured (q up to 8), an EAGLE-3 head priced."""
    return make_profile(tmp_path_factory.mktemp("profiles") / "eagle", drafters=("eagle3",))


def tune(profile: Path, out: Path, *extra: str) -> int:
    return main(["tune", "--profile", str(profile), *SCENARIO, *SMALL, "--out", str(out), *extra])


def test_the_method_s_num_speculative_tokens_caps_every_baseline_and_trial(eagle_profile, tmp_path):
    from policies.registry import make_policy

    from specbatch.commands import cli

    out = tmp_path / "tune"
    assert tune(eagle_profile, out, "--speculative-config", EAGLE3_K2) == 0  # no --k-max: the method's k
    assert cli._NOTHING_LEFT_TO_DO  # the console script may end without the interpreter's teardown
    doc = json.loads((out / "tune.json").read_text())
    assert doc["space"]["k_values"] == [0, 1, 2]
    rows = {row["label"]: row["policy"] for row in doc["holdout"]}
    assert {"fixed k=2", "goodput k_max=2", "sglang-adaptive steps [1]"} <= set(rows) and "fixed k=3" not in rows
    for label, policy in rows.items():
        params = {k: v for k, v in policy.items() if k != "name"}
        assert make_policy(policy["name"], params).max_k <= 2, label
    for cell in (out / "cells").glob("*.json"):
        record = json.loads(cell.read_text())
        assert record["status"] == "ok" and record["metrics"]["mean_k"] <= 2


def test_a_k_max_beyond_the_method_is_refused_in_one_line(eagle_profile, tmp_path, capsys):
    out = tmp_path / "tune"
    assert tune(eagle_profile, out, "--speculative-config", EAGLE3_K2, "--k-max", "3") == 2
    err = capsys.readouterr().err
    assert err == "error: --k-max: must be in 1..2 (the eagle3 method's num_speculative_tokens), got 3\n"
    assert not out.exists()


def never_run(monkeypatch):
    from specbatch.commands.sweep import executors

    for name in ("run_serial", "run_pool", "run_dask", "DaskRunner"):
        monkeypatch.setattr(executors, name, lambda *a, **k: pytest.fail("a run started before every check"))


def test_a_baseline_that_cannot_run_is_refused_before_the_first_run(eagle_profile, tmp_path, capsys, monkeypatch):
    from specbatch.commands.tune import plan
    from specbatch.commands.tune.trials import Candidate

    real = plan.baselines
    monkeypatch.setattr(plan, "baselines", lambda *a, **k: real(*a, **k) + [Candidate("fixed k=9", {"name": "fixed",
                                                                                                    "k": 9})])
    never_run(monkeypatch)
    out = tmp_path / "tune"
    assert tune(eagle_profile, out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the tune's baseline 'fixed k=9' cannot run: " in err, err
    assert not out.exists()


def failing_after(monkeypatch, runs: int, failure):
    """The serial executor, ending the tune after ``runs`` runs: ``failure`` a failed record or an exception."""
    from specbatch.commands.sweep import executors

    real = executors.run_serial
    done = {"n": 0}

    def run(tasks):
        for key, record in real(tasks):
            done["n"] += 1
            if done["n"] > runs:
                if isinstance(failure, BaseException):
                    raise failure
                record = {**record, "status": "failed", "error": failure}
            yield key, record
    monkeypatch.setattr(executors, "run_serial", run)


def test_a_run_failing_mid_tune_leaves_nothing_behind(eagle_profile, tmp_path, capsys, monkeypatch):
    out = tmp_path / "tune"
    failing_after(monkeypatch, 3, "RuntimeError: the simulated node died")
    assert tune(eagle_profile, out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a run of the tune failed" in err and "the simulated node died" in err
    assert not out.exists() and not any(p.name.startswith(".tune") for p in tmp_path.iterdir())
    empty = tmp_path / "mine"  # a folder the user made for it stays, empty
    empty.mkdir()
    assert tune(eagle_profile, empty) == 2
    assert empty.is_dir() and not any(empty.iterdir())


def test_a_resumed_tune_that_fails_keeps_the_runs_it_had(eagle_profile, tmp_path, capsys, monkeypatch):
    out = tmp_path / "tune"
    failing_after(monkeypatch, 3, KeyboardInterrupt())
    assert tune(eagle_profile, out) == 130
    kept = sorted(p.name for p in (out / "cells").glob("*.json"))
    assert len(kept) == 3
    monkeypatch.undo()
    failing_after(monkeypatch, 1, "RuntimeError: the simulated node died")
    assert tune(eagle_profile, out) == 2
    assert set(kept) <= {p.name for p in (out / "cells").glob("*.json")} and not (out / "tune.json").exists()


def test_without_matplotlib_the_report_has_no_figure_and_says_so(eagle_profile, tmp_path, capsys, monkeypatch):
    """As on the README's first install: matplotlib cannot be found or imported."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import would raise ImportError
    out = tmp_path / "plain"
    assert tune(eagle_profile, out) == 0
    printed = capsys.readouterr().out
    assert "no figure: matplotlib is not installed, pip install 'specbatch[report]'" in printed.splitlines()[-1]
    assert not (out / "tune.png").exists() and (out / "tune.json").is_file()
    note = "No figure: matplotlib is not installed (pip install 'specbatch[report]')."
    for name, shown in (("report.md", note), ("report.html", html.escape(note))):
        text = (out / name).read_text()
        assert shown in text and "tune.png" not in text and "data:image/png" not in text


def test_a_dask_tune_opens_one_client_for_all_its_batches_and_closes_it(eagle_profile, tmp_path, monkeypatch):
    """--dask: the cluster (a LocalCluster for ``local``) is started once for the whole tune, not per
    batch of runs, and closed when the tune ends."""
    from specbatch.commands.sweep import executors

    opened, closed, batches = [], [], []

    class Runner:  # a Dask client as the tune uses it, running its tasks here
        def __init__(self, address, workers):
            opened.append((address, workers))

        def run(self, tasks):
            batches.append(len(tasks))
            return executors.run_serial(tasks)

        def close(self):
            closed.append(1)

    monkeypatch.setattr(executors, "DaskRunner", Runner)
    monkeypatch.setattr(executors, "have_dask", lambda: True)
    small = [arg for arg in SMALL if arg not in ("--executor", "serial")]
    out = tmp_path / "tune"
    assert main(["tune", "--profile", str(eagle_profile), *SCENARIO, *small, "--out", str(out), "--dask", "local",
                 "--workers", "2"]) == 0
    assert json.loads((out / "tune.json").read_text())
    assert len(batches) >= 2 and opened == [("local", 2)] and closed == [1]
    from specbatch.commands import cli

    assert not cli._NOTHING_LEFT_TO_DO  # Dask's own exit handlers run
