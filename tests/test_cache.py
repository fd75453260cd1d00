"""The fitted-profile cache (sim/costmodel/cache.py) and the column records (sim/serving/records.py, outputs)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costmodel import cache
from specbatch.commands.outputs import write_run, write_table
from sim.scheduler.layout import C_ITL_POS, C_REC_POS, N_COUNTERS
from sim.serving.records import STEP_DTYPE, Buffers
from sim.simulate import _fitted, simulate

ROOT = Path(__file__).resolve().parents[1]


def _run_bytes(config, out: Path) -> dict[str, bytes]:
    _fitted.cache_clear()  # the in-process caches would hide the disk cache
    cache.forget_recent_tables()
    write_run(simulate(config), out)
    return {name: (out / name).read_bytes() for name in ("requests.csv", "steps.csv", "summary.json")}


def test_the_key_covers_numpy_scipy_and_the_cpu(monkeypatch):
    """A fit computed with another numpy or scipy, or on another CPU (a cache folder shared between
    machines), is not this machine's to the last bit: each is part of the code version."""
    import scipy

    numerics = cache._numerics()
    assert np.__version__.encode() in numerics and scipy.__version__.encode() in numerics
    simd = np.show_config(mode="dicts")["SIMD Extensions"]
    assert all(feature.encode() in numerics for feature in simd.get("found", []))  # this CPU's, as numpy saw it
    monkeypatch.setattr(cache, "_numerics", lambda: numerics.replace(np.__version__.encode(), b"0.0.0"))
    assert cache._code_version() != cache.CODE_VERSION


def _entries(folder: Path) -> list[Path]:
    """The cache's entries: its files (the folder also holds numba's compiled rules when this
    process compiled them first, under the same variable)."""
    return sorted(p for p in folder.iterdir() if p.is_file())


def test_results_are_byte_identical_cold_warm_and_uncached(tmp_path, monkeypatch, run_config):
    from sim import stability

    config = run_config(workload__num_requests=150, workload__rate=5.0)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(stability, "_T_QUANTILES", {})  # as in a fresh process, whatever ran here before
    cold = _run_bytes(config, tmp_path / "cold")
    entries = [p.name for p in _entries(tmp_path / "cache")]
    assert len(entries) == 3 and sum(name.startswith("stdtrit-") for name in entries) == 1, entries
    # the fitted model, one step table and the growth check's t quantile
    warm = _run_bytes(config, tmp_path / "warm")
    monkeypatch.setenv(cache.ENV, "")
    off = _run_bytes(config, tmp_path / "off")
    assert cold == warm == off


def test_a_vllm_v1_table_caches_its_chunk_row_under_its_token_budget(tmp_path, monkeypatch, run_config):
    """A vllm-v1 run's step table carries the prefill-chunk prices: cached with them, keyed by the
    token budget (two budgets, two tables), and read back to the last bit."""
    def config(budget):
        return run_config(workload__num_requests=80, workload__rate=20.0, engine__scheduler="vllm-v1",
                          engine__max_num_batched_tokens=budget)

    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    cold = _run_bytes(config(512), tmp_path / "cold")
    assert b"prefill_tokens" in cold["steps.csv"] and b"num_preemptions" in cold["requests.csv"]
    warm = _run_bytes(config(512), tmp_path / "warm")
    _run_bytes(config(1024), tmp_path / "other")
    assert len(_entries(tmp_path / "cache")) == 3  # the model and one table per budget
    monkeypatch.setenv(cache.ENV, "")
    assert cold == warm == _run_bytes(config(512), tmp_path / "off")


