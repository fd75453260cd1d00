"""t_overhead: what a serving step costs beyond the passes calibration times.

A real engine spends time per step outside its model passes: the scheduler and the
policy, assembling inputs, sampling bookkeeping, rolling back and moving KV-cache
entries. The cost model adds it per step (docs/cost-model.md's t_overhead). It is measured
here the only honest way, with the engine itself: a short real replay
(:mod:`calibrate.replay`) of a small workload inside the grid, timing every step and
every calibrated pass in it; per phase, the median remainder inside a step plus the
mean time between steps (:func:`calibrate.replay.step_overheads`) is stored in the
profile's sidecar as ``engine_overhead``. The replay runs at one row, at four and at the
grid's largest batch up to 16 (:func:`sweep_batches`), and a decode step's overhead is the
line through them, per step and per running row (where an engine's bookkeeping grows with its rows). The
workload is fixed by the grid, not
by any scenario a validation later runs, so the validation stays out of sample. On a
machine with only torch, numpy and pandas the grid is still measured; the overhead is
then skipped with a warning (and charged as 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.costmodel.profile import load_profile

# Long enough that a step which retires a request (and moves the rows behind it) is the exception,
# as in serving, not every other step: with 12 tokens the H100 replay charged 3.1 ms a decode step
# where replays of served workloads measured 1.4-2.0 ms (issue 33).
OUTPUT_TOKENS = 48


def measure_overhead(profile_dir: str | Path, batch: int | None = None, k: int | None = None) -> dict[str, Any]:
    """Replay a small workload on the profile's device and models; return the overhead record.

    ``batch`` and ``k`` (default: 4, or the grid's largest batch if smaller, and 2, or the profile's
    k_max) set the replay's batch limit and fixed k; the workload is 3 x batch requests sent at once.
    The replay drives the simulator's scheduler and policies, so it needs the simulator's
    dependencies (simpy, scipy, tomli-w) besides torch: an ImportError says which is missing.
    """
    from calibrate.replay import replay_config
    from sim.config import load_config

    profile = load_profile(profile_dir)
    grid = profile.meta.get("grid", {})
    batch = usual_batch(grid.get("batch_sizes", [1])) if batch is None else batch
    k = min(2, profile.k_max) if k is None else k
    prompt = min(grid.get("prompts", [32]))
    values = {"profile": str(profile.path), "policy.name": "fixed", "policy.k": k, "engine.max_batch_size": batch,
              "workload.num_requests": 3 * batch, "workload.rate": 1e6, "workload.prompt_tokens": str(prompt),
              "workload.output_tokens": str(OUTPUT_TOKENS)}
    config = load_config(None, {key: (value, "calibration") for key, value in values.items()})
    result, measured = replay_config(config)
    overhead = {key: value for key, value in result.extra["replay"].items()
                if key.endswith(("_overhead_s", "_between_steps_s"))}
    return {**overhead, "steps": len(measured.steps), "batch_size": batch, "k": k, "prompt_tokens": prompt,
            "output_tokens": OUTPUT_TOKENS, "method": "median per-step time outside the timed passes plus the mean "
                                                   "time between steps, in a real replay (calibrate.overhead)"}


# The rows a served step usually holds stop well short of a large grid's top (a replay of 3 x 256
# requests would take minutes): the per-row line is measured up to here.
SWEEP_MAX_BATCH = 16


def usual_batch(batches) -> int:
    """The batch an overhead replay runs at by default: 4, or the largest of ``batches`` if smaller."""
    return min(4, max(batches, default=1))


def sweep_batches(grid_batches) -> list[int]:
    """The batch sizes calibration replays at: one row, the usual point (4, or the grid's top if smaller)
    and the grid's largest size up to :data:`SWEEP_MAX_BATCH`; one size where the grid has no other."""
    usual = usual_batch(grid_batches)
    largest = max((b for b in grid_batches if b <= SWEEP_MAX_BATCH), default=usual)
    return sorted({1, usual, max(largest, usual)})


def fit_per_row(records: list[dict[str, Any]]) -> tuple[float, float]:
    """(seconds per step, seconds per row per step) of the decode overhead: the least-squares line through
    the records' (batch size, decode overhead), neither part negative; one record: its overhead, 0 per row."""
    import numpy as np

    rows = np.array([r["batch_size"] for r in records], dtype=float)
    decode = np.array([r["decode_overhead_s"] for r in records], dtype=float)
    if len(set(rows.tolist())) < 2:
        return float(decode.mean()), 0.0
    slope = max(float(np.polyfit(rows, decode, 1)[0]), 0.0)
    return max(float(decode.mean() - slope * rows.mean()), 0.0), slope


def overhead_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The sidecar's ``engine_overhead`` from replays at several batch sizes: the usual point's record
    (its prefill overhead), with the decode overhead as the fitted line and every replay kept."""
    usual = next((r for r in records if r["batch_size"] == usual_batch([r["batch_size"] for r in records])), records[0])
    base, per_row = fit_per_row(records)
    return {**usual, "decode_overhead_s": base, "decode_overhead_per_row_s": per_row,
            "by_batch": [{k: r[k] for k in ("batch_size", "k", "steps", "decode_overhead_s", "prefill_overhead_s") if k in r}
                         for r in records],
            "method": "per batch size, the median per-step time outside the timed passes plus the mean time "
                      "between steps, in a real replay (calibrate.overhead); decode: the least-squares line "
                      "through the batch sizes, per step and per row"}


def measure_overheads(profile_dir: str | Path) -> dict[str, Any]:
    """Calibration's engine overhead: replays at :func:`sweep_batches` of the grid, fitted by
    :func:`overhead_record`, in case an engine's bookkeeping grows with its rows (on an H200 the replay's
    stayed near 1.1 ms a decode step from 1 to 16 rows once it stopped shifting rows, docs/validation.md)."""
    grid = load_profile(profile_dir).meta.get("grid", {})
    return overhead_record([measure_overhead(profile_dir, batch=b) for b in sweep_batches(grid.get("batch_sizes", [1]))])
