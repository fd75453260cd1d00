"""Run outputs: the terminal summary and the files of an output folder.

Files are written into a staging folder beside the target and renamed into place,
so a folder is either a complete run or absent. Nothing in them depends on the
wall clock, so the same config and seed give the same bytes.

The record tables (requests, steps) are written by pyarrow straight from the run's
typed columns (:mod:`sim.serving.records`): no DataFrame, no per-row Python. A new
column is one more entry in those columns; the writer takes them all, in order.
CSV floats are written at full precision: pyarrow prints the shortest decimal that
reads back as the same float64, so a value read from requests.csv or steps.csv is the
value the run computed (step durations summed from steps.csv give summary.json's busy
time to the last bit of rounding), and NaN is an empty cell. A table of numbers is
written by compiled code instead (sim/csv_rows.py, its floats by sim/float_text.py), to
the same bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Callable

import numpy as np

import sim
from sim.atomic_write import staged_dir
from sim.heap import release_freed
from specbatch.commands.described import describe, policy_k_max
from sim.config import RunConfig
from sim.errors import InputError
from sim.metrics import STEP_BLOCK, percentile_word
from sim.simulate import Columns, RunResult

STEP_FOLLOWS = {"start_s": "end_s"}  # a step starts when the one before it ended: its text is reused
SLICE_ROWS = 1 << 16  # rows converted and written at a time (larger slices were no faster: 2.5 s either way at 1M)
# ... by sim.csv_rows: a slice's texts, offsets and rows take about 700 bytes a row (a 65,536-row slice
# raised a 200k-request run's peak by 55 MB, this one by 12 MB, and is no slower)
COMPILED_SLICE_ROWS = 1 << 14
# Runs this long write steps.csv while the engine runs (StepsFile). One replica: from where that is no slower
# than writing after the run (10,000 requests of the default scenario: even; the 16,800-request real run, its
# steps handed over once before the end: the writing after the engine went from 0.09 s to 0.03 s); a cluster's
# merge as its replicas run pays, in memory, only for long runs (it keeps every replica on a thread of its own:
# 10,000 requests over 4 peaked 30 MB higher, no sooner).
STREAM_MIN_REQUESTS = 10_000
MERGE_MIN_REQUESTS = 50_000

MARKER = "summary.json"
SPEC_DECODE_FILE = "spec_decode.jsonl"  # per request, vLLM's speculative_decoding objects (when asked)


def default_output_dir(result_digest: str) -> Path:
    return Path("runs") / result_digest


def run_to_folder(config: RunConfig, *, default_folder: bool, warn: Callable[[str], None] = lambda warning: None,
                  keep_steps: bool = True) -> tuple[RunResult, Path | None]:
    """One run from a resolved config to its folder: what ``specbatch run`` and ``specbatch.run`` both do.

    Everything that can fail fails first (docs/errors.md): the inputs (``prepare``), then every
    output (the folder, the timeline). The folder is locked while the run works, so a second
    run into it is refused, and the folder and the timeline appear whole or not at all.
    ``default_folder``: without ``output.dir``, write to runs/<digest> (the command line) rather
    than nowhere (the API). ``warn`` hears each warning once: the preparation's before the run,
    the run's own (a queue that grows without bound) after it. ``keep_steps=False``: a run whose steps
    go to its folder's file as it runs (:class:`StepsFile`) keeps none in memory (the result's
    ``step_columns`` is None; ``specbatch run`` needs only the summary).
    """
    from sim.atomic_write import output_lock, output_problem
    from specbatch.commands.timeline import check_writable, commit, remove_folders, stage_timeline
    from sim.simulate import execute, prepare

    run = prepare(config)
    out = config.output.dir or (default_output_dir(run.config.digest()) if default_folder else None)
    if out is not None:
        problem = output_problem(out, folder=True)
        if problem is not None:
            raise config.error("output.dir", f"cannot write {out}: {problem}")
        check_run_dir(out)
    timeline = config.output.timeline
    timeline_folders = check_writable(timeline) if timeline else []
    for warning in run.warnings:
        warn(warning)
    locked = output_lock(out, error=lambda message: config.error("output.dir", message)) if out is not None \
        else contextlib.nullcontext()
    staged = None
    with locked:
        try:
            with staged_dir(out) if out is not None else contextlib.nullcontext() as staging:
                steps_file = StepsFile.for_run(run, staging, keep_steps)
                try:
                    result = execute(run, steps_sink=steps_file or _no_steps_file(config, keep_steps))
                    staged = stage_timeline(result, timeline, config.output.timeline_window) if timeline else None
                    if staging is not None:
                        fill_run_folder(result, staging, steps_file)
                        check_run_dir(out)  # again: the folder is replaced as this block ends
                finally:
                    if steps_file is not None:
                        steps_file.close()
        except BaseException:
            if staged is not None:
                staged.unlink(missing_ok=True)
            remove_folders(timeline_folders)
            raise
        if staged is not None:
            commit(staged, timeline)
    for warning in result.warnings[len(run.warnings):]:
        warn(warning)
    return result, (Path(out) if out is not None else None)


def summary_document(result: RunResult) -> dict:
    cfg = result.config
    return {
        "specbatch_version": sim.__version__,
        "config_digest": cfg.digest(),
        "profile": profile_section(result),
        "policy": {"name": cfg.policy.name, **cfg.policy.params},
        "speculation": cfg.speculation.to_dict(),
        "described": describe(cfg, result.profile, policy_k_max(cfg)),
        "batching": cfg.engine.batching,
        "seed": cfg.seed,
        "metrics": {k: _json_number(v) for k, v in result.summary.items()},
        "warnings": result.warnings,
        **({"by_label": {label: {k: _json_number(v) for k, v in m.items()} for label, m in result.by_label.items()}}
           if result.by_label else {}),
        **({"cluster": {"replicas": cfg.cluster.replicas, "router": cfg.cluster.router},
            "replicas": [{k: _json_number(v) for k, v in m.items()} for m in result.replicas]}
           if result.replicas else {}),
        **bench_serve_names(result),
        **({"speculative_decoding": {k: _json_value(v) for k, v in result.spec_decode.items()}}
           if result.spec_decode else {}),
        **(result.extra or {}),
    }


def profile_section(result: RunResult) -> dict:
    """summary.json's ``profile``: named as the user gave it (a folder's name is not its sidecar's:
    ``--profile my-profile`` may hold a calibration the sidecar calls ``cpu-tinyllama-1.1b-llama-68m``,
    the name of a shipped profile too), the sidecar's own name beside it where it differs."""
    profile, given = result.profile, result.config.profile
    return {"name": given, **({"sidecar_name": profile.name} if profile.name != given else {}),
            "device": profile.meta.get("device", {}),
            "models": {role: m.get("name") for role, m in profile.meta.get("models", {}).items()}}


