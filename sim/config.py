"""Run configuration: shipped defaults < TOML file < command-line flags (or API keywords).

Every setting is one row of :data:`KEYS`: its dotted name, how its value is read and
checked, its help text and its ``specbatch run`` flag. The config sections' dataclasses,
the set of known keys, the CLI flags (``specbatch.commands.cli``), the Python API's keywords and
the resolved ``config.toml`` are all derived from that table, so adding a setting is one
row here (plus its line in ``scenarios/default.toml``, which holds the shipped defaults).

Every value remembers where it came from (a file and line, a flag, or the shipped
defaults), so a bad one is answered with one line naming the field, the source and the
line. Unknown keys are errors too: a typo must not silently fall back to a default.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, make_dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import tomli_w

from sim.speculation.acceptance import DISTRIBUTIONS, MODELS, PROPOSERS, AcceptanceSpec, parse_rates
from sim.errors import InputError, missing_file, read_text
from sim.limits import INT64_MAX, MAX_BATCH, MAX_REPLICAS, MAX_TIME_S, MAX_TOKENS, SEED_MAX, memory_problem, request_bytes
from sim.costmodel.profile import SAMPLERS, resolve_profile_path
from sim.metrics import SPEC_DECODE_DETAIL, parse_goodput
from sim.router import CACHE_ROUTERS, ROUTERS, parse_router, router_text
from sim.serving.transfer import KV_LINKS, KV_TRANSFERS
from sim.scheduler import BATCHING, PREEMPTION, PREFILL, SCHEDULERS
from sim.jit import JIT_MODES
from sim.tomlsource import KeyLines, parse_toml
from workloads.lengths import LengthSpec, parse_length_spec
from workloads.numbers import read_number
from workloads.shared_prefix import SharedPrefix, parse_shared_prefix
from workloads.traffic import RateProfile, burstiness_from_cv, parse_rate_profile

ARRIVALS = ("poisson", "gamma")
RECORDS = ("csv", "parquet", "none")
DEFAULT_SCENARIO = "default.toml"
SECTIONS = ("workload", "engine", "policy", "acceptance", "output", "cluster", "speculative")


@dataclass(frozen=True)
class Source:
    where: str  # a file path, a flag such as "--rate", an API argument, or "defaults"
    line: int | None = None


# ---------------------------------------------------------------------------------------------
# How a value is read: its type and its checks. A check raises ValueError with the message
# the user sees after "field: ".


@dataclass(frozen=True)
class Value:
    """How one setting is read from TOML, a flag's text or a Python value."""

    type: Any                       # of the parsed value (the section dataclass's field type)
    parse: Callable[[Any], Any]     # raw (never None) -> value; raises ValueError(message)
    optional: bool = False          # may be absent (None); else "missing"
    infinite: bool = False          # a number that may be +inf (a documented meaning, e.g. rate inf)

    def read(self, raw: Any) -> Any:
        if raw is None:
            if self.optional:
                return None
            raise ValueError("missing")
        return self.parse(raw)

    @property
    def flag_type(self) -> type:
        """What argparse converts a flag's text with (a whole-number flag rejects '1.5' at once)."""
        return self.type if self.type in (int, float, bool) else str


def number(*, positive: bool = False, inside: tuple[float, float] | None = None,
           optional: bool = False, maximum: float | None = None, infinite: bool = False) -> Value:
    def parse(raw: Any) -> float:
        value = read_number(raw, infinite=infinite)
        if value == math.inf:
            return value
        if positive and value <= 0:
            raise ValueError(f"must be greater than 0, got {raw}")
        if inside is not None and not inside[0] < value < inside[1]:
            raise ValueError(f"must be inside ({inside[0]:g}, {inside[1]:g}), got {value}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum:g}, got {raw}")
        return value
    return Value(float, parse, optional, infinite)


def integer(*, minimum: int, optional: bool = False, maximum: int = INT64_MAX, why: str = "") -> Value:
    def parse(raw: Any) -> int:
        if isinstance(raw, str):
            try:
                raw = int(raw) if raw.isascii() else None
            except ValueError:
                raise ValueError(f"'{raw}' is not a whole number") from None
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError(f"'{raw}' is not a whole number")
        if raw < minimum:
            raise ValueError(f"must be at least {minimum}, got {raw}")
        if raw > maximum:
            limit = "2**63 - 1" if maximum == INT64_MAX else maximum
            raise ValueError(f"must be at most {limit}{why}, got {raw}")
        return raw
    return Value(int, parse, optional)


def share(*, optional: bool = False) -> Value:
    """A number in [0, 1] (both ends included: a rate that may be certain or nil)."""
    inner = number(optional=optional)

    def parse(raw: Any) -> float:
        value = inner.parse(raw)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"must be in [0, 1], got {raw}")
        return value
    return Value(float, parse, optional)


def read_speculative_config(raw: Any) -> dict:
    """vLLM's speculative_config as a table: given as one (TOML, API), as JSON text or a JSON file."""
    from sim.speculation.methods import read_vllm_config

    return read_vllm_config(raw)  # a ValueError (one line) when it is neither


def parse_sibling_rates(raw: Any) -> tuple[float, ...]:
    """A tree's sibling rates, from a TOML list or "0.3,0.2": each in [0, 1] (no order: each is conditional)."""
    return parse_rates(raw, falling=False)


def boolean() -> Value:
    """true/false in TOML or a Python bool; the words true/false (any case) from text."""
    def parse(raw: Any) -> bool:
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        if not isinstance(raw, bool):
            raise ValueError(f"'{raw}' is not true or false")
        return raw
    return Value(bool, parse)


def choice(allowed: tuple[str, ...]) -> Value:
    def parse(raw: Any) -> str:
        if raw not in allowed:
            raise ValueError(f"'{raw}' is not one of {', '.join(allowed)}")
        return raw
    return Value(str, parse)


def text(*, optional: bool = False) -> Value:
    def parse(raw: Any) -> str:
        if not isinstance(raw, str) or not raw:
            raise ValueError(f"expected a non-empty string, got {raw!r}")
        return raw
    return Value(str, parse, optional)


def window(raw: Any) -> tuple[float, float]:
    """'START:END' in seconds of simulated time, 0 <= START < END."""
    parts = str(raw).split(":")
    try:
        start, end = (float(p) for p in parts) if len(parts) == 2 else (math.nan, math.nan)
    except ValueError:
        start = end = math.nan
    if not (math.isfinite(start) and math.isfinite(end)):
        raise ValueError(f"'{raw}' is not START:END in seconds (e.g. 100:160)")
    if not 0 <= start < end:
        raise ValueError(f"needs 0 <= START < END, got {raw}")
    return start, end


