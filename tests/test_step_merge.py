"""A round-robin cluster's steps merged while its replicas run (sim/serving/step_merge.py): the files and
summary of the merge after the run, the (start time, replica) order whatever the hand-overs, memory held to
a few blocks a replica, and a clean stop."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import jit, metrics
from sim.serving.records import STEP_DTYPE
from sim.serving.step_merge import REPLICA_FIELD, StepMerge
from specbatch.commands import outputs

from tests.test_steps_file import (SMALL, Spy, after_and_streamed, fill_the_disk, folder_bytes,
                                   interrupt_the_third_hand_over)

pytestmark = pytest.mark.skipif(not jit.numba_available(), reason="replicas run apart in compiled runs only")

def same(a, b) -> bool:
    """Equal, NaN included (a run without speculation has no acceptance rate)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


TIES = dict(workload__rate=float("inf"), workload__prompt_tokens="16", workload__output_tokens="8",
            policy__name="none")  # every replica's steps start at the same instants


def streams_as_merged_after(run_config, monkeypatch, tmp_path, config: dict, every: int) -> None:
    """The cluster's run streamed (keeping no steps, hand-overs of ``every``) writes the folder, summary and
    per-replica breakdown of the run that merges its steps after, and leaves no thread behind."""
    after, streamed, _ = after_and_streamed(run_config, monkeypatch, tmp_path, config, every, keep=False)
    assert list(after.step_columns)[-1] == REPLICA_FIELD
    assert same(streamed.summary, after.summary) and same(streamed.replicas, after.replicas)
    assert streamed.step_columns is None
    assert not [t for t in threading.enumerate() if t.name.startswith(("steps-file", "replica"))]


@pytest.mark.parametrize("every", [1, 7, 1 << 16])
@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("overrides", [{"engine__scheduler": "vllm-v1"}, {"engine__scheduler": "v0"}, TIES])
def test_a_clusters_streamed_steps_are_the_files_and_summary_of_the_merge_after(run_config, monkeypatch, tmp_path,
                                                                                  every, replicas, overrides):
    monkeypatch.delenv("SPECBATCH_THREADS", raising=False)
    streams_as_merged_after(run_config, monkeypatch, tmp_path, dict(SMALL, **overrides, cluster__replicas=replicas),
                            every)


@pytest.mark.parametrize("every", [1, 7, 1 << 16])
@pytest.mark.parametrize("router", ["least-requests", "least-tokens", "prefix-aware"])
@pytest.mark.parametrize("overrides", [{}, TIES])
def test_a_compiled_clusters_streamed_steps_are_the_files_and_summary_of_the_merge_after(
        run_config, monkeypatch, tmp_path, every, router, overrides):
    """A router that reads the replicas runs them in one compiled cluster, in one simulated time: the steps
    merge as they run there too, none waiting (one thread runs them all)."""
    streams_as_merged_after(run_config, monkeypatch, tmp_path,
                            dict(SMALL, **overrides, cluster__replicas=3, cluster__router=router,
                                 engine__scheduler="vllm-v1", engine__enable_prefix_caching=True), every)


def test_a_routed_cluster_in_simpy_keeps_its_steps(run_config, monkeypatch, tmp_path):
    """Behind a client's concurrency limit the replicas step in SimPy: the steps are merged after the run."""
    config = dict(SMALL, cluster__replicas=2, cluster__router="least-requests", workload__max_concurrency=4)
    after, _ = outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "after")), default_folder=False)
    spy = Spy(monkeypatch, 16)
    outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "later")), default_folder=False,
                          keep_steps=False)
    assert len(spy.files) == 1 and spy.files[0].streamed is None
    assert folder_bytes(tmp_path / "later")["steps.csv"] == folder_bytes(tmp_path / "after")["steps.csv"]