def bench_serve_names(result: RunResult) -> dict:
    """The names of ``vllm bench serve --save-result`` that summary.json's ``metrics`` lacks, at its
    top level beside ``seed`` and ``batching``: the client's settings (``num_prompts``,
    ``request_rate`` ("inf" as vLLM writes it), ``burstiness``, ``max_concurrency``), ``duration``
    and ``request_goodput`` (null without --goodput, as vLLM writes it). vLLM's metric names
    (``completed``, ``mean_ttft_ms`` ...) are those of ``metrics``."""
    w, s = result.config.workload, result.summary
    rate = w.rate if w.trace is None and w.trace_vllm is None and w.rate_profile is None else None
    return {
        "num_prompts": result.request_count,
        "request_rate": "inf" if rate == math.inf else rate,
        "burstiness": w.burstiness if w.arrival == "gamma" else 1.0,
        "max_concurrency": w.max_concurrency,
        "duration": _json_number(s["duration_s"]),
        "request_goodput": _json_number(s["request_goodput"]) if "request_goodput" in s else None,
    }


def _json_value(value):
    return [_json_number(x) for x in value] if isinstance(value, list) else _json_number(value)


def check_run_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Refuse to replace a folder that is not an earlier run's (checked before the run, and again at the write)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not (out_dir.is_dir() and (out_dir / MARKER).is_file()):
        raise InputError("exists and is not a specbatch run folder; refusing to replace it",
                         field="output.dir", source=str(out_dir))
    return out_dir


def write_run(result: RunResult, out_dir: str | os.PathLike[str]) -> Path:
    out_dir = check_run_dir(out_dir)
    with staged_dir(out_dir) as staging:
        fill_run_folder(result, staging)
    return out_dir


