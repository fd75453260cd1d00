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
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np

from policies import Policy, PolicyError, make_policy
from policies.explain import Explaining
from sim.speculation.acceptance import (AcceptanceSampler, PositionSampler, RecordingSampler, RunLengthSampler,
                            SharedAlphaSampler, TraceSampler, acceptance_scale, accepted_per_position,
                            per_request_steps, position_rates, proposal_model, read_acceptance_trace,
                            read_runlength_trace)
from sim.costmodel.cache import fitted_profile, profile_digest, step_table
from sim.cluster import ReplicaParts, run_cluster
from sim.config import PolicyConfig, RunConfig
from sim.costmodel.model import CostModel, StepTable, v0_graph_batch_sizes
from sim.disaggregated import disaggregated_section, run_disaggregated, transfer_columns
from sim.errors import InputError
from sim.limits import COUNT_MAX, memory_problem, table_bytes
from sim.metrics import (StepTotals, by_label, per_request_spec_decode, replica_breakdown, scheduler_stats,
                         spec_decode_section, step_totals, summarize)
from sim.costmodel.profile import CSV_NAME, META_NAME, Profile, resolve_profile_path
from sim.replica import ReplicaPlan
from sim.scheduler import kv_reserve
from sim.scheduler.kvcache import blocks_for, prefix_keys
from sim.serving.clock import simulate_replica
from sim.serving.queues import arrival_queue
from sim.serving.records import ReplicaRecords
from sim.serving.transfer import KVBytes, Link, link_for
from sim.speculation.methods import SpeculationPlan, default_match_rate, kv_capacity_for, plan_run
from sim.stability import run_check
from workloads import Requests, TraceError, gamma_arrivals, profile_arrivals, read_trace, read_vllm_result

if TYPE_CHECKING:
    import pandas as pd

Columns = Mapping[str, np.ndarray]  # a table as named columns: a dict of arrays (or a DataFrame)

WORKLOAD, REQUEST_ALPHA, ACCEPTANCE = range(3)  # the run's random streams, in spawn order


def _stream(config: RunConfig, which: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(config.seed).spawn(3)[which])


def replica_streams(config: RunConfig, replicas: int) -> list[np.random.Generator]:
    """One acceptance stream per replica, fixed by the seed whatever order replicas run in."""
    if replicas == 1:
        return [_stream(config, ACCEPTANCE)]
    parent = np.random.SeedSequence(config.seed).spawn(3)[ACCEPTANCE]
    return [np.random.default_rng(child) for child in parent.spawn(replicas)]


def make_sampler(config: RunConfig, alphas: np.ndarray, rng: np.random.Generator | None = None,
                 k_max: int = 0, speculation: SpeculationPlan | None = None) -> RecordingSampler:
    """The run's acceptance model (``k_max``: the longest draft a step may ask, for the per-position
    table), wrapped to record what it draws for vLLM's speculation metrics; with the run's
    ``speculation``, a tree's longest-path acceptance and a host proposer's proposals
    (sim.speculation.proposals)."""
    rng = _stream(config, ACCEPTANCE) if rng is None else rng
    spec = config.acceptance
    tree = speculation.tree if speculation is not None else None
    if tree is not None:
        inner: AcceptanceSampler = PositionSampler(rng, np.asarray(tree.reach))
    elif spec.model == "per-position":
        inner = PositionSampler(rng, position_rates(spec.per_position, k_max))
    elif spec.model == "trace":
        inner = TraceSampler(rng, read_acceptance_trace(spec.trace), alphas.shape[0])
    elif spec.model == "runlength":
        inner = RunLengthSampler(rng, read_runlength_trace(spec.trace, spec.proposer), alphas.shape[0])
    elif spec.distribution == "fixed" and np.all(alphas == spec.alpha):
        inner = SharedAlphaSampler(rng, float(acceptance_scale(np.asarray([spec.alpha]))[0]))
    else:
        inner = AcceptanceSampler(rng)
    if speculation is not None and speculation.host:
        rate = spec.match_rate if spec.match_rate is not None else default_match_rate(speculation.spec.method,
                                                                                    spec.model)
        inner.proposals = proposal_model(replace(spec, match_rate=rate), True, inner, config.seed)
    per_request = config.output.per_request_spec_decode_metrics != "none"
    return RecordingSampler(inner, acceptance_scale(alphas), per_request)


def acceptance_values(config: RunConfig, alphas: np.ndarray) -> np.ndarray:
    """What each request's row carries for the sampler: its request id when the sampler is keyed
    (a trace, or per-request metrics), else its alpha's scale."""
    if config.acceptance.model in ("trace", "runlength") or config.output.per_request_spec_decode_metrics != "none":
        return np.arange(alphas.shape[0], dtype=np.float64)
    return acceptance_scale(alphas)


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
    replica: ReplicaPlan  # what each replica is built from (sim/replica.py)
    prefix_keys: np.ndarray | None = None  # vllm-v1 with prefix caching: each request's shared cache keys
    speculation: SpeculationPlan | None = None  # the method's drafter, tree and proposals (sim/speculation/methods.py)
    kv_bytes_per_token: int = 0  # disaggregated serving: what a prompt token's KV takes on each GPU
    decode: "PreparedRun | None" = None  # disaggregated serving with --decode-profile: the decode pool's own
    warnings: list[str] = field(default_factory=list)


