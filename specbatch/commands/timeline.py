"""The simulated timeline as a Chrome trace-event file (JSON), for Perfetto or chrome://tracing.

One process per replica (pid = replica index). Its thread 0 holds the engine steps
as complete events ("X", named prefill or decode, with the step's record as args),
and counter tracks ("C") follow its running batch size (0 while idle) and the k of
each decode step. A decode step's args carry the policy's reasoning under ``policy`` when the
policy gives one (recorded only for runs whose timeline is asked for: ``policies.explain``):
goodput each candidate k's expected tokens/s, the table and engine policies the row or rule
used. Each request is a nestable async span ("b"/"e", cat "request",
id = request id) from arrival to finish, with nested spans queued (arrival to
scheduled), prefill (scheduled to first token) and decode (first token to finish).
Timestamps are microseconds of simulated time.

Events are written one per line, streamed, into a temporary file beside the target
and renamed into place. A window keeps the steps and requests that overlap it,
whole (not clipped), so every step event is one row of steps.csv and every request
span one row of requests.csv.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np

import sim
from sim.atomic_write import commit, new_staging_file
from sim.errors import InputError
from sim.lazy import lazy_module

pd = lazy_module("pandas")  # only when the command runs: building the CLI's parser imports this module

US = 1e6  # trace timestamps are microseconds
STEP_ARGS = ("batch_size", "running", "k", "drafted_tokens", "accepted_tokens", "emitted_tokens")
PHASE_NAMES = ("prefill", "decode", "mixed")


def trace_events(requests: pd.DataFrame, steps: pd.DataFrame,
                 window: tuple[float, float] | None = None, reasons: list[dict] | None = None) -> Iterator[dict]:
    """Every event of the trace, metadata first, then steps and counters, then requests.

    ``reasons``: per replica, its decode step index -> the policy's reason (``RunResult.reasons``)."""
    replicas = _replica_column(steps)
    requests_replica = _replica_column(requests)
    for pid in range(int(replicas.max(initial=0)) + 1):
        yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"replica {pid}"}}
        yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "engine steps"}}
    keep = _overlapping(steps.start_s.to_numpy(), steps.end_s.to_numpy(), window)
    why = _step_reasons(replicas, reasons)
    yield from _step_events(steps[keep], replicas[keep], _idle_after(steps, replicas)[keep],
                            None if why is None else [why[i] for i in np.flatnonzero(keep)])
    keep = _overlapping(requests.arrival_s.to_numpy(), requests.finish_s.to_numpy(), window)
    yield from _request_events(requests[keep], requests_replica[keep])


def _replica_column(frame: pd.DataFrame) -> np.ndarray:
    if "replica" in frame:
        return frame["replica"].to_numpy(dtype=np.int64)
    return np.zeros(len(frame), dtype=np.int64)


def _overlapping(start: np.ndarray, end: np.ndarray, window: tuple[float, float] | None) -> np.ndarray:
    if window is None:
        return np.ones(start.shape[0], dtype=bool)
    return (end >= window[0]) & (start < window[1])


def _idle_after(steps: pd.DataFrame, replicas: np.ndarray) -> np.ndarray:
    """True where a replica's step is followed by a gap (or nothing): its batch is empty then."""
    idle = np.ones(len(steps), dtype=bool)
    start, end = steps.start_s.to_numpy(), steps.end_s.to_numpy()
    for pid in np.unique(replicas):
        rows = np.flatnonzero(replicas == pid)  # this replica's steps, in time order
        idle[rows[:-1]] = start[rows[1:]] > end[rows[:-1]]
    return idle


def _step_reasons(replicas: np.ndarray, reasons: list[dict] | None) -> list | None:
    """Each step row's reason (or None). A replica's steps keep their order in the merged table, so
    its j-th row is the step its policy saw as index j."""
    if not reasons or not any(reasons):
        return None
    out: list = [None] * replicas.shape[0]
    for pid, by_step in enumerate(reasons):
        for j, row in enumerate(np.flatnonzero(replicas == pid).tolist()):
            out[row] = by_step.get(j)
    return out


def _step_events(steps: pd.DataFrame, replicas: np.ndarray, idle_after: np.ndarray,
                 reasons: list | None = None) -> Iterator[dict]:
    columns = {name: steps[name].to_numpy().tolist() for name in ("start_s", "end_s", "phase", "mean_context_tokens",
                                                                   *STEP_ARGS)}
    for i, (pid, idle) in enumerate(zip(replicas.tolist(), idle_after.tolist())):
        start, end, phase = columns["start_s"][i], columns["end_s"][i], columns["phase"][i]
        args = {name: columns[name][i] for name in STEP_ARGS}
        args["mean_context_tokens"] = columns["mean_context_tokens"][i]
        if reasons is not None and reasons[i] is not None:
            args["policy"] = reasons[i]
        ts = start * US
        yield {"ph": "X", "name": PHASE_NAMES[phase], "cat": "step", "pid": pid, "tid": 0, "ts": ts,
               "dur": end * US - ts, "args": args}
        yield {"ph": "C", "name": "running", "pid": pid, "tid": 0, "ts": ts, "args": {"running": args["running"]}}
        if phase:  # a decode (or vllm-v1 mixed) step
            yield {"ph": "C", "name": "k", "pid": pid, "tid": 0, "ts": ts, "args": {"k": args["k"]}}
        if idle:
            yield {"ph": "C", "name": "running", "pid": pid, "tid": 0, "ts": end * US, "args": {"running": 0}}


