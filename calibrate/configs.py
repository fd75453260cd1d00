"""Published model shapes, so calibration can build a model without downloading a checkpoint.

Timing depends on tensor shapes, not on weight values, so a config is all we need.
The built-in shapes live in ``calibrate/models/<name>.json``; any other model is read from its
Hugging Face ``config.json`` (:mod:`calibrate.hf_config`). :func:`get_config` is the one resolver
every command's ``--target`` / ``--draft`` goes through. This module imports no torch, so
``specbatch calibrate --list-models`` and input checking work without it.

One registry serves both profile sources: ``calibrate`` builds the dense shapes in torch;
``specbatch compose`` prices any of them from kernel tables, including the ones no single
GPU holds or ``calibrate`` cannot build (70B targets, mixtures of experts, Qwen3's explicit
head size and per-head q/k norms): :func:`check_buildable` says so in one line.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

from sim.errors import InputError

ARCHS = ("opt", "llama")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
OPT_POSITION_OFFSET = 2  # OPT's learned position table has two extra leading rows


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer (OPT or Llama family)."""

    name: str
    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    rope_theta: float | None = None
    tie_word_embeddings: bool = True
    norm_eps: float = 1e-5
    head_dim: int = 0  # 0: hidden_size / num_heads (written out where a model sets its own, as Qwen3 does)
    num_experts: int = 0  # a mixture of experts in every layer (HF num_local_experts / num_experts); 0: dense
    experts_per_token: int = 0  # experts each token is routed to (HF num_experts_per_tok)
    qk_norm: bool = False  # an RMSNorm on each query and key head before rotary (Qwen3)
    source: str = ""
    notes: str = ""
    # Read from Hugging Face configs (calibrate.hf_config); recorded in a sidecar only where set (NEWER_FIELDS)
    attention_bias: bool = False  # biases on the q, k and v projections (Qwen2 / Qwen2.5)
    shared_expert_intermediate_size: int = 0  # an always-on expert beside the routed ones (Llama 4, Qwen2-MoE)
    dense_layers: int = 0  # layers of a mixture of experts whose MLP is dense (Llama-4 Maverick: every other one)
    dense_intermediate_size: int = 0  # those layers' MLP
    sliding_window: int = 0  # tokens a windowed layer attends to (Mistral's window, Llama 4's attention chunk)
    window_layers: int = 0  # how many layers are windowed; the others attend to the whole context
    dtype: str = ""  # the checkpoint's dtype (torch_dtype, or the quantization method), as published
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): queries and keys/values through low-rank
    # latents, one compressed KV vector per token (kv_lora_rank + qk_rope_head_dim); 0: not MLA
    q_lora_rank: int = 0  # 0 with MLA: queries projected directly (DeepSeek-V2-Lite)
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise InputError(f"arch '{self.arch}' is not one of {', '.join(ARCHS)}", field="arch", source=self.name)
        if self.num_heads % self.num_kv_heads or (not self.head_dim and self.hidden_size % self.num_heads):
            raise InputError("hidden_size must divide by num_heads (or head_dim be given) and num_heads by "
                             "num_kv_heads", field="num_heads", source=self.name)
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.arch == "opt" and (self.num_kv_heads != self.num_heads or self.num_experts or self.qk_norm):
            raise InputError("OPT has no grouped-query attention, experts or q/k norms", field="num_kv_heads",
                             source=self.name)
        if bool(self.num_experts) != bool(self.experts_per_token) or self.experts_per_token > self.num_experts:
            raise InputError("a mixture of experts needs num_experts and experts_per_token, at most num_experts",
                             field="experts_per_token", source=self.name)
        if (self.shared_expert_intermediate_size or self.dense_layers) and not self.is_moe:
            raise InputError("shared experts and dense layers belong to a mixture of experts (num_experts)",
                             field="num_experts", source=self.name)
        if bool(self.dense_layers) != bool(self.dense_intermediate_size) or self.dense_layers >= self.num_layers:
            raise InputError("dense layers need dense_intermediate_size, and fewer of them than layers",
                             field="dense_layers", source=self.name)
        if self.is_mla and not (self.qk_nope_head_dim and self.qk_rope_head_dim and self.v_head_dim):
            raise InputError("multi-head latent attention (kv_lora_rank) needs qk_nope_head_dim, qk_rope_head_dim "
                             "and v_head_dim", field="kv_lora_rank", source=self.name)
        if bool(self.sliding_window) != bool(self.window_layers) or self.window_layers > self.num_layers:
            raise InputError("a sliding window needs window_layers, at most num_layers", field="window_layers",
                             source=self.name)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.dense_layers if self.is_moe else 0

    def to_dict(self) -> dict[str, Any]:
        """The fields, those added for Hugging Face configs only where set: a built-in model's sidecar
        record stays what shipped profiles hold."""
        return {k: v for k, v in asdict(self).items() if k not in NEWER_FIELDS or v != NEWER_FIELDS[k]}


