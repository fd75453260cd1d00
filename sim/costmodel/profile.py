"""The profile format: what the cost model needs from calibration.

``sim`` owns this format (the consumer says what it needs); ``calibrate`` writes it.
A profile is a directory holding two files:

* ``profile.csv`` -- one row per measured point (see :data:`COLUMNS`);
* ``profile.json`` -- the sidecar: device, dtype, versions, model configs, grid,
  timing method, date (see :data:`REQUIRED_META`).

Phases and what ``query_tokens`` / ``context_tokens`` mean in each:

=========  =======  ==================================  ===========================
phase      model    query_tokens                        context_tokens
=========  =======  ==================================  ===========================
prefill    both     prompt length per sequence          0
decode     draft    1 (.. a few: the catch-up pass)       tokens already in KV cache
decode     target   q = 1 (plain decode) .. k_max + 1   tokens already in KV cache
verify     target   k = 0 (sample one token) .. k_max   0
=========  =======  ==================================  ===========================

A composed profile also prices the sampler for each sampling a run may ask for (``verify`` rows
whose model is a :data:`SAMPLERS` name: greedy, random, top-p; sim/compose/sampler.py); ``verify /
target`` is the one its sidecar names (``composition.sampling``, else greedy), what a run prices
unless it asks for another (``workload.sampling``).

Optional drafters besides the draft model (docs/speculation-methods.md), each priced only if present:

==========  ==========================  ==========================================  ==================
phase       model                       query_tokens                                context_tokens
==========  ==========================  ==========================================  ==================
decode      eagle, eagle3, mtp (heads)  a head pass's tokens: 1 (a later pass), or  tokens in its KV
                                        2.. (a step's first pass over the verified
                                        positions, EAGLE-3's feature fusion in it)
prefill     eagle, eagle3, mtp          prompt length (the head's pass over it)     0
decode      medusa                      heads run (k), one pass                     0
propose     ngram, suffix               k (tokens proposed per sequence)            tokens of context
==========  ==========================  ==========================================  ==================

``propose`` is host (CPU) time per step for the whole batch, timed by ``calibrate``.

This module imports only numpy and pandas so that calibration boxes can use it.
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from sim.atomic_write import write_file
from sim.errors import InputError, read_text
from sim.lazy import lazy_module

pd = lazy_module("pandas")  # imported when points are read: a cached run never does

FORMAT_VERSION = 1
CSV_NAME = "profile.csv"
META_NAME = "profile.json"
DEFAULT_PROFILE = "h100-llama-3.1-8b-llama-3.2-1b"

PHASES = ("prefill", "decode", "verify", "propose")
SAMPLERS = ("greedy", "random", "top-p")  # vLLM's sampler as a run's requests drive it (sim/compose/sampler.py)
MODELS = ("target", "draft", "eagle", "eagle3", "mtp", "medusa", "ngram", "suffix", *SAMPLERS)
HEADS = ("eagle", "eagle3", "mtp")  # drafters that are a decoder layer on the target's hidden states
HOSTS = ("ngram", "suffix")  # drafters that run on the host, timed in phase "propose"
PHASE_MODELS = ("prefill/target", "decode/target", "verify/target", "prefill/draft", "decode/draft",
                *(f"{phase}/{head}" for head in HEADS for phase in ("prefill", "decode")), "decode/medusa",
                *(f"propose/{host}" for host in HOSTS), *(f"verify/{mode}" for mode in SAMPLERS))
STATUSES = ("ok", "oom", "error")

COLUMNS: tuple[str, ...] = (
    "phase",
    "model",
    "batch_size",
    "query_tokens",
    "context_tokens",
    "status",
    "samples",
    "latency_median_s",
    "latency_mean_s",
    "latency_std_s",
    "latency_p10_s",
    "latency_p90_s",
    "latency_min_s",
)
KEY_COLUMNS = ("phase", "model", "batch_size", "query_tokens", "context_tokens")
INT_COLUMNS = ("batch_size", "query_tokens", "context_tokens", "samples")
LATENCY_COLUMNS = tuple(c for c in COLUMNS if c.startswith("latency_"))

MAX_COUNT = 2**31 - 1   # batch sizes, token counts, samples: beyond any model, and safe in every dtype
MAX_LATENCY_S = 3600.0  # one timed pass; more is a unit mistake (ms or us written as seconds)
OVERLAPS = ("none", "async")  # engine_overhead.overlap: the engine's work adds to a step, or overlaps it (docs/cost-model.md)
MIN_LATENCY_S = 1e-9    # a timed pass's median: no kernel is faster than a nanosecond (and curves cannot be fitted to 1e-300)

REQUIRED_META = ("format_version", "device", "dtype", "versions", "models", "grid", "timing", "created_utc")

# (phase, model) pairs a usable profile must contain at least one "ok" point of (a target-only profile:
# the target's; its sidecar's ``models`` names no draft).
REQUIRED_PHASES = (("prefill", "target"), ("prefill", "draft"), ("decode", "draft"), ("decode", "target"),
                   ("verify", "target"))


@dataclass(frozen=True)
class Profile:
    """A loaded, validated profile. ``points`` holds only the ``ok`` rows."""

    path: Path
    meta: dict[str, Any]
    points: pd.DataFrame
    skipped: pd.DataFrame

    @property
    def name(self) -> str:
        return str(self.meta.get("name") or self.path.name)

    def phase(self, phase: str, model: str) -> pd.DataFrame:
        rows = self.points[(self.points.phase == phase) & (self.points.model == model)]
        return rows.reset_index(drop=True)

    @property
    def has_draft(self) -> bool:
        """False for a target-only profile (no draft model was measured or composed): only runs that
        never speculate (``--policy none``) can use it."""
        return "draft" in (self.meta.get("models") or {})

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica of this profile occupies: its tensor-parallel size (1 where not recorded)."""
        return gpus_per_replica(self.meta)

    @property
    def k_max(self) -> int:
        """Largest speculation length every needed curve was measured for."""
        target_q = self.phase("decode", "target").query_tokens.max()
        verify_k = self.phase("verify", "target").query_tokens.max()
        return int(min(target_q - 1, verify_k))

    @property
    def kv_capacity_tokens(self) -> int | None:
        value = self.meta.get("kv_capacity_tokens")
        return int(value) if value is not None else None

    @property
    def sampling(self) -> str:
        """The sampling its ``verify / target`` points price: a composed sidecar's ``composition.sampling``,
        else greedy (``vllm bench serve``'s default; a measured profile's verification kernel is taken as
        that)."""
        return str((self.meta.get("composition") or {}).get("sampling", "greedy"))

    def samplings(self) -> list[str]:
        """Every sampling a run on this profile can be priced at: its own, and those it has verify points for."""
        priced = set(self.points.model[self.points.phase == "verify"]) & set(SAMPLERS)
        return [mode for mode in SAMPLERS if mode in priced or mode == self.sampling]

    def engine_overhead_s(self, phase: str) -> float:
        """Seconds per step an engine spends outside the timed passes (0 where not measured).

        Calibration measures it with a short real replay (``calibrate.overhead``): the
        scheduler, the policy, sampling bookkeeping, KV-cache rollbacks and moves.
        """
        value = self.meta.get("engine_overhead", {}).get(f"{phase}_overhead_s")
        return float(value) if value is not None else 0.0

    def engine_overhead_per_row_s(self, phase: str) -> float:
        """Seconds per step per running sequence that the engine spends beyond :meth:`engine_overhead_s`
        (0 where not measured): its bookkeeping per row, which calibration measures by replaying at several
        batch sizes (``calibrate.overhead``). A step of b rows costs the engine the two together."""
        value = self.meta.get("engine_overhead", {}).get(f"{phase}_overhead_per_row_s")
        return float(value) if value is not None else 0.0

    def decode_overhead_at(self, rows):
        """The engine's own work in a decode step of ``rows`` running rows (a number or an array): per step
        plus per row (:class:`sim.costmodel.model.CostModel` charges the same from its fitted state)."""
        return self.engine_overhead_s("decode") + self.engine_overhead_per_row_s("decode") * np.asarray(rows, dtype=float)

    @property
    def overhead_overlapped(self) -> bool:
        """True when the engine's own work overlaps the previous step's passes (``"overlap":
        "async"``, vLLM V1's asynchronous scheduling): a step then takes the longer of the two,
        not their sum (docs/cost-model.md)."""
        return self.meta.get("engine_overhead", {}).get("overlap", "none") == "async"

    @property
    def exposed_overhead_s(self) -> float:
        """Seconds per step outside the priced passes that no overlap hides (0 where not given)."""
        value = self.meta.get("engine_overhead", {}).get("exposed_overhead_s")
        return float(value) if value is not None else 0.0

    @property
    def request_latency_s(self) -> float:
        """Seconds the serving frontend adds to every request as its client sees it, beyond the
        engine's steps (HTTP, tokenization, the hop to the engine and back, detokenization,
        streaming): added to TTFT and E2E, not to the time between tokens (0 where not given)."""
        value = self.meta.get("engine_overhead", {}).get("request_latency_s")
        return float(value) if value is not None else 0.0


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship inside the package."""
    root = resources.files("sim") / "profiles"
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / META_NAME).is_file())


def resolve_profile_path(name_or_path: str | os.PathLike[str]) -> Path:
    """A directory path, or the name of a shipped profile."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.suffix in (".csv", ".json") and path.is_file():
        return path.parent
    shipped = resources.files("sim") / "profiles" / str(name_or_path)
    if shipped.is_dir():
        return Path(str(shipped))
    names = ", ".join(shipped_profiles()) or "none"
    raise InputError(
        f"no profile directory '{name_or_path}' and no shipped profile of that name (shipped: {names})",
        field="profile",
    )


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """Load and validate a profile; every problem is one :class:`InputError`."""
    directory = resolve_profile_path(name_or_path)
    csv_path, meta_path = directory / CSV_NAME, directory / META_NAME
    meta = load_meta(directory)
    table = read_points(csv_path)
    ok = table[table.status == "ok"].reset_index(drop=True)
    skipped = table[table.status != "ok"].reset_index(drop=True)
    roles = (set(meta["models"]) & set(MODELS)) or set(MODELS)  # a sidecar naming neither is judged on both
    for phase, model in REQUIRED_PHASES:
        if model in roles and not ((ok.phase == phase) & (ok.model == model)).any():
            raise InputError(f"profile has no measured '{phase}' points for the {model} model",
                             source=csv_path, field="phase")
    if "draft" not in roles and (ok.model == "draft").any():
        raise InputError("the sidecar names no draft model (a target-only profile) but the points time one; "
                         "name it under models.draft", source=meta_path, field="models")
    return Profile(path=directory, meta=meta, points=ok, skipped=skipped)


