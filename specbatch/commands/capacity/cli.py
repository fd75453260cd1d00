"""``specbatch capacity``: flags, input checks, the search, the printed table and the report.

All inputs are checked (and every policy prepared once) before the first run, so a
bad one costs one line and no work.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbatch.commands.capacity.inputs import DEFAULTS
from sim.errors import InputError
from sim.limits import MAX_WORKERS, memory_problem, request_bytes

# The flags of `specbatch run` that describe the workload's shape, the engine and the model
# pair, and how it speculates (specbatch.commands.flags.SPECULATION_FLAGS: the method and its acceptance);
# they apply to every run of the search. The rate, run length, policy and output are the search's
# to choose, and it sizes one replica (so no cluster flags). A flag that this version of
# `specbatch run` lacks is left out.
WORKLOAD_FLAGS = ("--profile", "--arrival", "--burstiness", "--cv", "--prompt-tokens", "--output-tokens",
                  "--batching", "--max-batch-size", "--prefill", "--kv-cache-tokens", "--scheduler",
                  "--max-num-batched-tokens", "--alpha", "--alpha-distribution", "--alpha-concentration", "--seed",
                  "--sampling")
DEFAULT_POLICIES = "none,fixed,goodput"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specbatch.commands.capacity.inputs import DEFAULTS as d, LONGEST
    from specbatch.commands.flags import add_run_flags, typed

    parser.add_argument("--config", help="base scenario TOML (its rate and run length are ignored); "
                        "the flags below override it")
    add_run_flags(parser, scenario_flags(), helps={
        "--seed": "first seed; the runs use seeds SEED..SEED+N-1 (default: the scenario's seed, 0)"})
    parser.add_argument("--slo", action="append", metavar="METRIC=MS",
                        help="an SLO, repeatable: p50/p90/p99 (or mean) of ttft, tpot, e2el in ms, named as in "
                             "summary.json, e.g. --slo p99_ttft_ms=2000 --slo p90_tpot_ms=500")
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help=f"comma-separated policies, with parameters as NAME:KEY=VALUE[:KEY=VALUE], "
                             f"e.g. none,fixed:k=2,goodput (default {DEFAULT_POLICIES})")
    parser.add_argument("--seeds", type=typed("--seeds", int), default=len(d.seeds),
                        help=f"runs (seeds) per rate (default {len(d.seeds)})")
    parser.add_argument("--tolerance", type=typed("--tolerance", float), default=d.tolerance,
                        help=f"stop bisecting when (hi - lo) / lo is at most this (default {d.tolerance:g})")
    parser.add_argument("--service-times", type=typed("--service-times", float), default=d.service_times,
                        help=f"a rate's first runs have arrivals over this many service times (a request's time in "
                             f"a full batch, from the saturation probe); default {d.service_times:g}")
    parser.add_argument("--extensions", type=typed("--extensions", int), default=d.extensions,
                        help=f"while a rate is undecided, rerun it longer (as its spread says it needs, at most "
                             f"{LONGEST}x), at most this often (default {d.extensions}); still undecided, it fails")
    parser.add_argument("--max-growth", type=typed("--max-growth", float), default=d.max_growth,
                        help=f"a sustained rate's queue keeps less than this share of its arrivals, shown at 95%% "
                             f"confidence (default {d.max_growth:g}); larger decides with shorter runs")
    parser.add_argument("--min-requests", type=typed("--min-requests", int), default=d.min_requests,
                        help=f"fewest requests per run (default {d.min_requests})")
    parser.add_argument("--warmup", type=typed("--warmup", float), default=d.warmup,
                        help=f"fraction of each run's arrival window left out of the measurement (default {d.warmup:g})")
    parser.add_argument("--curve-points", type=typed("--curve-points", int), default=d.curve_points,
                        help=f"extra evenly spaced rates per policy for the latency and goodput figures "
                             f"(default {d.curve_points})")
    parser.add_argument("--target-rate", type=typed("--target-rate", float), default=None,
                        help="traffic to serve (req/s): report the replicas needed")
    parser.add_argument("--gpu-hour-price", type=typed("--gpu-hour-price", float), default=None,
                        help="price of one GPU-hour: report the cost per 1M output tokens")
    parser.add_argument("--profiles", default=None, metavar="A,B,...",
                        help="compare these profiles (names or folders, comma-separated; one per GPU, say) "
                             "for the same traffic and SLOs: replicas and $ per 1M output tokens per GPU; "
                             "needs --gpu-price")
    parser.add_argument("--gpu-price", default=None, metavar="GPU=PRICE,...|FILE",
                        help="price of one hour of each GPU, e.g. h100=3.9,h200=4.5,l40s=1.9, or a TOML file of "
                             "GPU = PRICE lines; a key matches a profile's GPU by its words (h100 matches "
                             "h100_sxm and 'NVIDIA H100 80GB HBM3'). No prices ship with specbatch")
    parser.add_argument("--gpus-per-replica", type=typed("--gpus-per-replica", int), default=None,
                        help="GPUs one replica occupies, for the cost (default: the profile's tensor-parallel size; "
                             "give it for a measured profile of a replica of several GPUs)")
    parser.add_argument("--tp", default=None, metavar="N,...",
                        help="tensor parallelism as an axis: compare each profile split over these GPU counts "
                             "(e.g. 1,4: four TP-1 replicas or one TP-4?), from the shipped profiles or composed "
                             "from the profile's own compose command (needs the gpu-data extra)")
    parser.add_argument("--pd-ratios", default=None, metavar="P:D,...",
                        help="disaggregated serving: search these splits of prefill:decode replicas (e.g. "
                             "1:1,1:2,1:3), each as one unit, beside aggregated serving on the same GPUs "
                             "(docs/capacity.md); --decode-profile and --kv-link... apply to the splits")
    parser.add_argument("--prefill-profile", default=None, metavar="NAME",
                        help="disaggregated serving: the splits' prefill pool on this profile (the same models on "
                             "another GPU or TP size); the decode pool and the aggregated replica stay on "
                             "--profile (or the decode pool on --decode-profile)")
    parser.add_argument("--gpu-budget", type=typed("--gpu-budget", int), default=None, metavar="GPUS",
                        help="disaggregated serving on this many GPUs: every prefill:decode split that uses them, "
                             "or with --pd-ratios each ratio scaled to the most units that fit")
    parser.add_argument("--jobs", type=typed("--jobs", int), default=os.cpu_count() or 1,
                        help="worker processes (default: all cores)")
    parser.add_argument("--out", default=None, help="report folder (default runs/capacity-<hash of the inputs>)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


@dataclass
class CapacityPlan:
    """A checked capacity search, before it runs: its report inputs and one prepared config per policy."""

    inputs: Any          # report.ReportInputs
    configs: dict        # search label -> the RunConfig to search
    members: dict        # search label -> (profile name, policy label)
    jobs: int

    def default_out(self) -> Path:
        return Path("runs") / f"capacity-{_digest(self.inputs, self.configs)}"

    def search(self, progress=None) -> "CapacityResult":
        from specbatch.commands.capacity.costing import costing
        from specbatch.commands.capacity.search import search_capacity

        started = time.perf_counter()
        inputs = self.inputs
        if self.jobs > 1:  # this process only waits on the pool's workers until the report
            from specbatch.commands.figures import import_in_background

            import_in_background()
        found = search_capacity(self.configs, inputs.slos, inputs.settings, jobs=self.jobs, progress=progress,
                                curve_groups={label: name for label, (name, _) in self.members.items()})
        outcomes = {name: {} for name in inputs.profiles}
        costs = {name: {} for name in inputs.profiles}
        for label, o in found.items():
            name, policy = self.members[label]
            outcomes[name][policy] = replace(o, label=policy)
            costs[name][policy] = costing(o.max_rate, (o.operating or {}).get("mean_output_tokens", 0.0),
                                          inputs.target_rate, inputs.profiles[name].price, inputs.gpus(name))
        return CapacityResult(inputs, outcomes, costs, self.configs, time.perf_counter() - started)


@dataclass
class CapacityResult:
    """A finished search: its inputs, each policy's outcome and costing."""

    inputs: Any          # report.ReportInputs
    outcomes: dict       # profile name -> policy label -> search.PolicyOutcome
    costs: dict          # profile name -> policy label -> costing.Costing
    configs: dict        # search label -> the RunConfig searched
    wall_s: float

    @property
    def runs(self) -> int:
        """Simulations the search ran, over every profile and policy."""
        return sum(o.runs for by_policy in self.outcomes.values() for o in by_policy.values())

    @property
    def requests(self) -> int:
        """Requests those simulations served, over every profile and policy."""
        return sum(o.requests for by_policy in self.outcomes.values() for o in by_policy.values())

    def table_text(self) -> str:
        """What ``specbatch capacity`` prints: the results, with several profiles the cost
        comparison, and the prices it used."""
        from specbatch.commands.capacity.report import (comparison_header, comparison_rows, price_lines, result_header,
                                                  result_rows)

        inputs = self.inputs
        text = _text_table(result_header(inputs), result_rows(inputs, self.outcomes, self.costs))
        if inputs.splits is not None:
            from specbatch.commands.capacity import disaggregated as pd

            text += "\n\n" + _text_table(pd.header(inputs), pd.rows(inputs, self.outcomes, self.costs))
        elif len(inputs.profiles) > 1:
            text += "\n\n" + _text_table(comparison_header(inputs), comparison_rows(inputs, self.outcomes, self.costs))
        return "\n".join([*inputs.ran_lines(), text, *price_lines(inputs)])

    def write(self, out: str | os.PathLike[str]) -> Path:
        from specbatch.commands.capacity.report import write_report

        return write_report(out, self.inputs, self.outcomes, self.costs)