NEWER_FIELDS = {f.name: f.default for f in fields(ModelConfig) if f.name in (
    "attention_bias", "shared_expert_intermediate_size", "dense_layers", "dense_intermediate_size",
    "sliding_window", "window_layers", "dtype", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim")}


@lru_cache(maxsize=1)
def _all_configs() -> dict[str, ModelConfig]:
    known = {f.name for f in fields(ModelConfig)}
    configs = {}
    for entry in sorted(resources.files("calibrate").joinpath("models").iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".json"):
            continue
        raw = json.loads(entry.read_text())
        extra = set(raw) - known
        if extra:
            raise InputError(f"unknown key(s) {sorted(extra)}", source=f"calibrate/models/{entry.name}")
        configs[raw["name"]] = ModelConfig(**raw)
    return configs


def known_models() -> list[str]:
    """The built-in names accepted by :func:`get_config` (besides Hugging Face configs)."""
    return list(_all_configs())


def get_config(name: str, field: str = "model") -> ModelConfig:
    """The one model resolver: a built-in name, a path to a Hugging Face ``config.json`` or a folder
    holding one, or a Hugging Face id whose config is in the local cache or ships with
    aiconfigurator-core (:mod:`calibrate.hf_config`), or else one a built-in was copied from (its
    ``source``) or a published fine-tune of the same shape (:mod:`calibrate.variants`). Anything else is an :class:`InputError`
    naming ``field``; a config that cannot be priced names its key, file and line."""
    from calibrate import hf_config, variants

    configs = _all_configs()
    if name in configs:
        return configs[name]
    found = hf_config.locate(name)
    if found is None:  # a Hugging Face id a built-in config was copied from: that config, offline
        same = [c for c in configs.values() if c.source and c.source.lower() == name.lower()]
        if same:
            return same[0]
        base = variants.base_of(name)  # a published fine-tune of the same shape (calibrate/variants.py)
        if base is not None:
            return configs[base]
        raise InputError(f"unknown model '{name}': not a built-in name ({', '.join(configs)}), a config.json "
                         "or a folder holding one, nor a Hugging Face id in the local cache "
                         f"({hf_config.hub_cache()}) or among aiconfigurator-core's configs", field=field)
    fields_read = hf_config.read_config(found)
    try:
        return ModelConfig(**fields_read)
    except InputError as exc:
        raise hf_config.placed(exc, found) from None


def recorded_config(record: dict[str, Any], field: str = "model") -> ModelConfig:
    """The config a profile's sidecar recorded for one model (``models.<role>``): what was measured, so
    a model read from a config.json is rebuilt without the file; a record without one names the model."""
    config = record.get("config")
    if isinstance(config, dict) and config.get("name") == record.get("name") and set(config) <= {
            f.name for f in fields(ModelConfig)}:
        return ModelConfig(**config)
    return get_config(str(record.get("name")), field)


def check_buildable(cfg: ModelConfig, field: str = "model") -> None:
    """``calibrate`` builds dense OPT and Llama models in torch; anything else is composed, said in one line."""
    why = ("multi-head latent attention" if cfg.is_mla else "a mixture of experts" if cfg.is_moe else
           "per-head q/k norms" if cfg.qk_norm else
           "a head size other than hidden / heads" if cfg.head_dim * cfg.num_heads != cfg.hidden_size else
           "q/k/v biases" if cfg.attention_bias else "a sliding attention window" if cfg.sliding_window else None)
    if why:
        raise InputError(f"{cfg.name} has {why}, which calibrate does not build; compose its profile from "
                         "kernel tables instead (specbatch compose, docs/gpu-profiles.md)", field=field)


def param_count(cfg: ModelConfig) -> int:
    """Parameters as built by :mod:`calibrate.model` (matches the published checkpoints); a mixture of
    experts counts every expert and the router (its active parameters: :func:`active_param_count`)."""
    h, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    kv = cfg.num_kv_heads * cfg.head_dim
    q = cfg.num_heads * cfg.head_dim
    attn = h * (q + 2 * kv) + q * h + (2 * cfg.head_dim if cfg.qk_norm else 0) + (q + 2 * kv if cfg.attention_bias else 0)
    if cfg.is_mla:
        attn = mla_params(cfg)
    embed = cfg.vocab_size * h
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * h
    if cfg.arch == "opt":
        attn += (h + 2 * kv) + h  # biases
        mlp = 2 * h * f + f + h
        norms = 2 * 2 * h
        positions = (cfg.max_position_embeddings + OPT_POSITION_OFFSET) * h
        return embed + positions + head + layers * (attn + mlp + norms) + 2 * h
    mlp = 3 * h * f
    if cfg.is_moe:  # routed experts, their router and any shared expert; the dense layers' MLPs apart
        mlp = cfg.num_experts * 3 * h * f + h * cfg.num_experts + 3 * h * cfg.shared_expert_intermediate_size
    norms = 2 * h
    dense = cfg.dense_layers * (3 * h * cfg.dense_intermediate_size - mlp)
    return embed + head + layers * (attn + mlp + norms) + dense + h


def mla_params(cfg: ModelConfig) -> int:
    """One layer's multi-head latent attention, as DeepSeek's checkpoints hold it: the query's down
    projection and its norm (or one direct projection without q_lora_rank), the KV down projection
    (latent plus the shared rotary key) and its norm, the up projections to every head's query, key
    and value, and the output projection."""
    h, heads = cfg.hidden_size, cfg.num_heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    if cfg.q_lora_rank:
        query = h * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * heads * qk
    else:
        query = h * heads * qk
    latent = h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank
    up = cfg.kv_lora_rank * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    return query + latent + up + heads * cfg.v_head_dim * h


def active_param_count(cfg: ModelConfig) -> int:
    """Parameters one token runs through: a mixture of experts counts its routed experts only."""
    unused = cfg.moe_layers * (cfg.num_experts - cfg.experts_per_token) * 3 * cfg.hidden_size * cfg.intermediate_size
    return param_count(cfg) - unused


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise InputError(f"'{dtype}' is not one of {', '.join(DTYPE_BYTES)}", field="dtype")
    return DTYPE_BYTES[dtype]


def weight_bytes(cfg: ModelConfig, dtype: str) -> int:
    return param_count(cfg) * dtype_bytes(dtype)


def kv_bytes_per_token(cfg: ModelConfig, dtype: str) -> int:
    """Key + value bytes one token occupies across all layers (with latent attention: its one
    compressed vector, the latent and the rotary key)."""
    if cfg.is_mla:
        return cfg.num_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * dtype_bytes(dtype)
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes(dtype)


def describe(cfg: ModelConfig) -> str:
    """One line for ``--list-models``."""
    heads = f"{cfg.num_heads}" if cfg.num_kv_heads == cfg.num_heads else f"{cfg.num_heads}/{cfg.num_kv_heads}kv"
    experts = f"  experts {cfg.num_experts} top {cfg.experts_per_token}" if cfg.is_moe else ""
    return (f"{cfg.name:<16} {cfg.arch:<6} {param_count(cfg) / 1e6:>9.1f}M  layers {cfg.num_layers:>2}  "
            f"hidden {cfg.hidden_size:>5}  heads {heads:<7} ffn {cfg.intermediate_size:>5}  "
            f"vocab {cfg.vocab_size:>6}  max_len {cfg.max_position_embeddings}{experts}")
