"""The issue-12 GPU-like profile: a target step of about 10 ms + 0.3 ms per token of batch x q,
a draft a tenth of it (measured at several q, so the draft's catch-up pass has a price), batches
up to 64. Costs are linear in work, so every interpolation is exact."""

from __future__ import annotations

from pathlib import Path

from tests.synthetic import make_profile

BATCH = (1, 2, 4, 8, 16, 32, 64)
Q_MAX = 8


def latency(phase: str, model: str, b: int, q: int, c: int = 0) -> float:
    scale = 1.0 if model == "target" else 0.1
    if phase == "verify":
        return 1e-5 * b * (q + 1)
    return scale * (0.010 + 3e-4 * b * q)


def make_gpu_like_profile(directory: Path) -> Path:
    return make_profile(directory, latency, batch=BATCH, q_max=Q_MAX, draft_q_max=Q_MAX, label="gpu-like",
                        dtype="float16")
