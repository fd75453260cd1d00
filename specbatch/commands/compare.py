"""``specbatch compare FILE``: a real run against the simulation of its requests.

FILE is either a ``vllm bench serve --save-result --save-detailed`` JSON, or a per-request
measurement file of your own deployment (CSV or Parquet, :mod:`workloads.measured`:
``arrival_s, prompt_tokens, output_tokens`` [, ``prompt_id, stage, ttft_s, e2e_s, ok``])
with the engine's settings given as flags. The second is simulated request for request
(its arrivals, lengths and prompt ids) and compared per stage: mean, p50, p90 and p99 of
TTFT, ITL ((E2E - TTFT) / (output tokens - 1), vLLM's TPOT) and E2E, real beside
simulated with the relative error, and whether each side kept up with the stage's rate
(:func:`saturated`). The rest of this docstring is about the vLLM JSON.

The simulation replays the result's requests (``--trace-vllm``: its prompt and output
lengths, sent at its start times where saved, else at its request rate and burstiness)
under the file's ``max_concurrency``, on the given profile and policy. The table has
vLLM's rows and layout with the real value, the simulated one and the relative error
(simulated - real) / real; below it, two-sample Kolmogorov-Smirnov tests of the
per-request TTFT, TPOT and E2EL and of the ITLs (``scipy.stats.ks_2samp``: D is the
largest gap between the two empirical CDFs; a small p says the two samples are unlikely
to come from one distribution). Real values are the file's own metrics where it has
them, else computed from its per-request lists with the simulator's definitions.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specbatch.commands.flags import RUN_FLAGS, add_run_flags, run_overrides
from sim.errors import InputError
from sim.lazy import lazy_module

pd = lazy_module("pandas")  # the cli imports this module: a plain run must not pay for pandas

# The file defines the workload: these run flags do not apply.
WORKLOAD_FLAGS = ("--arrival", "--rate", "--rate-profile", "--burstiness", "--cv", "--duration", "--num-requests",
                  "--prompt-tokens", "--output-tokens", "--trace", "--trace-vllm")
COMPARE_FLAGS = [f for f in RUN_FLAGS if f not in WORKLOAD_FLAGS]

# (label, key, unit scale) in vllm bench serve's order; a None key is a section header.
ROWS = (
    ("Successful requests:", "completed"),
    ("Benchmark duration (s):", "duration"),
    ("Total input tokens:", "total_input_tokens"),
    ("Total generated tokens:", "total_output_tokens"),
    ("Request throughput (req/s):", "request_throughput"),
    ("Output token throughput (tok/s):", "output_throughput"),
    ("Total Token throughput (tok/s):", "total_token_throughput"),
) + tuple(row for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                                  ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency"))
          for row in ((title, None), (f"Mean {name.upper()} (ms):", f"mean_{name}_ms"),
                      (f"Median {name.upper()} (ms):", f"median_{name}_ms"),
                      (f"P99 {name.upper()} (ms):", f"p99_{name}_ms")))
KS_METRICS = ("ttft", "tpot", "itl", "e2el")
COUNTS = frozenset({"completed", "total_input_tokens", "total_output_tokens"})


@dataclass(frozen=True)
class Comparison:
    """The real run beside the simulated one: ``table`` (metric, real, sim, rel_error) and ``ks``."""

    table: pd.DataFrame
    ks: pd.DataFrame
    result: object  # the simulation's sim.simulate.RunResult

    def __str__(self) -> str:
        return format_comparison(self)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("result", help="a `vllm bench serve --save-result --save-detailed` JSON file, or a "
                                       "per-request measurement file (.csv, .csv.gz, .parquet: arrival_s, "
                                       "prompt_tokens, output_tokens[, prompt_id, stage, ttft_s, e2e_s, ok])")
    parser.add_argument("--config", help="TOML scenario file (its workload is replaced by the file's requests)")
    add_run_flags(parser, COMPARE_FLAGS, helps={"--max-concurrency": "override the file's max_concurrency"})


def main(args: argparse.Namespace) -> int:
    comparison = compare_file(args.result, args.config, run_overrides(args, COMPARE_FLAGS))
    print(comparison)
    if comparison.result.config.output.dir is not None:
        from specbatch.commands.outputs import write_run

        print(f"Wrote {write_run(comparison.result, comparison.result.config.output.dir)}/")
    return 0


def compare_file(path: str, config: str | None = None, overrides: dict | None = None):
    """Simulate the requests at ``path`` and compare (overrides: as load_config's): a
    :class:`Comparison` for a vLLM result JSON, a :class:`StageComparison` for a per-request
    measurement file."""
    from sim.config import load_config
    from sim.simulate import execute, prepare
    from workloads import TraceError, read_vllm_result
    from workloads.measured import is_measured_file

    if is_measured_file(path):
        return compare_measured(path, config, overrides)

    try:
        real = read_vllm_result(path)
    except TraceError as exc:
        raise InputError(exc.message, source=exc.path, line=exc.line, field=exc.field) from None
    overrides = dict(overrides or {})
    overrides["workload.trace_vllm"] = (str(path), "RESULT")
    given = overrides.get("workload.max_concurrency")
    if (given is None or (isinstance(given, tuple) and given[0] is None)) and real.max_concurrency is not None:
        overrides["workload.max_concurrency"] = (real.max_concurrency, "RESULT")
    result = execute(prepare(load_config(config, overrides)))
    return Comparison(*compare(real, result), result)


def real_metrics(real) -> dict[str, float]:
    """The real run's metrics: the file's own, else computed from its per-request lists."""
    from sim.metrics import distribution_stats

    computed: dict[str, float] = {"completed": float(real.prompt_tokens.shape[0]),
                                  "total_input_tokens": float(real.prompt_tokens.sum()),
                                  "total_output_tokens": float(real.output_tokens.sum())}
    e2el, tpot = real.e2el_s(), real.tpot_s()
    if real.ttft_s is not None:
        computed.update(distribution_stats("ttft", real.ttft_s))
    if e2el is not None:
        computed.update(distribution_stats("e2el", e2el))
        computed.update(distribution_stats("tpot", tpot))
    if real.itl_s is not None:
        computed.update(distribution_stats("itl", _concat(real.itl_s)))
    duration = real.metrics.get("duration")
    if duration:
        for key, total in (("request_throughput", "completed"), ("output_throughput", "total_output_tokens")):
            computed[key] = computed[total] / duration
        tokens = computed["total_input_tokens"] + computed["total_output_tokens"]
        computed["total_token_throughput"] = tokens / duration
    out = {}
    for _, key in ROWS:
        if key is None:
            continue
        value = real.metrics.get(key, computed.get(key, math.nan))
        out[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    return out


def compare(real, result) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(metric table, KS table) of a :class:`workloads.VllmResult` against a simulation's RunResult."""
    from scipy.stats import ks_2samp

    sim = {**result.summary, "duration": result.summary["duration_s"]}
    real_values = real_metrics(real)
    rows = []
    for label, key in ROWS:
        if key is None:
            continue
        r, s = real_values[key], float(sim.get(key, math.nan))
        rel = (s - r) / r if r and math.isfinite(r) and math.isfinite(s) else math.nan
        rows.append({"metric": key, "label": label, "real": r, "sim": s, "rel_error": rel})
    table = pd.DataFrame(rows)
    done = result.requests[result.requests.finish_s.notna()]
    sim_samples = {"ttft": done.ttft_s.to_numpy(), "tpot": done.tpot_s.dropna().to_numpy(),
                   "e2el": done.e2el_s.to_numpy(), "itl": np.repeat(*result.itl) if result.itl else np.zeros(0)}
    real_samples = {"ttft": real.ttft_s, "tpot": real.tpot_s(), "e2el": real.e2el_s(),
                    "itl": _concat(real.itl_s) if real.itl_s is not None else None}
    tests = []
    for name in KS_METRICS:
        a, b = real_samples[name], sim_samples[name]
        if a is None or a.size == 0 or b.size == 0:
            tests.append({"metric": name, "statistic": math.nan, "pvalue": math.nan,
                          "n_real": 0 if a is None else int(a.size), "n_sim": int(b.size)})
            continue
        test = ks_2samp(a, b)
        tests.append({"metric": name, "statistic": float(test.statistic), "pvalue": float(test.pvalue),
                      "n_real": int(a.size), "n_sim": int(b.size)})
    return table, pd.DataFrame(tests)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0)