def plan_capacity(config: str | None, overrides: dict[str, Any], *, slos: list[str] | None, policies: str,
                  seeds: int = len(DEFAULTS.seeds), tolerance: float = DEFAULTS.tolerance,
                  service_times: float = DEFAULTS.service_times, extensions: int = DEFAULTS.extensions,
                  max_growth: float = DEFAULTS.max_growth, min_requests: int = DEFAULTS.min_requests,
                  warmup: float = DEFAULTS.warmup, curve_points: int = DEFAULTS.curve_points,
                  target_rate: float | None = None, gpu_hour_price: float | None = None,
                  gpus_per_replica: int | None = None, jobs: int = 1, profiles: str | None = None,
                  gpu_price: str | None = None, tp: str | None = None, pd_ratios: str | None = None,
                  gpu_budget: int | None = None, prefill_profile: str | None = None) -> CapacityPlan:
    """Check every input (one InputError, named by its flag) and prepare each policy, before any run."""
    from specbatch.commands.capacity.inputs import SearchSettings, parse_policies, parse_slos, policy_config, positive
    from specbatch.commands.capacity.report import ReportInputs
    from specbatch.commands.described import describe, policy_k_max

    parsed_slos = parse_slos(slos)
    specs = parse_policies(policies)
    target = positive(target_rate, "--target-rate")
    _at_least(seeds, 1, "--seeds")
    if gpus_per_replica is not None:
        _at_least(gpus_per_replica, 1, "--gpus-per-replica")
    _at_least(jobs, 1, "--jobs")
    if jobs > MAX_WORKERS:
        raise InputError(f"must be at most {MAX_WORKERS}, got {jobs}", source="--jobs")
    _at_least(min_requests, 10, "--min-requests")
    positive(service_times, "--service-times")
    if not 0 < max_growth < 1:
        raise InputError(f"must be inside (0, 1), got {max_growth:g}", source="--max-growth")
    _at_least(extensions, 0, "--extensions")
    problem = memory_problem(request_bytes(min_requests) * max(1, min(jobs, os.cpu_count() or 1)))
    if problem is not None:
        raise InputError(f"{min_requests} requests per run on {jobs} worker(s): {problem}", source="--min-requests")
    _at_least(curve_points, 0, "--curve-points")
    if not 0 < tolerance < 1:
        raise InputError(f"must be inside (0, 1), got {tolerance:g}", source="--tolerance")
    if not 0 <= warmup < 0.9:
        raise InputError(f"must be in [0, 0.9), got {warmup:g}", source="--warmup")
    _check_names(overrides, profiles, specs)  # a mistyped name answers before the pool's server takes the cores
    if jobs > 1:
        from specbatch.commands.workers import start_fork_server

        start_fork_server()  # its imports go on while this process loads and checks the scenario and profiles
    ask = None
    if pd_ratios is not None or gpu_budget is not None:  # serving name -> (base scenario, loaded profile)
        bases, ask = _disaggregated_bases(config, overrides, profiles, tp, pd_ratios, gpu_budget, gpus_per_replica,
                                          prefill_profile)
    else:
        if prefill_profile is not None:
            raise InputError("applies only to disaggregated serving: give --pd-ratios or --gpu-budget",
                             source="--prefill-profile")
        _refuse_pool_flags(overrides)
        bases = _profile_bases(config, overrides, profiles)  # profile name -> (base scenario, loaded profile)
        if tp is not None:
            bases = _split_variants(config, overrides, bases, tp)
    _check_gpus(bases, gpus_per_replica)
    configs, members, described = {}, {}, {}
    for name, (base, profile) in bases.items():
        mine = []
        for spec in specs:
            label = spec.label if len(bases) == 1 else f"{name} / {spec.label}"
            configs[label] = _prepared(policy_config(base, spec), label)
            members[label] = (name, spec.label)
            mine.append(configs[label])
        # What the runs ran, from the configs the search is given (their policies differ, not what drafts and
        # accepts), the per-position rates up to the largest k any of them may draft.
        described[name] = describe(mine[0], profile, max(policy_k_max(c) or 0 for c in mine))
    priced = _priced_profiles(bases, gpu_hour_price, gpu_price, described)
    if ask is not None:
        priced = _priced_splits(priced, ask, gpu_price)
    first = next(iter(bases.values()))[0]
    settings = SearchSettings(seeds=tuple(range(first.seed, first.seed + seeds)), tolerance=tolerance,
                              service_times=service_times, extensions=extensions, max_growth=max_growth,
                              min_requests=min_requests, warmup=warmup, curve_points=curve_points)
    inputs = ReportInputs(profiles=priced, workload=_workload_facts(first), slos=parsed_slos, settings=settings,
                          target_rate=target, gpus_per_replica=gpus_per_replica,
                          prices=_prices_text(gpu_hour_price, gpu_price), splits=ask)
    return CapacityPlan(inputs, configs, members, jobs)


