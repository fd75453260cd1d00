"""A tune from its checked inputs to its result: search on the search seeds, confirm on held-out seeds.

:func:`plan_tune` checks every input (one InputError naming the flag) and prepares the
scenario once, so bad input costs one line and no run. :meth:`TunePlan.run` searches
(``search``), runs the tuned schedule and every baseline on the held-out seeds
(``baselines``), and measures, in one more run of the tuned schedule in this process, how
often each band was used (which also checks that the run is the executor's, byte for byte).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbatch.commands.tune import DEFAULT_BANDS, DEFAULT_K_MAX, DEFAULT_SEEDS
from specbatch.commands.tune.baselines import TUNED, Row, baselines, comparison, verdict, verdict_category
from specbatch.commands.tune.objective import DEFAULT, Objective, parse_objective
from specbatch.commands.tune.search import CoordinateSearch, SearchResult
from specbatch.commands.tune.space import (FORMATS, SGLANG_MIN_K, Schedule, Space, batch_bands, context_bands, engine_text,
                                     fitted_bands)
from specbatch.commands.tune.trials import EXECUTORS, Candidate, Trials, run_config, same_run
from sim.config import PolicyConfig, RunConfig
from sim.errors import InputError
from sim.limits import MAX_WORKERS, SEED_MAX, memory_problem, request_bytes



@dataclass
class TunePlan:
    """A checked tune, before it runs."""

    base: RunConfig
    space: Space
    objective: Objective
    seeds: tuple[int, ...]
    holdout: tuple[int, ...]
    fmt: str
    starts: list[Schedule]
    lut_table: list[list[int]]          # the analytic lut at the scenario's alpha (its baseline's table)
    baselines: list[Candidate]
    executor: str = "pool"
    workers: int | None = None
    dask_address: str | None = None
    pool: Any = None   # the process pool the plan started, its workers warming while it prepared (executor pool)

    def digest(self) -> str:
        data = {"base": self.base.to_toml(), "objective": self.objective.metric, "bands": self.space.bands,
                "contexts": self.space.contexts, "k": self.space.k_values, "seeds": self.seeds,
                "holdout": self.holdout}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:10]

    def default_out(self) -> Path:
        return Path("runs") / f"tune-{self.digest()}"

    def candidate(self, schedule: Schedule, label: str | None = None) -> Candidate:
        return Candidate(label or self.space.text(schedule), self.space.policy(schedule), schedule)

    def config(self, candidate: Candidate, seed: int) -> RunConfig:
        return run_config(self.base, candidate, seed)

    def run(self, out: str | os.PathLike[str], progress: bool = False) -> "TuneResult":
        started = time.perf_counter()
        if self.pool is not None:  # this process only waits on the pool's workers until the report
            from specbatch.commands.figures import import_in_background

            import_in_background()
        trials = Trials(self.base, Path(out), self.objective, executor=self.executor, workers=self.workers,
                        dask_address=self.dask_address, progress=progress, pool=self.pool)
        self.pool = None  # the trials own it now, and close it
        try:
            def run_batch(pairs, phase):
                return trials.summaries_for([(self.candidate(s), seed) for s, seed in pairs], phase)

            found = CoordinateSearch(self.space, self.objective, run_batch, self.seeds, say=trials.say).search(self.starts)
            tuned = self.candidate(found.best, TUNED)
            everyone = [tuned, *self.baselines]
            runs = trials.summaries_for([(c, seed) for c in everyone for seed in self.holdout], "holdout")
            by_label = {c.label: runs[i * len(self.holdout):(i + 1) * len(self.holdout)] for i, c in enumerate(everyone)}
            shares = self.cell_shares(tuned, by_label[TUNED][0], trials.pool)
        finally:
            trials.close()
        rows = comparison(everyone, by_label, self.objective)
        return TuneResult(self, found, rows, shares, trials.ran, trials.stored, time.perf_counter() - started)

    def run_into(self, out: str | os.PathLike[str], progress: bool = False) -> "TuneResult":
        """Run into the folder ``out`` and write its report there. Ctrl-C keeps the runs stored so far (the
        same command resumes); any other failure removes what this call put in a folder it found absent or
        empty, so a failed tune leaves nothing behind (a resumed folder keeps its store: its runs are whole)."""
        out = Path(out)
        existed = out.exists()
        fresh = not existed or (out.is_dir() and not any(out.iterdir()))
        try:
            result = self.run(out, progress=progress)
            result.write(out)
        except KeyboardInterrupt:
            raise
        except BaseException:
            if fresh:
                remove_contents(out, keep_folder=existed)
            raise
        return result

    def cell_shares(self, tuned: Candidate, expected: dict, pool=None) -> list[float]:
        """Each cell's share of the decode steps of the tuned schedule on the first held-out seed (run again,
        on ``pool`` where given: this process then never loads the engine)."""
        cells = [self.space.cell(cell) for cell in range(self.space.size)]
        counts = in_pool(pool, cell_counts, self.config(tuned, self.holdout[0]), cells, expected)
        total = max(1, counts[-1])
        return [c / total for c in counts[:-1]]


@dataclass
class TuneResult:
    plan: TunePlan
    search: SearchResult
    rows: list[Row]             # the held-out comparison, the tuned schedule first
    shares: list[float]         # per cell: share of the tuned runs' decode steps (first held-out seed)
    ran: int                    # runs simulated now
    stored: int                 # runs found in the store (a resumed tune)
    wall_s: float

    @property
    def schedule(self) -> Schedule:
        return self.search.best

    @functools.cached_property
    def described(self) -> dict:
        """What every run of the tune ran (specbatch.commands.described): the scenario's method, drafter and
        acceptance, from the tuned schedule's run config (the candidates differ only in their policy), with
        per-position rates up to the largest k any of them may draft."""
        from specbatch.commands.described import describe, policy_k_max

        plan = self.plan
        runs = [plan.config(c, plan.holdout[0]) for c in plan.baselines]
        k_max = max([plan.space.k_values[-1], *(policy_k_max(run) or 0 for run in runs)])
        return describe(plan.config(plan.candidate(self.schedule), plan.holdout[0]), k_max=k_max)

    @property
    def verdict(self) -> str:
        return verdict(self.rows, self.plan.objective)

    @property
    def verdict_category(self) -> str:
        """"better", "within noise" or "worse": the tuned schedule against the best baseline."""
        return verdict_category(self.rows)

    def formats(self) -> dict[str, str | None]:
        """Every format the schedule can be written in (None where the engine cannot express it)."""
        out: dict[str, str | None] = {}
        for fmt in FORMATS:
            try:
                out[fmt] = engine_text(self.plan.space, self.schedule, fmt)
            except InputError:
                out[fmt] = None
        return out

    @property
    def table(self):
        """The held-out comparison as a DataFrame: one row per policy (the tuned schedule first), the
        objective, the tuned schedule's paired difference to it (its standard error, half its 95%
        confidence interval), the metrics."""
        import pandas as pd

        goal = self.plan.objective
        return pd.DataFrame([{"policy": r.label, goal.metric: r.value(goal),
                              "tuned_minus_this": goal.value(r.tuned_minus.mean),
                              "standard_error": r.tuned_minus.se, "noise_95": r.tuned_minus.noise, **r.metrics}
                             for r in self.rows])

    def text(self) -> str:
        from specbatch.commands.tune.report import result_text

        return result_text(self)

    def __str__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return self.table.to_html(index=False, float_format=lambda v: f"{v:.4g}")

    def write(self, out: str | os.PathLike[str]) -> Path:
        from specbatch.commands.tune.report import write_report

        return write_report(Path(out), self)


def remove_contents(folder: Path, keep_folder: bool) -> None:
    """Everything a failed tune wrote into ``folder``, which it found absent or empty (then ``keep_folder``)."""
    import shutil

    if not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    if not keep_folder:
        folder.rmdir()


def decode_steps_by_batch(config: RunConfig) -> list[int]:
    """Decode steps per charged batch size (0..max batch) of a run of ``config``."""
    import numpy as np

    from sim.serving.records import PREFILL
    from sim.simulate import simulate

    steps = simulate(config).step_columns
    batch = np.asarray(steps["batch_size"])[np.asarray(steps["phase"]) != PREFILL]
    return np.bincount(batch, minlength=config.engine.max_batch_size + 1).tolist()


def cell_counts(config: RunConfig, cells: list, expected: dict) -> list[int]:
    """The decode steps of a run of ``config`` in each cell ((batch lo, hi), context band or None), then all
    its decode steps; the run must give the ``expected`` summary (the executor's run of it)."""
    import numpy as np

    from sim.serving.records import PREFILL
    from sim.simulate import simulate

    result = simulate(config)
    if not same_run(result.summary, expected):
        raise RuntimeError("the tuned schedule's run again differs from the executor's: "
                           "a run is no longer a pure function of its config and seed")
    steps = result.step_columns
    decode = steps["phase"] != PREFILL
    batch = np.asarray(steps["batch_size"])[decode]
    context = np.asarray(steps["mean_context_tokens"])[decode]
    counts = []
    for (lo, hi), ctx in cells:
        inside = (batch >= lo) & (batch <= hi)
        if ctx is not None:
            inside &= (context >= ctx[0]) & (context < ctx[1] + 1)
        counts.append(int(inside.sum()))
    return counts + [int(decode.sum())]


def in_pool(pool, fn, *args):
    """``fn(*args)`` on the tune's process pool where it has one (its workers have the engine loaded), else here."""
    return fn(*args) if pool is None else pool.submit(fn, *args).result()


def k_limit(base: RunConfig, profile) -> tuple[int, str]:
    """The largest k any policy of the tune may choose, and why: the profile's measured k_max, or the speculation
    method's num_speculative_tokens where smaller (vLLM sizes every step by it: the k_max of every baseline)."""
    method = base.speculation
    if method.given and method.num_speculative_tokens < profile.k_max:
        return method.num_speculative_tokens, f"the {method.method} method's num_speculative_tokens"
    return profile.k_max, "the profile's measured k_max"


def check_runnable(base: RunConfig, candidate: Candidate) -> None:
    """Prepare the candidate's run on a two-request copy of the scenario (its policy bound to the profile, its
    k against the method and the profile): an InputError naming the candidate, before any run."""
    from sim.simulate import prepare

    probe = run_config(base, candidate, base.seed)
    w = probe.workload
    if w.trace is None and w.trace_vllm is None:  # generated arrivals: two requests are checked as a run's
        probe = replace(probe, workload=replace(w, num_requests=2, duration_s=None))
    try:
        prepare(probe)
    except InputError as exc:
        own = (exc.field or "").startswith("policy")  # the tune's own policy: no file or flag of the user's gave it
        raise InputError(f"the tune's {'baseline' if candidate.schedule is None else 'trial'} '{candidate.label}' "
                         f"cannot run: {exc.message}", field=exc.field, source=None if own else exc.source,
                         line=None if own else exc.line) from None


def plan_tune(config: str | os.PathLike[str] | None, overrides: dict[str, Any], *, objective: str = DEFAULT,
              bands: int | str | list[int] = DEFAULT_BANDS, contexts: str | list[int] | None = None,
              k_max: int | None = None, seeds: int = DEFAULT_SEEDS, holdout: int = DEFAULT_SEEDS,
              fmt: str = "lut", executor: str = "pool", workers: int | None = None,
              dask_address: str | None = None) -> TunePlan:
    """Check every input and prepare the scenario, before any run of the search.

    ``bands``: a count (placed where a run of the analytic lut at the first search seed spends
    its decode steps) or upper edges."""
    from sim.config import load_config

    if fmt not in FORMATS:
        raise InputError(f"'{fmt}' is not one of {', '.join(FORMATS)}", source="--format")
    for value, flag in ((seeds, "--seeds"), (holdout, "--holdout-seeds")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"must be a whole number >= 1, got {value!r}", source=flag)
    if executor not in EXECUTORS:
        raise InputError(f"'{executor}' is not one of {', '.join(EXECUTORS)}", source="--executor")
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise InputError(f"must be from 1 to {MAX_WORKERS}, got {workers}", source="--workers")
    if executor == "dask":
        from specbatch.commands.sweep.executors import have_dask

        if not have_dask():
            raise InputError("needs dask.distributed: pip install 'specbatch[sweep]'", source="--dask")
    base = load_config(config, overrides)
    base.profile_path()  # a mistyped name answers before the simulator is loaded and the pool's server starts
    # The runs write nothing and draw no timeline (a scenario file's [output] may ask for both); the
    # SLOs of --goodput stay: they make request_goodput.
    base = replace(base, output=replace(base.output, dir=None, records="none", timeline=None, timeline_window=None,
                                        per_request_spec_decode_metrics="none"))
    goal = parse_objective(objective, base.output.goodput)
    if base.seed + seeds + holdout - 1 > SEED_MAX:
        raise base.error("seed", f"the tune uses seeds {base.seed}..{base.seed + seeds + holdout - 1}, beyond {SEED_MAX}")
    if pool_size(executor, workers):
        from specbatch.commands.workers import start_fork_server

        start_fork_server()  # its imports go on while this process checks the profile and prepares the scenario
    from sim.simulate import checked_profile, prepare

    profile = checked_profile(base.profile)
    k_min = SGLANG_MIN_K if fmt == "sglang" else 0
    limit, why = k_limit(base, profile)
    top = min(DEFAULT_K_MAX, limit) if k_max is None else k_max
    if isinstance(top, bool) or not isinstance(top, int) or not max(k_min, 1) <= top <= limit:
        raise InputError(f"must be in {max(k_min, 1)}..{limit} ({why}), got {top!r}", source="--k-max")
    count = int(bands) if isinstance(bands, int) or (isinstance(bands, str) and bands.strip().isdigit()) else None
    if count is None:
        batch = batch_bands(bands, base.engine.max_batch_size)
    elif isinstance(bands, bool) or count < 1:
        raise InputError(f"must be at least 1 band, got {bands!r}", source="--bands")
    ctx = None if contexts is None else context_bands(contexts)
    if ctx is not None and fmt != "lut":
        raise InputError(f"{fmt} takes one k per batch size; with --context-bands the schedule is written as a "
                         "lut (context) table: --format lut", source="--format")
    k_values = tuple(range(k_min, top + 1))
    others = baselines(k_values, base.acceptance.alpha, limit, tree=base.speculation.is_tree)
    # The pool's workers start now and load the engine while this process prepares (a second or more
    # on a small machine, which the first batch of runs would otherwise wait for).
    pool = early_pool(base, executor, workers)
    try:
        # Prepared here: every input of the scenario is checked before the first run, and the lut
        # baseline's own table (built at bind from the step table) places the bands and seeds the search.
        lut = next(c for c in others if c.policy["name"] == "lut")
        first = prepare(replace(base, policy=PolicyConfig("lut", {k: v for k, v in lut.policy.items() if k != "name"})))
        busy = min(workers or os.cpu_count() or 1, MAX_WORKERS) if executor == "pool" else 1
        problem = memory_problem(request_bytes(len(first.requests)) * busy)
        if problem is not None:
            raise InputError(f"{len(first.requests)} requests per run on {busy} worker(s): {problem}", source="--workers")
        lut_table = [list(row) for row in first.policy.table]
        steps = in_pool(pool, decode_steps_by_batch, first.config)
        if count is not None:
            batch = fitted_bands(steps, [row[1] for row in lut_table[:-1]], count)
        space = Space(batch, ctx, k_values)
        starts = [space.uniform(k) for k in space.k_values]
        projected = space.project(first.policy.k_for, steps)
        if projected not in starts:
            starts.append(projected)
        # Every policy the tune will run, checked as its run would be (each trial is a table of k within the
        # searched range, so the two extreme uniform schedules stand for them all): one line before any run.
        trials = [Candidate(space.text(s), space.policy(s), s) for s in (starts[0], starts[len(k_values) - 1])]
        for candidate in trials + others:
            check_runnable(base, candidate)
        origin = base.seed
        return TunePlan(base=replace(base, policy=PolicyConfig("none", {})), space=space, objective=goal,
                        seeds=tuple(range(origin, origin + seeds)),
                        holdout=tuple(range(origin + seeds, origin + seeds + holdout)), fmt=fmt, starts=starts,
                        lut_table=lut_table, baselines=others, executor=executor, workers=workers,
                        dask_address=dask_address, pool=pool)
    except BaseException:
        if pool is not None:  # bad input: one line now, the warming workers are not waited for
            pool.shutdown(wait=False, cancel_futures=True)
        raise


def pool_size(executor: str, workers: int | None) -> int:
    """The tune's process pool's workers: 0 unless it runs on a pool of more than one."""
    from specbatch.commands.sweep.executors import default_workers

    count = workers or default_workers()
    return count if executor == "pool" and count >= 2 else 0


def early_pool(base: RunConfig, executor: str, workers: int | None):
    """The tune's process pool, its workers warming on a few requests of the scenario (None unless it will
    run on a pool of more than one worker)."""
    from specbatch.commands.workers import warmed_pool

    count = pool_size(executor, workers)
    if not count:
        return None
    w = base.workload
    generated = w.trace is None and w.trace_vllm is None and w.rate_profile is None
    small = replace(base, workload=replace(w, num_requests=20, duration_s=None)) if generated else None
    return warmed_pool(count, small)

