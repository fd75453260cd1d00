"""Hand-made profiles with known costs, for tests that need exact answers."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Callable

import pandas as pd

from sim.costmodel.profile import write_profile

Latency = Callable[[str, str, int, int, int], float]


def linear_latency(phase: str, model: str, b: int, q: int, c: int) -> float:
    """Costs linear in work: easy to reason about and exactly interpolated."""
    if model in ("eagle", "eagle3", "mtp"):  # a head: one layer, much cheaper than the draft model
        return (0.0008 + 2e-6 * b * q) if phase == "prefill" else 0.001 + 5e-6 * b * q + 1e-8 * b * c
    if model == "medusa":
        return 0.0005 * q + 1e-6 * b * q
    if phase == "propose":  # a host proposer
        return 1e-5 + 1e-6 * b * q + 1e-7 * b * c
    if phase == "prefill":
        return (0.010 if model == "target" else 0.002) + 1e-5 * b * q
    if phase == "decode":
        base, per_token, per_ctx = (0.020, 1e-4, 1e-7) if model == "target" else (0.004, 2e-5, 2e-8)
        return base + per_token * b * q + per_ctx * b * c
    return 0.0005 + 1e-6 * b * (q + 1)


def make_profile(directory: Path, latency: Latency = linear_latency, *, batch=(1, 2, 4, 8, 16, 32),
                 q_max: int = 8, contexts=(128, 512, 1024, 2048), prompts=(32, 128, 512, 1024),
                 kv_capacity_tokens: int | None = 1_000_000, draft_q_max: int = 1,
                 label: str = "synthetic", dtype: str = "float32", drafters: tuple[str, ...] = ()) -> Path:
    """``draft_q_max`` > 1 measures the draft's decode at several q too (its catch-up pass then has a price);
    ``drafters``: heads (eagle, eagle3, mtp, medusa) and host proposers (ngram, suffix) priced too."""
    rows = []

    def add(phase, model, b, q, c):
        t = float(latency(phase, model, b, q, c))
        rows.append({"phase": phase, "model": model, "batch_size": b, "query_tokens": q, "context_tokens": c,
                     "status": "ok", "samples": 5, "latency_median_s": t, "latency_mean_s": t,
                     "latency_std_s": 0.0, "latency_p10_s": t, "latency_p90_s": t, "latency_min_s": t})

    for model in ("target", "draft"):
        for b, p in itertools.product(batch, prompts):
            add("prefill", model, b, p, 0)
    for b, c in itertools.product(batch, contexts):
        for q in range(1, draft_q_max + 1):
            add("decode", "draft", b, q, c)
        for q in range(1, q_max + 1):
            add("decode", "target", b, q, c)
    for b, k in itertools.product(batch, range(q_max)):
        add("verify", "target", b, k, 0)
    for name in drafters:
        if name == "medusa":
            for b, k in itertools.product(batch, range(1, q_max)):
                add("decode", "medusa", b, k, 0)
        elif name in ("ngram", "suffix"):
            for b, k, c in itertools.product(batch, (1, q_max - 1), contexts):
                add("propose", name, b, k, c)
        else:
            for b, p in itertools.product(batch, prompts):
                add("prefill", name, b, p, 0)
            for b, q, c in itertools.product(batch, range(1, q_max + 1), contexts):
                add("decode", name, b, q, c)
    name = "hand-made" if label == "synthetic" else label
    meta = {"name": directory.name, "device": {"type": "synthetic", "name": name}, "dtype": dtype,
            "versions": {}, "models": {"target": {"name": f"{label}-target", "weight_bytes": 16 << 30,
                                                  "kv_bytes_per_token": 131072},
                                       "draft": {"name": f"{label}-draft", "weight_bytes": 2 << 30,
                                                 "kv_bytes_per_token": 32768},
                                       **{name: {"name": f"{label}-{name}", "weight_bytes":
                                                 (0 if name in ("ngram", "suffix") else 1 << 30),
                                                 "kv_bytes_per_token": 4096 if name in ("eagle", "eagle3", "mtp")
                                                 else 0} for name in drafters}},
            "grid": {}, "timing": {"method": "synthetic"}, "created_utc": "2026-01-01T00:00:00Z"}
    if kv_capacity_tokens is not None:
        meta["kv_capacity_tokens"] = kv_capacity_tokens
    return write_profile(directory, meta, pd.DataFrame(rows))


def step_feedback(k: int, accepted: list[int]):
    """What the loop tells a policy after a uniform step at k whose sequences kept ``accepted``."""
    import numpy as np

    from policies.base import StepFeedback

    fb = StepFeedback()
    fb.k = k
    fb.accepted_per_sequence = np.asarray(accepted, dtype=np.int64)
    fb.drafted_tokens = k * len(accepted)
    fb.accepted_tokens = int(sum(accepted))
    return fb
