"""The compiled decode run (:mod:`sim.serving.compiled` says when and why; imported only there).

Each step is :meth:`ServingLoop._choose_k` + ``PricedBackend.decode`` + ``_apply_decode`` +
``_retire`` written row by row, with the same float operations in the same order, so its
records are the step-by-step loop's to the bit. Keep the two in step: a change to one is
a change to the other (``tests/test_decode_runs.py`` fails otherwise).
"""

from __future__ import annotations

from numba import njit

from sim.serving.decode_state import (ADMIT, ARRIVAL, DECODE_COUNT, DRAW_POS, FRESH, IDLE, ITL_END, ITL_POS, K_SUM,
                                  KV_USED, LAST_DECODE_END, LIMIT, NOW, PENDING_END, POSITIONS, REC_END, REC_POS, REFILL,
                                  RUNNING, SHARED, STEPS, TOTAL_FINAL_CONTEXT, TOTAL_REMAINING)
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
def decode_run(ints, floats, st, ft, k_by_batch, static_charged, decode, lag2, catch_up, context_step, kind,
               draws_i, draws_f, neg_rates, counts, track_lag,
               finish_s, decode_steps, drafted_req, accepted_req, kv_reserve, records, itl_values, itl_weights,
               stop_at, waiting, max_steps):
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
        k = k_by_batch[charged]
        mean_context = (st[TOTAL_FINAL_CONTEXT] - st[TOTAL_REMAINING]) / b
        x = mean_context / context_step
        if k == 0:
            dt = _blend(decode[charged, 0], x)
        else:
            lag = 1
            if track_lag:
                for i in range(b):
                    if ints[LAG, i] > lag:
                        lag = ints[LAG, i]
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
