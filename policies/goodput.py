"""``goodput``: SmartSpec (arXiv 2406.14066) -- each step, the k with the most expected goodput.

For the batch about to run (b sequences charged, mean context c) and the current
estimates r_j of the acceptance rate at draft position j (the chance that a sequence
keeps its j-th draft token given that it kept the first j - 1),

    goodput(k) = b * E[tokens](k) / step_time(b, k, c),
    E[tokens](k) = 1 + r_1 + r_1 r_2 + ... + r_1 ... r_k,

which is 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) when every r_j is one rate a
(geometric acceptance). Real engines' acceptance falls with position, faster than any
one rate, so pricing k with one pooled rate over-prices long speculation there.

step_time(b, k, c) of a k >= 1 adds the draft's catch-up, the emitted tokens it has not seen:
whole up to a lag of 2 (it recurs every speculative step), and beyond it, the debt k = 0 steps
pile up, spread over the steps paying it opens (goodput_rules.spread_catch_up): priced whole,
it kept the policy at k = 0 until the lagging rows finished (docs/policy-goodput.md).

The policy returns the k in 0..k_max with the largest goodput; a larger k wins
over the best smaller one only if it is better by more than ``tie_break`` (relative),
so exact ties go to the smaller k (and to k = 0).

alpha_hat is estimated online: after every step that drafted (k >= 1), observe()
updates exponential moving averages (weight ``smoothing`` on the newest step) of
the accepted tokens per sequence and of the *tested* tokens per sequence,

    tested = accepted + rejected,   rejected = sequences that kept fewer than k tokens,

and alpha_hat = EMA(accepted) / EMA(tested), starting from alpha_init (as one tested
token per sequence): the pooled estimate. Under the geometric acceptance model E[accepted] = alpha *
E[tested] for every k and batch size, so alpha_hat settles at alpha. The plain
accepted / drafted (vLLM's "acceptance rate") would not: the tokens after a rejection
are drafted but never tested, so it settles at (a + ... + a^k) / k, 0.48 instead of
0.6 at k = 2; and an average of per-step ratios is biased at small batch (0.48 again
for one sequence at k = 2).

Per position, the same idea: position j was *tested* by the sequences that drafted at
least j tokens and kept the first j - 1, and *accepted* by those that kept it; EMAs of
both counts (weight ``smoothing``, every position updated at every drafting step, so the
evidence of a position no longer reached fades) give

    r_j = (EMA(accepted_j) + p * alpha_hat) / (EMA(tested_j) + p),   p = PRIOR_TESTS * smoothing,

each position's own rate shrunk towards the pooled alpha_hat, which counts as PRIOR_TESTS
tests (EMA(tested_j) / smoothing is the EMA's effective number of tests). A position
with little evidence is priced near alpha_hat: before anything is observed every
position is exactly, so a run starts as the geometric pricing did, and a position that
stops being reached drifts back to it. Shrinking rather than switching keeps the noise
of a few tests out of the prices. A decode step at k = 0 tests nothing; it moves alpha_hat's
EMAs towards the prior and fades every position's evidence by the same weight
(goodput_rules.fade), so early rejections cannot hold the policy at k = 0 for good.
Under geometric acceptance every r_j settles at alpha.

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

Per step: k_max + 1 step_time calls and arithmetic; E[tokens] for every k is worked
out once per observed step (a cumulative product and sum over k_max positions), not
per choice. observe() counts positions with one np.bincount over the accepted counts.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from policies import goodput_rules as rules
from policies.base import BatchView, CompiledForm, CostModelLike, Policy, PolicyError, StepFeedback, check_k_max
from policies.goodput_rules import (ACCEPTED_AVG, ALPHA, ALPHA_INIT, EXPECTED, MARGIN, MISSES, PRIOR, RATES, SMOOTHING,
                                   TESTED_AVG)

# Each position's estimate counts the pooled alpha_hat as this many tests on top of its own
# evidence (EMA(tested_j) / smoothing tests' worth): a position with little evidence is priced
# near alpha_hat, one with much at its own rate.
PRIOR_TESTS = 5.0


def _number(value: Any, param: str, lo: float, hi: float, lo_open: bool, hi_open: bool, text: str) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        raise PolicyError(f"{param} must be a number {text}, got {value!r}", field=param)
    return float(value)


class Goodput(Policy):
    """The module docstring; its learnt state lives in two arrays (policies/goodput_rules.py),
    which :meth:`state_arrays` hands to a compiled run to read and update in place."""

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
        self.step_time = None  # the cost model's step price (bind)
        self.catch_up_time = None  # ... and the draft's catch-up, when it prices one
        self._prices = np.zeros(self.k_max + 1)
        self._scratch = np.zeros((2, self.k_max + 2), dtype=np.int64)
        self._reset()

    @property
    def max_k(self) -> int:
        return self.k_max

    def bind(self, k_max: int, cost_model: CostModelLike | None = None) -> None:
        super().bind(k_max, cost_model)
        if cost_model is None:
            raise PolicyError("goodput prices every candidate k with a cost model, and none was given",
                              field="name")
        self.step_time = cost_model.step_time
        # The draft's catch-up (see the module docstring); a cost model without it prices none.
        self.catch_up_time = getattr(cost_model, "catch_up_time", None) if self.k_max > 0 else None
        # A host matcher (n-gram, suffix) proposes only where the context matches: its misses are learnt.
        self._misses = getattr(cost_model, "drafter_kind", "model") == "host"
        self._reset()  # a policy object reused for a second run starts afresh

    def _reset(self) -> None:
        scalars = self._scalars = np.zeros(rules.N_SCALARS)
        # The prior: one tested token per sequence, accepted with probability alpha_init.
        scalars[ACCEPTED_AVG], scalars[TESTED_AVG], scalars[ALPHA] = self.alpha_init, 1.0, self.alpha_init
        scalars[SMOOTHING], scalars[PRIOR] = self.smoothing, PRIOR_TESTS * self.smoothing  # PRIOR in the EMAs' units
        scalars[MARGIN] = 1.0 + self.tie_break
        scalars[MISSES] = 1.0 if getattr(self, "_misses", False) else 0.0
        scalars[ALPHA_INIT] = self.alpha_init
        # Per position j = 1..k_max: EMAs of the sequences that tested j and that accepted it (none yet).
        self._rows = np.zeros((rules.N_ROWS, self.k_max + 1))
        rules.price_positions(self._scalars, self._rows, self.k_max)

    def state_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The learnt state (scalars, per-position rows) a compiled run reads and updates in place."""
        return self._scalars, self._rows

    def compiled_form(self, max_batch: int, cost_model: CostModelLike | None) -> CompiledForm | None:
        """goodput's rule over its state arrays, when bound to ``cost_model`` (a compiled run prices with
        that model's own table) and batch-level (``per_request`` answers per sequence)."""
        if (self.per_request or cost_model is None or self.step_time != cost_model.step_time
                or self.catch_up_time not in (None, getattr(cost_model, "catch_up_time", None))):
            return None
        return CompiledForm.goodput(self._scalars, self._rows, self.catch_up_time is not None, self.k_max)

    @property
    def alpha_hat(self) -> float:
        """The pooled estimate of the per-token acceptance rate."""
        return float(self._scalars[ALPHA])

    @property
    def position_rates(self) -> np.ndarray:
        """r_j, j = 1..k_max, as priced: each position's own estimate, or alpha_hat where evidence is short."""
        return self._rows[RATES, :self.k_max].copy()

    def expected_tokens(self, k: int) -> float:
        """E[tokens](k) = 1 + r_1 + r_1 r_2 + ... + r_1 ... r_k: what one sequence is expected to emit."""
        return float(self._rows[EXPECTED, k])

    def expected_goodput(self, batch_size: int, k: int, context_tokens: float, max_lag: int = 1) -> float:
        """batch_size * E[tokens](k) / the step's price: generated tokens per second of this step."""
        return batch_size * self.expected_tokens(k) / self.priced_time(batch_size, k, context_tokens, max_lag)

    def priced_time(self, batch_size: int, k: int, context_tokens: float, max_lag: int = 1) -> float:
        """What the engine charges for the step: step_time, plus the draft's catch-up when k >= 1."""
        t = self.step_time(batch_size, k, context_tokens)
        if k and max_lag > 1 and self.catch_up_time is not None:
            t += self.catch_up_time(batch_size, max_lag, context_tokens)
        return t

    def choose_k(self, view: BatchView) -> int | np.ndarray:
        b, c, step_time, prices = view.batch_size, view.mean_context_tokens, self.step_time, self._prices
        catch_up = recurring = 0.0  # what the next speculative step pays for the tokens the draft has not seen
        horizon = 0.0  # ... and the tokens each row has left to use the speculation it buys
        if self.catch_up_time is not None:
            lag = view.max_lag
            if lag > 1:
                catch_up = self.catch_up_time(b, lag, c)
                recurring = catch_up if lag == 2 else self.catch_up_time(b, 2, c)
                remaining = view.remaining_tokens
                if remaining.shape[0]:
                    horizon = int(np.add.reduce(remaining)) / remaining.shape[0]
        for k in range(self.k_max + 1):
            prices[k] = step_time(b, k, c)
        expected = self._rows[EXPECTED]
        best_k = rules.choose_priced(prices, expected, catch_up, recurring, horizon, self._scalars[MARGIN], self.k_max)
        if view.explain is not None:  # b multiplies every candidate alike; the timeline shows tokens/s
            view.explain.update(alpha_hat=round(self.alpha_hat, 6),
                                position_rates=[round(r, 6) for r in self.position_rates.tolist()],
                                max_lag=view.max_lag if self.catch_up_time else None,
                                catch_up_ms=round(catch_up * 1e3, 6),
                                tokens_per_s={str(k): round(b * float(expected[k] / prices[k]), 3)
                                              for k in range(self.k_max + 1)})
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
        if k == 0:  # nothing tested: the estimates drift back towards the prior (goodput_rules.fade)
            rules.fade(self._scalars, self._rows, self.k_max)
            return
        if drafted == 0 and not self._scalars[MISSES]:
            return
        per_sequence, ks = feedback.accepted_per_sequence, feedback.k_per_sequence
        if ks is None and (per_sequence is None or per_sequence.shape[0] != drafted // k):
            # A driver that reports only totals: accepted / drafted, and nothing per position.
            rules.update_pooled(self._scalars, feedback.accepted_tokens, drafted, drafted // k)
            rules.price_positions(self._scalars, self._rows, self.k_max)
            return
        m = per_sequence.shape[0]
        ks = np.full(m, k, dtype=np.int64) if ks is None else ks
        rules.observe_rows(self._scalars, self._rows, per_sequence, ks, m, self.k_max, self._scratch)

    def params(self) -> dict[str, Any]:
        params = {"alpha_init": self.alpha_init, "smoothing": self.smoothing, "k_max": self.k_max,
                  "tie_break": self.tie_break}
        if self.per_request:  # only when on, so that records of batch-level runs stay as they were
            params["per_request"] = True
        return params
