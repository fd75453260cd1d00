"""Decoder-only transformers (OPT, Llama) in plain torch with random weights.

Timing needs the real shapes and the real sequence of kernels, not trained weights, so
weights are random and built directly on the device in the target dtype (no float32
detour, no slow initialiser). Like serving engines we fuse q/k/v (and Llama's gate/up)
projections into one matmul each.

``forward(tokens[b, q], cache)`` writes the q new tokens' keys/values into the cache at
each sequence's current length, attends causally over the cached prefix, each row to its own
length (calibrate.attention), and returns logits ``[b, q, vocab]`` (or ``[b, 1, vocab]`` with
``last_only`` or ``last_positions``, as prefill needs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from calibrate.attention import PassContext, attend, pass_context, split_attention
from calibrate.configs import OPT_POSITION_OFFSET, ModelConfig
from calibrate.kvcache import KVCache

INIT_STD = 0.02
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Init:
    """Random-normal weights built by tiling one random pool: as fast as a memcpy.

    ``normal_`` on a billion CPU parameters takes many seconds; values only need to be
    small, finite and not denormal for timing, so every tensor is filled from a random
    offset of a shared ``N(0, INIT_STD)`` pool of 2**20 values.
    """

    POOL = 1 << 20

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.pool = (torch.randn(2 * self.POOL, generator=gen) * INIT_STD).to(device=device, dtype=dtype)
        self.offsets = torch.randint(0, self.POOL, (1 << 16,), generator=gen).tolist()
        self.device, self.dtype, self.count = device, dtype, 0

    def weight(self, *shape: int) -> nn.Parameter:
        flat = torch.empty(shape, device=self.device, dtype=self.dtype).view(-1)
        start = self.offsets[self.count % len(self.offsets)]
        self.count += 1
        src, n, size = self.pool[start:start + self.POOL], flat.numel(), self.POOL
        full = n // size
        if full:
            flat[:full * size].view(full, size).copy_(src.expand(full, size))
        flat[full * size:].copy_(src[:n - full * size])
        return nn.Parameter(flat.view(shape), requires_grad=False)


def constant(value: float, *shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.full(shape, value, device=device, dtype=dtype), requires_grad=False)


class Block(nn.Module):
    """One pre-norm decoder layer of either architecture. ``qkv_in``: the width its QKV projection reads
    (an EAGLE-3 head's layer reads [embedding, hidden], 2h: calibrate.heads)."""

    def __init__(self, cfg: ModelConfig, init: Init, qkv_in: int | None = None) -> None:
        super().__init__()
        h, f, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_kv_heads * cfg.head_dim
        mk = dict(device=init.device, dtype=init.dtype)
        self.cfg = cfg
        self.norm1_w, self.norm2_w = constant(1.0, h, **mk), constant(1.0, h, **mk)
        self.qkv_w = init.weight(h + 2 * kv, qkv_in or h)
        self.out_w = init.weight(h, h)
        if cfg.arch == "opt":
            self.norm1_b, self.norm2_b = constant(0.0, h, **mk), constant(0.0, h, **mk)
            self.qkv_b, self.out_b = init.weight(h + 2 * kv), init.weight(h)
            self.fc1_w, self.fc1_b = init.weight(f, h), init.weight(f)
            self.fc2_w, self.fc2_b = init.weight(h, f), init.weight(h)
        else:
            self.gate_up_w = init.weight(2 * f, h)
            self.down_w = init.weight(h, f)

    def norm(self, x: torch.Tensor, which: int) -> torch.Tensor:
        w = self.norm1_w if which == 1 else self.norm2_w
        if self.cfg.arch == "opt":
            b = self.norm1_b if which == 1 else self.norm2_b
            return F.layer_norm(x, (x.shape[-1],), w, b, self.cfg.norm_eps)
        return rms_norm(x, w, self.cfg.norm_eps)

    def forward(self, x: torch.Tensor, cache: KVCache, layer: int, positions: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor] | None, context: PassContext | None,
                qkv_input: torch.Tensor | None = None) -> torch.Tensor:
        """``qkv_input``: what the QKV projection reads instead of the normed ``x`` (the residual stays x)."""
        cfg = self.cfg
        b, q, _ = x.shape
        d, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        qkv = F.linear(self.norm(x, 1) if qkv_input is None else qkv_input, self.qkv_w, getattr(self, "qkv_b", None))
        qk, xv = qkv.split([(nh + nkv) * d, nkv * d], dim=-1)
        qk = qk.view(b, q, nh + nkv, d)
        if rope is not None:  # queries and keys rotated together: one set of kernels, as vLLM's fused rotary
            qk = apply_rope(qk, *rope)
        xq, xk = qk.split([nh, nkv], dim=2)
        xq, xk = xq.transpose(1, 2), xk.transpose(1, 2)
        xv = xv.view(b, q, nkv, d).transpose(1, 2)
        attn = attend(xq, xk, xv, cache, layer, positions, context)
        x = x + F.linear(attn.transpose(1, 2).reshape(b, q, nh * d), self.out_w, getattr(self, "out_b", None))
        y = self.norm(x, 2)
        if cfg.arch == "opt":
            y = F.linear(F.relu(F.linear(y, self.fc1_w, self.fc1_b)), self.fc2_w, self.fc2_b)
        else:
            gate, up = F.linear(y, self.gate_up_w).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_w)
        return x + y


