"""specbatch sweep: cells resolved up front, one table whatever runs it, resumable after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbatch.commands.cli import main
from sim.config import load_config
from sim.simulate import simulate
from specbatch.commands.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = """\
profile = "{profile}"
[workload]
num_requests = 24
prompt_tokens = 32
output_tokens = 24
[output]
records = "none"
"""

GRID = """\
base = "scenario.toml"

[axes]
policy = ["none", {name = "fixed", k = 2}]
rate = [0.2, 0.4]
seed = [0, 1]
"""


PROFILE = {}


@pytest.fixture(autouse=True, scope="module")
def _fast_profile(synthetic_profile):
    """Cells on the synthetic profile: its cost curves fit in half the time of the shipped one's."""
    PROFILE["path"] = str(synthetic_profile)


def write_sweep(folder: Path, text: str, name: str = "grid.toml") -> Path:
    (folder / "scenario.toml").write_text(SCENARIO.format(profile=PROFILE["path"]))
    path = folder / name
    path.write_text(text)
    return path


def sweep(path: Path, out: Path, *flags: str) -> int:
    return main(["sweep", str(path), "--out", str(out), "--no-progress", "--csv", *flags])


@pytest.fixture(scope="module")
def dask_address():
    distributed = pytest.importorskip("distributed")
    import logging

    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None,
                                  silence_logs=logging.ERROR) as cluster:
        yield cluster.scheduler_address


def test_serial_pool_and_dask_give_identical_tables(tmp_path, dask_address, capsys):
    path = write_sweep(tmp_path, GRID)
    assert sweep(path, tmp_path / "serial", "--executor", "serial") == 0
    assert "8 cells (8 run now, 0 from the store, 0 failed)" in capsys.readouterr().out
    assert sweep(path, tmp_path / "pool", "--workers", "2") == 0
    assert sweep(path, tmp_path / "dask", "--dask", dask_address) == 0
    tables = {name: pd.read_parquet(tmp_path / name / "sweep.parquet") for name in ("serial", "pool", "dask")}
    pd.testing.assert_frame_equal(tables["serial"], tables["pool"])
    pd.testing.assert_frame_equal(tables["serial"], tables["dask"])
    csv = {name: (tmp_path / name / "sweep.csv").read_bytes() for name in tables}
    assert csv["serial"] == csv["pool"] == csv["dask"]
    # The rows are the product in the file's order, whatever order the cells finished in.
    table = tables["serial"]
    assert list(table.columns[:9]) == ["cell", "policy", "policy.name", "policy.k", "workload.rate", "seed",
                                       "status", "error", "key"]
    assert list(table.policy) == ["none"] * 4 + ["fixed k=2"] * 4
    assert list(table["workload.rate"]) == [0.2, 0.2, 0.4, 0.4] * 2
    assert list(table.seed) == [0, 1] * 4
    assert (table.status == "ok").all() and table.key.is_unique
    assert table.mean_e2el_ms.nunique() == 8  # every cell differs: the axes reach the runs
    # A cell's metrics are exactly those of the same scenario run alone.
    config = load_config(tmp_path / "scenario.toml", {"policy.name": ("fixed", "--policy"), "policy.k": (2, "--k"),
                                                      "workload.rate": (0.4, "--rate"), "seed": (1, "--seed")})
    alone = simulate(config).summary
    for name in ("mean_e2el_ms", "p99_ttft_ms", "request_throughput", "acceptance_rate", "num_steps"):
        assert table.iloc[7][name] == alone[name]


