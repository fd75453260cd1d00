"""The simulator's error against a real replay, measured in parts (``specbatch validate``).

End to end, an error mixes the machine's noise, the scheduling logic and the cost model.
Each is measured apart here, from what the real replays recorded:

* the noise floor: real against real, over replays of the same scenario and seed;
* the logic: the simulator's loop fed a replay's measured steps (:mod:`sim.serving.recorded`);
* the cost model: per step, the profile's price against the measured step;
* drift: the device's speed over stretches of a replay, from its own timed passes;
* equivalence: a TOST on mean E2EL, beside the KS tests of :mod:`specbatch.commands.validation`.

Replays are duck-typed (``calibrate.replay.ReplayResult``) so that this module, like the
rest of ``sim``, never imports torch.
"""

from __future__ import annotations

import math

import numpy as np

from sim.lazy import lazy_module
from sim.serving.records import PREFILL

pd = lazy_module("pandas")  # the CLI's parser imports validation, which imports this: a plain run pays no pandas

TOST_MARGIN = 0.05  # the equivalence test's margin on mean E2EL, relative to the real mean
LOGIC_TOLERANCE = 0.005  # the logic check: per-request TTFT and E2EL within 0.5% of the replay's
LOGIC_RESIDUAL = 1e-9  # ... and, the engine overhead between steps added, equal up to rounding
DRIFT_WINDOWS = 8  # stretches of the replay over which the device's speed is measured
LATENCIES = (("e2el", "E2EL"), ("ttft", "TTFT"), ("tpot", "TPOT"))
STATS = (("mean", "mean"), ("median", "p50"), ("p99", "p99"))
OTHER_METRICS = ("request_throughput", "output_throughput", "mean_acceptance_length", "num_steps")


def compared_metrics() -> list[tuple[str, str]]:
    """(summary key, label) of every metric the validation compares, in table order."""
    out = [(f"{stat}_{name}_ms", f"{label} {shown} (ms)") for name, label in LATENCIES for stat, shown in STATS]
    return out + [(m, m) for m in OTHER_METRICS]


def equivalence_test(real: pd.DataFrame, simulated: pd.DataFrame, margin: float = TOST_MARGIN,
                     column: str = "e2el_s") -> dict:
    """TOST (two one-sided t-tests) that the simulated mean is within ±margin of the real mean.

    Paired by request (the same request in every replay and in the simulation), which takes
    the requests' own spread of lengths out of the test. H0: the mean difference lies outside
    ±margin x the real mean; a p-value under 0.05 rejects it (equivalent). Per-request values
    of one run are correlated through the queue, so the test is optimistic on a short run.
    """
    from scipy.stats import ttest_1samp

    pairs = real[["request_id", column]].merge(simulated[["request_id", column]], on="request_id",
                                                suffixes=("_real", "_sim")).dropna()
    diff = (pairs[f"{column}_sim"] - pairs[f"{column}_real"]).to_numpy()
    mean_real = float(pairs[f"{column}_real"].mean()) if len(pairs) else math.nan
    if diff.size < 2 or not math.isfinite(mean_real):
        return {"metric": f"mean {column}", "margin": margin, "n_pairs": int(diff.size), "p_value": None,
                "equivalent": False}
    bound = margin * mean_real
    lower = ttest_1samp(diff, -bound, alternative="greater").pvalue
    upper = ttest_1samp(diff, bound, alternative="less").pvalue
    p = float(max(lower, upper))
    return {"metric": f"mean {column}", "margin": margin, "n_pairs": int(diff.size),
            "mean_difference_relative": float(diff.mean() / mean_real), "p_value": p, "equivalent": p < 0.05}


# ------------------------------------------------------------ the noise floor
def as_pooled(summary: dict, requests: pd.DataFrame, repeats: int) -> dict:
    """A simulation's metrics computed as the replays' pooled ones are: over ``repeats`` copies of
    its requests. Every replay serves the same requests, and a percentile over 5 x 60 pooled
    values is not the same statistic as one over 60 (p99 of 60 leans on the second-worst request,
    p99 of 300 pooled on the worst one's five versions), so the two sides must be alike."""
    return summary if repeats == 1 else pooled_summary([summary] * repeats, [requests] * repeats)


def pooled_summary(summaries: list[dict], requests: list[pd.DataFrame]) -> dict:
    """The compared metrics over repeats pooled: latency statistics over every request of every
    repeat (so p99 is not one request's), the other metrics averaged over the repeats."""
    from sim.metrics import distribution_stats

    pooled = pd.concat(requests, ignore_index=True)
    out = {m: float(np.mean([s.get(m, math.nan) for s in summaries])) for m in OTHER_METRICS}
    for name, _ in LATENCIES:
        out.update(distribution_stats(name, pooled[f"{name}_s"].dropna().to_numpy()))
    return out