# The engine settings a disaggregated pool may set for itself ([cluster.prefill] / [cluster.decode]).
POOL_ENGINE_KEYS = ("max_batch_size", "max_num_batched_tokens", "kv_cache_tokens", "gpu_memory_utilization")


def pool_engine(raw: Any) -> tuple[tuple[str, Any], ...]:
    """One pool's engine settings: a TOML table, or as a flag KEY=VALUE,KEY=VALUE (e.g.
    max_num_batched_tokens=16384,max_batch_size=64), each read as the [engine] key of that name reads it."""
    if isinstance(raw, str):
        pairs = {}
        for item in filter(None, (part.strip() for part in raw.split(","))):
            name, equals, value = item.partition("=")
            if not equals:
                raise ValueError(f"'{item}' is not KEY=VALUE (one of {', '.join(POOL_ENGINE_KEYS)})")
            pairs[name.strip()] = value.strip()
        raw = pairs
    if not isinstance(raw, dict):
        raise ValueError(f"expected a table of engine settings ({', '.join(POOL_ENGINE_KEYS)}), got {raw!r}")
    out = []
    for name, value in raw.items():
        if name not in POOL_ENGINE_KEYS:
            raise ValueError(f"'{name}' is not a setting a pool sets for itself (one of {', '.join(POOL_ENGINE_KEYS)})")
        try:
            out.append((name, KEY_BY_NAME[f"engine.{name}"].value.read(value)))
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return tuple(sorted(out))


def _pool_table(value: tuple | None, section: Any) -> dict | None:
    """Written as a [cluster.prefill] / [cluster.decode] table, only for a disaggregated run that sets one."""
    return dict(value) if value and section.prefill_replicas else None


def _window_text(value: tuple[float, float] | None, section: Any = None) -> str | None:
    return None if value is None else f"{value[0]!r}:{value[1]!r}"


def _as_dict(value: Any, section: Any = None) -> dict | None:
    return None if value is None else value.to_dict()


def _same(value: Any, section: Any = None) -> Any:
    return value


def _never(value: Any, section: Any) -> None:
    """How the run is computed, not what it computes: left out of config.toml (and its digest)."""
    return None


def _if_v1(value: Any, section: Any) -> Any:
    """The vllm-v1 scheduler's keys are written only for a vllm-v1 run."""
    return None if section.scheduler == "v0" else value


def _if_v0(value: Any, section: Any) -> Any:
    """The v0 scheduler's keys are written only for a v0 run."""
    return value if section.scheduler == "v0" else None


def _if_disaggregated(value: Any, section: Any) -> Any:
    """The disaggregation's keys are written only for a disaggregated run."""
    return value if section.prefill_replicas else None


DISAGGREGATION_KEYS = ("cluster.decode_profile", "cluster.kv_link", "cluster.kv_link_bandwidth_gb_s",
                       "cluster.kv_link_latency_us", "cluster.kv_transfers", "cluster.pd_threshold", "cluster.prefill",
                       "cluster.decode")


# Keys that only one scheduler reads: giving one to the other is an error, not silently nothing.
V0_KEYS = ("engine.prefill",)
V1_KEYS = ("engine.max_num_batched_tokens", "engine.chunked_prefill", "engine.block_size",
           "engine.enable_prefix_caching", "engine.preemption", "engine.async_scheduling")


# ---------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Key:
    """One setting: everything the config, the CLI, the API and config.toml need to know about it."""

    name: str                       # dotted, as in TOML: "workload.rate"; the section is the part before the dot
    value: Value | None             # None: a policy parameter, checked by the policy itself
    help: str
    flag: str | None = None         # its `specbatch run` flag; None: TOML (and API) only
    write: Callable[[Any, Any], Any] = _same  # (value, its section) -> the value config.toml records (None: left out)
    flag_type: type | None = None   # a policy parameter's flag type (other keys: their value's)
    aliases: tuple[str, ...] = ()   # further flags (and API keywords) for the same key, e.g. vLLM's name

    @property
    def section(self) -> str | None:
        return self.name.split(".", 1)[0] if "." in self.name else None

    @property
    def field(self) -> str:
        return self.name.rsplit(".", 1)[-1]


LENGTH_HELP = "N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA[:MAX]"

