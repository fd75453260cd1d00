"""``goodput``: SmartSpec (arXiv 2406.14066) -- each step, the k with the most expected goodput.

For the batch about to run (b sequences charged, mean context c) and the current
estimate alpha_hat of the per-token acceptance rate,

    goodput(k) = b * E[tokens](alpha_hat, k) / step_time(b, k, c),
    E[tokens](a, k) = (1 - a^(k+1)) / (1 - a) = 1 + a + ... + a^k,

and the policy returns the k in 0..k_max with the largest goodput; a larger k wins
over the best smaller one only if it is better by more than ``tie_break`` (relative),
so exact ties go to the smaller k (and to k = 0).

alpha_hat is estimated online: after every step that drafted (k >= 1), observe()
updates exponential moving averages (weight ``smoothing`` on the newest step) of
the accepted tokens per sequence and of the *tested* tokens per sequence,

    tested = accepted + rejected,   rejected = sequences that kept fewer than k tokens,

and alpha_hat = EMA(accepted) / EMA(tested), starting from alpha_init (as one tested
token per sequence). Under the geometric acceptance model E[accepted] = alpha *
E[tested] for every k and batch size, so alpha_hat settles at alpha. The plain
accepted / drafted (vLLM's "acceptance rate") would not: the tokens after a rejection
are drafted but never tested, so it settles at (a + ... + a^k) / k, 0.48 instead of
0.6 at k = 2; and an average of per-step ratios is biased at small batch (0.48 again
for one sequence at k = 2).

Per-request variant (``per_request = true``): the engine's acceptance is a property
of each request that only the engine knows, so the policy has no per-sequence alpha to
optimise against. What it does know per sequence is how many tokens each still has to
emit, and drafting past a request's end is pure waste. So it first takes the batch
argmax k* above (the padded step is charged at max k_i, which is k* whenever some
sequence can use k* tokens) and then gives each sequence

    k_i = min(k*, remaining_i - 1),

remaining_i being the tokens sequence i still has to emit: a step emits at most
k_i + 1 of them, so k_i = remaining_i - 1 can finish the request and no more is ever
useful. The answer is an int64 array (one k per running sequence), which the engine
runs as a ragged step (see ``sim.serving.loop``: padded to max k_i, each sequence keeping
at most its own k_i); when every k_i equals k* it returns the int k* instead.
observe() then counts, per sequence that drafted, a rejection where it kept fewer
than its own k_i.

Per step: k_max + 1 step_time calls and arithmetic. E[tokens] is summed up in the
same loop (one multiply and one add per k), which is cheaper than keeping a cache per
k that every speculative step's new alpha_hat would invalidate anyway.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from policies.base import BatchView, CostModelLike, Policy, PolicyError, StepFeedback, check_k_max

_SMALL_BATCH = 64  # up to here a Python list count beats numpy's per-call overhead


def _number(value: Any, param: str, lo: float, hi: float, lo_open: bool, hi_open: bool, text: str) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        raise PolicyError(f"{param} must be a number {text}, got {value!r}", field=param)
    return float(value)


class Goodput(Policy):
    name = "goodput"
    max_k_param = "k_max"

    def __init__(self, alpha_init: float = 0.7, smoothing: float = 0.1, k_max: int = 4,
                 tie_break: float = 0.0, per_request: bool = False) -> None:
        self.alpha_init = _number(alpha_init, "alpha_init", 0.0, 1.0, True, True, "inside (0, 1)")
        self.smoothing = _number(smoothing, "smoothing", 0.0, 1.0, True, False, "in (0, 1]")
        self.k_max = check_k_max(k_max)
        self.tie_break = _number(tie_break, "tie_break", 0.0, math.inf, False, True, ">= 0")
        if not isinstance(per_request, bool):
            raise PolicyError(f"per_request must be true or false, got {per_request!r}", field="per_request")
        self.per_request = per_request
        self._step_time = None
        self._candidates = tuple(range(1, k_max + 1))
        self._margin = 1.0 + self.tie_break
        self._reset()

    @property
    def max_k(self) -> int:
        return self.k_max

    def bind(self, k_max: int, cost_model: CostModelLike | None = None) -> None:
        super().bind(k_max, cost_model)
        if cost_model is None:
            raise PolicyError("goodput prices every candidate k with a cost model, and none was given",
                              field="name")
        self._step_time = cost_model.step_time
        # The draft's catch-up (see the module docstring); a cost model without it prices none.
        self._catch_up = getattr(cost_model, "catch_up_time", None) if self.k_max > 0 else None
        self._reset()  # a policy object reused for a second run starts afresh

    def _reset(self) -> None:
        # The prior: one tested token per sequence, accepted with probability alpha_init.
        self._accepted_avg, self._tested_avg = self.alpha_init, 1.0
        self._alpha = self.alpha_init

    @property
    def alpha_hat(self) -> float:
        """The current estimate of the per-token acceptance rate."""
        return self._alpha

    def expected_goodput(self, batch_size: int, k: int, context_tokens: float, max_lag: int = 1) -> float:
        """batch_size * E[tokens](alpha_hat, k) / the step's price: generated tokens per second of this step."""
        a = self._alpha
        return batch_size * (1.0 - a ** (k + 1)) / (1.0 - a) / self.priced_time(batch_size, k, context_tokens, max_lag)

    def priced_time(self, batch_size: int, k: int, context_tokens: float, max_lag: int = 1) -> float:
        """What the engine charges for the step: step_time, plus the draft's catch-up when k >= 1."""
        t = self._step_time(batch_size, k, context_tokens)
        if k and max_lag > 1 and self._catch_up is not None:
            t += self._catch_up(batch_size, max_lag, context_tokens)
        return t

    def choose_k(self, view: BatchView) -> int | np.ndarray:
        b, c, step_time, a = view.batch_size, view.mean_context_tokens, self._step_time, self._alpha
        catch_up = 0.0  # what a speculative step pays on top for the tokens the draft has not seen
        if self._catch_up is not None:
            lag = view.max_lag
            if lag > 1:
                catch_up = self._catch_up(b, lag, c)
        # b multiplies every candidate alike, so the argmax compares E[tokens] / step_time.
        best_k, best = 0, 1.0 / step_time(b, 0, c)
        term = expected = 1.0  # E[tokens](a, k) = 1 + a + ... + a^k, built up as k grows
        margin = self._margin
        explain = view.explain
        if explain is not None:
            explain.update(alpha_hat=round(a, 6), max_lag=view.max_lag if self._catch_up else None,
                           catch_up_ms=round(catch_up * 1e3, 6), tokens_per_s={"0": round(b * best, 3)})
        for k in self._candidates:
            term *= a
            expected += term
            g = expected / (step_time(b, k, c) + catch_up)
            if explain is not None:
                explain["tokens_per_s"][str(k)] = round(b * g, 3)
            if g > best * margin:
                best_k, best = k, g
        if best_k and self.per_request:
            return self.per_sequence_k(view, best_k)
        return best_k

    @staticmethod
    def per_sequence_k(view: BatchView, best_k: int) -> int | np.ndarray:
        """k_i = min(k*, remaining_i - 1) for the batch argmax k*: never drafts past a request's end."""
        remaining = view.remaining_tokens  # >= 1 for every running sequence
        if np.minimum.reduce(remaining) > best_k:
            return best_k  # every sequence can use all k* tokens: a uniform step
        return np.minimum(remaining - 1, best_k)

    def observe(self, feedback: StepFeedback) -> None:
        k, drafted = feedback.k, feedback.drafted_tokens
        if k == 0 or drafted == 0:
            return
        accepted, per_sequence = feedback.accepted_tokens, feedback.accepted_per_sequence
        ks = getattr(feedback, "k_per_sequence", None)
        if ks is not None:  # a ragged step: only sequences that drafted tested anything
            drafting = ks > 0
            n = int(np.count_nonzero(drafting))
            tested = accepted + int(np.count_nonzero(drafting & (per_sequence < ks)))
            self._update(accepted, tested, n)
            return
        n = drafted // k  # sequences in the step
        # A sequence that kept fewer than k tokens saw a rejection (one more tested token); one
        # that kept all k saw none. Count the latter the cheapest exact way for the batch's size.
        if per_sequence is None or per_sequence.shape[0] != n:  # a driver that reports only totals
            tested = drafted  # fall back to accepted / drafted
        elif n <= _SMALL_BATCH:
            tested = accepted + n - per_sequence.tolist().count(k)
        else:
            tested = accepted + n - int(np.bincount(per_sequence, minlength=k + 1)[k])
        s = self.smoothing  # _update, inlined on the per-step path
        a = self._accepted_avg = self._accepted_avg + s * (accepted / n - self._accepted_avg)
        t = self._tested_avg = self._tested_avg + s * (tested / n - self._tested_avg)
        self._alpha = a / t

    def _update(self, accepted: int, tested: int, n: int) -> None:
        s = self.smoothing
        a = self._accepted_avg = self._accepted_avg + s * (accepted / n - self._accepted_avg)
        t = self._tested_avg = self._tested_avg + s * (tested / n - self._tested_avg)
        self._alpha = a / t

    def params(self) -> dict[str, Any]:
        params = {"alpha_init": self.alpha_init, "smoothing": self.smoothing, "k_max": self.k_max,
                  "tie_break": self.tie_break}
        if self.per_request:  # only when on, so that records of batch-level runs stay as they were
            params["per_request"] = True
        return params