@dataclass
class RunResult:
    """A run's records as typed columns (written as they are) and its summary.

    ``requests`` and ``steps`` are DataFrames built on first use from the columns, without
    copying them: the command line writes the columns and never needs pandas.
    """

    config: RunConfig
    profile: Profile
    request_columns: Columns  # one entry per requests.csv column
    step_columns: Columns | None  # one entry per steps.csv column (None: written to the run folder only)
    summary: dict
    warnings: list[str]
    wall_s: float
    engine_wall_s: float  # the SimPy loop alone, for the speed benchmark
    by_label: dict | None = None  # per-label metrics when a trace labels its requests
    replicas: list[dict] | None = None  # per-replica metrics of a cluster of more than one replica
    extra: dict | None = None  # further top-level sections of summary.json (a real replay says so there)
    reasons: list[dict] | None = None  # per replica: decode step index -> why k (only when a timeline is asked)
    spec_decode: dict | None = None  # vLLM's speculation counters (summary.json's speculative_decoding)
    spec_decode_requests: list[dict] | None = None  # per request, when asked (spec_decode.jsonl)
    itl: tuple[np.ndarray, np.ndarray] | None = None  # the ITLs as (gap, count) pairs, for distribution tests

    @property
    def request_count(self) -> int:
        return len(self.request_columns["request_id"])

    @cached_property
    def requests(self) -> "pd.DataFrame":
        return as_frame(self.request_columns)

    @cached_property
    def steps(self) -> "pd.DataFrame":
        if self.step_columns is None:
            raise ValueError("this run kept no steps in memory: they are in its run folder's steps.csv")
        return as_frame(self.step_columns)


def as_frame(columns: Columns) -> "pd.DataFrame":
    """A DataFrame over the columns, sharing their memory (a DataFrame is returned as is)."""
    import pandas as pd

    if isinstance(columns, pd.DataFrame):
        return columns
    return pd.DataFrame(dict(columns), copy=False)


def prepare(config: RunConfig) -> PreparedRun:
    """Everything that can be wrong with the inputs fails here, before the run."""
    c = config.cluster
    if c.prefill_replicas and (c.prefill or c.decode or c.decode_profile is not None):
        return _prepare_pools(config)
    return _prepare(config)


def _prepare_pools(config: RunConfig) -> PreparedRun:
    """A disaggregated run whose pools differ (their own engine settings, ``[cluster.prefill]`` and
    ``[cluster.decode]``, or the decode pool's own profile): each pool is prepared as its own run (the same
    requests: the same seed and workload), the prefill pool's standing for the run."""
    c = config.cluster
    pools = replace(c, prefill=None, decode=None, decode_profile=None)

    def pool(profile: str, settings, role: str) -> PreparedRun:
        engine = dict(settings or ())
        if "kv_cache_tokens" in engine:  # a pool's KV budget replaces the run's, however that was given
            engine.setdefault("gpu_memory_utilization", None)
        if "gpu_memory_utilization" in engine:
            engine.setdefault("kv_cache_tokens", None)
        try:
            return _prepare(replace(config, profile=profile, engine=replace(config.engine, **engine), cluster=pools),
                            role=role)
        except InputError as exc:  # a pool's own setting: name it where the pool set it
            if exc.field == "profile" and profile != config.profile:
                raise config.error("cluster.decode_profile", exc.message) from None
            name = exc.field.rpartition(".")[2] if exc.field else None
            if name in engine and exc.field == f"engine.{name}":
                raise config.error(f"cluster.{role}", f"{name}: {exc.message}") from None
            raise

    prefill = pool(config.profile, c.prefill, "prefill")
    decode = pool(c.decode_profile or config.profile, c.decode, "decode")
    if c.decode_profile is not None:
        ours, theirs = model_names(prefill.profile), model_names(decode.profile)
        if ours != theirs:
            raise config.error("cluster.decode_profile", f"profile '{decode.profile.name}' times "
                                                         f"{' + '.join(theirs)}, the prefill pool's "
                                                         f"'{prefill.profile.name}' {' + '.join(ours)}: "
                                                         "both pools must run the same models")
    prepared = replace(prefill, config=replace(prefill.config, engine=config.engine, cluster=c), decode=decode)
    prepared.warnings = prefill.warnings + [w for w in decode.warnings if w not in prefill.warnings]
    return prepared


