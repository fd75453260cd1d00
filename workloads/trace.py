"""Replay of a request trace: a CSV with arrival_s, prompt_tokens, output_tokens.

Optional columns: ``alpha``, the request's acceptance probability in (0, 1) (blank: not
given, the configured acceptance applies); ``label``, a dataset name; for prefix caching,
``prompt_id`` (requests with the same id send the same prompt) and ``prefix_id`` with
``prefix_tokens`` (requests with the same prefix id share their first prefix_tokens tokens, a
system prompt); an id is any text, blank for none. Other extra columns are ignored. Rows may come in any order; they are sorted by arrival
(stably, so ties keep file order). Every bad line is reported with its line number.

The file is read as UTF-8 and numbers are written in ASCII (Python would read other
scripts' digits, or ``1_000``, as numbers: a trace is data from elsewhere, so no guessing).
"""

from __future__ import annotations

import codecs
import csv
import math
import os
import re
from pathlib import Path

import numpy as np

from workloads.files import missing_file
from workloads.limits import MAX_TIME_S, MAX_TOKENS
from workloads.numbers import read_number
from workloads.requests import Requests

TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_COLUMNS = ("alpha", "label", "prompt_id", "prefix_id", "prefix_tokens")
ID_COLUMNS = ("prompt_id", "prefix_id")
_WHOLE = re.compile(r"\+?[0-9]+")


class TraceError(ValueError):
    def __init__(self, message: str, path: Path, line: int | None = None, field: str | None = None):
        self.message, self.path, self.line, self.field = message, path, line, field
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {field + ': ' if field else ''}{message}")


def read_trace(path: str | os.PathLike[str]) -> Requests:
    path = Path(path)
    if not path.is_file():
        raise TraceError(missing_file(path, "trace file"), path)
    fast = read_trace_columns(path)
    if fast is not None:
        return fast
    try:
        return _read(path)
    except UnicodeDecodeError:
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"not UTF-8 text (byte 0x{data[exc.start]:02x}); save the trace as UTF-8", path,
                             data[:exc.start].count(b"\n") + 1) from None
        raise


def _read(path: Path) -> Requests:
    with path.open(newline="", encoding="utf-8-sig", errors="strict") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError("empty trace file", path, 1)
        header = [h.strip() for h in header]
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise TraceError(f"missing column(s) {', '.join(missing)}", path, 1, missing[0])
        index = {c: header.index(c) for c in TRACE_COLUMNS + OPTIONAL_COLUMNS if c in header}
        arrival, prompt, output, alpha, label = [], [], [], [], []
        ids: dict[str, list] = {c: [] for c in ID_COLUMNS}
        prefix_tokens: list[int] = []
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise TraceError(f"expected {len(header)} fields, found {len(row)}", path, line)
            arrival.append(_number(row[index["arrival_s"]], path, line, "arrival_s"))
            prompt.append(_count(row[index["prompt_tokens"]], path, line, "prompt_tokens"))
            output.append(_count(row[index["output_tokens"]], path, line, "output_tokens"))
            if "alpha" in index:
                alpha.append(_alpha(row[index["alpha"]], path, line))
            if "label" in index:
                label.append(row[index["label"]].strip())
            for column in ID_COLUMNS:
                if column in index:
                    ids[column].append(row[index[column]].strip())
            if "prefix_tokens" in index or "prefix_id" in index:
                prefix_tokens.append(_prefix(row, index, prompt[-1], path, line))
    if not arrival:
        raise TraceError("trace has no requests", path, 2)
    order = np.argsort(np.asarray(arrival), kind="stable")
    prefixed = "prefix_id" in index or "prefix_tokens" in index
    return Requests(np.asarray(arrival)[order], np.asarray(prompt)[order], np.asarray(output)[order],
                    alpha=np.asarray(alpha, dtype=float)[order] if "alpha" in index else None,
                    label=np.asarray(label, dtype=object)[order] if "label" in index else None,
                    prompt_id=id_numbers(ids["prompt_id"])[order] if "prompt_id" in index else None,
                    prefix_id=id_numbers(ids["prefix_id"] or [""] * len(arrival))[order] if prefixed else None,
                    prefix_tokens=np.asarray(prefix_tokens, dtype=np.int64)[order] if prefixed else None)


def id_numbers(ids) -> np.ndarray:
    """Ids (any text; blank: none) as numbers, 0, 1, ... in order of first appearance; -1 for none."""
    values = np.asarray(ids, dtype=object).astype(str)
    given = values != ""
    _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")  # by first appearance
    numbers = rank[inverse]
    if not given.all():  # the blank id takes a rank of its own: renumber the given ones from 0
        blank_rank = numbers[~given][0]
        numbers = np.where(numbers > blank_rank, numbers - 1, numbers)
    return np.where(given, numbers, -1).astype(np.int64)