# In config.toml's order (the resolved file must stay byte-identical: its digest names run folders).
KEYS: tuple[Key, ...] = (
    Key("seed", integer(minimum=0, maximum=SEED_MAX, why=" (a TOML integer)"), "random seed; same config and seed give the same bytes", "--seed"),
    Key("profile", text(), "profile directory or shipped profile name", "--profile"),
    Key("workload.arrival", choice(ARRIVALS), "arrival process: poisson or gamma", "--arrival"),
    Key("workload.rate", number(positive=True, infinite=True), "mean request rate (req/s); inf: every request "
        "at t = 0, as vllm bench serve --request-rate inf", "--rate", aliases=("--request-rate",)),
    Key("workload.rate_profile", Value(RateProfile, parse_rate_profile, optional=True),
        "time-varying rate, replacing --rate: phases:1,4,8:60,60,60, ramp:1:8[:S], ramp-exp:1:8[:S], "
        "sine:MEAN:AMP:PERIOD[:PHASE] or onoff:ON:OFF:ON_S:OFF_S", "--rate-profile", write=_as_dict),
    Key("workload.burstiness", number(positive=True), "gamma shape (vLLM's burstiness): 1 = Poisson; any "
        "other value means gamma arrivals",
        "--burstiness", write=lambda value, section: value if section.cv is None else None),
    Key("workload.cv", number(positive=True, optional=True),
        "gamma gaps' coefficient of variation, instead of --burstiness (= 1/cv^2)", "--cv"),
    Key("workload.duration_s", number(positive=True, optional=True, maximum=MAX_TIME_S), "generate arrivals for this many seconds",
        "--duration"),
    Key("workload.num_requests", integer(minimum=1, optional=True), "generate exactly this many requests instead",
        "--num-requests", aliases=("--num-prompts",)),
    Key("workload.prompt_tokens", Value(LengthSpec, parse_length_spec), LENGTH_HELP, "--prompt-tokens",
        write=_as_dict),
    Key("workload.output_tokens", Value(LengthSpec, parse_length_spec), LENGTH_HELP, "--output-tokens",
        write=_as_dict),
    Key("workload.shared_prefix", Value(SharedPrefix, parse_shared_prefix, optional=True),
        "shared-prefix prompts (inference-perf's shared_prefix): GROUPS:PROMPTS:SYSTEM_TOKENS, each request "
        "sending one of GROUPS x PROMPTS prompts (a group's system prompt, then a question of --prompt-tokens)",
        "--shared-prefix", write=_as_dict),
    Key("workload.trace", text(optional=True),
        "replay a CSV trace (arrival_s, prompt_tokens, output_tokens[, alpha, label])", "--trace"),
    Key("engine.batching", choice(BATCHING), "continuous or static", "--batching"),
    Key("engine.max_batch_size", integer(minimum=1, maximum=MAX_BATCH, why=" (beyond any serving engine's batch)"),
        "most sequences in a batch", "--max-batch-size", aliases=("--max-num-seqs",)),
    Key("engine.prefill", choice(PREFILL), "v0: packed (admitted prompts cost as their mean length, as vLLM) or "
        "padded (as the longest, as a right-padded batch)", "--prefill", write=_if_v0),
    Key("engine.kv_cache_tokens", integer(minimum=1, optional=True, maximum=2**62),
        "KV-cache budget in tokens (default: the profile's)", "--kv-cache-tokens"),
    # The scheduler and the vllm-v1 scheduler's settings (vLLM's names; docs/scheduling.md). config.toml
    # records the v1 settings only for a vllm-v1 run, the v0 ones only for a v0 run.
    Key("engine.scheduler", choice(SCHEDULERS), "vllm-v1 (vLLM V1: a token budget per step, chunked prefill in "
        "mixed steps, paged KV with prefix caching and preemption) | v0 (whole KV reserved at admission, "
        "prefill-only and decode-only steps; static batching)", "--scheduler"),
    Key("engine.max_num_batched_tokens", integer(minimum=1, maximum=MAX_TOKENS), "vllm-v1: tokens per step (decodes with their "
        "speculative tokens, then prefill chunks)", "--max-num-batched-tokens", write=_if_v1),
    Key("engine.chunked_prefill", boolean(), "vllm-v1: split prompts into chunks to fill the step's token budget "
        "(--no-chunked-prefill: a prompt waits until it fits whole)", "--chunked-prefill", write=_if_v1),
    Key("engine.block_size", integer(minimum=1, maximum=MAX_TOKENS), "vllm-v1: tokens per KV-cache block", "--block-size",
        write=_if_v1),
    Key("engine.enable_prefix_caching", boolean(), "vllm-v1: share and keep full KV blocks of identical prompt "
        "prefixes (vLLM's automatic prefix caching; trace columns prompt_id, prefix_id + prefix_tokens)",
        "--enable-prefix-caching", write=_if_v1),
    Key("engine.async_scheduling", boolean(), "vllm-v1: schedule the next step while this one runs (vLLM's "
        "--async-scheduling): the engine's own work hides behind the passes, and a request that arrives during "
        "a step waits for the step after next", "--async-scheduling", write=_if_v1),
    Key("engine.enforce_eager", boolean(), "run every pass eagerly, without CUDA graphs (vLLM's "
        "--enforce-eager): a CUDA profile's steps are then not padded to graph capture sizes", "--enforce-eager",
        write=lambda value, section: True if value else None),
    Key("engine.gpu_memory_utilization", number(inside=(0.0, 1.0001), optional=True),
        "fraction of the GPU's memory for weights and KV cache, as vLLM's; sets the KV capacity from the "
        "profile's memory figures (instead of --kv-cache-tokens)", "--gpu-memory-utilization"),
    Key("engine.preemption", choice(PREEMPTION), "vllm-v1: what happens to the newest running request when "
        "blocks run out (recompute: back to the waiting head, its KV dropped)", "--preemption", write=_if_v1),
    Key("engine.jit", choice(JIT_MODES), "the engine's rules compiled (numba; identical results): auto (when numba "
        "is installed), on or off (interpreted: slow, for debugging)", "--jit", write=_never),
    Key("policy.name", text(), "speculation-length policy: none, fixed, lut, goodput, context, adaptive, vllm-dynamic, "
        "sglang-adaptive, trtllm-schedule, or module:Class, "
        "with :KEY=VALUE parameters", "--policy"),
    Key("policy.k", None, "speculation length for --policy fixed", "--k", flag_type=int),
    # The engine policies' knobs, under the engines' own flag names (docs/policy-engines.md).
    Key("policy.speculative_config", None, "vLLM's speculative_config JSON, for --policy vllm-dynamic (the "
        "[speculative] section's config when not given)"),
    Key("policy.adaptive_config", None, "SGLang's adaptive config (JSON text or file), for --policy "
        "sglang-adaptive", "--speculative-adaptive-config", flag_type=str),
    Key("policy.draft_len_schedule", None, "TensorRT-LLM's draft_len_schedule, e.g. '{4: 4, 8: 2}', for "
        "--policy trtllm-schedule", "--draft-len-schedule", flag_type=str),
    Key("acceptance.alpha", number(inside=(0.0, 1.0)), "per-token acceptance rate in (0, 1)", "--alpha"),
    Key("acceptance.distribution", choice(DISTRIBUTIONS), "fixed, or beta for per-request alpha",
        "--alpha-distribution"),
    Key("acceptance.concentration", number(positive=True), "Beta concentration (alpha*c, (1-alpha)*c)",
        "--alpha-concentration"),
    Key("output.dir", text(optional=True), "output folder (default runs/<config hash>)", "--out"),
    Key("output.records", choice(RECORDS), "per-request and per-step records: csv, parquet or none", "--records"),
    Key("output.timeline", text(optional=True), "also write the simulated timeline here, as Chrome trace-event "
        "JSON (open it in Perfetto)", "--timeline"),
    Key("output.timeline_window", Value(tuple, window, optional=True), "only steps and requests overlapping "
        "START:END seconds of simulated time", "--timeline-window", write=_window_text),
    Key("cluster.replicas", integer(minimum=1, maximum=MAX_REPLICAS, why=" (every replica is simulated in one "
                                                                       "process)"), "identical replicas behind one router (default 1)", "--replicas"),
    Key("cluster.router", Value(str, router_text), "round-robin, least-requests, least-tokens or prefix-aware "
        "(llm-d's scorers; weights as prefix-aware:prefix=3:queue=2:kv=2, llm-d's defaults)", "--router"),
    # Disaggregated prefill and decode (sim/disaggregated.py): written only for such a run, so every
    # other run's config.toml and digest stay as they were.
    Key("cluster.prefill_replicas", integer(minimum=0, maximum=MAX_REPLICAS), "disaggregated serving: replicas "
        "that only prefill (vLLM's kv_producer); 0 (default): every replica does both", "--prefill-replicas",
        write=_if_disaggregated),
    Key("cluster.decode_replicas", integer(minimum=0, maximum=MAX_REPLICAS), "disaggregated serving: replicas "
        "that decode what the prefill replicas send (vLLM's kv_consumer)", "--decode-replicas",
        write=_if_disaggregated),
    Key("cluster.decode_profile", text(optional=True), "disaggregated serving: the decode pool's profile (another "
        "GPU or TP size, the same models; default: the run's profile)", "--decode-profile", write=_if_disaggregated),
    Key("cluster.kv_link", choice(KV_LINKS), "disaggregated serving: the link KV blocks cross, rdma (between "
        "nodes) or nvlink (within a node)", "--kv-link", write=_if_disaggregated),
    Key("cluster.kv_link_bandwidth_gb_s", number(positive=True, optional=True), "disaggregated serving: the "
        "link's bandwidth per GPU and direction, GB/s (default: the link's)", "--kv-link-bandwidth",
        write=_if_disaggregated),
    Key("cluster.kv_link_latency_us", number(optional=True), "disaggregated serving: the link's fixed cost per "
        "transfer, microseconds (default: the link's)", "--kv-link-latency-us", write=_if_disaggregated),
    Key("cluster.kv_transfers", choice(KV_TRANSFERS), "disaggregated serving: queued (each link end carries one "
        "transfer at a time) or shared (transfers in flight share each end's bandwidth, as NIXL's concurrent "
        "reads do)", "--kv-transfers", write=_if_disaggregated),
    Key("cluster.prefill", Value(tuple, pool_engine, optional=True), "disaggregated serving: the prefill pool's own "
        f"engine settings ({', '.join(POOL_ENGINE_KEYS)}), over [engine]'s", "--prefill-engine", write=_pool_table),
    Key("cluster.decode", Value(tuple, pool_engine, optional=True), "disaggregated serving: the decode pool's own "
        f"engine settings ({', '.join(POOL_ENGINE_KEYS)}), over [engine]'s", "--decode-engine", write=_pool_table),
    Key("cluster.pd_threshold", integer(minimum=0, optional=True), "disaggregated serving as llm-d routes it: the "
        "decode replica is chosen first, and a request whose prompt tokens not in its prefix cache are fewer than "
        "this is prefilled there (llm-d's pd-profile-handler threshold; 0, its default, sends every prompt to the "
        "prefill pool); unset: vLLM's proxy, which picks the decode replica after the prefill", "--pd-threshold",
        write=_if_disaggregated),
    # vLLM compatibility: acceptance models, vllm bench serve's inputs and options, vLLM's speculation
    # metrics. Each is left out of config.toml at its default, so earlier runs keep their digests.
    Key("acceptance.model", choice(MODELS), "geometric (alpha), per-position (vLLM's per-position rates) or "
        "trace (vLLM's per-request per_step_accepted/per_step_drafted, JSONL)", "--acceptance-model",
        write=lambda value, section: None if value == "geometric" else value),
    Key("acceptance.per_position", Value(tuple, parse_rates, optional=True),
        "per-position acceptance rates P(a >= j), j = 1, 2, ...: e.g. 0.8,0.6,0.45", "--acceptance-per-position",
        write=lambda value, section: None if value is None else list(value)),
    Key("acceptance.trace", text(optional=True), "JSONL of per-request per_step_accepted/per_step_drafted "
        "(vLLM's --per-request-spec-decode-metrics detailed)", "--acceptance-trace"),
    Key("workload.trace_vllm", text(optional=True), "replay the requests of a `vllm bench serve --save-result "
        "--save-detailed` JSON file (lengths, and start times where present)", "--trace-vllm"),
    Key("workload.max_concurrency", integer(minimum=1, optional=True, maximum=MAX_TOKENS), "the client keeps at most N requests "
        "outstanding (vllm bench serve --max-concurrency), over all the replicas", "--max-concurrency"),
    Key("output.goodput", Value(dict, parse_goodput, optional=True), "request goodput SLOs in ms, as vllm bench "
        "serve --goodput: ttft:MS tpot:MS e2el:MS", "--goodput"),
    Key("output.per_request_spec_decode_metrics", choice(SPEC_DECODE_DETAIL), "none, summary or detailed: "
        "per-request speculation metrics in spec_decode.jsonl (vLLM's --per-request-spec-decode-metrics)",
        "--per-request-spec-decode-metrics", write=lambda value, section: None if value == "none" else value),
    # Speculation methods (sim/speculation/methods.py, docs/speculation-methods.md): vLLM's speculative_config or
    # SGLang's flags. Nothing given: a separate draft model, as before (and config.toml stays as it was).
    Key("speculative.config", Value(dict, read_speculative_config, optional=True),
        "vLLM's speculative_config (JSON text, a JSON file or a TOML table): method draft_model, ngram, suffix, "
        "eagle, eagle3, medusa or mtp; num_speculative_tokens; prompt_lookup_min/max; "
        "num_speculative_tokens_per_batch_size (the vllm-dynamic policy)", "--speculative-config"),
    Key("speculative.algorithm", text(optional=True), "SGLang's --speculative-algorithm: EAGLE, EAGLE3, NEXTN (MTP), "
        "STANDALONE (a draft model) or NGRAM", "--speculative-algorithm"),
    Key("speculative.num_steps", integer(minimum=1, optional=True, maximum=127), "SGLang's --speculative-num-steps: "
        "draft depth (k)", "--speculative-num-steps"),
    Key("speculative.eagle_topk", integer(minimum=1, optional=True, maximum=64), "SGLang's --speculative-eagle-topk: "
        "candidates per node (> 1: a tree)", "--speculative-eagle-topk"),
    Key("speculative.num_draft_tokens", integer(minimum=2, optional=True, maximum=1024), "SGLang's "
        "--speculative-num-draft-tokens: tokens the target verifies per step, the root included",
        "--speculative-num-draft-tokens"),
    Key("acceptance.proposer", Value(str, choice(PROPOSERS).parse, optional=True), "runlength model: whose runs "
        "the trace's records give, eagle or ngram", "--acceptance-proposer"),
    Key("acceptance.trace_lengths", boolean(), "runlength model: requests take their prompt and output lengths "
        "from the trace's records (request i: record i mod N)", "--acceptance-trace-lengths",
        write=lambda value, section: value or None),
    Key("acceptance.match_rate", share(optional=True), "n-gram and suffix: the "
        "chance the context matches at an output position (runlength: where the run is 1); default: the method's "
        "(docs/speculation-methods.md)", "--acceptance-match-rate"),
    Key("acceptance.sibling_rates", Value(tuple, parse_sibling_rates, optional=True), "trees: the chance the 2nd, "
        "3rd, ... ranked candidate is the target's token once the better-ranked were not, e.g. 0.3,0.2",
        "--acceptance-sibling-rates", write=lambda value, section: None if value is None else list(value)),
    Key("workload.sampling", Value(str, choice(SAMPLERS).parse, optional=True), "the sampling the requests ask "
        "for, as vLLM's sampler runs it: greedy (temperature 0, vllm bench serve's default), random (temperature "
        "> 0) or top-p (top-p or top-k filtering: a sort over the vocabulary in vLLM 0.15); default: the "
        "profile's own (docs/gpu-profiles.md#sampling-a-runs-choice)", "--sampling"),
)