def noise_floor(summaries: list[dict]) -> pd.DataFrame:
    """Real against real: per metric, its spread over replays of the same scenario and seed.

    ``range`` = (max - min) / mean and ``cv`` = sample standard deviation / mean: a simulator
    error inside these is inside the machine's own noise.
    """
    rows = []
    for key, label in compared_metrics():
        values = np.array([float(s.get(key, math.nan)) for s in summaries])
        mean = float(values.mean())
        spread = values.size > 1 and mean != 0 and math.isfinite(mean)
        rows.append({"metric": key, "label": label, "repeats": int(values.size), "mean": mean,
                     "min": float(values.min()), "max": float(values.max()),
                     "range": float((values.max() - values.min()) / mean) if spread else math.nan,
                     "cv": float(values.std(ddof=1) / mean) if spread else math.nan})
    return pd.DataFrame(rows)


# ------------------------------------------------------- the scheduling logic alone
def logic_check(real, measured) -> dict:
    """The simulator's loop fed the replay's measured step times and accepted counts.

    It must take the replay's decisions step for step and reproduce every request's TTFT
    and E2EL. The playback charges each step up to the replay's next clock reading, so the
    simulated times are the replay's plus the loop's own work after the step that emitted
    the token (the engine overhead between steps): ``error`` is against the replay as
    measured, ``residual`` against the replay with that term added (0 up to rounding when
    the logic is right); ``overhead_term`` is the term's mean share.
    """
    from sim.serving.recorded import LogicDivergence, RecordedBackend
    from sim.simulate import execute, prepare

    steps = measured.recorded_steps()
    backend = RecordedBackend(steps)
    try:
        played = execute(prepare(real.config), backend=backend)
        backend.check_done()
    except LogicDivergence as exc:
        return {"reproduced": False, "passed": False, "divergence": str(exc), "steps": len(steps)}
    ends = measured.steps.end_s.to_numpy()
    out: dict = {"reproduced": True, "steps": len(steps), "tolerance": LOGIC_TOLERANCE}
    worst = 0.0
    # Behind a concurrency limit a request is sent when a finish frees a slot, and the playback's
    # finishes carry that same term: latencies run from a send moved by it (0 for open arrivals).
    # The residual below then no longer sees the sends, so both sides' are checked on their own.
    sent_shift = played.requests.arrival_s.to_numpy() - real.requests.arrival_s.to_numpy()
    limit = real.config.workload.max_concurrency
    if limit is not None:
        planned = prepare(real.config).requests.arrival_s
        out["client_send_error_s"] = max(_client_rule_error(planned, side.requests, limit) for side in (real, played))
    for name, column, emitted in (("ttft", "ttft_s", "first_token_s"), ("e2el", "e2el_s", "finish_s")):
        r, p = real.requests[column].to_numpy(), played.requests[column].to_numpy()
        at = np.minimum(np.searchsorted(ends, real.requests[emitted].to_numpy()), ends.size - 1)
        term = steps.until_s[at] - ends[at] - sent_shift  # the loop's work after the step that emitted the token
        error, residual = (p - r) / r, (p - r - term) / r
        worst = max(worst, float(np.abs(residual).max()))
        out[name] = {"mean_error": float(error.mean()), "max_abs_error": float(np.abs(error).max()),
                     "within_tolerance": float(np.mean(np.abs(error) <= LOGIC_TOLERANCE)),
                     "overhead_term": float(np.mean(term / r)), "max_abs_residual": float(np.abs(residual).max())}
    between = steps.until_s - ends
    inside = (measured.steps.end_s - measured.steps.start_s).to_numpy() - measured.step_passes_s
    wake = (measured.steps.start_s.to_numpy() - played.steps.start_s.to_numpy())[steps.idle_before]
    out["between_steps_ms"] = {"median": 1e3 * float(np.median(between)), "mean": 1e3 * float(between.mean()),
                               "total_s": float(between.sum())}
    out["in_step_overhead_ms"] = {"median": 1e3 * float(np.median(inside)), "mean": 1e3 * float(inside.mean())}
    out["wake_lag_ms"] = {"median": 1e3 * float(np.median(wake)) if wake.size else 0.0,
                          "max": 1e3 * float(wake.max()) if wake.size else 0.0, "idle_wakes": int(wake.size)}
    # The logic passes when it reproduces the replay's decisions and times exactly (the residual);
    # the overhead between steps is not the logic's but the engine's, shown apart.
    out["passed"] = bool(worst <= LOGIC_RESIDUAL and out.get("client_send_error_s", 0.0) == 0.0)
    out["within_tolerance"] = bool(all(abs(out[n]["mean_error"]) <= LOGIC_TOLERANCE for n in ("ttft", "e2el")))
    return out


def _client_rule_error(planned: np.ndarray, requests: pd.DataFrame, limit: int) -> float:
    """How far a run's send times are from its client's rule: request i sent at
    max(arrival_i, the (i - limit)-th finish), finishes in time order (0.0 when obeyed)."""
    sent, finishes = requests.arrival_s.to_numpy(), np.sort(requests.finish_s.to_numpy())
    expected = planned.astype(np.float64, copy=True)
    expected[limit:] = np.maximum(planned[limit:], finishes[:max(len(finishes) - limit, 0)])
    return float(np.abs(sent - expected).max()) if len(sent) else 0.0