def test_runs_whose_longest_requests_round_to_the_same_columns_share_one_table(tmp_path, monkeypatch, run_config):
    """A search runs many rates and seeds, each with another longest request; the step table is a function of
    its column widths alone, so one entry serves them all, to the last bit of an uncached run's results."""
    from sim.costmodel.model import column_widths
    from sim.simulate import prepare

    configs = [run_config(workload__num_requests=150, workload__rate=5.0, seed=seed) for seed in (0, 2, 3)]
    longest = []
    for config in configs:
        requests = prepare(config).requests
        longest.append((int((requests.prompt_tokens + requests.output_tokens).max()), int(requests.prompt_tokens.max())))
    assert len(set(longest)) == 3 and len({column_widths(*pair) for pair in longest}) == 1, longest
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    cached = [_run_bytes(config, tmp_path / f"seed{config.seed}") for config in configs]
    tables = [p for p in _entries(tmp_path / "cache") if "-" in p.stem and not p.name.startswith("stdtrit-")]
    assert len(tables) == 1, tables
    monkeypatch.setenv(cache.ENV, "")
    assert cached == [_run_bytes(config, tmp_path / f"off{config.seed}") for config in configs]


def test_a_process_keeps_its_recent_tables_in_memory_within_a_bound(tmp_path, monkeypatch, run_config):
    """A worker that runs many scenarios reads each table from disk once; a run served from memory has the
    bytes of one served from disk; the tables kept stay within RECENT_TABLES_BYTES (at least the last)."""
    from sim.simulate import prepare

    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    cache.forget_recent_tables()
    reads = []
    real_load = cache.load
    monkeypatch.setattr(cache, "load", lambda key: reads.append(key) or real_load(key))
    configs = [run_config(workload__num_requests=60, workload__rate=5.0, policy__k=k) for k in (1, 2, 3)]
    first = [prepare(config).table for config in configs]
    table_reads = [key for key in reads if "-" in key]
    assert len(table_reads) == 3
    again = [prepare(config).table for config in configs]
    assert [key for key in reads if "-" in key] == table_reads  # from memory: not read again
    assert all(a is b for a, b in zip(first, again))
    from_memory = _written(simulate(configs[0]), tmp_path / "memory")
    cache.forget_recent_tables()
    assert _written(simulate(configs[0]), tmp_path / "disk") == from_memory
    one = cache._table_bytes(first[0])
    monkeypatch.setattr(cache, "RECENT_TABLES_BYTES", 2 * one + one // 2)
    for config in configs:
        prepare(config)
    assert len(cache._recent) == 2 and cache._recent_table(list(cache._recent)[-1]) is not None
    monkeypatch.setattr(cache, "RECENT_TABLES_BYTES", 0)
    prepare(configs[0])
    assert len(cache._recent) == 1  # the table just made is kept whatever the bound


def _written(result, out: Path) -> dict[str, bytes]:
    write_run(result, out)
    return {name: (out / name).read_bytes() for name in ("requests.csv", "steps.csv", "summary.json")}


def test_step_table_arrays_round_trip_with_and_without_chunks(tmp_path, monkeypatch):
    from sim.costmodel.model import StepTable

    monkeypatch.setenv(cache.ENV, "")
    _fitted.cache_clear()
    from sim.simulate import profile_and_costs

    _, model, _ = profile_and_costs("h100-llama-3.1-8b-llama-3.2-1b")
    for chunk_tokens in (0, 2048):
        table = model.tabulate(4, 2, 300, 200, True, chunk_tokens=chunk_tokens)
        back = StepTable.from_arrays(dict(np.load(_saved(tmp_path, table.arrays()))))
        assert back == table and (back.chunk is None) == (chunk_tokens == 0)


def _saved(tmp_path, arrays) -> Path:
    path = tmp_path / "t.npz"
    np.savez(path, **arrays)
    return path


def test_a_corrupt_or_foreign_entry_is_ignored_and_rewritten(tmp_path, monkeypatch, run_config):
    config = run_config(workload__num_requests=60, workload__rate=5.0)
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.ENV, str(folder))
    good = _run_bytes(config, tmp_path / "a")
    entries = lambda: _entries(folder)  # noqa: E731
    for i, entry in enumerate(entries()):
        entry.write_bytes(b"not a zip file" if i == 0 else entry.read_bytes()[:100])  # corrupt, truncated
    assert _run_bytes(config, tmp_path / "b") == good
    assert all(cache.load(p.stem) is not None for p in entries())  # rewritten whole
    np.savez(entries()[0], unrelated=np.arange(3))  # readable, wrong content
    assert _run_bytes(config, tmp_path / "c") == good


