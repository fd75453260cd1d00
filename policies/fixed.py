"""``fixed``: the same speculation length k at every step, whatever the batch."""

from __future__ import annotations

from typing import Any

from policies.base import BatchView, Policy, PolicyError


class FixedK(Policy):
    name = "fixed"

    def __init__(self, k: int = 3) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise PolicyError(f"k must be a whole number >= 0, got {k!r}", field="k")
        self.k = k

    @property
    def max_k(self) -> int:
        return self.k

    def choose_k(self, view: BatchView) -> int:
        return self.k

    def k_by_batch_size(self, max_batch: int) -> list[int]:
        return [self.k] * (max_batch + 1)

    def params(self) -> dict[str, Any]:
        return {"k": self.k}