def _prepare(config: RunConfig, role: str | None = None) -> PreparedRun:
    """One run's (or, ``role``, one disaggregated pool's) preparation: the checks of its inputs, its requests,
    cost model, step table, policy and replica."""
    profile, cost_model, digest = profile_and_costs(config.profile_path())
    cost_model, digest = _with_sampling(config, profile, cost_model, digest)
    try:
        policy = make_policy(config.policy.name, config.policy.params)
        if policy.max_k > 0 and not profile.has_draft:
            raise config.error("policy.name", f"profile '{profile.name}' has no draft model (a target-only "
                                              "profile): only --policy none runs on it")
        if policy.max_k > profile.k_max:
            raise policy.max_k_error(profile.k_max)
    except PolicyError as exc:
        raise config.policy_error(exc) from None
    speculation = plan_run(config, cost_model, policy.max_k)
    problem = memory_problem(table_bytes(config.engine.max_batch_size, policy.max_k))
    if problem is not None:  # before the first arrival is drawn (sim.limits)
        raise config.error("engine.max_batch_size", f"the step table for batches up to "
                                                    f"{config.engine.max_batch_size} {problem}")
    # Record the parameters the policy runs with, defaults included, in the resolved config.
    config = replace(config, policy=PolicyConfig(config.policy.name, {**policy.params(), **config.policy.params}))
    if config.acceptance.model in ("trace", "runlength"):
        try:
            if config.acceptance.model == "trace":
                read_acceptance_trace(config.acceptance.trace)
            else:
                read_runlength_trace(config.acceptance.trace, config.acceptance.proposer)
        except InputError as exc:
            if exc.line is None:
                raise config.error("acceptance.trace", exc.message) from None
            raise
    requests = make_requests(config, _stream(config, WORKLOAD))
    alphas = config.acceptance.request_alphas(_stream(config, REQUEST_ALPHA), len(requests))
    if requests.alpha is not None:  # a trace's per-request acceptance overrides the distribution
        alphas = np.where(np.isnan(requests.alpha), alphas, requests.alpha)
    _check_counts(config, requests, policy.max_k)
    reserve = kv_reserve(requests.prompt_tokens, requests.output_tokens, policy.max_k)
    budget = config.engine.kv_cache_tokens
    if config.engine.gpu_memory_utilization is not None:
        budget = kv_capacity_at(config, profile)
    if budget is None:
        budget = kv_capacity_for(profile, speculation.spec)
    v1 = config.engine.scheduler == "vllm-v1"
    keys, num_keys, max_blocks = None, 0, 1
    if v1:  # paged: a request alone must fit in whole blocks at its longest (its last step's slots and lookahead)
        check_v1(config, requests, policy.max_k)
        block = config.engine.block_size
        reserve = blocks_for(reserve + policy.max_k, block) * block
        max_blocks = int(blocks_for(int(reserve.max()), block)) + 1
        if config.engine.enable_prefix_caching:
            keys, num_keys = prefix_keys(requests, block)
    if budget is None:  # neither says: an unlimited cache, room for every request at its longest at once
        budget = int(reserve.sum())  # (under vllm-v1 in whole blocks, with the lookahead)
    worst = int(np.argmax(reserve))
    usable = budget // config.engine.block_size * config.engine.block_size if v1 else budget
    whose = " (the profile's measured capacity)" if not (config.engine.kv_cache_tokens or
                                                         config.engine.gpu_memory_utilization) else ""
    disaggregated = config.cluster.prefill_replicas > 0
    if disaggregated and role != "decode":  # a prefill replica holds the prompt and the one token the proxy asks for
        block = config.engine.block_size
        prompt_kv = blocks_for(kv_reserve(requests.prompt_tokens, 1, policy.max_k) + policy.max_k, block) * block
        longest = int(np.argmax(prompt_kv))
        if prompt_kv[longest] > usable:
            raise config.error("engine.kv_cache_tokens", f"request {longest}'s prompt needs {int(prompt_kv[longest])} "
                                                         f"tokens of KV cache on a prefill replica, more than its "
                                                         f"budget of {budget} tokens{whose}")
    if reserve[worst] > usable and role != "prefill":
        key = "engine.kv_cache_tokens"
        where = " on a decode replica" if disaggregated else ""
        raise config.error(key, f"request {worst} needs {int(reserve[worst])} tokens of KV cache{where}, more than "
                                f"the budget of {budget} tokens{whose}")
    reach = _table_reach(config, policy, requests, speculation)
    if not (v1 and config.engine.async_scheduling) and cost_model.overlapped:  # the engine's work is not hidden
        cost_model, digest = cost_model.without_overlap(), digest + "-sync"
    table = step_table(cost_model, reach, digest, chunk_tokens=config.engine.max_num_batched_tokens if v1 else 0,
                       graphs=graph_padding(config, cost_model))
    try:
        policy.bind(profile.k_max, table)  # the fast table: policies may price every step
    except PolicyError as exc:
        raise config.policy_error(exc) from None
    # vllm-v1 holds its budget as arrays of blocks: beyond every request at its longest at once (which never
    # evicts nor preempts) more blocks change nothing, so a budget of 2**40 tokens allocates what the run can use.
    held = min(budget, int(reserve.sum())) if v1 else budget
    replica = ReplicaPlan(table, config.engine, held, policy.max_k, max_blocks, num_keys,
                          lookahead=speculation.lookahead(policy.max_k),
                          lag_mode=speculation.lag_mode if policy.max_k else 0, requests=len(requests))
    prepared = PreparedRun(config, profile, cost_model, table, policy, requests, alphas, budget, replica, keys,
                           speculation)
    if disaggregated:
        prepared.kv_bytes_per_token = kv_bytes_per_token(profile, speculation.spec.method if policy.max_k else None)
        if not prepared.kv_bytes_per_token:
            raise config.error("cluster.prefill_replicas", f"profile '{profile.name}' records no KV bytes per token "
                                                           "(models' kv_bytes_per_token): a KV transfer cannot be "
                                                           "priced")
    prepared.warnings.extend(cost_model.range_warnings(**reach))
    return prepared