def _entry_arrays() -> dict[str, np.ndarray]:
    """What entries hold: float tables (C and Fortran order), integers, booleans, 0-d scalars, a JSON string."""
    rng = np.random.default_rng(5)
    return {"decode": rng.random((7, 300, 5)), "fortran": np.asfortranarray(rng.random((40, 3))),
            "ints": np.arange(-50, 50, dtype=np.int64), "small": np.arange(9, dtype=np.int32).reshape(3, 3),
            "flags": np.array([True, False, True]), "k_max": np.array(7), "step": np.array(2.5),
            "meta": np.array(json.dumps({"name": "p", "grid": [1, 2, 4]})), "empty": np.zeros((0, 4))}


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_an_entry_reads_back_mapped_as_numpy_loads_it(tmp_path, monkeypatch, save):
    """A stored entry's arrays are views of its file mapped copy-on-write (a compressed one, which cannot be,
    is read whole): the names, dtypes, shapes, order and values numpy's own reader gives, writable without
    writing the file."""
    import mmap

    monkeypatch.setenv(cache.ENV, str(tmp_path))
    arrays = _entry_arrays()
    save(tmp_path / "k.npz", **arrays)
    before = (tmp_path / "k.npz").read_bytes()
    back = cache.load("k")
    with np.load(tmp_path / "k.npz", allow_pickle=False) as entry:
        assert list(back) == entry.files
        for name in entry.files:
            expected = entry[name]
            assert back[name].dtype == expected.dtype and back[name].shape == expected.shape
            assert back[name].flags.f_contiguous == expected.flags.f_contiguous
            assert np.array_equal(back[name], expected)
    assert all(isinstance(a.base, mmap.mmap) for a in back.values()) == (save is np.savez)
    assert all(a.flags.writeable for a in back.values())
    back["decode"][:] = 0.0
    assert (tmp_path / "k.npz").read_bytes() == before


def test_an_entry_whose_members_are_damaged_or_hold_objects_is_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path))
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    assert cache.load("objects") is None  # as np.load without pickles refuses them
    np.savez(tmp_path / "header.npz", **_entry_arrays())
    data = bytearray((tmp_path / "header.npz").read_bytes())
    at = data.index(b"\x93NUMPY")
    data[at:at + 6] = b"XXXXXX"  # the first array's .npy magic
    (tmp_path / "header.npz").write_bytes(bytes(data))
    assert cache.load("header") is None
    np.savez(tmp_path / "short.npz", **_entry_arrays())
    data = bytearray((tmp_path / "short.npz").read_bytes())
    at = data.index(b"'shape': (7, 300, 5)")
    data[at:at + 20] = b"'shape': (9, 900, 9)"  # more values than the member holds
    (tmp_path / "short.npz").write_bytes(bytes(data))
    assert cache.load("short") is None
    np.savez(tmp_path / "within.npz", **_entry_arrays())
    data = bytearray((tmp_path / "within.npz").read_bytes())
    at = data.index(b"'shape': (40, 3)")
    data[at:at + 16] = b"'shape': (40, 4)"  # more than the member holds, fewer than the file does
    (tmp_path / "within.npz").write_bytes(bytes(data))
    assert cache.load("within") is None


def test_an_unwritable_cache_folder_leaves_the_run_uncached(tmp_path, monkeypatch, run_config):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv(cache.ENV, str(blocker / "cache"))
    config = run_config(workload__num_requests=40, workload__rate=5.0)
    monkeypatch.setenv(cache.ENV, "")
    expected = _run_bytes(config, tmp_path / "a")
    monkeypatch.setenv(cache.ENV, str(blocker / "cache"))
    assert _run_bytes(config, tmp_path / "b") == expected


def test_the_key_follows_the_profile_content(tmp_path, synthetic_profile):
    import shutil

    copy = tmp_path / "p"
    shutil.copytree(synthetic_profile, copy)
    files = lambda d: [d / "profile.csv", d / "profile.json"]  # noqa: E731
    assert cache.profile_digest(files(copy)) == cache.profile_digest(files(synthetic_profile))
    with (copy / "profile.csv").open("a") as handle:
        handle.write("\n")
    assert cache.profile_digest(files(copy)) != cache.profile_digest(files(synthetic_profile))