def rope_frequencies(cfg: ModelConfig, device: torch.device) -> torch.Tensor:
    """RoPE's inverse frequencies for ``cfg``'s head size (computed on the device, no table)."""
    return 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device).float() / cfg.head_dim))


class CachedModel(nn.Module):
    """What a model timed here has: weights on a device (its ``embed`` says where and in which dtype)
    and a KV cache per pass (``cfg``'s layers and heads)."""

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache.for_model(self, batch, max_len)


class Transformer(CachedModel):
    """An OPT or Llama decoder with random weights, for timing and for real replay."""

    def __init__(self, cfg: ModelConfig, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        super().__init__()
        device = torch.device(device)
        init = Init(device, dtype, seed)
        mk = dict(device=device, dtype=dtype)
        self.cfg = cfg
        self.embed = init.weight(cfg.vocab_size, cfg.hidden_size)
        if cfg.arch == "opt":
            self.positions = init.weight(cfg.max_position_embeddings + OPT_POSITION_OFFSET, cfg.hidden_size)
            self.final_norm_b = constant(0.0, cfg.hidden_size, **mk)
        self.final_norm_w = constant(1.0, cfg.hidden_size, **mk)
        self.lm_head = self.embed if cfg.tie_word_embeddings else init.weight(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg, init) for _ in range(cfg.num_layers))
        if cfg.arch == "llama":
            self.register_buffer("inv_freq", rope_frequencies(cfg, device), persistent=False)
        self.split = split_attention(device, dtype, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: KVCache, *, last_only: bool = False,
                last_positions: torch.Tensor | None = None) -> torch.Tensor:
        b, q = tokens.shape
        if b != cache.batch:
            raise ValueError(f"tokens have batch {b}, cache has {cache.batch}")
        cache.check_room(cache.span + q)
        if self.cfg.arch == "opt" and cache.span + q > self.cfg.max_position_embeddings:
            raise ValueError(f"{self.cfg.name} has learned positions up to {self.cfg.max_position_embeddings}")
        positions = cache.lengths[:, None] + torch.arange(q, device=tokens.device)
        x = F.embedding(tokens, self.embed)
        rope = None
        if self.cfg.arch == "opt":
            x = x + F.embedding(positions + OPT_POSITION_OFFSET, self.positions)
        else:
            rope = rope_tables(positions, self.inv_freq, x.dtype)
        context = pass_context(cache, positions, self.cfg.num_heads, self.cfg.num_kv_heads, x.dtype, self.split)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer, positions, rope, context)
        cache.advance(q)
        if last_positions is not None:  # a right-padded batch: each sequence's own last token
            x = x[torch.arange(b, device=x.device), last_positions][:, None]
        elif last_only:
            x = x[:, -1:]
        if self.cfg.arch == "opt":
            x = F.layer_norm(x, (x.shape[-1],), self.final_norm_w, self.final_norm_b, self.cfg.norm_eps)
        else:
            x = rms_norm(x, self.final_norm_w, self.cfg.norm_eps)
        return F.linear(x, self.lm_head)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: torch's (one fused kernel on CUDA, accumulating in float32, as an engine's)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[b, q, 1, head_dim]`` for absolute positions ``[b, q]`` (computed per pass, no table), to
    rotate ``[b, q, heads, head_dim]``."""
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[:, :, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