def plan_from_args(args: argparse.Namespace) -> CapacityPlan:
    """The plan of a parsed ``specbatch capacity`` command line (every input checked)."""
    from specbatch.commands.flags import run_overrides

    return plan_capacity(args.config, run_overrides(args, scenario_flags()), slos=args.slo,
                         policies=args.policies, seeds=args.seeds, tolerance=args.tolerance,
                         service_times=args.service_times, extensions=args.extensions,
                         max_growth=args.max_growth, min_requests=args.min_requests, warmup=args.warmup,
                         curve_points=args.curve_points, target_rate=args.target_rate,
                         gpu_hour_price=args.gpu_hour_price, gpus_per_replica=args.gpus_per_replica, jobs=args.jobs,
                         profiles=args.profiles, gpu_price=args.gpu_price, tp=args.tp, pd_ratios=args.pd_ratios,
                         gpu_budget=args.gpu_budget, prefill_profile=args.prefill_profile)


def main(args: argparse.Namespace) -> int:
    from sim.atomic_write import check_output, output_lock
    from specbatch.commands.capacity.report import check_out_dir
    from specbatch.commands.capacity.search import stderr_progress
    from specbatch.commands.cli import nothing_left_to_do
    from specbatch.commands.figures import have_matplotlib

    if args.out:  # a named folder is checked before the plan fits its profiles
        check_out_dir(args.out)
        check_output(args.out, folder=True, field="out", source=f"--out {args.out}")
    plan = plan_from_args(args)
    out = check_out_dir(args.out if args.out else plan.default_out())  # before the search, not after
    check_output(out, folder=True, field="out", source=f"--out {out}" if args.out else None)
    with output_lock(out, field="out", source=f"--out {out}" if args.out else None):
        result = plan.search(progress=None if args.quiet else stderr_progress)  # (its pool is shut down)
        result.write(out)
    nothing_left_to_do()
    print(result.table_text())
    figures = "figures" if have_matplotlib() else "no figures: matplotlib is not installed, pip install 'specbatch[report]'"
    print(f"Search took {result.wall_s:.1f} s wall on {args.jobs} worker(s), {result.runs} runs, "
          f"{result.requests:,} requests. Wrote {out}/ (report.html, report.md, capacity.json; {figures})")
    return 0


