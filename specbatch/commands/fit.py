"""``specbatch fit``: adjust a profile's named overhead terms to measurements of a real deployment.

    specbatch fit --profile P --measured RUN1.csv [RUN2.csv ...] --out P2 [--terms exposed_overhead_s]
                  [engine settings as run flags: --scheduler, --max-num-seqs, --kv-cache-tokens ...]
    specbatch fit --profile P --terms-from FITTED --out P2 [--terms ...]   # carry fitted terms over

Some of what a step costs cannot be known from kernel tables or a spec sheet: the engine's
own time per step, and how much of it its scheduling hides. Those are the only things this
command changes, and only the terms named (``--terms``, default ``exposed_overhead_s``), in
the profile sidecar's ``engine_overhead``:

* ``exposed_overhead_s``: time per step outside the priced passes that no overlap hides;
* ``decode_overhead_s``, ``prefill_overhead_s``: the engine's own work per step (under
  ``"overlap": "async"`` it costs only where it is longer than the step's passes);
* ``request_latency_s``: what the serving frontend adds to each request as its client sees it
  (HTTP, tokenization, the hop to the engine and back, detokenization, streaming): TTFT and
  E2E, not the time between tokens. Fitting it judges mean TTFT too.

Each measured file (a per-request file, as ``specbatch compare`` reads it) is simulated
with the given settings, and the terms are set to minimise the root mean square of the
relative errors of mean ITL and mean E2E (and mean TTFT when ``request_latency_s`` is fitted)
over the stages the real engine kept up with
(bounded scalar search for one term, bounded Nelder-Mead for more; every evaluation is a
deterministic simulation). With two or more files it first fits on all but one and tests
on the one left out, for each file in turn, and prints the train and test errors (median
absolute error over stages of mean E2E, mean ITL, mean TTFT and p99 E2E) so that a
term's fit can be judged on runs it never saw; then it fits on all of them. The new
profile (the same points, the fitted terms) is written atomically to ``--out``; its
sidecar records the fitted values, the files they were fitted on, the errors and the
command (``engine_overhead.fitted``).

``--terms-from FITTED`` instead carries the terms a profile was already fitted to onto another
(the same serving stack on another model or GPU: the frontend's latency, the engine's exposed
time per step), with no simulation; the sidecar says where they came from, so that errors on
runs of the other model measure how well the terms carry over (leave one model out).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sim.errors import InputError

TERMS = ("exposed_overhead_s", "decode_overhead_s", "prefill_overhead_s", "request_latency_s")
BOUNDS_S = (0.0, 0.05)  # no engine spends more than 50 ms of its own per step; a fit that wants more is wrong elsewhere
OBJECTIVE = (("itl", "mean"), ("e2e", "mean"))
LATENCY_OBJECTIVE = OBJECTIVE + (("ttft", "mean"),)  # request_latency_s moves TTFT too: judge it there
REPORTED = (("e2e", "mean"), ("itl", "mean"), ("ttft", "mean"), ("e2e", "p99"))
NOT_FLAGS = ("--profile", "--out", "--records", "--timeline", "--timeline-window", "--goodput",
             "--per-request-spec-decode-metrics")


def _fit_flags() -> list[str]:
    from specbatch.commands.compare import COMPARE_FLAGS

    return [f for f in COMPARE_FLAGS if f not in NOT_FLAGS]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specbatch.commands.flags import add_run_flags

    parser.add_argument("--profile", required=True, help="the profile to start from (a folder or a shipped name)")
    parser.add_argument("--measured", nargs="+", metavar="FILE",
                        help="per-request measurement files (.csv, .csv.gz, .parquet), one per run")
    parser.add_argument("--terms-from", default=None, metavar="FITTED",
                        help="carry the named terms over from a profile specbatch fit wrote, instead of fitting")
    parser.add_argument("--out", required=True, help="the fitted profile's folder (written whole, or not at all)")
    parser.add_argument("--terms", default="exposed_overhead_s",
                        help=f"comma-separated overhead terms to fit, of: {', '.join(TERMS)} (default: %(default)s)")
    add_run_flags(parser, _fit_flags())


def main(args: argparse.Namespace) -> int:
    from specbatch.commands.flags import run_overrides

    terms = parse_terms(args.terms)
    if (args.measured is None) == (args.terms_from is None):
        raise InputError("give --measured files to fit to, or --terms-from a fitted profile (one of them)",
                         field="measured")
    if args.terms_from is not None:
        record = carry_terms(args.profile, args.terms_from, args.out, terms)
        print("carried " + ", ".join(f"{t} = {1e3 * v:.3f} ms" for t, v in record["terms"].items())
              + f" over from {record['from']}")
        print(f"Wrote {args.out}/ (profile.csv, profile.json)")
        return 0
    result = fit_profile(args.profile, args.measured, args.out, terms, run_overrides(args, _fit_flags()),
                         command=" ".join(["specbatch", "fit", *sys.argv[2:]]) if len(sys.argv) > 2 else "",
                         progress=lambda text: print(text, file=sys.stderr, flush=True))
    print(format_fit(result))
    print(f"Wrote {args.out}/ (profile.csv, profile.json)")
    return 0


def parse_terms(text: str) -> tuple[str, ...]:
    terms = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in terms if t not in TERMS]
    if not terms or unknown:
        raise InputError(f"'{unknown[0] if unknown else text}' is not an overhead term (known: {', '.join(TERMS)})",
                         field="terms")
    if len(set(terms)) != len(terms):
        raise InputError("names a term twice", field="terms")
    return terms


def fit_profile(profile: str, measured: list[str], out: str, terms: tuple[str, ...], overrides: dict | None = None,
                command: str = "", progress=None) -> dict:
    """Fit ``terms`` of ``profile`` to the ``measured`` files, write the result to ``out``; returns the
    record written to its sidecar (values, train and test errors)."""
    from sim.costmodel.profile import load_profile, resolve_profile_path
    from workloads import TraceError
    from workloads.measured import read_measured

    source = resolve_profile_path(profile)
    load_profile(source)  # a bad profile fails here, before any work
    files = [Path(m) for m in measured]
    for path in files:  # every file checked before the first simulation
        try:
            read_measured(path)
        except TraceError as exc:
            raise InputError(exc.message, source=exc.path, line=exc.line, field=exc.field) from None
    if not all(read_measured(p).has_latencies for p in files):
        raise InputError("a measurement file to fit to needs ttft_s and e2e_s columns", field="measured")
    overrides = {k: v for k, v in (overrides or {}).items() if k != "profile"}
    meta = json.loads((source / "profile.json").read_text())
    start = {t: float(meta.get("engine_overhead", {}).get(t, 0.0) or 0.0) for t in terms}
    say = progress or (lambda text: None)
    with tempfile.TemporaryDirectory(prefix="specbatch-fit-") as scratch:
        fitter = _Fitter(source, meta, Path(scratch), overrides, terms, say)
        folds = []
        if len(files) > 1:
            for held in range(len(files)):
                train = [p for i, p in enumerate(files) if i != held]
                say(f"fold {held + 1}/{len(files)}: fitting on {len(train)} files, testing on {files[held].name}")
                values = fitter.fit(train, start)
                folds.append({"left_out": files[held].name, "values": values,
                              "train": fitter.errors(train, values), "test": fitter.errors([files[held]], values)})
        say(f"fitting on all {len(files)} files")
        values = fitter.fit(files, start)
        record = {"terms": {t: values[t] for t in terms}, "before": start, "on": [p.name for p in files],
                  "objective": "RMS of the relative errors of mean ITL, mean E2E"
                               + (" and mean TTFT" if "request_latency_s" in terms else "")
                               + " over the stages the real engine kept up with",
                  "train": fitter.errors(files, values), "leave_one_out": folds,
                  "test": _pooled_test(folds), "settings": {k: v[0] if isinstance(v, tuple) else v
                                                            for k, v in overrides.items()
                                                            if (v[0] if isinstance(v, tuple) else v) is not None},
                  "from_profile": meta.get("name") or source.name, "command": command,
                  "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _write(source, Path(out), meta, values, record)
    return record


def carry_terms(profile: str, fitted: str, out: str, terms: tuple[str, ...]) -> dict:
    """Write ``profile`` with ``terms`` set as a profile :func:`fit_profile` wrote has them; returns
    the record written to its sidecar (``engine_overhead.carried``)."""
    from sim.costmodel.profile import load_profile, resolve_profile_path

    source, donor = resolve_profile_path(profile), resolve_profile_path(fitted)
    load_profile(source)
    donor_meta = json.loads((donor / "profile.json").read_text())
    fit = donor_meta.get("engine_overhead", {}).get("fitted")
    if not fit or any(t not in fit.get("terms", {}) for t in terms):
        raise InputError(f"was not fitted to {', '.join(terms)} by specbatch fit (its sidecar has no such "
                         "engine_overhead.fitted terms)", source=donor, field="terms-from")
    values = {t: float(fit["terms"][t]) for t in terms}
    meta = json.loads((source / "profile.json").read_text())
    record = {"terms": values, "from": donor_meta.get("name") or donor.name, "fitted_on": fit.get("on"),
              "fit_test_errors": fit.get("test"), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write(source, Path(out), meta, values, record, key="carried",
           source_text=f"carried over from {record['from']}, fitted by specbatch fit to {', '.join(fit.get('on', []))}")
    return record


class _Fitter:
    """Simulates the measured files on candidate profiles (the source's points, candidate terms)."""

    def __init__(self, source: Path, meta: dict, scratch: Path, overrides: dict, terms: tuple[str, ...], say) -> None:
        self.source, self.meta, self.scratch, self.overrides, self.terms, self.say = \
            source, meta, scratch, overrides, terms, say
        self.cache: dict[tuple, dict] = {}

    def candidate(self, values: dict[str, float]) -> Path:
        key = tuple(round(values[t], 9) for t in self.terms)
        folder = self.scratch / ("p" + "-".join(f"{v:.9f}" for v in key))
        if not folder.is_dir():
            folder.mkdir()
            shutil.copyfile(self.source / "profile.csv", folder / "profile.csv")
            meta = json.loads(json.dumps(self.meta))
            meta.setdefault("engine_overhead", {}).update({t: float(values[t]) for t in self.terms})
            (folder / "profile.json").write_text(json.dumps(meta))
        return folder

    def stages(self, path: Path, values: dict[str, float]):
        """The per-stage comparison of one file on the candidate (memoised: evaluations repeat)."""
        from specbatch.commands.compare import compare_measured

        key = (str(path), tuple(round(values[t], 9) for t in self.terms))
        if key not in self.cache:
            self.cache[key] = compare_measured(path, None, {**self.overrides,
                                                            "profile": (str(self.candidate(values)), "fit")})
        return self.cache[key]

    def judged_errors(self, files: list[Path], values: dict[str, float], pairs) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {f"{stat}_{metric}": [] for metric, stat in pairs}
        for path in files:
            comparison = self.stages(path, values)
            kept = comparison.stages[comparison.stages.real_saturated == False].stage  # noqa: E712 (None: unknown)
            for metric, stat in pairs:
                errors = comparison.error(metric, stat)
                out[f"{stat}_{metric}"] += [float(errors[s]) for s in kept if math.isfinite(errors[s])]
        return out

    def loss(self, files: list[Path], values: dict[str, float]) -> float:
        judged = LATENCY_OBJECTIVE if "request_latency_s" in self.terms else OBJECTIVE
        errors = [e for values_ in self.judged_errors(files, values, judged).values() for e in values_]
        return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else math.inf

    def fit(self, files: list[Path], start: dict[str, float]) -> dict[str, float]:
        from scipy.optimize import minimize, minimize_scalar

        calls = [0]

        def objective(x) -> float:
            values = dict(zip(self.terms, (float(v) for v in (x if len(self.terms) > 1 else [x]))))
            calls[0] += 1
            value = self.loss(files, values)
            self.say(f"  [{calls[0]}] " + ", ".join(f"{t} {1e3 * v:.3f} ms" for t, v in values.items())
                     + f": RMS error {100 * value:.2f}%")
            return value

        if len(self.terms) == 1:
            best = minimize_scalar(objective, bounds=BOUNDS_S, method="bounded", options={"xatol": 2e-5})
            x = [float(best.x)]
        else:
            best = minimize(objective, [min(max(start[t], BOUNDS_S[0]), BOUNDS_S[1]) for t in self.terms],
                            method="Nelder-Mead", bounds=[BOUNDS_S] * len(self.terms),
                            options={"xatol": 2e-5, "fatol": 1e-4})
            x = [float(v) for v in best.x]
        return {t: round(v, 7) for t, v in zip(self.terms, x)}

    def errors(self, files: list[Path], values: dict[str, float]) -> dict[str, float | None]:
        """Median absolute relative error over the judged stages, per reported statistic."""
        out = {}
        for key, errors in self.judged_errors(files, values, REPORTED).items():
            out[key] = _median([abs(e) for e in errors])
        return out


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _pooled_test(folds: list[dict]) -> dict[str, float | None] | None:
    """The held-out files' errors pooled: the median over folds of each statistic."""
    if not folds:
        return None
    return {key: _median([f["test"][key] for f in folds if f["test"][key] is not None]) for key in folds[0]["test"]}


def _write(source: Path, out: Path, meta: dict, values: dict[str, float], record: dict, key: str = "fitted",
           source_text: str | None = None) -> None:
    from sim.atomic_write import staged_dir, write_file
    from sim.costmodel.profile import CSV_NAME, META_NAME

    if out.exists() and not (out.is_dir() and {p.name for p in out.iterdir()} <= {CSV_NAME, META_NAME}):
        raise InputError("exists and is not a profile folder; refusing to replace it", source=out, field="out")
    meta = json.loads(json.dumps(meta))
    meta["name"] = out.name
    overhead = meta.setdefault("engine_overhead", {})
    overhead.update(values)
    overhead[key] = record
    what = source_text or f"fitted by specbatch fit to {', '.join(record['on'])}"
    overhead["source"] = (f"{overhead.get('source', '')} | {what}: "
                          + ", ".join(f"{t} {1e3 * v:.3f} ms" for t, v in values.items()))
    with staged_dir(out) as staging:
        shutil.copyfile(source / CSV_NAME, staging / CSV_NAME)
        write_file(staging / META_NAME, json.dumps(meta, indent=2, sort_keys=True) + "\n")


def format_fit(record: dict) -> str:
    width = max([34] + [len(f"  fit without {f['left_out']}") + 2 for f in record["leave_one_out"]])
    lines = ["fitted " + ", ".join(f"{t} = {1e3 * v:.3f} ms (was {1e3 * record['before'][t]:.3f})"
                                   for t, v in record["terms"].items()),
             f"on {', '.join(record['on'])}",
             f"{'median |error| over stages':<{width}}{'mean E2E':>10}{'mean ITL':>10}{'mean TTFT':>11}{'p99 E2E':>9}"]

    def row(label: str, errors: dict | None) -> str:
        if errors is None:
            return f"{label:<{width}}" + "(one file: no held-out test)"
        cells = [errors.get(k) for k in ("mean_e2e", "mean_itl", "mean_ttft", "p99_e2e")]
        widths = (10, 10, 11, 9)
        return f"{label:<{width}}" + "".join(f"{'n/a' if v is None else f'{100 * v:.1f}%':>{w}}" for v, w in zip(cells, widths))

    lines.append(row("train (all files)", record["train"]))
    for fold in record["leave_one_out"]:
        lines.append(row(f"  fit without {fold['left_out']}", fold["train"]))
        lines.append(row(f"  test on {fold['left_out']}", fold["test"]))
    lines.append(row("test (left out, median of folds)", record["test"]))
    return "\n".join(lines)


# -- leave one model out over runs already simulated (benchmarks/real_vllm.py) ---------------------------

LATENCY_TERM, STEP_TERM = "request_latency_s", "exposed_overhead_s"


def shifted_error(real: float, sim: float, metric: str, latency_s: float) -> float:
    """A stage statistic's relative error with the frontend's latency added: TTFT and E2E (every request,
    so its mean and each percentile) move by it, ITL does not."""
    return (sim + (latency_s if metric in ("ttft", "e2e") else 0.0)) / real - 1.0


def best_latency(stages: list[dict]) -> float:
    """The request latency that minimises the squared relative errors of the stages' mean TTFT and mean
    E2E (closed form: each is (sim - real + L) / real), within BOUNDS_S; ``stages``: rows with
    ``metric``, ``stat``, ``real``, ``sim``."""
    rows = [r for r in stages if r["stat"] == "mean" and r["metric"] in ("ttft", "e2e") and r["real"]]
    if not rows:
        return 0.0
    weight = sum(1.0 / r["real"] ** 2 for r in rows)
    value = -sum((r["sim"] - r["real"]) / r["real"] ** 2 for r in rows) / weight
    return min(max(value, BOUNDS_S[0]), BOUNDS_S[1])


def fit_on_grid(simulated: dict[float, list[dict]]) -> tuple[dict[str, float], float]:
    """Both overhead terms fitted to stages simulated at a grid of exposed per-step times: for each grid
    value the closed-form request latency, then the grid value whose RMS of the relative errors of mean
    ITL, mean E2E and mean TTFT is least (ties: the smaller time). ``simulated``: grid value -> judged
    stage rows (``metric``, ``stat``, ``real``, ``sim``). Returns the terms and their RMS error."""
    best = None
    for exposed in sorted(simulated):
        rows = [r for r in simulated[exposed] if r["stat"] == "mean" and r["metric"] in ("itl", "e2e", "ttft")]
        latency = best_latency(rows)
        errors = [shifted_error(r["real"], r["sim"], r["metric"], latency) for r in rows]
        rms = math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else math.inf
        if best is None or rms < best[1] - 1e-12:
            best = ({STEP_TERM: exposed, LATENCY_TERM: round(latency, 7)}, rms)
    return best