def load_meta(name_or_path: str | os.PathLike[str]) -> dict[str, Any]:
    """A profile's sidecar (profile.json), validated, without its points: what a listing of profiles
    needs (reading every profile's points took ``specbatch profiles`` 2 s, most of it importing pandas)."""
    directory = resolve_profile_path(name_or_path)
    for needed in (directory / CSV_NAME, directory / META_NAME):
        if not needed.is_file():
            raise InputError(f"missing {needed.name} (a profile is a directory with {CSV_NAME} and {META_NAME})",
                             source=directory, field="profile")
    return _load_meta(directory / META_NAME)


def gpus_per_replica(meta: dict[str, Any]) -> int:
    """GPUs one replica of a profile occupies: its tensor-parallel size (1 where not recorded)."""
    return int(meta.get("tensor_parallel_size", 1))


def _load_meta(path: Path) -> dict[str, Any]:
    text = read_text(path)
    try:
        meta = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", source=path, line=exc.lineno) from None
    except ValueError as exc:
        constant = re.search(r"\b(NaN|-?Infinity)\b", text)
        line = text.count("\n", 0, constant.start()) + 1 if constant else None
        raise InputError(str(exc), source=path, line=line) from None
    if not isinstance(meta, dict):
        raise InputError("expected a JSON object", source=path, line=1)
    for key in REQUIRED_META:
        if key not in meta:
            raise InputError("missing key", source=path, field=key)
    if meta["format_version"] != FORMAT_VERSION:
        raise InputError(f"unsupported format version {meta['format_version']!r} (this specbatch reads "
                         f"{FORMAT_VERSION})", source=path, field="format_version", line=_json_line(text, "format_version"))
    _check_meta_values(meta, path, text)
    return meta


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows (write a finite number, or leave the key out)")