def fill_run_folder(result: RunResult, staging: Path, steps_file: "StepsFile | None" = None) -> None:
    """A run folder's files, into its staging folder; ``steps_file``: the steps, if it holds them already
    (written while the engine ran; it is waited for here)."""
    from concurrent.futures import ThreadPoolExecutor

    records = result.config.output.records
    (staging / "config.toml").write_text(result.config.to_toml())
    if records != "none":
        compiled = result.config.engine.jit != "off"

        def write_requests() -> None:
            if steps_file is None or not steps_file.finish_requests(result.request_columns):
                write_table(result.request_columns, staging / f"requests.{records}", records, compiled=compiled)

        def write_steps() -> None:
            if steps_file is None or not steps_file.holds(result.step_columns):  # (waits for its writes)
                write_table(result.step_columns, staging / f"steps.{records}", records, compiled=compiled,
                            follows=STEP_FOLLOWS)

        # The two tables are written at once, requests.csv on a thread of its own: both writers format without
        # the interpreter's lock (pyarrow's, and sim.csv_rows' compiled one), and where the steps file's thread
        # still writes the run's last steps, the rest of requests.csv is written meanwhile.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="requests-file") as other:
            requests_written = other.submit(write_requests)  # (left whole before the folder is removed)
            write_steps()
            requests_written.result()
    if result.spec_decode_requests is not None:
        (staging / SPEC_DECODE_FILE).write_text("".join(
            json.dumps(r, separators=(",", ":")) + "\n" for r in result.spec_decode_requests))
    (staging / MARKER).write_text(json.dumps(summary_document(result), indent=2, sort_keys=True) + "\n")


def _no_steps_file(config: RunConfig, keep_steps: bool):
    """Where a run that writes no steps and keeps none sends them: to its summary's totals only."""
    if keep_steps or config.output.records != "none":
        return None
    from sim.serving.records import TotalsOnly

    return TotalsOnly()


