"""Speculation methods: what drafts the tokens a step verifies, configured as the engines configure it.

A run speculates with one *method* (docs/speculation-methods.md):

==============  ==========  ============================================================================
method          drafter     what a step runs besides the target's verification pass
==============  ==========  ============================================================================
``draft_model`` model       k passes of a separate small model (its own KV cache, its own prefill)
``eagle``       head        k passes of one decoder layer at the target's width + LM head, fed the
``eagle3``      head          target's hidden states (EAGLE-3: fused from three layers, reduced vocab);
``mtp``         head          MTP: the model's own next-token-prediction layer; the prompt passes the
                              layer once (its KV), no small model is prefilled
``medusa``      heads       one pass of k parallel heads (residual block + LM head each) on the last
                              hidden state: no KV, nothing to catch up
``ngram``       host        no GPU pass: a CPU matcher proposes the tokens that followed the context's
``suffix``                    latest n-gram (suffix: the longest suffix, up to 24 tokens) where it
                              matches, so a row may propose nothing in a step
==============  ==========  ============================================================================

Configured by vLLM's ``speculative_config`` (``--speculative-config`` JSON, a TOML table, an API
dict) or by SGLang's flags (``--speculative-algorithm``, ``--speculative-num-steps``,
``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``), with the engines' own
defaults and checks. SGLang's EAGLE with ``eagle_topk > 1`` drafts a *tree*: the target verifies
``num_draft_tokens`` tokens per sequence in one pass under a tree mask and keeps the longest
accepted path (:mod:`sim.speculation.trees`). Nothing given: today's separate draft model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

METHODS = ("draft_model", "ngram", "suffix", "eagle", "eagle3", "medusa", "mtp")
DRAFTERS = {"draft_model": "model", "eagle": "head", "eagle3": "head", "mtp": "head", "medusa": "heads",
            "ngram": "host", "suffix": "host"}
# vLLM's per-model MTP method names, all run as ``mtp`` (vllm/config/speculative.py: deprecated aliases).
VLLM_MTP_ALIASES = ("deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp", "qwen3_next_mtp",
                    "longcat_flash_mtp", "pangu_ultra_moe_mtp")
# vLLM's ``speculative_config`` keys this simulator reads, and those it accepts and ignores (they say
# which checkpoint, parallelism or kernel runs: the profile already fixes that).
VLLM_USED = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
             "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth")
VLLM_IGNORED = ("model", "draft_tensor_parallel_size", "tensor_parallel_size", "quantization", "moe_backend",
                "attention_backend", "kv_cache_dtype", "max_model_len", "revision", "code_revision",
                "enforce_eager", "disable_padded_drafter_batch", "use_local_argmax_reduction",
                "parallel_drafting", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
                "suffix_decoding_min_token_prob", "rejection_sample_method", "draft_sample_method",
                "disable_by_batch_size", "disable_logprobs", "disable_log_stats", "acceptance_method",
                "index_share_for_mtp_iteration", "disable_eagle_block_drop")
NGRAM_DEFAULT_LOOKUP = 5  # vLLM's prompt_lookup_min = prompt_lookup_max when neither is given
SUFFIX_MAX_TREE_DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth default (and suffix's default k)
MTP_DEFAULT_K = 1  # vLLM takes an MTP model's n_predict; DeepSeek-V3 ships one MTP module
# SGLang (python/sglang/srt/server_args.py): --speculative-algorithm names -> methods; NEXTN is
# SGLang's name for a model's own MTP layers (run by its EAGLE worker), STANDALONE a draft model.
# The methods with which the engine schedules the next step while this one runs (vLLM's async
# scheduling, on by default; vllm/config/vllm.py turns it off for any other method, and refuses it
# when asked for: "async scheduling is only supported with EAGLE/MTP/Draft Model ... speculative
# decoding", vLLM 0.17; SGLang's overlap scheduler supports chains, --speculative-eagle-topk 1, only).
ASYNC_METHODS = ("draft_model", "eagle", "eagle3", "mtp")
SGLANG_ALGORITHMS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp", "STANDALONE": "draft_model",
                     "NGRAM": "ngram"}
SGLANG_DEFAULT_STEPS, SGLANG_DEFAULT_TOPK, SGLANG_DEFAULT_DRAFT_TOKENS = 5, 4, 8  # SGLang's documented defaults
SGLANG_KEYS = ("speculative.algorithm", "speculative.num_steps", "speculative.eagle_topk",
               "speculative.num_draft_tokens")


class SpeculationError(ValueError):
    """A bad speculation setting; ``key`` names the config key it came from."""

    def __init__(self, message: str, key: str = "speculative.config") -> None:
        self.message, self.key = message, key
        super().__init__(message)


@dataclass(frozen=True)
class Speculation:
    """The run's speculation method and its shape (the module docstring).

    ``num_speculative_tokens``: k, the longest draft (SGLang: ``num_steps``, a tree's depth);
    ``topk`` > 1 and ``num_draft_tokens``: a tree of that many verified tokens per step, root
    included; ``schedule``: vLLM's ``num_speculative_tokens_per_batch_size``; ``engine``: whose
    configuration named it (``vllm``, ``sglang``; ``default``: nothing was given).
    """

    method: str = "draft_model"
    num_speculative_tokens: int | None = None
    topk: int = 1
    num_draft_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    schedule: tuple[tuple[int, int, int], ...] | None = None
    engine: str = "default"

    @property
    def drafter(self) -> str:
        """model, head, heads or host (the module docstring's table)."""
        return DRAFTERS[self.method]

    @property
    def profile_model(self) -> str:
        """The profile's ``model`` column holding this drafter's passes (a draft model's: ``draft``)."""
        return "draft" if self.method == "draft_model" else self.method

    @property
    def is_tree(self) -> bool:
        return self.topk > 1

    @property
    def given(self) -> bool:
        return self.engine != "default"

    @property
    def schedules_async(self) -> bool:
        """Whether the engine may plan the next step while this one runs with this method (ASYNC_METHODS)."""
        return self.method in ASYNC_METHODS and not self.is_tree

    def lookahead(self, max_k: int) -> int:
        """vLLM V1's ``num_lookahead_tokens``: slots kept ahead per running request for a draft model
        or an EAGLE-type head (its KV is written before verification), none for the others."""
        return max_k if self.drafter in ("model", "head") else 0

    def label(self) -> str:
        """One line naming the method as the summary and the timeline show it."""
        if self.engine == "sglang":
            algorithm = next(name for name, method in SGLANG_ALGORITHMS.items() if method == self.method)
            shape = (f"{self.num_speculative_tokens} steps, top-{self.topk}, {self.num_draft_tokens} draft tokens"
                     if self.is_tree else f"{self.num_speculative_tokens} steps")
            return f"{self.method} (SGLang {algorithm}: {shape})"
        if self.engine == "vllm":
            extra = ""
            if self.method == "ngram":
                extra = f", prompt_lookup {self.prompt_lookup_min}..{self.prompt_lookup_max}"
            k = "by batch size" if self.schedule else str(self.num_speculative_tokens)
            return f"{self.method} (vLLM, num_speculative_tokens {k}{extra})"
        return "draft_model (a separate draft model)"

    def to_dict(self) -> dict[str, Any]:
        """What summary.json records under ``speculation``."""
        out: dict[str, Any] = {"method": self.method, "drafter": self.drafter, "engine": self.engine,
                               "num_speculative_tokens": self.num_speculative_tokens}
        if self.is_tree:
            out.update(eagle_topk=self.topk, num_draft_tokens=self.num_draft_tokens)
        if self.method == "ngram":
            out.update(prompt_lookup_min=self.prompt_lookup_min, prompt_lookup_max=self.prompt_lookup_max)
        return out


DEFAULT = Speculation()


# ------------------------------------------------------------------------------------- vLLM
def _whole(value: Any, what: str, lo: int = 1) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise SpeculationError(f"{what} must be a whole number >= {lo}, got {value!r}")
    return value


def read_vllm_config(raw: Any) -> dict[str, Any]:
    """vLLM's ``speculative_config`` as given: a table (TOML, an API dict), JSON text, or a JSON file's
    path; a ValueError with one line otherwise."""
    from policies.knobs import load_knob

    return load_knob(raw, "speculative_config")


def from_vllm(config: dict[str, Any]) -> Speculation:
    """vLLM's ``speculative_config`` with vLLM's defaults and checks (vllm/config/speculative.py)."""
    unknown = [key for key in config if key not in VLLM_USED + VLLM_IGNORED]
    if unknown:
        if unknown[0] == "speculative_token_tree":
            raise SpeculationError("speculative_token_tree (vLLM's experimental tree) is not modelled; give a tree "
                                   "with SGLang's --speculative-eagle-topk and --speculative-num-draft-tokens")
        raise SpeculationError(f"unknown key '{unknown[0]}' (vLLM's speculative_config keys read here: "
                               f"{', '.join(VLLM_USED)})")
    method = config.get("method")
    if method is None:  # vLLM: "ngram" as the model name means the n-gram method, else a draft model
        method = "ngram" if config.get("model") in ("ngram", "[ngram]") else "draft_model"
    if method == "[ngram]":
        method = "ngram"
    if method in VLLM_MTP_ALIASES:
        method = "mtp"
    if method not in METHODS:
        raise SpeculationError(f"method '{method}' is not one of {', '.join(METHODS)} (or vLLM's per-model MTP "
                               f"names, run as mtp)")
    k = config.get("num_speculative_tokens")
    if k is None:
        if method == "suffix":
            k = int(_whole(config.get("suffix_decoding_max_tree_depth", SUFFIX_MAX_TREE_DEPTH),
                           "suffix_decoding_max_tree_depth"))
        elif method == "mtp":
            k = MTP_DEFAULT_K
        elif config.get("num_speculative_tokens_per_batch_size") is None:
            raise SpeculationError(f"method {method} needs num_speculative_tokens (vLLM's largest k)")
    schedule = None
    if config.get("num_speculative_tokens_per_batch_size") is not None:
        from policies.vllm_dynamic import check_schedule

        try:
            schedule = tuple(tuple(row) for row in check_schedule(config["num_speculative_tokens_per_batch_size"]))
        except ValueError as exc:
            raise SpeculationError(str(exc).removeprefix("speculative_config.").removeprefix("speculative_config: ")) \
                from None
        if k is None:
            raise SpeculationError("num_speculative_tokens_per_batch_size needs num_speculative_tokens too "
                                   "(vLLM sizes its buffers by it)")
    k = _whole(k, "num_speculative_tokens")
    lookup_min, lookup_max = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
    if method == "ngram":
        if lookup_min is None and lookup_max is None:
            lookup_min = lookup_max = NGRAM_DEFAULT_LOOKUP
        lookup_min = _whole(lookup_max if lookup_min is None else lookup_min, "prompt_lookup_min")
        lookup_max = _whole(lookup_min if lookup_max is None else lookup_max, "prompt_lookup_max")
        if lookup_min > lookup_max:
            raise SpeculationError(f"prompt_lookup_min={lookup_min} must be <= prompt_lookup_max={lookup_max}")
    elif lookup_min is not None or lookup_max is not None:
        raise SpeculationError(f"prompt_lookup_min/max apply to method ngram (the method is {method})")
    return Speculation(method, k, prompt_lookup_min=lookup_min, prompt_lookup_max=lookup_max, schedule=schedule,
                       engine="vllm")


# ------------------------------------------------------------------------------------- SGLang
def from_sglang(algorithm: str, num_steps: int | None, topk: int | None, draft_tokens: int | None) -> Speculation:
    """SGLang's flags with SGLang's defaults and rules: topk 1 verifies ``num_steps + 1`` tokens (SGLang
    sets num_draft_tokens so); a tree holds at most the candidates its steps can draft."""
    name = algorithm.upper()
    if name not in SGLANG_ALGORITHMS:
        raise SpeculationError(f"'{algorithm}' is not one of {', '.join(SGLANG_ALGORITHMS)}", "speculative.algorithm")
    method = SGLANG_ALGORITHMS[name]
    eagle_like = DRAFTERS[method] == "head"
    if not eagle_like and topk not in (None, 1):
        raise SpeculationError(f"--speculative-eagle-topk applies to EAGLE, EAGLE3 and NEXTN (the algorithm is "
                               f"{name}); trees are modelled for EAGLE-type heads", "speculative.eagle_topk")
    if method == "ngram" and num_steps is None:
        if draft_tokens is None:
            raise SpeculationError("NGRAM needs --speculative-num-draft-tokens (tokens verified per step, the "
                                   "root included)", "speculative.num_draft_tokens")
        num_steps = draft_tokens - 1
    steps = SGLANG_DEFAULT_STEPS if num_steps is None else num_steps
    try:
        steps = _whole(steps, "num_steps")
    except SpeculationError as exc:
        raise SpeculationError(exc.message, "speculative.num_steps") from None
    width = (SGLANG_DEFAULT_TOPK if eagle_like else 1) if topk is None else topk
    try:
        width = _whole(width, "eagle_topk")
    except SpeculationError as exc:
        raise SpeculationError(exc.message, "speculative.eagle_topk") from None
    if width == 1:
        tokens = steps + 1  # SGLang: with topk 1 the draft tokens are the steps plus the root
    else:
        tokens = SGLANG_DEFAULT_DRAFT_TOKENS if draft_tokens is None else draft_tokens
        try:
            tokens = _whole(tokens, "num_draft_tokens", lo=2)
        except SpeculationError as exc:
            raise SpeculationError(exc.message, "speculative.num_draft_tokens") from None
        most = tree_capacity(steps, width)
        if tokens - 1 > most:
            raise SpeculationError(f"a tree of {steps} steps and top-{width} drafts at most {most} candidate "
                                   f"tokens, fewer than num_draft_tokens - 1 = {tokens - 1}",
                                   "speculative.num_draft_tokens")
    return Speculation(method, steps, topk=width, num_draft_tokens=tokens, engine="sglang")


def tree_capacity(steps: int, topk: int) -> int:
    """Candidates SGLang's EAGLE drafts in ``steps`` steps of top-``topk``: topk at the first depth,
    then topk children of each of the topk kept nodes per further depth."""
    return topk + (steps - 1) * topk * topk


# ------------------------------------------------------------------------------------- the run's
def resolve(vllm: Any, algorithm: str | None, num_steps: int | None, topk: int | None,
            draft_tokens: int | None) -> Speculation:
    """The run's speculation from the [speculative] settings; SpeculationError naming the key."""
    sglang_given = [key for key, value in zip(SGLANG_KEYS, (algorithm, num_steps, topk, draft_tokens))
                    if value is not None]
    if vllm is not None and sglang_given:
        raise SpeculationError("give either vLLM's speculative_config or SGLang's --speculative-* flags, not both",
                               sglang_given[0])
    if vllm is not None:
        return from_vllm(vllm)
    if sglang_given:
        if algorithm is None:
            raise SpeculationError("SGLang's flags need --speculative-algorithm (EAGLE, EAGLE3, NEXTN, STANDALONE "
                                   "or NGRAM)", sglang_given[0])
        return from_sglang(algorithm, num_steps, topk, draft_tokens)
    return DEFAULT


def policy_for(spec: Speculation, config: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The policy a speculation config implies when no policy is given: vLLM's per-batch-size schedule
    is the ``vllm-dynamic`` policy (as vLLM runs it), anything else a fixed k."""
    if spec.schedule is not None:
        return "vllm-dynamic", {"speculative_config": dict(config or {})}
    return "fixed", {"k": int(spec.num_speculative_tokens)}


# ------------------------------------------------------------------------ default acceptance
# Each method's acceptance when none is given (docs/speculation-methods.md, with the derivation).
# EAGLE and n-gram: SpecDecode-Bench's measured run lengths of Llama-3.1-8B-Instruct under vLLM on
# ShareGPT (chat; arXiv 2601.11580, github.com/SpecDecode-Bench/simulator at 2fdccbd), summed up as
# per-position rates over every output position (sim.speculation.acceptance.runlength_rates; four decimals),
# the n-gram's given that it proposed, with its simulator's chance 0.2 that a position whose run
# is 1 still matched. MTP: DeepSeek-V3's report (arXiv 2412.19437, sec. 5.4.3) measures 85-90%
# acceptance of its MTP module's token: 0.875 per position. Medusa and draft models: no published
# figure for these pairs ships; the geometric default (alpha 0.7) stands. Suffix: n-gram's.
SHAREGPT_EAGLE = (0.6937, 0.4602, 0.3177, 0.2304, 0.175, 0.1376, 0.1095, 0.0782, 0.0506, 0.0339)
SHAREGPT_NGRAM = (0.7273, 0.613, 0.5342, 0.4781, 0.4334, 0.3976, 0.3674, 0.343, 0.3228, 0.3052)
SHAREGPT_NGRAM_PROPOSES = 0.4783  # the share of ShareGPT's output positions where n-gram proposes
RUNLENGTH_MATCH_RATE = 0.2  # SpecDecode-Bench's simulator: a run of 1 still matched (chat, math; 0.4 news, 0.8 code)
MTP_RATE = 0.875
ACCEPTANCE_DEFAULTS: dict[str, dict[str, Any]] = {
    "draft_model": {}, "medusa": {},
    "eagle": {"model": "per-position", "per_position": SHAREGPT_EAGLE},
    "eagle3": {"model": "per-position", "per_position": SHAREGPT_EAGLE},
    "mtp": {"model": "per-position", "per_position": (MTP_RATE,)},
    "ngram": {"model": "per-position", "per_position": SHAREGPT_NGRAM, "match_rate": SHAREGPT_NGRAM_PROPOSES},
    "suffix": {"model": "per-position", "per_position": SHAREGPT_NGRAM, "match_rate": SHAREGPT_NGRAM_PROPOSES},
}


def acceptance_defaults(method: str) -> dict[str, Any]:
    """The [acceptance] settings a method runs with when none is given."""
    return dict(ACCEPTANCE_DEFAULTS[method])


def default_match_rate(method: str, model: str) -> float:
    """A host proposer's match rate when none is given: under the run-length model the chance that a
    position whose run is 1 matched; otherwise the chance a position proposes. Others always propose."""
    if DRAFTERS[method] != "host":
        return 1.0
    return RUNLENGTH_MATCH_RATE if model == "runlength" else SHAREGPT_NGRAM_PROPOSES


# ------------------------------------------------------------------------ a run's plan
LAG_NONE, LAG_DRAFT, LAG_HEAD = 0, 1, 2  # how a row's drafter lag moves (sim/serving/rules.py apply_decode)


@dataclass(frozen=True)
class SpeculationPlan:
    """What a run's method sets up: the drafting the step table prices (``drafter``), a tree's shape,
    how drafter lag moves (``lag_mode``), and whether rows propose only where their context matches."""

    spec: Speculation
    drafter: Any  # sim.costmodel.model.Drafter
    tree: Any = None  # sim.speculation.trees.Tree
    lag_mode: int = LAG_DRAFT
    host: bool = False

    def lookahead(self, max_k: int) -> int:
        return self.spec.lookahead(max_k)


def plan_run(config, cost_model, policy_max_k: int) -> SpeculationPlan:
    """The run's plan; bad input (a method the profile cannot price, a policy beyond the method's k, a
    tree the acceptance cannot describe or the profile cannot verify) is one InputError naming its key."""
    from sim.costmodel.model import Drafter

    spec = config.speculation
    key = "speculative.config" if spec.engine == "vllm" else "speculative.algorithm"
    acceptance = config.acceptance
    lag = {"model": LAG_DRAFT, "head": LAG_HEAD}.get(spec.drafter, LAG_NONE)
    # A head or a host proposer must be priced even under a policy that never drafts (its step table is built
    # for the method); a missing draft model is refused only where a policy would draft with it.
    if (policy_max_k > 0 or spec.drafter != "model") and spec.profile_model not in cost_model.priced_drafters():
        raise config.error(key if spec.given else "profile",
                           f"profile '{cost_model.profile.name}' has no {spec.method} passes ({_phase_of(spec)}/"
                           f"{spec.profile_model} points) to price it; it prices {', '.join(_methods_of(cost_model))} "
                           f"(compose or calibrate it with --drafters {spec.method})")
    if spec.is_tree and config.policy.name == "sglang-adaptive":
        raise config.error("speculative.eagle_topk", "SGLang's adaptive speculation needs --speculative-eagle-topk 1 "
                                                     "(a chain), as SGLang's does")
    if spec.given and policy_max_k > spec.num_speculative_tokens:
        raise config.error("policy.name", f"policy '{config.policy.name}' may choose k = {policy_max_k}, beyond the "
                                          f"method's num_speculative_tokens = {spec.num_speculative_tokens}")
    if acceptance.model == "runlength" and policy_max_k > 0:
        wanted = "ngram" if spec.drafter == "host" else "eagle"
        if acceptance.proposer != wanted:
            raise config.error("acceptance.proposer", f"the {acceptance.proposer} runs are a "
                                                      f"{'host' if acceptance.proposer == 'ngram' else 'GPU'} "
                                                      f"drafter's; method {spec.method} takes --acceptance-proposer "
                                                      f"{wanted}")
    tree = None
    width = 1
    if spec.is_tree:
        tree = _tree_for(config, spec)
        width = spec.topk
        widest = tree.target_tokens(spec.num_speculative_tokens)
        measured = int(cost_model.decode_target.bounds("query_tokens")[1])
        if widest > measured:
            raise config.error("speculative.num_draft_tokens", f"the tree's {widest} verified tokens per sequence "
                                                               f"exceed the profile's measured query width {measured}")
    elif config.acceptance.sibling_rates is not None:
        raise config.error("acceptance.sibling_rates", "applies only to a tree (--speculative-eagle-topk > 1)")
    tokens = tuple(tree.target_tokens(k) for k in range(spec.num_speculative_tokens + 1)) if tree else ()
    drafter = Drafter(spec.drafter, spec.profile_model, width, tokens)
    return SpeculationPlan(spec, drafter, tree, lag, spec.drafter == "host")


def _phase_of(spec: Speculation) -> str:
    return "propose" if spec.drafter == "host" else "decode"


def _methods_of(cost_model) -> list[str]:
    return ["draft_model" if name == "draft" else name for name in cost_model.priced_drafters()]


def _tree_for(config, spec: Speculation):
    """The tree of sim.speculation.trees from the acceptance model's chain rates and the sibling rates."""
    import numpy as np

    from sim.speculation.trees import build_tree, chain_rates

    acc = config.acceptance
    if acc.model == "geometric" and acc.distribution == "fixed":
        chain = np.full(spec.num_speculative_tokens, acc.alpha)
    elif acc.model == "per-position":
        from sim.speculation.acceptance import position_rates

        chain = chain_rates(position_rates(acc.per_position, spec.num_speculative_tokens), spec.num_speculative_tokens)
    else:
        raise config.error("acceptance.model", "a tree's acceptance is built from a chain's rates: the geometric "
                                               "model with one alpha, or per-position rates (a trace measures "
                                               "a chain)")
    if acc.sibling_rates is None:
        raise config.error("acceptance.sibling_rates", f"a tree of top-{spec.topk} needs the chance its further "
                                                       "candidates are the target's token: --acceptance-sibling-rates "
                                                       "0.3,0.2 (no measured default ships)")
    return build_tree(chain, acc.sibling_rates, spec.num_speculative_tokens, spec.topk, spec.num_draft_tokens - 1)


def kv_capacity_for(profile, spec: Speculation) -> int | None:
    """The profile's KV capacity (measured or composed for its target and draft model) moved to the
    method's drafter: the draft model's weights and per-token KV replaced by the drafter's (a head's one
    layer, nothing for Medusa's heads' KV or a host matcher), from the sidecar's ``models`` entries."""
    capacity = profile.kv_capacity_tokens
    models = profile.meta.get("models") or {}
    if capacity is None or spec.method == "draft_model" or "target" not in models or "draft" not in models:
        return capacity
    target, draft = models["target"], models["draft"]
    own = models.get(spec.method, {"weight_bytes": 0, "kv_bytes_per_token": 0})
    kv_t, kv_d, kv_x = (int(m.get("kv_bytes_per_token") or 0) for m in (target, draft, own))
    if not kv_t:
        return capacity
    free = capacity * (kv_t + kv_d) + int(draft.get("weight_bytes") or 0) - int(own.get("weight_bytes") or 0)
    return max(0, free // (kv_t + kv_x))