def test_a_cluster_that_writes_no_steps_totals_them_as_they_merge(run_config, monkeypatch, tmp_path):
    monkeypatch.delenv("SPECBATCH_THREADS", raising=False)
    monkeypatch.setattr(metrics, "STEP_BLOCK", 5)
    config = run_config(**SMALL, cluster__replicas=3, output__records="none", output__dir=str(tmp_path / "none"))
    kept, _ = outputs.run_to_folder(config, default_folder=False)
    merges = []
    make = StepMerge.__init__
    monkeypatch.setattr(StepMerge, "__init__", lambda self, *a: (merges.append(self), make(self, *a))[1])
    dropped, _ = outputs.run_to_folder(config, default_folder=False, keep_steps=False)
    assert len(merges) == 1 and merges[0].totals.steps == kept.summary["num_steps"]
    assert same(dropped.summary, kept.summary) and same(dropped.replicas, kept.replicas)


def test_replicas_run_fewer_at_once_than_there_are_keep_their_steps(run_config, monkeypatch, tmp_path):
    """Under ``SPECBATCH_THREADS`` below the replicas, some replica has not started while others run, so none
    could be merged: the steps are merged after the run, and the files are the same."""
    config = dict(SMALL, cluster__replicas=3)
    monkeypatch.setattr(metrics, "STEP_BLOCK", 16)  # the spy's blocks: the step totals are summed in them
    after, _ = outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "after")), default_folder=False)
    monkeypatch.setenv("SPECBATCH_THREADS", "2")
    spy = Spy(monkeypatch, 16)
    outputs.run_to_folder(run_config(**config, output__dir=str(tmp_path / "later")), default_folder=False,
                          keep_steps=False)
    assert len(spy.files) == 1 and spy.files[0].streamed is None
    assert folder_bytes(tmp_path / "later") == folder_bytes(tmp_path / "after")


def test_a_write_that_fails_fails_the_clusters_run_and_leaves_no_folder(run_config, monkeypatch, tmp_path):
    monkeypatch.delenv("SPECBATCH_THREADS", raising=False)
    Spy(monkeypatch, 8)
    fill_the_disk(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        outputs.run_to_folder(run_config(**SMALL, cluster__replicas=3, output__dir=str(tmp_path / "run")),
                              default_folder=False, keep_steps=False)
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith(("steps-file", "replica"))]


def test_an_interrupted_cluster_leaves_no_folder_and_no_thread(run_config, monkeypatch, tmp_path):
    """Ctrl-C while the replicas run apart and merge (here raised in a hand-over): replicas waiting on the
    merge stop waiting, the others stop at their next return, and the staged folder goes."""
    monkeypatch.delenv("SPECBATCH_THREADS", raising=False)
    Spy(monkeypatch, 8)
    interrupt_the_third_hand_over(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        outputs.run_to_folder(run_config(**SMALL, cluster__replicas=3, output__dir=str(tmp_path / "run")),
                              default_folder=False, keep_steps=False)
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith(("steps-file", "replica"))]


class Keep:
    """A sink that keeps no steps (as the merge requires) but copies what it is handed, for the test to read."""

    keeps, streamed = False, None

    def __init__(self) -> None:
        self.every, self.columns, self.got = metrics.STEP_BLOCK, None, []

    def start(self, columns):
        self.columns = columns

    def rows(self, steps, lo, hi):
        self.got.append(steps[lo:hi].copy())


def replica_steps(starts: list[float], replica: int) -> np.ndarray:
    steps = np.zeros(len(starts), STEP_DTYPE)
    steps["start_s"] = starts
    steps["end_s"] = np.asarray(starts) + 0.5
    steps["running"] = np.arange(len(starts)) + 1000 * replica  # which record it was, to check the order
    steps["phase"] = 1
    steps["k"] = replica
    return steps


@settings(max_examples=150, deadline=None)
@given(gaps=st.lists(st.lists(st.sampled_from([0.0, 0.0, 0.25, 1.0]), max_size=40), min_size=1, max_size=4),
       sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6), turns=st.randoms(use_true_random=False),
       block=st.sampled_from([1, 3, 8, 1 << 16]))
