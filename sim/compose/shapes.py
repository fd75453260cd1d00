"""A model's forward pass as a list of kernels: the shapes composition prices.

The command turns a published config (``calibrate/models/*.json``) into a
:class:`ModelShape`; this module never reads configs itself, so the core does not
depend on ``calibrate``. Shapes follow vLLM's model code: fused QKV projection, fused
gate/up projection for Llama (``MergedColumnParallelLinear``), OPT's fc1/fc2 with ReLU
and learned positions.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

ACT_BYTES = 2  # activations stay bf16 in both bf16 and fp8 (weight-only fp8 GEMM inputs are cast inside)


@dataclass(frozen=True)
class ModelShape:
    name: str
    arch: str  # "llama" or "opt"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    params: int  # published parameter count (from the shape, checked against the model card in tests)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def group(self) -> int:
        """Query heads per KV head (1 for multi-head attention)."""
        return self.num_heads // self.num_kv_heads

    def layer_gemms(self) -> list[tuple[str, int, int]]:
        """(name, n, k) of each per-layer GEMM: y[m, n] = x[m, k] @ W[k, n]."""
        h, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        qkv = (self.num_heads + 2 * self.num_kv_heads) * hd
        if self.arch == "opt":
            return [("qkv", qkv, h), ("out", h, h), ("fc1", f, h), ("fc2", h, f)]
        return [("qkv", qkv, h), ("o", h, self.num_heads * hd), ("gate_up", 2 * f, h), ("down", h, f)]

    def gemm_params(self) -> int:
        return self.num_layers * sum(n * k for _, n, k in self.layer_gemms())

    def weight_bytes(self, gemm_weight_bytes: int) -> int:
        """Linear layers at ``gemm_weight_bytes`` per weight (1 for fp8); embeddings, head, norms bf16."""
        gemm = self.gemm_params()
        return gemm * gemm_weight_bytes + (self.params - gemm) * ACT_BYTES

    def kv_bytes_per_token(self, kv_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bytes

    def small_op_elements_per_token(self) -> tuple[int, int]:
        """Elements each token reads + writes in the memory-bound ops: (per layer, once per pass).

        Llama: two fused residual-add + RMSNorms (read x and residual, write both: 4h each),
        rotary on q and k (read + write), SiLU-and-mul (read 2f, write f), the KV-cache write.
        OPT: two LayerNorms (2h each) and two residual adds (3h each), ReLU (2f), KV write.
        Per pass: the embedding gather (2h; OPT adds its learned positions, 2h + 3h) and the
        final norm. Elements are bf16; the KV write is counted at the KV dtype by the caller.
        """
        h, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        if self.arch == "opt":
            return 2 * 2 * h + 2 * 3 * h + 2 * f, 2 * h + 5 * h + 2 * h
        return 2 * 4 * h + 2 * (self.num_heads + self.num_kv_heads) * hd + 3 * f, 2 * h + 4 * h

    @classmethod
    def of(cls, config: Any, params: int) -> "ModelShape":
        """The shape of a published config (any object with these fields, e.g. calibrate's ModelConfig)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls) if f.name != "params"}, params=params)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}