KNOWN = frozenset(key.name for key in KEYS if key.value is not None)  # policy.* is open: the policy checks it
KEY_BY_NAME = {key.name: key for key in KEYS}


def key_for(name: str) -> str:
    """A flag or keyword name (``rate``, ``max-batch-size``, ``num_requests``, ``k``) -> its config key;
    anything else (a dotted key) as written."""
    if "." not in name:
        flag = f"--{name.replace('_', '-')}"
        for key in KEYS:
            if key.flag == flag or flag in key.aliases:
                return key.name
    return name


def _section_type(class_name: str, section: str, doc: str) -> type:
    """A frozen dataclass with one field per key of ``section``, typed by the key's value."""
    fields = [(key.field, key.value.type | None if key.value.optional else key.value.type)
              for key in KEYS if key.section == section]
    cls = make_dataclass(class_name, fields, frozen=True, kw_only=True)
    cls.__module__, cls.__doc__ = __name__, doc  # importable by name: configs are pickled to sweep workers
    return cls


WorkloadConfig = _section_type("WorkloadConfig", "workload", "The [workload] section: arrivals and lengths.")
EngineConfig = _section_type("EngineConfig", "engine", "The [engine] section: batching and memory.")
OutputConfig = _section_type("OutputConfig", "output", "The [output] section: where results go.")
ClusterConfig = _section_type("ClusterConfig", "cluster", "The [cluster] section: replicas and router.")
SpeculativeSection = _section_type("SpeculativeSection", "speculative", "The [speculative] section: the speculation "
                                   "method, as vLLM's speculative_config or SGLang's flags (sim/speculation/methods.py).")