class StepsFile:
    """``steps.csv``, written while the engine runs (a :class:`~sim.serving.records.StepSink`).

    A long single-replica run's compiled engine holds no interpreter lock: each :attr:`every` records it
    hands over are formatted (sim/csv_rows.py, the same bytes :func:`write_table` writes) and written on
    a thread of their own meanwhile, in order, so that most of the file is on disk when the engine
    ends. Where the run could not stream (:func:`sim.simulate.execute` says which), the file is
    written after the run as before (:meth:`holds`). A single replica's run also has it write the
    rows of requests.csv whose requests have finished, from the first, on the same thread
    (:meth:`follow_requests`).
    """

    every = STEP_BLOCK  # records a hand-over: a compiled run returns once for each
    queued = 4  # blocks waiting for the writer at most: a run that outpaces it waits, its memory bounded
    requests_every = COMPILED_SLICE_ROWS  # finished requests written at a time while the engine runs

    def __init__(self, path: Path, keeps: bool = True) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.path, self.keeps = path, keeps
        self._format_rows = None  # sim.csv_rows' compiled formatter, loaded by the first write (_formatter)
        self.streamed: list[str] | None = None  # the columns written, once the run has streamed them all
        self._columns: list[str] | None = None
        self._sink = None
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steps-file")
        self._pending: list = []
        self.requests_path = path.with_name("requests.csv")
        self._finished = None  # sim.simulate.FinishedRequests, where requests.csv is written as requests finish
        self._requests: list | None = None  # its columns' names and dtypes, once its first rows are queued
        self._requests_sink = None
        self._requests_queued = 0  # rows of requests.csv queued for the writer
        self._requests_written = None  # the last of those writes (a Future)

    @classmethod
    def for_run(cls, run, staging: Path | None, keep_steps: bool = True) -> "StepsFile | None":
        """The run's steps file, where writing it while the engine runs applies: a run folder of CSV records,
        one replica in compiled runs of at least :data:`STREAM_MIN_REQUESTS` requests (a shorter run's steps
        take less to write than loading the compiled formatter does) or, for a run that keeps no steps, a
        cluster in compiled code (sim.cluster.run_cluster) of at least :data:`MERGE_MIN_REQUESTS`; the
        formatter compiled on this machine (:meth:`_formatter` loads it)."""
        c = run.config
        shortest = STREAM_MIN_REQUESTS if c.cluster.replicas == 1 else MERGE_MIN_REQUESTS
        if (staging is None or c.output.records != "csv" or c.engine.jit == "off"
                or (c.cluster.replicas != 1 and keep_steps) or c.cluster.prefill_replicas or c.output.timeline
                or len(run.requests) < shortest):
            return None
        from sim import jit

        if not jit.numba_available() or not jit.is_warm():
            return None
        return cls(staging / "steps.csv", keep_steps)

    def start(self, columns: list[str]) -> None:
        """The run streams its records' ``columns`` (in the file's order)."""
        self._columns = list(columns)
        self._sink = open(self.path, "wb")
        self._sink.write((",".join(self._columns) + "\n").encode())

    @property
    def requests_streamed(self) -> int:
        """Rows of requests.csv written (or queued) while the engine ran."""
        return self._requests_queued

    def follow_requests(self, finished) -> None:
        """Write requests.csv too while the engine runs: the rows of the requests that ``finished``
        (:class:`sim.simulate.FinishedRequests`) says are final, from the first, :attr:`requests_every` or
        more at a time; :meth:`finish_requests` writes the rest after the run."""
        self._finished = finished

    def rows(self, steps: np.ndarray, lo: int, hi: int) -> None:
        """Queue records ``lo`` to ``hi`` of ``steps`` for writing (they are final: see StepSink), and the
        requests that have finished since, where this file follows them."""
        from sim.serving.records import copied

        rows = copied(steps, lo, hi)  # not a view: the run reuses or replaces the buffer meanwhile
        self._queue(self._write, {name: rows[name] for name in self._columns}, hi - lo)
        if self._finished is not None:
            final = self._finished.count()
            # Once every request has finished the run is ending: the rest is written after it, beside this
            # file's last rows of steps rather than queued before them (finish_requests).
            if self.requests_every <= final - self._requests_queued and final < len(self._finished.requests):
                columns = self._finished.columns(self._requests_queued, final)
                self._requests = self._requests or [(name, values.dtype) for name, values in columns.items()]
                self._requests_written = self._queue(self._write_requests, columns, final - self._requests_queued)
                self._requests_queued = final

    def _queue(self, write, arrays: dict[str, np.ndarray], count: int):
        while self._pending and (self._pending[0].done() or len(self._pending) >= self.queued):
            self._pending[0].result()  # a write that failed (a full disk) stops the run here
            self._pending.pop(0)
        self._pending.append(self._writer.submit(write, arrays, count))
        return self._pending[-1]

    def _write_requests(self, arrays: dict[str, np.ndarray], count: int) -> None:
        if self._requests_sink is None:
            self._requests_sink = open(self.requests_path, "wb")
            self._requests_sink.write((",".join(arrays) + "\n").encode())
        write_rows(self._requests_sink, arrays, 0, count, {}, self._formatter())

    def finish_requests(self, columns: Columns) -> bool:
        """Write the rest of requests.csv, ``columns`` (the run's whole table), after the rows written while
        the engine ran; False where none were, or the table is not the one they were taken from (the caller
        then writes the file whole). Call once the run has ended: it waits for the request rows queued
        during the run, not for the steps, whose last rows this file's thread may still be writing."""
        if self._requests != [(name, np.asarray(values).dtype) for name, values in columns.items()]:
            return False
        self._requests_written.result()
        self._requests_sink.close()  # its thread has written its last request row: the rest is written here
        arrays = {name: np.asarray(values) for name, values in columns.items()}
        with open(self.requests_path, "ab") as sink:
            write_rows(sink, arrays, self._requests_queued, len(arrays["request_id"]), {}, self._formatter())
        return True

    def _write(self, arrays: dict[str, np.ndarray], count: int) -> None:
        write_rows(self._sink, arrays, 0, count, STEP_FOLLOWS, self._formatter())
        # Each block of steps was copied (and a cluster's merged) on its way here, and the copies freed:
        # giving their pages back on this thread, a block at a time (1-2 ms), kept a million-request
        # cluster's peak RSS 20-30 MB lower (sim/heap.py).
        release_freed()

    def _formatter(self):
        """The compiled formatter, loaded by the file's thread at its first write: where the run hands rows
        over as it goes, while the engine (which has loaded its own code and holds no lock) runs on."""
        if self._format_rows is None:
            from sim import csv_rows, jit

            self._format_rows = jit.compiled(csv_rows.format_rows)
        return self._format_rows

    def holds(self, columns: Columns | None) -> bool:
        """Whether the file holds the run's steps, ``columns`` (None: kept nowhere else). Waits for the last
        writes and closes the file either way, so that a file that does not hold them can be written anew."""
        for pending in self._pending:
            pending.result()
        self._pending = []
        self._close_files()
        return self.streamed is not None and (columns is None or self.streamed == list(columns))

    def close(self) -> None:
        """Stop writing (what is queued and not yet begun is dropped: after a failure or Ctrl-C, the staging
        folder this file is in is removed) and close the file."""
        self._writer.shutdown(wait=True, cancel_futures=True)
        self._close_files()

    def _close_files(self) -> None:
        for sink in (self._sink, self._requests_sink):
            if sink is not None:
                sink.close()