def test_a_warm_run_imports_neither_pandas_nor_scipy(tmp_path):
    """Start-up: a run whose profile is cached pays for no fit (scipy's optimizers), no pandas and no
    scipy.stats (the post-run queue check takes its t quantile from scipy.special). (numba
    imports scipy's bare package, a few milliseconds, when it starts: not what this guards.)"""
    from tests.conftest import cache_with_compiled_engine

    env = {"SPECBATCH_CACHE_DIR": str(cache_with_compiled_engine(tmp_path / "cache")), "PATH": "/usr/bin:/bin",
           "SPECBATCH_BACKGROUND_COMPILE": "0"}
    script = ("import sys; from specbatch.commands.cli import main; "
              "main(['run', '--num-requests', '200', '--out', sys.argv[1]]); "
              "loaded = [m for m in ('pandas', 'scipy.optimize', 'scipy.interpolate', 'scipy.stats') if m in sys.modules "
              "and type(sys.modules[m]).__name__ != '_LazyModule']; print(loaded)")
    first = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a")], cwd=ROOT, env=env,
                           capture_output=True, text=True, check=True)
    assert "scipy.optimize" in first.stdout  # the cold run fitted the curves
    second = subprocess.run([sys.executable, "-c", script, str(tmp_path / "b")], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=True)
    assert second.stdout.strip().splitlines()[-1] == "[]"
    assert "queue" in json.loads((tmp_path / "b" / "summary.json").read_text())  # the post-run check ran (no scipy.stats)
    assert (tmp_path / "a" / "requests.csv").read_bytes() == (tmp_path / "b" / "requests.csv").read_bytes()


def test_a_warm_run_loads_the_compiled_engine_without_numbas_lowering_registries(tmp_path):
    """Start-up: loading the cached compiled rules skips numba's context refresh (sim.jit), which
    imports its implementation modules (numba.np.arraymath and the rest). (A compile still refreshes:
    the session's cache, tests.conftest, is compiled in-process with the same rules; and compiled
    runs give the interpreted bytes: tests/test_decode_runs.py.)"""
    from tests.conftest import cache_with_compiled_engine

    env = {"SPECBATCH_CACHE_DIR": str(cache_with_compiled_engine(tmp_path / "cache")), "PATH": "/usr/bin:/bin",
           "SPECBATCH_BACKGROUND_COMPILE": "0"}
    script = ("import sys; from specbatch.commands.cli import main; "
              "main(['run', '--num-requests', '300', '--jit', 'on', '--out', sys.argv[1], '--quiet']); "
              "print([m for m in ('numba.np.arraymath', 'numba.np.npyimpl') if m in sys.modules])")
    warm = subprocess.run([sys.executable, "-c", script, str(tmp_path / "warm")], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    assert warm.stdout.strip().splitlines()[-1] == "[]"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 90)), max_size=60), st.integers(1, 9))
def test_buffers_grow_keeping_every_row_written(batches, capacity):
    """Records written in place, room made before each batch (as the loop and the compiled runs do):
    every row and gap written is there after any number of doublings."""
    ctr = np.zeros(N_COUNTERS, dtype=np.int64)
    buffers = Buffers(ctr, capacity=capacity)
    written_steps, written_gaps = [], []
    for steps, gaps in batches:
        buffers.room(steps, gaps)
        for _ in range(steps):
            value = float(len(written_steps))
            buffers.steps[ctr[C_REC_POS]]["start_s"] = value
            written_steps.append(value)
            ctr[C_REC_POS] += 1
        for _ in range(gaps):
            buffers.itl_values[ctr[C_ITL_POS]], buffers.itl_weights[ctr[C_ITL_POS]] = len(written_gaps), 2
            written_gaps.append(len(written_gaps))
            ctr[C_ITL_POS] += 1
    assert buffers.step_columns(v1=True)["start_s"].tolist() == written_steps
    values, weights = buffers.itl()
    assert values.tolist() == written_gaps and (weights == 2).all()
    assert set(buffers.step_columns(v1=False)) == set(STEP_DTYPE.names) - {"prefill_tokens", "kv_blocks", "preemptions"}


