"""A long table's CSV rows, compiled: the bytes pyarrow's CSV writer writes, sooner.

pyarrow's writer turns every cell into text through its cast to strings, integers included, and
then copies the texts into rows: at a million requests (four million steps, sixty million cells)
that is most of a run's writing. Here only the floats go through pyarrow's cast (its shortest
round-trip text, so every float reads back as the same float64, and the same bytes as before);
the integers are printed, and the rows put together, by one compiled function (:func:`format_rows`).

A float equal, bit for bit, to the one a row above it (in its own column, or in a column it is
said to follow: a step starts when the one before it ended) reuses that text instead of being
formatted again; a fixed alpha is formatted once per slice. NaN is an empty cell, as pyarrow
writes a null. The writer (specbatch/commands/outputs.py) takes this path for long tables of
numbers only, where the compiled code is already on disk (sim.warm compiles it with the engine);
anything else goes to pyarrow's writer, which gives the same bytes (tests/test_csv_rows.py).
"""

from __future__ import annotations

import numpy as np

RULES = ()  # nothing registered for the engine's rules: this module is compiled on its own (sim.jit)
# Shorter tables go to pyarrow's writer: loading the compiled code (about 10 ms, numba already up) costs
# about what 30,000 steps save (the 16,800-request real run's steps: 30,000 in 18 ms either way, 60,000 in
# 30 against 38 ms, all 108,000 in 43 against 68 ms).
MIN_ROWS = 50_000
_PAIRS = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode(), np.uint8).copy()  # "00" .. "99"


def applies(arrays: dict[str, np.ndarray], rows: int) -> bool:
    """Whether this path writes ``arrays``: long, and every column a float64 or an integer of at most 64 bits
    that prints as an int64 does (unsigned 64-bit ints and labels go to pyarrow)."""
    return rows >= MIN_ROWS and all(a.dtype == np.float64 or a.dtype.kind == "i" or
                                    (a.dtype.kind == "u" and a.dtype.itemsize < 8) for a in arrays.values())


def csv_rows(arrays: dict[str, np.ndarray], lo: int, hi: int, follows: dict[str, str], format_rows) -> np.ndarray:
    """Rows ``lo`` to ``hi`` of the columns as CSV bytes (no header), formatted by ``format_rows``
    (the compiled :func:`format_rows`). ``follows``: float columns whose value is often that of
    another float column one row above (``{"start_s": "end_s"}``)."""
    import pyarrow as pa

    names = list(arrays)
    n = hi - lo
    floats = [name for name in names if arrays[name].dtype.kind == "f"]
    ints = [name for name in names if arrays[name].dtype.kind != "f"]
    follows = {name: source for name, source in follows.items() if name in floats and source in floats}
    kinds = np.array([ints.index(name) if name in ints else -1 - floats.index(name) for name in names], np.int64)
    int_block = np.empty((len(ints), n), np.int64)
    int_width = 0  # the widest row of integers, as text: the rows' room (a few digits each, not an int64's 20)
    for row, name in enumerate(ints):
        int_block[row] = arrays[name][lo:hi]
        if n:
            int_width += max(len(str(int_block[row].min())), len(str(int_block[row].max())))
    starts, ends = np.empty((len(floats), n), np.int64), np.empty((len(floats), n), np.int64)
    texts, base = [], 0
    # A column another follows is formatted first: the follower's reused texts are its.
    for name in sorted(floats, key=lambda name: name in follows):
        column = floats.index(name)
        values = np.ascontiguousarray(arrays[name][lo:hi])
        bits = values.view(np.int64)
        source = follows.get(name)
        above = bits[:-1] if source is None else np.ascontiguousarray(arrays[source][lo:hi - 1]).view(np.int64)
        same = np.zeros(n, bool)
        same[1:] = bits[1:] == above  # bit for bit: -0.0 prints otherwise than 0.0, NaN is the same NaN
        fresh = np.flatnonzero(~same)
        formatted = values[fresh]
        text = _as_strings(pa.Array.from_buffers(pa.float64(), fresh.shape[0],
                                                 [_validity(formatted), pa.py_buffer(formatted)]))
        buffers = text.buffers()
        offsets = np.frombuffer(buffers[1], np.int32, fresh.shape[0] + 1, text.offset * 4).astype(np.int64)
        data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
        texts.append(data[offsets[0]:offsets[-1]])
        offsets += base - offsets[0]
        base = int(offsets[-1])
        starts[column, fresh], ends[column, fresh] = offsets[:-1], offsets[1:]
        repeat = np.flatnonzero(same)
        if repeat.shape[0]:
            if source is not None:  # the text of the source one row above
                of = floats.index(source)
                starts[column, repeat], ends[column, repeat] = starts[of, repeat - 1], ends[of, repeat - 1]
            else:  # the text of the last row above that was formatted (row 0 always is)
                last = np.maximum.accumulate(np.where(same, 0, np.arange(n)))[repeat]
                starts[column, repeat], ends[column, repeat] = starts[column, last], ends[column, last]
    text = np.concatenate(texts) if texts else np.zeros(0, np.uint8)
    # Room for every row: its floats' texts (a reused one is written again), its integers and separators.
    out = np.empty(int((ends - starts).sum()) + n * (int_width + len(names)), np.uint8)
    written = format_rows(kinds, int_block, text, starts, ends, n, out, _PAIRS)
    return out[:written]