def format_comparison(comparison: Comparison) -> str:
    width = 72
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result: real vs simulated ", n=width, c="=")]
    lines.append(f"{'':<40}{'real':>10}{'sim':>11}{'rel. err':>11}")
    values = {row.metric: row for row in comparison.table.itertuples()}
    for label, key in ROWS:
        if key is None:
            lines.append("{s:{c}^{n}}".format(s=label, n=width, c="-"))
            continue
        row = values[key]
        digits = 0 if key in COUNTS else 2
        lines.append(f"{label:<40}{_num(row.real, digits):>10}{_num(row.sim, digits):>11}{_pct(row.rel_error):>11}")
    lines.append("{s:{c}^{n}}".format(s="Kolmogorov-Smirnov (real vs sim)", n=width, c="-"))
    lines.append(f"{'':<40}{'D':>10}{'p-value':>11}{'n real/sim':>11}")
    for t in comparison.ks.itertuples():
        lines.append(f"{t.metric.upper() + ':':<40}{_num(t.statistic, 3):>10}{_p(t.pvalue):>11}"
                     f"{f'{t.n_real}/{t.n_sim}':>11}")
    lines.append("=" * width)
    return "\n".join(lines)


def _num(value: float, digits: int = 2) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.{digits}f}"


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{100 * value:+.1f}%"