@dataclass(frozen=True)
class PolicyConfig:
    name: str
    params: dict[str, Any]


# The [acceptance] keys are AcceptanceSpec's fields (sim.speculation.acceptance owns that value type).
SECTION_TYPES: dict[str, type] = {"workload": WorkloadConfig, "engine": EngineConfig, "acceptance": AcceptanceSpec,
                                  "output": OutputConfig, "cluster": ClusterConfig,
                                  "speculative": SpeculativeSection}


@dataclass(frozen=True)
class RunConfig:
    seed: int
    profile: str
    workload: WorkloadConfig
    engine: EngineConfig
    policy: PolicyConfig
    acceptance: AcceptanceSpec
    output: OutputConfig
    cluster: ClusterConfig = ClusterConfig(replicas=1, router=ROUTERS[0], prefill_replicas=0, decode_replicas=0,
                                           decode_profile=None, kv_link=KV_LINKS[0], kv_link_bandwidth_gb_s=None,
                                           kv_link_latency_us=None, pd_threshold=None, prefill=None, decode=None,
                                           kv_transfers=KV_TRANSFERS[0])
    sources: dict[str, Source] = field(default_factory=dict, compare=False, repr=False)
    speculative: SpeculativeSection = SpeculativeSection(config=None, algorithm=None, num_steps=None, eagle_topk=None,
                                                         num_draft_tokens=None)

    @property
    def speculation(self):
        """The run's speculation method (sim.speculation.methods.Speculation), checked when the config was read."""
        from sim.speculation.methods import resolve

        s = self.speculative
        return resolve(s.config, s.algorithm, s.num_steps, s.eagle_topk, s.num_draft_tokens)

    def error(self, key: str, message: str) -> InputError:
        """An InputError naming ``key`` and where its value came from."""
        return error_at(self.sources, key, message)

    def profile_path(self) -> Path:
        """The profile's directory. A name that is neither a directory nor a shipped profile is the ``profile``
        key's error, naming the flag or the file's line that gave it: a command checks this before it loads
        the simulator, so that a mistyped name answers as soon as a bad setting does."""
        try:
            return resolve_profile_path(self.profile)
        except InputError as exc:
            raise self.error("profile", exc.message) from None

    def policy_class(self) -> type:
        """The class ``policy.name`` stands for (built in, or a user's ``module:Class``, imported); an unknown
        name, or a module that cannot be imported, is the ``policy.name`` key's error. Checked, like
        :meth:`profile_path`, before the simulator is loaded."""
        from policies import PolicyError, policy_class

        try:
            return policy_class(self.policy.name)
        except PolicyError as exc:
            raise self.policy_error(exc) from None

    def policy_error(self, exc) -> InputError:
        """A policy's :class:`~policies.PolicyError` as the error of the policy key it is about."""
        key = "policy.name" if exc.field in (None, "name") else f"policy.{exc.field}"
        return self.error(key, exc.message)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as TOML-ready data (None values are left out), in :data:`KEYS` order."""
        data: dict[str, Any] = {}
        for key in KEYS:
            if key.name == "policy.name":
                data["policy"] = {"name": self.policy.name, **self.policy.params}
            if key.value is None or key.section == "policy":
                continue
            holder = self if key.section is None else getattr(self, key.section)
            value = key.write(getattr(holder, key.field), holder)
            if value is not None:
                (data if key.section is None else data.setdefault(key.section, {}))[key.field] = value
        if self.cluster.replicas == 1 and not self.cluster.prefill_replicas:  # the plain single-replica run: same file, same digest
            del data["cluster"]
        return data

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def digest(self) -> str:
        """Short hash of everything that determines the run's results (not where they are written).

        A trace is hashed by its contents, not its path, so an edited trace is a new run.
        """
        data = self.to_dict()
        data.pop("output", None)
        payload = tomli_w.dumps(data).encode()
        for traced in (self.workload.trace, self.workload.trace_vllm, self.acceptance.trace):
            if traced is not None and Path(traced).is_file():
                payload += hashlib.sha256(Path(traced).read_bytes()).digest()
        return hashlib.sha256(payload).hexdigest()[:10]


def error_at(sources: dict[str, Source], key: str, message: str) -> InputError:
    src = sources.get(key) or sources.get(key.rsplit(".", 1)[0])
    if src is None:
        return InputError(message, field=key)
    if src.where.startswith("--"):
        return InputError(message, field=key, source=src.where)
    return InputError(message, field=key, source=src.where, line=src.line)


# ---------------------------------------------------------------------------------------------
# Loading: defaults < file < overrides


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Resolve a run config.

    ``overrides`` maps dotted keys to plain values (``{"workload.rate": 0.2}``; errors name
    them as "overrides") or to ``(value, source)`` pairs, the source being a flag name or a
    ``file:line`` label that errors name instead. A None value overrides nothing (a flag
    not given).
    """
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    default_text = (resources.files("sim") / "scenarios" / DEFAULT_SCENARIO).read_text()
    _merge(values, sources, parse_toml(default_text, "defaults"), None, "defaults")
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise InputError(missing_file(path, "config file"), source=path, field="config")
        text = read_text(path, field="config")
        table = parse_toml(text, path)
        flat = flatten_sections(table)
        if "workload.duration_s" in flat and "workload.num_requests" in flat:
            raise InputError("give either duration_s or num_requests, not both", field="workload.num_requests",
                             source=path, line=KeyLines(text).find("workload.num_requests"))
        if "workload.num_requests" in flat:
            values.pop("workload.duration_s", None)
        if "workload.duration_s" in flat:
            values.pop("workload.num_requests", None)
        _merge(values, sources, table, text, str(path))
    sourced = {k: _sourced(v) for k, v in (overrides or {}).items()}
    sourced = {k: v for k, v in sourced.items() if v[0] is not None}
    if "workload.duration_s" in sourced and "workload.num_requests" in sourced:
        raise InputError("give either --duration or --num-requests, not both", field="workload.num_requests",
                         source=sourced["workload.num_requests"][1])
    if "policy.name" in sourced:
        _forget_policy(values, sources, sourced["policy.name"][0])
    for key, (value, where) in sourced.items():
        if key == "workload.num_requests":
            values.pop("workload.duration_s", None)
        if key == "workload.duration_s":
            values.pop("workload.num_requests", None)
        values[key] = value
        sources[key] = Source(where)
    return _build(values, sources)