def _as_strings(values):
    """pyarrow's cast of ``values`` to strings, called in its compute kernels' own module: ``Array.cast``
    imports ``pyarrow.compute``, whose wrappers of every compute function took 30 ms to build, more
    than a short run's whole table of floats takes to format (the same call, the same bytes)."""
    import pyarrow as pa

    try:
        from pyarrow._compute import CastOptions, call_function
    except ImportError:  # a pyarrow that keeps them elsewhere: the public way
        return values.cast(pa.string())
    return call_function("cast", [values], CastOptions.safe(pa.string()))


def _validity(values: np.ndarray):
    """NaN as a null (an empty cell, as pyarrow's writer prints a null)."""
    import pyarrow as pa

    nan = np.isnan(values)
    return pa.py_buffer(np.packbits(~nan, bitorder="little")) if nan.any() else None


def format_rows(kinds: np.ndarray, ints: np.ndarray, text: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                n: int, out: np.ndarray, pairs: np.ndarray) -> int:
    """Write ``n`` CSV rows into ``out``, returning the bytes written. Column c is the int row
    ``kinds[c]`` of ``ints`` (printed here: two digits at a time from ``pairs``) or, for
    ``kinds[c] = -1 - f``, float column f's text: ``text[starts[f, r]:ends[f, r]]`` in row r."""
    pos = 0
    columns = kinds.shape[0]
    ten, hundred = np.uint64(10), np.uint64(100)
    for r in range(n):
        for c in range(columns):
            kind = kinds[c]
            if kind >= 0:
                value = ints[kind, r]
                if value < 0:
                    out[pos] = 45  # '-'
                    pos += 1
                    u = np.uint64(-(value + 1)) + np.uint64(1)  # int64's least value too
                else:
                    u = np.uint64(value)
                digits = 1
                rest = u
                while rest >= ten:
                    rest //= ten
                    digits += 1
                end = pos + digits
                while u >= hundred:
                    q = u // hundred
                    d = (u - q * hundred) * np.uint64(2)
                    out[end - 1] = pairs[d + np.uint64(1)]
                    out[end - 2] = pairs[d]
                    end -= 2
                    u = q
                if u >= ten:
                    d = u * np.uint64(2)
                    out[end - 1] = pairs[d + np.uint64(1)]
                    out[end - 2] = pairs[d]
                else:
                    out[end - 1] = np.uint8(48) + np.uint8(u)
                pos += digits
            else:
                f = -1 - kind
                for j in range(starts[f, r], ends[f, r]):
                    out[pos] = text[j]
                    pos += 1
            out[pos] = 44  # ','
            pos += 1
        out[pos - 1] = 10  # the row's last comma is its line break
    return pos