# ---------------------------------------------------------------- profiles and their prices

def _profile_bases(config: str | None, overrides: dict, profiles: str | None) -> dict:
    """Profile name -> (base scenario, profile): the one of --profile/--config, or one per --profiles entry."""
    from specbatch.commands.capacity.inputs import base_config
    from sim.costmodel.profile import load_profile

    if profiles is None:
        base = base_config(config, overrides)
        base.profile_path()  # a mistyped name, before the simulator is loaded
        from sim.simulate import checked_profile

        profile = checked_profile(base.profile)
        return {profile.name: (base, profile)}
    given = overrides.get("profile")  # the config key --profile sets: a plain value or a (value, source) pair
    if (given[0] if isinstance(given, tuple) else given) is not None:
        raise InputError("give --profile or --profiles, not both", source="--profiles")
    names = [part.strip() for part in profiles.split(",")]
    if not all(names):
        raise InputError(f"empty profile name in '{profiles}'", source="--profiles")
    bases = {}
    for name in names:
        try:
            profile = load_profile(name)
        except InputError as exc:
            if exc.source is None:
                raise InputError(exc.message, source="--profiles") from None
            raise
        if profile.name in bases:
            raise InputError(f"profile {profile.name} is listed twice", source="--profiles")
        bases[profile.name] = (base_config(config, {**overrides, "profile": (name, "--profiles")}), profile)
    return bases


