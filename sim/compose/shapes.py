"""A model's forward pass as a list of kernels, on each GPU of its tensor-parallel group.

The command turns a published config (a built-in ``calibrate/models/*.json`` or a Hugging Face
``config.json``, both read by ``calibrate.configs.get_config``) into a :class:`ModelShape`; this
module never reads configs itself, so the core does not depend on ``calibrate``. Shapes follow vLLM's model code: fused QKV projection, fused
gate/up projection for Llama (``MergedColumnParallelLinear``), OPT's fc1/fc2 with ReLU
and learned positions, and a mixture of experts (``FusedMoE``) in place of the MLP where
the model has experts.

Tensor parallelism (``tp`` GPUs, vLLM's ``tensor_parallel_size``) splits a layer as vLLM's
parallel linear layers do: the QKV and gate/up projections are column-parallel (each GPU
holds ``num_heads / tp`` query heads, ``num_kv_heads / tp`` KV heads, replicated to one
per GPU when there are fewer KV heads than GPUs, and ``intermediate_size / tp`` of the
MLP), the output and down projections row-parallel (their partial sums are all-reduced,
twice a layer), experts are split along their intermediate size (vLLM's default without
expert parallelism), and the embedding and LM head are vocabulary-parallel (the embedding
all-reduced, the logits all-gathered). Everything here is per GPU unless it says
otherwise; ``tp = 1`` is the whole model.

Not every layer need be alike: a mixture of experts may keep a dense MLP in some layers (Llama-4
Maverick's every other layer, Qwen-MoE's ``mlp_only_layers``) and add a shared expert beside the
routed ones (Llama 4, Qwen2-MoE), priced as :meth:`ModelShape.layer_groups`, each group a shape
of like layers; and some layers may attend to a window of recent tokens only (Mistral's
``sliding_window``, Llama 4's attention chunks), priced as :meth:`ModelShape.attention_groups`.

A *head* drafter (EAGLE, MTP: a decoder layer or a few at the target's width fed the
target's hidden states) is a shape too: :meth:`ModelShape.head_of` builds one from the
target, with its input fusion GEMM as a per-pass GEMM, so it is priced by the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

ACT_BYTES = 2  # activations stay bf16 in both bf16 and fp8 (weight-only fp8 GEMM inputs are cast inside)
TP_SIZES = (1, 2, 4, 8)  # one node's NVLink group: what the kernel data's all-reduce tables measure


@dataclass(frozen=True)
class ModelShape:
    name: str
    arch: str  # "llama" or "opt"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int  # the MLP's, or each expert's in a mixture of experts
    params: int  # published parameter count (from the shape, checked against the model card in tests)
    head_dim: int = 0  # 0: hidden_size / num_heads
    num_experts: int = 0  # 0: a dense MLP
    experts_per_token: int = 0
    qk_norm: bool = False
    tie_word_embeddings: bool = True
    owns_vocab: bool = True  # False: a head using the target's LM head and embedding (no weights of its own)
    tp: int = 1  # GPUs the layers are split over (tensor parallelism)
    pass_gemms: tuple[tuple[str, int, int], ...] = ()  # (name, n, k) run once per pass (a head's input fusion)
    shared_expert_intermediate_size: int = 0  # an always-on expert beside the routed ones (a dense MLP)
    dense_layers: int = 0  # layers of a mixture of experts whose MLP is dense, of dense_intermediate_size
    dense_intermediate_size: int = 0
    sliding_window: int = 0  # tokens each of window_layers layers attends to (0: every layer sees the whole context)
    window_layers: int = 0
    q_lora_rank: int = 0  # multi-head latent attention (DeepSeek): the query's latent (0: projected directly)
    kv_lora_rank: int = 0  # the KV latent each token caches (0: not latent attention)
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)

    # -- tensor parallelism ---------------------------------------------------------------
    def sharded(self, tp: int) -> "ModelShape":
        """This model split over ``tp`` GPUs (each method then answers per GPU)."""
        return replace(self, tp=tp)

    def tp_problem(self, tp: int) -> str | None:
        """Why vLLM cannot split this model over ``tp`` GPUs (its own checks), or None."""
        if tp not in TP_SIZES:
            return f"tensor parallelism of {tp} GPUs: one node's group is {', '.join(map(str, TP_SIZES))}"
        if self.num_heads % tp:
            return f"{self.num_heads} attention heads do not split over {tp} GPUs"
        if self.num_kv_heads % tp and tp % self.num_kv_heads and not self.is_mla:
            return f"{self.num_kv_heads} KV heads neither split over nor replicate evenly onto {tp} GPUs"
        for size in (self.intermediate_size, self.shared_expert_intermediate_size, self.dense_intermediate_size):
            if size % tp:
                return f"an intermediate size of {size} does not split over {tp} GPUs"
        return None

    @property
    def heads(self) -> int:
        """Query heads on one GPU."""
        return self.num_heads // self.tp

    @property
    def kv_heads(self) -> int:
        """KV heads on one GPU: split, or replicated to one per GPU when there are fewer than GPUs."""
        return max(1, self.num_kv_heads // self.tp)

    @property
    def group(self) -> int:
        """Query heads per KV head on one GPU (1 for multi-head attention)."""
        return self.heads // self.kv_heads

    @property
    def ffn(self) -> int:
        """The MLP's (each expert's) intermediate size on one GPU."""
        return self.intermediate_size // self.tp

    @property
    def vocab(self) -> int:
        """LM-head rows on one GPU (vLLM pads the vocabulary to a multiple of 64 per GPU)."""
        return self.vocab_size if self.tp == 1 else 64 * math.ceil(self.vocab_size / (64 * self.tp))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: priced as a whole module (:mod:`sim.compose.mla`)."""
        return self.kv_lora_rank > 0

    # -- unlike layers --------------------------------------------------------------------
    def layer_groups(self) -> tuple["ModelShape", ...]:
        """The layers as groups of like ones, each a shape whose ``num_layers`` is the group's size:
        the model itself when every layer is alike, else its expert layers and its dense ones."""
        if not self.dense_layers:
            return (self,)
        experts = replace(self, num_layers=self.num_layers - self.dense_layers, dense_layers=0,
                          dense_intermediate_size=0)
        dense = replace(experts, num_layers=self.dense_layers, intermediate_size=self.dense_intermediate_size,
                        num_experts=0, experts_per_token=0, shared_expert_intermediate_size=0)
        return experts, dense

    def assumptions(self) -> list[str]:
        """The sidecar's lines for what this shape has beyond like layers of full attention (none for most)."""
        lines = []
        if self.sliding_window:
            lines.append(
                f"{self.name}: {self.window_layers} of {self.num_layers} layers attend to at most "
                f"{self.sliding_window} tokens (a sliding window, or Llama 4's attention chunks priced as a window "
                "of the chunk size: an upper bound, as a chunk's tokens see 1 to that many keys): a decode reads "
                "min(context, window) keys; a longer prompt costs the window's causal prefill x (1 + 2 (prompt - "
                "window) / window), by FLOPs; the KV cache is counted for the whole context (vLLM frees blocks "
                "that leave the window: the KV capacity is a lower bound)")
        if self.shared_expert_intermediate_size:
            lines.append(f"{self.name}: a shared expert (intermediate size {self.shared_expert_intermediate_size}) "
                         "runs on every token beside the routed ones, priced as a dense MLP's GEMMs (split over "
                         "the GPUs like one)")
        return lines

    def attention_groups(self) -> tuple[tuple[int, int], ...]:
        """(layers, window) per kind of attention: window 0 attends to the whole context."""
        groups = ((self.num_layers - self.window_layers, 0), (self.window_layers, self.sliding_window))
        return tuple(g for g in groups if g[0])

    # -- kernels --------------------------------------------------------------------------
    def layer_gemms(self) -> list[tuple[str, int, int]]:
        """(name, n, k) of each per-layer GEMM on one GPU: y[m, n] = x[m, k] @ W[k, n].

        A mixture of experts has its router here (replicated, ``ReplicatedLinear``); the
        experts themselves are one fused kernel (:meth:`expert_params`, priced from the MoE table)."""
        return self.attention_gemms() + self.mlp_gemms()

    def attention_gemms(self) -> list[tuple[str, int, int]]:
        """The attention block's projections. Latent attention follows vLLM's DeepSeek code: the fused
        down projection of the query latent, the KV latent and the shared rotary key (replicated on every
        GPU), then column-parallel up projections to the GPU's heads and the row-parallel output."""
        h, hd = self.hidden_size, self.head_dim
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            latent = self.kv_lora_rank + self.qk_rope_head_dim
            if self.q_lora_rank:
                down = [("qkv_a", self.q_lora_rank + latent, h), ("q_b", self.heads * qk, self.q_lora_rank)]
            else:
                down = [("kv_a", latent, h), ("q", self.heads * qk, h)]
            return [*down, ("kv_b", self.heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank),
                    ("o", h, self.heads * self.v_head_dim)]
        qkv = (self.heads + 2 * self.kv_heads) * hd
        if self.arch == "opt":
            return [("qkv", qkv, h), ("out", h, self.heads * hd)]
        return [("qkv", qkv, h), ("o", h, self.heads * hd)]

    def mlp_gemms(self) -> list[tuple[str, int, int]]:
        """The MLP's GEMMs, or a mixture of experts' router and shared expert."""
        h = self.hidden_size
        if self.arch == "opt":
            return [("fc1", self.ffn, h), ("fc2", h, self.ffn)]
        mlp = [("router", self.num_experts, h)] if self.is_moe else [("gate_up", 2 * self.ffn, h), ("down", h, self.ffn)]
        shared = self.shared_expert_intermediate_size // self.tp
        if shared:  # column- and row-parallel like a dense MLP
            mlp += [("shared_gate_up", 2 * shared, h), ("shared_down", h, shared)]
        return mlp

    def expert_params(self) -> int:
        """Expert weights on one GPU, all layers (each expert's gate/up and down, split over the GPUs)."""
        return (self.num_layers - self.dense_layers) * self.num_experts * 3 * self.hidden_size * self.ffn

    def gemm_params(self) -> int:
        """Linear-layer weights on one GPU, all layers: the GEMMs, the experts and the per-pass GEMMs."""
        per_pass = sum(n * k for _, n, k in self.pass_gemms)
        layers = sum(g.num_layers * sum(n * k for _, n, k in g.layer_gemms()) for g in self.layer_groups())
        return layers + self.expert_params() + per_pass

    def vocab_params(self) -> int:
        """Embedding and LM head on one GPU (vocabulary-parallel; one matrix when tied; none when shared)."""
        return self.vocab * self.hidden_size * (1 if self.tie_word_embeddings else 2) if self.owns_vocab else 0

    def weight_bytes(self, gemm_weight_bytes: int) -> int:
        """Weights on one GPU: linear layers at ``gemm_weight_bytes`` per weight (1 for fp8); embedding,
        LM head, norms (replicated) and the rest bf16."""
        whole = self.sharded(1)
        replicated = self.params - whole.gemm_params() - whole.vocab_params()
        return self.gemm_params() * gemm_weight_bytes + (self.vocab_params() + replicated) * ACT_BYTES

    def kv_bytes_per_token(self, kv_bytes: int) -> int:
        """Key and value bytes one token takes on one GPU (all layers; the whole model's at tp = 1).
        Latent attention caches one vector per token, the latent and the rotary key, on every GPU."""
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * kv_bytes
        return 2 * self.num_layers * self.kv_heads * self.head_dim * kv_bytes

    def small_op_elements_per_token(self) -> tuple[int, int]:
        """Elements each token reads + writes in the memory-bound ops on one GPU: (per layer, once per pass).

        Llama: two fused residual-add + RMSNorms over the whole hidden state (read x and residual,
        write both: 4h each), rotary on the GPU's q and k heads (read + write), q/k norms where the
        model has them (Qwen3: read + write q and k), SiLU-and-mul (read 2f, write f; inside the
        fused kernel for experts, whose router's top-k reads the E logits instead, plus a shared
        expert's own), the KV-cache write.
        OPT: two LayerNorms (2h each) and two residual adds (3h each), ReLU (2f), KV write.
        Latent attention's norms, rotary and cache write are part of its measured module (none here).
        Per pass: the embedding gather (2h; OPT adds its learned positions, 2h + 3h) and the
        final norm. Elements are bf16; the KV write is counted at the KV dtype by the caller.
        """
        h, f, hd = self.hidden_size, self.ffn, self.head_dim
        if self.arch == "opt":
            return 2 * 2 * h + 2 * 3 * h + 2 * f, 2 * h + 5 * h + 2 * h
        qk = 0 if self.is_mla else 2 * (self.heads + self.kv_heads) * hd  # latent attention: inside its module
        mlp = self.num_experts + 3 * (self.shared_expert_intermediate_size // self.tp) if self.is_moe else 3 * f
        return 2 * 4 * h + qk * (2 if self.qk_norm else 1) + mlp, 2 * h + 4 * h

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def of(cls, config: Any, params: int) -> "ModelShape":
        """The shape of a published config (any object with these fields, e.g. calibrate's ModelConfig)."""
        names = {f.name for f in fields(cls)} - {"params", "tp", "pass_gemms", "owns_vocab"}
        return cls(**{name: getattr(config, name) for name in names if hasattr(config, name)}, params=params)

    @classmethod
    def head_of(cls, target: "ModelShape", name: str, layers: int = 1, fused_inputs: int = 2,
                vocab_size: int | None = None) -> "ModelShape":
        """A drafter head on ``target``'s hidden states (EAGLE, EAGLE-3, MTP), priced like any shape.

        ``layers`` decoder layers at the target's width and heads; ``fused_inputs`` hidden-size
        vectors concatenated and projected back to the hidden size once per pass (EAGLE: the token
        embedding and the target's last hidden state, 2; EAGLE-3: three of the target's layers, 3;
        0: none); ``vocab_size``: the head's own LM head (EAGLE-3's reduced draft vocabulary), else
        the target's. Its embedding is the target's (shared). ``params`` counts what the head adds.
        """
        h = target.hidden_size
        fc = (("fc", h, fused_inputs * h),) if fused_inputs else ()
        head = replace(target, name=name, num_layers=layers, vocab_size=vocab_size or target.vocab_size,
                       tie_word_embeddings=True, owns_vocab=vocab_size is not None, pass_gemms=fc, params=0, tp=1,
                       dense_layers=0, dense_intermediate_size=0, sliding_window=0, window_layers=0)
        norms = layers * (2 * h + (2 * head.head_dim if head.qk_norm else 0)) + h
        return replace(head, params=head.gemm_params() + head.vocab_params() + norms, tp=target.tp)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}
