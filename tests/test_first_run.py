"""The first run of a code version on a machine (sim/jit.py): says so on any stderr, and a small
run does not wait for the compiler (it is interpreted while a background process compiles)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim import jit
from sim.warm import warm

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not jit.numba_available(), reason="numba is not installed")


class FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """A cold compiled-code folder, background compilation on, and the processes it would start."""
    jit.prepare()
    monkeypatch.setattr(jit, "_folder", tmp_path)
    monkeypatch.setattr(jit, "_SAID", set())
    monkeypatch.setenv(jit.BACKGROUND_ENV, "1")
    started = []

    def popen(argv, **kwargs):
        started.append((argv, kwargs))
        return FakeProcess(os.getpid())  # a live process id

    monkeypatch.setattr(subprocess, "Popen", popen)
    return tmp_path, started


def test_a_small_cold_run_is_interpreted_while_one_warm_up_compiles(cold, capsys):
    folder, started = cold
    assert jit.use_compiled("auto", 500) is False
    assert jit.use_compiled("auto", 500) is False  # the warm-up already runs: not a second one
    assert len(started) == 1
    argv, kwargs = started[0]
    assert argv[1:] == ["-m", "sim.warm"] and kwargs["start_new_session"]
    assert kwargs["env"][jit.BACKGROUND_ENV] == "0"  # the warm-up compiles in its own process
    assert (folder / jit.WARMING).read_text() == str(os.getpid())
    err = capsys.readouterr().err  # not a terminal, and still said, once
    assert err.count("\n") == 1 and "interpreted while the engine compiles in the background" in err


def test_on_and_a_large_run_compile_now_and_say_so(cold, capsys):
    _, started = cold
    assert jit.use_compiled("on", 10) is True
    assert jit.use_compiled("auto", jit.SMALL_RUN + 1) is True
    assert started == []
    assert capsys.readouterr().err.count("note: compiling the simulation engine") == 1
    assert jit.use_compiled("off", 10) is False


def test_a_folder_that_holds_compiled_code_loads_it_without_a_note(cold, capsys, monkeypatch):
    folder, _ = cold
    monkeypatch.setenv(jit.BACKGROUND_ENV, "0")
    (folder / "serving").mkdir()
    (folder / "serving" / "kernel.run_steps-1.py311.nbi").write_bytes(b"")
    assert jit.use_compiled("auto", 10) is True
    assert capsys.readouterr().err == ""


def test_a_warm_folder_runs_compiled_silently(cold, capsys):
    folder, started = cold
    (folder / jit.READY).write_text("")
    assert jit.use_compiled("auto", 10) is True and started == []
    assert capsys.readouterr().err == ""


def test_background_compilation_can_be_turned_off(cold, monkeypatch):
    _, started = cold
    monkeypatch.setenv(jit.BACKGROUND_ENV, "0")
    assert jit.use_compiled("auto", 10) is True and started == []


def test_a_dead_warm_up_is_replaced_and_a_failed_one_is_not_retried(cold):
    folder, started = cold
    (folder / jit.WARMING).write_text("999999999")  # no such process
    assert jit.use_compiled("auto", 10) is False and len(started) == 1
    (folder / jit.WARMING).unlink()
    (folder / jit.FAILED).write_text("Traceback ...")
    assert jit.use_compiled("auto", 10) is True and len(started) == 1


def test_warm_marks_the_folder_and_releases_its_lock(cold):
    folder, _ = cold
    (folder / jit.WARMING).write_text(str(os.getpid()))
    warm(runs=({"engine.scheduler": "v0"},))
    assert (folder / jit.READY).is_file() and not (folder / jit.WARMING).exists()


def test_a_failing_warm_up_says_why_and_releases_its_lock(cold):
    folder, _ = cold
    with pytest.raises(Exception):
        warm(runs=({"engine.scheduler": "no-such-scheduler"},))
    assert "no-such-scheduler" in (folder / jit.FAILED).read_text()
    assert not (folder / jit.READY).exists() and not (folder / jit.WARMING).exists()


def test_the_warm_up_reaches_every_kernel_and_its_two_shares_are_all_of_it(tmp_path):
    """sim.warm compiles what a run can call: the single replica's kernel, the routed cluster's (round-robin's
    replicas run apart, so a routed run needs its own warm run) and the disaggregated one. Its runs are made
    in a process of their own with numba's compiler off (``NUMBA_DISABLE_JIT``: the same calls, each kernel's
    twin made and called as plain Python), so that asking which kernels they reach compiles none of them."""
    from sim import warm as warm_module

    script = ("from sim import jit, warm\n"
              "from sim.serving import cluster_kernel, kernel, pd_kernel\n"
              "warm.run_compiled(warm.WARM_RUNS)\n"
              "print(sorted(f.__name__ for f in (kernel.run_steps, cluster_kernel.run_cluster, pd_kernel.run_pd)"
              " if f in jit._TWINS))\n")
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "SPECBATCH_CACHE_DIR": str(tmp_path / "cache"),
           "SPECBATCH_BACKGROUND_COMPILE": "0"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['run_cluster', 'run_pd', 'run_steps']"
    shares = warm_module.share(0, 2) + warm_module.share(1, 2)
    assert sorted(map(repr, shares)) == sorted(map(repr, warm_module.WARM_RUNS)) and warm_module.share(2, 3) == ()


def test_one_process_at_a_time_compiles_an_entry_point_the_others_wait_and_load(monkeypatch):
    """A process that finds another compiling the same entry point (its lock file held) waits for it."""
    import fcntl
    import threading
    import time

    def tiny_rule(x):
        return x + 1

    monkeypatch.setattr(jit, "_TWINS", {})
    twin = jit.compiled(tiny_rule)
    lock = jit.cache_folder() / f"{tiny_rule.__module__}.{tiny_rule.__qualname__}.lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as another process compiling it would
    answers = []
    caller = threading.Thread(target=lambda: answers.append(twin(41)))
    caller.start()
    time.sleep(2.0)  # a rule this small compiles in well under a second
    waited = not answers
    os.close(fd)
    caller.join(timeout=120)
    assert waited and answers == [42]


def test_the_compiled_code_folder_is_keyed_by_every_file_whose_values_it_compiles_in():
    """numba compiles a global's value into the code: every project module a rule module imports from
    (the state's slot layout, the policies' constants) must key the cache, or a changed slot would run
    with stale compiled code."""
    import ast
    import importlib

    keyed = set(jit.RULE_MODULES + jit.CONSTANT_MODULES)
    for name in jit.RULE_MODULES:
        tree = ast.parse(Path(importlib.import_module(name).__file__).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in (
                    "sim", "policies", "workloads", "calibrate"):
                assert node.module in keyed, f"{name} imports from {node.module}, which does not key the cache"


def test_numba_disabled_runs_the_compiled_path_interpreted_with_the_same_numbers(tmp_path):
    """NUMBA_DISABLE_JIT=1 (the GPU session runs so, to spend no device time compiling): numba hands back
    the plain functions, and a run that would call them compiled runs them as Python, to the same result."""
    import json
    import os
    import sys

    out = {}
    for name, env in (("disabled", {"NUMBA_DISABLE_JIT": "1"}), ("interpreted", {})):
        folder = tmp_path / name
        subprocess.run([sys.executable, "-m", "specbatch.commands.cli", "run", "--num-requests", "40", "--rate", "8",
                        "--jit", "on" if env else "off", "--records", "none", "--out", str(folder), "--quiet"],
                       check=True, env={**os.environ, **env, "SPECBATCH_BACKGROUND_COMPILE": "0"}, timeout=300)
        out[name] = json.loads((folder / "summary.json").read_text())["metrics"]
    assert out["disabled"] == out["interpreted"]