def _check_names(overrides: dict, profiles: str | None, specs) -> None:
    """That the profiles and policies named on the command line exist (a directory or a shipped profile; a
    built-in policy or an importable ``module:Class``): the lookups the plan makes as it loads them, made
    first. (A name in a ``--config`` file is looked up as the plan reads the file.)"""
    from policies import PolicyError, policy_class
    from specbatch.commands.capacity.inputs import policies_error
    from sim.costmodel.profile import resolve_profile_path

    flag, names = ("--profiles", [part.strip() for part in profiles.split(",")]) if profiles is not None else \
        ("--profile", [_given(overrides, "profile")])
    for name in filter(None, names):
        try:
            resolve_profile_path(name)
        except InputError as exc:
            raise InputError(exc.message, source=flag, field="profile" if flag == "--profile" else None) from None
    for spec in specs:
        try:
            policy_class(spec.name)
        except PolicyError as exc:
            raise policies_error(spec.label, exc.message, "policy.name") from None


def _given(overrides: dict, key: str):
    """The value --flag or a keyword gave a config key (None when not given)."""
    value = overrides.get(key)
    return value[0] if isinstance(value, tuple) else value


def _refuse_pool_flags(overrides: dict) -> None:
    """The disaggregated pools' flags mean nothing to an aggregated search: one line, before any run."""
    from specbatch.commands.capacity.disaggregated import POOL_FLAGS, pool_keys

    for flag, key in zip(POOL_FLAGS, pool_keys()):
        if _given(overrides, key) is not None:
            raise InputError("applies only to disaggregated serving: give --pd-ratios or --gpu-budget", source=flag)


