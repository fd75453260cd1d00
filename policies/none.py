"""``none``: plain autoregressive decoding, the baseline every policy is judged against."""

from __future__ import annotations

from policies.base import BatchView, Policy


class NoSpeculation(Policy):
    name = "none"

    @property
    def max_k(self) -> int:
        return 0

    def choose_k(self, view: BatchView) -> int:
        return 0

    def k_by_batch_size(self, max_batch: int) -> list[int]:
        return [0] * (max_batch + 1)