def _sourced(override: Any) -> tuple[Any, str]:
    """A plain value, or a (value, source) pair (no TOML value is a tuple, so a pair is unambiguous)."""
    if isinstance(override, tuple) and len(override) == 2 and isinstance(override[1], str):
        return override
    return override, "overrides"


def flatten_sections(table: dict[str, Any]) -> dict[str, Any]:
    """A TOML config table as dotted keys: the sections' tables are opened one level
    (``{"workload": {"rate": 2}}`` -> ``workload.rate``); values that are tables themselves
    (a length distribution, a rate profile) stay whole."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict) and key in SECTIONS:
            out.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            out[key] = value
    return out


def _forget_policy(values: dict[str, Any], sources: dict[str, Source], new_name: str) -> None:
    """A different policy name drops the parameters (and their sources) set for the earlier policy."""
    if values.get("policy.name") == new_name:
        return
    for key in [k for k in values if k.startswith("policy.")]:
        del values[key]
        sources.pop(key, None)


def _merge(values: dict, sources: dict, table: dict, text: str | None, where: str) -> None:
    flat = flatten_sections(table)
    if "policy.name" in flat:
        _forget_policy(values, sources, flat["policy.name"])
    lines = KeyLines(text) if text is not None else None
    for key, value in flat.items():
        values[key] = value
        sources[key] = Source(where, lines.find(key) if lines is not None else None)


def _build(values: dict[str, Any], sources: dict[str, Source]) -> RunConfig:
    for key in values:
        if key not in KNOWN and not key.startswith("policy."):
            raise error_at(sources, key, "unknown setting")
    read: dict[str, Any] = {}
    for key in KEYS:
        if key.value is not None:
            try:
                read[key.name] = key.value.read(values.get(key.name))
            except ValueError as exc:
                raise error_at(sources, key.name, str(exc)) from None
    _settle_workload(read, sources)
    _settle_speculation(read, sources, values)
    _settle_vllm_options(read, sources)
    _settle_engine(read, sources)
    if read["output.timeline_window"] is not None and read["output.timeline"] is None:
        raise error_at(sources, "output.timeline_window", "applies only to a timeline: give "
                       "--timeline FILE (or timeline in [output]) too")
    sections = {name: cls(**{k.field: read[k.name] for k in KEYS if k.section == name and k.value is not None})
                for name, cls in SECTION_TYPES.items()}
    params = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("policy.") and k != "policy.name"}
    return RunConfig(seed=read["seed"], profile=read["profile"], policy=PolicyConfig(read["policy.name"], params),
                     sources=dict(sources), **sections)


def _settle_speculation(read: dict[str, Any], sources: dict[str, Source], values: dict[str, Any]) -> None:
    """The speculation method (sim/speculation/methods.py): checked here, one line naming its key. Given and with no
    policy named, it names the policy as the engine runs it (vLLM's per-batch-size schedule: vllm-dynamic,
    else a fixed k); vllm-dynamic without its own speculative_config takes the section's. With no
    acceptance setting given, the method's documented default acceptance applies."""
    from sim.speculation.methods import SpeculationError, acceptance_defaults, policy_for, resolve

    try:
        spec = resolve(read["speculative.config"], read["speculative.algorithm"], read["speculative.num_steps"],
                       read["speculative.eagle_topk"], read["speculative.num_draft_tokens"])
    except SpeculationError as exc:
        raise error_at(sources, exc.key, exc.message) from None
    if not spec.given:
        return
    key = "speculative.config" if spec.engine == "vllm" else "speculative.algorithm"
    defaults = _shipped_defaults()
    if read["engine.scheduler"] == "vllm-v1" and read["engine.async_scheduling"] and not spec.schedules_async:
        # as the engine does, or refuses
        if _set_by_user("engine.async_scheduling", read, sources, defaults):
            raise error_at(sources, "engine.async_scheduling", f"the engine schedules asynchronously only with a "
                           f"draft model or an EAGLE/MTP chain, not with {spec.label()}: give "
                           f"--no-async-scheduling")
        read["engine.async_scheduling"] = False
        sources["engine.async_scheduling"] = sources[key]
    policy_given = sources.get("policy.name", Source("defaults")).where != "defaults" and (
        sources["policy.name"].line is None or values.get("policy.name") != defaults.get("policy.name")
        or any(values.get(k) != defaults.get(k) for k in values if k.startswith("policy.")))
    if not policy_given:
        name, params = policy_for(spec, read["speculative.config"])
        _forget_policy(values, sources, name)
        values["policy.name"] = name
        read["policy.name"] = name
        sources["policy.name"] = sources[key]
        for param, value in params.items():
            values[f"policy.{param}"] = value
            sources[f"policy.{param}"] = sources[key]
    elif values.get("policy.name") == "vllm-dynamic" and "policy.speculative_config" not in values \
            and read["speculative.config"] is not None:
        values["policy.speculative_config"] = dict(read["speculative.config"])
        sources["policy.speculative_config"] = sources[key]
    model_given = any(_set_by_user(k.name, read, sources, defaults) for k in KEYS
                      if k.section == "acceptance" and k.field not in ("match_rate", "sibling_rates"))
    for name, value in acceptance_defaults(spec.method).items():
        if name == "match_rate" and read["acceptance.match_rate"] is None and not model_given:
            read["acceptance.match_rate"] = value
        elif name != "match_rate" and not model_given:
            read[f"acceptance.{name}"] = value


