"""specbatch regress: exit codes, tolerance semantics, --update, bad baselines, the project's own baseline."""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import BatchView
from policies.fixed import FixedK
from specbatch.commands.cli import main
from sim.config import load_config
from sim.errors import InputError
from specbatch.commands.regress import (DIRECTIONS, FLOAT_DRIFT, Tolerance, assert_no_regression, check_baseline,
                                  default_direction, judge, load_baseline)
from sim.simulate import simulate
from tests.conftest import CPU_DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
PROJECT_BASELINE = ROOT / "tests" / "baselines" / "specbatch.toml"
EXAMPLES = ROOT / "docs" / "examples"

SMALL = """\
# a small baseline: comments must survive --update
format = 1

[tolerance]
default = { abs = 0.0, rel = 0.0 }   # exact

[[scenario]]
name = "small"
[scenario.overrides]
profile = "cpu-tinyllama-1.1b-llama-68m"
engine.scheduler = "v0"
engine.max_batch_size = 32
workload.prompt_tokens = "lognormal:128:0.5:512"
workload.output_tokens = "lognormal:128:0.5:512"
workload.num_requests = 20
workload.rate = 0.15
"""

TWO = SMALL + """
[[scenario]]
name = "static"
[scenario.overrides]
profile = "cpu-tinyllama-1.1b-llama-68m"
workload.prompt_tokens = "lognormal:128:0.5:512"
workload.output_tokens = "lognormal:128:0.5:512"
workload.num_requests = 16
engine.scheduler = "v0"
engine.batching = "static"
engine.max_batch_size = 4
policy = { name = "fixed", k = 2 }
"""


class Reference(FixedK):
    """A user's policy as recorded in a baseline: fixed k = 3."""


class Broken(FixedK):
    """The same policy after a "harmless" change: it stops speculating once four sequences run."""

    def choose_k(self, view: BatchView) -> int:
        return 0 if view.batch_size >= 4 else self.k