def _p(value: float) -> str:
    return "n/a" if not math.isfinite(value) else (f"{value:.3f}" if value >= 1e-3 else f"{value:.1e}")


# ---------------------------------------------------------------------------------------------
# per-request measurement files

METRICS = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E"))
STATS = ("mean", "p50", "p90", "p99")
SATURATION_SLOPE = 0.01  # TTFT growing by more than 1% of the time elapsed: the queue grows, the engine fell behind
FAILED_SHARE = 0.05  # more failed requests than this: the real engine did not keep up either


@dataclass(frozen=True)
class StageComparison:
    """A measured run beside its simulation, per stage.

    ``table``: stage, metric (ttft, itl, e2e), stat (mean, p50, p90, p99), real, sim, rel_error
    (seconds; the real values over the requests that succeeded, the simulated over the same
    requests); ``stages``: stage, requests, failed, start_s, duration_s, rate_rps,
    real_saturated, sim_saturated; ``samples``: one row per simulated request (stage, ok, and
    real_/sim_ ttft, itl, e2e) for plots; ``result``: the simulation's RunResult.
    """

    table: pd.DataFrame
    stages: pd.DataFrame
    samples: pd.DataFrame
    result: object

    def __str__(self) -> str:
        return format_stages(self)

    def error(self, metric: str, stat: str) -> pd.Series:
        """The relative error of one statistic, per stage."""
        rows = self.table[(self.table.metric == metric) & (self.table.stat == stat)]
        return rows.set_index("stage").rel_error


def compare_measured(path, config: str | None = None, overrides: dict | None = None) -> StageComparison:
    """Simulate the requests of a measurement file with the given settings and compare them per stage."""
    import tempfile

    from sim.config import load_config
    from sim.simulate import execute, prepare
    from workloads import TraceError
    from workloads.measured import read_measured

    try:
        measured = read_measured(path)
    except TraceError as exc:
        raise InputError(exc.message, source=exc.path, line=exc.line, field=exc.field) from None
    simulated = measured.simulated_rows()
    overrides = dict(overrides or {})
    with tempfile.TemporaryDirectory(prefix="specbatch-compare-") as folder:
        trace = Path(folder) / "requests.csv"
        columns = ["arrival_s", "prompt_tokens", "output_tokens"] + (["prompt_id"] if "prompt_id" in simulated else [])
        simulated[columns].to_csv(trace, index=False, float_format="%.9f")
        overrides["workload.trace"] = (str(trace), "FILE")
        result = execute(prepare(load_config(config, overrides)))
    return compare_requests(simulated.reset_index(drop=True), result)