def _check_meta_values(meta: dict[str, Any], path: Path, text: str) -> None:
    """The sidecar's numbers the simulator uses, each checked where it is read from (key and line)."""
    def fail(key: str, message: str) -> InputError:
        return InputError(message, source=path, field=key, line=_json_line(text, key.rsplit(".", 1)[-1]))

    name = meta.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise fail("name", f"expected a non-empty string, got {name!r}")
    tp = meta.get("tensor_parallel_size", 1)
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 1024:
        raise fail("tensor_parallel_size", f"expected the GPUs of one replica, a whole number from 1 to 1024, got {tp!r}")
    if not isinstance(meta.get("models"), dict):
        raise fail("models", f"expected an object of the models by role (target, draft), got {meta.get('models')!r}")
    kv = meta.get("kv_capacity_tokens")
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or not 0 <= kv <= 2**62):
        # 0 is a measurement (the weights leave no room for a KV cache): every run is then refused
        raise fail("kv_capacity_tokens", f"expected a whole number of tokens from 0 to 2**62, got {kv!r}")
    overhead = meta.get("engine_overhead", {})
    if not isinstance(overhead, dict):
        raise fail("engine_overhead", f"expected an object, got {overhead!r}")
    for key, value in overhead.items():
        if (key.endswith(("_overhead_s", "_per_row_s")) or key == "request_latency_s") and value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
                or not 0 <= value <= MAX_LATENCY_S):
            raise fail(f"engine_overhead.{key}", f"expected seconds from 0 to {MAX_LATENCY_S:g}, got {value!r}")
    overlap = overhead.get("overlap", "none")
    if overlap not in OVERLAPS:
        raise fail("engine_overhead.overlap", f"expected one of {', '.join(OVERLAPS)}, got {overlap!r}")


