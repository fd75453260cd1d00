"""An example speculation-length policy, used by docs/policies.md.

Speculate k = 3 tokens while the batch is small and k = 1 once it reaches 8
sequences: a hand-written version of the batch size -> k look-up table of
arXiv 2310.18813. Run it with

    PYTHONPATH=docs/examples specbatch run --policy my_policy:SmallBatchSpec

tests/test_docs_examples.py runs it, so this file cannot drift from the interface.
"""

from __future__ import annotations

from typing import Any

from policies import BatchView, Policy, PolicyError, StepFeedback


class SmallBatchSpec(Policy):
    name = "small-batch-spec"

    def __init__(self, small_k: int = 3, large_k: int = 1, threshold: int = 8, smoothing: float = 0.1) -> None:
        for field, value in (("small_k", small_k), ("large_k", large_k), ("threshold", threshold)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PolicyError(f"{field} must be a whole number >= 0, got {value!r}", field=field)
        if not 0.0 < smoothing <= 1.0:
            raise PolicyError(f"smoothing must be in (0, 1], got {smoothing!r}", field="smoothing")
        self.small_k, self.large_k, self.threshold, self.smoothing = small_k, large_k, threshold, smoothing
        self.alpha_estimate: float | None = None  # learned from feedback; not used to choose k here

    @property
    def max_k(self) -> int:
        # The largest k choose_k can return: the engine sizes its tables and KV
        # reservations by it, and bind() checks it against the profile's k_max.
        return max(self.small_k, self.large_k)

    def bind(self, k_max: int, cost_model=None) -> None:
        super().bind(k_max, cost_model)  # refuses max_k > k_max (the profile's largest measured k)
        self.cost_model = cost_model  # has step_time(batch_size, k, context_tokens), unused here

    def choose_k(self, view: BatchView) -> int:
        # view.batch_size is what the step is charged at (static batches count their padding).
        return self.small_k if view.batch_size < self.threshold else self.large_k

    def observe(self, feedback: StepFeedback) -> None:
        # A moving average of accepted / drafted, as SmartSpec's goodput policy keeps.
        if feedback.drafted_tokens:
            rate = feedback.accepted_tokens / feedback.drafted_tokens
            old = self.alpha_estimate
            self.alpha_estimate = rate if old is None else old + self.smoothing * (rate - old)

    def params(self) -> dict[str, Any]:
        return {"small_k": self.small_k, "large_k": self.large_k, "threshold": self.threshold,
                "smoothing": self.smoothing}