def _prefix(row, index, prompt: int, path: Path, line: int) -> int:
    """A row's prefix_tokens: given with a prefix_id, within the prompt; 0 where there is none."""
    has_id = "prefix_id" in index and row[index["prefix_id"]].strip() != ""
    text = row[index["prefix_tokens"]].strip() if "prefix_tokens" in index else ""
    if not has_id:
        if text:
            raise TraceError("prefix_tokens without a prefix_id: name the shared prefix", path, line, "prefix_id")
        return 0
    if not text:
        raise TraceError("a prefix_id needs its prefix_tokens (how many leading tokens are shared)", path, line,
                         "prefix_tokens")
    if not _WHOLE.fullmatch(text):
        raise TraceError(f"'{text}' is not a whole number of tokens", path, line, "prefix_tokens")
    value = int(text)
    if value > prompt:
        raise TraceError(f"'{text}' is more than the request's {prompt} prompt tokens", path, line, "prefix_tokens")
    return value


def read_trace_columns(path: Path) -> Requests | None:
    """The trace read by pyarrow's CSV reader into typed columns (a million rows in well under a
    second and a few tens of MB); None when any cell is not plainly valid, so that the
    line-by-line reader above finds the first bad line and names it.

    "Plainly valid" is never wider than what that reader accepts: the whole file is UTF-8,
    numbers are ASCII (pyarrow parses nothing else), times and token counts lie within
    :mod:`workloads.limits`; anything else goes to the line reader."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:
        return None
    types = {"arrival_s": pa.float64(), "prompt_tokens": pa.int64(), "output_tokens": pa.int64(),
             "alpha": pa.float64(), "label": pa.string()}
    try:  # the header alone (pyarrow's streaming reader would hold a block and its threads' memory)
        with open(path, encoding="utf-8", newline="") as handle:
            header = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    wanted = [c for c in TRACE_COLUMNS + OPTIONAL_COLUMNS if c in header]
    if any(c not in header for c in TRACE_COLUMNS) or len(set(header)) != len(header) or not _is_utf8(path):
        return None
    prefix_columns = [c for c in ("prompt_id", "prefix_id", "prefix_tokens") if c in wanted]
    wanted = [c for c in wanted if c not in prefix_columns]
    options = pacsv.ConvertOptions(column_types={c: types[c] for c in wanted}, include_columns=wanted,
                                   null_values=[""], strings_can_be_null=False, quoted_strings_can_be_null=False)
    try:
        # one thread: on a few cores as fast, and no per-thread buffers left behind for the run
        table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=False), convert_options=options)
    except (pa.ArrowInvalid, OSError):
        return None
    if table.num_rows == 0 or any(table[c].null_count for c in TRACE_COLUMNS):
        return None
    arrival = _numbers(table["arrival_s"], np.float64)
    prompt, output = _numbers(table["prompt_tokens"], np.int64), _numbers(table["output_tokens"], np.int64)
    if not (np.isfinite(arrival).all() and (arrival >= 0).all() and (arrival <= MAX_TIME_S).all()
            and (prompt >= 1).all() and (output >= 1).all() and (prompt <= MAX_TOKENS).all()
            and (output <= MAX_TOKENS).all()):
        return None
    alpha = label = None
    if "alpha" in wanted or "label" in wanted:
        import pyarrow.compute as pc  # only for these columns: importing it is a tenth of a short run's start
    if "alpha" in wanted:
        alpha = _numbers(pc.fill_null(table["alpha"], float("nan")), np.float64)  # blank cells: NaN
        if np.isnan(alpha).sum() != table["alpha"].null_count:  # a cell written "nan" is not a blank one
            return None
        given = alpha[~np.isnan(alpha)]
        if not ((given > 0) & (given < 1)).all():
            return None
    if "label" in wanted:
        label = np.array(pc.utf8_trim_whitespace(table["label"]).to_pylist(), dtype=object)
    ids = _prefix_columns(path, prefix_columns, prompt) if prefix_columns else {}
    if ids is None:
        return None
    order = np.argsort(arrival, kind="stable")
    requests = Requests(arrival[order], prompt[order], output[order],
                        alpha=alpha[order] if alpha is not None else None,
                        label=label[order] if label is not None else None,
                        **{name: values[order] for name, values in ids.items()})
    del table, arrival, prompt, output
    pa.default_memory_pool().release_unused()  # hand the parser's buffers back: the run needs the memory
    return requests


def _numbers(column, dtype) -> np.ndarray:
    """A numeric column without nulls as a numpy view of Arrow's data buffer. pyarrow's own
    ``to_numpy`` goes through its pandas converter, which imports pandas: a fifth of a
    one-second run spent on a library the run never uses."""
    array = column.combine_chunks()
    if array.null_count:
        raise ValueError("a column with nulls has no plain numpy view")
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * itemsize)


def _prefix_columns(path: Path, columns: list[str], prompt: np.ndarray) -> dict[str, np.ndarray] | None:
    """The prefix-caching columns read as text by pyarrow and checked; None where any cell is not
    plainly valid (the line reader then names the line)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    options = pacsv.ConvertOptions(column_types={c: pa.string() for c in columns}, include_columns=columns,
                                   null_values=[], strings_can_be_null=False)
    try:
        table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=False), convert_options=options)
    except (pa.ArrowInvalid, OSError):
        return None
    text = {c: np.char.strip(np.array(table[c].to_pylist(), dtype=str)) for c in columns}  # (_numbers: no pandas)
    out = {}
    if "prompt_id" in text:
        out["prompt_id"] = id_numbers(text["prompt_id"])
    if "prefix_id" in text or "prefix_tokens" in text:
        has_id = text["prefix_id"] != "" if "prefix_id" in text else np.zeros(prompt.shape, bool)
        tokens = text.get("prefix_tokens", np.full(prompt.shape, "", dtype=object).astype(str))
        if not all(t.isdigit() and t.isascii() for t in tokens[has_id]) or (tokens[~has_id] != "").any():
            return None
        count = np.zeros(prompt.shape, dtype=np.int64)
        count[has_id] = tokens[has_id].astype(np.int64)
        if (count > prompt).any():
            return None
        out["prefix_id"] = id_numbers(text.get("prefix_id", np.full(prompt.shape, "", dtype=object).astype(str)))
        out["prefix_tokens"] = count
    return out