def _with_sampling(config: RunConfig, profile: Profile, cost_model: CostModel, digest: str):
    """The cost model verifying at the sampling the run's requests ask for (``workload.sampling``; None: the
    profile's own), and its step tables' cache key."""
    asked = config.workload.sampling
    if asked is None or asked == cost_model.sampling:
        return cost_model, digest
    if asked not in cost_model.samplers:
        raise config.error("workload.sampling", f"profile '{profile.name}' prices only {', '.join(profile.samplings())} "
                                                f"sampling (its verify points); compose one with --sampling {asked}, "
                                                f"or run without --sampling")
    return cost_model.with_sampling(asked), f"{digest}-{asked}"


def model_names(profile: Profile) -> tuple[str, ...]:
    """The models a profile times: its target's name, and its draft model's where it has one."""
    models = profile.meta.get("models") or {}
    return tuple(str((models.get(role) or {}).get("name")) for role in ("target", "draft") if role in models)


def checked_profile(name: str) -> Profile:
    """A profile, loaded and validated as :func:`~sim.costmodel.profile.load_profile` does, for a command that
    needs its facts before its runs: from the fitted-profile cache when these bytes were checked and fitted
    before (then its points are not read, nor pandas imported), its problems otherwise the same one line."""
    return profile_and_costs(name)[0]


def profile_and_costs(name: str | Path) -> tuple[Profile, CostModel, str]:
    """Load and fit a profile once per process, and once per machine through the disk cache
    (:mod:`sim.costmodel.cache`): sweeps and capacity searches run hundreds of scenarios on one profile,
    and fitting its curves costs far more than a small run."""
    directory = resolve_profile_path(name).resolve()
    digest = profile_digest([directory / CSV_NAME, directory / META_NAME])
    return (*_fitted(str(directory), digest), digest)


@lru_cache(maxsize=8)
def _fitted(directory: str, digest: str) -> tuple[Profile, CostModel]:
    return fitted_profile(Path(directory), digest, fit=_fit)


def _fit(profile: Profile) -> CostModel:
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise"):  # points that pass every field check yet defeat the fit: one line
            return CostModel(profile)
    except (ArithmeticError, ValueError, np.linalg.LinAlgError) as exc:
        raise InputError(f"cannot fit cost curves to these points ({exc}); check the latencies",
                         source=profile.path / CSV_NAME, field="profile") from None


def scheduler_for(run: PreparedRun):
    """A fresh scheduler for one replica of ``run`` (the simulator's and the real replay's alike)."""
    return run.replica.scheduler()