def test_a_cell_failing_at_run_time_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    path = write_sweep(tmp_path, GRID.replace('{name = "fixed", k = 2}', '{name = "fixed", k = 2}, '
                                              '{name = "fixed", k = 9}').replace("rate = [0.2, 0.4]", "rate = [0.4]"))
    assert sweep(path, tmp_path / "out", "--executor", "serial") == 0
    table = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    failed = table[table.status == "failed"]
    assert list(failed.policy) == ["fixed k=9"] * 2  # k = 9 is beyond the profile's k_max = 7
    assert failed.error.str.contains(f"{path}:4: policy.k: k = 9 is beyond the profile's measured k_max",
                                     regex=False).all()
    assert failed.mean_e2el_ms.isna().all() and pd.isna(failed.completed).all()
    assert (table[table.status == "ok"].error == "").all() and len(table) == 6
    captured = capsys.readouterr()
    assert "6 cells (6 run now, 0 from the store, 2 failed)" in captured.out
    assert "failed: " in captured.err
    # Failed cells are stored too: a rerun runs nothing, unless asked to retry them.
    assert sweep(path, tmp_path / "out", "--executor", "serial") == 0
    assert "(0 run now, 6 from the store, 2 failed)" in capsys.readouterr().out
    assert sweep(path, tmp_path / "out", "--executor", "serial", "--retry-failed") == 0
    assert "(2 run now, 4 from the store, 2 failed)" in capsys.readouterr().out


