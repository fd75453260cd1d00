"""The issue-12 GPU-like profile: a target step of about 10 ms + 0.3 ms per token of batch x q,
a draft a tenth of it (measured at several q, so the draft's catch-up pass has a price), batches
up to 64. Costs are linear in work, so every interpolation is exact."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from sim.profile import write_profile

BATCH = (1, 2, 4, 8, 16, 32, 64)
Q_MAX = 8
CONTEXTS = (128, 512, 1024, 2048)
PROMPTS = (32, 128, 512, 1024)


def latency(phase: str, model: str, b: int, q: int) -> float:
    scale = 1.0 if model == "target" else 0.1
    if phase == "verify":
        return 1e-5 * b * (q + 1)
    return scale * (0.010 + 3e-4 * b * q)


def make_gpu_like_profile(directory: Path) -> Path:
    rows = []

    def add(phase, model, b, q, c):
        t = float(latency(phase, model, b, q))
        rows.append({"phase": phase, "model": model, "batch_size": b, "query_tokens": q, "context_tokens": c,
                     "status": "ok", "samples": 5, "latency_median_s": t, "latency_mean_s": t,
                     "latency_std_s": 0.0, "latency_p10_s": t, "latency_p90_s": t, "latency_min_s": t})

    for model in ("target", "draft"):
        for b, p in itertools.product(BATCH, PROMPTS):
            add("prefill", model, b, p, 0)
        for b, c, q in itertools.product(BATCH, CONTEXTS, range(1, Q_MAX + 1)):
            add("decode", model, b, q, c)
    for b, k in itertools.product(BATCH, range(Q_MAX)):
        add("verify", "target", b, k, 0)
    meta = {"name": directory.name, "device": {"type": "synthetic", "name": "gpu-like"}, "dtype": "float16",
            "versions": {}, "models": {"target": {"name": "gpu-like-target"}, "draft": {"name": "gpu-like-draft"}},
            "grid": {}, "timing": {"method": "synthetic"}, "created_utc": "2026-01-01T00:00:00Z",
            "kv_capacity_tokens": 1_000_000}
    return write_profile(directory, meta, pd.DataFrame(rows))
