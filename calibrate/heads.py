"""Drafter heads in torch with random weights, for timing: EAGLE, EAGLE-3, MTP and Medusa at a target's width.

A head's shapes come from its target's published config and the head's published structure
(:class:`sim.compose.heads.HeadShape`, shared with composition, so a measured and a composed
profile price the same passes): one decoder layer at the target's width, fed the target's hidden
states, and an LM head. As for the models, weights are random: timing depends on shapes only.

* EAGLE, MTP: each pass projects [embedding, hidden] (2h) to h, runs the layer, takes logits;
* EAGLE-3: a step's first pass fuses the target's three layers' states (3h -> h); every pass's
  QKV projection reads [normed embedding, normed hidden] (2h); a 32k-row draft LM head;
* Medusa: k heads on the last hidden state, each h + SiLU(W h) and its own LM head.

A timed decode pass over q >= 2 tokens is a step's first pass (the fusion runs), q = 1 a later
one; logits for each sequence's last token (a greedy draft samples its argmax).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from calibrate.configs import ModelConfig, param_count
from calibrate.attention import pass_context, split_attention
from calibrate.model import Block, CachedModel, Init, constant, rms_norm, rope_frequencies, rope_tables
from sim.compose.heads import HEAD_METHODS, HeadShape
from sim.compose.shapes import ModelShape


def head_shape(method: str, target: ModelConfig) -> HeadShape:
    """The head of ``method`` for ``target`` (sim.compose.heads)."""
    return HeadShape.of(method, ModelShape.of(target, param_count(target)))


def layer_config(shape: HeadShape, target: ModelConfig) -> ModelConfig:
    """The head's decoder layer as a one-layer model config of the target's width (its LM head's rows)."""
    return dataclasses.replace(target, name=f"{shape.method}-head-of-{target.name}", num_layers=1,
                               vocab_size=shape.lm_rows, notes=f"{shape.method} head (calibrate/heads.py)")


class Head(CachedModel):
    """A drafter head (the module docstring), built on the device in the target dtype."""

    def __init__(self, method: str, target: ModelConfig, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        super().__init__()
        if method not in HEAD_METHODS:
            raise ValueError(f"'{method}' is not a head ({', '.join(HEAD_METHODS)})")
        device = torch.device(device)
        init = Init(device, dtype, seed)
        self.method = method
        self.shape = shape = head_shape(method, target)
        self.cfg = cfg = layer_config(shape, target)
        h = target.hidden_size
        self.embed = init.weight(target.vocab_size, h)  # the target's embedding: an input gather
        if method == "medusa":
            self.residual = nn.ParameterList(init.weight(h, h) for _ in range(shape.medusa_heads))
            self.heads = nn.ParameterList(init.weight(shape.lm_rows, h) for _ in range(shape.medusa_heads))
            return
        self.fc = init.weight(h, shape.fc_in)
        self.block = Block(cfg, init, qkv_in=shape.qkv_in)
        self.norm_w = constant(1.0, h, device=device, dtype=dtype)
        self.lm_head = init.weight(shape.lm_rows, h)
        self.register_buffer("inv_freq", rope_frequencies(cfg, device), persistent=False)
        self.split = split_attention(device, dtype, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)

    def hidden_width(self, first: bool) -> int:
        """The width of the hidden states a pass is fed: EAGLE-3's first pass the target's fused three
        layers (3h), otherwise one hidden state (h)."""
        h = self.cfg.hidden_size
        return 3 * h if self.method == "eagle3" and first else h

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, cache: KVCache, *, first: bool) -> torch.Tensor:
        """One pass over ``tokens [b, q]`` with their hidden states; logits ``[b, 1, rows]`` of the last."""
        cfg = self.cfg
        q = tokens.shape[1]
        positions = cache.lengths[:, None] + torch.arange(q, device=tokens.device)
        embeds = F.embedding(tokens, self.embed)
        qkv_input = None
        if self.method == "eagle3":
            x = F.linear(hidden, self.fc) if first else hidden
            qkv_input = torch.cat((rms_norm(embeds, self.norm_w, cfg.norm_eps), rms_norm(x, self.norm_w, cfg.norm_eps)),
                                  dim=-1)
        else:
            x = F.linear(torch.cat((embeds, hidden), dim=-1), self.fc)
        rope = rope_tables(positions, self.inv_freq, x.dtype)
        context = pass_context(cache, positions, cfg.num_heads, cfg.num_kv_heads, x.dtype, self.split)
        x = self.block(x, cache, 0, positions, rope, context, qkv_input)
        cache.advance(q)
        return F.linear(rms_norm(x[:, -1:], self.norm_w, cfg.norm_eps), self.lm_head)

    @torch.no_grad()
    def medusa(self, hidden: torch.Tensor, k: int) -> list[torch.Tensor]:
        """Medusa's first k heads on ``hidden [b, 1, h]``: their logits."""
        return [F.linear(hidden + F.silu(F.linear(hidden, w)), lm) for w, lm in zip(self.residual[:k], self.heads[:k])]


def head_weight_bytes(method: str, target: ModelConfig, dtype_bytes: int) -> int:
    """The head's own weights in bytes (the target's shared embedding not counted)."""
    return head_shape(method, target).params * dtype_bytes
