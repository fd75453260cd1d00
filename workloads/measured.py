"""Reading per-request measurements of a real deployment: what ``specbatch compare`` checks against.

One row per request sent, as CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``, ``.pq``):

* ``arrival_s``, ``prompt_tokens``, ``output_tokens`` (required): when the request was sent
  (seconds, any origin), its prompt length and the tokens it generated (or was asked for);
* ``prompt_id`` (optional): requests with the same id sent the same prompt (what prefix
  caching can reuse);
* ``stage`` (optional): a label the comparison is grouped by (a constant-rate stage of a
  benchmark; default: one stage);
* ``ttft_s``, ``e2e_s`` (optional): the measured time to first token and end-to-end latency;
* ``ok`` (optional, 1 or 0): whether the request succeeded; a failed one (0) may leave its
  latencies and its prompt length empty (0 or blank), the length is then taken from a
  successful request with the same ``prompt_id`` (one whose length stays unknown is not
  simulated: :meth:`Measured.simulated_rows`).

Rows are sorted by arrival (stably) and the origin moved to the first arrival. Every bad
cell is one :class:`~workloads.trace.TraceError` naming the file, the line (CSV; the row
for Parquet) and the column, before anything runs. Other columns are ignored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.limits import MAX_TIME_S, MAX_TOKENS
from workloads.trace import TraceError

REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL = ("prompt_id", "stage", "ttft_s", "e2e_s", "ok")
CSV_SUFFIXES = (".csv", ".csv.gz")
PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass(frozen=True)
class Measured:
    """The measured requests, sorted by arrival: ``frame`` has the columns above (``ok`` always,
    ``stage`` always, ``prompt_id``/``ttft_s``/``e2e_s`` where the file had them)."""

    frame: pd.DataFrame
    path: Path

    @property
    def has_latencies(self) -> bool:
        return "ttft_s" in self.frame and "e2e_s" in self.frame

    def simulated_rows(self) -> pd.DataFrame:
        """The requests to simulate: every row with a known prompt length (every request sent)."""
        return self.frame[self.frame.prompt_tokens >= 1]


def is_measured_file(path: str | os.PathLike[str]) -> bool:
    """Whether a file is a per-request measurement file by its name (CSV, gzipped CSV or Parquet)."""
    name = Path(path).name.lower()
    return name.endswith(CSV_SUFFIXES + PARQUET_SUFFIXES)


def read_measured(path: str | os.PathLike[str]) -> Measured:
    path = Path(path)
    if not path.is_file():
        raise TraceError("no such measurement file", path)
    parquet = path.name.lower().endswith(PARQUET_SUFFIXES)
    try:
        raw = pd.read_parquet(path) if parquet else pd.read_csv(path, dtype=str, keep_default_na=False,
                                                                  skipinitialspace=True, encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8 text ({exc.reason}); save the file as UTF-8", path) from None
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        kind = "Parquet" if parquet else "CSV"
        raise TraceError(f"cannot be read as {kind}: {str(exc).splitlines()[0]}", path) from None
    raw.columns = [str(c).strip() for c in raw.columns]
    missing = [c for c in REQUIRED if c not in raw.columns]
    if missing:
        raise TraceError(f"missing column(s) {', '.join(missing)}", path, None if parquet else 1, missing[0])
    if raw.empty:
        raise TraceError("has no requests", path, None if parquet else 2)
    line = (lambda i: None) if parquet else (lambda i: int(i) + 2)  # header is line 1
    where = (lambda i: f" (row {int(i) + 1})") if parquet else (lambda i: "")

    def numbers(column: str, whole: bool, blank_ok: bool) -> np.ndarray:
        text = raw[column]
        values = pd.to_numeric(text, errors="coerce").astype(float).to_numpy()
        blank = pd.isna(text).to_numpy() if parquet else (text.str.strip() == "").to_numpy()
        bad = (~np.isfinite(values) & ~blank) | (blank & (not blank_ok))
        if whole:
            bad |= np.isfinite(values) & (values != np.round(values))
        if bad.any():
            i = int(np.argmax(bad))
            kind = "a whole number" if whole else "a finite number"
            raise TraceError(f"'{raw[column].iloc[i]}' is not {kind}{where(i)}", path, line(i), column)
        return np.where(blank, np.nan, values)

    arrival = numbers("arrival_s", False, False)
    prompt = numbers("prompt_tokens", True, True)
    output = numbers("output_tokens", True, False)
    ok = numbers("ok", True, False) if "ok" in raw else np.ones(len(raw))
    frame = {"arrival_s": arrival, "prompt_tokens": np.nan_to_num(prompt, nan=0.0), "output_tokens": output, "ok": ok}
    checks = [("arrival_s", (arrival < 0) | (arrival > MAX_TIME_S), f"must be from 0 to {MAX_TIME_S:g} seconds"),
              ("output_tokens", (output < 1) | (output > MAX_TOKENS), f"must be from 1 to {MAX_TOKENS}"),
              ("prompt_tokens", (frame["prompt_tokens"] < 0) | (frame["prompt_tokens"] > MAX_TOKENS),
               f"must be from 1 to {MAX_TOKENS}"),
              ("prompt_tokens", (frame["prompt_tokens"] < 1) & (ok == 1), "must be at least 1 for a request with ok = 1"),
              ("ok", ~np.isin(ok, (0, 1)), "must be 1 (succeeded) or 0 (failed)")]
    for column in ("ttft_s", "e2e_s"):
        if column in raw:
            values = numbers(column, False, True)
            frame[column] = values
            checks.append((column, (values < 0) | (values > MAX_TIME_S), f"must be from 0 to {MAX_TIME_S:g} seconds"))
            checks.append((column, np.isnan(values) & (ok == 1), "is empty for a request with ok = 1"))
    if "ttft_s" in frame and "e2e_s" in frame:
        checks.append(("e2e_s", frame["e2e_s"] < frame["ttft_s"], "is below the request's ttft_s"))
    if "prompt_id" in raw:
        frame["prompt_id"] = numbers("prompt_id", True, False)
        checks.append(("prompt_id", frame["prompt_id"] < 0, "must be at least 0"))
    for column, bad, message in checks:
        if np.any(bad):
            i = int(np.argmax(bad))
            raise TraceError(f"'{raw[column].iloc[i]}' {message}{where(i)}", path, line(i), column)
    frame["stage"] = (raw["stage"].astype(str).str.strip().to_numpy() if "stage" in raw
                      else np.zeros(len(raw), dtype=int))
    out = pd.DataFrame(frame)
    out["stage"] = _stage_labels(out["stage"])
    for column in ("prompt_tokens", "output_tokens", "ok"):
        out[column] = out[column].astype(np.int64)
    if "prompt_id" in out:
        out["prompt_id"] = out["prompt_id"].astype(np.int64)
        _fill_prompts(out, path)
    out = out.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    out["arrival_s"] -= out["arrival_s"].iloc[0]
    return Measured(out, path)


def _stage_labels(stage: pd.Series) -> pd.Series:
    """Integers where every label is one (so stages sort 0, 1, ..., 10), else the labels as text."""
    numeric = pd.to_numeric(stage, errors="coerce")
    return numeric.astype(np.int64) if numeric.notna().all() and (numeric == numeric.round()).all() else stage


def _fill_prompts(frame: pd.DataFrame, path: Path) -> None:
    """A failed request's unknown prompt length (0) from a request with its prompt_id that has one."""
    known = frame[frame.prompt_tokens >= 1].groupby("prompt_id").prompt_tokens.first()
    unknown = frame.prompt_tokens < 1
    frame.loc[unknown, "prompt_tokens"] = frame.loc[unknown, "prompt_id"].map(known).fillna(0).astype(np.int64)
