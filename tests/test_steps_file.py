"""steps.csv written while the engine runs (specbatch/commands/outputs.py ``StepsFile``): the same bytes as
written after the run, and the same summary whether the run keeps its steps or only their totals; every
record handed over once and in order; nothing left behind when a run fails."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import jit, metrics
from sim.scheduler.layout import C_REC_END, C_REC_POS, N_COUNTERS
from sim.serving import compiled
from sim.serving.records import RECORD_ROOM, STEP_DTYPE, Buffers
from specbatch.commands import outputs

pytestmark = pytest.mark.skipif(not jit.numba_available(), reason="the steps file streams from compiled runs only")

SMALL = dict(workload__num_requests=300, workload__rate=12.0, workload__prompt_tokens="uniform:16:256",
             workload__output_tokens="uniform:1:64", engine__max_batch_size=8, engine__jit="on")


class Spy:
    """Records what the run's steps files did."""

    def __init__(self, monkeypatch, every: int) -> None:
        self.files = []
        make = outputs.StepsFile.for_run.__func__
        monkeypatch.setattr(outputs, "STREAM_MIN_REQUESTS", 0)
        monkeypatch.setattr(outputs, "MERGE_MIN_REQUESTS", 0)
        monkeypatch.setattr(jit, "is_warm", lambda: True)  # the formatter compiles here if it must
        monkeypatch.setattr(outputs.StepsFile, "every", every)
        monkeypatch.setattr(outputs.StepsFile, "requests_every", every)  # requests.csv in as small slices
        monkeypatch.setattr(metrics, "STEP_BLOCK", every)  # a sink that keeps no steps takes blocks of it
        monkeypatch.setattr(compiled, "RECORD_ROOM", min(RECORD_ROOM, every))  # hand-overs every `every` records
        monkeypatch.setattr(outputs.StepsFile, "for_run",
                            classmethod(lambda cls, run, staging, keep=True: self.files.append(
                                make(cls, run, staging, keep)) or self.files[-1]))


def folder_bytes(folder) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.name != "config.toml"}


def after_and_streamed(run_config, monkeypatch, tmp_path, config: dict, every: int, keep: bool):
    """The run with its steps written after it, then streamed (hand-overs of ``every``, the totals' blocks
    too): both results and the steps file, checked to have streamed every column into the same files."""
    monkeypatch.setattr(metrics, "STEP_BLOCK", every)
    after, _ = outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "after")), default_folder=False)
    spy = Spy(monkeypatch, every)
    streamed, _ = outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "streamed")),
                                        default_folder=False, keep_steps=keep)
    assert len(spy.files) == 1 and spy.files[0].streamed == list(after.step_columns)
    assert folder_bytes(tmp_path / "streamed") == folder_bytes(tmp_path / "after")
    return after, streamed, spy.files[0]


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("every", [1, 7, 4096, 1 << 16])
@pytest.mark.parametrize("scheduler", ["vllm-v1", "v0"])
def test_a_streamed_steps_file_is_the_file_written_after_the_run(run_config, monkeypatch, tmp_path, every, scheduler,
                                                                  keep):
    """The same files, summary.json included, whether the run keeps its steps or only their totals (summed in
    the same blocks either way: the blocks are ``every`` here)."""
    config = dict(SMALL, engine__scheduler=scheduler)
    after, streamed, file = after_and_streamed(run_config, monkeypatch, tmp_path, config, every, keep)
    assert file.requests_streamed > 0 or every > 7  # 300 requests: in slices of `every` as they finish
    assert streamed.summary == after.summary
    if keep:
        assert all(np.array_equal(streamed.step_columns[name], after.step_columns[name])
                   for name in after.step_columns)
    else:
        assert streamed.step_columns is None
        with pytest.raises(ValueError, match="kept no steps in memory"):
            streamed.steps
    assert not [t for t in threading.enumerate() if t.name.startswith("steps-file")]


