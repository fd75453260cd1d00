"""An on-disk cache of fitted cost models and step tables, so a process pays a profile's fit once.

Fitting a profile's curves (least squares, scipy) and tabulating the step table cost
about a second, more than a 10,000-request run's engine; a sweep or a capacity search
pays it again in every worker process. Both are pure functions of the profile's bytes,
the code that computes them and (for the table) the reach of the run, so they are kept
on disk under a key that hashes exactly those:

* the fitted model: ``<profile digest>.npz``, the digest over ``profile.csv``,
  ``profile.json`` and :data:`CODE_VERSION` (the code, numpy's build and the SIMD
  extensions it found, scipy's version and the CPU model);
* a step table: ``<profile digest>-<reach digest>.npz``, the reach taken as the table's column
  widths (:func:`step_table`), and the most recent kept in the process's memory too.

The folder is ``$SPECBATCH_CACHE_DIR`` if set (empty: no cache), else
``$XDG_CACHE_HOME/specbatch``, else ``~/.cache/specbatch``. Entries are arrays only
(``numpy.savez``, no pickles), written whole via :mod:`sim.atomic_write` and read back mapped
(:func:`load`); one that cannot be read (truncated, corrupt, from other code) is ignored and rewritten. A
folder that cannot be written leaves the run uncached, never failed. The entries are kept
under ``$SPECBATCH_CACHE_MAX_MB`` megabytes (default :data:`DEFAULT_MAX_MB`): a store that
takes them past it removes the least recently used (a hit marks an entry used) down to
80% of it, so a machine that runs many profiles and reaches never fills its disk. A cached value
is the computed one to the last bit, so results are byte-identical with or without it
(tests/test_cache.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import functools
import json
import math
import mmap
import os
import struct
import sys
import threading
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

import sim
from sim.atomic_write import write_file
from sim.costmodel.model import CostModel, StepTable, column_widths
from sim.costmodel.profile import Profile, load_profile

ENV = "SPECBATCH_CACHE_DIR"
MAX_ENV = "SPECBATCH_CACHE_MAX_MB"
DEFAULT_MAX_MB = 2048  # a few hundred step tables (~10 MB each at the default batch of 256)
# The code whose output is cached: a change to any of these files is a new cache key.
_SOURCES = ("curves.py", "model.py", "profile.py", "cache.py")


def _code_version() -> str:
    digest = hashlib.sha256(sim.__version__.encode())
    here = Path(__file__).parent
    for name in _SOURCES:
        digest.update((here / name).read_bytes())
    digest.update(_numerics())
    return digest.hexdigest()[:16]


def _numerics() -> bytes:
    """What else decides a fit's last bits: numpy's build (its BLAS and the SIMD extensions it
    found on this CPU), scipy's version (its version file, read without importing scipy) and
    the CPU model (BLAS picks its kernels by it), so that a cache folder shared between
    machines, or kept across an upgrade, never hands back a fit this machine would not compute."""
    config = np.show_config(mode="dicts")
    parts = [np.__version__.encode(), os.uname().machine.encode() if hasattr(os, "uname") else b"",
             json.dumps({key: config.get(key) for key in ("Build Dependencies", "SIMD Extensions")},
                        sort_keys=True, default=str).encode()]
    spec = importlib.util.find_spec("scipy")
    version_file = Path(spec.origin).parent / "version.py" if spec is not None and spec.origin else None
    parts.append(version_file.read_bytes() if version_file is not None and version_file.is_file() else b"")
    try:
        with open("/proc/cpuinfo", "rb") as info:  # the first CPU's lines are enough (x86: model name; Arm: part)
            for line in info:
                if line.startswith((b"model name", b"CPU implementer", b"CPU part", b"CPU variant")):
                    parts.append(line)
                elif not line.strip():
                    break
    except OSError:
        pass
    return b"\0".join(parts)


CODE_VERSION = _code_version()


def cache_dir() -> Path | None:
    """Where entries live, or None when caching is off (``SPECBATCH_CACHE_DIR=""``)."""
    if ENV in os.environ:
        value = os.environ[ENV]
        return Path(value) if value else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specbatch"


def profile_digest(files: list[Path]) -> str:
    """A profile's content key: its files' bytes and the code version."""
    digest = hashlib.sha256(CODE_VERSION.encode())
    for path in files:
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<absent>")
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def reach_digest(reach: dict) -> str:
    return hashlib.sha256(json.dumps(reach, sort_keys=True).encode()).hexdigest()[:16]


def load(key: str) -> dict[str, np.ndarray] | None:
    """The arrays stored under ``key``, or None (no cache, absent, or unreadable: then it is rewritten)."""
    folder = cache_dir()
    if folder is None:
        return None
    path = folder / f"{key}.npz"
    try:
        arrays = _mapped(path)
    except (OSError, ValueError, EOFError, KeyError, TypeError, struct.error, zipfile.BadZipFile):
        return None
    try:
        os.utime(path)  # used now: the last to go when the cache is trimmed
    except OSError:
        pass
    return arrays


def _mapped(path: Path) -> dict[str, np.ndarray]:
    """An entry's arrays as views of its file mapped copy-on-write, not read into memory. ``np.load`` of a
    step table (10-14 MB) took 16-30 ms, a checksum over every byte and a copy; mapped, 2 ms, and its pages
    come from the page cache as the run reads them, shared by a search's workers. ``np.savez`` stores
    each array uncompressed as an ``.npy`` member, so each lies at a known offset of the file; an entry
    stored otherwise is read by ``np.load``. (numpy maps ``.npy`` files, not the members of an ``.npz``.)"""
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)  # writable views: never written back
    arrays = {}
    with zipfile.ZipFile(mapped) as archive:
        for member in archive.infolist():
            if member.compress_type != zipfile.ZIP_STORED or not member.filename.endswith(".npy"):
                return _read(path)
            at = member.header_offset  # the member's local header: 30 bytes, then its name and extra field
            if mapped[at:at + 4] != b"PK\x03\x04":
                raise ValueError(f"{path}: no local header for {member.filename}")
            name_length, extra_length = struct.unpack("<HH", mapped[at + 26:at + 30])
            start = at + 30 + name_length + extra_length
            npy = io.BytesIO(mapped[start:start + min(member.file_size, 1 << 16)])
            version = np.lib.format.read_magic(npy)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(npy)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(npy)
            else:
                return _read(path)
            if dtype.hasobject:  # as np.load without pickles refuses them
                raise ValueError(f"{path}: {member.filename} holds Python objects")
            if npy.tell() + math.prod(shape) * dtype.itemsize != member.file_size:
                raise ValueError(f"{path}: {member.filename} does not hold the array its header describes")
            arrays[member.filename[:-4]] = np.ndarray(shape, dtype, buffer=mapped, offset=start + npy.tell(),
                                                      order="F" if fortran else "C")
    return arrays


def _read(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as entry:
        return {name: entry[name] for name in entry.files}


def store(key: str, arrays: dict[str, np.ndarray]) -> None:
    """Keep ``arrays`` under ``key``, whole or not at all; a folder that cannot be written is skipped."""
    folder = cache_dir()
    if folder is None:
        return
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    try:
        write_file(folder / f"{key}.npz", buffer.getvalue())
    except OSError:
        return
    trim(folder, keep=folder / f"{key}.npz")


def max_bytes() -> int:
    """The cache's size limit: ``$SPECBATCH_CACHE_MAX_MB`` megabytes (a bad value: the default, said in
    one warning line; the cache is an optimisation, so a bad limit does not stop a run)."""
    text = os.environ.get(MAX_ENV)
    if text is None:
        return DEFAULT_MAX_MB * 1_000_000
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = math.nan
    if not (math.isfinite(megabytes) and megabytes >= 0):
        _say_bad_limit(text)
        return DEFAULT_MAX_MB * 1_000_000
    return int(megabytes * 1e6)


@functools.lru_cache(maxsize=None)
def _say_bad_limit(text: str) -> None:
    """One line on stderr, once per process and value."""
    print(f"warning: {MAX_ENV}={text!r} is not a number of megabytes (>= 0); the cache keeps the default "
          f"{DEFAULT_MAX_MB} MB", file=sys.stderr)


def trim(folder: Path, keep: Path | None = None) -> int:
    """Remove the least recently used entries while the folder's ``.npz`` files exceed the limit,
    down to 80% of it (``keep``, the entry just written, stays); returns the bytes removed.
    Processes sharing the folder may trim at once: an entry already gone is skipped."""
    limit = max_bytes()
    entries = []
    for path in folder.glob("*.npz"):
        try:
            stat = path.stat()
        except OSError:
            continue
        entries.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    if total <= limit:
        return 0
    removed = 0
    for _, size, path in sorted(entries, key=lambda e: (e[0], str(e[2]))):
        if total - removed <= 0.8 * limit:
            break
        if path == keep:
            continue
        try:
            path.unlink()
        except OSError:
            continue
        removed += size
    return removed


class CachedProfile(Profile):
    """A profile read back from the cache: its sidecar and k_max; the measured points are read
    from its files only if something asks for them (nothing on a run's path does)."""

    def __init__(self, path: Path, meta: dict, k_max: int) -> None:  # noqa: super().__init__ would need the points
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "meta", meta)
        object.__setattr__(self, "_k_max", k_max)

    @property
    def k_max(self) -> int:
        return self._k_max

    @property
    def points(self):
        return self._loaded().points

    @property
    def skipped(self):
        return self._loaded().skipped

    def _loaded(self) -> Profile:
        if "_full" not in self.__dict__:
            object.__setattr__(self, "_full", load_profile(self.path))
        return self.__dict__["_full"]


