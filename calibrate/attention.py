"""Attention over the KV cache, as a serving engine runs it: each row reads its own context.

A step's rows hold different numbers of tokens. A dense kernel over the batch reads every
row to the longest row's length and masks the rest; with a mask torch also picks its
memory-efficient kernel, which walks a row's context with one block of threads per KV head,
so at small batch most of the GPU idles (0.2 TB/s read at batch 1 on an H100, where vLLM's
flash attention splits a long context across the SMs: docs/gpu-profiles.md).

On CUDA, in half precision, a pass therefore attends with flash attention's variable-length
form (``torch.ops.aten._flash_attention_forward`` with ``seqused_k``): the cache is one
token-major buffer per layer (calibrate.kvcache), row ``i`` starts at ``i * max_len`` and
the kernel reads its first ``length + q`` keys only, causal within the new tokens, and
splits the keys across SMs for one-token decodes of grouped-query models, as vLLM's kernel
does. Whether that kernel is there and agrees with the dense one is checked once per
configuration on the device, before any pass is timed or captured; where it is not, or
``SPECBATCH_ATTENTION=dense`` asks for it, the dense masked kernel runs, and
:func:`split_attention_notes` says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTENTION_ENV = "SPECBATCH_ATTENTION"  # auto (split where it works), split (required), dense
_CHECKED: dict[tuple, bool] = {}
_NOTES: dict[tuple, str] = {}


@dataclass(frozen=True)
class SplitContext:
    """Per-pass metadata of the variable-length kernel, built once and read by every layer."""

    cu_q: torch.Tensor  # [b + 1] int32: row i's queries are q[cu_q[i]:cu_q[i + 1]]
    cu_k: torch.Tensor  # [b + 1] int32: row i's keys start at i * max_len of the layer's buffer
    used_k: torch.Tensor  # [b] int32: keys row i reads (its length after this pass's writes)
    max_q: int
    max_k: int


@dataclass(frozen=True)
class PassContext:
    """How a pass over a non-empty cache attends: a dense mask, or the split kernel's metadata."""

    mask: torch.Tensor | None = None
    split: SplitContext | None = None


