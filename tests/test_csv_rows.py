"""sim/csv_rows.py: a long table's CSV rows, compiled, are the bytes pyarrow's writer writes."""

from __future__ import annotations

import numpy as np
import pytest

import specbatch.commands.outputs as outputs
from sim import cluster, csv_rows, jit
from specbatch.commands.outputs import write_table


def awkward_table(n: int = 3000) -> dict[str, np.ndarray]:
    """Every kind of cell the fast path takes: signed and unsigned ints of each width with their
    extremes, floats tiny, huge, subnormal, integral, negative zero, infinite and NaN; a constant
    column, runs of repeats, and a start_s that mostly repeats the end_s above it."""
    rng = np.random.default_rng(8)
    end = np.cumsum(rng.random(n) * 0.03)
    start = np.concatenate(([0.0], end[:-1]))
    start[rng.integers(1, n, n // 10)] += 1e-3  # an idle gap: its own text
    start[5] = -0.0  # equal to 0.0, printed otherwise
    floats = rng.standard_normal(n) * 10.0 ** rng.integers(-310, 300, n)
    floats[:12] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 5e-324, 1e-5, 7.82613375e-05, 1e22, 3.0, -2.5, np.nan]
    runs = np.repeat(rng.random(n // 50 + 1), 50)[:n]
    runs[100:140] = np.nan
    i64 = rng.integers(-(2**62), 2**62, n)
    i64[:4] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0, -1]
    return {
        "request_id": np.arange(n),
        "start_s": start,
        "end_s": end,
        "phase": rng.integers(-128, 128, n).astype(np.int8),
        "k": rng.integers(0, 8, n).astype(np.int8),
        "batch_size": rng.integers(-(2**31), 2**31, n).astype(np.int32),
        "value": floats,
        "alpha": np.full(n, 0.8),
        "runs": runs,
        "i64": i64,
        "u8": rng.integers(0, 256, n).astype(np.uint8),
        "u32": rng.integers(0, 2**32, n).astype(np.uint32),
        "i16": rng.integers(-(2**15), 2**15, n).astype(np.int16),
    }


def pyarrow_bytes(columns, tmp_path) -> bytes:
    path = tmp_path / "pyarrow.csv"
    write_table(columns, path, "csv")  # not compiled: pyarrow's writer
    return path.read_bytes()


@pytest.mark.parametrize("compiled", [False, True])
def test_rows_are_pyarrows_bytes(tmp_path, compiled):
    """The rows, formatted by the plain function and by its compiled twin, in slices of every
    offset, equal pyarrow's writer's bytes: the reused texts (a repeat, a start that follows the
    end above) included, and a slice's first row formatted afresh."""
    columns = awkward_table()
    expected = pyarrow_bytes(columns, tmp_path).split(b"\n", 1)[1]
    format_rows = jit.compiled(csv_rows.format_rows) if compiled else csv_rows.format_rows
    arrays = {name: np.asarray(values) for name, values in columns.items()}
    bounds = [0, 1, 2, 700, 701, 2999, 3000]
    got = b"".join(csv_rows.csv_rows(arrays, lo, hi, {"start_s": "end_s"}, format_rows).tobytes()
                   for lo, hi in zip(bounds, bounds[1:]))
    assert got == expected


@pytest.mark.parametrize("digits", [1, 5, 19])
def test_the_rows_room_holds_repeated_texts_and_the_widest_integers(tmp_path, digits):
    """The rows are written into room sized from their texts and their integers' widest values: long float
    texts written twice (a start that is the end above it, a repeat) beside integers of a digit, or of
    nineteen (the plain function, checked by numpy, fails on a row that would overrun it)."""
    n = 500
    rng = np.random.default_rng(digits)
    end = np.cumsum(rng.random(n)) + 0.123456789012345
    widest = 10 ** (digits - 1)
    columns = {"start_s": np.concatenate(([0.0], end[:-1])), "end_s": end, "same": np.full(n, 1 / 3),
               "i": rng.integers(-widest, widest, n) if digits > 1 else rng.integers(0, 10, n)}
    expected = pyarrow_bytes(columns, tmp_path).split(b"\n", 1)[1]
    got = csv_rows.csv_rows(columns, 0, n, {"start_s": "end_s"}, csv_rows.format_rows).tobytes()
    assert got == expected


@pytest.mark.parametrize("threads", [1, 3])
def test_a_long_table_is_written_by_the_compiled_rows_with_the_same_bytes(tmp_path, monkeypatch, threads):
    """write_table takes the compiled path for a numeric CSV where the code is compiled (here: made
    so), in slices (formatted on ``threads`` threads, written in order), and writes pyarrow's bytes; a table
    with a label, or Parquet, stays with pyarrow."""
    columns = awkward_table()
    monkeypatch.setattr(outputs, "COMPILED_SLICE_ROWS", 777)
    monkeypatch.setattr(cluster, "usable_threads", lambda: threads)
    monkeypatch.setattr(jit, "is_warm", lambda: True)
    calls = []
    real = csv_rows.csv_rows
    monkeypatch.setattr(csv_rows, "csv_rows", lambda *args: calls.append(args[1]) or real(*args))
    expected = pyarrow_bytes(columns, tmp_path)
    write_table(columns, tmp_path / "fast.csv", "csv", compiled=True, follows={"start_s": "end_s"})
    assert sorted(calls) == list(range(0, 3000, 777))
    assert (tmp_path / "fast.csv").read_bytes() == expected
    calls.clear()
    labelled = {**columns, "label": np.array(["a,b"] * 3000, dtype=object)}
    write_table(labelled, tmp_path / "labelled.csv", "csv", compiled=True)
    assert calls == [] and (tmp_path / "labelled.csv").read_bytes() == pyarrow_bytes(labelled, tmp_path)
    write_table(columns, tmp_path / "short.csv", "csv", compiled=False)
    assert calls == []


def test_which_tables_it_takes():
    n = 5
    assert csv_rows.applies({"x": np.zeros(n), "i": np.zeros(n, np.int8), "u": np.zeros(n, np.uint32)})
    assert not csv_rows.applies({"u": np.zeros(n, np.uint64)})  # beyond int64
    assert not csv_rows.applies({"x": np.zeros(n, np.float32)})  # float32 prints its own shortest text
    assert not csv_rows.applies({"b": np.zeros(n, bool)})
    assert not csv_rows.applies({"label": np.array(["a"] * n, dtype=object)})


@pytest.mark.parametrize("rows", [0, 1, 7])
def test_a_short_table_is_written_by_the_compiled_rows_with_the_same_bytes(tmp_path, monkeypatch, rows):
    """However short (a run of a few requests; none at all): pyarrow's bytes, with no pyarrow in the way."""
    monkeypatch.setattr(jit, "is_warm", lambda: True)
    calls = []
    real = csv_rows.csv_rows
    monkeypatch.setattr(csv_rows, "csv_rows", lambda *args: calls.append(args[1]) or real(*args))
    columns = {name: values[:rows] for name, values in awkward_table().items()}
    write_table(columns, tmp_path / "short.csv", "csv", compiled=True, follows={"start_s": "end_s"})
    assert calls == ([0] if rows else [])
    assert (tmp_path / "short.csv").read_bytes() == pyarrow_bytes(columns, tmp_path)
