"""``sglang-adaptive``: SGLang's ``--speculative-adaptive`` controller, from its adaptive config JSON.

SGLang (``python/sglang/srt/speculative/adaptive_spec_params.py``) moves the number of draft
steps (k here) along a ladder of ``candidate_steps`` by an exponential moving average of
the accepted draft tokens per request:

* after every verify, EMA <- (1 - ema_alpha) * EMA + ema_alpha * (mean accepted drafts per
  request in the batch); the EMA starts at (initial steps - 1);
* nothing moves during the first ``warmup_batches`` verifies; after them the ladder is
  re-evaluated every ``update_interval`` verifies:
  - step down from s_i to s_(i-1) while EMA <= s_(i-1) - 0.5 + down_hysteresis,
  - step up from s_i to s_(i+1) while EMA > s_i - 0.5 + up_hysteresis
  (so with zero hysteresis it settles near round(EMA) + 1, one step beyond what is accepted).

Recent SGLang keeps this state **per batch size**: integer keys of the config (``"1"``,
``"64"``, ...) are slot lower bounds, each ``{"steps": [...], "up_hysteresis": ...,
"down_hysteresis": ...}`` (or just the list of steps); a batch of b uses the slot with
the largest key <= b (the first slot below every key), each slot with its own ladder,
EMA and counters, starting at the middle of its steps; a slot without hysteresis takes
SGLang's defaults for its batch size (keys 1 / 64 / 128: down -0.25 / 0 / 0.25, up
0 / 0 / -0.1). The global ``ema_alpha``, ``update_interval`` and ``warmup_batches`` apply
to every slot. A config without integer keys is one ladder for all batch sizes
(``candidate_steps``, default [1, 3, 7], hysteresis default down -0.25, up 0), starting
at ``initial_steps`` (SGLang's ``--speculative-num-steps``) or the middle step.

Unlike SGLang, slots are chosen by the batch size itself (SGLang first pads it to its
CUDA-graph batch size). Per step: a bisection and, after a speculative step, one mean
over the batch. The controller's state is two arrays that its rules (policies/ladder_rules.py)
read and move, called here step by step and by the simulator's compiled runs alike, so a run
under this policy runs compiled. See docs/policy-engines.md.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from policies import ladder_rules as rules
from policies.base import BatchView, CompiledForm, CostModelLike, Policy, PolicyError, StepFeedback
from policies.knobs import named, batch_key, load_knob, number, whole

PARAM = "adaptive_config"
GLOBAL_KEYS = ("ema_alpha", "update_interval", "warmup_batches", "candidate_steps", "down_hysteresis",
               "up_hysteresis")
SLOT_KEYS = ("steps", "up_hysteresis", "down_hysteresis")
DEFAULT_STEPS = [1, 3, 7]
# SGLang's per-batch-size default hysteresis (slot lower bound -> values), and its single-ladder defaults.
DEFAULT_SLOT_HYSTERESIS = {1: (-0.25, 0.0), 64: (0.0, 0.0), 128: (0.25, -0.1)}  # (down, up)
DEFAULT_HYSTERESIS = (-0.25, 0.0)


class Ladder:
    """One slot's ladder, read from (and moved in) the policy's state arrays (policies/ladder_rules.py)."""

    __slots__ = ("_slots", "_slot")

    def __init__(self, slots: np.ndarray, slot: int) -> None:
        self._slots, self._slot = slots, slot

    @property
    def steps(self) -> list[int]:
        row = self._slots[self._slot]
        return [int(s) for s in row[rules.STEPS:rules.STEPS + int(row[rules.N_STEPS])]]

    @property
    def down(self) -> float:
        return float(self._slots[self._slot, rules.DOWN])

    @property
    def up(self) -> float:
        return float(self._slots[self._slot, rules.UP])

    @property
    def current(self) -> int:
        return self.steps[int(self._slots[self._slot, rules.INDEX])]

    @property
    def ema(self) -> float:
        return float(self._slots[self._slot, rules.EMA])

    @property
    def verifies(self) -> int:
        return int(self._slots[self._slot, rules.VERIFIES])

    def update(self, mean_accepted: float, ema_alpha: float, warmup: int, interval: int) -> None:
        rules.advance(self._slots, self._slot, mean_accepted, ema_alpha, warmup, interval)


def engine_config(table: list[list[int]]) -> tuple[dict[str, Any], list[list[int]]]:
    """A ``lut`` table [[start, end, k], ...] as SGLang's per-batch-size config: one slot per range,
    keyed by its start, with the single step k (so the slot never moves). SGLang drafts at least
    one step, so a range with k = 0 gets steps [1]; those ranges are returned too."""
    config: dict[str, Any] = {}
    raised = []
    for start, end, k in table:
        config[str(start)] = {"steps": [max(k, 1)]}
        if k == 0:
            raised.append([start, end, k])
    return config, raised


def _steps(value: Any, what: str) -> list[int]:
    if not isinstance(value, (list, tuple)) or not value:
        raise PolicyError(f"{PARAM}: {what} must be a non-empty list of draft steps, got {value!r}", field=PARAM)
    return sorted({whole(v, f"each of {what}", PARAM, lo=1) for v in value})


class SglangAdaptive(Policy):
    name = "sglang-adaptive"
    max_k_param = PARAM

    def __init__(self, adaptive_config: Any = None, initial_steps: int | None = None) -> None:
        with named(self.name):
            self._setup(adaptive_config, initial_steps)

    def _setup(self, adaptive_config: Any = None, initial_steps: int | None = None) -> None:
        config = {} if adaptive_config is None else load_knob(adaptive_config, PARAM)
        self.config = dict(config)
        self.initial_steps = None if initial_steps is None else whole(initial_steps, "initial_steps",
                                                                      "initial_steps", lo=1)
        slots: dict[int, Any] = {}
        for key, value in config.items():
            if isinstance(key, str) and key.strip().isdigit() or isinstance(key, int) and not isinstance(key, bool):
                slots[batch_key(key, PARAM)] = value
            elif key not in GLOBAL_KEYS:
                raise PolicyError(f"{PARAM}: unknown key '{key}' (SGLang's keys: {', '.join(GLOBAL_KEYS)}, and "
                                  "batch-size keys such as \"64\" for per-batch-size ladders)", field=PARAM)
        self.ema_alpha = number(config.get("ema_alpha", 0.2), "ema_alpha", PARAM)
        if not 0.0 < self.ema_alpha <= 1.0:
            raise PolicyError(f"{PARAM}: ema_alpha must be in (0, 1], got {self.ema_alpha:g}", field=PARAM)
        self.update_interval = whole(config.get("update_interval", 5), "update_interval", PARAM, lo=1)
        self.warmup_batches = whole(config.get("warmup_batches", 10), "warmup_batches", PARAM)
        if slots:
            ignored = [k for k in ("candidate_steps", "down_hysteresis", "up_hysteresis") if k in config]
            if ignored:
                raise PolicyError(f"{PARAM}: {ignored[0]} is ignored by SGLang when batch-size keys are given (each "
                                  "slot has its own steps and hysteresis); drop it or the batch-size keys",
                                  field=PARAM)
            self._slot_specs = {bs: self._slot_spec(bs, entry) for bs, entry in sorted(slots.items())}
        else:
            down, up = (number(config.get(k, d), k, PARAM) for k, d in zip(("down_hysteresis", "up_hysteresis"),
                                                                          DEFAULT_HYSTERESIS))
            self._slot_specs = {1: (_steps(config.get("candidate_steps", DEFAULT_STEPS), "candidate_steps"),
                                    down, up)}
        self._single = not slots
        if slots and self.initial_steps is not None:
            raise PolicyError("initial_steps applies to a single ladder: with batch-size slots SGLang starts each "
                              "slot at the middle of its steps", field="initial_steps")
        self._keys = list(self._slot_specs)
        self._reset()

    def _slot_spec(self, bs: int, entry: Any) -> tuple[list[int], float, float]:
        if not isinstance(entry, dict):
            entry = {"steps": entry}
        unknown = [k for k in entry if k not in SLOT_KEYS]
        if unknown:
            raise PolicyError(f"{PARAM}: batch-size slot \"{bs}\" has an unknown key '{unknown[0]}' (a slot takes "
                              f"{', '.join(SLOT_KEYS)})", field=PARAM)
        if "steps" not in entry:
            raise PolicyError(f"{PARAM}: batch-size slot \"{bs}\" needs its steps", field=PARAM)
        default = DEFAULT_SLOT_HYSTERESIS[max(k for k in DEFAULT_SLOT_HYSTERESIS if k <= bs)]
        down = number(entry.get("down_hysteresis", default[0]), f"slot \"{bs}\" down_hysteresis", PARAM)
        up = number(entry.get("up_hysteresis", default[1]), f"slot \"{bs}\" up_hysteresis", PARAM)
        return _steps(entry["steps"], f"slot \"{bs}\" steps"), down, up

    def _reset(self) -> None:
        """Each slot at its starting step (``initial_steps`` if on a single ladder, else the middle), its EMA
        at that step less one, no verifies yet."""
        initial = self.initial_steps if self._single else None
        specs = list(self._slot_specs.values())
        self._scalars = np.zeros(rules.N_SCALARS)
        self._scalars[[rules.EMA_ALPHA, rules.WARMUP, rules.INTERVAL, rules.PLAYED]] = (
            self.ema_alpha, self.warmup_batches, self.update_interval, -1)
        self._slots = np.zeros((len(specs), rules.STEPS + max(len(steps) for steps, _, _ in specs)))
        for row, (steps, down, up) in zip(self._slots, specs):
            index = steps.index(initial) if initial in steps else len(steps) // 2
            row[[rules.INDEX, rules.EMA, rules.DOWN, rules.UP, rules.N_STEPS]] = (
                index, float(steps[index] - 1), down, up, len(steps))
            row[rules.STEPS:rules.STEPS + len(steps)] = steps

    def state_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The controller's state (scalars, slots: policies/ladder_rules.py) a compiled run reads and moves."""
        return self._scalars, self._slots

    @property
    def ladders(self) -> list[Ladder]:
        """Each slot's ladder, in the order of its batch-size key."""
        return [Ladder(self._slots, i) for i in range(self._slots.shape[0])]

    @property
    def max_k(self) -> int:
        return max(max(steps) for steps, _, _ in self._slot_specs.values())

    def bind(self, k_max: int, cost_model=None) -> None:
        super().bind(k_max, cost_model)
        self._reset()  # a policy object reused for a second run starts afresh

    def slot(self, batch_size: int) -> int:
        """The slot a batch size uses: the largest key <= batch size, else the first."""
        return max(bisect_right(self._keys, batch_size) - 1, 0)

    def choose_k(self, view: BatchView) -> int:
        i = self.slot(view.batch_size)
        if view.explain is not None:
            ladder = Ladder(self._slots, i)
            view.explain.update(rule=f"slot \"{self._keys[i]}\" steps {ladder.steps}",
                                ema_accept_len=round(ladder.ema, 4), verifies=ladder.verifies)
        return rules.play(self._scalars, self._slots, i)

    def observe(self, feedback: StepFeedback) -> None:
        accepted = feedback.accepted_per_sequence
        if accepted is None or not accepted.shape[0]:
            rules.learn(self._scalars, self._slots, 0.0, 0)
            return
        rules.learn(self._scalars, self._slots, float(np.add.reduce(accepted)) / accepted.shape[0], feedback.k)

    def compiled_form(self, max_batch: int, cost_model: CostModelLike | None) -> CompiledForm:
        """The ladder rules over this policy's own state arrays, with each batch size's slot looked up."""
        slot_of_batch = np.array([self.slot(b) for b in range(max_batch + 1)], dtype=np.int64)
        return CompiledForm.ladder(slot_of_batch, self._scalars, self._slots)

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {PARAM: {str(k): v for k, v in self.config.items()}}
        if self.initial_steps is not None:
            params["initial_steps"] = self.initial_steps
        return params