def fitted_profile(directory: Path, key: str, fit=CostModel) -> tuple[Profile, CostModel]:
    """The profile in ``directory`` and its fitted cost model: from the cache, or loaded, fitted and
    cached. ``key``: the profile's :func:`profile_digest`; ``fit``: profile -> CostModel.

    A hit skips :func:`~sim.costmodel.profile.load_profile`'s validation, and that is sound: an entry is
    stored only after the same bytes (the key hashes them) passed it and were fitted, under
    the same validating code (the key hashes profile.py too). A profile that fails is never
    stored, so it fails again on every run."""
    state = load(key)
    if state is not None and "meta" in state:
        try:
            profile = CachedProfile(directory, json.loads(str(state["meta"])), int(state["k_max"]))
            return profile, CostModel.from_state(profile, state)
        except (KeyError, ValueError, TypeError):
            pass  # from other code, or damaged: fit again and rewrite it
    profile = load_profile(directory)
    model = fit(profile)
    store(key, {"meta": np.array(json.dumps(profile.meta)), **model.state()})
    return profile, model


def step_table(model: CostModel, reach: dict, profile_key: str, chunk_tokens: int = 0,
               graphs: dict | None = None) -> StepTable:
    """``model.tabulate(**reach, chunk_tokens=..., **graphs)``: from this process's recent tables, else from the
    cache when this profile's table for this reach is there, else tabulated and stored (a vllm-v1 table's
    token budget is part of the key; its chunk row is stored; ``graphs``: tabulate's CUDA-graph padding
    arguments, part of the key when given).

    The key holds the reach's column widths (:func:`~sim.costmodel.model.column_widths`), not its longest
    context and prompt: the table is the same for every run whose longest request rounds to the same
    columns, so a search's runs at other rates and seeds share a few tables instead of tabulating one each."""
    graphs = graphs or {}
    key = f"{profile_key}-{reach_digest(table_inputs(reach, chunk_tokens, graphs))}"
    table = _recent_table(key)
    if table is not None:
        return table
    arrays = load(key)
    if arrays is not None:
        try:
            table = StepTable.from_arrays(arrays)
        except (KeyError, ValueError, TypeError):
            pass
    if table is None:
        table = model.tabulate(**reach, chunk_tokens=chunk_tokens, **graphs)
        store(key, table.arrays())
    _remember_table(key, table)
    return table