def test_buffers_grow_keeping_every_field_of_every_record():
    """Growing copies the records as bytes (a packed record dtype copied field by field was ten times
    slower): every field of every record survives each doubling, as a field-by-field copy keeps it."""
    ctr = np.zeros(N_COUNTERS, dtype=np.int64)
    buffers = Buffers(ctr, capacity=3)
    rng = np.random.default_rng(7)
    expected = np.zeros(0, STEP_DTYPE)
    for steps in (2, 5, 1, 17, 40, 3):
        buffers.room(steps, 0)
        rows = np.zeros(steps, STEP_DTYPE)
        for name in STEP_DTYPE.names:
            kind = STEP_DTYPE[name]
            rows[name] = rng.random(steps) * 1e3 if kind.kind == "f" else rng.integers(-100, 100, steps).astype(kind)
        pos = int(ctr[C_REC_POS])
        buffers.steps[pos:pos + steps] = rows
        ctr[C_REC_POS] += steps
        expected = np.concatenate((expected, rows))
    assert buffers.steps.shape[0] >= len(expected) > 3
    assert buffers.steps[:len(expected)].tobytes() == expected.tobytes()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_csv_floats_read_back_as_the_same_float64(values):
    """CSV records carry every bit: what a reader parses is what the run computed."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        write_table({"x": np.array(values)}, path, "csv")
        assert [float(cell) for cell in path.read_text().split()[1:]] == values


def test_csv_cells_nulls_and_labels(tmp_path):
    columns = {"request_id": np.arange(3), "tpot_s": np.array([0.123456789123, np.nan, 2.0]),
               "label": np.array(["chat", "a,b", 'say "hi"'], dtype=object)}
    write_table(columns, tmp_path / "t.csv", "csv")
    assert (tmp_path / "t.csv").read_text() == 'request_id,tpot_s,label\n0,0.123456789123,"chat"\n1,,"a,b"\n' \
                                               '2,2,"say ""hi"""\n'
    plain = {"x": np.array([1.0, 0.5]), "label": np.array(["chat", "code"], dtype=object)}
    write_table(plain, tmp_path / "p.csv", "csv")
    assert (tmp_path / "p.csv").read_text() == "x,label\n1,chat\n0.5,code\n"


def test_parquet_keeps_full_precision(tmp_path):
    import pyarrow.parquet as pq

    columns = {"x": np.array([0.1 + 0.2, np.nan]), "k": np.array([1, 2], dtype=np.int8)}
    write_table(columns, tmp_path / "t.parquet", "parquet")
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.column("x").to_pylist()[0] == 0.1 + 0.2 and np.isnan(table.column("x").to_pylist()[1])
    assert str(table.schema.field("k").type) == "int8"


def test_trace_fast_reader_agrees_with_the_line_reader(tmp_path, monkeypatch):
    """pyarrow's reader (workloads.trace.read_trace_columns) gives what the line-by-line reader gives."""
    import workloads.trace as trace

    rng = np.random.default_rng(3)
    n = 500
    alpha = np.where(rng.random(n) < 0.3, np.nan, rng.uniform(0.05, 0.95, n))
    requests = trace.Requests(np.sort(rng.uniform(0, 100, n)), rng.integers(1, 999, n), rng.integers(1, 999, n),
                              alpha=alpha, label=rng.choice(["chat", "code", "long, quoted"], n))
    path = tmp_path / "t.csv"
    trace.write_trace(path, requests)
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0], *text[1:][::-1]]) + "\n")  # unsorted: ties keep file order
    assert trace.read_trace_columns(path) is not None  # the fast reader took it (no silent fallback)
    fast = trace.read_trace(path)
    monkeypatch.setattr(trace, "read_trace_columns", lambda p: None)
    slow = trace.read_trace(path)
    for field in ("arrival_s", "prompt_tokens", "output_tokens", "alpha", "label"):
        a, b = getattr(fast, field), getattr(slow, field)
        assert a.dtype == b.dtype and (np.array_equal(a, b, equal_nan=True) if a.dtype != object else list(a) == list(b))