def kv_capacity_at(config: RunConfig, profile: Profile) -> int:
    """The KV tokens that fit at ``engine.gpu_memory_utilization``: the profile's capacity, recorded
    at its own memory fraction, moved by the memory between the two fractions over the KV bytes per
    token of both models (docs/scheduling.md)."""
    key, fraction = "engine.gpu_memory_utilization", config.engine.gpu_memory_utilization
    if config.engine.kv_cache_tokens is not None:
        raise config.error(key, "give either --gpu-memory-utilization or --kv-cache-tokens, not both")
    memory = profile.meta.get("memory") or {}
    per_token = kv_bytes_per_token(profile, config.speculation.method)
    budget = kv_capacity_for(profile, config.speculation)  # at the profile's own fraction
    if profile.kv_capacity_tokens is None or not {"available_bytes", "fraction"} <= memory.keys() or not per_token:
        raise config.error(key, f"profile '{profile.name}' records no memory figures to size the KV cache "
                                "from; give --kv-cache-tokens")
    capacity = budget + int((fraction - memory["fraction"]) * memory["available_bytes"] // per_token)
    if capacity < 1:
        raise config.error(key, f"{fraction:g} of {memory['available_bytes'] / 2**30:.0f} GiB leaves no room for "
                                f"a KV cache beside the models' weights")
    return capacity


def kv_bytes_per_token(profile: Profile, method: str | None) -> int:
    """The KV bytes one token takes on each GPU of a replica, as the profile records them: the target's and
    the drafter's of ``method`` (None: no drafter runs; a host matcher keeps none)."""
    models = profile.meta.get("models") or {}
    drafter = {} if method is None else models.get("draft" if method == "draft_model" else method) or {}
    return sum(int(m.get("kv_bytes_per_token") or 0) for m in (models.get("target") or {}, drafter))


def check_v1(config: RunConfig, requests: Requests, max_k: int) -> None:
    """What the vllm-v1 scheduler needs of its settings, said before the run (docs/scheduling.md)."""
    e = config.engine
    if e.max_num_batched_tokens < e.max_batch_size:  # vLLM's own check: every running request gets a token a step
        raise config.error("engine.max_num_batched_tokens",
                           f"{e.max_num_batched_tokens} tokens cannot give each of max_num_seqs {e.max_batch_size} "
                           "running requests a token a step; give at least max_num_seqs (vLLM asks the same)")
    if not e.chunked_prefill:  # a prompt, or a preempted request's recompute, must fit one step whole
        longest = int((requests.prompt_tokens + requests.output_tokens - 1).max())
        if longest > e.max_num_batched_tokens:
            raise config.error("engine.max_num_batched_tokens",
                               f"without chunked prefill a step must hold a whole prompt and its recompute: "
                               f"{longest} tokens (prompt + output - 1) > {e.max_num_batched_tokens}")


def _check_counts(config: RunConfig, requests: Requests, max_k: int) -> None:
    """A request's counts are kept in int32 (sim/serving/state.py). The largest it can reach: its draft
    tokens, at most k a decode step and so k times its output, and its cached tokens, at most its
    prompt and output (a preempted request's recompute)."""
    if not len(requests):
        return
    drafts = int(requests.output_tokens.max()) * max_k
    tokens = int((requests.prompt_tokens + requests.output_tokens).max())
    if max(drafts, tokens) > COUNT_MAX:
        where = "workload.trace" if config.workload.trace is not None else "workload.output_tokens"
        what = (f"a request of {int(requests.output_tokens.max())} output tokens may draft up to {max_k} tokens "
                f"a step" if drafts > COUNT_MAX else f"a request of {tokens} prompt and output tokens")
        raise config.error(where, f"{what}: beyond the {COUNT_MAX} a request's counts hold; give shorter requests")


def make_requests(config: RunConfig, rng: np.random.Generator) -> Requests:
    w = config.workload
    if w.trace is not None:
        try:
            return read_trace(w.trace)
        except TraceError as exc:
            raise InputError(exc.message, source=exc.path, line=exc.line, field=exc.field) from None
    if w.trace_vllm is not None:
        return vllm_requests(w.trace_vllm, rng)
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
    if config.acceptance.trace_lengths:  # the run-length trace's records give the lengths (request i: record i mod N)
        runs = read_runlength_trace(config.acceptance.trace, config.acceptance.proposer)
        record = np.arange(n) % len(runs)
        return Requests(arrivals, runs.prompt[record], runs.length[record])
    if w.shared_prefix is not None:  # prompts from groups behind system prompts, sent again and again
        prompts = w.shared_prefix.draw(rng, n, w.prompt_tokens)
        return Requests(arrivals, output_tokens=w.output_tokens.sample(rng, n), **prompts)
    return Requests(arrivals, w.prompt_tokens.sample(rng, n), w.output_tokens.sample(rng, n))


def vllm_requests(path: str, rng: np.random.Generator) -> Requests:
    """The completed requests of a vLLM benchmark result: sent at its start times where saved,
    else at arrivals drawn from its request rate and burstiness (inf: all at t = 0)."""
    try:
        result = read_vllm_result(path)
    except TraceError as exc:
        raise InputError(exc.message, source=exc.path, line=exc.line, field=exc.field) from None
    n = result.prompt_tokens.shape[0]
    if result.start_s is not None:
        order = np.argsort(result.start_s, kind="stable")
        return Requests(result.start_s[order], result.prompt_tokens[order], result.output_tokens[order])
    arrivals = gamma_arrivals(rng, result.request_rate, result.burstiness, num_requests=n)
    return Requests(arrivals, result.prompt_tokens, result.output_tokens)


def graph_padding(config: RunConfig, cost_model: CostModel) -> dict:
    """How a run's steps are padded to CUDA graphs (:meth:`CostModel.tabulate`'s arguments): none with
    ``enforce_eager`` or a profile of passes run eagerly; vLLM V1's token sizes for a vllm-v1 run
    (tabulate's default); vLLM V0's batch sizes for a v0 run, which the real replay pads to as well."""
    if config.engine.enforce_eager or not cost_model.cuda_graphs:
        return {"graph_sizes": ()}
    if config.engine.scheduler == "v0":
        return {"graph_batch_sizes": v0_graph_batch_sizes(config.engine.max_batch_size)}
    return {}


def _table_reach(config: RunConfig, policy: Policy, r: Requests, speculation: SpeculationPlan | None = None) -> dict:
    """Every (batch, k, context, prompt) the run can touch: what the step table must cover (and, for a
    method other than a draft model's, whose drafting it prices)."""
    reach = {"max_batch": config.engine.max_batch_size, "k_max": policy.max_k,
             "max_context": int((r.prompt_tokens + r.output_tokens).max()) + policy.max_k,
             "max_prompt": int(r.prompt_tokens.max()), "with_draft": policy.max_k > 0}
    if speculation is not None and speculation.drafter.to_dict() != {"kind": "model", "curve": "draft", "width": 1,
                                                                     "tree_tokens": []}:
        reach["drafter"] = speculation.drafter.to_dict()
    return reach


def execute(run: PreparedRun, routed: bool | None = None, backend=None, steps_sink=None) -> RunResult:
    """Run the engine. ``routed``: drive even one replica through the cluster's router
    (the default is to do so only for more than one replica; tests compare the two).
    ``backend``: one replica's step backend instead of the priced one (the validation's
    playback of a real replay, :mod:`sim.serving.recorded`). ``steps_sink``
    (:class:`~sim.serving.records.StepSink`): handed the step records as a single replica's compiled
    run writes them (a run folder's steps file, written while the engine runs); its ``streamed`` is set
    to the steps' columns once it has had them all, and left None where the run could not stream
    (anything but a single replica in compiled runs, or, for a sink that keeps none, a cluster in
    compiled code: sim.cluster.run_cluster). A sink that keeps no steps leaves the result none
    (``step_columns`` None; the summary is taken from their totals, the same figures)."""
    started = time.perf_counter()
    config, requests = run.config, run.requests
    count = config.cluster.replicas
    explain = config.output.timeline is not None  # the timeline shows why each k was chosen
    wrap = Explaining if explain else (lambda policy: policy)
    scale = acceptance_values(config, run.alphas)
    routed = count > 1 if routed is None else routed
    disaggregated = None
    if routed and backend is not None:  # a recorded backend plays one replica's steps back
        raise ValueError("a step backend drives one replica; this run is routed over a cluster")
    if config.cluster.prefill_replicas:
        if backend is not None:
            raise ValueError("a step backend drives one replica; this run is a disaggregated cluster")
        records, disaggregated, samplers, policies, engine_wall = _run_disaggregated(run, scale, wrap)
        cluster = None
    elif not routed:
        samplers = [make_sampler(config, run.alphas, k_max=run.table.k_max, speculation=run.speculation)]
        policies = [wrap(run.policy)]
        records, sent_s, engine_wall = _run_replica(run, scale, samplers[0], policies[0], backend, steps_sink)
        cluster = None
        if sent_s is not None:  # latencies run from when the client sent each request, as vLLM measures them
            requests = replace(requests, arrival_s=sent_s)
    else:
        parts = [ReplicaParts(wrap(run.policy if index == 0 else _fresh_policy(run)),
                              make_sampler(config, run.alphas, rng, run.table.k_max, run.speculation))
                 for index, rng in enumerate(replica_streams(config, count))]
        policies = [part.policy for part in parts]
        samplers = [p.sampler for p in parts]
        engine_started = time.perf_counter()
        cluster = run_cluster(arrival_s=requests.arrival_s, prompt_tokens=requests.prompt_tokens,
                              output_tokens=requests.output_tokens, prefix_keys=run.prefix_keys,
                              acceptance_scale=scale, replica=run.replica, parts=parts,
                              router=config.cluster.router, max_concurrency=config.workload.max_concurrency,
                              reply_delay_s=run.profile.request_latency_s,
                              steps_sink=steps_sink if steps_sink is not None and not steps_sink.keeps else None)
        engine_wall = time.perf_counter() - engine_started
        records = cluster.merged
        if cluster.sent_s is not None:
            requests = replace(requests, arrival_s=cluster.sent_s)
    latency = run.profile.request_latency_s
    if latency:  # the frontend's share: the client sees every token that much later (TTFT, E2E; not ITL)
        records.first_token_s += latency
        records.finish_s += latency
    totals = step_totals(records.steps)
    summary = summarize(requests.arrival_s, requests.prompt_tokens, requests.output_tokens, records.first_token_s,
                        records.finish_s, records.itl_values, records.itl_weights, totals,
                        config.output.goodput)
    spec_decode = spec_decode_section(summary, accepted_per_position(samplers, run.table.k_max))
    detail = config.output.per_request_spec_decode_metrics
    per_request = None if detail == "none" else per_request_spec_decode(
        per_request_steps(samplers, len(requests)), run.policy.max_k, detail == "detailed")
    if records.preemptions is not None:  # vllm-v1 (a v0 summary stays as it was)
        summary.update(scheduler_stats(records, prefix_caching=config.engine.enable_prefix_caching, steps=totals))
    kept = not isinstance(records.steps, StepTotals)  # else only their totals: the steps went to a file
    table = request_columns(requests, run.alphas, records)
    queue = run_check(config.workload, requests.arrival_s, records.scheduled_s, records.finish_s)  # a growing queue says so
    warnings = list(run.warnings) + ([queue.warning()] if queue is not None and queue.grows else [])
    steps = dict(records.steps) if kept else None
    breakdown = None
    extra = {"queue": queue.document()} if queue is not None else {}
    if disaggregated is not None:
        table.update(transfer_columns(disaggregated))
        steps["replica"] = disaggregated.step_replica
        decode = run.decode or run
        extra["disaggregated"] = disaggregated_section(disaggregated, run_link(config), kv_bytes(run),
                                                       (run.profile.name, decode.profile.name), summary["duration_s"],
                                                       config.cluster.pd_threshold, config.cluster.kv_transfers)
    if count > 1:  # a one-replica run's files stay exactly the single replica's
        table["replica"] = cluster.replica_of
        if kept:
            steps["replica"] = cluster.step_replica
        breakdown = replica_breakdown(requests.arrival_s, requests.prompt_tokens, requests.output_tokens,
                                      cluster.request_ids, cluster.per_replica(step_totals=True),
                                      summary["duration_s"],
                                      prefix_caching=config.engine.enable_prefix_caching)
    return RunResult(config, run.profile, table, steps, summary, warnings,
                     time.perf_counter() - started, engine_wall, by_label(table), breakdown,
                     extra=extra or None,
                     spec_decode=spec_decode, spec_decode_requests=per_request,
                     itl=(records.itl_values, records.itl_weights),
                     reasons=[policy.reasons for policy in policies] if explain else None)


def _run_disaggregated(run: PreparedRun, scale: np.ndarray, wrap):
    """The prefill and decode pools (sim/disaggregated.py): the client's records, the pools' own, every
    replica's sampler and policy (prefill replicas first), the engine's wall time."""
    config, requests = run.config, run.requests
    prefill, decode = config.cluster.prefill_replicas, config.cluster.decode_replicas
    pool = run.decode or run  # the decode pool's own preparation (--decode-profile), or the run's
    parts = []
    for index, rng in enumerate(replica_streams(config, prefill + decode)):
        own = run if index < prefill else pool
        first = index == 0 or (index == prefill and own is not run)  # each preparation's policy serves once
        parts.append(ReplicaParts(wrap(own.policy if first else _fresh_policy(own)),
                                  make_sampler(config, run.alphas, rng, own.table.k_max, own.speculation)))
    started = time.perf_counter()
    records = run_disaggregated(arrival_s=requests.arrival_s, prompt_tokens=requests.prompt_tokens,
                                output_tokens=requests.output_tokens, prefix_keys=run.prefix_keys,
                                acceptance_scale=scale, replica=run.replica, decode_replica=pool.replica,
                                prefill_parts=parts[:prefill], decode_parts=parts[prefill:],
                                router=config.cluster.router, link=run_link(config), kv=kv_bytes(run),
                                pd_threshold=config.cluster.pd_threshold, kv_transfers=config.cluster.kv_transfers)
    engine_wall = time.perf_counter() - started
    return records.merged, records, [p.sampler for p in parts], [p.policy for p in parts], engine_wall


def kv_bytes(run: PreparedRun) -> KVBytes:
    """What a prompt token's KV takes on a GPU of each pool (sim.serving.transfer)."""
    decode = run.decode or run
    return KVBytes(run.kv_bytes_per_token, decode.kv_bytes_per_token, run.profile.gpus_per_replica)


def run_link(config: RunConfig) -> Link:
    """The link a disaggregated run's KV crosses: the named one, its parameters overridden where given."""
    c = config.cluster
    return link_for(c.kv_link, c.kv_link_bandwidth_gb_s, c.kv_link_latency_us)


def _run_replica(run: PreparedRun, scale: np.ndarray, sampler, policy: Policy, backend, steps_sink=None):
    """One replica's engine run: its records, the client's send times (None without a concurrency
    limit) and the engine's wall time. The queue and the loop end here, before the metrics and
    the writing need their memory (about 100 bytes a request). ``steps_sink``: see :func:`execute`."""
    config, requests = run.config, run.requests
    limit = config.workload.max_concurrency
    queue = arrival_queue(requests.arrival_s, run.replica.inputs(requests.prompt_tokens, requests.output_tokens,
                                                                 run.prefix_keys), scale, limit,
                          run.profile.request_latency_s)
    if backend is not None:  # e.g. a playback, which releases the queue at the instants it recorded
        backend.watch(queue)
    loop = run.replica.loop(queue, policy, sampler, backend)
    buffers = loop.state.buffers
    streaming = steps_sink is not None and loop.compiled_runs is not None  # else no run would outpace the writing
    columns = list(buffers.step_columns(loop.scheduler.paged))
    if streaming:
        steps_sink.start(columns)
        buffers.stream_to(steps_sink)
        follow = getattr(steps_sink, "follow_requests", None)  # requests.csv too, as requests finish
        if follow is not None and limit is None and requests.label is None:
            follow(FinishedRequests(requests, run.alphas, loop.records(), run.profile.request_latency_s))
    started = time.perf_counter()
    simulate_replica(loop)
    engine_wall = time.perf_counter() - started
    loop.close()  # cycles back to the loop would keep its arrays and the queue until the GC ran
    if streaming:
        buffers.flush()
        steps_sink.streamed = columns
    records = loop.records()
    if streaming and not steps_sink.keeps:  # the steps are in the sink's file: the summary takes their totals
        records.steps = buffers.totals
    return records, (queue.sent_s if limit is not None else None), engine_wall


def _fresh_policy(run: PreparedRun) -> Policy:
    """Another instance of the run's policy, bound like the first: policies keep per-replica state."""
    policy = make_policy(run.config.policy.name, run.config.policy.params)
    policy.bind(run.profile.k_max, run.table)
    return policy


def simulate(config: RunConfig) -> RunResult:
    return execute(prepare(config))


def request_table(requests: Requests, alphas: np.ndarray, rec: ReplicaRecords) -> "pd.DataFrame":
    """:func:`request_columns` as a DataFrame."""
    return as_frame(request_columns(requests, alphas, rec))


def request_columns(requests: Requests, alphas: np.ndarray, rec: ReplicaRecords,
                    rows: slice = slice(None)) -> dict[str, np.ndarray]:
    """requests.csv's columns, in its order; ``rows``: those rows only (``rec`` holds just them)."""
    arrival = requests.arrival_s[rows]
    ttft = rec.first_token_s - arrival
    e2el = rec.finish_s - arrival
    out = requests.output_tokens[rows]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2el - ttft) / (out - 1), np.nan)
    return {
        "request_id": np.arange(*rows.indices(len(requests))),  # just these: a long run asks for 60-odd slices
        "arrival_s": arrival,
        "prompt_tokens": requests.prompt_tokens[rows],
        "output_tokens": out,
        "alpha": alphas[rows],
        "scheduled_s": rec.scheduled_s,
        "first_token_s": rec.first_token_s,
        "finish_s": rec.finish_s,
        "queue_s": rec.scheduled_s - arrival,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2el_s": e2el,
        "decode_steps": rec.decode_steps,
        "drafted_tokens": rec.drafted_tokens,
        "accepted_tokens": rec.accepted_tokens,
        **({"num_preemptions": rec.preemptions} if rec.preemptions is not None else {}),
        **({"num_cached_tokens": rec.cached_tokens} if rec.cached_tokens is not None else {}),
        **({"label": requests.label[rows]} if requests.label is not None else {}),
    }


