"""The policy interface."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class PolicyError(ValueError):
    """Bad policy parameters; ``field`` names the offending parameter."""

    def __init__(self, message: str, field: str | None = None):
        self.message, self.field = message, field
        super().__init__(message)


def check_k_max(k_max: object, field: str = "k_max") -> int:
    """A largest speculation length: a whole number >= 0 (the check every policy shares)."""
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 0:
        raise PolicyError(f"{field} must be a whole number >= 0, got {k_max!r}", field=field)
    return k_max


class CostModelLike(Protocol):
    """What a policy may ask of the cost model (a protocol, not an import of ``sim``).

    In a simulation this is the run's pre-tabulated step table: cheap enough to call
    for every candidate k at every step, valid for batch sizes up to the run's
    max_batch_size and k up to the policy's max_k.

    Optional attribute: ``max_batch`` (int), the largest batch size it covers. The
    simulator's step table has it; a policy that tabulates per batch size reads it
    with ``getattr(cost_model, "max_batch", None)`` and copes with its absence.
    """

    def step_time(self, batch_size: int, k: int, context_tokens: float) -> float: ...


class BatchView:
    """The running batch as a policy sees it just before a decode step.

    The engine reuses one instance and updates it in place each step (cheap), so a
    policy must read it during ``choose_k`` and keep no reference to its arrays.
    """

    __slots__ = ("now_s", "step", "batch_size", "running", "mean_context_tokens", "remaining_tokens",
                 "final_context_tokens", "lag_tokens", "k_max", "explain")

    def __init__(self, k_max: int) -> None:
        self.now_s = 0.0
        self.step = 0
        self.batch_size = 0  # the size the step is charged at (static batches keep their padding)
        self.running = 0  # sequences still generating
        self.mean_context_tokens = 0.0
        self.remaining_tokens: np.ndarray = np.zeros(0, dtype=np.int64)  # tokens each still has to emit
        self.final_context_tokens: np.ndarray = np.zeros(0, dtype=np.int64)  # context when each finishes
        # Emitted tokens each row's draft has not yet seen: the next speculative step's first draft
        # pass feeds them all (its catch-up, priced by the engine at the batch's largest lag).
        self.lag_tokens: np.ndarray = np.zeros(0, dtype=np.int64)
        self.k_max = k_max
        # Set by whoever wants to know why k was chosen (the timeline): a policy that can explain
        # its choice stores a small dict here in choose_k; None (the default) costs nothing.
        self.explain: dict | None = None

    @property
    def context_tokens(self) -> np.ndarray:
        """Tokens already in each running sequence's KV cache (computed only when asked for)."""
        return self.final_context_tokens - self.remaining_tokens

    @property
    def max_lag(self) -> int:
        """The batch's largest draft lag (1 when nothing is known): what the catch-up is priced at."""
        lag = self.lag_tokens
        return int(np.maximum.reduce(lag)) if lag.shape[0] else 1


class StepFeedback:
    """What happened in the step just run (also reused in place by the engine)."""

    __slots__ = ("now_s", "step", "batch_size", "k", "step_time_s", "drafted_tokens", "accepted_tokens",
                 "accepted_per_sequence", "k_per_sequence")

    def __init__(self) -> None:
        self.now_s = 0.0
        self.step = 0
        self.batch_size = 0
        self.k = 0
        self.step_time_s = 0.0
        self.drafted_tokens = 0
        self.accepted_tokens = 0
        self.accepted_per_sequence: np.ndarray = np.zeros(0, dtype=np.int64)
        # None after a uniform step; after a ragged one, each sequence's own k (k above is their max).
        self.k_per_sequence: np.ndarray | None = None


class Policy:
    """Base class of speculation-length policies.

    Subclasses set ``name``, take their parameters as keyword arguments, and
    implement :meth:`choose_k`. ``max_k`` is the largest k the policy may return,
    checked against what the profile measured before a run starts.
    """

    name = "policy"
    max_k_param = "k"  # the parameter that sets max_k: a max_k beyond the profile is reported against it

    def bind(self, k_max: int, cost_model: CostModelLike | None = None) -> None:
        """Called once before a run with the largest k the profile supports and the step costs."""
        if self.max_k > k_max:
            raise self.max_k_error(k_max)

    def max_k_error(self, k_max: int) -> PolicyError:
        """The error for a max_k beyond the profile's measured k_max, naming ``max_k_param``."""
        what = (f"the table's largest k = {self.max_k}" if self.max_k_param == "table"
                else f"{self.max_k_param} = {self.max_k}")
        return PolicyError(f"{what} is beyond the profile's measured k_max = {k_max}", field=self.max_k_param)

    @property
    def max_k(self) -> int:
        raise NotImplementedError

    def choose_k(self, view: BatchView) -> int | np.ndarray:
        """k for the whole batch, or an integer array with one k per running sequence (a ragged
        step, charged padded to the largest k: see ``sim.serving.loop``)."""
        raise NotImplementedError

    def observe(self, feedback: StepFeedback) -> None:
        """Learning policies update here; the default ignores feedback."""

    def k_by_batch_size(self, max_batch: int) -> list[int] | None:
        """The k :meth:`choose_k` returns at each charged batch size 0..max_batch, for a policy whose
        choice depends on nothing else and that learns nothing; None (the default) otherwise.
        Answering lets the engine run stretches of decode steps in compiled code without asking
        (sim.serving.compiled); a subclass that overrides choose_k must override this too."""
        return None

    def params(self) -> dict[str, Any]:
        """Parameters as they would be written in a config (for the resolved config)."""
        return {}