def test_merged_steps_come_in_start_then_replica_order_whatever_the_hand_overs(gaps, sizes, turns, block):
    """Replicas hand their records over in blocks of any size, in any interleaving; ties in start time
    (many here) go to the lower replica, a replica's own ties keep its order; the totals are those of the
    merged records in blocks of sim.metrics.STEP_BLOCK, as the merge after the run sums them."""
    saved = metrics.STEP_BLOCK
    metrics.STEP_BLOCK = block
    try:
        every = [replica_steps(list(np.cumsum(g)), index) for index, g in enumerate(gaps)]
        sink = Keep()
        merge = StepMerge(sink, len(every), list(STEP_DTYPE.names), threading.Event())
        merge.ahead = 1 << 30  # one thread here: no replica may wait
        handed = [0] * len(every)
        open_ = [index for index in range(len(every))]
        turn = 0
        while open_:
            index = turns.choice(open_)
            size = sizes[turn % len(sizes)]
            turn += 1
            lo = handed[index]
            hi = min(lo + size, every[index].shape[0])
            merge.take(index, every[index][lo:hi].copy())
            handed[index] = hi
            if hi == every[index].shape[0]:
                merge.finished(index)
                open_.remove(index)
        totals = merge.close()
        got = np.concatenate(sink.got) if sink.got else np.zeros(0, sink.got and sink.got[0].dtype)
        whole = np.concatenate(every)
        owner = np.concatenate([np.full(s.shape[0], i) for i, s in enumerate(every)])
        order = np.lexsort((owner, whole["start_s"]))
        assert sink.streamed == sink.columns == list(STEP_DTYPE.names) + [REPLICA_FIELD]
        assert got.shape[0] == whole.shape[0]
        if got.shape[0]:
            assert np.array_equal(got["running"], whole["running"][order])
            assert np.array_equal(got[REPLICA_FIELD], owner[order])
            assert all(part.shape[0] == block for part in sink.got[:-1])  # whole blocks but the last
        assert totals == metrics.step_totals({name: whole[name][order] for name in STEP_DTYPE.names})
    finally:
        metrics.STEP_BLOCK = saved


def test_a_replica_ahead_of_the_others_waits_for_them_and_a_stop_frees_it(monkeypatch):
    monkeypatch.setattr(metrics, "STEP_BLOCK", 4)
    stop = threading.Event()
    merge = StepMerge(Keep(), 2, list(STEP_DTYPE.names), stop)
    merge.ahead = 2  # blocks

    def run_ahead():
        for lo in range(0, 40, 4):
            merge.take(0, replica_steps([float(t) for t in range(lo, lo + 4)], 0))

    ahead = threading.Thread(target=run_ahead)
    ahead.start()
    waiting = lambda: sum(rows.shape[0] for rows in merge._waiting[0])  # noqa: E731
    deadline = time.monotonic() + 10
    while waiting() <= 2 * 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    ahead.join(0.2)
    assert ahead.is_alive()  # replica 1 has handed nothing over: replica 0's records wait, and so does it
    assert 2 * 4 < waiting() <= 3 * 4
    merge.take(1, replica_steps([100.0], 1))  # replica 1 is past all of them: they merge, and 0 goes on
    ahead.join(5)
    assert not ahead.is_alive()
    merge.take(0, replica_steps([101.0 + t for t in range(8)], 0))  # ahead of replica 1 again, to the limit
    late = threading.Thread(target=lambda: merge.take(0, replica_steps([200.0], 0)))
    late.start()
    late.join(0.3)
    assert late.is_alive()
    stop.set()  # a failure elsewhere, or Ctrl-C: nothing waits on
    late.join(5)
    assert not late.is_alive()


def test_the_merge_refuses_a_sink_that_keeps_steps():
    class Keeping(Keep):
        keeps = True

    with pytest.raises(ValueError, match="keeps no steps"):
        StepMerge(Keeping(), 2, list(STEP_DTYPE.names), threading.Event())
