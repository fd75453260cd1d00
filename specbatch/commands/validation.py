"""``specbatch validate`` and ``specbatch replay``: the simulator's error against reality.

``replay`` serves a scenario for real (``calibrate.replay``: torch models on the device
the scenario's profile was calibrated on) and writes a run folder like ``specbatch
run``'s, with a ``replay`` section in summary.json. ``validate`` replays the scenario,
simulates the same scenario (same config and seed, hence the same requests and
acceptance model), and reports the simulator's error in parts (docs/validation.md):

* end to end: per metric the real value, the simulated one and the relative error, raw
  and speed-corrected, a two-sample Kolmogorov-Smirnov test per latency (both) and a TOST
  equivalence test on mean E2EL;
* the noise floor (``--repeat N``): the spread of the metrics over N replays of the same
  scenario and seed, beside the simulator's error;
* the scheduling logic alone (``--logic``, on by default): the one serving loop fed the
  replay's measured step times and accepted counts (:mod:`sim.serving.recorded`) must
  reproduce its timeline;
* the cost model alone: per step, the profile's price against the measured time;
* the device's speed drift within the replay, measured in place from its timed passes.

Both price prefill as the replay runs it (``engine.prefill = "padded"``). A replay
interrupted with Ctrl-C still writes what it measured, marked partial (exit 130), and
``validate`` then skips the comparison: a partial replay is not comparable.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from sim.atomic_write import staged_dir
from sim.errors import InputError
from sim.lazy import lazy_module
from sim.costmodel.profile import write_scaled_profile
from specbatch.commands.fidelity import (DRIFT_WINDOWS, LATENCIES, compared_metrics, drift, equivalence_test,
                                   as_pooled, group_order, logic_check, merge_logic, noise_floor, pooled_summary,
                                   step_cost_by_batch, step_cost_summary, step_costs)

pd = lazy_module("pandas")  # only when the command runs: building the CLI's parser imports this module

INTERRUPTED = 130


def compare(real: dict, simulated: dict) -> pd.DataFrame:
    """One row per metric: real, simulated, simulated - real relative to real."""
    rows = []
    for key, label in compared_metrics():
        r, s = float(real.get(key, math.nan)), float(simulated.get(key, math.nan))
        error = (s - r) / r if r != 0 and math.isfinite(r) and math.isfinite(s) else math.nan
        rows.append({"metric": key, "label": label, "real": r, "simulated": s, "relative_error": error})
    return pd.DataFrame(rows)


def distribution_tests(real: pd.DataFrame, simulated: pd.DataFrame) -> pd.DataFrame:
    """Two-sample Kolmogorov-Smirnov test of each per-request latency, real vs simulated."""
    from scipy.stats import ks_2samp

    rows = []
    for name, label in LATENCIES:
        a = real[f"{name}_s"].dropna().to_numpy()
        b = simulated[f"{name}_s"].dropna().to_numpy()
        if a.size and b.size:
            test = ks_2samp(a, b)
            rows.append({"latency": label, "n_real": a.size, "n_simulated": b.size,
                         "ks_statistic": float(test.statistic), "p_value": float(test.pvalue)})
    return pd.DataFrame(rows)


# -------------------------------------------------------------------- the report
def format_table(table: pd.DataFrame, tests: pd.DataFrame, corrected_tests: pd.DataFrame | None = None) -> str:
    corrected = "speed_corrected" in table
    noise = "noise_cv" in table
    head = f"{'metric':28} {'real':>12} {'simulated':>12} {'error':>8}"
    if corrected:
        head += f" {'speed-corrected':>16} {'error':>8}"
    if noise:
        head += f" {'real range':>11} {'real CV':>8}"
    lines = [head, "-" * len(head)]
    for row in table.itertuples():
        line = f"{row.label:28} {_num(row.real):>12} {_num(row.simulated):>12} {_pct(row.relative_error):>8}"
        if corrected:
            line += f" {_num(row.speed_corrected):>16} {_pct(row.speed_corrected_error):>8}"
        if noise:
            line += f" {_pct(row.noise_range, sign=False):>11} {_pct(row.noise_cv, sign=False):>8}"
        lines.append(line)
    lines.append("")
    lines.append("two-sample Kolmogorov-Smirnov test, per-request latencies (real vs simulated"
                 + (", raw | speed-corrected):" if corrected_tests is not None else "):"))
    fixed = {row.latency: row for row in corrected_tests.itertuples()} if corrected_tests is not None else {}
    for row in tests.itertuples():
        line = f"  {row.latency:5} D = {row.ks_statistic:.3f}  p = {row.p_value:.3g}"
        if row.latency in fixed:
            line += f"  |  D = {fixed[row.latency].ks_statistic:.3f}  p = {fixed[row.latency].p_value:.3g}"
        lines.append(line + f"  (n = {row.n_real} real, {row.n_simulated} simulated)")
    return "\n".join(lines)


def format_tost(tost: dict, label: str) -> str:
    if tost.get("p_value") is None:
        return f"  {label}: too few requests for a test"
    verdict = "equivalent" if tost["equivalent"] else "not shown equivalent"
    return (f"  {label}: mean E2EL {_pct(tost['mean_difference_relative'])} vs real, "
            f"p = {tost['p_value']:.3g} ({verdict} within ±{100 * tost['margin']:.0f}%, {tost['n_pairs']} pairs)")


def format_logic(logic: dict) -> str:
    if not logic["reproduced"]:
        return f"scheduling logic: NOT reproduced: {logic['divergence']}"
    verdict = ("reproduced: every decision and time equal, up to the engine overhead between steps"
               if logic["passed"] else "NOT reproduced: the times differ beyond the engine overhead")
    lines = [f"scheduling logic (the loop fed the replay's {logic['steps']} measured steps and accepted counts): "
             + verdict]
    for name, label in (("ttft", "TTFT"), ("e2el", "E2EL")):
        part = logic[name]
        lines.append(f"  {label:4} vs the replay: mean {_pct(part['mean_error'], 2)}, max {_pct(part['max_abs_error'], 2, False)}, "
                     f"{100 * part['within_tolerance']:.0f}% of requests within {100 * logic['tolerance']:.1f}%; "
                     f"engine overhead between steps {_pct(part['overhead_term'], 2)}, "
                     f"the rest (residual) at most {part['max_abs_residual']:.1e}")
    lines.append(f"  engine overhead: {logic['in_step_overhead_ms']['median']:.2f} ms per step inside the step "
                 f"(outside the passes; median), {logic['between_steps_ms']['median']:.2f} ms between steps "
                 f"(median; mean {logic['between_steps_ms']['mean']:.2f}); waking for an arrival "
                 f"{logic['wake_lag_ms']['median']:.2f} ms late (median of {logic['wake_lag_ms']['idle_wakes']})")
    if "client_send_error_s" in logic:
        error = logic["client_send_error_s"]
        lines.append("  client (concurrency limit): every request sent at max(its arrival, the finish that freed its "
                     "slot), in the replay and played back" if error == 0.0 else
                     f"  client (concurrency limit): sends off the rule by up to {1e3 * error:.3f} ms")
    return "\n".join(lines)


def format_step_cost(rows: list[dict], by_batch: list[dict] | None = None) -> str:
    lines = ["cost model per step (the profile's price vs the measured step; absolute % error):",
             f"  {'phase':12} {'steps':>6} {'median':>8} {'p90':>8} {'bias':>8}   {'speed-corrected: median':>23} "
             f"{'p90':>8} {'bias':>8}"]
    for r in rows:
        lines.append(f"  {r['group']:12} {r['steps']:>6} {_pct(r['median_ape'], sign=False):>8} "
                     f"{_pct(r['p90_ape'], sign=False):>8} {_pct(r['median_error']):>8}   "
                     f"{_pct(r['corrected_median_ape'], sign=False):>23} {_pct(r['corrected_p90_ape'], sign=False):>8} "
                     f"{_pct(r['corrected_median_error']):>8}")
    if by_batch:
        lines.append("  decode by batch size, speed-corrected bias (steps): "
                     + ", ".join(f"{r['batch_size']}: {_pct(r['corrected_median_error'])} ({r['steps']})"
                                 for r in by_batch))
    return "\n".join(lines)


def _pct(x: float | None, digits: int = 1, sign: bool = True) -> str:
    if x is None or math.isnan(x):
        return ""
    return f"{100 * x:{'+' if sign else ''}.{digits}f}%"


def _num(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:,.0f}"


def plot_cdfs(real: pd.DataFrame, simulated: pd.DataFrame | dict, path: Path, title: str) -> None:
    """CDFs of each latency: the real replay(s) against one or more simulations (name -> requests)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sims = simulated if isinstance(simulated, dict) else {"simulated": simulated}
    styles = ("--", ":", "-.")
    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(12, 3.6))
    for ax, (name, label) in zip(axes, LATENCIES):
        for frame, what, style in ((real, "real replay", "-"),
                                   *((f, n, styles[i % 3]) for i, (n, f) in enumerate(sims.items()))):
            x = np.sort(frame[f"{name}_s"].dropna().to_numpy() * 1e3)
            ax.step(x, np.arange(1, x.size + 1) / max(x.size, 1), style, where="post", label=what)
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def plot_step_costs(frame: pd.DataFrame, path: Path, title: str) -> None:
    """Predicted against measured step time, one colour per phase (decode by k), log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharex=True, sharey=True)
    for ax, column, what in ((axes[0], "predicted_s", "profile's price"),
                             (axes[1], "corrected_s", "price, speed-corrected")):
        for group in sorted(frame.group.unique(), key=group_order):
            part = frame[frame.group == group]
            ax.scatter(part.measured_s * 1e3, part[column] * 1e3, s=8, alpha=0.6, label=group)
        lo = float(min(frame.measured_s.min(), frame[column].min())) * 1e3 * 0.8
        hi = float(max(frame.measured_s.max(), frame[column].max())) * 1e3 * 1.2
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured step (ms)")
        ax.set_ylabel(f"{what} (ms)")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


# ---------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser, *, validate: bool = True) -> None:
    from specbatch.commands.flags import RUN_FLAGS, add_run_flags

    parser.description = ("Replay a scenario with real batched speculative decoding on the device its profile was "
                          "calibrated on" + (", simulate it, and print the simulator's error." if validate else
                                             ", and write what it measured."))
    parser.add_argument("--config", help="TOML scenario file; flags override its values")
    add_run_flags(parser, [f for f, (key, _, _) in RUN_FLAGS.items()
                           if not key.startswith("output.timeline")])  # no timeline of a real replay
    parser.add_argument("--acceptance", choices=("synthetic", "real"), default="synthetic",
                        help="synthetic (default): accepted counts drawn from the acceptance model, the "
                             "verification kernel still run on the real logits; real: keep what rejection "
                             "sampling of the random-weight models decides")
    if validate:
        parser.add_argument("--repeat", type=_positive, default=1, metavar="N",
                            help="replay the scenario N times (same seed): the spread between the replays is "
                                 "the machine's noise floor, shown beside the simulator's error; latencies are "
                                 "compared over the N replays pooled (default 1)")
        parser.add_argument("--logic", action=argparse.BooleanOptionalAction, default=True,
                            help="check the scheduling logic alone: the simulator fed each replay's measured "
                                 "step times and accepted counts must reproduce its timeline (default: on)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return value


def main(args: argparse.Namespace) -> int:
    return _main(args, validate=True)


def _main(args: argparse.Namespace, *, validate: bool) -> int:
    from specbatch.commands.flags import run_overrides
    from sim.config import load_config

    config = load_config(args.config, run_overrides(args))
    if config.cluster.replicas != 1:
        raise config.error("cluster.replicas", "the real replay serves one replica")
    try:
        from calibrate.replay import replay_config
    except ImportError as exc:
        print(f"error: specbatch {'validate' if validate else 'replay'} needs torch ({exc}); "
              "pip install 'specbatch[calibrate]'", file=sys.stderr)
        return 2
    from specbatch.commands.outputs import default_output_dir, format_summary, write_run

    name = "validate" if validate else "replay"
    out = Path(config.output.dir or default_output_dir(f"{name}-{config.digest()}"))
    _check_out(out, config)
    repeats = getattr(args, "repeat", 1) if validate else 1

    def starting(index: int) -> None:
        which = f" (replay {index + 1} of {repeats})" if repeats > 1 else ""
        print(f"replaying {config.workload.num_requests or 'the'} requests in real time ({args.acceptance} "
              f"acceptance){which}; Ctrl-C stops and keeps what was measured", file=sys.stderr)

    replays = replay_repeats(config, repeats, args.acceptance, on_start=starting)
    for warning in replays[0][0].warnings:
        print(f"warning: {warning}", file=sys.stderr)
    real, measured = replays[-1]
    if validate:
        _, report = write_validation(replays, out, args.acceptance, logic=args.logic)
    else:
        write_run(real, out)  # atomic itself
    if measured.partial:
        done = real.extra["replay"]["completed"]
        where = out / _real_folder(len(replays) - 1) if validate else out
        print(f"interrupted: {done} of {len(real.requests)} requests finished; the partial replay is in "
              f"{where}/ (summary.json says partial)", file=sys.stderr)
        return INTERRUPTED
    if validate:
        print(report)
        folders = "real/" + (f", real-2/ .. real-{repeats}/" if repeats > 1 else "")
        print(f"Wrote {out}/ (validation.json, validation.csv, step_costs.csv, latency_cdf.png, step_cost.png, "
              f"{folders}, simulated/, speed-corrected/)")
    else:
        print(format_summary(real))
        print(f"Wrote {out}/")
    return 0


def replay_repeats(config, repeat: int = 1, acceptance: str = "synthetic", on_start=None) -> list:
    """``repeat`` real replays of ``config`` (same seed), as (RunResult, ReplayResult) pairs; stops
    after an interrupted one (it is the last, marked partial). ``on_start(index)`` is called
    just before each replay's clock starts."""
    from calibrate.replay import replay_config

    replays = []
    for index in range(repeat):
        started = (lambda index=index: on_start(index)) if on_start is not None else None
        real, measured = replay_config(config, acceptance=acceptance, on_start=started)
        replays.append((real, measured))
        if measured.partial:
            break
    return replays


