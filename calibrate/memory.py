"""Memory: what is available, what a point needs, how many KV tokens fit.

A point that cannot fit is skipped *before* it runs: on a GPU an out-of-memory error is
recoverable but slow and fragments the allocator, and on Linux a CPU process that
over-allocates is often killed outright instead of seeing an error. Estimates are
deliberately generous (activations and attention scores counted as if materialised).
"""

from __future__ import annotations

import os

from calibrate.configs import ModelConfig, dtype_bytes, kv_bytes_per_token, weight_bytes
from calibrate.grid import Point

SLACK_BYTES = {"cuda": 768 << 20, "cpu": 256 << 20}  # allocator, cuBLAS workspaces, graph pools, Python


def available_memory_bytes(device: str) -> int:
    """Free memory now: ``MemAvailable`` on CPU, ``torch.cuda.mem_get_info`` on CUDA."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def total_memory_bytes(device: str) -> int:
    if device == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def point_bytes(point: Point, cfg: ModelConfig, dtype: str) -> int:
    """Bytes a point allocates beyond the resident weights: KV cache, activations, logits."""
    nbytes = dtype_bytes(dtype)
    b, q, ctx = point.batch_size, point.query_tokens, point.context_tokens
    vocab, h, f = cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size
    if point.phase == "verify":
        k = q
        # target logits (+ the float32 noise they are made from), their float32 softmax, draft probs,
        # and a few [b, V] float32 temporaries of the sampler
        return b * (k + 1) * vocab * (nbytes + 8) + b * k * vocab * 4 + 6 * b * vocab * 4
    kv = kv_bytes_per_token(cfg, dtype) * b * (ctx + q)
    tokens = b * q
    activations = tokens * (8 * h + 4 * f) * nbytes
    kv_len = ctx + q
    heads = cfg.num_heads
    if point.phase == "prefill":
        scores = 0  # causal prefill runs in flash kernels (CUDA and CPU): no score matrix
        logit_rows = b
    else:
        # the additive mask (one row per query head) and the scores, as if materialised
        scores = b * heads * q * kv_len * (nbytes + 4)
        logit_rows = tokens
    logits = logit_rows * vocab * (nbytes + 3 * 4)
    return kv + activations + scores + logits


def resident_bytes(target: ModelConfig, draft: ModelConfig, dtype: str, device: str) -> int:
    """Both models' weights (both stay loaded, as when serving) plus fixed slack."""
    return weight_bytes(target, dtype) + weight_bytes(draft, dtype) + SLACK_BYTES[device]


def kv_capacity_tokens(budget: int, target: ModelConfig, draft: ModelConfig, dtype: str, device: str) -> int:
    """Tokens of KV (target + draft) that fit next to both models' weights."""
    free = budget - resident_bytes(target, draft, dtype, device)
    per_token = kv_bytes_per_token(target, dtype) + kv_bytes_per_token(draft, dtype)
    return max(0, free // per_token)
