"""The bad-input contract (docs/errors.md), for every command and input kind: one line naming
the field, the file and the line, exit 2, before any work, and nothing written anywhere.

A corpus of known-bad inputs (flags, configs, traces, profiles, sweep files, baselines,
policy plugins, output locations), then hypothesis fuzzing of configs, traces and profiles
with generated bad values. Each case runs the real command line in a folder of its own and
compares the folder's whole listing, hidden files included, before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbatch.commands.cli import main
from sim.limits import MAX_BATCH, MAX_REPLICAS, SEED_MAX
from workloads.limits import MAX_TIME_S, MAX_TOKENS

SHAPE = ["--prompt-tokens", "16", "--output-tokens", "8", "--max-batch-size", "8"]
TINY = [*SHAPE, "--num-requests", "4"]
TRACE_HEADER = "arrival_s,prompt_tokens,output_tokens\n"


def listing(root: Path) -> list[str]:
    """What is under ROOT, less Python's bytecode cache: importing a plugin writes its ``__pycache__``
    whatever the run does (unless PYTHONDONTWRITEBYTECODE is set), and that is not the run's output."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts)


def refused(capsys, folder: Path, argv: list[str], *needles: str) -> str:
    """Run ``specbatch argv`` in ``folder``: exit 2, one ``error:`` line holding every needle, nothing written."""
    before = listing(folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own one-line usage error
        code = exit.code
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert listing(folder) == before, "something was written"
    return lines[0]


@pytest.fixture
def here(tmp_path, synthetic_profile):
    """A working folder holding a copy of the synthetic profile (``p``) and a good trace (``t.csv``)."""
    shutil.copytree(synthetic_profile, tmp_path / "p")
    (tmp_path / "t.csv").write_text(TRACE_HEADER + "0,16,8\n0.5,12,8\n")
    return tmp_path


# ------------------------------------------------------------------------------------------- flags

@pytest.mark.parametrize("flags, needles", [
    (["--rate", "1e308", "--duration", "10"], ["--rate", "workload.rate", "memory"]),
    (["--rate", "1e-300", "--num-requests", "5"], ["--rate", "workload.rate", "simulated clock"]),
    (["--num-requests", "1000000000000", "--rate", "1e6"], ["--num-requests", "memory"]),
    (["--duration", "1e308"], ["--duration", "workload.duration_s", "at most"]),
    (["--prompt-tokens", "9223372036854775807"], ["--prompt-tokens", str(MAX_TOKENS)]),
    (["--output-tokens", "uniform:1:99999999999999999999"], ["--output-tokens"]),
    (["--max-batch-size", "1000000000"], ["--max-batch-size", str(MAX_BATCH)]),
    (["--replicas", "100000"], ["--replicas", str(MAX_REPLICAS)]),
    (["--seed", str(2**70)], ["--seed", "2**63 - 1"]),
    (["--seed", str(SEED_MAX + 1)], ["--seed"]),
    (["--seed", "-1"], ["--seed", "at least 0"]),
    (["--rate", "nan"], ["--rate", "finite"]),
    (["--rate=-inf"], ["--rate"]),
    (["--rate", "١"], ["--rate", "ASCII"]),
    (["--num-requests", "٣"], ["--num-requests", "ASCII"]),
])
def test_extreme_and_foreign_flag_values(capsys, here, flags, needles):
    load = [] if {"--duration", "--num-requests"} & set(flags) else ["--num-requests", "4"]
    refused(capsys, here, ["run", "--profile", "p", *SHAPE, *load, *flags, "--out", "o"], *needles)


def test_a_seed_at_the_top_of_the_range_runs_and_round_trips_through_config_toml(capsys, here):
    out = here / "o"
    assert main(["run", "--profile", str(here / "p"), *TINY, "--seed", str(SEED_MAX), "--out", str(out)]) == 0
    assert main(["run", "--config", str(out / "config.toml"), "--out", str(here / "again")]) == 0
    assert (here / "again" / "requests.csv").read_bytes() == (out / "requests.csv").read_bytes()


def test_lut_refuses_a_batch_range_it_cannot_tabulate(capsys, here):
    refused(capsys, here, ["lut", "--alpha", "0.7", "--profile", "p", "--max-batch", "100000000"], "--max-batch")


# ------------------------------------------------------------------------------------------ configs

@pytest.mark.parametrize("text, line, needles", [
    ("seed = 99999999999999999999\n", 1, ["seed", "2**63 - 1"]),
    ("[workload]\nrate = 1 # caf\xe9\n", 2, ["not UTF-8"]),
    ("[workload]\nprompt_tokens = 99999999999999999999\n", 2, ["workload.prompt_tokens"]),
    ("[workload]\nduration_s = inf\n", 2, ["workload.duration_s", "finite"]),
    ("[workload]\nnum_requests = 5\nrate = 1e-300\n", 3, ["workload.rate", "simulated clock"]),
    ("[engine]\nmax_batch_size = 99999999999\n", 2, ["engine.max_batch_size"]),
    ("[engine]\nkv_cache_tokens = 9999999999999999999\n", 2, ["engine.kv_cache_tokens"]),
    ("[cluster]\nreplicas = 5000\n", 2, ["cluster.replicas"]),
])
def test_bad_config_values_name_the_file_and_line(capsys, here, text, line, needles):
    path = here / "c.toml"
    path.write_bytes(text.encode("latin-1"))
    refused(capsys, here, ["run", "--config", "c.toml", "--profile", "p", "--out", "o"], f"c.toml:{line}", *needles)


# ------------------------------------------------------------------------------------------- traces

@pytest.mark.parametrize("body, line, needles", [
    (b"0,1\xff0,10\n", 2, ["not UTF-8"]),
    ("0,١٢,10\n".encode(), 2, ["prompt_tokens", "whole number"]),
    (b"0,1_2,10\n", 2, ["prompt_tokens"]),
    (b"0,12,10\n1e308,5,5\n", 3, ["arrival_s", "at most"]),
    (b"0,12,10\n1e10,5,5\n", 3, ["arrival_s"]),
    (b"0,99999999999999999999999,10\n", 2, ["prompt_tokens", str(MAX_TOKENS)]),
    (b"0,12,9223372036854775808\n", 2, ["output_tokens"]),
    (b"nan,12,10\n", 2, ["arrival_s", "finite"]),
    (b"0x10,12,10\n", 2, ["arrival_s"]),
])
def test_bad_trace_cells_name_the_file_line_and_column(capsys, here, body, line, needles):
    (here / "bad.csv").write_bytes(TRACE_HEADER.encode() + body)
    refused(capsys, here, ["run", "--trace", "bad.csv", "--profile", "p", "--out", "o"], f"bad.csv:{line}", *needles)


# ----------------------------------------------------------------------------------------- profiles

def _edit_points(profile: Path, column: str, value: str, row: int = 0) -> int:
    """Write ``value`` into one cell of profile.csv; returns the file line it is on."""
    table = pd.read_csv(profile / "profile.csv", dtype=str, keep_default_na=False)
    table.loc[row, column] = value
    table.to_csv(profile / "profile.csv", index=False, lineterminator="\n")
    return row + 2


def _edit_meta(profile: Path, key: str, raw_json: str) -> None:
    meta = json.loads((profile / "profile.json").read_text())
    holder = meta
    *parents, last = key.split(".")
    for part in parents:
        holder = holder.setdefault(part, {})
    holder[last] = "@@VALUE@@"
    (profile / "profile.json").write_text(json.dumps(meta, indent=2).replace('"@@VALUE@@"', raw_json))


@pytest.mark.parametrize("column, value", [
    ("latency_median_s", "0"), ("latency_median_s", "inf"), ("latency_median_s", "1e-300"),
    ("latency_median_s", "1e308"), ("latency_mean_s", "-1"), ("latency_p90_s", "nan"),
    ("batch_size", "99999999999999999999"), ("context_tokens", "١٢٨"), ("samples", "-3"),
])
def test_bad_profile_points_name_the_row_and_column(capsys, here, column, value):
    line = _edit_points(here / "p", column, value)
    refused(capsys, here, ["run", "--profile", "p", *TINY, "--out", "o"], f"profile.csv:{line}", column)


@pytest.mark.parametrize("key, raw", [
    ("kv_capacity_tokens", '"lots"'), ("kv_capacity_tokens", "NaN"), ("kv_capacity_tokens", "-5"),
    ("kv_capacity_tokens", "1e30"), ("kv_capacity_tokens", "true"), ("kv_capacity_tokens", "2.5"),
    ("engine_overhead.decode_overhead_s", "-0.001"), ("engine_overhead.prefill_overhead_s", '"fast"'),
    ("engine_overhead.decode_overhead_s", "Infinity"), ("name", "12"),
    ("engine_overhead.exposed_overhead_s", "-1"), ("engine_overhead.overlap", '"sometimes"'),
    ("engine_overhead.decode_overhead_per_row_s", "-1e-4"), ("engine_overhead.decode_overhead_per_row_s", '"x"'),
])
def test_bad_profile_sidecar_values_name_the_key_and_line(capsys, here, key, raw):
    _edit_meta(here / "p", key, raw)
    line = refused(capsys, here, ["run", "--profile", "p", *TINY, "--out", "o"], "profile.json:")
    assert key.rsplit(".", 1)[-1] in line or raw in line


def test_an_empty_or_foreign_profile_csv_is_one_line(capsys, here):
    (here / "p" / "profile.csv").write_text("")
    refused(capsys, here, ["run", "--profile", "p", *TINY, "--out", "o"], "profile.csv:1", "empty")
    (here / "p" / "profile.csv").write_bytes(b"phase,model\n\xff\xfe\n")
    refused(capsys, here, ["run", "--profile", "p", *TINY, "--out", "o"], "profile.csv:2", "UTF-8")


# ---------------------------------------------------------------------------------- output locations

def _baseline(folder: Path) -> Path:
    (folder / "b.toml").write_text(f'[[scenario]]\nname = "tiny"\nprofile = "{folder / "p"}"\n'
                                   "workload.num_requests = 4\nworkload.prompt_tokens = 16\n"
                                   "workload.output_tokens = 8\n[scenario.expected]\ncompleted = 4\n")
    return folder / "b.toml"


@pytest.mark.parametrize("case", ["run-under-file", "run-is-file", "run-not-a-run", "timeline-dir",
                                  "timeline-under-file", "lut-dir", "regress-json-dir", "regress-update-dir",
                                  "sweep-is-file", "capacity-under-file", "read-only-fs"])
def test_output_locations_are_checked_before_any_work(capsys, here, case):
    (here / "file").write_text("not a folder")
    (here / "folder").mkdir()
    (here / "folder" / "keep").write_text("mine")
    (here / "base.toml").write_text('profile = "p"\n[workload]\nnum_requests = 4\n')
    (here / "s.toml").write_text('base = "base.toml"\n[axes]\nseed = [1, 2]\n')
    run = ["run", "--profile", "p", *TINY]
    argv, needle = {
        "run-under-file": (run + ["--out", "file/o"], "is a file, not a folder"),
        "run-is-file": (run + ["--out", "file"], "is a file, not a folder"),
        "run-not-a-run": (run + ["--out", "folder"], "not a specbatch run folder"),
        "timeline-dir": (run + ["--out", "o", "--timeline", "folder"], "folder"),
        "timeline-under-file": (run + ["--out", "o", "--timeline", "file/t.json"], "is a file"),
        "lut-dir": (["lut", "--alpha", "0.7", "--profile", "p", "--out", "folder"], "folder"),
        "regress-json-dir": (["regress", "--baseline", str(_baseline(here)), "--json", "folder"], "--json"),
        "regress-update-dir": (["regress", "--baseline", "folder", "--update"], "folder"),
        "sweep-is-file": (["sweep", "s.toml", "--out", "file", "--executor", "serial"], "is a file"),
        "capacity-under-file": (["capacity", "--profile", "p", "--policies", "fixed", "--slo", "p99_ttft_ms=2000",
                                 "--min-requests", "20", "--jobs", "1", "--out", "file/c"],
                                "is a file"),
        "read-only-fs": (run + ["--out", "/proc/specbatch-out"], "/proc"),
    }[case]
    refused(capsys, here, argv, needle)


# ------------------------------------------------------------------------------------------ plugins

PLUGINS = {
    "syntax": ("from policies import Policy\nclass P(Policy)\n    pass\n", "syntax error"),
    "import": ("raise RuntimeError('boom at import')\n", "raised RuntimeError importing"),
    "init": ("from policies import Policy\nclass P(Policy):\n    def __init__(self):\n"
             "        raise ValueError('boom in init')\n", "raised ValueError in __init__"),
    "max_k": ("from policies import Policy\nclass P(Policy):\n    @property\n    def max_k(self):\n"
              "        return 1 // 0\n    def choose_k(self, view):\n        return 1\n",
              "raised ZeroDivisionError in max_k"),
    "choose_k": ("from policies import Policy\nclass P(Policy):\n    max_k = 2\n    def __init__(self):\n"
                 "        self.calls = 0\n    def choose_k(self, view):\n        self.calls += 1\n"
                 "        if self.calls > 2:\n            raise KeyError('boom in choose_k')\n        return 1\n",
                 "raised KeyError in choose_k"),
}


@pytest.fixture
def plugin(here, monkeypatch):
    """Write a plugin module of a fresh name (modules are cached by name) into the working folder."""
    monkeypatch.syspath_prepend(str(here))

    def write(kind: str) -> tuple[str, str]:
        source, needle = PLUGINS[kind]
        module = f"plugin_{kind}_{uuid.uuid4().hex[:8]}"
        (here / f"{module}.py").write_text(source)
        return f"{module}:P", needle
    yield write
    for name in [m for m in sys.modules if m.startswith("plugin_")]:
        del sys.modules[name]


@pytest.mark.parametrize("kind", list(PLUGINS))
def test_a_plugin_raising_anywhere_is_one_line_naming_it_and_where(capsys, here, plugin, kind):
    name, needle = plugin(kind)
    line = refused(capsys, here, ["run", "--profile", "p", *TINY, "--policy", name, "--out", "o"], name, needle)
    assert f"{name.split(':')[0]}.py:" in line  # the plugin's file and line


def test_debug_shows_the_plugins_traceback(capsys, here, plugin):
    name, _ = plugin("choose_k")
    os.chdir(here)
    code = main(["run", "--profile", "p", *TINY, "--policy", name, "--out", "o", "--debug"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err and "boom in choose_k" in err and not (here / "o").exists()


def test_a_sweep_records_a_plugins_mid_run_failure_as_one_line_per_cell(capsys, here, plugin):
    name, needle = plugin("choose_k")
    (here / "base.toml").write_text(f'profile = "{here / "p"}"\n[workload]\nnum_requests = 4\nprompt_tokens = 16\n'
                                    'output_tokens = 8\n')
    (here / "s.toml").write_text(f'base = "base.toml"\n[axes]\npolicy = ["fixed", "{name}"]\n')
    os.chdir(here)
    assert main(["sweep", "s.toml", "--out", "s", "--executor", "serial", "--no-progress"]) == 0
    failed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("failed: ")]
    assert len(failed) == 1 and needle in failed[0] and name in failed[0]


# ------------------------------------------------------------------------------------ fuzz (hypothesis)

FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_non_finite = st.sampled_from(["nan", "inf", "-inf", "+inf"])
_huge_int = st.integers(min_value=2**63, max_value=2**80).map(str)
_negative = st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False).map(repr)
_foreign_digits = st.sampled_from(["١٢", "۳۴", "१२", "１２", "๒"])
_junk = st.text(alphabet="xyz!?", min_size=1, max_size=4).map(lambda s: f'"{s}"')

# key -> strategy of TOML value texts that key must refuse
CONFIG_BAD = {
    "seed": st.one_of(_huge_int, st.integers(max_value=-1).map(str), _junk, st.just("1.5")),
    # rate = inf is valid (every request at t = 0, as vllm bench serve --request-rate inf)
    "workload.rate": st.one_of(st.sampled_from(["nan", "-inf"]), _negative, st.just("0"), _junk),
    "workload.duration_s": st.one_of(_non_finite, _negative, st.floats(min_value=MAX_TIME_S * 1.01,
                                                                      max_value=1e308).map(repr)),
    "workload.num_requests": st.one_of(st.integers(max_value=0).map(str), _huge_int, st.just("2.5")),
    "workload.prompt_tokens": st.one_of(st.integers(min_value=MAX_TOKENS + 1, max_value=2**70).map(str),
                                        st.integers(max_value=0).map(str)),
    "engine.max_batch_size": st.one_of(st.integers(min_value=MAX_BATCH + 1).map(str),
                                       st.integers(max_value=0).map(str), _junk),
    "engine.kv_cache_tokens": st.one_of(_huge_int, st.integers(max_value=0).map(str)),
    "acceptance.alpha": st.one_of(_non_finite, st.floats(min_value=1.0, max_value=1e308).map(repr),
                                  st.floats(max_value=0.0, allow_nan=False, allow_infinity=False).map(repr)),
    "cluster.replicas": st.one_of(st.integers(min_value=MAX_REPLICAS + 1).map(str), st.integers(max_value=0).map(str)),
}


@FUZZ
@given(data=st.data())
def test_fuzz_bad_config_values(capsys, here, data):
    key = data.draw(st.sampled_from(sorted(CONFIG_BAD)))
    value = data.draw(CONFIG_BAD[key])
    section, _, field = key.rpartition(".")
    head = "[workload]\nnum_requests = 4\n" if section != "workload" else ""
    body = f"{field} = {value}\n" if not section else f"[{section}]\n{field} = {value}\n"
    text = head + body
    if section == "workload" and field != "num_requests":
        text += "num_requests = 4\n" if field != "duration_s" else ""
    (here / "c.toml").write_text(text)
    line = text.splitlines().index(f"{field} = {value}") + 1
    refused(capsys, here, ["run", "--config", "c.toml", "--profile", "p", "--out", "o"], f"c.toml:{line}", key)


_bad_count = st.one_of(st.integers(max_value=0).map(str), st.integers(min_value=MAX_TOKENS + 1).map(str),
                       _foreign_digits, st.just("1.5"), st.just("1_0"), st.just(""), st.just("ten"))
_bad_time = st.one_of(_non_finite, _negative, st.floats(min_value=MAX_TIME_S * 1.01, max_value=1e308).map(repr),
                      _foreign_digits, st.just("0x1"), st.just("1_0"))
TRACE_BAD = {"arrival_s": _bad_time, "prompt_tokens": _bad_count, "output_tokens": _bad_count}


@FUZZ
@given(data=st.data())
def test_fuzz_bad_trace_cells(capsys, here, data):
    rows = data.draw(st.integers(min_value=1, max_value=6))
    column = data.draw(st.sampled_from(list(TRACE_BAD)))
    at = data.draw(st.integers(min_value=0, max_value=rows - 1))
    cells = [[f"{0.5 * i}", "16", "8"] for i in range(rows)]
    cells[at][list(TRACE_BAD).index(column)] = data.draw(TRACE_BAD[column])
    (here / "bad.csv").write_text(TRACE_HEADER + "".join(",".join(row) + "\n" for row in cells))
    refused(capsys, here, ["run", "--trace", "bad.csv", "--profile", "p", "--out", "o"], f"bad.csv:{at + 2}",
            column)


_bad_latency = st.one_of(_non_finite, _negative, st.floats(min_value=3600.5, max_value=1e308).map(repr),
                         st.floats(min_value=0.0, max_value=9e-10).map(repr), _foreign_digits, st.just("fast"))
_bad_profile_count = st.one_of(st.integers(max_value=-1).map(str), st.integers(min_value=2**31).map(str),
                               _foreign_digits, st.just("2.5"), st.just("many"))
PROFILE_BAD = {"latency_median_s": _bad_latency, "batch_size": _bad_profile_count,
               "context_tokens": _bad_profile_count, "query_tokens": _bad_profile_count,
               "phase": st.sampled_from(["Prefill", "decoding", ""]), "status": st.sampled_from(["OK", "fine"])}


@FUZZ
@given(data=st.data())
def test_fuzz_bad_profile_points(capsys, here, synthetic_profile, data):
    column = data.draw(st.sampled_from(sorted(PROFILE_BAD)))
    row = data.draw(st.integers(min_value=0, max_value=50))
    shutil.rmtree(here / "p")
    shutil.copytree(synthetic_profile, here / "p")
    line = _edit_points(here / "p", column, data.draw(PROFILE_BAD[column]), row)
    refused(capsys, here, ["run", "--profile", "p", *TINY, "--out", "o"], f"profile.csv:{line}", column)


# ------------------------------------------------------------------------------------- Python API

def test_the_python_api_checks_and_locks_outputs_before_the_work(here):
    import specbatch
    from sim.atomic_write import output_lock
    from sim.errors import InputError

    (here / "file").write_text("not a folder")
    small = {"profile": str(here / "p"), "num_requests": 4, "prompt_tokens": 16, "output_tokens": 8}
    with pytest.raises(InputError, match="is a file, not a folder"):
        specbatch.run(out=str(here / "file" / "o"), **small)
    with output_lock(here / "busy"):
        with pytest.raises(InputError, match="another specbatch process"):
            specbatch.run(out=str(here / "busy"), **small)
    (here / "base.toml").write_text(f'profile = "{here / "p"}"\n[workload]\nnum_requests = 4\n')
    with pytest.raises(InputError, match="is a file"):
        specbatch.sweep({"base": str(here / "base.toml"), "axes": {"seed": [1, 2]}}, out=here / "file",
                        executor="serial")
    assert sorted(p.name for p in here.iterdir()) == ["base.toml", "file", "p", "t.csv"]
    assert specbatch.run(out=str(here / "o"), **small).out == here / "o"


@pytest.mark.parametrize("argv, says", [
    (["run", "--config", "{d}"], "{d}: config: is a folder, not a config file"),
    (["run", "--trace", "{d}"], "{d}: is a folder, not a trace file"),
    (["run", "--trace-vllm", "{d}"], "{d}: workload.trace_vllm: is a folder, not a vLLM result file"),
    (["run", "--acceptance-model", "trace", "--acceptance-trace", "{d}"], "is a folder, not an acceptance trace file"),
    (["sweep", "{d}"], "{d}: sweep: is a folder, not a sweep file"),
    (["regress", "--baseline", "{d}"], "{d}: baseline: is a folder, not a baseline file"),
    (["capacity", "--slo", "p99_ttft_ms=1", "--gpu-price", "{d}"], "'{d}' is a folder, not a TOML file of prices"),
])
def test_a_folder_where_a_file_is_expected_says_so(argv, says, tmp_path, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    assert main([a.format(d=folder) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says.format(d=folder) in err