def table_inputs(reach: dict, chunk_tokens: int, graphs: dict) -> dict:
    """What a step table is a function of (its cache key's part beside the profile's)."""
    inputs = {name: value for name, value in reach.items() if name not in ("max_context", "max_prompt")}
    inputs["context_step"], inputs["prompt_step"] = column_widths(reach["max_context"], reach["max_prompt"])
    return {**inputs, "chunk_tokens": chunk_tokens, **graphs}


# A process that runs many scenarios (a tune's or a capacity search's worker, a notebook) asks for the same
# few tables again and again; reading one back from disk (~10 MB) costs about as much as a 3,000-request run's
# engine. The most recent are kept in memory, never more than RECENT_TABLES_BYTES of them: a table is never
# written to once made (the runs and the compiled code only read it), so runs may share one.
RECENT_TABLES_BYTES = 100_000_000
_recent: OrderedDict[str, StepTable] = OrderedDict()
_recent_lock = threading.Lock()


def _recent_table(key: str) -> StepTable | None:
    with _recent_lock:
        table = _recent.get(key)
        if table is not None:
            _recent.move_to_end(key)
        return table


def _remember_table(key: str, table: StepTable) -> None:
    with _recent_lock:
        _recent[key] = table
        while len(_recent) > 1 and sum(_table_bytes(t) for t in _recent.values()) > RECENT_TABLES_BYTES:
            _recent.popitem(last=False)


def forget_recent_tables() -> None:
    """Drop the tables kept in memory (for a test of the disk cache itself)."""
    with _recent_lock:
        _recent.clear()


def _table_bytes(table: StepTable) -> int:
    return sum(getattr(table, name).array.nbytes for name in StepTable._TABLES)