def write_table(columns: Columns, path: Path, fmt: str, *, compiled: bool = False,
                follows: dict[str, str] | None = None) -> None:
    """Write named columns (a dict of arrays or a DataFrame) as CSV or Parquet, in their order.

    Rows go out in slices of :data:`SLICE_ROWS` (:data:`COMPILED_SLICE_ROWS`), so the writer's own
    memory (the formatted text) stays a slice's, whatever the run's length. ``compiled``: a CSV table of numbers
    goes through sim.csv_rows where its compiled code is on disk (the same bytes, sooner);
    ``follows`` tells it which float column often repeats another's previous row.
    """
    names = list(columns)
    arrays = {name: np.asarray(columns[name]) for name in names}
    rows = len(next(iter(arrays.values()))) if arrays else 0
    format_rows = _compiled_rows(arrays) if compiled and fmt == "csv" else None
    if format_rows is not None:
        with open(path, "wb") as sink:
            sink.write((",".join(names) + "\n").encode())
            from sim.cluster import usable_threads

            write_rows(sink, arrays, 0, rows, follows or {}, format_rows, threads=usable_threads())
        return
    import pyarrow as pa

    def table(lo: int, hi: int):
        return pa.table([_arrow_column(arrays[name][lo:hi], fmt) for name in names], names=names)

    first = table(0, min(rows, SLICE_ROWS))
    with pa.OSFile(str(path), "wb") as sink:
        if fmt == "csv":
            import pyarrow.csv as pacsv

            sink.write((",".join(names) + "\n").encode())  # bare names: they are identifiers
            writer = pacsv.CSVWriter(sink, first.schema, write_options=_csv_options(arrays))
        else:
            import pyarrow.parquet as pq

            writer = pq.ParquetWriter(sink, first.schema)
        with writer:
            writer.write_table(first)
            for lo in range(SLICE_ROWS, rows, SLICE_ROWS):
                writer.write_table(table(lo, min(rows, lo + SLICE_ROWS)))


def write_rows(sink, arrays: dict[str, np.ndarray], lo: int, hi: int, follows: dict[str, str], format_rows,
               threads: int = 1) -> None:
    """Rows ``lo`` to ``hi`` of the columns to an open file by sim.csv_rows' compiled ``format_rows``, in
    slices of :data:`COMPILED_SLICE_ROWS` (the formatted text is a slice's, however many rows). With
    ``threads`` > 1 that many slices are formatted at once (each slice stands alone, and the formatter
    holds no interpreter lock) and written in order: a table written after its run has the cores to itself."""
    from sim.csv_rows import csv_rows

    starts = range(lo, hi, COMPILED_SLICE_ROWS)

    def text(at: int) -> np.ndarray:
        return csv_rows(arrays, at, min(hi, at + COMPILED_SLICE_ROWS), follows, format_rows)

    if threads < 2 or len(starts) < 2:
        for at in starts:
            sink.write(text(at))
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads, thread_name_prefix="rows") as pool:
        pending: deque = deque()
        for at in starts:
            pending.append(pool.submit(text, at))
            if len(pending) > threads:  # at most a slice ahead per thread: the text in memory stays a few slices'
                sink.write(pending.popleft().result())
        while pending:
            sink.write(pending.popleft().result())


def _compiled_rows(arrays: dict[str, np.ndarray]):
    """sim.csv_rows' compiled row formatter where it applies to the table and this machine has it
    compiled already (sim.warm compiles it with the engine: a run never waits for it), else None."""
    from sim import csv_rows, jit

    if not csv_rows.applies(arrays) or not jit.numba_available() or not jit.is_warm():
        return None
    return jit.compiled(csv_rows.format_rows)


