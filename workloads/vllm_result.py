"""Reading a ``vllm bench serve --save-result --save-detailed`` JSON file.

The file holds the run's settings (``request_rate``, ``burstiness``, ``max_concurrency``,
``num_prompts``), its metrics (``duration``, ``completed``, ``mean_ttft_ms`` ...) and, with
``--save-detailed``, one entry per request in ``input_lens``, ``output_lens``, ``ttfts``
(seconds), ``itls`` (a list of seconds per request), ``errors`` and, in recent versions,
``start_times`` (when each request was sent, on the client's clock). A request counts as
completed when it produced output and has no error, as vLLM counts it.

Arrival times: ``start_times`` relative to the first, where present; otherwise the caller
draws them from the file's ``request_rate`` and ``burstiness``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workloads.files import missing_file
from workloads.numbers import read_number
from workloads.trace import TraceError

DETAIL_FIELDS = ("input_lens", "output_lens")


@dataclass(frozen=True)
class VllmResult:
    """The completed requests of a vLLM benchmark run, in file order, and its settings and metrics."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    start_s: np.ndarray | None    # sent times relative to the first request; None when not saved
    ttft_s: np.ndarray | None
    itl_s: list[np.ndarray] | None
    request_rate: float           # inf: every request at t = 0
    burstiness: float
    max_concurrency: int | None
    metrics: dict                 # every scalar of the file (its metrics and settings)

    def e2el_s(self) -> np.ndarray | None:
        """Each request's end-to-end latency: its ``latencies`` if saved, else TTFT + its ITLs."""
        if "latencies" in self.metrics:
            return np.asarray(self.metrics["latencies"], dtype=float)
        if self.ttft_s is None or self.itl_s is None:
            return None
        return self.ttft_s + np.array([float(np.sum(x)) for x in self.itl_s])

    def tpot_s(self) -> np.ndarray | None:
        """(E2EL - TTFT) / (output tokens - 1) over requests of more than one token, as vLLM defines it."""
        e2el = self.e2el_s()
        if e2el is None:
            return None
        multi = self.output_tokens > 1
        return (e2el[multi] - self.ttft_s[multi]) / (self.output_tokens[multi] - 1)


def read_vllm_result(path: str | os.PathLike[str]) -> VllmResult:
    path = Path(path)
    if not path.is_file():
        raise TraceError(missing_file(path, "vLLM result file"), path, field="workload.trace_vllm")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TraceError(f"not JSON: {exc.msg}", path, exc.lineno) from None
    if not isinstance(data, dict):
        raise TraceError("expected a JSON object (vllm bench serve --save-result)", path, 1)
    missing = [f for f in DETAIL_FIELDS if not isinstance(data.get(f), list)]
    if missing:
        raise TraceError(f"has no per-request {', '.join(missing)}: save it with vllm bench serve --save-result "
                         "--save-detailed", path, field=missing[0])
    n = len(data["input_lens"])
    for name in ("output_lens", "ttfts", "itls", "errors", "start_times"):
        if name in data and (not isinstance(data[name], list) or len(data[name]) != n):
            raise TraceError(f"has {len(data[name]) if isinstance(data[name], list) else 'no list of'} entries, "
                             f"input_lens has {n}", path, field=name)
    prompt = _counts(data["input_lens"], path, "input_lens")
    output = _counts(data["output_lens"], path, "output_lens")
    ok = (output > 0) & (prompt > 0)
    if "errors" in data:
        ok &= np.array([not e for e in data["errors"]], dtype=bool)
    if not ok.any():
        raise TraceError("no completed request (every one failed or produced no output)", path,
                         field="output_lens")
    keep = np.flatnonzero(ok)
    start = ttft = itl = None
    if "start_times" in data:
        start = _seconds(data["start_times"], path, "start_times")[keep]
        start = start - start.min()
    if "ttfts" in data:
        ttft = _seconds(data["ttfts"], path, "ttfts")[keep]
    if "itls" in data:
        itl = [_seconds(data["itls"][i], path, "itls") for i in keep]
    rate = _setting(data, "request_rate", math.inf, path, infinite=True)
    burstiness = _setting(data, "burstiness", 1.0, path)
    concurrency = data.get("max_concurrency")
    scalars = {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
    if "latencies" in data and isinstance(data["latencies"], list) and len(data["latencies"]) == n:
        scalars["latencies"] = [float(v) for v in _seconds(data["latencies"], path, "latencies")[keep]]
    return VllmResult(prompt[keep], output[keep], start, ttft, itl, rate, burstiness,
                      int(concurrency) if concurrency else None, scalars)


def _counts(values: list, path: Path, field: str) -> np.ndarray:
    out = np.asarray(values)
    if out.dtype.kind not in "iu" or np.any(out < 0):
        raise TraceError("must be whole numbers of tokens >= 0", path, field=field)
    return out.astype(np.int64)


def _setting(data: dict, field: str, default: float, path: Path, infinite: bool = False) -> float:
    """A run setting of the file (absent or null: vLLM's default), a number > 0; ``"inf"`` only where
    ``infinite`` (request_rate: every request at t = 0)."""
    value = data.get(field)
    if value is None:
        return default
    try:
        number = read_number(value, infinite=infinite)
    except ValueError as exc:
        raise TraceError(str(exc), path, field=field) from None
    if not number > 0:
        raise TraceError(f"{field} {value} must be > 0" + (' (or "inf")' if infinite else ""), path, field=field)
    return number


def _seconds(values: list, path: Path, field: str) -> np.ndarray:
    try:
        out = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise TraceError("must be numbers of seconds", path, field=field) from None
    if out.ndim != 1 or not np.all(np.isfinite(out)):
        raise TraceError("must be finite numbers of seconds", path, field=field)
    return out
