"""goodput's choice and its learning, as rules: plain functions over its state's arrays.

:class:`policies.goodput.Goodput` calls them step by step; the simulator's compiled runs
(sim/serving/kernel.py) call the same functions, compiled by numba, on the same arrays (the
policy hands them over with :meth:`~policies.goodput.Goodput.state_arrays`), so there is one
implementation of each (sim/jit.py). The formulas are policies/goodput.py's docstring.

State: ``scalars`` (the EMAs, alpha_hat, the parameters) and ``rows[field, j]`` (per position
j = 1..k_max: the EMAs of accepted and tested, the rates r_j; and E[tokens](k), k = 0..k_max).

``MISSES`` (1 for a host matcher's run, n-gram or suffix): a row that proposed nothing in a step
the policy offered k counts as tested at position 1 and rejected, so r_1 is the chance a row both
matches and keeps its first guess, and E[tokens](k) prices the method's own acceptance.
"""

from __future__ import annotations

ACCEPTED_AVG, TESTED_AVG, ALPHA, SMOOTHING, PRIOR, MARGIN, MISSES, ALPHA_INIT = range(8)
N_SCALARS = 8
# A decode step at k = 0 pulls the estimates back towards the prior by this fraction of an observation's
# weight (fade): slowly enough that where speculation truly loses, goodput tries it again only every
# ten steps or so, and fast enough that a few unlucky rejections do not end it for the run.
FADE = 0.25
POS_ACCEPTED, POS_TESTED, RATES, EXPECTED = range(4)
N_ROWS = 4


def best_k(expected, prices, margin, k_max):
    """The k with the most expected tokens per second of step (``prices[k]``: the step's price at k);
    a larger k wins only by more than the margin, so ties go to the smaller k."""
    best = 1.0 / prices[0]  # E[tokens](0) = 1
    chosen = 0
    for k in range(1, k_max + 1):
        g = expected[k] / prices[k]
        if g > best * margin:
            chosen = k
            best = g
    return chosen


def spread_catch_up(prices, expected, recurring, debt, horizon, k_max):
    """Add the draft's catch-up to the price of every k >= 1: ``recurring`` whole, ``debt`` spread.

    The catch-up feeds the draft every emitted token it has not seen. Up to a lag of 2 it recurs on
    every speculative step (a row that kept all its drafts lags 2): ``recurring``, priced whole. Each
    k = 0 step adds one token per row beyond that: ``debt``, paid once by the next speculative step,
    and not avoided by another k = 0 step, only deferred and grown. Priced whole, it would keep the
    policy at k = 0 until the lagging rows finish; what it buys is speculation for the rest of the
    batch's rows, ``horizon`` tokens each (their mean remaining), about horizon / E[tokens](k) steps
    at k, so each of those steps carries E[tokens](k) / horizon of it (all of it when fewer tokens
    than one step's are left, or when the horizon is unknown: 0)."""
    for k in range(1, k_max + 1):
        share = 1.0
        if expected[k] < horizon:
            share = expected[k] / horizon
        prices[k] += recurring + debt * share


def choose_priced(prices, expected, catch_up, recurring, horizon, margin, k_max):
    """goodput's k, given each candidate's step price (``prices[k]``, the cost model's): the draft's
    catch-up (``catch_up``, of which ``recurring`` recurs; 0: none) is added as
    :func:`spread_catch_up` says, then the best k. The Python policy and the compiled runs both call it."""
    if catch_up:
        spread_catch_up(prices, expected, recurring, catch_up - recurring, horizon, k_max)
    return best_k(expected, prices, margin, k_max)


def price_positions(scalars, rows, k_max):
    """r_j, each position's estimate shrunk towards alpha_hat, and E[tokens](k) = 1 + r_1 + r_1 r_2 + ..."""
    shrink = scalars[PRIOR] * scalars[ALPHA]
    prior = scalars[PRIOR]
    product = 1.0
    total = 0.0
    rows[EXPECTED, 0] = 1.0
    for j in range(k_max):
        r = (rows[POS_ACCEPTED, j] + shrink) / (rows[POS_TESTED, j] + prior)
        rows[RATES, j] = r
        product *= r
        total += product
        rows[EXPECTED, j + 1] = 1.0 + total


def update_pooled(scalars, accepted, tested, n):
    """The EMAs of accepted and tested tokens per sequence, and alpha_hat their ratio."""
    s = scalars[SMOOTHING]
    a = scalars[ACCEPTED_AVG] + s * (accepted / n - scalars[ACCEPTED_AVG])
    t = scalars[TESTED_AVG] + s * (tested / n - scalars[TESTED_AVG])
    scalars[ACCEPTED_AVG] = a
    scalars[TESTED_AVG] = t
    scalars[ALPHA] = a / t


def observe_rows(scalars, rows, kept, ks, m, k_max, scratch):
    """Learn from a step whose m rows drafted ``ks[i]`` and kept ``kept[i]`` tokens (a row with
    k = 0 drafted nothing). Position j was tested by the rows that drafted at least j and kept
    the first j - 1; a row that kept fewer than its own k saw one rejection. ``scratch``: 2 x
    (k_max + 2) ints."""
    for j in range(k_max + 2):
        scratch[0, j] = 0  # rows that kept exactly j
        scratch[1, j] = 0  # rows that kept all of their own k = j
    accepted = 0
    n = 0
    full = 0
    misses = scalars[MISSES] > 0
    for i in range(m):
        k = ks[i]
        a = kept[i] if k > 0 else 0
        scratch[0, a] += 1
        accepted += a
        if a == k and (k > 0 or not misses):
            scratch[1, a] += 1
        if k > 0 or misses:
            n += 1
            if a == k and k > 0:
                full += 1
    if n == 0:
        return
    update_pooled(scalars, accepted, accepted + n - full, n)
    s = scalars[SMOOTHING]
    at_least = 0
    for j in range(k_max + 1, -1, -1):
        at_least += scratch[0, j]  # rows that kept j or more
        if j <= k_max and j >= 1:
            rows[POS_ACCEPTED, j - 1] += s * (at_least - rows[POS_ACCEPTED, j - 1])
        if j < k_max:
            tested = at_least - scratch[1, j]
            rows[POS_TESTED, j] += s * (tested - rows[POS_TESTED, j])
    price_positions(scalars, rows, k_max)


def fade(scalars, rows, k_max):
    """A decode step at k = 0 tests no draft, yet it must not leave the estimates where the last
    drafting steps put them: a few unlucky rejections (three for one row) would then price every
    k >= 1 below k = 0 for the rest of the run, and no later step would ever test that again
    (docs/policy-goodput.md). So such a step moves the pooled EMAs towards the prior (alpha_init
    of one tested token) and lets each position's evidence fade, by FADE of an observation's
    weight: the estimates drift back until speculation is priced worth a try, and the try is a
    fresh observation. Where k = 0 wins on price with the estimates at the prior, nothing changes."""
    s = FADE * scalars[SMOOTHING]
    scalars[ACCEPTED_AVG] += s * (scalars[ALPHA_INIT] - scalars[ACCEPTED_AVG])
    scalars[TESTED_AVG] += s * (1.0 - scalars[TESTED_AVG])
    scalars[ALPHA] = scalars[ACCEPTED_AVG] / scalars[TESTED_AVG]
    for j in range(k_max):
        rows[POS_ACCEPTED, j] -= s * rows[POS_ACCEPTED, j]
        rows[POS_TESTED, j] -= s * rows[POS_TESTED, j]
    price_positions(scalars, rows, k_max)


RULES = (best_k, spread_catch_up, choose_priced, price_positions, update_pooled, observe_rows, fade)