def _csv_options(arrays: dict[str, np.ndarray]):
    """No quotes, unless a label holds a comma, quote or line break (then Arrow quotes every label)."""
    import pyarrow.csv as pacsv

    structural = any(np.char.find(values.astype(str), c).max(initial=-1) >= 0
                     for values in arrays.values() if values.dtype.kind == "O" for c in ',"\r\n')
    return pacsv.WriteOptions(include_header=False, quoting_style="needed" if structural else "none")


def _arrow_column(values: np.ndarray, fmt: str):
    """One column as an Arrow array sharing the numpy buffer (``pa.array`` would import pandas,
    ~0.4 s, to look for pandas types); a CSV's NaN is a null, written as an empty cell, and every
    other float is printed in full (the shortest text that reads back as the same float64)."""
    import pyarrow as pa

    if values.dtype.kind not in "iuf":  # labels: strings (a labelled run has imported pandas anyway)
        return pa.array(values, type=pa.string() if values.dtype.kind == "O" else None)
    values = np.ascontiguousarray(values)
    validity = None
    if values.dtype.kind == "f" and fmt == "csv":
        nan = np.isnan(values)
        if nan.any():
            validity = pa.py_buffer(np.packbits(~nan, bitorder="little"))
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [validity, pa.py_buffer(values)])


