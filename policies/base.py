"""The policy interface."""

from __future__ import annotations

from dataclasses import dataclass
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


BY_BATCH_SIZE, GOODPUT_RULE, LADDER_RULE, CONTEXT_RULE = 0, 1, 2, 3  # the rules a compiled run chooses k by


@dataclass(frozen=True, eq=False)
class CompiledForm:
    """How a compiled run (sim/serving/kernel.py) makes a policy's choices itself, without calling it.

    ``rule`` BY_BATCH_SIZE: ``k_by_batch[b]`` is the k at charged batch size b. ``rule``
    GOODPUT_RULE: goodput's argmax and learning (policies/goodput_rules.py) over the policy's own
    state arrays ``scalars`` and ``rows``, read and updated in place, for k up to ``k_max``, with the
    draft's catch-up priced when ``catch_up``. ``rule`` LADDER_RULE: SGLang's adaptive ladder
    (policies/ladder_rules.py) over ``scalars`` and the slots' ``rows``, ``k_by_batch[b]`` being the
    slot of charged batch size b. ``rule`` CONTEXT_RULE: the ``context`` table's grid lookup
    (policies/context_rules.py): ``rows`` the grid, ``scalars`` its context bands' edges and
    ``k_by_batch[b]`` the grid's column of batch size b.
    """

    rule: int
    k_by_batch: np.ndarray
    scalars: np.ndarray
    rows: np.ndarray
    catch_up: bool = False
    k_max: int = 0

    @classmethod
    def by_batch_size(cls, ks) -> "CompiledForm":
        from policies.goodput_rules import N_ROWS, N_SCALARS

        return cls(BY_BATCH_SIZE, np.asarray(ks, dtype=np.int64), np.zeros(N_SCALARS), np.zeros((N_ROWS, 1)))

    @classmethod
    def goodput(cls, scalars: np.ndarray, rows: np.ndarray, catch_up: bool, k_max: int) -> "CompiledForm":
        return cls(GOODPUT_RULE, np.zeros(1, dtype=np.int64), scalars, rows, catch_up, k_max)

    @classmethod
    def ladder(cls, slot_of_batch: np.ndarray, scalars: np.ndarray, slots: np.ndarray) -> "CompiledForm":
        return cls(LADDER_RULE, slot_of_batch, scalars, slots)

    @classmethod
    def context(cls, column_of_batch: np.ndarray, context_edges: np.ndarray, grid: np.ndarray) -> "CompiledForm":
        return cls(CONTEXT_RULE, column_of_batch, context_edges, grid)


class Policy:
    """Base class of speculation-length policies.

    Subclasses set ``name``, take their parameters as keyword arguments, and
    implement :meth:`choose_k`. ``max_k`` is the largest k the policy may return,
    checked against what the profile measured before a run starts.
    """

    name = "policy"
    max_k_param = "k"  # the parameter that sets max_k: a max_k beyond the profile is reported against it
    observes = False  # whether observe() wants feedback (True for a class that defines it: __init_subclass__)

    def __init_subclass__(cls, **kwargs) -> None:
        """A class says what it changes: one that defines ``observe`` learns (the engine fills in its
        feedback); one that changes ``choose_k`` or ``observe`` and says nothing of how it runs
        compiled (``compiled_form``, ``k_by_batch_size``) runs step by step rather than inherit
        its parent's table or rule, which would no longer be its choice."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if "observe" in own and "observes" not in own:
            cls.observes = True
        if ("choose_k" in own or "observe" in own) and "compiled_form" not in own and "k_by_batch_size" not in own:
            cls.compiled_form = Policy.compiled_form
            cls.k_by_batch_size = Policy.k_by_batch_size

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
        (:meth:`compiled_form`)."""
        return None

    def compiled_form(self, max_batch: int, cost_model: CostModelLike | None) -> CompiledForm | None:
        """How a compiled run makes this policy's choices for charged batch sizes 0..max_batch, priced
        with ``cost_model``; None: it runs step by step, asked each step. The default: the table of
        :meth:`k_by_batch_size`, for a policy that learns nothing."""
        ks = None if self.observes else self.k_by_batch_size(max_batch)
        return None if ks is None else CompiledForm.by_batch_size(ks)

    def params(self) -> dict[str, Any]:
        """Parameters as they would be written in a config (for the resolved config)."""
        return {}