def write_validation(replays: list, out: Path, acceptance: str, *, logic: bool = True
                     ) -> tuple[dict | None, str | None]:
    """Write the replays' run folders and, unless the last was interrupted, the validation
    (:func:`validation_report`) into ``out``, all at once; returns its document and report."""
    from specbatch.commands.outputs import write_run

    document = report = None
    with staged_dir(out) as staging:  # write_run is atomic itself; a validation's folders are staged together
        for index, (one, _) in enumerate(replays):
            write_run(one, staging / _real_folder(index))
        if not replays[-1][1].partial:
            document, report = validation_report(replays, staging, acceptance, logic=logic)
    return document, report


def _real_folder(index: int) -> str:
    return "real" if index == 0 else f"real-{index + 1}"


def validation_report(replays: list, staging: Path, acceptance: str, *, logic: bool = True) -> tuple[dict, str]:
    """Simulate what ``replays`` (complete replays of one config) served, compare, write the
    validation files into ``staging``; returns validation.json's document and the printed report."""
    from specbatch.commands.outputs import write_run
    from sim.simulate import simulate

    first = replays[0][0]
    profile, config = first.profile, first.config  # the resolved config the replays ran (prefill padded)
    sim = simulate(config)
    write_run(sim, staging / "simulated")
    summaries = [r.summary for r, _ in replays]
    requests = [r.requests for r, _ in replays]
    real_summary = summaries[0] if len(replays) == 1 else pooled_summary(summaries, requests)
    pooled = pd.concat(requests, ignore_index=True)
    table = compare(real_summary, as_pooled(sim.summary, sim.requests, len(replays)))
    # The same simulation on the profile scaled by the speed the device ran the passes at
    # during the replays: what remains is the model's error, not the machine's drift.
    speeds = [m_extra["pass_speed_ratio"] for m_extra in (r.extra["replay"] for r, _ in replays)]
    speed = float(np.exp(np.mean(np.log(speeds))))
    scaled = write_scaled_profile(profile, speed, staging / "speed-corrected" / "profile")
    corrected = simulate(replace(config, profile=str(scaled)))
    write_run(corrected, staging / "speed-corrected" / "run")
    fixed = compare(real_summary, as_pooled(corrected.summary, corrected.requests, len(replays)))
    table["speed_corrected"] = fixed["simulated"]
    table["speed_corrected_error"] = fixed["relative_error"]
    noise = noise_floor(summaries)
    if len(replays) > 1:
        table["noise_range"] = noise["range"]
        table["noise_cv"] = noise["cv"]
    tests = distribution_tests(pooled, sim.requests)
    corrected_tests = distribution_tests(pooled, corrected.requests)
    tost = {"raw": equivalence_test(pooled, sim.requests), "speed_corrected": equivalence_test(pooled,
                                                                                                corrected.requests)}
    costs = pd.concat([step_costs(m, profile, speed).assign(replay=i + 1) for i, (_, m) in enumerate(replays)],
                      ignore_index=True)
    cost_rows, by_batch = step_cost_summary(costs), step_cost_by_batch(costs)
    drifts = [drift(m) for _, m in replays]
    document = {"simulated_pooled": True, "profile": profile.name, "profile_created_utc": profile.meta.get("created_utc"),
                "profile_batch_sizes": profile.meta.get("grid", {}).get("batch_sizes"),
                "acceptance": acceptance, "config_digest": config.digest(),
                "repeats": len(replays), "requests_per_replay": len(first.requests),
                "metrics": _records(table), "ks_tests": _records(tests), "ks_tests_corrected": _records(corrected_tests),
                "tost": tost, "noise_floor": _records(noise), "step_cost": cost_rows, "step_cost_by_batch": by_batch,
                "drift": drifts, "speed_ratio": speed, "replay": first.extra["replay"],
                "replays": [r.extra["replay"] for r, _ in replays]}
    if logic:
        checks = []
        for index, (real, measured) in enumerate(replays):
            checks.append(logic_check(real, measured))
        document["logic"] = merge_logic(checks)
    (staging / "validation.json").write_text(json.dumps(_clean(document), indent=2, sort_keys=True) + "\n")
    table.to_csv(staging / "validation.csv", index=False, float_format="%.9g", lineterminator="\n")
    costs.to_csv(staging / "step_costs.csv", index=False, float_format="%.9g", lineterminator="\n")
    title = (f"{profile.name}: {config.policy.name}, {config.engine.batching} batching, "
             f"{len(first.requests)} requests" + (f" x {len(replays)} replays" if len(replays) > 1 else ""))
    try:
        plot_cdfs(pooled, {"simulated": sim.requests, "speed-corrected": corrected.requests},
                  staging / "latency_cdf.png", title)
        plot_step_costs(costs, staging / "step_cost.png", title)
    except ImportError:
        print("note: no matplotlib, so no latency_cdf.png, step_cost.png (pip install 'specbatch[docs]')",
              file=sys.stderr)
    replayed = first.extra["replay"]
    lines = [f"validation of {profile.name}, {acceptance} acceptance, {len(first.requests)} requests"
             + (f" x {len(replays)} replays (latencies pooled)" if len(replays) > 1 else ""),
             f"  the device ran the timed passes at {_ratios(speeds)} their calibrated time "
             f"(within the replay{'s' if len(replays) > 1 else ''}: {_drift_span(drifts)}); engine overhead per step "
             f"{1e3 * replayed['decode_overhead_s']:.2f} ms decode, {1e3 * replayed['prefill_overhead_s']:.2f} ms "
             f"prefill (profile: {1e3 * profile.engine_overhead_s('decode'):.2f}"
             + (f" + {1e3 * profile.engine_overhead_per_row_s('decode'):.3f} a row"
                if profile.engine_overhead_per_row_s("decode") else "")
             + f" / {1e3 * profile.engine_overhead_s('prefill'):.2f} ms)"
             + _by_kind(replayed.get("cuda_graphs", {}).get("passes_by_kind")),
             format_table(table, tests, corrected_tests),
             "TOST equivalence test, mean E2EL within ±5% (paired by request):",
             format_tost(tost["raw"], "raw            "), format_tost(tost["speed_corrected"], "speed-corrected"),
             "", format_step_cost(cost_rows, by_batch)]
    if logic:
        lines += ["", format_logic(document["logic"])]
    return _clean(document), "\n".join(lines)