def recorded(tmp_path: Path, text: str = SMALL, name: str = "baseline.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    assert main(["regress", "--baseline", str(path), "--update"]) == 0
    return path


def set_expected(path: Path, metric: str, value) -> None:
    """Rewrite one expected value (the first scenario's) in the file's text."""
    text, count = re.subn(rf"^{metric} = .*$", f"{metric} = {value!r}", path.read_text(), count=1, flags=re.M)
    assert count == 1
    path.write_text(text)


def expected_of(path: Path, scenario: int = 0) -> dict:
    return tomllib.loads(path.read_text())["scenario"][scenario]["expected"]


# --- the project's own baseline (CI runs this through `python -m pytest -n 2`) -----------------

def test_project_baseline_passes(tmp_path, capsys):
    out = tmp_path / "comparison.json"
    code = main(["regress", "--baseline", str(PROJECT_BASELINE), "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    document = json.loads(out.read_text())
    assert document["passed"] and document["counts"]["regressed"] == 0
    assert all(row["verdict"] == "ok" for row in document["rows"])
    # What it covers: both batching modes, every built-in policy, time-varying rate, beta alpha.
    base = load_baseline(PROJECT_BASELINE)
    configs = [load_config(s.config, {k: (v, "test") for k, v in s.overrides.items()}) for s in base.scenarios]
    assert {c.engine.batching for c in configs} == {"continuous", "static"}
    assert {c.policy.name for c in configs} == {"none", "fixed", "lut", "goodput", "adaptive", "context"}
    assert any(c.workload.rate_profile is not None for c in configs)
    assert any(c.acceptance.distribution == "beta" for c in configs)
    assert all(t == Tolerance(0.0, 0.0) for t in base.tolerances.values())
    assert len(document["rows"]) == sum(len(s.expected) for s in base.scenarios)


def test_a_trace_in_overrides_is_read_beside_the_baseline_from_any_folder(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "baselines"
    folder.mkdir()
    (folder / "traces").mkdir()
    (folder / "traces" / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n"
                                             + "".join(f"{i * 0.5},{64 + i},{32 + i}\n" for i in range(12)))
    text = SMALL.replace('workload.num_requests = 20\n', 'workload.trace = "traces/t.csv"\n')
    path = recorded(folder, text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["regress", "--baseline", str(path)]) == 0
    assert "0 regressed" in capsys.readouterr().out
    assert expected_of(path)["completed"] == 12  # the trace was read, not the generated workload


@pytest.mark.parametrize("coretype", ["Haswell", "Sandybridge"])
def test_project_baseline_passes_with_another_cpus_blas_kernels(coretype, tmp_path):
    """The baseline was recorded on one CPU; CI may run on another. OpenBLAS picks its kernels per
    CPU (AVX2, AVX-512, AVX), which moves the fitted cost curves and so every metric's last digits
    (up to 8.7e-10 relative). Forcing another kernel set here (a fresh process, no fit cache) makes
    that drift on any x86-64 machine: FLOAT_DRIFT must absorb it. Elsewhere the variable is ignored.
    The fresh process's cache is empty but for the session's compiled engine (which BLAS does not
    touch): compiling it again took 15 s of the test."""
    import os
    import subprocess

    from tests.conftest import cache_with_compiled_engine

    cache = cache_with_compiled_engine(tmp_path / "cache")
    env = {**os.environ, "OPENBLAS_CORETYPE": coretype, "SPECBATCH_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-m", "specbatch.commands.cli", "regress", "--baseline", str(PROJECT_BASELINE)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("PASS") and "0 regressed, 0 improved, 0 changed" in done.stdout


# --- exit codes ------------------------------------------------------------------------------

def test_update_then_check_passes_and_the_values_are_exact(tmp_path, capsys):
    path = recorded(tmp_path)
    text = path.read_text()
    assert "# a small baseline: comments must survive --update" in text
    assert "default = { abs = 0.0, rel = 0.0 }   # exact" in text
    summary = simulate(load_config(CPU_DEFAULTS, {"workload.num_requests": (20, "t"), "workload.rate": (0.15, "t")})).summary
    expected = expected_of(path)
    assert list(expected) == list(summary)  # every scalar metric, in the summary's order
    for metric, value in summary.items():  # stored with full precision: equal, not close
        assert expected[metric] == value or (math.isnan(value) and math.isnan(expected[metric])), metric
    capsys.readouterr()
    assert main(["regress", "--baseline", str(path)]) == 0
    assert capsys.readouterr().out.startswith("PASS: 1 scenario(s), 39 metrics")
    # A second update changes nothing: the round trip is exact.
    assert main(["regress", "--baseline", str(path), "--update"]) == 0
    assert path.read_text() == text


def test_perturbed_expected_value_is_a_regression(tmp_path, capsys):
    path = recorded(tmp_path)
    base = expected_of(path)["mean_e2el_ms"]
    # Cross-machine floating-point drift (up to FLOAT_DRIFT, relative) passes a zero tolerance ...
    for drifted in (math.nextafter(base, 0.0), base * (1 - 0.5 * FLOAT_DRIFT)):
        set_expected(path, "mean_e2el_ms", drifted)
        assert main(["regress", "--baseline", str(path)]) == 0
    # ... and anything beyond it is a move: now is 2e-8 higher, worse.
    set_expected(path, "mean_e2el_ms", base * (1 - 2 * FLOAT_DRIFT))
    capsys.readouterr()
    out = tmp_path / "c.json"
    assert main(["regress", "--baseline", str(path), "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    assert re.search(r"^small\s+mean_e2el_ms\s.*\s0\s+regressed$", printed, flags=re.M), printed
    assert printed.rstrip().endswith("1 regressed, 0 improved, 0 changed")
    rows = {r["metric"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["mean_e2el_ms"]["verdict"] == "regressed" and rows["mean_e2el_ms"]["delta"] > 0
    assert rows["p99_e2el_ms"]["verdict"] == "ok"


def test_an_improvement_passes_unless_fail_on_change(tmp_path, capsys):
    path = recorded(tmp_path)
    set_expected(path, "output_throughput", expected_of(path)["output_throughput"] * 0.9)  # now is 11 % higher
    assert main(["regress", "--baseline", str(path)]) == 0
    assert re.search(r"output_throughput.*\+11.1%\s+0\s+improved", capsys.readouterr().out)
    assert main(["regress", "--baseline", str(path), "--fail-on-change"]) == 1


def test_tolerances_in_the_file_absorb_a_small_move(tmp_path, capsys):
    path = recorded(tmp_path)
    base = expected_of(path)["p99_ttft_ms"]
    set_expected(path, "p99_ttft_ms", base * (1 - 1e-4))  # now is 0.01 % worse
    assert main(["regress", "--baseline", str(path)]) == 1
    text = path.read_text().replace("[scenario.overrides]", "[scenario.tolerance]\np99_ttft_ms = { rel = 2e-4 }\n\n"
                                    "[scenario.overrides]")
    path.write_text(text)
    capsys.readouterr()
    assert main(["regress", "--baseline", str(path)]) == 0
    path.write_text(text.replace("{ rel = 2e-4 }", f"{{ abs = {base * 0.5e-4!r} }}"))
    assert main(["regress", "--baseline", str(path)]) == 1  # half the move allowed: still a regression


def test_a_changed_policy_class_is_caught(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(SMALL)
    check_baseline(path, policy=Reference, update=True)
    assert assert_no_regression(path, policy=Reference).passed
    with pytest.raises(AssertionError) as caught:
        assert_no_regression(path, policy=Broken)
    message = str(caught.value)
    assert message.startswith("FAIL: 1 scenario(s)")
    assert re.search(r"^small\s+mean_tpot_ms\s.*regressed$", message, flags=re.M)
    table = message.split("\n", 1)[1]
    assert "improved" not in table and "changed" not in table  # the failing rows only
    # The CLI takes the same class as module:Class.
    assert main(["regress", "--baseline", str(path), "--policy", f"{__name__}:Broken"]) == 1


def test_scenario_option_runs_only_that_scenario(tmp_path, capsys):
    path = recorded(tmp_path, TWO)
    out = tmp_path / "c.json"
    capsys.readouterr()
    assert main(["regress", "--baseline", str(path), "--scenario", "static", "--json", str(out), "--all"]) == 0
    document = json.loads(out.read_text())
    assert [s["name"] for s in document["scenarios"]] == ["static"]
    assert {row["scenario"] for row in document["rows"]} == {"static"}
    assert document["scenarios"][0]["policy"] == {"name": "fixed", "k": 2}
    assert len(capsys.readouterr().out.splitlines()) == 2 + 39 + 1  # --all: header, rule, rows, headline


def test_update_of_one_scenario_leaves_the_others(tmp_path):
    path = recorded(tmp_path, TWO)
    set_expected(path, "mean_ttft_ms", 1.0)  # the first scenario's
    static_before = expected_of(path, 1)
    path.write_text(path.read_text().replace('k = 2 }', 'k = 1 }'))  # the second scenario changes
    assert main(["regress", "--baseline", str(path), "--update", "--scenario", "static"]) == 0
    assert expected_of(path, 0)["mean_ttft_ms"] == 1.0
    assert expected_of(path, 1)["mean_k"] == 1.0 != static_before["mean_k"]


def test_update_records_the_files_metric_list_and_keeps_a_scenarios_own(tmp_path):
    text = SMALL.replace("format = 1\n", 'format = 1\nmetrics = ["mean_e2el_ms", "num_steps"]\n') + (
        '\n[[scenario]]\nname = "own"\n[scenario.overrides]\nworkload.num_requests = 10\n'
        '[scenario.expected]\np99_ttft_ms = 0.0\n')
    path = recorded(tmp_path, text)
    assert list(expected_of(path, 0)) == ["mean_e2el_ms", "num_steps"]
    assert isinstance(expected_of(path, 0)["num_steps"], int)
    assert list(expected_of(path, 1)) == ["p99_ttft_ms"] and expected_of(path, 1)["p99_ttft_ms"] > 0


def test_a_config_file_is_found_relative_to_the_baseline(tmp_path, monkeypatch):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "s.toml").write_text("[workload]\nnum_requests = 12\n")
    path = tmp_path / "b.toml"
    path.write_text('[[scenario]]\nname = "from-file"\nconfig = "scenarios/s.toml"\n')
    monkeypatch.chdir(ROOT)  # anywhere but the baseline's folder
    assert main(["regress", "--baseline", str(path), "--update"]) == 0
    assert expected_of(path)["completed"] == 12


# --- bad input: one line naming the file, line and field; exit 2; nothing written ----------------

BAD = [
    ("format = 1\n[[scenario]\nname = 'x'\n", 2, "not valid TOML"),
    ("format = 2\n", 1, "format: unsupported baseline format 2"),
    ("tolerances = {}\n", 1, "tolerances: unknown key"),
    ("format = 1\n", None, "scenario: no scenarios"),
    ("[[scenario]]\nname = 'a'\nexpect = { x = 1 }\n", 3, "scenario[0].expect: unknown key"),
    ("[[scenario]]\ndescription = 'no name'\n", 1, "scenario[0].name: every scenario needs a name"),
    ("[[scenario]]\nname = 'a'\n", 1, "scenario[0]: give config"),
    ("[[scenario]]\nname = 'a'\nconfig = 'nowhere.toml'\n", 3, "scenario[0].config: no such config file"),
    ("[[scenario]]\nname = 'a'\noverrides = {}\n[[scenario]]\nname = 'a'\noverrides = {}\n", 5,
     "scenario[1].name: duplicate scenario name 'a'"),
    ("[tolerance]\ndefault = { rel = -0.1 }\n", 2, "tolerance.default.rel: must be a finite number >= 0"),
    ("[tolerance]\ndefault = { pct = 1 }\n", 2, "tolerance.default.pct: unknown tolerance key"),
    ("[tolerance]\nmean_e2el_ms = 0.01\n", 2, "tolerance.mean_e2el_ms: expected a table"),
    ("[direction]\nmean_k = 'up'\n", 2, "direction.mean_k: 'up' is not one of"),
    ("metrics = []\n", 1, "metrics: expected a non-empty list"),
    ("[[scenario]]\nname = 'a'\n[scenario.overrides]\nworkload.num_requests = 5\n[scenario.expected]\n"
     "mean_e2el_ms = 'fast'\n", 6, "scenario[0].expected.mean_e2el_ms: expected a number"),
    ("[[scenario]]\nname = 'a'\n[scenario.overrides]\nworkload.num_requests = 5\n", 1,
     "scenario 'a' has no expected values; record them with --update"),
    # Found when the scenario runs: the config's own checks, pointed at the baseline's line.
    ("[[scenario]]\nname = 'a'\n[scenario.overrides]\nworkload.num_requests = 5\nworkload.rate = 0\n"
     "[scenario.expected]\ncompleted = 5\n", 5, "workload.rate: must be greater than 0"),
    ("[[scenario]]\nname = 'a'\n[scenario.overrides]\nworkload.rat = 1\n[scenario.expected]\ncompleted = 5\n",
     4, "workload.rat: unknown setting"),
    ("[[scenario]]\nname = 'a'\n[scenario.overrides]\nworkload.num_requests = 5\npolicy = { name = 'fixed', "
     "k = -1 }\n[scenario.expected]\ncompleted = 5\n", 5, "policy.k: k must be a whole number >= 0"),
    ("[[scenario]]\nname = 'a'\n[scenario.overrides]\nworkload.num_requests = 5\n[scenario.expected]\n"
     "completed = 5\nmean_e2e_ms = 1.0\n", 7, "scenario[0].expected.mean_e2e_ms: 'mean_e2e_ms' is not a metric"),
    ("[[scenario]]\nname = 'a'\n[scenario.overrides]\nworkload.num_requests = 5\npolicy.name = 'lut'\n"
     "policy.table = [\n  [1, 4, 2],\n  [5, 8, 1]\n]\npolicy.bogus = 1\n[scenario.expected]\ncompleted = 5\n", 10,
     "policy.bogus: policy 'lut' takes no parameter 'bogus'"),  # lines of a multi-line array are not headers
    ("[[scenario]]\nname = 'a'\n[scenario.overrides]\nworkload.num_requests = 5\nengine.scheduler = 'v0'\n"
     "[scenario.expected]\ncompleted = 5\nnum_preemptions = 0\n", 8, "scenario[0].expected.num_preemptions: "
     "'num_preemptions' is not a "
     "metric of this scenario's runs (only a vllm-v1 run reports it"),  # a v1 figure, known, in a v0 scenario
    ("[tolerance]\np99_ttf_ms = { rel = 0.1 }\n[[scenario]]\nname = 'a'\n[scenario.overrides]\n"
     "workload.num_requests = 5\n[scenario.expected]\ncompleted = 5\n", 2, "tolerance.p99_ttf_ms: 'p99_ttf_ms' is not"),
]


@pytest.mark.parametrize("text, line, message", BAD, ids=[m.split(":")[0] + f"-{i}" for i, (_, _, m) in
                                                          enumerate(BAD)])
def test_bad_baselines_are_one_line_errors(tmp_path, capsys, text, line, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = tmp_path / "c.json"
    assert main(["regress", "--baseline", str(path), "--json", str(out)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if not re.match(r"^\[\d+/\d+\] ", line)]  # not progress
    assert len(errors) == 1 and err.endswith(errors[0] + "\n"), err
    assert "[1/" not in err  # names are checked before any output
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert err.startswith(f"error: {where}") and message in err, err
    assert not out.exists()
    if "record them with --update" not in message:  # --update on a bad file writes nothing either
        assert main(["regress", "--baseline", str(path), "--update"]) == 2
        assert path.read_text() == text


def test_bad_command_line_input(tmp_path, capsys):
    assert main(["regress", "--baseline", str(tmp_path / "missing.toml")]) == 2
    assert "missing.toml: baseline: no such baseline file" in capsys.readouterr().err
    path = recorded(tmp_path)
    assert main(["regress", "--baseline", str(path), "--scenario", "nope"]) == 2
    assert "--scenario: scenario: no scenario named 'nope'" in capsys.readouterr().err
    assert main(["regress", "--baseline", str(path), "--policy", "nomodule:Nope"]) == 2
    assert "--policy: policy.name: cannot import module 'nomodule'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["regress"])  # --baseline is required: argparse's one line
    assert exited.value.code == 2 and "--baseline" in capsys.readouterr().err


def test_helper_raises_input_error_not_assertion_for_a_bad_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[[scenario]]\nname = 'a'\nconfig = 3\n")
    with pytest.raises(InputError, match=r"bad.toml:3: scenario\[0\].config"):
        assert_no_regression(path)


# --- tolerance semantics ------------------------------------------------------------------------

@pytest.mark.parametrize("baseline, now, tolerance, direction, verdict", [
    (100.0, 100.0, Tolerance(), "lower-is-better", "ok"),
    (100.0, 101.0, Tolerance(), "lower-is-better", "regressed"),
    (100.0, 99.0, Tolerance(), "lower-is-better", "improved"),
    (100.0, 99.0, Tolerance(), "higher-is-better", "regressed"),
    (100.0, 101.0, Tolerance(), "higher-is-better", "improved"),
    (100.0, 101.0, Tolerance(), "must-not-change", "regressed"),
    (100.0, 99.0, Tolerance(), "must-not-change", "regressed"),
    (100.0, 99.0, Tolerance(), "informational", "changed"),
    (100.0, 101.0, Tolerance(abs=1.0), "lower-is-better", "ok"),          # |delta| <= abs
    (100.0, 101.5, Tolerance(abs=1.0), "lower-is-better", "regressed"),
    (100.0, 101.5, Tolerance(rel=0.02), "lower-is-better", "ok"),         # |delta| <= rel * |baseline|
    (100.0, 102.5, Tolerance(rel=0.02), "lower-is-better", "regressed"),
    (100.0, 102.5, Tolerance(abs=3.0, rel=0.02), "lower-is-better", "ok"),  # the larger of the two
    (-100.0, -102.5, Tolerance(rel=0.02), "higher-is-better", "regressed"),  # rel of |baseline|
    (0.0, 1e-12, Tolerance(rel=0.5), "lower-is-better", "regressed"),      # rel of zero allows nothing
    (100.0, 100.0 + 0.9e-6, Tolerance(), "lower-is-better", "ok"),        # cross-machine drift: rel 1e-8
    (100.0, 100.0 + 1.1e-6, Tolerance(), "lower-is-better", "regressed"),
    (100.0, 100.0 - 1.1e-6, Tolerance(abs=1e-7), "higher-is-better", "regressed"),
    (math.nan, math.nan, Tolerance(), "higher-is-better", "ok"),
    (math.nan, 0.5, Tolerance(abs=1.0), "higher-is-better", "regressed"),   # became defined: no direction
    (0.5, math.nan, Tolerance(abs=1.0), "informational", "changed"),
    (math.inf, math.inf, Tolerance(), "lower-is-better", "ok"),
])
def test_judge(baseline, now, tolerance, direction, verdict):
    assert judge(baseline, now, tolerance, direction) == verdict


finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)
tolerances = st.builds(Tolerance, st.floats(0, 1e6), st.floats(0, 10))


@given(finite, finite, tolerances, st.sampled_from(DIRECTIONS))
def test_judge_invariants(baseline, now, tolerance, direction):
    verdict = judge(baseline, now, tolerance, direction)
    within = abs(now - baseline) <= max(tolerance.abs, max(tolerance.rel, FLOAT_DRIFT) * abs(baseline))
    assert (verdict == "ok") == within
    if not within and direction in ("lower-is-better", "higher-is-better"):
        # Swapping which way is better swaps regressed and improved.
        other = "higher-is-better" if direction == "lower-is-better" else "lower-is-better"
        assert {verdict, judge(baseline, now, tolerance, other)} == {"regressed", "improved"}
    # Looser tolerances never turn a pass into a failure.
    looser = Tolerance(tolerance.abs * 2 + 1, tolerance.rel * 2)
    assert verdict != "ok" or judge(baseline, now, looser, direction) == "ok"


def test_default_directions():
    assert default_direction("p99_ttft_ms") == "lower-is-better"
    assert default_direction("std_itl_ms") == "lower-is-better"
    assert default_direction("duration_s") == "lower-is-better"
    assert default_direction("output_throughput") == "higher-is-better"
    assert default_direction("acceptance_rate") == "higher-is-better"
    assert default_direction("total_output_tokens") == "must-not-change"
    assert default_direction("num_steps") == "informational"
    assert default_direction("mean_k") == "informational"


def test_tolerance_precedence(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text("""
[tolerance]
default = { abs = 1.0 }
mean_e2el_ms = { abs = 2.0 }
p99_e2el_ms = { abs = 3.0 }
[direction]
mean_k = "lower-is-better"
[[scenario]]
name = "a"
overrides = {}
[scenario.tolerance]
default = { rel = 0.1 }
p99_e2el_ms = { abs = 4.0 }
[[scenario]]
name = "b"
overrides = {}
""")
    base = load_baseline(path)
    a, b = base.scenarios
    assert base.tolerance(a, "p99_e2el_ms") == Tolerance(abs=4.0)   # scenario, for the metric
    assert base.tolerance(a, "mean_e2el_ms") == Tolerance(rel=0.1)  # scenario default beats the file's metric
    assert base.tolerance(b, "mean_e2el_ms") == Tolerance(abs=2.0)  # file, for the metric
    assert base.tolerance(b, "num_steps") == Tolerance(abs=1.0)     # file default
    assert base.direction("mean_k") == "lower-is-better" and base.direction("num_steps") == "informational"


# --- the docs' examples ------------------------------------------------------------------------

@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    for name in ("my_policy", "test_my_policy_regress"):
        sys.modules.pop(name, None)


def test_docs_pytest_example_passes_and_catches_a_change(examples_on_path, tmp_path):
    import test_my_policy_regress
    from my_policy import SmallBatchSpec

    test_my_policy_regress.test_small_batch_spec_has_not_regressed()

    class Eager(SmallBatchSpec):  # a "tuning" that speculates k = 3 at every batch size
        def choose_k(self, view):
            return self.small_k

    with pytest.raises(InputError, match="cannot be imported by name"):
        check_baseline(test_my_policy_regress.BASELINE, policy=Eager)  # a local class has no importable name
    module = type(sys)("eager_policy")
    module.Eager = Eager
    Eager.__module__, Eager.__qualname__ = "eager_policy", "Eager"
    sys.modules["eager_policy"] = module
    try:
        with pytest.raises(AssertionError, match=r"heavy-load\s+mean_e2el_ms.*regressed"):
            assert_no_regression(test_my_policy_regress.BASELINE, policy=Eager,
                                 overrides={"policy.threshold": 8})
    finally:
        sys.modules.pop("eager_policy")


def test_docs_github_actions_example_runs(examples_on_path, tmp_path, monkeypatch, capsys):
    import yaml
    workflow = yaml.safe_load((EXAMPLES / "regress-github-actions.yml").read_text())
    steps = [s for s in workflow["jobs"]["regress"]["steps"] if "specbatch regress" in s.get("run", "")]
    assert steps and steps[0]["env"]["PYTHONPATH"] == "docs/examples"
    argv = shlex.split(steps[0]["run"])
    assert argv[:2] == ["specbatch", "regress"]
    monkeypatch.chdir(ROOT)
    argv[argv.index("--json") + 1] = str(tmp_path / "regress.json")
    assert main(argv[1:]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "regress.json").read_text())["passed"]


def test_docs_figure_script_draws_a_comparison(tmp_path):
    spec = __import__("importlib.util").util.spec_from_file_location("regress_figure", EXAMPLES / "regress_figure.py")
    module = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = recorded(tmp_path)
    set_expected(path, "mean_e2el_ms", 1.0)
    comparison = check_baseline(path)
    out = module.draw(comparison.to_dict(), tmp_path / "fig.png")
    assert out.stat().st_size > 1000 and np.frombuffer(out.read_bytes()[:8], np.uint8)[1:4].tobytes() == b"PNG"


def test_the_pytest_helpers_are_part_of_import_specbatch():
    """A team's test suite imports them from the public module (docs/python-api.md), the same functions."""
    import specbatch

    assert specbatch.assert_no_regression is assert_no_regression and specbatch.check_baseline is check_baseline
    assert {"assert_no_regression", "check_baseline"} <= set(specbatch.__all__)
