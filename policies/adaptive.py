"""``adaptive``: learn k online from observed step times and acceptance -- no cost model needed.

A discounted UCB1 bandit (Garivier and Moulines, "On Upper-Confidence Bound Policies
for Switching Bandit Problems", 2011) over the arms k = 0..k_max. After every decode
step, observe() scores the arm that was played by the step's goodput per sequence,

    reward = (accepted + n) / (n * step_time_s),

the tokens each of the n running sequences emitted per second of the step (n = the
sequences that took part, accepted = the draft tokens they kept, step_time_s the
measured step time). Dividing by n keeps a bigger batch from looking like a better
arm. Before each step the policy returns the arm with the largest index

    index(k) = mean(k) / max_j mean(j) + exploration * sqrt(2 ln N / N(k)),

where N(k) is the arm's discounted play count (every count and reward sum is
multiplied by ``discount`` each time the bandit plays), mean(k) its discounted mean
reward, and N = sum_k N(k). Dividing by the best mean makes the index scale-free
(rewards are in tokens per second, whatever the hardware), so ``exploration`` is a
relative margin: an arm 10% worse than the best is re-tried while its bonus exceeds
0.1. Unplayed arms go first, k = 0 upwards; ties go to the smaller k. Nothing is
random: the same run gives the same choices.

``by_batch_size`` (default on) keeps one bandit per power-of-two batch bucket (1, 2-3,
4-7, 8-15, ...), since the best k falls as the batch grows (``lut``); each bucket learns
from its own steps only.

**Switching speculation off.** Serving engines stop speculating when acceptance is
poor. With ``disable_below`` > 0 the policy keeps the acceptance rate accepted /
drafted over the recent speculative steps (the same ``discount``), and when it falls
below ``disable_below`` -- once at least ``probe_steps`` speculative steps have been seen
since the last switch-off -- it returns k = 0 for the next ``cooldown_steps`` steps, then
lets the bandit speculate again. Those k = 0 steps still teach arm 0.

Per step: O(k_max) arithmetic in choose_k and observe, no allocation.
"""

from __future__ import annotations

import math
from typing import Any

from policies.base import BatchView, Policy, PolicyError, StepFeedback


def _whole(value: Any, param: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise PolicyError(f"{param} must be a whole number >= {lo}, got {value!r}", field=param)
    return value


def _number(value: Any, param: str, ok, text: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise PolicyError(f"{param} must be a number {text}, got {value!r}", field=param)
    return float(value)


class _Bandit:
    """Discounted counts and reward sums of the arms 0..k_max."""

    __slots__ = ("counts", "sums")

    def __init__(self, arms: int) -> None:
        self.counts = [0.0] * arms
        self.sums = [0.0] * arms


class Adaptive(Policy):
    name = "adaptive"
    max_k_param = "k_max"

    def __init__(self, k_max: int = 4, discount: float = 0.99, exploration: float = 0.05,
                 by_batch_size: bool = True, disable_below: float = 0.0, cooldown_steps: int = 50,
                 probe_steps: int = 8) -> None:
        self.k_max = _whole(k_max, "k_max", 0)
        self.discount = _number(discount, "discount", lambda v: 0.0 < v <= 1.0, "in (0, 1]")
        self.exploration = _number(exploration, "exploration", lambda v: v >= 0.0, ">= 0")
        if not isinstance(by_batch_size, bool):
            raise PolicyError(f"by_batch_size must be true or false, got {by_batch_size!r}", field="by_batch_size")
        self.by_batch_size = by_batch_size
        self.disable_below = _number(disable_below, "disable_below", lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
        self.cooldown_steps = _whole(cooldown_steps, "cooldown_steps", 1)
        self.probe_steps = _whole(probe_steps, "probe_steps", 1)
        self._reset()

    @property
    def max_k(self) -> int:
        return self.k_max

    def bind(self, k_max: int, cost_model=None) -> None:
        super().bind(k_max, cost_model)  # the cost model is not used
        self._reset()  # a policy object reused for a second run starts afresh

    def _reset(self) -> None:
        self._bandits: dict[int, _Bandit] = {}
        self._played: _Bandit | None = None  # the bandit whose arm the coming step plays
        self._running = 0  # sequences generating in the coming step
        self._cooldown = 0  # steps of forced k = 0 left
        self._accepted = self._drafted = 0.0  # discounted, over speculative steps since the last switch-off
        self._probes = 0  # speculative steps seen since the last switch-off
        self.switch_offs = 0  # how many times the acceptance rule turned speculation off

    def bucket(self, batch_size: int) -> int:
        """The bandit a batch size plays: floor(log2(batch_size)) with by_batch_size, else 0."""
        return batch_size.bit_length() - 1 if self.by_batch_size and batch_size > 0 else 0

    def bandit(self, batch_size: int) -> _Bandit:
        key = self.bucket(batch_size)
        bandit = self._bandits.get(key)
        if bandit is None:
            bandit = self._bandits[key] = _Bandit(self.k_max + 1)
        return bandit

    def means(self, batch_size: int) -> list[float | None]:
        """The discounted mean reward (tokens per sequence per second) of each k, None if unplayed."""
        bandit = self.bandit(batch_size)
        return [s / n if n > 0 else None for s, n in zip(bandit.sums, bandit.counts)]

    def choose_k(self, view: BatchView) -> int:
        bandit = self._played = self.bandit(view.batch_size)
        self._running = view.running
        if self._cooldown > 0:
            self._cooldown -= 1
            return 0
        counts, sums = bandit.counts, bandit.sums
        best_mean = 0.0
        for k, n in enumerate(counts):
            if n <= 0.0:
                return k  # every arm is tried once first, k = 0 upwards
            m = sums[k] / n
            if m > best_mean:
                best_mean = m
        if best_mean <= 0.0:
            return 0
        log_total = 2.0 * math.log(max(sum(counts), 1.0))
        c = self.exploration
        best_k, best = 0, -1.0
        for k, n in enumerate(counts):
            index = sums[k] / n / best_mean + c * math.sqrt(log_total / n)
            if index > best:
                best_k, best = k, index
        return best_k

    def observe(self, feedback: StepFeedback) -> None:
        k, dt = feedback.k, feedback.step_time_s
        # The sequences that took part: drafted / k when the step drafted, else the running count choose_k
        # saw (StepFeedback.batch_size is the charged size, padding included under static batching).
        n = feedback.drafted_tokens // k if k > 0 else self._running or feedback.batch_size
        if n <= 0 or not dt > 0.0 or k > self.k_max:
            return
        bandit = self._played or self.bandit(feedback.batch_size)
        self._played = None
        g = self.discount
        counts, sums = bandit.counts, bandit.sums
        for j in range(len(counts)):
            counts[j] *= g
            sums[j] *= g
        counts[k] += 1.0
        sums[k] += (feedback.accepted_tokens + n) / (n * dt)
        if self.disable_below > 0.0 and k > 0 and feedback.drafted_tokens > 0:
            self._accepted = g * self._accepted + feedback.accepted_tokens
            self._drafted = g * self._drafted + feedback.drafted_tokens
            self._probes += 1
            if self._probes >= self.probe_steps and self._accepted < self.disable_below * self._drafted:
                self._cooldown = self.cooldown_steps
                self._accepted = self._drafted = 0.0
                self._probes = 0
                self.switch_offs += 1

    def params(self) -> dict[str, Any]:
        return {"k_max": self.k_max, "discount": self.discount, "exploration": self.exploration,
                "by_batch_size": self.by_batch_size, "disable_below": self.disable_below,
                "cooldown_steps": self.cooldown_steps, "probe_steps": self.probe_steps}