def _json_line(text: str, key: str) -> int | None:
    """The line a key is first written on in a JSON text (for messages; None if not found)."""
    needle = f'"{key}"'
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return None


def read_points(csv_path: Path) -> pd.DataFrame:
    """Read and check a points CSV; errors name the 1-based file line and the column."""
    text = read_text(csv_path)
    if not text.strip():
        raise InputError(f"empty file: a profile's points need a header line ({', '.join(COLUMNS[:3])}, ...) and "
                         "one row per measured point", source=csv_path, line=1)
    try:
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, skip_blank_lines=False)
    except pd.errors.ParserError as exc:
        raise InputError(f"cannot parse CSV: {exc}", source=csv_path) from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}", source=csv_path, line=1, field=missing[0])
    table = table[list(COLUMNS)].copy()
    # Blank lines are read as empty rows and dropped here, so that line numbers stay exact.
    blank = (table.isna() | table.eq("")).all(axis=1).to_numpy()
    lines = np.flatnonzero(~blank) + 2  # header is line 1
    table = table[~blank].reset_index(drop=True)
    line_of = lambda row: int(lines[row])  # noqa: E731
    for col, allowed in (("phase", PHASES), ("model", MODELS), ("status", STATUSES)):
        bad = ~table[col].isin(allowed)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise InputError(f"'{table[col].iloc[row]}' is not one of {', '.join(allowed)}",
                             source=csv_path, line=line_of(row), field=col)
    pairs = table.phase + "/" + table.model
    bad = ~pairs.isin(PHASE_MODELS)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(f"a '{table.phase.iloc[row]}' point of model '{table.model.iloc[row]}' means nothing "
                         f"(phases and models: {', '.join(PHASE_MODELS)})", source=csv_path, line=line_of(row),
                         field="model")
    for col in INT_COLUMNS:
        ascii_digits = table[col].str.strip().str.fullmatch(r"[0-9]+(\.0*)?")
        values = pd.to_numeric(table[col].where(ascii_digits, ""), errors="coerce")
        bad = values.isna() | (values < 0) | (values != values.round()) | (values > MAX_COUNT)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise InputError(f"'{table[col].iloc[row]}' is not a non-negative integer (at most {MAX_COUNT})",
                             source=csv_path, line=line_of(row), field=col)
        table[col] = values.astype(np.int64)
    ok = (table.status == "ok").to_numpy()
    for col in LATENCY_COLUMNS:
        values = pd.to_numeric(table[col].replace("", np.nan), errors="coerce")
        numbers = values.to_numpy()
        lowest = 0.0 if col != "latency_median_s" else MIN_LATENCY_S  # a measured pass takes some time
        bad = ok & ~((numbers >= lowest) & (numbers <= MAX_LATENCY_S))
        bad |= ~ok & table[col].ne("").to_numpy() & ~np.isfinite(numbers)  # a skipped point: blank, or a number
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            value = numbers[row]
            within = "" if np.isnan(value) or value < 0 else \
                f" within [{lowest:g}, {MAX_LATENCY_S:g}], as a measured point's is" if ok[row] else \
                " (a skipped point's is blank or finite)"
            raise InputError(f"'{table[col].iloc[row]}' is not a non-negative number of seconds{within}",
                             source=csv_path, line=line_of(row), field=col)
        table[col] = values.astype(float)
    bad_batch = ok & (table.batch_size.to_numpy() < 1)
    bad_q = ok & (table.query_tokens.to_numpy() < 1) & (table.phase != "verify").to_numpy()
    for bad, col in ((bad_batch, "batch_size"), (bad_q, "query_tokens")):
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise InputError("must be at least 1 for a measured point", source=csv_path,
                             line=line_of(row), field=col)
    dup = table.duplicated(subset=list(KEY_COLUMNS))
    if dup.any():
        row = int(np.flatnonzero(dup.to_numpy())[0])
        raise InputError("duplicate measured point", source=csv_path, line=line_of(row), field="phase")
    return table