def test_requests_written_as_they_finish_carry_the_frontends_latency(run_config, monkeypatch, tmp_path,
                                                                     synthetic_profile):
    """A profile's request latency moves every first token and finish after the run; the rows of requests.csv
    written while the engine ran carry it too."""
    import json
    import shutil

    profile = tmp_path / "late"
    shutil.copytree(synthetic_profile, profile)
    meta = json.loads((profile / "profile.json").read_text())
    meta.setdefault("engine_overhead", {})["request_latency_s"] = 0.0123
    (profile / "profile.json").write_text(json.dumps(meta))
    config = dict(SMALL, profile=str(profile))
    outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "after")), default_folder=False)
    spy = Spy(monkeypatch, 7)  # hand-overs every 7 steps, requests.csv's rows 7 or more at a time
    monkeypatch.setattr(metrics, "STEP_BLOCK", 1 << 16)  # the totals' blocks as after the run (the steps are kept)
    outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "streamed")), default_folder=False)
    assert spy.files[0].requests_streamed > 0
    assert folder_bytes(tmp_path / "streamed") == folder_bytes(tmp_path / "after")
    late = (tmp_path / "after" / "requests.csv").read_text().splitlines()
    assert float(late[1].split(",")[6]) > 0.0123  # first_token_s, frontend latency included


def test_labelled_requests_are_written_after_the_run(run_config, monkeypatch, tmp_path):
    """A trace's labels are text, which the compiled rows do not print: requests.csv waits for the run's end."""
    rng = np.random.default_rng(3)
    rows = ["arrival_s,prompt_tokens,output_tokens,label"] + [
        f"{t:.4f},{p},{o},{'chat' if i % 3 else 'code'}" for i, (t, p, o) in
        enumerate(zip(np.cumsum(rng.exponential(0.08, 300)), rng.integers(16, 256, 300), rng.integers(1, 64, 300)))]
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    config = dict(SMALL, workload__trace=str(trace))
    monkeypatch.setattr(metrics, "STEP_BLOCK", 7)
    outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "after")), default_folder=False)
    spy = Spy(monkeypatch, 7)
    outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "streamed")), default_folder=False,
                          keep_steps=False)
    assert spy.files[0].streamed is not None and spy.files[0].requests_streamed == 0
    assert folder_bytes(tmp_path / "streamed") == folder_bytes(tmp_path / "after")
    assert b",code" in folder_bytes(tmp_path / "after")["requests.csv"]


def test_requests_csv_is_finished_while_the_steps_file_still_writes(run_config, monkeypatch, tmp_path):
    """After the run, the rest of requests.csv is written beside the steps file's last writes, not after them:
    those writes are held here until requests.csv is whole (were it waiting for them, they would run first)."""
    from sim.serving.records import Buffers

    outputs.run_to_folder(run_config(**SMALL, output__dir=str(tmp_path / "after")), default_folder=False)
    spy = Spy(monkeypatch, 7)
    # requests.csv's rows a request at a time: the run's last requests finish after its last hand-over, and
    # were their rows queued as it ends (behind its last steps), requests.csv would wait for those steps
    monkeypatch.setattr(outputs.StepsFile, "requests_every", 1)
    ended, whole, order, last = threading.Event(), threading.Event(), [], set()
    flush, queue = Buffers.flush, outputs.StepsFile._queue
    write, finish = outputs.StepsFile._write, outputs.StepsFile.finish_requests
    monkeypatch.setattr(Buffers, "flush", lambda self: (ended.set(), flush(self))[1])

    def queued(self, write, arrays, count):
        if ended.is_set():  # the run's last rows, handed over as it ends
            last.add(id(arrays))
        return queue(self, write, arrays, count)

    def held_write(self, arrays, count):
        if id(arrays) in last:
            whole.wait(10)
            order.append("steps")
        write(self, arrays, count)

    def finished(self, columns):
        done = finish(self, columns)
        order.append("requests")
        whole.set()
        return done

    monkeypatch.setattr(outputs.StepsFile, "_queue", queued)
    monkeypatch.setattr(outputs.StepsFile, "_write", held_write)
    monkeypatch.setattr(outputs.StepsFile, "finish_requests", finished)
    outputs.run_to_folder(run_config(**SMALL, output__dir=str(tmp_path / "streamed")), default_folder=False,
                          keep_steps=False)
    assert spy.files[0].requests_streamed > 0 and order[0] == "requests" and "steps" in order
    assert folder_bytes(tmp_path / "streamed") == folder_bytes(tmp_path / "after")


