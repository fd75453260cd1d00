"""The compiled decode run (:mod:`sim.serving.compiled` says when and why; imported only there).

Each step is :meth:`ServingLoop._choose_k` + ``PricedBackend.decode`` + ``_apply_decode`` +
``_retire`` written row by row, with the same float operations in the same order, so its
records are the step-by-step loop's to the bit; for ``goodput`` the same holds of
``Goodput.choose_k`` and ``Goodput.observe`` (:func:`_goodput_k`, :func:`_goodput_observe`).
Keep the two in step: a change to one is a change to the other (``tests/test_decode_runs.py``
fails otherwise).
"""

from __future__ import annotations

from numba import njit

from sim.serving.decode_state import (ACCEPTED_AVG, ADMIT, ALPHA, ARRIVAL, DECODE_COUNT, DRAW_POS, EXPECTED, FRESH,
                                      GOODPUT_K, IDLE, ITL_END, ITL_POS, K_SUM, KV_USED, LAST_DECODE_END, LIMIT, MARGIN,
                                      NOW, PENDING_END, POS_ACCEPTED, POS_RATES, POS_TESTED, POSITIONS, PRICES_CATCH_UP,
                                      PRIOR, REC_END, REC_POS, REFILL, RUNNING, SHARED, SMOOTHING, STEPS, TESTED_AVG,
                                      TOTAL_FINAL_CONTEXT, TOTAL_REMAINING)
from sim.serving.records import DECODE

# Rows of the loop's int block (ServingLoop._int_rows) and float block.
REQ, REMAINING, FINAL_CONTEXT, ACCEPTED, JOINED_STEP, JOINED_K, LAG = range(7)
SCALE, FIRST_TOKEN = range(2)


@njit(cache=True, nogil=True)
def _blend(row, x):
    """sim.costmodel._blend."""
    j = int(x)
    if j >= row.shape[0] - 1:
        return row[row.shape[0] - 1]
    lo = row[j]
    return lo + (x - j) * (row[j + 1] - lo)


@njit(cache=True, nogil=True)
def _catch_up(rows, lag, x):
    """StepTable.catch_up_time for one batch size's rows."""
    if lag < rows.shape[0]:
        return _blend(rows[lag], x)
    top = rows.shape[0] - 1
    at_top = _blend(rows[top], x)
    slope = at_top - _blend(rows[top - 1], x)
    return at_top + (lag - top) * slope


@njit(cache=True, nogil=True)
def _goodput_k(gp, gp_rows, decode, catch_up, charged, x, lag):
    """Goodput.choose_k (batch-level): the k with the most expected tokens per second of step."""
    extra = 0.0
    if gp[PRICES_CATCH_UP] != 0.0 and lag > 1:
        extra = _catch_up(catch_up[charged], lag, x)
    expected = gp_rows[EXPECTED]
    best_k = 0
    best = 1.0 / _blend(decode[charged, 0], x)
    margin = gp[MARGIN]
    for k in range(1, expected.shape[0]):
        g = expected[k] / (_blend(decode[charged, k], x) + extra)
        if g > best * margin:
            best_k = k
            best = g
    return best_k


@njit(cache=True, nogil=True)
def _goodput_observe(gp, gp_rows, kept, k, n, accepted):
    """Goodput.observe for a uniform step at k >= 1 of n sequences, ``kept[m]`` of which kept m drafts;
    then Goodput._price_positions."""
    k_max = gp_rows.shape[1] - 1
    s = gp[SMOOTHING]
    tested = accepted + n - kept[k]
    a = gp[ACCEPTED_AVG] = gp[ACCEPTED_AVG] + s * (accepted / n - gp[ACCEPTED_AVG])
    t = gp[TESTED_AVG] = gp[TESTED_AVG] + s * (tested / n - gp[TESTED_AVG])
    alpha = gp[ALPHA] = a / t
    at_least = kept[k_max + 1]  # sequences that kept more than k_max drafts: none
    for m in range(k_max, 0, -1):
        at_least += kept[m]  # at_least[m]: sequences that kept m drafts or more
        j = m - 1  # position m's column
        gp_rows[POS_ACCEPTED, j] += s * (at_least - gp_rows[POS_ACCEPTED, j])
        # position m was tested by those that kept m - 1 or more, where it was drafted (m <= k)
        tested_m = at_least + kept[m - 1] if m <= k else 0
        gp_rows[POS_TESTED, j] += s * (tested_m - gp_rows[POS_TESTED, j])
    prior = gp[PRIOR]
    shrink = prior * alpha
    product = 1.0  # the cumulative product and sum of Goodput._price_positions (1.0 * r and 0.0 + p are exact)
    total = 0.0
    for j in range(k_max):
        r = (gp_rows[POS_ACCEPTED, j] + shrink) / (gp_rows[POS_TESTED, j] + prior)
        gp_rows[POS_RATES, j] = r
        product *= r
        total += product
        gp_rows[EXPECTED, j + 1] = 1.0 + total