def sort_points(points: pd.DataFrame) -> pd.DataFrame:
    """Canonical row order so that equal measurements give byte-identical files."""
    order = {p: i for i, p in enumerate(PHASES)}
    keyed = points.assign(_p=points.phase.map(order), _m=points.model.map({m: i for i, m in enumerate(MODELS)}))
    keyed = keyed.sort_values(["_p", "_m", "batch_size", "query_tokens", "context_tokens"], kind="stable")
    return keyed.drop(columns=["_p", "_m"]).reset_index(drop=True)[list(COLUMNS)]


def write_profile(directory: str | os.PathLike[str], meta: dict[str, Any], points: pd.DataFrame) -> Path:
    """Write a profile atomically: both files appear complete or not at all."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"format_version": FORMAT_VERSION, **meta}
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(f"profile metadata lacks {missing}")
    csv_text = sort_points(points).to_csv(index=False, float_format="%.9g", lineterminator="\n")
    write_file(directory / CSV_NAME, csv_text)
    write_file(directory / META_NAME, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return directory


def write_scaled_profile(profile: "Profile", factor: float, directory: str | os.PathLike[str]) -> Path:
    """``profile`` with every time (passes and engine overhead) multiplied by ``factor``.

    What the validation uses to take a device's measured speed drift out of the comparison.
    """
    table = pd.concat([profile.points, profile.skipped], ignore_index=True)
    table[list(LATENCY_COLUMNS)] = table[list(LATENCY_COLUMNS)] * factor
    meta = json.loads(json.dumps(profile.meta))
    for key, value in meta.get("engine_overhead", {}).items():
        if key.endswith("_overhead_s"):
            meta["engine_overhead"][key] = value * factor
    meta["name"] = f"{profile.name}-x{factor:.3f}"
    meta["scaled"] = {"from": profile.name, "factor": factor}
    return write_profile(directory, meta, table[list(COLUMNS)])
