"""Run a calibration: load both models, time every grid point, write the profile.

Points that cannot fit are skipped with status ``oom`` (estimated up front, or caught);
other failures get ``error``; either way the point is recorded and the run goes on.
Progress is resumable (see :mod:`calibrate.partial`); the profile itself is written
only at the end, atomically, through :func:`sim.costmodel.profile.write_profile`.
"""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from calibrate import memory
from calibrate.configs import ModelConfig, dtype_bytes, get_config, kv_bytes_per_token, param_count, weight_bytes
from calibrate.environment import device_info, versions
from calibrate.grid import HOST_DRAFTERS, Grid, Point
from calibrate.heads import Head, head_shape, head_weight_bytes, layer_config
from calibrate.host import host_info, time_proposer
from calibrate.attention import split_attention_notes
from calibrate.model import TORCH_DTYPES, Transformer
from calibrate.overhead import measure_overheads
from calibrate.partial import PartialRun
from calibrate.passes import GRAPHABLE, build_pass
from calibrate.timing import Measurement, TimerConfig, time_cpu, time_cuda
from sim.costmodel.profile import COLUMNS, INT_COLUMNS, KEY_COLUMNS, LATENCY_COLUMNS, write_profile


@dataclass(frozen=True)
class Settings:
    """Everything that determines what a calibration measures."""

    target: str  # as given to --target: a built-in name, a config.json path or a Hugging Face id (get_config)
    draft: str
    device: str  # "cpu" | "cuda"
    dtype: str  # resolved: float32 | float16 | bfloat16
    grid: Grid
    seed: int = 0
    threads: int | None = None
    memory_fraction: float = 0.9
    cuda_graphs: bool = True
    measure_overhead: bool = True  # t_overhead from a short real replay once the grid is timed
    drafters: tuple[str, ...] = ()  # drafters besides the draft model: heads timed on the device, host proposers
    ragged_contexts: bool = False  # decode rows spread around each point's context (calibrate.passes)

    def fingerprint(self, device_name: str) -> dict[str, Any]:
        """What must match for a partial run to be resumed."""
        return {"target": self.target, "draft": self.draft, "device": self.device, "device_name": device_name,
                "dtype": self.dtype, "grid": self.grid.to_dict(), "seed": self.seed, "threads": self.threads,
                "cuda_graphs": self.cuda_graphs and self.device == "cuda",
                **({"drafters": list(self.drafters)} if self.drafters else {}),
                **({"ragged_contexts": True} if self.ragged_contexts else {})}


@dataclass
class RunResult:
    out: Path
    table: pd.DataFrame  # every grid point, partial-file columns (COLUMNS + note)
    elapsed_s: float
    measured: int  # points timed or skipped by this invocation
    resumed: int  # points taken over from an earlier, interrupted run
    meta: dict[str, Any] = field(default_factory=dict)


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto``: bfloat16 (else float16) on CUDA, float32 on CPU."""
    if dtype != "auto":
        return dtype
    if device == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


def run_calibration(settings: Settings, out: str | Path, *, fresh: bool = False, progress: bool = True,
                    on_point: Callable[[Point, dict[str, Any]], None] | None = None) -> RunResult:
    """Measure every grid point not already in ``out``'s partial file, then write the profile."""
    # Denormals slow CPU passes by orders of magnitude; flush them while timing, and
    # only then, so a process that calibrates in-line keeps IEEE arithmetic afterwards.
    flushing = settings.device == "cpu" and torch.set_flush_denormal(True)
    try:
        return _calibrate(settings, out, fresh=fresh, progress=progress, on_point=on_point)
    finally:
        if flushing:
            torch.set_flush_denormal(False)