def _is_utf8(path: Path, block: int = 1 << 20) -> bool:
    """Whether the whole file decodes as UTF-8 (pyarrow checks only the columns it converts to text)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(block):
                decoder.decode(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def write_trace(path: str | os.PathLike[str], requests: Requests) -> None:
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        extra = [c for c in OPTIONAL_COLUMNS if getattr(requests, c) is not None]
        writer.writerow(TRACE_COLUMNS + tuple(extra))
        columns = [requests.arrival_s.tolist(), requests.prompt_tokens.tolist(), requests.output_tokens.tolist()]
        columns += [getattr(requests, c).tolist() for c in extra]
        for a, p, o, *more in zip(*columns):
            cells = {"alpha": lambda x: "" if math.isnan(x) else repr(x), "label": str,
                     "prompt_id": lambda x: "" if x < 0 else str(x), "prefix_id": lambda x: "" if x < 0 else str(x),
                     "prefix_tokens": str}
            writer.writerow((repr(a), p, o, *(cells[c](x) for c, x in zip(extra, more))))


def _number(text: str, path: Path, line: int, field: str) -> float:
    try:
        value = read_number(text)
    except ValueError as exc:
        raise TraceError(str(exc), path, line, field) from None
    if not 0 <= value <= MAX_TIME_S:
        raise TraceError(f"'{text.strip()}' must be a finite number >= 0 and at most {MAX_TIME_S:g} seconds (beyond "
                         "that the simulated clock cannot resolve a step)", path, line, field)
    return value


def _alpha(text: str, path: Path, line: int) -> float:
    if not text.strip():
        return math.nan  # not given: the configured acceptance applies
    try:
        value = read_number(text)
    except ValueError as exc:
        raise TraceError(f"{exc} (leave the cell blank for the configured acceptance)", path, line, "alpha") from None
    if not 0.0 < value < 1.0:
        raise TraceError(f"'{text.strip()}' must be inside (0, 1)", path, line, "alpha")
    return value


def _count(text: str, path: Path, line: int, field: str) -> int:
    if not _WHOLE.fullmatch(text.strip()):
        raise TraceError(f"'{text.strip()}' is not a whole number of tokens", path, line, field)
    value = int(text)
    if value < 1:
        raise TraceError(f"'{text.strip()}' must be at least 1", path, line, field)
    if value > MAX_TOKENS:
        raise TraceError(f"'{text.strip()}' must be at most {MAX_TOKENS} tokens", path, line, field)
    return value
