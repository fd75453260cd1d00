"""Every report names what ran: the method, the drafter and the acceptance model with its parameters as the
runs used them (specbatch.commands.described), and what a report says agrees with the run config it ran.

Three methods: a separate draft model (the geometric alpha), EAGLE-3 with its own per-position defaults
(given in a scenario file, as the issue's capacity run was) and n-gram (per-position rates and a match
rate). The run's side is read from what the run itself wrote or was given: config.toml (the resolved
config), a tune's stored cells (each run's config), the searched configs of a capacity plan and the
profile's sidecar; the report's side from summary.json, report.md, the printed table and the JSON files.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from specbatch.commands.cli import main
from sim.speculation.methods import SHAREGPT_EAGLE, SHAREGPT_NGRAM, SHAREGPT_NGRAM_PROPOSES
from tests.synthetic import make_profile

NGRAM = '{"method": "ngram", "num_speculative_tokens": 2}'
SMALL_RUN = ["--prompt-tokens", "64", "--output-tokens", "24", "--max-batch-size", "8"]


@pytest.fixture(scope="module")
def methods_profile(tmp_path_factory) -> Path:
    """The synthetic profile with an EAGLE-3 head and an n-gram proposer priced too."""
    return make_profile(tmp_path_factory.mktemp("profiles") / "methods", drafters=("eagle3", "ngram"))


def sidecar_name(profile: Path, role: str) -> str:
    return json.loads((profile / "profile.json").read_text())["models"][role]["name"]


# Each case: its flags (or a scenario file's [speculative] table), the sidecar role that drafts, and the
# acceptance the run must have used (checked against its own config.toml too).
CASES = {
    "draft-model": ([], None, "draft", {"model": "geometric", "alpha": 0.8, "distribution": "fixed"}),
    "eagle3-defaults": ([], '[speculative]\nconfig = {method = "eagle3", num_speculative_tokens = 3}\n', "eagle3",
                        {"model": "per-position", "per_position": list(SHAREGPT_EAGLE[:3])}),
    "ngram": (["--speculative-config", NGRAM], None, "ngram",
              {"model": "per-position", "per_position": list(SHAREGPT_NGRAM[:2]), "match_rate": SHAREGPT_NGRAM_PROPOSES}),
}


def case_args(case: str, tmp_path: Path) -> list[str]:
    flags, scenario, _, _ = CASES[case]
    args = list(flags) + (["--alpha", "0.8"] if case == "draft-model" else [])
    if scenario is not None:
        path = tmp_path / f"{case}.toml"
        path.write_text(scenario)
        args += ["--config", str(path)]
    return args


def assert_describes(described: dict, case: str, profile: Path, config: dict) -> None:
    """``described`` (a report's) against the run: its resolved config (config.toml's tables) and the profile."""
    _, _, role, expected = CASES[case]
    method = "draft_model" if role == "draft" else role
    assert described["method"] == method and described["drafter"] == sidecar_name(profile, role)
    accepted = config.get("acceptance", {})
    assert described["acceptance"]["model"] == accepted.get("model", "geometric") == expected["model"]
    for key, value in expected.items():
        assert described["acceptance"][key] == pytest.approx(value), key
    if expected["model"] == "per-position":  # the rates the run was configured with, up to its k
        assert described["acceptance"]["per_position"] == pytest.approx(
            accepted["per_position"][:len(expected["per_position"])])
        assert "alpha" not in described["acceptance"] and "alpha" not in described["text"]
        assert described["acceptance"]["method_default"] and "(the method's default)" in described["text"]
    else:
        assert described["acceptance"]["alpha"] == accepted["alpha"]
    assert described["drafter"] in described["text"] and described["acceptance_text"] in described["text"]


@pytest.mark.parametrize("case", list(CASES))
def test_summary_json_names_what_the_run_ran(case, methods_profile, tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--profile", str(methods_profile), *case_args(case, tmp_path), *SMALL_RUN, "--rate", "4",
                 "--num-requests", "30", "--records", "none", "--quiet", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    config = tomllib.loads((out / "config.toml").read_text())
    assert summary["described"]["method"] == summary["speculation"]["method"]
    assert_describes(summary["described"], case, methods_profile, config)


CAPACITY = ["--slo", "p99_e2el_ms=5000", "--policies", "none,fixed", "--seeds", "1", "--min-requests", "30",
            "--service-times", "5", "--tolerance", "0.5", "--curve-points", "0", "--jobs", "1", "--quiet"]


@pytest.mark.parametrize("case", list(CASES))
def test_capacity_reports_name_what_the_searched_runs_ran(case, methods_profile, tmp_path, capsys):
    """The printed table, report.md, report.html and capacity.json, against each config the search ran."""
    from specbatch.commands.capacity.cli import plan_from_args
    from specbatch.commands.cli import build_parser
    from specbatch.commands.described import describe

    argv = ["capacity", "--profile", str(methods_profile), *case_args(case, tmp_path), *SMALL_RUN, *CAPACITY,
            "--out", str(tmp_path / "report")]
    plan = plan_from_args(build_parser().parse_args(argv))
    runs = [describe(config) for config in plan.configs.values()]
    assert all(run == runs[0] for run in runs)  # the policies differ; what drafts and accepts does not
    for config in plan.configs.values():
        assert_describes(runs[0], case, methods_profile, config.to_dict())
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"Ran: {runs[0]['text']}" in printed.splitlines()
    doc = json.loads((tmp_path / "report" / "capacity.json").read_text())
    assert next(iter(doc["profiles"].values()))["described"] == runs[0]
    md = (tmp_path / "report" / "report.md").read_text()
    assert f"| speculation method | {runs[0]['method_text']} |" in md
    assert f"| acceptance | {runs[0]['acceptance_text']} |" in md
    assert f"| {runs[0]['drafter']} |" in md
    if case != "draft-model":  # the issue's report: a draft model and alpha 0.7 while EAGLE-3's defaults ran
        assert "alpha 0.7" not in md and sidecar_name(methods_profile, "draft") not in md
    import html

    assert html.escape(runs[0]["acceptance_text"]) in (tmp_path / "report" / "report.html").read_text()


def test_tune_reports_name_what_its_stored_runs_ran(methods_profile, tmp_path, capsys):
    """tune.json's description against every run the tune stored (each cell keeps the config it ran)."""
    out = tmp_path / "tune"
    assert main(["tune", "--profile", str(methods_profile), "--speculative-config", NGRAM, *SMALL_RUN, "--rate", "4",
                 "--num-requests", "40", "--bands", "1", "--seeds", "1", "--holdout-seeds", "1", "--executor",
                 "serial", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    described = json.loads((out / "tune.json").read_text())["described"]
    assert printed.splitlines()[0] == f"Ran: {described['text']}"
    cells = [json.loads(p.read_text())["config"] for p in (out / "cells").glob("*.json")]
    assert cells
    for config in cells:
        assert_describes(described, "ngram", methods_profile, config)
    md = (out / "report.md").read_text()
    for row in (f"| speculation method | {described['method_text']} |", f"| drafter | {described['drafter']} |",
                f"| acceptance | {described['acceptance_text']} |"):
        assert row in md


def test_the_python_api_takes_the_speculation_keywords_and_names_what_ran(methods_profile):
    import specbatch

    report = specbatch.capacity(slo={"p99_e2el_ms": 5000}, policies=["fixed"], profile=str(methods_profile),
                                speculative_config=NGRAM, prompt_tokens="64", output_tokens="24", max_batch_size=8,
                                seeds=1, min_requests=30, service_times=5, tolerance=0.5, curve_points=0)
    described = next(iter(report.result.inputs.profiles.values())).facts["described"]
    assert described["method"] == "ngram" and report.text.splitlines()[0] == f"Ran: {described['text']}"
    assert report.result.outcomes[next(iter(report.result.outcomes))]["fixed"].config.policy.params["k"] == 2
