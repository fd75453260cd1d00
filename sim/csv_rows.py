"""A table's CSV rows, compiled: the bytes pyarrow's CSV writer writes, sooner.

pyarrow's writer turns every cell into text through its cast to strings, integers included, and
then copies the texts into rows: at a million requests (four million steps, sixty million cells)
that is most of a run's writing. Here one compiled function (:func:`format_rows`) prints each row
whole: its integers two digits at a time, its floats as the shortest text that reads back as the
same float64 (:mod:`sim.float_text`: the digits and the layout pyarrow prints), so that every
float reads back as the value the run computed and the bytes are pyarrow's.

A float equal, bit for bit, to the one a row above it (in its own column, or in a column it is
said to follow: a step starts when the one before it ended) reuses that text instead of being
formatted again; a fixed alpha is formatted once per slice. NaN is an empty cell, as pyarrow
writes a null. The writer (specbatch/commands/outputs.py) takes this path for tables of
numbers, of any length, where the compiled code is already on disk (sim.warm compiles it with the
engine); anything else goes to pyarrow's writer, which gives the same bytes (tests/test_csv_rows.py).
"""

from __future__ import annotations

import numpy as np

from sim.float_text import LONGEST, decimal_length, write_digits, write_shortest

RULES = ()  # nothing registered for the engine's rules: this module is compiled on its own (sim.jit)
_NAN_ABOVE = np.uint64(0x7FF0000000000000)  # a float64's magnitude bits above this: NaN
_MAGNITUDE = np.uint64((1 << 63) - 1)


def applies(arrays: dict[str, np.ndarray]) -> bool:
    """Whether this path writes ``arrays``: every column a float64 or an integer of at most 64 bits that prints
    as an int64 does (unsigned 64-bit ints and labels go to pyarrow). A short table too: loading the compiled
    code once numba is up costs less than importing pyarrow, which a run that reads no trace need not import."""
    return all(a.dtype == np.float64 or a.dtype.kind == "i" or (a.dtype.kind == "u" and a.dtype.itemsize < 8)
               for a in arrays.values())


def csv_rows(arrays: dict[str, np.ndarray], lo: int, hi: int, follows: dict[str, str], format_rows) -> np.ndarray:
    """Rows ``lo`` to ``hi`` of the columns as CSV bytes (no header), formatted by ``format_rows``
    (the compiled :func:`format_rows`). ``follows``: float columns whose value is often that of
    another float column one row above (``{"start_s": "end_s"}``)."""
    names = list(arrays)
    n = hi - lo
    floats = [name for name in names if arrays[name].dtype.kind == "f"]
    ints = [name for name in names if arrays[name].dtype.kind != "f"]
    kinds = np.array([ints.index(name) if name in ints else -1 - floats.index(name) for name in names], np.int64)
    int_block = np.empty((len(ints), n), np.int64)
    int_width = 0  # the widest row of integers, as text: the rows' room (a few digits each, not an int64's 20)
    for row, name in enumerate(ints):
        int_block[row] = arrays[name][lo:hi]
        if n:
            int_width += max(len(str(int_block[row].min())), len(str(int_block[row].max())))
    float_bits = np.empty((len(floats), n), np.uint64)
    for row, name in enumerate(floats):
        float_bits[row] = np.ascontiguousarray(arrays[name][lo:hi]).view(np.uint64)
    # The column whose value one row above a float is compared with: the one it follows, or its own.
    above = np.array([floats.index(follows.get(name, name)) if follows.get(name, name) in floats else row
                      for row, name in enumerate(floats)], np.int64)
    spans = np.zeros((2, max(len(floats), 1), 2), np.int64)  # each float's text in the row above and in this one
    out = np.empty(n * (int_width + LONGEST * len(floats) + len(names)), np.uint8)
    written = format_rows(kinds, int_block, float_bits, above, spans, n, out)
    return out[:written]


def format_rows(kinds: np.ndarray, ints: np.ndarray, floats: np.ndarray, above: np.ndarray, spans: np.ndarray,
                n: int, out: np.ndarray) -> int:
    """Write ``n`` CSV rows into ``out``, returning the bytes written. Column c is the int row
    ``kinds[c]`` of ``ints`` or, for ``kinds[c] = -1 - f``, the float64 whose bits are ``floats[f, r]``
    in row r: the text of float ``above[f]`` one row above where the bits are the same, else its own
    (NaN: none). ``spans``: scratch, where each float's text lies in the row above (``spans[0]``) and in
    this one (``spans[1]``)."""
    pos = 0
    columns = kinds.shape[0]
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
                length = decimal_length(u)
                write_digits(u, length, out, pos, 0)
                pos += length
            else:
                f = -1 - kind
                bits = floats[f, r]
                start = pos
                source = above[f]
                if r > 0 and bits == floats[source, r - 1]:  # bit for bit: -0.0 prints otherwise than 0.0
                    for j in range(spans[0, source, 0], spans[0, source, 1]):
                        out[pos] = out[j]
                        pos += 1
                elif bits & _MAGNITUDE <= _NAN_ABOVE:  # (NaN: an empty cell)
                    pos = write_shortest(bits, out, pos)
                spans[1, f, 0], spans[1, f, 1] = start, pos
            out[pos] = 44  # ','
            pos += 1
        out[pos - 1] = 10  # the row's last comma is its line break
        for f in range(spans.shape[1]):
            spans[0, f, 0], spans[0, f, 1] = spans[1, f, 0], spans[1, f, 1]
    return pos