def test_the_two_tables_are_written_at_once(run_config, monkeypatch, tmp_path):
    """A run that did not stream writes requests.csv on a thread of its own while steps.csv is written."""
    threads = {}
    write_table = outputs.write_table

    def noted(columns, path, *args, **kwargs):
        threads[path.name] = threading.current_thread().name
        write_table(columns, path, *args, **kwargs)

    monkeypatch.setattr(outputs, "write_table", noted)
    outputs.run_to_folder(run_config(**{**SMALL, "engine__jit": "off"}, output__dir=str(tmp_path / "run")),
                          default_folder=False)
    assert threads["steps.csv"] == threading.current_thread().name
    assert threads["requests.csv"].startswith("requests-file")
    assert not [t for t in threading.enumerate() if t.name.startswith("requests-file")]


def test_a_requests_table_that_fails_fails_the_run_and_leaves_no_folder(run_config, monkeypatch, tmp_path):
    write_table = outputs.write_table

    def full_disk(columns, path, *args, **kwargs):
        if path.name.startswith("requests"):
            raise OSError(28, "No space left on device")
        write_table(columns, path, *args, **kwargs)

    monkeypatch.setattr(outputs, "write_table", full_disk)
    with pytest.raises(OSError, match="No space left"):
        outputs.run_to_folder(run_config(**{**SMALL, "engine__jit": "off"}, output__dir=str(tmp_path / "run")),
                              default_folder=False)
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_the_tables_are_written_leaves_no_folder_and_no_thread(run_config, monkeypatch, tmp_path):
    """Ctrl-C as steps.csv is written, requests.csv half written on its thread: the thread ends its table
    before the staging folder goes, so nothing is left (and no file is written into a removed folder)."""
    write_table = outputs.write_table
    writing, interrupted = threading.Event(), threading.Event()

    def tables(columns, path, *args, **kwargs):
        if path.name.startswith("requests"):
            writing.set()
            interrupted.wait(10)  # still writing as the interrupt arrives
            write_table(columns, path, *args, **kwargs)
            return
        writing.wait(10)
        interrupted.set()
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs, "write_table", tables)
    with pytest.raises(KeyboardInterrupt):
        outputs.run_to_folder(run_config(**{**SMALL, "engine__jit": "off"}, output__dir=str(tmp_path / "run")),
                              default_folder=False)
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("requests-file")]


def test_specbatch_run_keeps_no_steps_unless_a_result_file_reads_them(monkeypatch, tmp_path, synthetic_profile):
    from specbatch.commands.cli import main

    kept = []
    run = outputs.run_to_folder
    monkeypatch.setattr(outputs, "run_to_folder", lambda *a, **k: (kept.append(k["keep_steps"]), run(*a, **k))[1])
    common = ["run", "--profile", str(synthetic_profile), "--num-requests", "20", "--quiet"]
    assert main(common + ["--out", str(tmp_path / "a")]) == 0
    assert main(common + ["--out", str(tmp_path / "b"), "--save-result",
                          "--result-filename", str(tmp_path / "bench.json")]) == 0
    assert kept == [False, True]


@pytest.mark.parametrize("overrides", [
    {"engine__jit": "off"},  # stepped in Python: nothing to overlap
    {"cluster__replicas": 2},  # the cluster's steps are merged after the run
    {"output__records": "parquet"},
    {"policy__name": "adaptive"},  # a policy stepped in Python
])
def test_runs_that_cannot_stream_write_their_steps_after(run_config, monkeypatch, tmp_path, overrides):
    spy = Spy(monkeypatch, 16)
    result, folder = outputs.run_to_folder(run_config(**{**SMALL, **overrides}, output__dir=str(tmp_path / "run")),
                                           default_folder=False)
    assert all(f is None or f.streamed is None for f in spy.files)
    name = "steps.parquet" if overrides.get("output__records") == "parquet" else "steps.csv"
    assert (folder / name).is_file()