def merge_logic(checks: list[dict]) -> dict:
    """One logic record over repeats: the worst repeat's figures, every repeat's verdict."""
    if len(checks) == 1:
        return checks[0]
    failed = [c for c in checks if not c["reproduced"]]
    if failed:
        return {**failed[0], "repeats": len(checks)}
    worst = max(checks, key=lambda c: max(abs(c["ttft"]["mean_error"]), abs(c["e2el"]["mean_error"])))
    return {**worst, "repeats": len(checks), "passed": all(c["passed"] for c in checks)}


# ----------------------------------------------------------- the cost model alone
def step_costs(measured, profile, speed: float = 1.0) -> pd.DataFrame:
    """Per step: the profile's price for that step (its batch, k, context and draft lag; a prefill's
    prompts padded to the longest) against its measured time on the engine, from its start to
    the loop's next clock reading (its passes and the engine's work around them).

    ``corrected``: the price with its passes scaled by ``speed`` (the device's measured speed
    during the replay), so what remains is the cost model's shape, not the machine's drift.
    """
    steps = measured.steps
    phase = steps.phase.to_numpy()
    overhead = np.where(phase == PREFILL, profile.engine_overhead_s("prefill"),
                        profile.decode_overhead_at(steps.batch_size.to_numpy()))
    passes = measured.step_predicted_s[:len(steps)]
    until = measured.recorded_steps().until_s
    frame = pd.DataFrame({
        "step": np.arange(len(steps)), "start_s": steps.start_s.to_numpy(),
        "group": np.where(phase == PREFILL, "prefill", [f"decode k={k}" for k in steps.k.to_numpy()]),
        "batch_size": steps.batch_size.to_numpy(), "k": steps.k.to_numpy(),
        "context": steps.mean_context_tokens.to_numpy(),
        "predicted_s": passes + overhead, "corrected_s": passes * speed + overhead,
        "measured_s": until - steps.start_s.to_numpy(), "measured_passes_s": measured.step_passes_s[:len(steps)]})
    return frame


def step_cost_summary(frame: pd.DataFrame) -> list[dict]:
    """Per phase (prefill; decode by k), then all steps: the absolute percentage error of the
    price against the measured time, median and p90, raw and speed-corrected, and the median
    signed error (the bias)."""
    rows = []
    groups = [(g, frame[frame.group == g]) for g in sorted(frame.group.unique(), key=group_order)]
    for group, part in groups + [("all steps", frame)]:
        raw = (part.predicted_s - part.measured_s) / part.measured_s
        fixed = (part.corrected_s - part.measured_s) / part.measured_s
        rows.append({"group": group, "steps": len(part),
                     "median_ape": float(raw.abs().median()), "p90_ape": float(raw.abs().quantile(0.9)),
                     "median_error": float(raw.median()),
                     "corrected_median_ape": float(fixed.abs().median()),
                     "corrected_p90_ape": float(fixed.abs().quantile(0.9)),
                     "corrected_median_error": float(fixed.median())})
    return rows


def step_cost_by_batch(frame: pd.DataFrame) -> list[dict]:
    """Decode steps by batch size: the median signed error of the price, raw and speed-corrected.
    A profile measured at some batch sizes prices the others by its fitted curve; a size the
    hardware runs unevenly slower (an odd GEMM shape) shows here as a bias of its own."""
    decode = frame[frame.group != "prefill"]
    rows = []
    for batch, part in decode.groupby("batch_size", sort=True):
        rows.append({"batch_size": int(batch), "steps": len(part),
                     "median_error": float(((part.predicted_s - part.measured_s) / part.measured_s).median()),
                     "corrected_median_error": float(((part.corrected_s - part.measured_s) / part.measured_s).median())})
    return rows


def group_order(group: str) -> tuple:
    """Sort key of a step-cost group: prefill first, then decode by k."""
    return (0, 0) if group == "prefill" else (1, int(group.rsplit("=", 1)[1]))


def drift(measured, windows: int = DRIFT_WINDOWS) -> dict:
    """How the device's speed moved during the replay, measured in place: every calibrated pass
    the replay runs is timed, so each stretch of ``windows`` equal runs of steps gives the
    ratio of its passes' time to the profile's (what a calibration interleaved with the
    replay would see)."""
    passes, predicted = measured.step_passes_s, measured.step_predicted_s[:len(measured.step_passes_s)]
    starts = measured.steps.start_s.to_numpy()
    parts = [p for p in np.array_split(np.arange(passes.size), min(windows, passes.size)) if p.size]
    ratios = [float(passes[p].sum() / predicted[p].sum()) for p in parts]
    times = [float(starts[p[0]]) for p in parts]
    mean = float(np.mean(ratios)) if ratios else math.nan
    return {"window_start_s": times, "speed_ratio": ratios, "min": min(ratios, default=math.nan),
            "max": max(ratios, default=math.nan),
            "cv": float(np.std(ratios, ddof=1) / mean) if len(ratios) > 1 else math.nan}
