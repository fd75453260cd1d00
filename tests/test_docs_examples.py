"""The example policy of docs/policies.md runs as documented and does what it says."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from specbatch.commands.cli import main
from tests.conftest import CPU_DEFAULTS

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # what PYTHONPATH=docs/examples does
    yield
    sys.modules.pop("my_policy", None)


def test_example_policy_file_imports():
    spec = importlib.util.spec_from_file_location("my_policy_doc", EXAMPLES / "my_policy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    policy = module.SmallBatchSpec()
    assert policy.max_k == 3 and policy.params()["threshold"] == 8


def test_example_policy_runs_through_the_cli(tmp_path, capsys, examples_on_path):
    out = tmp_path / "run"
    code = main(["run", "--config", str(CPU_DEFAULTS), "--policy", "my_policy:SmallBatchSpec",
                 "--num-requests", "30", "--rate", "1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    steps = pd.read_csv(out / "steps.csv")
    decode = steps[steps.phase == 1]
    expected = decode.batch_size.map(lambda b: 3 if b < 8 else 1)
    assert (decode.k == expected).all()
    assert (decode.batch_size < 8).any() and (decode.batch_size >= 8).any()  # both branches ran
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"]["name"] == "my_policy:SmallBatchSpec"
    assert summary["metrics"]["completed"] == 30


def test_example_policy_learns_alpha(examples_on_path):
    from sim.config import load_config
    from sim.simulate import prepare, execute

    config = load_config(CPU_DEFAULTS, {"policy.name": ("my_policy:SmallBatchSpec", "--policy"),
                                "workload.num_requests": (30, "--num-requests"),
                                "workload.rate": (1.0, "--rate"), "output.records": ("none", "--records")})
    run = prepare(config)
    execute(run)
    # observe() was fed every step: a moving average of accepted / drafted, a rate in (0, 1).
    assert run.policy.alpha_estimate is not None and 0.0 < run.policy.alpha_estimate < 1.0



def _marked_block(page: str, marker: str) -> str:
    """The fenced block right after ``<!-- marker -->`` in a docs page."""
    after = page.split(f"<!-- {marker} -->", 1)[1]
    return after.split("```", 2)[1].split("\n", 1)[1].rstrip("\n")


def test_python_api_page_shows_the_example_and_what_it_prints(tmp_path):
    """docs/python-api.md: the code is the example file's, the output is what running it prints."""
    import subprocess

    page = (EXAMPLES.parent / "python-api.md").read_text()
    script = EXAMPLES / "python_api.py"
    body = script.read_text().split('"""', 2)[2].strip("\n")
    assert _marked_block(page, "example: docs/examples/python_api.py") == body
    printed = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                             check=True).stdout
    assert _marked_block(page, "output: docs/examples/python_api.py") == printed.rstrip("\n")
    assert list(tmp_path.iterdir()) == []  # the API writes nothing unless asked