def _calibrate(settings: Settings, out: str | Path, *, fresh: bool, progress: bool,
               on_point: Callable[[Point, dict[str, Any]], None] | None) -> RunResult:
    started = time.perf_counter()
    out = Path(out)
    if settings.device == "cpu" and settings.threads:
        torch.set_num_threads(settings.threads)
    cfgs = {"target": get_config(settings.target, "target"), "draft": get_config(settings.draft, "draft")}
    device = device_info(settings.device)
    partial = PartialRun(out, settings.fingerprint(device["name"]), fresh=fresh)
    points = settings.grid.points(settings.drafters)
    todo = [p for p in points if not partial.done(p.key)]
    resumed = len(points) - len(todo)

    available = memory.available_memory_bytes(settings.device)
    budget = int(available * settings.memory_fraction)
    resident = memory.resident_bytes(cfgs["target"], cfgs["draft"], settings.dtype, settings.device) + sum(
        head_weight_bytes(m, cfgs["target"], dtype_bytes(settings.dtype)) for m in settings.drafters if m in HEADS)
    point_cfgs = {**cfgs, **{m: layer_config(head_shape(m, cfgs["target"]), cfgs["target"])
                             for m in settings.drafters if m in HEADS}}
    partial.start()
    models = _load_models(cfgs, settings) if todo and resident <= budget else {}
    generator = torch.Generator(device=settings.device).manual_seed(settings.seed)
    timer = TimerConfig(settings.grid.warmup, settings.grid.repeats, settings.grid.budget_s)
    bar = Progress(len(points), partial.resumed, enabled=progress)
    for point in todo:
        if point.phase == "propose":  # a host proposer: timed on the CPU, whatever the device
            row = _host_row(point)
        elif (need := resident + memory.point_bytes(point, point_cfgs[point.model], settings.dtype)) > budget:
            row = _row(point, "oom", note=f"needs ~{need / 2**20:.0f} MiB of {budget / 2**20:.0f} MiB allowed")
        else:
            row = _measure(point, models, generator, timer, settings)
        partial.record(row)
        bar.update(point, row)
        if on_point is not None:
            on_point(point, row)
    bar.close()

    table = _typed(pd.DataFrame([partial.rows[tuple(str(v) for v in p.key)] for p in points]))
    meta = build_meta(settings, cfgs, device, available, budget, table)
    write_profile(out, meta, table[list(COLUMNS)])
    if settings.measure_overhead:  # needs the profile written: the replay is priced and bound by it
        if progress:
            print("measuring the engine's per-step overhead with short real replays ...", file=sys.stderr)
        try:
            meta["engine_overhead"] = measure_overheads(out)
        except ImportError as exc:  # torch, numpy and pandas alone still calibrate the grid
            print(f"warning: engine overhead not measured: the replay needs {exc.name or exc} "
                  "(pip install simpy scipy tomli-w)", file=sys.stderr)
            meta["engine_overhead"] = {"error": f"not measured: {exc.name or exc} is not installed"}
        except Exception as exc:  # the grid's timings stand; the cost model then charges no overhead
            print(f"warning: could not measure the engine overhead: {_first_line(exc)}", file=sys.stderr)
            meta["engine_overhead"] = {"error": _first_line(exc)}
        write_profile(out, meta, table[list(COLUMNS)])
    partial.finish()
    return RunResult(out, table, time.perf_counter() - started, len(todo), resumed, meta)


def _typed(table: pd.DataFrame) -> pd.DataFrame:
    """Partial-file strings back to ints and floats (empty latency cells become NaN)."""
    for col in INT_COLUMNS:
        table[col] = table[col].astype("int64")
    for col in LATENCY_COLUMNS:
        table[col] = pd.to_numeric(table[col].replace("", float("nan")))
    return table


def _load_models(cfgs: dict[str, ModelConfig], settings: Settings) -> dict[str, Any]:
    """The target and draft, and each head drafter (calibrate.heads), on the device."""
    dtype = TORCH_DTYPES[settings.dtype]
    models: dict[str, Any] = {role: Transformer(cfg, device=settings.device, dtype=dtype, seed=settings.seed + i)
                              for i, (role, cfg) in enumerate(cfgs.items())}
    for i, method in enumerate(m for m in settings.drafters if m in HEADS):
        models[method] = Head(method, cfgs["target"], device=settings.device, dtype=dtype, seed=settings.seed + 2 + i)
    return models


def _host_row(point: Point) -> dict[str, Any]:
    """A host proposer's point, timed with calibrate.host (numpy on the CPU)."""
    seconds = time_proposer(point.model, point.batch_size, point.query_tokens, point.context_tokens)
    row = _row(point, "ok", note="host")
    row.update(samples=1, **{col: (0.0 if col == "latency_std_s" else seconds) for col in LATENCY_COLUMNS})
    return row


def _measure(point: Point, models: dict[str, Transformer], generator: torch.Generator, timer: TimerConfig,
             settings: Settings) -> dict[str, Any]:
    """Time one point; an out-of-memory error becomes ``oom``, anything else ``error``."""
    timed = None
    try:
        timed = build_pass(point, models, generator, ragged=settings.ragged_contexts)
        if settings.device == "cuda":
            m = time_cuda(timed.fn, timer, graph=settings.cuda_graphs and timed.graphable)
        else:
            m = time_cpu(timed.fn, timer)
        return _row(point, "ok", m, note=m.note or ("graph" if m.graph else "eager"))
    except torch.cuda.OutOfMemoryError as exc:
        return _row(point, "oom", note=_first_line(exc))
    except RuntimeError as exc:
        status = "oom" if "out of memory" in str(exc) or "can't allocate memory" in str(exc) else "error"
        return _row(point, status, note=_first_line(exc))
    except Exception as exc:  # noqa: BLE001 - one bad point must not end an hours-long run
        return _row(point, "error", note=_first_line(exc))
    finally:
        del timed
        if settings.device == "cuda":
            gc.collect()
            torch.cuda.empty_cache()


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