def compare_requests(real: pd.DataFrame, result) -> StageComparison:
    """The per-stage comparison of measured requests (rows in arrival order, as simulated) with
    the simulation's requests table (one row each, in the same order)."""
    sim = result.requests
    if len(sim) != len(real):
        raise ValueError(f"{len(real)} measured requests but {len(sim)} simulated")
    samples = pd.DataFrame({"stage": real.stage.to_numpy(), "ok": real.ok.to_numpy().astype(bool),
                            "arrival_s": real.arrival_s.to_numpy()})
    steps = np.maximum(real.output_tokens.to_numpy() - 1, 1)
    for side, ttft, e2e in (("real", real.get("ttft_s"), real.get("e2e_s")), ("sim", sim.ttft_s, sim.e2el_s)):
        ttft = np.full(len(real), np.nan) if ttft is None else np.asarray(ttft, dtype=float)
        e2e = np.full(len(real), np.nan) if e2e is None else np.asarray(e2e, dtype=float)
        itl = np.where(real.output_tokens.to_numpy() > 1, (e2e - ttft) / steps, np.nan)
        samples[f"{side}_ttft"], samples[f"{side}_itl"], samples[f"{side}_e2e"] = ttft, itl, e2e
    rows, stages = [], []
    for stage, part in samples.groupby("stage", sort=True):
        judged = part[part.ok & part.real_e2e.notna()] if part.real_e2e.notna().any() else part
        for metric, _ in METRICS:
            for stat in STATS:
                r = _stat(judged[f"real_{metric}"].to_numpy(), stat)
                s = _stat(judged[f"sim_{metric}"].to_numpy(), stat)
                rows.append({"stage": stage, "metric": metric, "stat": stat, "real": r, "sim": s,
                             "rel_error": (s - r) / r if r and math.isfinite(r) and math.isfinite(s) else math.nan})
        start, end = float(part.arrival_s.min()), float(part.arrival_s.max())
        failed = int((~part.ok).sum())
        real_known = part.ok & part.real_ttft.notna()
        stages.append({"stage": stage, "requests": len(part), "failed": failed, "start_s": start,
                       "duration_s": end - start, "rate_rps": (len(part) - 1) / (end - start) if end > start else math.nan,
                       "real_saturated": (saturated(part.arrival_s[real_known], part.real_ttft[real_known])
                                          or failed > FAILED_SHARE * len(part)) if real_known.any() else None,
                       "sim_saturated": saturated(part.arrival_s, part.sim_ttft)})
    return StageComparison(pd.DataFrame(rows), pd.DataFrame(stages), samples, result)


def saturated(arrival_s, ttft_s) -> bool:
    """Whether an engine fell behind a stage's arrivals: its TTFT grows through the stage, faster than
    :data:`SATURATION_SLOPE` seconds per second elapsed (least squares); an engine that keeps up
    holds its queue, and TTFT, steady."""
    t, y = np.asarray(arrival_s, dtype=float), np.asarray(ttft_s, dtype=float)
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    if t.size < 3 or np.ptp(t) == 0:
        return False
    return bool(np.polyfit(t - t.mean(), y, 1)[0] > SATURATION_SLOPE)


def _stat(values: np.ndarray, stat: str) -> float:
    values = values[np.isfinite(values)]
    if not values.size:
        return math.nan
    return float(np.mean(values)) if stat == "mean" else float(np.percentile(values, float(stat[1:])))


def format_stages(comparison: StageComparison) -> str:
    width = 110
    lines = ["{s:{c}^{n}}".format(s=" Real vs simulated, per stage ", n=width, c="="),
             "ITL = (E2E - TTFT) / (output tokens - 1), vLLM's TPOT; real over the requests that succeeded",
             f"{'':<10}" + "".join(f"{stat:^25}" for stat in STATS),
             f"{'':<10}" + f"{'real':>8}{'sim':>9}{'error':>8}" * len(STATS)]
    for stage in comparison.stages.itertuples():
        lines.append("{s:{c}^{n}}".format(s=f" stage {stage.stage} ", n=width, c="-"))
        rate = f"{stage.rate_rps:.2f} req/s over {stage.duration_s:.0f} s" if math.isfinite(stage.rate_rps) else "one request"
        kept = {True: "fell behind", False: "kept up", None: "not measured"}
        lines.append(f"{stage.requests:,} requests, {stage.failed:,} failed, {rate}: real {kept[stage.real_saturated]}, "
                     f"simulation {kept[stage.sim_saturated]}")
        for metric, label in METRICS:
            cells = []
            for stat in STATS:
                row = comparison.table[(comparison.table.stage == stage.stage) & (comparison.table.metric == metric)
                                       & (comparison.table.stat == stat)].iloc[0]
                cells.append(f"{_ms(row.real):>8}{_ms(row.sim):>9}{_error(row.rel_error):>8}")
            lines.append(f"{label + ' ms':<10}" + "".join(cells))
    lines.append("=" * width)
    return "\n".join(lines)


def _error(value: float) -> str:
    """A relative error: one decimal below 100%, whole percents above (where the decimal says nothing)."""
    if not math.isfinite(value):
        return "n/a"
    return f"{100 * value:+.1f}%" if abs(value) < 1 else f"{100 * value:+.0f}%"


def _ms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "n/a"
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 1000 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"