def _request_events(requests: pd.DataFrame, replicas: np.ndarray) -> Iterator[dict]:
    cols = {name: requests[name].to_numpy().tolist() for name in (
        "request_id", "arrival_s", "scheduled_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
        "alpha", "drafted_tokens", "accepted_tokens")}
    for i, pid in enumerate(replicas.tolist()):
        rid = cols["request_id"][i]
        name = f"request {rid}"
        common = {"cat": "request", "id": rid, "pid": pid, "tid": 0}
        arrival, scheduled, first, finish = (cols[c][i] * US for c in ("arrival_s", "scheduled_s", "first_token_s",
                                                                       "finish_s"))
        args = {c: cols[c][i] for c in ("prompt_tokens", "output_tokens", "alpha", "drafted_tokens",
                                        "accepted_tokens")}
        yield {"ph": "b", "name": name, "ts": arrival, "args": args, **common}
        yield {"ph": "b", "name": "queued", "ts": arrival, **common}
        yield {"ph": "e", "name": "queued", "ts": scheduled, **common}
        yield {"ph": "b", "name": "prefill", "ts": scheduled, **common}
        yield {"ph": "e", "name": "prefill", "ts": first, **common}
        if finish > first:
            yield {"ph": "b", "name": "decode", "ts": first, **common}
            yield {"ph": "e", "name": "decode", "ts": finish, **common}
        yield {"ph": "e", "name": name, "ts": finish, **common}


def stage_timeline(result, path: str | os.PathLike[str], window: tuple[float, float] | None = None) -> Path:
    """Write the trace to a temporary file beside ``path`` and return it; :func:`commit` renames it.

    Staged so that the CLI can write the run folder in between and leave nothing
    behind if either fails.
    """
    path = Path(path)
    other = {"specbatch_version": sim.__version__, "config_digest": result.config.digest(),
             "profile": result.profile.name, "policy": result.config.policy.name,
             "speculation": result.config.speculation.label(),
             "replicas": result.config.cluster.replicas, "router": result.config.cluster.router,
             "time_unit": "microseconds of simulated time",
             **({"window_s": list(window)} if window is not None else {})}
    try:
        with _opened(path) as (staging, out):
            out.write('{"displayTimeUnit":"ms","otherData":' + json.dumps(other, sort_keys=True)
                      + ',\n"traceEvents":[\n')
            first = True
            for event in trace_events(result.requests, result.steps, window, getattr(result, "reasons", None)):
                out.write(("" if first else ",\n") + json.dumps(event, separators=(",", ":"), allow_nan=False))
                first = False
            out.write("\n]}\n")
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    return staging


def check_writable(path: str | os.PathLike[str]) -> list[Path]:
    """Fail before a long run, not after it, when the timeline could not be written. The folders
    the check had to create are removed again (staging creates them when the trace is written),
    so a run interrupted before then leaves nothing; they are returned, deepest first, for
    :func:`remove_folders` to clear should the writing fail."""
    path = Path(path)
    created = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    try:
        with _opened(path) as (staging, _):
            pass
    except OSError as exc:
        remove_folders(created)
        raise _cannot_write(path, exc) from None
    staging.unlink()
    remove_folders(created)
    return created


def remove_folders(folders: list[Path]) -> None:
    """Remove these folders, deepest first, where they are (still) empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass


@contextlib.contextmanager
def _opened(path: Path):
    """A new staging file beside ``path`` and its handle, open for writing; removed again if anything fails."""
    if path.is_dir():
        raise IsADirectoryError(21, "it is a folder")
    for folder in (path.parent, *path.parent.parents):
        if folder.exists() and not folder.is_dir():  # mkdir would only say "File exists"
            raise NotADirectoryError(20, f"{folder} is a file, not a folder")
    staging = new_staging_file(path)
    try:
        with open(staging, "w") as out:
            yield staging, out
    except BaseException:
        with contextlib.suppress(OSError):
            staging.unlink()
        raise


def _cannot_write(path: Path, exc: OSError) -> InputError:
    return InputError(f"cannot write the timeline: {exc.strerror or exc}", field="output.timeline",
                      source=str(path))


def write_timeline(result, path: str | os.PathLike[str], window: tuple[float, float] | None = None) -> Path:
    return commit(stage_timeline(result, path, window), path)