# What each acceptance model needs besides its name: (model, key, what the error asks for).
MODEL_NEEDS = (
    ("per-position", "acceptance.per_position", "its rates: --acceptance-per-position 0.8,0.6,0.45 (per_position "
                                                "in [acceptance])"),
    ("trace", "acceptance.trace", "a trace: --acceptance-trace FILE.jsonl (trace in [acceptance])"),
    ("runlength", "acceptance.trace", "a trace: --acceptance-trace FILE.jsonl[.gz] (trace in [acceptance]) and "
                                      "--acceptance-proposer eagle|ngram"),
    ("runlength", "acceptance.proposer", "--acceptance-proposer eagle|ngram (whose run lengths the trace's records "
                                         "give)"),
)


def _settle_vllm_options(read: dict[str, Any], sources: dict[str, Source]) -> None:
    """The rules between the vLLM-compatibility keys and the rest."""
    model = read["acceptance.model"]
    for needs, key, what in MODEL_NEEDS:
        if model == needs and read[key] is None:
            raise error_at(sources, "acceptance.model", f"the {model} model needs {what}")
    for key, needs in (("acceptance.per_position", ("per-position",)), ("acceptance.trace", ("trace", "runlength")),
                       ("acceptance.proposer", ("runlength",))):
        if read[key] is not None and model not in needs:
            raise error_at(sources, key, f"applies only to --acceptance-model {' or '.join(needs)} (the model is "
                                         f"{model})")
    if read["acceptance.trace_lengths"]:
        if model != "runlength":
            raise error_at(sources, "acceptance.trace_lengths", f"applies only to --acceptance-model runlength (the "
                                                                f"model is {model})")
        for key in ("workload.trace", "workload.trace_vllm", "workload.shared_prefix"):
            if read[key] is not None:
                raise error_at(sources, key, "the lengths come from the acceptance trace "
                                             "(--acceptance-trace-lengths): give either, not both")
        for key in ("workload.prompt_tokens", "workload.output_tokens"):  # given beside it (a file's: overridden)
            src = sources.get(key, Source("defaults"))
            if src.where != "defaults" and src.line is None:
                raise error_at(sources, key, "the lengths come from the acceptance trace "
                                             "(--acceptance-trace-lengths): give either, not both")
    if read["workload.trace_vllm"] is not None and read["workload.trace"] is not None:
        raise error_at(sources, "workload.trace_vllm", "give either trace or trace_vllm, not both")


def _settle_engine(read: dict[str, Any], sources: dict[str, Source]) -> None:
    """A key one scheduler reads, given for the other, is refused rather than ignored: given as a
    flag or keyword, or in a file with a value other than the shipped default (a file written out
    from the default scenario names every key)."""
    scheduler = read["engine.scheduler"]
    defaults = _shipped_defaults()
    given = [key for key in (V0_KEYS if scheduler == "vllm-v1" else V1_KEYS)
             if _set_by_user(key, read, sources, defaults)]
    if given:
        other = "v0" if scheduler == "vllm-v1" else "vllm-v1"
        raise error_at(sources, given[0], f"applies only to --scheduler {other} (the scheduler is {scheduler})")
    if parse_router(read["cluster.router"]).name in CACHE_ROUTERS and not (
            scheduler == "vllm-v1" and read["engine.enable_prefix_caching"]):
        why = "the scheduler is v0" if scheduler != "vllm-v1" else "prefix caching is off"
        raise error_at(sources, "cluster.router", f"'{read['cluster.router']}' reads each replica's prefix cache: "
                       f"it needs --scheduler vllm-v1 with --enable-prefix-caching ({why})")
    _settle_disaggregation(read, sources, defaults)
    if scheduler == "vllm-v1" and read["engine.batching"] == "static":
        raise error_at(sources, "engine.batching", "static batching runs under --scheduler v0 (the vllm-v1 "
                       "scheduler batches continuously)")


def _settle_disaggregation(read: dict[str, Any], sources: dict[str, Source], defaults: dict[str, Any]) -> None:
    """Disaggregated serving needs both pools, vllm-v1 (vLLM's KV connectors are V1's) and no --replicas; its
    link keys apply to nothing else (docs/cluster.md)."""
    prefill, decode = read["cluster.prefill_replicas"], read["cluster.decode_replicas"]
    if not prefill and not decode:
        given = [key for key in DISAGGREGATION_KEYS if _set_by_user(key, read, sources, defaults)]
        if given:
            raise error_at(sources, given[0], "applies only to disaggregated serving (--prefill-replicas P "
                                              "--decode-replicas D)")
        return
    for key, count, other in (("cluster.prefill_replicas", prefill, "cluster.decode_replicas"),
                              ("cluster.decode_replicas", decode, "cluster.prefill_replicas")):
        if not count:
            pool = key.split(".")[1].split("_")[0]
            if sources.get(key, Source("defaults")).where == "defaults":  # not given: name the one that was
                raise error_at(sources, other, f"disaggregated serving needs a {pool} pool too: give "
                                               f"--{pool}-replicas (at least 1)")
            raise error_at(sources, key, f"disaggregated serving needs at least one {pool} replica, got 0")
    if read["cluster.replicas"] != 1:
        raise error_at(sources, "cluster.replicas", "give either --replicas (every replica prefills and decodes) or "
                                                    "--prefill-replicas and --decode-replicas, not both")
    if read["engine.scheduler"] != "vllm-v1":
        raise error_at(sources, "cluster.prefill_replicas", "disaggregated serving runs under --scheduler vllm-v1 "
                                                            "(vLLM's KV connectors are V1's); the scheduler is v0")
    if read["workload.max_concurrency"] is not None:
        raise error_at(sources, "workload.max_concurrency", "a client with a concurrency limit in front of a "
                                                            "disaggregated cluster is not simulated yet")
    if read["output.timeline"] is not None:
        raise error_at(sources, "output.timeline", "the timeline of a disaggregated cluster is not written yet")
    for pool in ("cluster.prefill", "cluster.decode"):
        names = dict(read[pool] or ())
        if "kv_cache_tokens" in names and "gpu_memory_utilization" in names:
            raise error_at(sources, pool, "give either kv_cache_tokens or gpu_memory_utilization for a pool, not both")
    latency = read["cluster.kv_link_latency_us"]
    if latency is not None and latency < 0:
        raise error_at(sources, "cluster.kv_link_latency_us", f"must be at least 0, got {latency:g}")