def test_a_cluster_merges_as_it_runs_from_longer_runs_than_one_replica_streams(run_config, monkeypatch, tmp_path):
    """One replica streams from STREAM_MIN_REQUESTS requests; a cluster's merge, which keeps a thread for
    each replica, from MERGE_MIN_REQUESTS."""
    from sim.simulate import prepare

    monkeypatch.setattr(jit, "is_warm", lambda: True)
    monkeypatch.setattr(outputs, "STREAM_MIN_REQUESTS", 300)
    monkeypatch.setattr(outputs, "MERGE_MIN_REQUESTS", 301)
    made = {}
    for replicas in (1, 2):
        file = outputs.StepsFile.for_run(prepare(run_config(**SMALL, cluster__replicas=replicas)), tmp_path,
                                         keep_steps=False)
        made[replicas] = file is not None
        if file is not None:
            file.close()
    assert made == {1: True, 2: False}


def fill_the_disk(monkeypatch) -> None:
    """Every write of the steps file fails as a full disk does."""
    def full_disk(self, arrays, count):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs.StepsFile, "_write", full_disk)


def interrupt_the_third_hand_over(monkeypatch) -> None:
    """Ctrl-C arrives as the steps file is handed its third block (of about 190 at blocks of 8)."""
    handed = []
    rows = outputs.StepsFile.rows

    def interrupted(self, steps, lo, hi):
        rows(self, steps, lo, hi)
        handed.append(hi)
        if len(handed) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(outputs.StepsFile, "rows", interrupted)


def test_a_write_that_fails_fails_the_run_and_leaves_no_folder(run_config, monkeypatch, tmp_path):
    Spy(monkeypatch, 8)
    fill_the_disk(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        outputs.run_to_folder(run_config(**SMALL, output__dir=str(tmp_path / "run")), default_folder=False)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging


def test_an_interrupted_run_leaves_no_folder_and_stops_writing(run_config, monkeypatch, tmp_path):
    Spy(monkeypatch, 8)
    interrupt_the_third_hand_over(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        outputs.run_to_folder(run_config(**SMALL, output__dir=str(tmp_path / "run")), default_folder=False)
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("steps-file")]


class Collect:
    """A sink that keeps what it is handed."""

    def __init__(self, every: int, keeps: bool = True) -> None:
        self.every, self.keeps, self.streamed, self.got = every, keeps, None, []

    def start(self, columns):
        pass

    def rows(self, steps, lo, hi):
        self.got.append(steps[lo:hi].copy())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(every=st.integers(1, 50), writes=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 60)), max_size=30),
       before=st.integers(0, 20), keeps=st.booleans())
def test_buffers_hand_every_record_over_once_in_order(every, writes, before, keeps):
    """Whatever the run writes between returns (never past the records' end it was given), the sink gets
    every record once, in order, in blocks of ``every`` from the first (but the last); the buffers keep them
    all, or (a sink that keeps none) their totals, summed block by block as the whole run's would be."""
    ctr = np.zeros(N_COUNTERS, dtype=np.int64)
    buffers = Buffers(ctr, capacity=4)
    written = 0
    rng = np.random.default_rng(every + 100 * len(writes))
    largest = 0

    def write(count: int) -> None:
        nonlocal written, largest
        for _ in range(count):
            assert ctr[C_REC_POS] < ctr[C_REC_END]  # the end the run was given is room it has
            rec = buffers.steps[ctr[C_REC_POS]]
            for name in STEP_DTYPE.names:
                rec[name] = rng.integers(0, 3) if name == "phase" else rng.integers(0, 9)
            rec["start_s"] = written
            rec["end_s"] = written + (1e12 if rng.random() < 0.2 else 1e-3 * rng.random())  # another grouping rounds otherwise
            ctr[C_REC_POS] += 1
            written += 1
        largest = max(largest, buffers.steps.shape[0])

    buffers.room(before, 0)
    write(before)
    sink = Collect(every, keeps)
    metrics_block = metrics.STEP_BLOCK
    metrics.STEP_BLOCK = every
    try:
        buffers.stream_to(sink)
        for wanted, count in writes:
            buffers.room(wanted, 0)
            write(min(count, int(ctr[C_REC_END] - ctr[C_REC_POS])))  # a compiled run stops at the end it was given
        buffers.flush()
        got = np.concatenate(sink.got) if sink.got else np.zeros(0, STEP_DTYPE)
        assert np.array_equal(got["start_s"], np.arange(written, dtype=np.float64))
        assert all(len(part) == every for part in sink.got[:-1]) and all(len(part) <= every for part in sink.got)
        assert len(buffers) == written and buffers.sink is None and ctr[C_REC_END] == buffers.steps.shape[0]
        if keeps:
            assert buffers.steps[:written].tobytes() == got.tobytes()
        else:
            whole = {name: got[name] for name in STEP_DTYPE.names}
            assert buffers.totals == metrics.step_totals(whole)
            assert ctr[C_REC_POS] == 0
            assert largest <= 4 * (every + 60 + 20)  # a block and a run's room, doubled: not the whole run
    finally:
        metrics.STEP_BLOCK = metrics_block


