"""Why each k was chosen: a policy wrapper that records each decode step's reason, for the timeline.

Policies that can explain themselves fill ``BatchView.explain`` (a dict) in ``choose_k`` when it
is not None: goodput each candidate k's expected tokens per second, the table policies the row
they used, the engine policies their rule. The engine leaves ``explain`` None, so an ordinary
run pays one attribute check per step; only a run whose timeline is asked for is wrapped here.
"""

from __future__ import annotations

from typing import Any

from policies.base import BatchView, CostModelLike, Policy, StepFeedback


class Explaining(Policy):
    """Delegates everything to ``inner``; keeps ``reasons``: decode step index -> the reason given."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_k_param = inner.max_k_param
        self.reasons: dict[int, dict[str, Any]] = {}

    @property
    def max_k(self) -> int:
        return self.inner.max_k

    def bind(self, k_max: int, cost_model: CostModelLike | None = None) -> None:
        self.inner.bind(k_max, cost_model)

    def choose_k(self, view: BatchView):
        view.explain = reason = {}
        try:
            k = self.inner.choose_k(view)
        finally:
            view.explain = None
        if reason:
            self.reasons[view.step] = reason
        return k

    def observe(self, feedback: StepFeedback) -> None:
        self.inner.observe(feedback)

    def params(self) -> dict[str, Any]:
        return self.inner.params()
