"""specbatch run --timeline: a valid Chrome trace whose events are the run's records."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from specbatch.commands.cli import main
from tests.conftest import CPU_DEFAULT_FLAGS

REQUIRED = {"X": {"ts", "dur", "pid", "tid", "name"}, "C": {"ts", "pid", "name", "args"},
            "b": {"ts", "pid", "tid", "name", "cat", "id"}, "e": {"ts", "pid", "tid", "name", "cat", "id"},
            "M": {"pid", "name", "args"}}


def run_with_timeline(tmp_path, profile, *flags: str):
    out, trace = tmp_path / "run", tmp_path / "trace" / "timeline.json"
    code = main(["run", "--profile", str(profile), "--num-requests", "60", "--rate", "8",
                 "--output-tokens", "uniform:1:40", "--timeline", str(trace), "--out", str(out), *flags])
    assert code == 0
    document = json.loads(trace.read_text())
    return document, pd.read_csv(out / "requests.csv"), pd.read_csv(out / "steps.csv")


def check_schema(events: list[dict]) -> None:
    for event in events:
        assert REQUIRED[event["ph"]] <= event.keys(), event
        if event["ph"] == "X":
            assert event["dur"] > 0
        if event["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in event["args"].values())
    # Async spans balance and nest per (cat, id): every end closes the latest open span of its name.
    open_spans: dict = defaultdict(list)
    for event in (e for e in events if e["ph"] in "be"):
        stack = open_spans[(event["cat"], event["id"])]
        if event["ph"] == "b":
            stack.append((event["name"], event["ts"]))
        else:
            name, ts = stack.pop()
            assert name == event["name"] and event["ts"] >= ts
    assert not any(open_spans.values())


@pytest.mark.parametrize("replicas", ["1", "3"])
def test_timeline_events_are_the_runs_steps_and_requests(capsys, tmp_path, synthetic_profile, replicas):
    document, requests, steps = run_with_timeline(tmp_path, synthetic_profile, "--replicas", replicas,
                                                  "--router", "least-tokens")
    events = document["traceEvents"]
    check_schema(events)
    assert document["otherData"]["replicas"] == int(replicas)
    replica_of_step = steps.replica if "replica" in steps else pd.Series(0, index=steps.index)
    replica_of_request = requests.replica if "replica" in requests else pd.Series(0, index=requests.index)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"replica {r}" for r in range(int(replicas))}
    # One complete event per row of steps.csv, in order, with the row's values.
    xs = [e for e in events if e["ph"] == "X"]
    assert len(xs) == len(steps)
    assert np.allclose([e["ts"] for e in xs], steps.start_s * 1e6, rtol=1e-8, atol=1e-3)
    assert np.allclose([e["ts"] + e["dur"] for e in xs], steps.end_s * 1e6, rtol=1e-8, atol=1e-3)
    assert [e["name"] for e in xs] == [("prefill", "decode", "mixed")[p] for p in steps.phase]
    assert [e["pid"] for e in xs] == replica_of_step.tolist()
    for field in ("batch_size", "running", "k", "drafted_tokens", "accepted_tokens", "emitted_tokens"):
        assert [e["args"][field] for e in xs] == steps[field].tolist(), field
    # Counter tracks: k at every decode step; running at every step.
    assert sum(e["ph"] == "C" and e["name"] == "k" for e in events) == int((steps.phase > 0).sum())
    # One request span per row of requests.csv, with nested queued/prefill/decode phases.
    spans = defaultdict(dict)
    for e in events:
        if e["ph"] in "be":
            spans[e["id"]][(e["name"].split()[0], e["ph"])] = (e["ts"], e["pid"])
    assert sorted(spans) == requests.request_id.tolist()
    for row, replica in zip(requests.itertuples(), replica_of_request):
        s = spans[row.request_id]
        for (name, ph), column in ((("request", "b"), "arrival_s"), (("request", "e"), "finish_s"),
                                   (("queued", "e"), "scheduled_s"), (("prefill", "e"), "first_token_s")):
            ts, pid = s[(name, ph)]
            assert ts == pytest.approx(getattr(row, column) * 1e6, rel=1e-8, abs=1e-3) and pid == replica
        assert (("decode", "b") in s) == (row.output_tokens > 1)


def test_a_window_keeps_the_steps_and_requests_overlapping_it(capsys, tmp_path, synthetic_profile):
    document, requests, steps = run_with_timeline(tmp_path, synthetic_profile, "--timeline-window", "2:4")
    events = document["traceEvents"]
    check_schema(events)
    assert document["otherData"]["window_s"] == [2.0, 4.0]
    inside = (steps.end_s >= 2) & (steps.start_s < 4)
    xs = [e for e in events if e["ph"] == "X"]
    assert 0 < len(xs) == int(inside.sum()) < len(steps)
    assert np.allclose([e["ts"] for e in xs], steps.start_s[inside] * 1e6)
    ids = {e["id"] for e in events if e["ph"] == "b"}
    assert ids == set(requests.request_id[(requests.finish_s >= 2) & (requests.arrival_s < 4)])


def test_same_run_gives_the_same_timeline_bytes(capsys, tmp_path, synthetic_profile):
    for name in ("a", "b"):
        run_with_timeline(tmp_path / name, synthetic_profile, "--replicas", "2")
    assert (tmp_path / "a" / "trace" / "timeline.json").read_bytes() == \
        (tmp_path / "b" / "trace" / "timeline.json").read_bytes()


def test_an_unwritable_timeline_is_one_line_and_writes_nothing(capsys, tmp_path, synthetic_profile):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out = tmp_path / "run"
    code = main(["run", "--profile", str(synthetic_profile), *CPU_DEFAULT_FLAGS, "--num-requests", "10",
                 "--timeline", str(blocker / "t.json"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "cannot write the timeline" in err and "output.timeline" in err and "is a file, not a folder" in err
    assert not out.exists() and list(tmp_path.iterdir()) == [blocker]


def test_a_failed_run_folder_leaves_no_timeline(capsys, tmp_path, synthetic_profile):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "precious.txt").write_text("not a run")
    trace = tmp_path / "t.json"
    code = main(["run", "--profile", str(synthetic_profile), "--num-requests", "10", "--timeline", str(trace),
                 "--out", str(taken)])
    assert code == 2 and "refusing to replace it" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


@pytest.mark.parametrize("window,needle", [("5:2", "needs 0 <= START < END"), ("abc", "is not START:END")])
def test_a_bad_window_is_one_line(capsys, tmp_path, synthetic_profile, window, needle):
    code = main(["run", "--profile", str(synthetic_profile), "--num-requests", "10", "--timeline",
                 str(tmp_path / "t.json"), "--timeline-window", window, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "output.timeline_window" in err
    assert list(tmp_path.iterdir()) == []


def test_a_window_without_a_timeline_is_refused(capsys, tmp_path, synthetic_profile):
    code = main(["run", "--profile", str(synthetic_profile), "--num-requests", "10", "--timeline-window", "1:2",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "--timeline-window: output.timeline_window: applies only to a timeline" in err
    assert list(tmp_path.iterdir()) == []
