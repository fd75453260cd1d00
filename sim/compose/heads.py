"""Drafter heads priced from the kernel tables: EAGLE, EAGLE-3, MTP and Medusa at a target's width.

A head is not a small model: it is one decoder layer at the target's hidden size (its attention
heads, KV heads and MLP width), fed the target's hidden states, plus an LM head. Its shapes follow
the published checkpoints and vLLM's model code:

* EAGLE (``yuhuili/EAGLE-LLaMA3.1-Instruct-8B``; vLLM ``llama_eagle.py``): each pass projects
  [token embedding, hidden state] (2h) to h (``fc``), runs the layer, and takes logits from the
  target's LM head;
* EAGLE-3 (``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``; vLLM ``llama_eagle3.py``): a step's first pass
  fuses the target's low, middle and high layers' states (3h) to h (``fc``: only when its input is
  the target's, so only in the first pass); the layer's QKV projection reads [embedding, hidden]
  (2h); its own LM head covers a reduced draft vocabulary (32,000 tokens for Llama 3);
* MTP (DeepSeek-V3's module, arXiv 2412.19437): normed [embedding, hidden] projected 2h -> h
  (``eh_proj``), one decoder layer of the target's kind, the shared LM head. Priced at the
  target's width whatever the target (Llama 3.1 ships no MTP layer: a what-if);
* Medusa (arXiv 2401.10774; vLLM ``medusa.py``): k heads on the last hidden state, each a residual
  block (an h x h linear and SiLU) and its own LM head, all in one pass; no attention, no KV.

A profile row ``decode/<head>`` at q tokens per sequence is one pass over q tokens: q = 1 a later
draft pass, q >= 2 a step's first pass over the q positions the target verified (EAGLE-3's fusion
included there); logits for one token per sequence (a tree's later passes need top-k: their LM
head is understated by that). ``prefill/<head>``: the head's pass over a prompt (its one-layer KV).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.compose.price import KV_BYTES, KernelTables, PassPricer
from sim.compose.shapes import ACT_BYTES, ModelShape

HEAD_METHODS = ("eagle", "eagle3", "mtp", "medusa")
EAGLE3_DRAFT_VOCAB = 32000  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's draft_vocab_size
MEDUSA_HEADS = 5  # the published Medusa checkpoints (FasterDecoding/medusa-vicuna-7b-v1.3) carry 5 heads


@dataclass(frozen=True)
class HeadShape:
    """A drafter head's shapes (the module docstring), derived from its target's."""

    method: str
    target: ModelShape
    lm_rows: int  # the LM head's output rows: the target's vocabulary, or EAGLE-3's draft vocabulary
    fc_in: int  # the feature projection's input width (0: none)
    qkv_in: int  # the layer's QKV projection's input width
    medusa_heads: int = 0

    @classmethod
    def of(cls, method: str, target: ModelShape, medusa_heads: int = MEDUSA_HEADS) -> "HeadShape":
        h = target.hidden_size
        if method == "eagle3":
            return cls(method, target, min(EAGLE3_DRAFT_VOCAB, target.vocab_size), 3 * h, 2 * h)
        if method in ("eagle", "mtp"):
            return cls(method, target, target.vocab_size, 2 * h, h)
        if method == "medusa":
            return cls(method, target, target.vocab_size, 0, h, medusa_heads)
        raise ValueError(f"'{method}' is not a head ({', '.join(HEAD_METHODS)})")

    @property
    def layer(self) -> ModelShape:
        """The head's one decoder layer, as a one-layer model of the target's width (its LM head rows)."""
        t = self.target
        return ModelShape(f"{self.method}-head", t.arch, self.lm_rows, t.hidden_size, 1, t.num_heads,
                          t.num_kv_heads, t.intermediate_size, 0)

    def layer_gemms(self) -> list[tuple[str, int, int]]:
        gemms = self.layer.layer_gemms()
        return [(name, n, self.qkv_in if name == "qkv" else k) for name, n, k in gemms]

    @property
    def params(self) -> int:
        """The head's own weights (the target's shared embedding and LM head not counted)."""
        h = self.target.hidden_size
        if self.method == "medusa":
            return self.medusa_heads * (h * h + h + self.lm_rows * h)
        own_head = self.lm_rows * h if self.method == "eagle3" else 0
        return self.fc_in * h + sum(n * k for _, n, k in self.layer_gemms()) + 3 * h + own_head

    def weight_bytes(self) -> int:
        return self.params * ACT_BYTES

    def kv_bytes_per_token(self) -> int:
        return 0 if self.method == "medusa" else self.layer.kv_bytes_per_token(KV_BYTES)

    def config(self) -> dict:
        """What the sidecar records of it."""
        return {"method": self.method, "of_target": self.target.name, "hidden_size": self.target.hidden_size,
                "num_layers": 0 if self.method == "medusa" else 1, "lm_head_rows": self.lm_rows,
                "fc_in": self.fc_in, "qkv_in": self.qkv_in, "medusa_heads": self.medusa_heads}


class HeadPricer:
    """A head's passes from the kernel tables, in :class:`~sim.compose.price.PassPricer`'s interface
    (``decode_parts``, ``prefill_parts``) so that a profile's points are priced alike."""

    def __init__(self, shape: HeadShape, tables: KernelTables) -> None:
        self.shape = shape
        self.model = shape.layer
        self.layer = PassPricer(shape.layer, tables)

    def _gemms(self, tokens, first) -> np.ndarray:
        s, h = self.shape, self.shape.target.hidden_size
        total = sum(self.layer.gemm(tokens, n, k) for _, n, k in s.layer_gemms())
        if s.fc_in:
            fc = self.layer.gemm(tokens, h, s.fc_in)
            total = total + (np.where(first, fc, 0.0) if s.method == "eagle3" else fc)
        return total

    def decode_parts(self, b, q, c, logits_per_sequence=None) -> dict[str, np.ndarray]:
        b, q, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (b, q, c)))
        if self.shape.method == "medusa":
            return self.medusa_parts(b, q)
        tokens = b * q
        layer_small, pass_small = self.layer.small_ops(tokens)
        return {"gemm": self._gemms(tokens, q >= 2), "attention": self.layer.decode_attention(b, q, c),
                "small_ops": layer_small + pass_small, "lm_head": self.layer.lm_head(b)}

    def prefill_parts(self, b, p) -> dict[str, np.ndarray]:
        b, p = np.broadcast_arrays(np.asarray(b, dtype=float), np.asarray(p, dtype=float))
        tokens = b * p
        layer_small, pass_small = self.layer.small_ops(tokens)
        return {"gemm": self._gemms(tokens, np.ones(tokens.shape, bool)),
                "attention": self.layer.context_attention(b, p), "small_ops": layer_small + pass_small,
                "lm_head": self.layer.lm_head(b)}

    def medusa_parts(self, b, k) -> dict[str, np.ndarray]:
        """k heads over b last hidden states: each an h x h linear (+ SiLU and the residual, bandwidth) and
        its LM head."""
        h = self.shape.target.hidden_size
        residual = b * 3 * h * ACT_BYTES / self.layer.bw
        return {"gemm": k * self.layer.gemm(b, h, h), "small_ops": k * residual, "lm_head": k * self.layer.lm_head(b)}