def test_resume_after_sigkill_runs_only_the_missing_cells(tmp_path, capsys):
    path = write_sweep(tmp_path, GRID.replace('"none", ', '"none", {name = "fixed", k = 1}, '))  # 12 cells
    out, cells = tmp_path / "out", tmp_path / "out" / "cells"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "specbatch.commands.cli", "sweep", str(path), "--out", str(out),
                             "--executor", "serial", "--no-progress"], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(cells.glob("*.json"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep (and any process it started), mid-way
    proc.wait()
    kept = {p.name: p.stat().st_mtime_ns for p in cells.glob("*.json")}
    assert 2 <= len(kept) < 12, "the sweep was not killed mid-way"
    assert not (out / "sweep.parquet").exists()
    (cells / ".torn.json.1234.tmp").write_text('{"status": "o')  # what a write cut short leaves: ignored
    assert sweep(path, out, "--executor", "serial") == 0
    assert f"12 cells ({12 - len(kept)} run now, {len(kept)} from the store, 0 failed)" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in cells.glob("*.json") if p.name in kept} == kept  # untouched
    assert sweep(path, tmp_path / "fresh", "--executor", "serial") == 0
    pd.testing.assert_frame_equal(pd.read_parquet(out / "sweep.parquet"),
                                  pd.read_parquet(tmp_path / "fresh" / "sweep.parquet"))


def test_a_damaged_cell_file_is_recomputed(tmp_path, capsys):
    path = write_sweep(tmp_path, GRID.replace("rate = [0.2, 0.4]", "rate = [0.4]").replace("seed = [0, 1]",
                                                                                          "seed = [0]"))
    assert sweep(path, tmp_path / "out", "--executor", "serial") == 0
    before = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    victim = tmp_path / "out" / "cells" / f"{before.key[0]}.json"
    victim.write_text(victim.read_text()[:40])
    capsys.readouterr()
    assert sweep(path, tmp_path / "out", "--executor", "serial") == 0
    assert "(1 run now, 1 from the store" in capsys.readouterr().out
    pd.testing.assert_frame_equal(before, pd.read_parquet(tmp_path / "out" / "sweep.parquet"))


def test_zipped_axes_vary_together_and_equal_cells_run_once(tmp_path, capsys):
    path = write_sweep(tmp_path, """\
base = "scenario.toml"
[scenario.policy]
name = "none"
[axes]
seed = [3, 3]
[zip.load]
rate = [0.2, 0.4, 0.8]
"workload.num_requests" = [10, 20, 40]
""")
    assert sweep(path, tmp_path / "out", "--executor", "serial") == 0
    table = pd.read_csv(tmp_path / "out" / "sweep.csv")
    assert list(table["workload.rate"]) == [0.2, 0.4, 0.8] * 2
    assert list(table.completed) == [10, 20, 40] * 2
    assert "6 cells (3 run now" in capsys.readouterr().out  # seed 3 twice: the same three configs
    assert table.key[:3].tolist() == table.key[3:].tolist()


def test_table_without_pyarrow_falls_back_to_csv(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("specbatch.commands.sweep.store.have_pyarrow", lambda: False)
    path = write_sweep(tmp_path, GRID.replace("seed = [0, 1]", "seed = [0]").replace("rate = [0.2, 0.4]",
                                                                                    "rate = [0.4]"))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial", "--no-progress"]) == 0
    assert (tmp_path / "out" / "sweep.csv").is_file() and not (tmp_path / "out" / "sweep.parquet").exists()
    assert "pyarrow is not installed" in capsys.readouterr().err


BAD = {
    "missing base": ('base = "nope.toml"\n[axes]\nseed = [0]\n', 1, "base: no such scenario file 'nope.toml'"),
    "unknown axis": ('[axes]\nseed = [0]\n"workload.rat" = [0.1]\n', 3, "axes.workload.rat: unknown setting"),
    "empty axis": ("[axes]\nrate = []\n", 2, "axes.rate: empty axis"),
    "not a list": ("[axes]\nseed = 3\n", 2, "axes.seed: expected a list of values"),
    "wrong type": ('[axes]\nseed = [0]\nrate = [0.1, "fast"]\n', 3, "axes.rate: 'fast' is not a number"),
    "wrong integer": ('[axes]\n"engine.max_batch_size" = [8, 2.5]\n', 2, "axes.engine.max_batch_size: '2.5' is"),
    "policy param type": ('[axes]\npolicy = [\n  "none",\n  {name = "fixed", k = "two"},\n]\n', 2,
                          "axes.policy: k must be a whole number >= 0, got 'two' (policy.k)"),
    "unknown policy": ('[axes]\npolicy = ["fixd"]\n', 2, "axes.policy: unknown policy 'fixd'"),
    "unknown policy param": ('[axes]\npolicy = [{name = "fixed", kk = 2}]\n', 2,
                             "axes.policy: policy 'fixed' takes no parameter 'kk'"),
    "zip lengths": ("[zip.load]\nrate = [0.1, 0.2]\nseed = [1]\n", 3, "zip.load.seed: has 1 values but rate"),
    "two axes one key": ('[axes]\nrate = [0.1]\n"workload.rate" = [0.2]\n', 3,
                         "axes.workload.rate: sets workload.rate, which axis axes.rate also sets"),
    "output axis": ('[axes]\n"output.dir" = ["x"]\n', 2, "axes.output.dir: output settings do not vary"),
    "unknown top key": ("[axes]\nseed = [0]\n[axis]\nrate = [1]\n", 3, "axis: unknown sweep key"),
    "bad scenario value": ("[scenario.workload]\nrate = -1\n[axes]\nseed = [1]\n", 2,
                           "workload.rate: must be greater than 0"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_sweep_files_fail_before_any_cell_with_one_line(tmp_path, capsys, case):
    text, line, message = BAD[case]
    path = write_sweep(tmp_path, text, "bad.toml")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--executor", "serial"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}:{line}: ")
    assert message in err
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


@settings(max_examples=25, deadline=None)
@given(rates=st.lists(st.sampled_from([0.05, 0.1, 0.2, 0.3]), min_size=1, max_size=3),
       seeds=st.lists(st.integers(0, 50), min_size=1, max_size=3),
       ks=st.lists(st.integers(0, 7), min_size=1, max_size=3))
def test_cells_are_the_product_and_each_config_carries_its_values(tmp_path_factory, rates, seeds, ks):
    folder = tmp_path_factory.mktemp("spec")
    path = write_sweep(folder, f'base = "scenario.toml"\n[axes]\n"policy.k" = {ks}\nrate = {rates}\nseed = {seeds}\n')
    spec = load_sweep(path)
    assert len(spec.cells) == len(ks) * len(rates) * len(seeds)
    for cell in spec.cells:
        i, rest = divmod(cell.index, len(rates) * len(seeds))
        j, s = divmod(rest, len(seeds))
        assert (cell.config.policy.params["k"], cell.config.workload.rate, cell.config.seed) == (ks[i], rates[j],
                                                                                                  seeds[s])
        assert cell.columns == {"policy.k": ks[i], "workload.rate": rates[j], "seed": seeds[s]}
        assert cell.config.workload.num_requests == 24  # the base file applies to every cell
