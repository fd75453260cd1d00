"""The speed benchmarks time older code too (``--against DIR``): its command-line module and the settings it reads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def engine_speed(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as the script runs: alternate.py beside it
    yield load_script("benchmarks/engine_speed.py", "engine_speed_against")
    sys.modules.pop("engine_speed_against", None)


def test_older_code_is_run_through_its_own_command_module(tmp_path, engine_speed):
    import alternate

    assert alternate.cli_module() == alternate.cli_module(ROOT) == "specbatch.commands.cli"
    (tmp_path / "sim" / "commands").mkdir(parents=True)  # the layout before the commands left sim/
    (tmp_path / "sim" / "commands" / "cli.py").write_text("")
    assert alternate.cli_module(tmp_path) == "sim.commands.cli"


def test_the_code_before_is_given_the_settings_away_from_the_defaults(engine_speed):
    """A length distribution is one setting: it is kept whole where any of its fields differs."""
    defaults = {"seed": 0, "profile": "p", "workload": {"rate": 1.0, "sampling": None,
                                                        "prompt_tokens": {"dist": "lognormal", "mean": 128}},
                "engine": {"max_batch_size": 256}}
    settings = {"seed": 0, "profile": "q", "workload": {"rate": 2.0, "sampling": None,
                                                        "prompt_tokens": {"dist": "lognormal", "mean": 64}},
                "engine": {"max_batch_size": 256}}
    assert engine_speed.away_from(settings, defaults) == {
        "profile": "q", "workload": {"rate": 2.0, "prompt_tokens": {"dist": "lognormal", "mean": 64}}}


def test_a_setting_the_code_before_does_not_know_is_left_out_and_named(engine_speed):
    settings = {"profile": "q", "workload": {"rate": 2.0, "no_such_setting": "x"}, "policy": {"name": "fixed", "k": 2}}
    kept, unknown = engine_speed.known_to(ROOT, settings)
    assert kept == {"profile": "q", "workload": {"rate": 2.0}, "policy": {"name": "fixed", "k": 2}}
    assert unknown == ["workload.no_such_setting = 'x'"]


def test_the_scale_tables_cold_and_warm_start_come_from_one_invocation():
    """benchmarks/results/scale.json quotes a cold start beside a warm one: the warm start is the fixed row of
    the cold start's size, measured with it (scale.py --keep keeps the two together or neither)."""
    import json

    doc = json.loads((ROOT / "benchmarks" / "results" / "scale.json").read_text())
    cold = doc["cold_start"]
    beside = [r for r in doc["rows"] if r["case"] == "fixed" and r["requests"] == cold["requests"]]
    assert len(beside) == 1
    assert (doc["warm_start_s"], doc["warm_import_s"]) == (beside[0]["startup_s"], beside[0]["import_s"])
