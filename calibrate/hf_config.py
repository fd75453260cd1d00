"""Any model from its Hugging Face ``config.json``: find the file, read the shape a cost needs.

A model given to ``--target`` / ``--draft`` that is not a built-in name is looked for, in order,
as a path to a ``config.json`` (or a folder holding one), in the local Hugging Face cache
(``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``: the snapshot that
``refs/main`` names, else the first by name) and among the configs aiconfigurator-core ships
(``model_configs/ORG--NAME_config.json``, found on disk: the package is never imported, so
calibration keeps needing only torch, numpy and pandas). Nothing is fetched from the network.

The shape is read as vLLM's model code reads it (Llama, Mistral, Mixtral, Qwen2/2.5, Qwen2-MoE,
Qwen3, Qwen3-MoE, Llama 4's text model). A missing key, or an architecture whose attention or
layers are not priced yet, is one :class:`~sim.errors.InputError` naming the key, the file and
its line. Plain Python and json only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import InputError, read_text

CONFIG_NAME = "config.json"
SHIPPED_SUFFIX = "_config.json"  # aiconfigurator-core's model_configs/ORG--NAME_config.json
HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")

# architectures -> family: how the layers are laid out (_shape_of reads each)
FAMILIES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe", "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4",
    "DeepseekV3ForCausalLM": "deepseek", "DeepseekV2ForCausalLM": "deepseek",
}
# priced nowhere yet, with the reason (the rest: "not priced yet", listing FAMILIES)
REFUSED = {
    "DeepseekV32ForCausalLM": "its sparse attention (the lightning indexer choosing index_topk keys per query) is "
                              "not priced: the kernel data's MLA module tables time dense latent attention",
}
LLAMA4_NOPE_INTERVAL = 4  # HF Llama4TextConfig: every 4th layer has no rotary and global attention


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it (no network)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def shipped_configs_dir() -> Path | None:
    """aiconfigurator-core's ``model_configs`` folder, found without importing the package."""
    try:
        spec = importlib.util.find_spec("aiconfigurator_core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        folder = Path(root) / "model_configs"
        if folder.is_dir():
            return folder
    return None


def _named(folder: Path, name: str) -> Path:
    """``folder / name``, or the entry whose name is ``name`` but for case (the Hub matches ids whatever
    their case: meta-llama/llama-3.1-8b is meta-llama/Llama-3.1-8B)."""
    exact = folder / name
    if exact.exists() or not folder.is_dir():
        return exact
    wanted = name.lower()
    return next((entry for entry in sorted(folder.iterdir()) if entry.name.lower() == wanted), exact)


def cached_config(model_id: str) -> Path | None:
    """``ORG/NAME``'s config.json in the local Hugging Face cache: refs/main's snapshot, else the first."""
    repo = _named(hub_cache(), "models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    main = repo / "refs" / "main"
    if main.is_file():
        pinned = snapshots / main.read_text().strip() / CONFIG_NAME
        if pinned.is_file():
            return pinned
    found = sorted(snapshots.glob(f"*/{CONFIG_NAME}"))
    return found[0] if found else None


def shipped_config(model_id: str) -> Path | None:
    folder = shipped_configs_dir()
    if folder is None:
        return None
    path = _named(folder, model_id.replace("/", "--") + SHIPPED_SUFFIX)
    return path if path.is_file() else None


def shipped_ids() -> list[str]:
    """The Hugging Face ids whose config ships with aiconfigurator-core and names a priced architecture."""
    folder = shipped_configs_dir()
    if folder is None:
        return []
    ids = []
    for path in sorted(folder.glob("*" + SHIPPED_SUFFIX)):
        stem = path.name[:-len(SHIPPED_SUFFIX)]
        try:
            architectures = json.loads(path.read_text()).get("architectures") or [None]
        except (OSError, ValueError, AttributeError):
            continue
        if "--" in stem and architectures[0] in FAMILIES:
            ids.append(stem.replace("--", "/", 1))
    return ids


@dataclass(frozen=True)
class Found:
    """A located config.json: the file, the model's name, where it came from (recorded in a profile's
    sidecar) and the file as an error names it (a shipped one by its place in the package)."""

    path: Path
    name: str
    source: str
    shown: str


def locate(spec: str) -> Found | None:
    """The config.json of a path, a folder or a Hugging Face id; None if nothing matches."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / CONFIG_NAME
        if not path.is_file():
            raise InputError(f"the folder holds no {CONFIG_NAME}", source=spec)
    if path.is_file():
        return Found(path, name_of_path(path), str(path), str(path))
    if not HF_ID.match(spec):
        return None
    cached = cached_config(spec)
    if cached is not None:  # named as the cache spells the id, whatever case it was asked in
        name = name_of_path(cached)
        return Found(cached, name, f"{name} (Hugging Face cache, snapshot {cached.parent.name})", str(cached))
    shipped = shipped_config(spec)
    if shipped is not None:
        name = name_of_path(shipped)
        return Found(shipped, name, f"{name} (aiconfigurator-core model_configs/{shipped.name})",
                     f"aiconfigurator_core/model_configs/{shipped.name}")
    return None


def name_of_path(path: Path) -> str:
    """A config file's model name: ORG/NAME inside a Hugging Face cache, else its folder's name."""
    parts = path.resolve().parts
    for part in reversed(parts):
        if part.startswith("models--") and part.count("--") >= 2:
            return part[len("models--"):].replace("--", "/", 1)
    shipped = path.name
    if shipped.endswith(SHIPPED_SUFFIX) and "--" in shipped:
        return shipped[:-len(SHIPPED_SUFFIX)].replace("--", "/", 1)
    return path.resolve().parent.name


# -- reading ----------------------------------------------------------------------------------

class _Keys:
    """One config's (text) keys with the file's text, so an error names the key, the file and its line."""

    def __init__(self, raw: dict[str, Any], text: str, path: str, prefix: str = "") -> None:
        self.raw, self.text, self.path, self.prefix = raw, text, path, prefix

    def line(self, key: str) -> int | None:
        match = re.search(rf'"{re.escape(key)}"\s*:', self.text)
        return self.text.count("\n", 0, match.start()) + 1 if match else None

    def error(self, key: str, message: str) -> InputError:
        return InputError(message, field=self.prefix + key, source=self.path, line=self.line(key))

    def get(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None) -> int:
        value = self.raw.get(key)
        if value is None:
            if default is None:
                raise self.error(key, "missing: the model's shape needs it")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(key, f"must be a non-negative integer, not {value!r}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"must be a number, not {value!r}")
        return float(value)


def read_config(found: Found) -> dict[str, Any]:
    """The :class:`~calibrate.configs.ModelConfig` fields of one Hugging Face config.json (the caller
    builds it; an error it raises is placed in the file by :func:`placed`)."""
    path = found.shown
    text = read_text(found.path)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not JSON: {exc.msg}", source=path, line=exc.lineno) from None
    if not isinstance(raw, dict):
        raise InputError("not a config.json: the file holds no JSON object", source=path)
    top = _Keys(raw, text, path)
    architectures = top.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise top.error("architectures", "missing: it says which model code (and so which layers) to price")
    arch = str(architectures[0])
    if arch in REFUSED:
        raise top.error("architectures", f"{arch}: {REFUSED[arch]}")
    if arch not in FAMILIES:
        raise top.error("architectures", f"{arch} is not priced yet (priced: {', '.join(sorted(FAMILIES))})")
    family = FAMILIES[arch]
    keys = top
    if family == "llama4":
        inner = raw.get("text_config", raw)
        if not isinstance(inner, dict):
            raise top.error("text_config", "must be an object (the language model's config)")
        keys = _Keys(inner, text, path, "text_config." if inner is not raw else "")
    return {"name": found.name, "arch": "llama", "source": found.source, **_shape_of(family, keys)}


def placed(error: InputError, found: Found) -> InputError:
    """A shape check's error on a field, placed at that key's line of the config file."""
    keys = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads", "num_experts": "num_experts",
            "experts_per_token": "num_experts_per_tok"}
    key = keys.get(error.field or "", error.field or "")
    return InputError(error.message, field=key, source=found.shown,
                      line=_Keys({}, read_text(found.path), found.shown).line(key))


def _shape_of(family: str, k: _Keys) -> dict[str, Any]:
    """The ModelConfig fields (besides name, arch and source) of one family's config keys."""
    layers = k.int("num_hidden_layers")
    heads = k.int("num_attention_heads")
    out: dict[str, Any] = {
        "vocab_size": k.int("vocab_size"), "hidden_size": k.int("hidden_size"), "num_layers": layers,
        "num_heads": heads, "num_kv_heads": k.int("num_key_value_heads", heads),
        "intermediate_size": k.int("intermediate_size"),
        "max_position_embeddings": k.int("max_position_embeddings"),
        "rope_theta": k.number("rope_theta", 10000.0),
        "tie_word_embeddings": bool(k.get("tie_word_embeddings", False)),
        "norm_eps": k.number("rms_norm_eps", 1e-6),
        "head_dim": k.int("head_dim", 0),
        "dtype": str(k.get("torch_dtype") or k.get("dtype") or ""),
    }
    quant = k.get("quantization_config")
    if isinstance(quant, dict):  # the checkpoint's weights as stored (compose prices --dtype's)
        out["dtype"] = str(quant.get("quant_method") or "quantized")
    out.update(_windows(family, k, layers))
    if family in ("qwen2", "qwen2_moe"):
        out["attention_bias"] = True  # Qwen2's q, k and v projections carry biases
    if family in ("qwen3", "qwen3_moe"):
        out["qk_norm"] = True
    if family == "deepseek":
        out.update(_latent_attention(k))
    out.update(_experts(family, k, layers, out["intermediate_size"]))
    if family == "llama4":
        out["qk_norm"] = bool(k.get("use_qk_norm"))
    return out


def _windows(family: str, k: _Keys, layers: int) -> dict[str, int]:
    """sliding_window and window_layers: the layers that attend to recent tokens only (none: {})."""
    window = k.get("sliding_window")
    kinds = k.get("layer_types")
    windowed = 0
    if window and isinstance(kinds, list):  # newer configs list each layer's attention
        windowed = sum(1 for kind in kinds if kind == "sliding_attention")
    elif family in ("llama", "mixtral") and window:  # Mistral-7B-v0.1: every layer attends to the last window
        windowed = layers
    elif family.startswith("qwen") and k.get("use_sliding_window") and window:  # from max_window_layers on
        windowed = max(0, layers - k.int("max_window_layers", layers))
    if windowed:
        return {"sliding_window": k.int("sliding_window"), "window_layers": windowed}
    chunk = k.int("attention_chunk_size", 0) if family == "llama4" else 0
    if chunk:  # Llama 4: rotary layers attend within chunks of attention_chunk_size, the no-rope layers globally
        rope = k.get("no_rope_layers") or [int((i + 1) % LLAMA4_NOPE_INTERVAL != 0) for i in range(layers)]
        return {"sliding_window": chunk, "window_layers": sum(1 for flag in rope if flag)}
    return {}


def _latent_attention(k: _Keys) -> dict[str, int]:
    """DeepSeek's multi-head latent attention: every head keeps its own query, key and value, but the KV
    cache holds one compressed vector per token (kv_lora_rank + qk_rope_head_dim wide)."""
    nope, rope = k.int("qk_nope_head_dim"), k.int("qk_rope_head_dim")
    return {"q_lora_rank": k.int("q_lora_rank", 0), "kv_lora_rank": k.int("kv_lora_rank"),
            "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": k.int("v_head_dim"),
            "head_dim": nope + rope, "num_kv_heads": k.int("num_attention_heads")}


def _experts(family: str, k: _Keys, layers: int, intermediate: int) -> dict[str, int]:
    """The mixture of experts' fields: experts, top-k, each expert's size, a shared expert, dense layers."""
    if family == "mixtral":
        return {"num_experts": k.int("num_local_experts"), "experts_per_token": k.int("num_experts_per_tok")}
    if family in ("qwen2_moe", "qwen3_moe"):
        step, dense_only = k.int("decoder_sparse_step", 1), k.get("mlp_only_layers", [])
        if not isinstance(dense_only, list):
            raise k.error("mlp_only_layers", "must be a list of layer indices")
        sparse = sum(1 for i in range(layers) if i not in dense_only and step and (i + 1) % step == 0)
        out = {"num_experts": k.int("num_experts"), "experts_per_token": k.int("num_experts_per_tok"),
               "intermediate_size": k.int("moe_intermediate_size")}
        if family == "qwen2_moe":
            out["shared_expert_intermediate_size"] = k.int("shared_expert_intermediate_size", 0)
    elif family == "deepseek":  # shared experts beside the routed ones; the first layers dense
        first, step = k.int("first_k_dense_replace", 0), k.int("moe_layer_freq", 1)
        sparse = sum(1 for i in range(first, layers) if step and i % step == 0)
        out = {"num_experts": k.int("n_routed_experts"), "experts_per_token": k.int("num_experts_per_tok"),
               "intermediate_size": k.int("moe_intermediate_size"),
               "shared_expert_intermediate_size": k.int("n_shared_experts", 0) * k.int("moe_intermediate_size")}
    elif family == "llama4":  # a shared expert as wide as each routed one; dense layers between expert ones
        step = k.int("interleave_moe_layer_step", 1)
        sparse = len(k.get("moe_layers") or (range(step - 1, layers, step) if step else ()))
        out = {"num_experts": k.int("num_local_experts"), "experts_per_token": k.int("num_experts_per_tok"),
               "shared_expert_intermediate_size": intermediate}
    else:
        return {}
    if sparse < layers:
        dense_key = "intermediate_size_mlp" if family == "llama4" else "intermediate_size"
        out.update(dense_layers=layers - sparse, dense_intermediate_size=k.int(dense_key))
    return out