class FinishedRequests:
    """requests.csv's rows of a single replica's run as they become final: a request's row is final once it
    has finished, and a run of them from the first can be written while the engine goes on
    (specbatch/commands/outputs.py ``StepsFile``). ``live``: the loop's per-request records (views of its
    arrays, which an arrival queue never replaces); ``latency_s``: the frontend's share, added to every
    first token and finish after the run (:func:`execute`), here to each row taken."""

    def __init__(self, requests: Requests, alphas: np.ndarray, live: ReplicaRecords, latency_s: float) -> None:
        self.requests, self.alphas, self.live, self.latency_s = requests, alphas, live, latency_s
        self.final = 0  # requests from the first that have finished

    def count(self) -> int:
        """How many requests from the first have finished by now."""
        waiting = np.isnan(self.live.finish_s[self.final:])
        self.final += int(waiting.argmax()) if waiting.any() else waiting.shape[0]
        return self.final

    def columns(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Rows ``lo`` to ``hi`` (finished) of requests.csv, as they will read after the run."""
        cut, live, shift = slice(lo, hi), self.live, self.latency_s
        late = (lambda values: values[cut] + shift) if shift else (lambda values: values[cut].copy())
        rec = ReplicaRecords(live.scheduled_s[cut].copy(), late(live.first_token_s), late(live.finish_s),
                             live.decode_steps[cut].copy(), live.drafted_tokens[cut].copy(),
                             live.accepted_tokens[cut].copy(), {}, live.itl_values, live.itl_weights,
                             None if live.preemptions is None else live.preemptions[cut].copy(),
                             None if live.cached_tokens is None else live.cached_tokens[cut].copy())
        return request_columns(self.requests, self.alphas, rec, cut)