def test_a_run_that_outpaces_its_writer_waits_for_it(monkeypatch, tmp_path):
    """At most ``queued`` blocks wait for the writer: the run's memory stays bounded however slow the disk."""
    gate = threading.Event()
    started = []
    file = outputs.StepsFile(tmp_path / "steps.csv")
    monkeypatch.setattr(file, "_write", lambda arrays, count: (started.append(count), gate.wait(10)))
    file.start(["start_s"])
    steps = np.zeros(100, STEP_DTYPE)
    waited = threading.Thread(target=lambda: [file.rows(steps, i, i + 1) for i in range(file.queued + 3)])
    waited.start()
    for _ in range(1000):  # until the run has queued all it may (however slow the machine)
        if len(file._pending) == file.queued:
            break
        time.sleep(0.01)
    waited.join(0.2)
    assert waited.is_alive() and len(file._pending) == file.queued  # the run waits on the writer
    gate.set()
    waited.join(10)
    assert not waited.is_alive() and file.holds(None) is False  # (no run said it streamed)
    file.close()


def test_a_compiled_run_returns_to_hand_records_over():
    """The records' end is set at the next hand-over, never below the room asked for."""
    ctr = np.zeros(N_COUNTERS, dtype=np.int64)
    buffers = Buffers(ctr)
    buffers.stream_to(Collect(100))
    buffers.room(RECORD_ROOM, 0)
    assert ctr[C_REC_END] == RECORD_ROOM  # room asked for beats a hand-over due sooner
    buffers.flush()
    buffers.stream_to(Collect(1 << 20))
    buffers.room(RECORD_ROOM, 0)
    assert ctr[C_REC_END] == buffers.steps.shape[0]  # a hand-over due later than the buffer's end: the end


@pytest.mark.parametrize("block", [5, 1 << 16])
def test_a_run_that_writes_no_steps_keeps_only_their_totals(run_config, monkeypatch, tmp_path, block):
    """``specbatch run --records none`` (and a sweep's cell) totals the steps a block at a time and keeps none:
    the summary is a kept run's."""
    from sim.serving import records as step_records
    from sim.simulate import execute, prepare

    monkeypatch.setattr(metrics, "STEP_BLOCK", block)
    config = run_config(**SMALL, output__records="none", output__dir=str(tmp_path / "none"))
    kept, _ = outputs.run_to_folder(config, default_folder=False)
    handed = []
    monkeypatch.setattr(step_records.TotalsOnly, "rows", lambda self, steps, lo, hi: handed.append(hi - lo))
    dropped, _ = outputs.run_to_folder(config, default_folder=False, keep_steps=False)
    assert kept.step_columns is not None and dropped.step_columns is None
    assert dropped.summary == kept.summary and len(handed) > (1 if block == 5 else 0)
    assert execute(prepare(config), steps_sink=step_records.TotalsOnly()).summary == kept.summary
