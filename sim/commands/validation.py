"""``specbatch validate`` and ``specbatch replay``: the simulator's error against reality.

``replay`` serves a scenario for real (``calibrate.replay``: torch models on the device
the scenario's profile was calibrated on) and writes a run folder like ``specbatch
run``'s, with a ``replay`` section in summary.json. ``validate`` replays the scenario,
simulates the same scenario (same config and seed, hence the same requests and
acceptance model), and prints per metric the real value, the simulated one and the
relative error, plus a two-sample Kolmogorov-Smirnov test per latency distribution.

Both price prefill as the replay runs it (``engine.prefill = "padded"``). A replay
interrupted with Ctrl-C still writes what it measured, marked partial (exit 130), and
``validate`` then skips the comparison: a partial replay is not comparable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from sim.atomic_write import staged_dir
from sim.errors import InputError
from sim.lazy import lazy_module
from sim.profile import write_scaled_profile

pd = lazy_module("pandas")  # only when the command runs: building the CLI's parser imports this module

LATENCIES = (("e2el", "E2EL"), ("ttft", "TTFT"), ("tpot", "TPOT"))
STATS = (("mean", "mean"), ("median", "p50"), ("p99", "p99"))
OTHER_METRICS = ("request_throughput", "output_throughput", "mean_acceptance_length", "num_steps")
INTERRUPTED = 130


def compared_metrics() -> list[tuple[str, str]]:
    """(summary key, label) of every metric the validation compares, in table order."""
    out = [(f"{stat}_{name}_ms", f"{label} {shown} (ms)") for name, label in LATENCIES for stat, shown in STATS]
    return out + [(m, m) for m in OTHER_METRICS]


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


def format_table(table: pd.DataFrame, tests: pd.DataFrame) -> str:
    corrected = "speed_corrected" in table
    lines = [f"{'metric':28} {'real':>12} {'simulated':>12} {'error':>8}"
             + (f" {'speed-corrected':>16} {'error':>8}" if corrected else ""), "-" * (88 if corrected else 63)]
    for row in table.itertuples():
        line = f"{row.label:28} {_num(row.real):>12} {_num(row.simulated):>12} {_pct(row.relative_error):>8}"
        if corrected:
            line += f" {_num(row.speed_corrected):>16} {_pct(row.speed_corrected_error):>8}"
        lines.append(line)
    lines.append("")
    lines.append("two-sample Kolmogorov-Smirnov test, per-request latencies (real vs simulated):")
    for row in tests.itertuples():
        lines.append(f"  {row.latency:5} D = {row.ks_statistic:.3f}  p = {row.p_value:.3g}  "
                     f"(n = {row.n_real} real, {row.n_simulated} simulated)")
    return "\n".join(lines)


def _pct(x: float) -> str:
    return "" if math.isnan(x) else f"{100 * x:+.1f}%"


def _num(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:,.0f}"


def plot_cdfs(real: pd.DataFrame, simulated: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(12, 3.6))
    for ax, (name, label) in zip(axes, LATENCIES):
        for frame, what, style in ((real, "real replay", "-"), (simulated, "simulated", "--")):
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


# ---------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser, *, validate: bool = True) -> None:
    from sim.commands.flags import RUN_FLAGS, add_run_flags

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


def main(args: argparse.Namespace) -> int:
    return _main(args, validate=True)


def _main(args: argparse.Namespace, *, validate: bool) -> int:
    from sim.commands.flags import run_overrides
    from sim.config import load_config

    config = load_config(args.config, run_overrides(args))
    if config.cluster.replicas != 1:
        raise config.error("cluster.replicas", "the real replay serves one replica")
    if config.workload.max_concurrency is not None:
        raise config.error("workload.max_concurrency", "the real replay does not apply a client concurrency limit "
                                                       "yet; simulate it with specbatch run")
    try:
        from calibrate.replay import replay_config
    except ImportError as exc:
        print(f"error: specbatch {'validate' if validate else 'replay'} needs torch ({exc}); "
              "pip install 'specbatch[calibrate]'", file=sys.stderr)
        return 2
    from sim.commands.outputs import default_output_dir, format_summary, write_run
    from sim.simulate import simulate

    name = "validate" if validate else "replay"
    out = Path(config.output.dir or default_output_dir(f"{name}-{config.digest()}"))
    _check_out(out, config)
    def starting() -> None:
        print(f"replaying {config.workload.num_requests or 'the'} requests in real time ({args.acceptance} "
              "acceptance); Ctrl-C stops and keeps what was measured", file=sys.stderr)

    real, measured = replay_config(config, acceptance=args.acceptance, on_start=starting)
    for warning in real.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    partial = measured.partial
    # write_run is atomic itself; a validation's several folders are staged together.
    with staged_dir(out) if validate else contextlib.nullcontext(out) as staging:
        write_run(real, staging / "real" if validate else staging)
        if validate and not partial:
            sim = simulate(real.config)  # the resolved config the replay ran (prefill padded)
            write_run(sim, staging / "simulated")
            table = compare(real.summary, sim.summary)
            # The same simulation on the profile scaled by the speed the device ran the passes at
            # during the replay: what remains is the model's error, not the machine's drift.
            speed = real.extra["replay"]["pass_speed_ratio"]
            scaled = write_scaled_profile(real.profile, speed, staging / "speed-corrected" / "profile")
            corrected = simulate(replace(real.config, profile=str(scaled)))
            write_run(corrected, staging / "speed-corrected" / "run")
            fixed = compare(real.summary, corrected.summary)
            table["speed_corrected"] = fixed["simulated"]
            table["speed_corrected_error"] = fixed["relative_error"]
            tests = distribution_tests(real.requests, sim.requests)
            document = {"profile": real.profile.name, "acceptance": args.acceptance,
                        "config_digest": real.config.digest(),
                        "metrics": _records(table), "ks_tests": _records(tests),
                        "replay": real.extra["replay"]}
            (staging / "validation.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
            table.to_csv(staging / "validation.csv", index=False, float_format="%.9g", lineterminator="\n")
            try:
                plot_cdfs(real.requests, sim.requests, staging / "latency_cdf.png",
                          f"{real.profile.name}: {real.config.policy.name}, {real.config.engine.batching} batching, "
                          f"{len(real.requests)} requests")
            except ImportError:
                print("note: no matplotlib, so no latency_cdf.png (pip install 'specbatch[docs]')", file=sys.stderr)
    if partial:
        done = real.extra["replay"]["completed"]
        print(f"interrupted: {done} of {len(real.requests)} requests finished; the partial replay is in "
              f"{out / 'real' if validate else out}/ (summary.json says partial)", file=sys.stderr)
        return INTERRUPTED
    if validate:
        replayed = real.extra["replay"]
        print(f"validation of {real.profile.name}, {args.acceptance} acceptance, {len(real.requests)} requests")
        print(f"  the device ran the timed passes at {replayed['pass_speed_ratio']:.3f}x their calibrated time; "
              f"engine overhead per step {1e3 * replayed['decode_overhead_s']:.2f} ms decode, "
              f"{1e3 * replayed['prefill_overhead_s']:.2f} ms prefill (profile: "
              f"{1e3 * real.profile.engine_overhead_s('decode'):.2f} / "
              f"{1e3 * real.profile.engine_overhead_s('prefill'):.2f} ms)")
        print(format_table(table, tests))
        print(f"Wrote {out}/ (validation.json, validation.csv, latency_cdf.png, real/, simulated/, "
              "speed-corrected/)")
    else:
        print(format_summary(real))
        print(f"Wrote {out}/")
    return 0


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
            for row in json.loads(frame.to_json(orient="records"))]


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