def _row(point: Point, status: str, m: Measurement | None = None, note: str = "") -> dict[str, Any]:
    row: dict[str, Any] = dict(zip(KEY_COLUMNS, point.key))
    row.update(status=status, samples=0, note=note)
    if m is not None:
        row.update(m.stats())
    return row


def build_meta(settings: Settings, cfgs: dict[str, ModelConfig], device: dict[str, Any], available: int,
               budget: int, table: pd.DataFrame) -> dict[str, Any]:
    """The profile sidecar: REQUIRED_META and what a reader needs to trust or reproduce it."""
    graph_phases = sorted(f"{p}/{m}" for p, m in GRAPHABLE) if settings.device == "cuda" and settings.cuda_graphs else []
    ok = table[table.status == "ok"]
    fallbacks = ok[ok.note.str.startswith("CUDA graph capture failed")]
    skipped = table[table.status != "ok"]
    return {
        "name": f"{settings.device}-{cfgs['target'].name}-{cfgs['draft'].name}".replace("/", "--"),
        "device": device,
        "dtype": settings.dtype,
        "versions": versions(),
        "models": {role: {"name": cfg.name, "config": cfg.to_dict(), "params": param_count(cfg),
                          "weight_bytes": weight_bytes(cfg, settings.dtype),
                          "kv_bytes_per_token": kv_bytes_per_token(cfg, settings.dtype)}
                   for role, cfg in cfgs.items()} | drafter_models(settings, cfgs["target"]),
        "grid": {**settings.grid.to_dict(), "max_len": min(c.max_position_embeddings for c in cfgs.values())},
        "timing": {"method": "cuda_events" if settings.device == "cuda" else "perf_counter",
                   "cuda_graphs": graph_phases, "graph_fallbacks": int(len(fallbacks)),
                   "attention": split_attention_notes(),
                   "decode_contexts": "ragged" if settings.ragged_contexts else "uniform",
                   "warmup": settings.grid.warmup, "repeats": settings.grid.repeats,
                   "budget_s": settings.grid.budget_s, "threads": device["threads"]},
        "memory": {"available_bytes": available, "fraction": settings.memory_fraction, "budget_bytes": budget},
        "kv_capacity_tokens": memory.kv_capacity_tokens(budget, cfgs["target"], cfgs["draft"], settings.dtype,
                                                        settings.device),
        "seed": settings.seed,
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "skipped": [{**{k: r[k] for k in KEY_COLUMNS}, "status": r["status"], "reason": r["note"]}
                    for r in skipped[list(KEY_COLUMNS) + ["status", "note"]].to_dict("records")],
    }


HEADS = ("eagle", "eagle3", "mtp", "medusa")


def drafter_models(settings: Settings, target: ModelConfig) -> dict[str, Any]:
    """The sidecar's entries for the drafters besides the draft model (their weights and KV per token:
    the run's KV capacity per method follows them, sim.speculation.methods.kv_capacity_for)."""
    out: dict[str, Any] = {}
    nbytes = dtype_bytes(settings.dtype)
    for method in settings.drafters:
        if method in HOST_DRAFTERS:
            out[method] = {"name": f"{method} proposer (host)", "config": {"method": method, "num_layers": 0,
                                                                           **host_info()},
                           "params": 0, "weight_bytes": 0, "kv_bytes_per_token": 0}
            continue
        shape = head_shape(method, target)
        out[method] = {"name": f"{method} head of {target.name}", "config": shape.config(), "params": shape.params,
                       "weight_bytes": head_weight_bytes(method, target, nbytes),
                       "kv_bytes_per_token": 0 if method == "medusa" else
                       kv_bytes_per_token(layer_config(shape, target), settings.dtype)}
    return out


class Progress:
    """tqdm when installed, else one plain line per point on stderr."""

    def __init__(self, total: int, done: int, *, enabled: bool) -> None:
        self.total, self.done, self.enabled, self.bar = total, done, enabled, None
        self.start = time.perf_counter()
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=done, unit="pt", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                if done:
                    print(f"resuming: {done} of {total} points already measured", file=sys.stderr)

    def update(self, point: Point, row: dict[str, Any]) -> None:
        self.done += 1
        if not self.enabled:
            return
        result = f"{row['latency_median_s'] * 1e3:.2f} ms" if row["status"] == "ok" else row["status"]
        if self.bar is not None:
            self.bar.set_postfix_str(f"{point.label()}: {result}", refresh=False)
            self.bar.update(1)
        else:
            elapsed = time.perf_counter() - self.start
            print(f"[{self.done:>{len(str(self.total))}}/{self.total}] {elapsed:7.1f}s  {point.label()}: {result}",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