def _set_by_user(key: str, read: dict[str, Any], sources: dict[str, Source], defaults: dict[str, Any]) -> bool:
    """Given as a flag or keyword, or in a file with a value other than the shipped default (a file written
    out from the default scenario names every key)."""
    src = sources.get(key, Source("defaults"))
    if src.where == "defaults":
        return False
    return src.line is None or read[key] != KEY_BY_NAME[key].value.read(defaults.get(key))


def _shipped_defaults() -> dict[str, Any]:
    """The shipped default scenario's values, by dotted key."""
    text = (resources.files("sim") / "scenarios" / DEFAULT_SCENARIO).read_text()
    return flatten_sections(parse_toml(text, "defaults"))


def _settle_workload(read: dict[str, Any], sources: dict[str, Source]) -> None:
    """The rules between workload keys: cv replaces burstiness; burstiness other than 1 means gamma
    arrivals; a rate profile's phases give the duration."""
    def given(key: str) -> bool:
        return sources.get(key, Source("defaults")).where != "defaults"

    if read["workload.cv"] is not None:
        if given("workload.burstiness"):
            raise error_at(sources, "workload.cv", f"give either burstiness or cv, not both (burstiness set at "
                                                   f"{_where(sources['workload.burstiness'])})")
        read["workload.burstiness"] = burstiness_from_cv(read["workload.cv"])
    _settle_arrival(read, sources)
    profile, duration = read["workload.rate_profile"], read["workload.duration_s"]
    if (profile is not None and profile.natural_duration_s is not None and duration is not None
            and not given("workload.duration_s")):
        read["workload.duration_s"] = duration = profile.natural_duration_s  # the phases' total unless given
    if profile is not None and duration is None and profile.shape == "ramp" and profile.duration_s is None:
        raise error_at(sources, "workload.rate_profile", "a ramp with num_requests needs its own duration "
                       "(duration_s in the table, or ramp:START:END:SECONDS)")
    traced = read["workload.trace"] is not None or read["workload.trace_vllm"] is not None
    if not traced and duration is None and read["workload.num_requests"] is None:
        raise error_at(sources, "workload.duration_s", "give duration_s or num_requests (or a trace)")
    if read["workload.rate"] == math.inf and not traced and read["workload.num_requests"] is None:
        raise error_at(sources, "workload.rate", "rate inf sends every request at t = 0: give num_requests "
                       "(--num-requests N), not a duration")
    if not traced:
        _check_reach(read, sources)


def _settle_arrival(read: dict[str, Any], sources: dict[str, Source]) -> None:
    """Burstiness other than 1 means gamma arrivals, as in ``vllm bench serve`` (where burstiness 1 is
    the Poisson process): a burstiness given over Poisson arrivals turns them gamma rather than being
    ignored, unless ``poisson`` was asked for as explicitly (then the two contradict each other)."""
    if read["workload.arrival"] != "poisson" or read["workload.burstiness"] == 1.0:
        return
    shape = "workload.cv" if read["workload.cv"] is not None else "workload.burstiness"
    if _layer(sources.get("workload.arrival")) >= _layer(sources.get(shape)) > 0:
        raise error_at(sources, "workload.arrival", f"poisson arrivals have burstiness 1, but "
                       f"{shape.split('.')[1]} is {read[shape]:g} (set at {_where(sources[shape])}): drop one "
                       f"(burstiness other than 1 means gamma arrivals, as in vllm bench serve)")
    read["workload.arrival"] = "gamma"


def _layer(source: Source | None) -> int:
    """Which layer a value came from: 0 the shipped defaults, 1 a scenario file, 2 a flag or override."""
    if source is None or source.where == "defaults":
        return 0
    return 1 if source.line is not None else 2


def _where(source: Source) -> str:
    """A value's source as messages name it: a flag, or a file and its line."""
    return source.where + (f":{source.line}" if source.line is not None and not source.where.startswith("--") else "")


def _check_reach(read: dict[str, Any], sources: dict[str, Source]) -> None:
    """A generated workload the run can honour: lengths within int64 sums, arrivals within the time the
    clock resolves, requests within the machine's memory (sim.limits; docs/errors.md)."""
    for key in ("workload.prompt_tokens", "workload.output_tokens"):
        spec = read[key]
        top = spec.upper_bound
        if (top is not None and top > MAX_TOKENS) or (spec.kind == "lognormal" and spec.mean > MAX_TOKENS):
            raise error_at(sources, key, f"lengths must stay at most {MAX_TOKENS} tokens")
    def given(key: str) -> bool:
        return sources.get(key, Source("defaults")).where != "defaults"

    profile, num = read["workload.rate_profile"], read["workload.num_requests"]
    duration = None if num is not None else read["workload.duration_s"]
    if profile is not None:
        if profile.natural_duration_s is not None and profile.natural_duration_s > MAX_TIME_S:
            raise error_at(sources, "workload.rate_profile", f"lasts {profile.natural_duration_s:g} s, more than "
                           f"the {MAX_TIME_S:g} s a simulated clock resolves")
        if duration is None:
            return  # its requests' count is given; their span follows the profile
        expected = float(profile.bind(duration).cumulative(duration))
    else:
        rate = read["workload.rate"]
        if num is not None and num / rate > MAX_TIME_S:
            key = "workload.rate" if given("workload.rate") or not given("workload.num_requests") \
                else "workload.num_requests"
            raise error_at(sources, key, f"{num} requests at {rate:g} req/s arrive over about "
                           f"{num / rate:.3g} s, more than the {MAX_TIME_S:g} s a simulated clock resolves")
        expected = num if num is not None else rate * duration
    problem = memory_problem(request_bytes(expected))
    if problem is not None:
        key = "workload.num_requests" if num is not None else (
            "workload.duration_s" if given("workload.duration_s") and not given("workload.rate") else "workload.rate")
        count = f"about {expected:.3g}" if math.isfinite(expected) else "more than 1e308"
        raise error_at(sources, key, f"{count} requests: the run {problem}")