def _disaggregated_bases(config: str | None, overrides: dict, profiles: str | None, tp: str | None,
                         ratios: str | None, budget: int | None, gpus_per_replica: int | None,
                         prefill_profile: str | None = None):
    """Serving name -> (base scenario, profile): one aggregated replica, then each split
    (specbatch.commands.capacity.disaggregated), its prefill pool on ``prefill_profile`` where given; and what
    the report needs to compare them."""
    from specbatch.commands.capacity.disaggregated import (AGGREGATED, PREFILL_PROFILE_FLAG, RATIOS_FLAG, Split,
                                                           SplitAsk, check_not_v0, link_text, plan_splits, pool_keys,
                                                           split_overrides)
    from specbatch.commands.capacity.inputs import base_config
    from sim.costmodel.profile import load_profile

    if profiles is not None or tp is not None:
        raise InputError("compares splits of one profile (--decode-profile for the decode pool's GPU); leave out "
                         + ("--profiles" if profiles is not None else "--tp"), source=RATIOS_FLAG)
    aggregated = {key: value for key, value in overrides.items() if key not in pool_keys()}
    base = base_config(config, aggregated)
    check_not_v0(base)
    profile = load_profile(base.profile)
    aggregated_gpus = gpus_per_replica or profile.gpus_per_replica
    decode_given = _given(overrides, "cluster.decode_profile")
    pools = lambda split: split_overrides(split, prefill_profile, decode_given or base.profile,  # noqa: E731
                                          decode_given is not None)
    probe = base_config(config, {**overrides, **pools(Split(1, 1))}, split=True)
    prefill = profile
    if prefill_profile is not None:
        try:
            prefill = load_profile(prefill_profile)
        except InputError as exc:
            raise InputError(exc.message, source=PREFILL_PROFILE_FLAG) from None
    prefill_gpus = gpus_per_replica or prefill.gpus_per_replica
    decode_gpus = prefill_gpus
    if probe.cluster.decode_profile is not None:
        decode_gpus = gpus_per_replica or load_profile(probe.cluster.decode_profile).gpus_per_replica
    splits = plan_splits(ratios, budget, prefill_gpus, decode_gpus)
    bases = {AGGREGATED: (base, profile)}
    for split in splits:
        bases[split.name] = (base_config(config, {**overrides, **pools(split)}, split=True), prefill)
    ask = SplitAsk({split.name: split for split in splits}, aggregated_gpus, budget, link_text(probe),
                   probe.cluster.decode_profile, prefill_profile)
    return bases, ask


def _priced_splits(priced: dict, ask, gpu_price: str | None) -> dict:
    """Each split's facts (its pools, GPUs and the decode pool's profile) and its price per GPU-hour: the
    mean over its GPUs, each pool's GPU priced by its own profile (with --gpu-price)."""
    from dataclasses import replace as copy

    from specbatch.commands.capacity.prices import gpu_price as price_of, parse_gpu_prices, profile_gpu
    from sim.costmodel.profile import load_profile

    out = dict(priced)
    for name, split in ask.splits.items():
        p = priced[name]
        decode = ask.decode_profile
        price, key, gpu = p.price, p.price_key, p.facts["gpu"]
        if decode is not None:
            meta = load_profile(decode).meta
            gpu = f"{p.facts['gpu']} + {profile_gpu(meta)}"
            if gpu_price is not None:
                decode_key, decode_price = price_of(meta, parse_gpu_prices(gpu_price), decode)
                price = (split.prefill * split.prefill_gpus * p.price
                         + split.decode * split.decode_gpus * decode_price) / split.gpus
                key = key if decode_key == key else f"{key} + {decode_key}"
        facts = {**p.facts, "gpu": gpu, "gpus": split.gpus,
                 "split": {"prefill_replicas": split.prefill, "decode_replicas": split.decode,
                           "prefill_gpus_per_replica": split.prefill_gpus,
                           "decode_gpus_per_replica": split.decode_gpus, "gpus": split.gpus}}
        out[name] = copy(p, facts=facts, price=price, price_key=key)
    return out


def _split_variants(config: str | None, overrides: dict, bases: dict, tp: str) -> dict:
    """Each profile at each ``--tp`` size (specbatch.commands.capacity.parallel), in the order given."""
    from specbatch.commands.capacity.inputs import base_config
    from specbatch.commands.capacity.parallel import parse_sizes, variant
    from sim.costmodel.profile import load_profile

    sizes = parse_sizes(tp)
    out = {}
    for _, profile in bases.values():
        for size in sizes:
            name = variant(profile, size)
            split = load_profile(name)
            if split.name not in out:
                out[split.name] = (base_config(config, {**overrides, "profile": (name, "--tp")}), split)
    return out


def _check_gpus(bases: dict, gpus_per_replica: int | None) -> None:
    """``--gpus-per-replica`` may say what a profile does not record, never contradict what it does."""
    if gpus_per_replica is None:
        return
    for name, (_, profile) in bases.items():
        own = int(profile.meta.get("tensor_parallel_size", 0))
        if own and own != gpus_per_replica:
            raise InputError(f"profile {name} runs a replica on {own} GPU(s) (its tensor_parallel_size), not "
                             f"{gpus_per_replica}; leave --gpus-per-replica out", source="--gpus-per-replica")


def _priced_profiles(bases: dict, gpu_hour_price: float | None, gpu_price: str | None, described: dict) -> dict:
    """Profile name -> its facts (with ``described``: what its runs ran) and price per GPU-hour (None without
    a price flag)."""
    from specbatch.commands.capacity.inputs import positive
    from specbatch.commands.capacity.prices import gpu_price as price_of, parse_gpu_prices
    from specbatch.commands.capacity.report import PricedProfile

    one_price = positive(gpu_hour_price, "--gpu-hour-price")
    prices = parse_gpu_prices(gpu_price) if gpu_price is not None else None
    if prices is not None and one_price is not None:
        raise InputError("give one price for every GPU (--gpu-hour-price) or a price per GPU, not both",
                         source="--gpu-price")
    if len({profile.name for _, profile in bases.values()}) > 1 and prices is None and one_price is None:
        raise InputError("comparing profiles needs each GPU's price per hour, e.g. --gpu-price "
                         "h100=3.9,h200=4.5 (or --gpu-hour-price P, one price for all)", source="--gpu-price")
    priced = {}
    for name, (_, profile) in bases.items():
        key, price = None, one_price
        if prices is not None:
            key, price = price_of(profile.meta, prices, name)
        priced[name] = PricedProfile(facts={**_profile_facts(profile), "described": described[name]}, price=price,
                                     price_key=key)
    return priced


def _prices_text(gpu_hour_price: float | None, gpu_price: str | None) -> str | None:
    if gpu_price is not None:
        return f"--gpu-price {gpu_price}"
    if gpu_hour_price is not None:
        return f"--gpu-hour-price {gpu_hour_price:g}"
    return None


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)


def scenario_flags() -> list[str]:
    """The run flags capacity takes: WORKLOAD_FLAGS, then the speculation method's and its acceptance's."""
    from specbatch.commands.flags import RUN_FLAGS, SPECULATION_FLAGS

    from specbatch.commands.capacity.disaggregated import POOL_FLAGS

    return [flag for flag in WORKLOAD_FLAGS if flag in RUN_FLAGS] + [
        flag for flag in SPECULATION_FLAGS if flag not in WORKLOAD_FLAGS] + [flag for flag in POOL_FLAGS
                                                                             if flag in RUN_FLAGS]


def _at_least(value: int, minimum: int, flag: str, what: str | None = None) -> None:
    if value < minimum:
        raise InputError(f"must be at least {what or minimum}, got {value}", source=flag)


def _prepared(config, label: str):
    """The config as the run resolves it (policy defaults filled in); a bad policy fails here."""
    from specbatch.commands.capacity.inputs import policies_error
    from sim.simulate import prepare

    probe = replace(config, workload=replace(config.workload, num_requests=2, duration_s=None))
    try:
        resolved = prepare(probe).config
    except InputError as exc:
        if exc.field and exc.field.startswith("policy"):
            raise policies_error(label, exc.message, exc.field) from None
        raise
    return replace(config, policy=resolved.policy)


def _profile_facts(profile) -> dict:
    from specbatch.commands.capacity.prices import profile_gpu

    meta = profile.meta
    return {"name": profile.name, "gpu": profile_gpu(meta), "source": meta.get("source", "measured"),
            "device": meta.get("device", {}), "dtype": meta.get("dtype"), "gpus": profile.gpus_per_replica,
            "models": {role: m.get("name") for role, m in meta.get("models", {}).items()}}


def _workload_facts(config) -> dict:
    w, e = config.workload, config.engine

    def spec(length) -> str:
        return ", ".join(f"{k} {v}" for k, v in length.to_dict().items())

    arrival = "Poisson" if w.arrival == "poisson" else f"gamma, burstiness {w.burstiness:g}"
    kv = "the profile's KV capacity" if e.kv_cache_tokens is None else f"KV budget {e.kv_cache_tokens} tokens"
    return {"arrival": arrival, "prompt_tokens": spec(w.prompt_tokens), "output_tokens": spec(w.output_tokens),
            "batching": f"{e.batching}, max batch {e.max_batch_size}, {e.prefill} prefill, {kv}"}


def _digest(inputs, configs) -> str:
    import hashlib
    import json

    payload = json.dumps([repr(inputs), [c.digest() for c in configs.values()]], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:10]