def _by_kind(kinds: dict | None) -> str:
    """On a GPU, the first replay's passes by kind: the time between their events (inputs staged, then the
    graph) and their graphs' replays alone, which is what calibration times; '' where not recorded."""
    if not kinds:
        return ""
    parts = [f"{kind} {v['passes']} passes {1e3 * v['span_s'] / max(v['passes'], 1):.3f} / "
             f"{1e3 * v['graph_s'] / max(v['passes'], 1):.3f} ms" for kind, v in kinds.items()]
    return "\n  passes by kind, each on average in its span / in its graph alone: " + "; ".join(parts)


def _ratios(speeds: list[float]) -> str:
    return f"{speeds[0]:.3f}x" if len(speeds) == 1 else f"{min(speeds):.3f}-{max(speeds):.3f}x"


def _drift_span(drifts: list[dict]) -> str:
    lo = min(d["min"] for d in drifts)
    hi = max(d["max"] for d in drifts)
    return f"{lo:.3f}-{hi:.3f}x over {DRIFT_WINDOWS} stretches"


def _clean(value):
    """JSON-safe: NaN and infinities become null; numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows as JSON-safe dicts at full precision (``to_json`` keeps 10 decimal places, which
    left a relative error of 2.5e-05 with six digits)."""
    return _clean(frame.to_dict(orient="records"))


def _check_out(out: Path, config) -> None:
    from sim.atomic_write import output_problem

    problem = output_problem(out, folder=True)
    if problem is not None:
        raise config.error("output.dir", f"cannot write {out}: {problem}")
    if out.exists() and not (out.is_dir() and ((out / "summary.json").is_file() or (out / "real").is_dir())):
        raise InputError("exists and is not a specbatch output folder; refusing to replace it",
                         field="output.dir", source=str(out))


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser, validate=False)


def replay_main(args: argparse.Namespace) -> int:
    return _main(args, validate=False)