@njit(cache=True, nogil=True)
def decode_run(ints, floats, st, ft, k_by_batch, static_charged, decode, lag2, catch_up, context_step, kind,
               draws_i, draws_f, neg_rates, counts, track_lag,
               finish_s, decode_steps, drafted_req, accepted_req, kv_reserve, records, itl_values, itl_weights,
               stop_at, waiting, max_steps, policy_kind, gp, gp_rows, kept_count):
    """Decode steps until a stop (sim.serving.compiled); returns the reason. ``st``/``ft`` carry the
    loop's scalars in and out; rows, request arrays and records are updated in place. A step that
    would end at or after ``stop_at`` is not taken: its end is left in ``ft[PENDING_END]``."""
    n_draws = draws_i.shape[0] if kind == SHARED else draws_f.shape[0]
    n_rates = neg_rates.shape[0]
    now = ft[NOW]
    while True:
        b = st[RUNNING]
        if b == 0:
            return IDLE
        if st[STEPS] >= max_steps:
            return LIMIT
        if st[REC_POS] >= st[REC_END] or st[ITL_POS] + b + 1 > st[ITL_END] or st[DRAW_POS] + b > n_draws:
            return REFILL
        charged = b if static_charged == 0 else static_charged
        mean_context = (st[TOTAL_FINAL_CONTEXT] - st[TOTAL_REMAINING]) / b
        x = mean_context / context_step
        lag = 1
        if track_lag:
            for i in range(b):
                if ints[LAG, i] > lag:
                    lag = ints[LAG, i]
        if policy_kind == GOODPUT_K:
            k = _goodput_k(gp, gp_rows, decode, catch_up, charged, x, lag)
        else:
            k = k_by_batch[charged]
        if k == 0:
            dt = _blend(decode[charged, 0], x)
        else:
            if lag <= 1:
                dt = _blend(decode[charged, k], x)
            elif lag == 2:
                dt = _blend(lag2[charged, k], x)
            else:
                dt = _blend(decode[charged, k], x) + _catch_up(catch_up[charged], lag, x)
        end = now + dt
        if end >= stop_at:
            ft[PENDING_END] = end
            return ARRIVAL
        # the draws and the rows (ServingLoop._apply_decode)
        pos = st[DRAW_POS]
        accepted_total = 0
        emitted_total = b
        finishing = False
        if policy_kind == GOODPUT_K:
            kept_count[:] = 0
        for i in range(b):
            if k:
                if kind == SHARED:
                    a = draws_i[pos + i]
                    if a > k:
                        a = k
                elif kind == POSITIONS:
                    u = draws_f[pos + i]
                    a = 0
                    while a < n_rates and neg_rates[a] < u:
                        a += 1
                    if a > k:
                        a = k
                else:
                    v = draws_f[pos + i] * floats[SCALE, i]
                    if v > k:
                        v = k
                    a = int(v)
                counts[a] += 1
                if policy_kind == GOODPUT_K:
                    kept_count[a] += 1
                ints[ACCEPTED, i] += a
                accepted_total += a
                left = ints[REMAINING, i] - (a + 1)
                if track_lag:
                    ints[LAG, i] = 2 if a == k else 1
            else:
                left = ints[REMAINING, i] - 1
                if track_lag:
                    ints[LAG, i] += 1
            if left <= 0:
                finishing = True
                if left < 0:
                    emitted_total += left  # surplus tokens past the request's end are wasted
                    left = 0
            ints[REMAINING, i] = left
        if k:
            st[DRAW_POS] = pos + b
        emitted_total += accepted_total
        st[TOTAL_REMAINING] -= emitted_total
        st[DECODE_COUNT] += 1
        st[K_SUM] += k
        fresh = st[FRESH]
        steady = b - fresh
        j = st[ITL_POS]
        if steady:
            itl_values[j] = end - ft[LAST_DECODE_END]
            itl_weights[j] = steady
            j += 1
        if fresh:
            for i in range(steady, b):
                itl_values[j] = end - floats[FIRST_TOKEN, i]
                itl_weights[j] = 1
                j += 1
            st[FRESH] = 0
        st[ITL_POS] = j
        ft[LAST_DECODE_END] = end
        if finishing:  # ServingLoop._retire: record the finished rows, compact the rest in order
            kept = 0
            for i in range(b):
                if ints[REMAINING, i] == 0:
                    req = ints[REQ, i]
                    finish_s[req] = end
                    decode_steps[req] += st[DECODE_COUNT] - ints[JOINED_STEP, i]
                    drafted_req[req] += st[K_SUM] - ints[JOINED_K, i]
                    accepted_req[req] += ints[ACCEPTED, i]
                    st[KV_USED] -= kv_reserve[req]
                    st[TOTAL_FINAL_CONTEXT] -= ints[FINAL_CONTEXT, i]
                else:
                    if kept != i:
                        for f in range(ints.shape[0]):
                            ints[f, kept] = ints[f, i]
                        for f in range(floats.shape[0]):
                            floats[f, kept] = floats[f, i]
                    kept += 1
            st[RUNNING] = kept
        if policy_kind == GOODPUT_K and k:
            _goodput_observe(gp, gp_rows, kept_count, k, b, accepted_total)
        record = records[st[REC_POS]]
        record.start_s = now
        record.end_s = end
        record.phase = DECODE
        record.batch_size = charged
        record.running = b
        record.k = k
        record.mean_context_tokens = mean_context
        record.drafted_tokens = k * b
        record.accepted_tokens = accepted_total
        record.emitted_tokens = emitted_total
        st[REC_POS] += 1
        st[STEPS] += 1
        now = end
        ft[NOW] = now
        if finishing and waiting:
            return ADMIT
