"""The Python API's process pools and Dask from a plain script with no ``__main__`` guard, from
``python -c``, from standard input and from a notebook: the caller's code runs once, the
workers never run it again, and the results come back.

Each case runs in a fresh interpreter (a subprocess), as a user's script would."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "tests" / "baselines" / "scenarios" / "cpu.toml"

SWEEP = ('import specbatch\n'
         'print("started", flush=True)\n'
         'table = specbatch.sweep({"axes": {"rate": [5, 10]}, "scenario": {"workload": {"num_requests": 60}}}, '
         'workers=2DASK)\n'
         'print("sweep", ",".join(table.status), flush=True)\n')
CAPACITY = ('report = specbatch.capacity(r"CPU", slo={"p99_ttft_ms": 60000}, policies=["none"], seeds=1, '
            'tolerance=0.3, max_growth=0.2, service_times=10, min_requests=10, curve_points=0, prompt_tokens="32", '
            'output_tokens="32", jobs=2)\n'
            'print("capacity", bool(report.table.max_rate[0] > 0), flush=True)\n')


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def check(done: subprocess.CompletedProcess, capacity: bool = True) -> None:
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr[-2000:]
    assert lines.count("started") == 1, done.stdout  # the workers did not run the caller's code again
    assert "sweep ok,ok" in lines
    assert not capacity or "capacity True" in lines


def code(dask: bool = False, capacity: bool = True) -> str:
    return SWEEP.replace("DASK", ', executor="dask"' if dask else "") + (CAPACITY.replace("CPU", str(CPU)) if capacity else "")


@pytest.mark.slow
def test_a_plain_script_without_a_main_guard(tmp_path):
    script = tmp_path / "study.py"
    script.write_text(code())
    check(subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment(), capture_output=True,
                         text=True, timeout=300))


@pytest.mark.slow
def test_python_dash_c_and_standard_input(tmp_path):
    check(subprocess.run([sys.executable, "-c", code()], cwd=tmp_path, env=environment(), capture_output=True,
                         text=True, timeout=300))
    check(subprocess.run([sys.executable, "-"], input=code(capacity=False), cwd=tmp_path, env=environment(),
                         capture_output=True, text=True, timeout=300), capacity=False)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs dask.distributed")
def test_dask_from_a_plain_script(tmp_path):
    script = tmp_path / "study.py"
    script.write_text(code(dask=True, capacity=False))
    check(subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment(), capture_output=True,
                         text=True, timeout=300), capacity=False)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("nbclient") is None or importlib.util.find_spec("ipykernel") is None,
                    reason="needs nbclient and ipykernel (the test extra)")
def test_a_notebook(tmp_path):
    """A notebook's cells run in a Jupyter kernel, whose __main__ is the kernel's launcher."""
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": source} for i, source in enumerate(code().split("report = "))]}
    notebook["cells"][1]["source"] = "report = " + notebook["cells"][1]["source"]
    path = tmp_path / "study.ipynb"
    path.write_text(json.dumps(notebook))
    runner = ("import nbformat, nbclient, sys\n"
              "nb = nbformat.read(sys.argv[1], as_version=4)\n"
              "nbclient.NotebookClient(nb, timeout=240, kernel_name='python3').execute()\n"
              "print(''.join(o.get('text', '') for c in nb.cells for o in c.get('outputs', [])), end='')\n")
    check(subprocess.run([sys.executable, "-c", runner, str(path)], cwd=tmp_path, env=environment(),
                         capture_output=True, text=True, timeout=300))