@pytest.mark.parametrize("body", ["1,2,x\n", "1,2\n", "NA,2,3\n", "-1,2,3\n", "1,0,3\n", "nan,2,3\n", "1,2.5,3\n"])
def test_trace_fast_reader_leaves_bad_lines_to_the_line_reader(tmp_path, body):
    import workloads.trace as trace

    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,5\n" + body)
    assert trace.read_trace_columns(path) is None
    with pytest.raises(trace.TraceError) as info:
        trace.read_trace(path)
    assert info.value.line == 3


@pytest.mark.parametrize("body,field", [
    ("1e10,2,3\n", "arrival_s"),             # beyond workloads.limits.MAX_TIME_S
    ("1,2147483648,3\n", "prompt_tokens"),   # beyond MAX_TOKENS (pyarrow reads it as an int64)
    ("1,2,2147483648\n", "output_tokens"),
    ("1,\u0661\u0662,3\n", "prompt_tokens"),  # Arabic-Indic digits: Python's int() would read them
])
def test_trace_fast_reader_keeps_the_line_readers_bounds(tmp_path, body, field):
    import workloads.trace as trace

    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,5\n" + body, encoding="utf-8")
    assert trace.read_trace_columns(path) is None
    with pytest.raises(trace.TraceError) as info:
        trace.read_trace(path)
    assert (info.value.line, info.value.field) == (3, field)


def test_trace_fast_reader_refuses_a_file_not_utf8_even_in_an_ignored_column(tmp_path):
    import workloads.trace as trace

    path = tmp_path / "t.csv"
    path.write_bytes(b"arrival_s,prompt_tokens,output_tokens,note\n0,5,5,ok\n1,2,3,caf\xe9\n")
    assert trace.read_trace_columns(path) is None
    with pytest.raises(trace.TraceError) as info:
        trace.read_trace(path)
    assert info.value.line == 3 and "not UTF-8" in info.value.message


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_tables_written_in_slices_read_back_whole(tmp_path, monkeypatch, fmt):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    import specbatch.commands.outputs as outputs

    columns = {"i": np.arange(1000), "x": np.linspace(0, 1, 1000)}
    monkeypatch.setattr(outputs, "SLICE_ROWS", 64)
    write_table(columns, tmp_path / f"t.{fmt}", fmt)
    table = pq.read_table(tmp_path / "t.parquet") if fmt == "parquet" else pacsv.read_csv(tmp_path / "t.csv")
    assert table.num_rows == 1000 and table.column("i").to_pylist() == list(range(1000))
    assert np.array_equal(table.column("x").to_numpy(), columns["x"])


def test_the_documented_record_widths_hold():
    """docs/performance.md states these bytes per step and per ITL entry."""
    buffers = Buffers(np.zeros(N_COUNTERS, dtype=np.int64))
    assert STEP_DTYPE.itemsize == 62
    assert buffers.itl_values.itemsize + buffers.itl_weights.itemsize == 12
    page = (ROOT / "docs" / "performance.md").read_text()
    assert "| 62 |" in page and "(float64 gap, int32 count) | 12 |" in page



def test_ctrl_c_inside_a_lazy_import_is_an_interrupt(monkeypatch, capsys):
    """pandas and scipy are imported on first use, mid-run; Ctrl-C during an import can surface as
    another error (a half-initialised module). After a SIGINT it is still exit 130 with one line."""
    import signal

    import specbatch.commands.cli as cli

    def interrupted_import(argv):
        try:
            # raise(3), to this thread: os.kill may land on another thread (pyarrow's, numba's) and
            # the handler then runs after the error below, which made this test flaky
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # swallowed, as a library's import may
        raise AttributeError("module 'pandas' has no attribute 'DataFrame'")

    monkeypatch.setattr(cli, "_dispatch", interrupted_import)
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are the main thread's")
    # Python's own handler, as a `specbatch` started from a terminal has: a process started as a shell's
    # background job inherits SIGINT ignored (Python then leaves it so, and there is no Ctrl-C to note)
    found = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli.main(["run"]) == 130
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back as it was
    finally:
        if found is not None:  # None: set from C, which Python cannot put back
            signal.signal(signal.SIGINT, found)
    assert capsys.readouterr().err.startswith("interrupted: nothing was written")