def split_attention(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether passes of this shape attend with the split kernel (checked once; see the module docstring)."""
    choice = os.environ.get(ATTENTION_ENV, "auto").strip().lower()
    if choice not in ("auto", "split", "dense"):
        raise ValueError(f"{ATTENTION_ENV}={choice!r}: expected auto, split or dense")
    if choice == "dense":
        return False
    key = (str(device), dtype, heads, kv_heads, head_dim)
    if key not in _CHECKED:
        _CHECKED[key], _NOTES[key] = _check_split(torch.device(device), dtype, heads, kv_heads, head_dim)
    if choice == "split" and not _CHECKED[key]:
        raise RuntimeError(f"{ATTENTION_ENV}=split, but the split kernel cannot run here: {_NOTES[key]}")
    return _CHECKED[key]


def split_attention_notes() -> dict[str, str]:
    """Each checked configuration and what the check found (for a profile's or a replay's record)."""
    return {f"{k[0]} {str(k[1]).removeprefix('torch.')} heads {k[2]}/{k[3]}x{k[4]}": note for k, note in _NOTES.items()}


def pass_context(cache, positions: torch.Tensor, heads: int, kv_heads: int, dtype: torch.dtype,
                 split: bool) -> PassContext | None:
    """What every layer of a pass over ``positions [b, q]`` needs to attend (None: an empty cache)."""
    if cache.span == 0:
        return None
    b, q = positions.shape
    if split:
        device = positions.device
        rows = torch.arange(b + 1, dtype=torch.int32, device=device)
        return PassContext(split=SplitContext(rows * q, rows * cache.max_len, (positions[:, -1] + 1).to(torch.int32),
                                              q, cache.span + q))
    return PassContext(mask=attention_mask(cache.span, positions, heads // kv_heads, dtype))


def attention_mask(span: int, positions: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive causal mask ``[b, 1, group * q, kv_len]`` over the cached prefix, built once per pass.

    Query i of sequence s (absolute position length_s + i) sees key j iff j <= length_s + i,
    which also hides stale entries left behind by a rollback. Rows repeat per grouped-query
    head (see :func:`attend`). The key axis is allocated padded to a multiple of 16 so that
    fused kernels accept the mask's stride without copying it in every layer.
    """
    qlen = positions.shape[1]
    kv_len = span + qlen
    padded = -(-kv_len // 16) * 16
    visible = torch.arange(padded, device=positions.device) <= positions[:, None, :, None]  # [b, 1, q, padded]
    mask = torch.zeros(visible.shape, dtype=dtype, device=positions.device).masked_fill_(~visible, float("-inf"))
    if group > 1:
        mask = mask.repeat(1, 1, group, 1)
    return mask[..., :kv_len]


def attend(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cache, layer: int,
           positions: torch.Tensor, context: PassContext | None) -> torch.Tensor:
    """Causal attention of ``q [b, H, q, d]`` over the cached prefix plus the new keys.

    An empty cache (prefill, ``context`` None) attends over the new keys alone with
    ``is_causal`` (flash kernels apply). Otherwise the new keys are written to the cache
    first and attention reads the cache: each row to its own length with the split kernel,
    or up to the span under the mask, grouped-query heads folded into the query axis
    (``[b, kv_heads, group * q, d]``) so that keys are never copied per query head.
    """
    b, nh, qlen, d = q.shape
    nkv = k_new.shape[1]
    cache.write(layer, k_new, v_new, positions)
    if context is None:
        return F.scaled_dot_product_attention(q, k_new, v_new, is_causal=qlen > 1, enable_gqa=nh != nkv)
    if context.split is not None:
        s = context.split
        out = _flash_varlen(q.transpose(1, 2).reshape(b * qlen, nh, d), cache.k[layer].view(-1, nkv, d),
                            cache.v[layer].view(-1, nkv, d), s, causal=qlen > 1)
        return out.view(b, qlen, nh, d).transpose(1, 2)
    mask = context.mask
    kv_len = mask.shape[-1]
    keys, values = cache.k[layer, :, :kv_len].transpose(1, 2), cache.v[layer, :, :kv_len].transpose(1, 2)
    if nh != nkv:
        q = q.reshape(b, nkv, (nh // nkv) * qlen, d)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask).reshape(b, nh, qlen, d)


def _flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: SplitContext, causal: bool) -> torch.Tensor:
    return torch.ops.aten._flash_attention_forward(q, k, v, s.cu_q, s.cu_k, s.max_q, s.max_k, 0.0, causal, False,
                                                   seqused_k=s.used_k)[0]


def _check_split(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> tuple[bool, str]:
    """Run the split kernel on ragged rows against a float32 reference; (usable, what was found)."""
    if device.type != "cuda":
        return False, f"dense: the split kernel is CUDA's ({device.type} here)"
    if dtype not in (torch.float16, torch.bfloat16):
        return False, f"dense: flash attention runs in half precision ({dtype} here)"
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        max_len, lengths = 96, [5, 40, 77]
        for q_len in (1, 3):
            k = torch.randn(len(lengths) * max_len, kv_heads, head_dim, device=device, dtype=dtype, generator=gen)
            v = torch.randn(k.shape, device=device, dtype=dtype, generator=gen)
            q = torch.randn(len(lengths) * q_len, heads, head_dim, device=device, dtype=dtype, generator=gen)
            rows = torch.arange(len(lengths) + 1, dtype=torch.int32, device=device)
            used = torch.tensor(lengths, dtype=torch.int32, device=device)
            out = _flash_varlen(q, k, v, SplitContext(rows * q_len, rows * max_len, used, q_len, max(lengths)),
                                causal=q_len > 1)
            error = _relative_error(out, _reference(q, k, v, lengths, max_len, q_len))
            if not error < 2e-2:
                return False, f"dense: the split kernel disagreed with the reference (relative error {error:.2g})"
        torch.cuda.synchronize(device)
        return True, "split: flash attention, variable length (seqused_k)"
    except Exception as exc:  # noqa: BLE001 - any failure means the dense kernel runs
        return False, f"dense: the split kernel failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def _reference(q, k, v, lengths: list[int], max_len: int, q_len: int) -> torch.Tensor:
    """Row by row in float32: query i of a row sees its first ``length - q_len + i + 1`` keys."""
    group = q.shape[1] // k.shape[1]
    out = []
    for row, length in enumerate(lengths):
        keys = k[row * max_len:row * max_len + length].float().repeat_interleave(group, dim=1)  # [len, H, d]
        values = v[row * max_len:row * max_len + length].float().repeat_interleave(group, dim=1)
        queries = q[row * q_len:(row + 1) * q_len].float()  # [q, H, d]
        scores = torch.einsum("qhd,khd->hqk", queries, keys) / queries.shape[-1] ** 0.5
        visible = torch.arange(length, device=q.device) <= (length - q_len + torch.arange(q_len, device=q.device))[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values))
    return torch.cat(out)


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())
