"""Faults survived (docs/errors.md): Ctrl-C is one line and exit 130 with nothing half-written;
``kill -9`` at any moment leaves nothing a later run trips on (its staging is cleaned up, its
lock released) and takes a sweep's pool workers with it; two writers to one output are told
apart by a lock, the second refused before its work.

The kill moments are drawn from a seeded generator: the same moments every run, spread
over start-up, the simulation and the write.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.atomic_write import clean_stale, output_lock, staged_dir
from specbatch.commands.cli import main
from sim.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CLI = [sys.executable, "-m", "specbatch.commands.cli"]
MOMENTS = random.Random(14)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def scenario(tmp_path, synthetic_profile) -> list[str]:
    """A run of several seconds (long enough to be interrupted in the middle: 6,000 requests took
    3 s before the loop got faster and under 1 s after, when most signals landed after the work)."""
    return ["run", "--profile", str(synthetic_profile), "--num-requests", "60000", "--rate", "40",
            "--prompt-tokens", "64", "--output-tokens", "32", "--max-batch-size", "16"]


def _start(argv: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(CLI + argv, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_is_one_line_exit_130_and_writes_nothing(tmp_path, scenario):
    for moment in sorted(MOMENTS.uniform(0.8, 3.0) for _ in range(2)):
        process = _start(scenario + ["--out", "o", "--timeline", "t/trace.json"], tmp_path)
        time.sleep(moment)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        # (a run's own notes and warnings come before the interrupt: a cold compiled-code cache, when this
        # test runs before any other has compiled the engine, says it is compiling)
        lines = [line for line in err.splitlines() if not line.startswith(("warning: ", "note: "))]
        if process.returncode == 0:  # finished before the signal: nothing to check at this moment
            continue
        if process.returncode == -signal.SIGINT and not lines and "o/summary.json" in listing(tmp_path):
            continue  # the signal landed in interpreter teardown, after the whole run was written
        assert process.returncode == 130 and len(lines) == 1 and lines[0].startswith("interrupted"), err
        assert listing(tmp_path) == [], f"left behind at {moment:.2f} s: {listing(tmp_path)}"


def test_kill_9_at_any_moment_leaves_nothing_the_next_run_trips_on(tmp_path, scenario):
    for moment in sorted(MOMENTS.uniform(0.5, 4.0) for _ in range(3)):
        process = _start(scenario + ["--out", "o"], tmp_path)
        time.sleep(moment)
        process.kill()
        process.communicate(timeout=60)
    # Whatever was left (a staging folder, a lock file), the next run to the same folder works,
    # and leaves only its own whole output behind.
    done = subprocess.run(CLI + scenario + ["--out", "o"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert listing(tmp_path) == ["o", "o/config.toml", "o/requests.csv", "o/steps.csv", "o/summary.json"]


def test_staging_left_by_a_dead_writer_is_removed_by_the_next_write(tmp_path):
    dead = _dead_pid()
    out = tmp_path / "o"
    (tmp_path / f".o.{dead}.abc123").mkdir()
    (tmp_path / f".o.{dead}.abc123" / "requests.csv").write_text("half")
    (tmp_path / f".o.{dead}.x9y8.tmp").write_text("half")
    (tmp_path / f".o.{dead}.q1w2.old").mkdir()
    alive = tmp_path / f".o.{os.getppid()}.zz11"  # a live writer's staging stays
    alive.mkdir()
    other = tmp_path / ".other.123.tmp"  # not ours to judge
    other.write_text("")
    (tmp_path / ".o.lock").write_text(f"{dead}\n")  # a lock file its holder could not remove
    with staged_dir(out) as staging:
        (staging / "summary.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["o", alive.name, other.name])
    # A live pid's staging is removed too once it is older than a day (the pid was reused).
    os.utime(alive, (time.time() - 2 * 86400,) * 2)
    assert clean_stale(out) == [alive]


def test_a_second_writer_to_one_output_is_refused_before_its_work(tmp_path, capsys, synthetic_profile):
    out = tmp_path / "o"
    with output_lock(out):
        code = main(["run", "--profile", str(synthetic_profile), "--num-requests", "4", "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and "another specbatch process" in err and "--out" in err
        assert not out.exists()
    assert listing(tmp_path) == []  # the lock file goes with its holder
    assert main(["run", "--profile", str(synthetic_profile), "--num-requests", "4", "--out", str(out)]) == 0


def test_a_lock_dies_with_its_holder_even_by_kill_9(tmp_path):
    out = tmp_path / "o"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from sim.atomic_write import output_lock\n"
                               f"with output_lock({str(out)!r}):\n    print('held', flush=True); time.sleep(60)"],
                              env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(InputError, match=f"pid {holder.pid}"):
        with output_lock(out):
            pass
    holder.kill()
    holder.wait()
    with output_lock(out):  # free again: the kernel released the flock
        pass


def test_replacing_one_folder_from_many_writers_never_raises_and_leaves_one_whole(tmp_path):
    out, errors = tmp_path / "o", []

    def write(n: int) -> None:
        try:
            for _ in range(15):
                with staged_dir(out) as staging:
                    for name in ("a", "b", "c"):
                        (staging / name).write_text(str(n))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    assert len({(out / name).read_text() for name in ("a", "b", "c")}) == 1  # one writer's whole folder


def test_a_killed_sweep_takes_its_workers_along_and_resumes(tmp_path, synthetic_profile):
    # Cells of several seconds' work between them: with 1,500 requests a cell, the faster loop
    # finished the whole sweep in the 0.5-2 s before the kill now and then, and with 15,000 the
    # compiled cells did too (6 cells in 0.9 s wall, in the full suite with its cache warm).
    (tmp_path / "base.toml").write_text(f'profile = "{synthetic_profile}"\n[workload]\nnum_requests = 150000\n'
                                        "prompt_tokens = 64\noutput_tokens = 32\n[engine]\nmax_batch_size = 16\n")
    (tmp_path / "s.toml").write_text('base = "base.toml"\n[axes]\nseed = [1, 2, 3, 4, 5, 6]\n')
    argv = ["sweep", "s.toml", "--out", "s", "--workers", "2", "--no-progress"]
    process = _start(argv, tmp_path)
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while time.monotonic() < deadline and len(workers) < 2:
        time.sleep(0.2)
        workers = _descendants(process.pid)
    time.sleep(MOMENTS.uniform(0.5, 2.0))
    workers = _descendants(process.pid)
    assert workers, "the pool never started"
    process.kill()
    process.wait(timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [pid for pid in workers if _running(pid)]:
        time.sleep(0.2)
    left = {pid: (Path("/proc") / str(pid) / "cmdline").read_text()[:120] for pid in workers if _running(pid)}
    assert left == {}, "pool workers outlived the sweep"
    process.communicate(timeout=60)
    done = subprocess.run(CLI + argv, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "6 cells" in done.stdout and (tmp_path / "s" / "sweep.parquet").is_file()


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid
