"""One simulated run: resolve inputs, check them all, then run the serving loop (one replica or a cluster).

A run is a pure function of (config, seed). Random streams are spawned from the
seed in a fixed order (workload, per-request alpha, acceptance draws), so adding
one stream never shifts another. A cluster of N > 1 replicas gives replica r the
r-th of N streams spawned from the acceptance stream; one replica uses that stream
itself, so a one-replica cluster is the single replica.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np
import pandas as pd

from policies import Policy, PolicyError, make_policy
from sim.acceptance import AcceptanceSampler, SharedAlphaSampler, acceptance_scale
from sim.cluster import ReplicaParts, run_cluster
from sim.config import PolicyConfig, RunConfig
from sim.costmodel import CostModel, StepTable
from sim.errors import InputError
from sim.metrics import by_label, replica_breakdown, summarize
from sim.profile import CSV_NAME, META_NAME, Profile, load_profile, resolve_profile_path
from sim.scheduler import kv_reserve, make_scheduler
from sim.serving.clock import simulate_replica
from sim.serving.loop import ServingLoop
from sim.serving.priced import PricedBackend
from sim.serving.queues import ArrivalQueue
from sim.serving.records import ReplicaRecords
from workloads import Requests, TraceError, gamma_arrivals, profile_arrivals, read_trace


WORKLOAD, REQUEST_ALPHA, ACCEPTANCE = range(3)  # the run's random streams, in spawn order


def _stream(config: RunConfig, which: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(config.seed).spawn(3)[which])


def replica_streams(config: RunConfig, replicas: int) -> list[np.random.Generator]:
    """One acceptance stream per replica, fixed by the seed whatever order replicas run in."""
    if replicas == 1:
        return [_stream(config, ACCEPTANCE)]
    parent = np.random.SeedSequence(config.seed).spawn(3)[ACCEPTANCE]
    return [np.random.default_rng(child) for child in parent.spawn(replicas)]


def make_sampler(config: RunConfig, alphas: np.ndarray, rng: np.random.Generator | None = None
                 ) -> AcceptanceSampler:
    rng = _stream(config, ACCEPTANCE) if rng is None else rng
    if config.acceptance.distribution == "fixed" and np.all(alphas == config.acceptance.alpha):
        return SharedAlphaSampler(rng, float(acceptance_scale(np.asarray([config.acceptance.alpha]))[0]))
    return AcceptanceSampler(rng)


@dataclass
class PreparedRun:
    config: RunConfig
    profile: Profile
    cost_model: CostModel
    table: StepTable
    policy: Policy
    requests: Requests
    alphas: np.ndarray
    kv_budget_tokens: int
    warnings: list[str] = field(default_factory=list)


@dataclass
class RunResult:
    config: RunConfig
    profile: Profile
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict
    warnings: list[str]
    wall_s: float
    engine_wall_s: float  # the SimPy loop alone, for the speed benchmark
    by_label: dict | None = None  # per-label metrics when a trace labels its requests
    replicas: list[dict] | None = None  # per-replica metrics of a cluster of more than one replica
    extra: dict | None = None  # further top-level sections of summary.json (a real replay says so there)


def prepare(config: RunConfig) -> PreparedRun:
    """Everything that can be wrong with the inputs fails here, before the run."""
    try:
        profile, cost_model = _profile_and_costs(config.profile)
    except InputError as exc:
        if exc.source is None:  # the name itself was bad: point at where it was given
            raise config.error("profile", exc.message) from None
        raise
    try:
        policy = make_policy(config.policy.name, config.policy.params)
        if policy.max_k > profile.k_max:
            raise policy.max_k_error(profile.k_max)
    except PolicyError as exc:
        raise _policy_error(config, exc) from None
    # Record the parameters the policy runs with, defaults included, in the resolved config.
    config = replace(config, policy=PolicyConfig(config.policy.name, {**policy.params(), **config.policy.params}))
    requests = make_requests(config, _stream(config, WORKLOAD))
    alphas = config.acceptance.request_alphas(_stream(config, REQUEST_ALPHA), len(requests))
    if requests.alpha is not None:  # a trace's per-request acceptance overrides the distribution
        alphas = np.where(np.isnan(requests.alpha), alphas, requests.alpha)
    reserve = kv_reserve(requests.prompt_tokens, requests.output_tokens, policy.max_k)
    budget = config.engine.kv_cache_tokens
    if budget is None:
        budget = profile.kv_capacity_tokens
    if budget is None:  # neither says: an unlimited cache
        budget = int(reserve.sum())
    worst = int(np.argmax(reserve))
    if reserve[worst] > budget:
        key = "engine.kv_cache_tokens"
        raise config.error(key, f"request {worst} needs {int(reserve[worst])} tokens of KV cache, more than the "
                                f"budget of {budget} tokens" + ("" if config.engine.kv_cache_tokens else
                                                                 " (the profile's measured capacity)"))
    reach = _table_reach(config, policy, requests)
    table = cost_model.tabulate(**reach)
    try:
        policy.bind(profile.k_max, table)  # the fast table: policies may price every step
    except PolicyError as exc:
        raise _policy_error(config, exc) from None
    prepared = PreparedRun(config, profile, cost_model, table, policy, requests, alphas, budget)
    prepared.warnings.extend(cost_model.range_warnings(**reach))
    return prepared


def _profile_and_costs(name: str) -> tuple[Profile, CostModel]:
    """Load and fit a profile once per process: sweeps and capacity searches run hundreds of
    scenarios on one profile, and fitting its curves costs far more than a small run."""
    directory = resolve_profile_path(name)
    stamp = tuple((f.stat().st_mtime_ns, f.stat().st_size) for f in (directory / CSV_NAME, directory / META_NAME)
                  if f.is_file())
    return _fitted(str(directory.resolve()), stamp)


@lru_cache(maxsize=8)
def _fitted(directory: str, stamp: tuple) -> tuple[Profile, CostModel]:
    profile = load_profile(directory)
    return profile, CostModel(profile)


def scheduler_for(run: PreparedRun):
    """A fresh scheduler for one replica of ``run`` (the simulator's and the real replay's alike)."""
    e = run.config.engine
    return make_scheduler(e.batching, e.max_batch_size, run.kv_budget_tokens, e.prefill)


def _policy_error(config: RunConfig, exc: PolicyError) -> InputError:
    key = "policy.name" if exc.field in (None, "name") else f"policy.{exc.field}"
    return config.error(key, exc.message)


def make_requests(config: RunConfig, rng: np.random.Generator) -> Requests:
    w = config.workload
    if w.trace is not None:
        try:
            return read_trace(w.trace)
        except TraceError as exc:
            raise InputError(exc.message, source=exc.path, line=exc.line, field=exc.field) from None
    burstiness = 1.0 if w.arrival == "poisson" else w.burstiness
    duration_s = None if w.num_requests else w.duration_s
    if w.rate_profile is not None:
        try:
            arrivals = profile_arrivals(rng, w.rate_profile, burstiness, duration_s=duration_s,
                                        num_requests=w.num_requests)
        except ValueError as exc:
            raise config.error("workload.rate_profile", str(exc)) from None
    else:
        arrivals = gamma_arrivals(rng, w.rate, burstiness, duration_s=duration_s, num_requests=w.num_requests)
    n = arrivals.size  # at least one: the first request arrives at t = 0
    return Requests(arrivals, w.prompt_tokens.sample(rng, n), w.output_tokens.sample(rng, n))


def _table_reach(config: RunConfig, policy: Policy, r: Requests) -> dict:
    """Every (batch, k, context, prompt) the run can touch: what the step table must cover."""
    return {"max_batch": config.engine.max_batch_size, "k_max": policy.max_k,
            "max_context": int((r.prompt_tokens + r.output_tokens).max()) + policy.max_k,
            "max_prompt": int(r.prompt_tokens.max()), "with_draft": policy.max_k > 0}


def execute(run: PreparedRun, routed: bool | None = None, backend=None) -> RunResult:
    """Run the engine. ``routed``: drive even one replica through the cluster's router
    (the default is to do so only for more than one replica; tests compare the two).
    ``backend``: one replica's step backend instead of the priced one (the validation's
    playback of a real replay, :mod:`sim.serving.recorded`)."""
    started = time.perf_counter()
    config, requests = run.config, run.requests
    count = config.cluster.replicas
    scale = acceptance_scale(run.alphas)
    if not (count > 1 if routed is None else routed):
        scheduler = scheduler_for(run)
        queue = ArrivalQueue(requests.arrival_s, requests.prompt_tokens, requests.output_tokens, scale,
                             run.policy.max_k)
        loop = ServingLoop(queue, scheduler=scheduler, policy=run.policy, k_max=run.table.k_max,
                           backend=backend or PricedBackend(run.table, make_sampler(config, run.alphas),
                                                            scheduler.prefill))
        engine_started = time.perf_counter()
        simulate_replica(loop)
        engine_wall = time.perf_counter() - engine_started
        records, cluster = loop.records(), None
    else:
        parts = [ReplicaParts(scheduler_for(run),
                              run.policy if index == 0 else _fresh_policy(run), make_sampler(config, run.alphas, rng))
                 for index, rng in enumerate(replica_streams(config, count))]
        engine_started = time.perf_counter()
        cluster = run_cluster(arrival_s=requests.arrival_s, prompt_tokens=requests.prompt_tokens,
                              output_tokens=requests.output_tokens, acceptance_scale=scale, max_k=run.policy.max_k,
                              table=run.table, parts=parts, router=config.cluster.router)
        engine_wall = time.perf_counter() - engine_started
        records = cluster.merged
    summary = summarize(requests.arrival_s, requests.prompt_tokens, requests.output_tokens, records.first_token_s,
                        records.finish_s, records.itl_values, records.itl_weights, records.steps)
    table = request_table(requests, run.alphas, records)
    steps = pd.DataFrame(records.steps)
    breakdown = None
    if count > 1:  # a one-replica run's files stay exactly the single replica's
        table["replica"] = cluster.replica_of
        steps["replica"] = cluster.step_replica
        breakdown = replica_breakdown(requests.arrival_s, requests.prompt_tokens, requests.output_tokens,
                                      cluster.request_ids, cluster.per_replica, summary["duration_s"])
    return RunResult(config, run.profile, table, steps, summary, list(run.warnings),
                     time.perf_counter() - started, engine_wall, by_label(table), breakdown)


def _fresh_policy(run: PreparedRun) -> Policy:
    """Another instance of the run's policy, bound like the first: policies keep per-replica state."""
    policy = make_policy(run.config.policy.name, run.config.policy.params)
    policy.bind(run.profile.k_max, run.table)
    return policy


def simulate(config: RunConfig) -> RunResult:
    return execute(prepare(config))


def request_table(requests: Requests, alphas: np.ndarray, rec: ReplicaRecords) -> pd.DataFrame:
    ttft = rec.first_token_s - requests.arrival_s
    e2el = rec.finish_s - requests.arrival_s
    out = requests.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2el - ttft) / (out - 1), np.nan)
    return pd.DataFrame({
        "request_id": np.arange(len(requests)),
        "arrival_s": requests.arrival_s,
        "prompt_tokens": requests.prompt_tokens,
        "output_tokens": out,
        "alpha": alphas,
        "scheduled_s": rec.scheduled_s,
        "first_token_s": rec.first_token_s,
        "finish_s": rec.finish_s,
        "queue_s": rec.scheduled_s - requests.arrival_s,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2el_s": e2el,
        "decode_steps": rec.decode_steps,
        "drafted_tokens": rec.drafted_tokens,
        "accepted_tokens": rec.accepted_tokens,
        **({"label": requests.label} if requests.label is not None else {}),
    })