def _json_number(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def latency_statistics(result, metrics: list[str], percentiles: list[float]) -> dict[str, float]:
    """mean, median, std and the percentiles asked for, in ms, of each latency (ttft, tpot, itl, e2el),
    named as vLLM names them (``p99.9_ttft_ms``): vllm bench serve's --percentile-metrics and
    --metric-percentiles."""
    from sim.metrics import distribution_stats

    r = result.request_columns
    done = ~np.isnan(r["finish_s"])
    values = {"ttft": (r["ttft_s"][done], None), "tpot": (r["tpot_s"][done & (r["output_tokens"] > 1)], None),
              "e2el": (r["e2el_s"][done], None), "itl": result.itl}
    out: dict[str, float] = {}
    for metric in metrics:
        data, weights = values[metric]
        out.update(distribution_stats(metric, data, weights, percentiles))
    return out


def format_summary(result: RunResult, selection: tuple[list[str], list[float]] | None = None) -> str:
    """A vLLM-style result block, readable at a glance. ``selection`` (vllm bench serve's
    --percentile-metrics and --metric-percentiles: metrics, percentiles) prints those latencies'
    mean, median and percentiles, as vLLM does; by default every latency's mean, median, P90 and P99."""
    s, cfg = result.summary, result.config
    width = 52
    lines = ["{s:{c}^{n}}".format(s=" specbatch simulation result ", n=width, c="=")]

    def row(label: str, value) -> None:
        if isinstance(value, float):
            value = "n/a" if not math.isfinite(value) else f"{value:.2f}"
        lines.append(f"{label:<40}{value:>12}")

    def header(title: str) -> None:
        lines.append("{s:{c}^{n}}".format(s=f" {title} ", n=width, c="-"))

    lines.append(f"{'Profile:':<12}{result.config.profile:>40}")  # as the user gave it (summary.json has both)
    policy = cfg.policy.name + "".join(f" {k}={v}" for k, v in cfg.policy.params.items())
    if len(policy) > 40:  # a look-up table, say: the full parameters are in config.toml
        policy = policy[:39] + "…"
    lines.append(f"{'Policy:':<12}{policy:>40}")
    lines.append(f"{'Batching:':<12}{cfg.engine.batching + f' (max {cfg.engine.max_batch_size})':>40}")
    if cfg.workload.sampling is not None:  # asked for (else the profile's own, as `specbatch profiles` says)
        lines.append(f"{'Sampling:':<12}{cfg.workload.sampling:>40}")
    if result.replicas:
        lines.append(f"{'Cluster:':<12}{f'{cfg.cluster.replicas} replicas, {cfg.cluster.router}':>40}")
    disaggregated = (result.extra or {}).get("disaggregated")
    if disaggregated:
        pools = f"{cfg.cluster.prefill_replicas} prefill + {cfg.cluster.decode_replicas} decode, {cfg.cluster.router}"
        lines.append(f"{'Cluster:':<12}{pools:>40}")
        if cfg.cluster.decode_profile is not None:
            lines.append(f"{'Decoding:':<12}{disaggregated['decode']['profile']:>40}")
    row("Successful requests:", s["completed"])
    row("Benchmark duration (s):", s["duration_s"])
    row("Total input tokens:", s["total_input_tokens"])
    row("Total generated tokens:", s["total_output_tokens"])
    row("Request throughput (req/s):", s["request_throughput"])
    if "request_goodput" in s:
        row("Request goodput (req/s):", s["request_goodput"])
    row("Output token throughput (tok/s):", s["output_throughput"])
    row("Total token throughput (tok/s):", s["total_token_throughput"])
    stats, shown = s, [("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")]
    metrics = ["ttft", "tpot", "itl", "e2el"]
    if selection is not None:
        metrics, percentiles = selection
        stats = latency_statistics(result, metrics, percentiles)
        words = [percentile_word(p) for p in percentiles]
        shown = [("mean", "Mean"), ("median", "Median")] + [(f"p{w}", f"P{w}") for w in words]
    titles = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
              "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
    for key in metrics:
        header(titles[key])
        for stat, label in shown:
            row(f"{label} {key.upper()} (ms):", stats[f"{stat}_{key}_ms"])
    header("Speculative Decoding")
    lines.append(f"Method: {cfg.speculation.label()}")
    row("Acceptance rate (%):", 100 * s["acceptance_rate"])
    row("Mean acceptance length:", s["mean_acceptance_length"])
    per_pos = (result.spec_decode or {}).get("acceptance_rate_per_pos", [])
    if per_pos and s["num_drafts"]:
        lines.append("Per-position acceptance (%):")
        lines.append("  " + ", ".join(f"{100 * x:.1f}" for x in per_pos[:8]) + (" ..." if len(per_pos) > 8 else ""))
    row("Mean k:", s["mean_k"])
    row("Mean batch size (decode):", s["mean_batch_size"])
    row("Engine steps (prefill + decode):", s["num_steps"])
    row("Token goodput (tok/s of busy time):", s["token_goodput"])
    if "num_preemptions" in s:  # the vllm-v1 scheduler
        header("Scheduler vllm-v1")
        row("Mixed steps (decodes + prefill chunks):", s["num_mixed_steps"])
        row("Preemptions:", s["num_preemptions"])
        row("Peak KV blocks:", s["peak_kv_blocks"])
        if "prefix_cache_queries" in s:
            row("Prefix cache hit rate (%):", 100 * s["prefix_cache_hit_rate"])
            row("Prompt tokens found in the cache:", s["prefix_cache_hits"])
    if result.replicas:
        header(f"{len(result.replicas)} replicas, {cfg.cluster.router} router")
        cached = "prefix_cache_hit_rate" in result.replicas[0]  # each replica's own cache (vllm-v1, caching on)
        lines.append(f"{'replica':>7}{'reqs':>6}{'mean E2EL ms':>13}{'p99 E2EL ms':>12}{'batch':>7}{'busy':>7}"
                     + (f"{'cache hit':>10}" if cached else ""))
        for m in result.replicas:
            lines.append(f"{m['replica']:>7}{m['requests']:>6}{_ms(m['mean_e2el_ms']):>13}"
                         f"{_ms(m['p99_e2el_ms']):>12}{m['mean_batch_size']:>7.1f}{100 * m['busy_fraction']:>6.1f}%"
                         + (f"{100 * m['prefix_cache_hit_rate']:>9.1f}%" if cached else ""))
    if disaggregated:
        header("Disaggregated prefill / decode")
        t = disaggregated["kv_transfer"]
        row("Prefill pool busy (%):", 100 * disaggregated["prefill"]["busy_fraction"])
        row("Decode pool busy (%):", 100 * disaggregated["decode"]["busy_fraction"])
        link = f"{t['link']}, {t['bandwidth_gb_s']:g} GB/s, {t['latency_us']:g} us"
        lines.append(f"{'KV link:':<12}{link:>40}")
        if "prefilled_on_decode" in disaggregated:  # llm-d's flow: its decider kept these off the prefill pool
            row("Prefilled on the decode pool:", disaggregated["prefilled_on_decode"])
        row("KV transfers:", t["transfers"])
        row("Waited for decode KV blocks:", t["waited_for_blocks"])
        row("KV transferred (GB):", t["bytes"] / 1e9)
        row("Mean KV transfer (ms):", t["mean_transfer_ms"])
        row("Mean transfer queueing (ms):", t["mean_queue_ms"])
        row("P99 transfer queueing (ms):", t["p99_queue_ms"])
    lines.append("=" * width)
    return "\n".join(lines)


def _ms(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.0f}"