def test_ctrl_c_is_noted_under_a_host_s_own_sigint_handler(monkeypatch, capsys):
    """Inside a host that handles SIGINT itself (Jupyter's kernel, a test runner), the failure that
    follows a Ctrl-C is still the interrupt, and the host's handler still runs and stays in place."""
    import signal

    import specbatch.commands.cli as cli

    hosted = []

    def host(signum, frame):
        hosted.append(signum)
        raise KeyboardInterrupt

    def interrupted_import(argv):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        raise AttributeError("module 'scipy' has no attribute 'special'")

    monkeypatch.setattr(cli, "_dispatch", interrupted_import)
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are the main thread's")
    previous = signal.signal(signal.SIGINT, host)
    try:
        assert cli.main(["run"]) == 130
        assert signal.getsignal(signal.SIGINT) is host and hosted == [signal.SIGINT]
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().err.startswith("interrupted: nothing was written")


def test_the_cache_keeps_under_its_limit_dropping_the_least_recently_used(tmp_path, monkeypatch):
    import os

    from sim.costmodel import cache

    monkeypatch.setenv(cache.ENV, str(tmp_path))
    monkeypatch.setenv(cache.MAX_ENV, "0.51")  # 510 kB: five entries fit, six do not
    payload = {"x": np.zeros(100_000 // 8)}  # ~100 kB an entry
    for i in range(4):
        cache.store(f"e{i}", payload)
        os.utime(tmp_path / f"e{i}.npz", (1000 + i, 1000 + i))  # stored in this order, a second apart
    assert cache.load("e0") is not None  # a hit: e0 is now the most recently used
    cache.store("e4", payload)  # 5 x 100 kB: at the limit, nothing goes
    assert sorted(p.stem for p in tmp_path.glob("*.npz")) == ["e0", "e1", "e2", "e3", "e4"]
    cache.store("e5", payload)  # past it: the least recently used go until 80% (408 kB) is left
    assert sorted(p.stem for p in tmp_path.glob("*.npz")) == ["e0", "e3", "e4", "e5"]
    assert sum(p.stat().st_size for p in tmp_path.glob("*.npz")) <= cache.max_bytes()


def test_a_bad_cache_limit_falls_back_to_the_default(monkeypatch):
    from sim.costmodel import cache

    monkeypatch.setenv(cache.MAX_ENV, "lots")
    assert cache.max_bytes() == cache.DEFAULT_MAX_MB * 1_000_000


def test_freed_pages_are_given_back_after_each_block_written_and_each_replica_merged(run_config, monkeypatch,
                                                                                       tmp_path):
    """sim/heap.py's release runs where a long run frees most: each block of a steps file written while
    the engine runs, and each replica's records merged into a cluster's."""
    from sim import cluster, heap
    from specbatch.commands import outputs
    from sim.simulate import execute, prepare

    calls = []
    monkeypatch.setattr(cluster, "release_freed", lambda: calls.append("merged"))
    monkeypatch.setattr(outputs, "release_freed", lambda: calls.append("written"))
    execute(prepare(run_config(workload__num_requests=60, workload__rate=8.0, cluster__replicas=3)))
    assert calls == ["merged"] * 3
    steps = outputs.StepsFile(tmp_path / "steps.csv")
    steps.start(["start_s"])
    steps.rows(np.zeros(4, [("start_s", np.float64)]), 0, 4)
    steps.holds(None)  # waits for the write
    steps.close()
    assert calls[3:] == ["written"]
    heap.release_freed()  # the real one: harmless wherever it runs (a no-op off glibc)
