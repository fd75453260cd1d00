"""A compiled run: many steps of one replica in one call, built from the same rules as the loop.

:func:`run_steps` is :meth:`ServingLoop.start_step <sim.serving.loop.ServingLoop>` +
``finish_step`` in a loop, for the policies whose choice the run can make itself (a k per batch
size, or goodput's argmax: :mod:`policies.goodput_rules`) and the acceptance samplers whose draws
it can read (sim.acceptance): every decision, price, draw and record is a call of the rule the
loop calls (sim/serving/rules.py, sim/scheduler/, sim/costmodel_rules.py), in the same order,
so its records are the loop's to the bit (tests/test_decode_runs.py). sim/serving/compiled.py
says when it runs and hands it the state.

It returns to the clock:

* ``ARRIVAL``: the next step would end at or after ``stop_at`` (a routing decision in a
  cluster: something outside the replica must see the state first); that step is planned,
  priced and drawn, its end left in ``clk[PENDING_END]``, and :func:`finish_pending` applies it
  once the clock is there;
* ``REFILL``: the record buffers or the draws need more room;
* ``IDLE``: nothing to run (a timed queue: nothing will ever arrive again; otherwise until the
  dispatcher hands the replica a request);
* ``LIMIT``: ``max_steps`` steps were taken.

A replica whose arrivals are all known (``timed``) releases them itself, so a single replica
runs from its first arrival to its last finish in a handful of calls.
"""

from __future__ import annotations

from policies.base import BY_BATCH_SIZE, GOODPUT_RULE
from policies.goodput_rules import EXPECTED, MARGIN, best_k, observe_rows, spread_catch_up
from sim.proposals import count_accepted, propose_rows
from sim.costmodel_rules import (blend, catch_up_price, chunk_price, decode_price, prefill_price,
                                  prefix_attention_price, tokens_price)
from sim.scheduler.v0 import charged_batch, plan_v0, prefill_prompt
from sim.scheduler.v1 import plan_v1
from sim.scheduler.work import has_work
from sim.scheduler.layout import (ARRIVAL, C_ADMIT, C_ARRIVED, C_HEAD, C_CHUNK_TOKENS, C_CHUNKS, C_DECODE_TOKENS, C_DRAW_POS,
                                  C_OFFERED_K,
                                  C_ITL_END, C_ITL_POS, C_PHASE, C_PREEMPTED_NOW, C_RAGGED, C_REC_END, C_REC_POS,
                                  C_RUNNING, C_STEP_BLOCKS, C_STEP_CHARGED, C_STEP_K, C_STEP_ROWS, C_STEP_RUNNING,
                                  C_STEPS, C_TOTAL_CONTEXT, DECODE, IDLE, LAST_STEP_END, LIMIT, MIXED, NOTHING, NOW,
                                  PENDING_END,
                                  PREFILL, REFILL, ROW_REMAINING, ROW_SCALE, S_CHUNK_PREFIX, S_CHUNK_TOKENS, S_ROW_K,
                                  STEP_MEAN)
from sim.serving.rules import (apply_chunks, apply_decode, apply_prefill, exact_delay, retire,
                               step_rows_stats, write_step)

# How a run picks k, as the policy's compiled_form says: a table by batch size, or goodput's argmax.
STATIC_K, GOODPUT_K = BY_BATCH_SIZE, GOODPUT_RULE


def _choose(b, charged, rows, ctr, policy_kind, k_by_batch, gp, gp_rows, gp_prices, gp_catch_up, k_max,
            decode, lag2, catch_up, ctx_step, track_lag):
    """The policy's k for the b running rows (the view a policy sees: all of them)."""
    if policy_kind != GOODPUT_K:
        return k_by_batch[charged]
    x = (ctr[C_TOTAL_CONTEXT] / b) / ctx_step
    lag = 1
    if track_lag:
        total, lag = step_rows_stats(rows, b, track_lag)
    for k in range(k_max + 1):  # Goodput.choose_k: the step table's step_time, plus the draft's catch-up
        gp_prices[k] = blend(decode[charged][k], x)
    if gp_catch_up and lag > 1:
        extra = catch_up_price(catch_up[charged], lag, x)
        if extra:
            recurring = extra if lag == 2 else catch_up_price(catch_up[charged], 2, x)
            remaining = 0
            for i in range(b):
                remaining += rows[ROW_REMAINING, i]
            spread_catch_up(gp_prices, gp_rows[EXPECTED], recurring, extra - recurring, remaining / b, k_max)
    return best_k(gp_rows[EXPECTED], gp_prices, gp[MARGIN], k_max)


def start_step(paged, rows, rowf, reqi, scale, reci, recf, ctr, clk, sched, kv, key_block, slot_blocks, scratch,
               par, ks, accepted, decode, lag2, catch_up, prefill, chunk, ctx_step, prompt_step, chunk_step,
               prefill_overhead, exposed, overlapped, kv_read, theta, pad, by_tokens, kind, draws_i, draws_f, neg_rates, counts, track_lag, policy_kind, k_by_batch, gp,
               gp_rows, gp_prices, gp_catch_up, k_max, prop, match_rate, seed, runs, run_start, run_len, now):
    """Plan, price and draw one step (ServingLoop.start_step); returns its duration. ``prop``...: how
    rows propose (sim.proposals; 0: every row proposes its k)."""
    b = ctr[C_RUNNING]
    if paged:
        if b:
            k = _choose(b, b, rows, ctr, policy_kind, k_by_batch, gp, gp_rows, gp_prices, gp_catch_up, k_max,
                        decode, lag2, catch_up, ctx_step, track_lag)
            for i in range(b):
                ks[i] = k
            if prop:
                ctr[C_OFFERED_K] = k
                propose_rows(ks, b, rows, rowf, reqi, prop, match_rate, seed, runs, run_start, run_len)
        phase = plan_v1(ks, rows, rowf, reqi, reci, recf, ctr, clk, sched, kv, key_block, slot_blocks, scratch, par,
                        now)
    else:
        phase = plan_v0(reqi, ctr, par)
        if phase < 0:  # NOTHING, or stuck (the caller raises)
            return 0.0
        if phase == PREFILL:
            price, mean = prefill_prompt(reqi, ctr, par)
            clk[STEP_MEAN] = mean
            return prefill_price(prefill, ctr[C_ADMIT], price / prompt_step)
        k = _choose(b, charged_batch(ctr, b), rows, ctr, policy_kind, k_by_batch, gp, gp_rows, gp_prices,
                    gp_catch_up, k_max, decode, lag2, catch_up, ctx_step, track_lag)
        for i in range(b):
            sched[S_ROW_K, i] = k
        ctr[C_STEP_K] = k
        ctr[C_RAGGED] = 0
        if prop:
            ctr[C_OFFERED_K] = k
            top, ragged = propose_rows(sched[S_ROW_K], b, rows, rowf, reqi, prop, match_rate, seed, runs, run_start,
                                       run_len)
            ctr[C_STEP_K] = top
            ctr[C_RAGGED] = ragged
    m = ctr[C_STEP_ROWS] if phase != PREFILL else 0
    dt = 0.0
    if m:
        total, lag = step_rows_stats(rows, m, track_lag)
        charged = charged_batch(ctr, m)
        mean = total / m
        ctr[C_STEP_CHARGED] = charged
        clk[STEP_MEAN] = mean
        k = ctr[C_STEP_K]
        if by_tokens and ctr[C_RAGGED]:  # a host matcher's rows: priced by their tokens (sim.serving.priced)
            dt = tokens_price(decode, charged, sched[S_ROW_K], m, mean / ctx_step)
        else:
            dt = decode_price(decode, lag2, catch_up, charged, k, mean / ctx_step, lag)
        if k:
            pos = ctr[C_DRAW_POS]
            count_accepted(kind, draws_i, draws_f, pos, rowf[ROW_SCALE], sched[S_ROW_K], m, neg_rates, accepted)
            for i in range(m):
                counts[accepted[i]] += 1
            ctr[C_DRAW_POS] = pos + m
    if paged and ctr[C_CHUNK_TOKENS]:
        n = ctr[C_CHUNKS]
        prefix_cost = prefix_attention_price(kv_read, theta, sched[S_CHUNK_TOKENS], sched[S_CHUNK_PREFIX], n)
        dt += chunk_price(chunk, chunk_step, prefill_overhead, exposed, overlapped, pad,
                          ctr[C_DECODE_TOKENS] if m else 0, ctr[C_CHUNK_TOKENS], prefix_cost)
    return dt


def finish_step(paged, rows, rowf, reqi, scale, reci, recf, ctr, clk, sched, kv, key_block, slot_blocks, par,
                accepted, records, itl_v, itl_w, track_lag, policy_kind, gp, gp_rows, gp_scratch, k_max, prop, start,
                end):
    """Apply the step :func:`start_step` planned (ServingLoop.finish_step); returns the requests finished."""
    clk[LAST_STEP_END] = end
    phase = ctr[C_PHASE]
    if phase == PREFILL and not paged:
        n = ctr[C_ADMIT]
        finished = apply_prefill(n, rows, rowf, reqi, scale, reci, recf, ctr, start, end)
        write_step(records, ctr, start, end, PREFILL, n, ctr[C_RUNNING], 0, clk[STEP_MEAN], 0, 0, 0, n, 0, 0, 0)
        return finished
    m = ctr[C_STEP_ROWS] if phase == DECODE or phase == MIXED else 0
    emitted = 0
    n_accepted = 0
    drafted = 0
    drafts = 0
    finishing = False
    if m:
        emitted, n_accepted, drafted, drafts, finishing = apply_decode(rows, rowf, m, sched[S_ROW_K], accepted, reci,
                                                                       itl_v, itl_w, ctr, clk, end, track_lag)
    finished = 0
    prefill_tokens = 0
    if paged:
        more, prefill_tokens, finished = apply_chunks(rows, rowf, reqi, scale, reci, recf, ctr, sched, kv,
                                                      slot_blocks, par, itl_v, itl_w, end)
        emitted += more
    if finishing:
        finished += retire(rows, rowf, reqi, recf, ctr, end, paged, kv, key_block, slot_blocks, sched, par)
    k = ctr[C_STEP_K] if m else 0
    offered = ctr[C_OFFERED_K] if prop else k  # a host matcher's misses are learnt from too
    if m and policy_kind == GOODPUT_K and offered:
        observe_rows(gp, gp_rows, accepted, sched[S_ROW_K], m, k_max, gp_scratch)
    if paged:
        write_step(records, ctr, start, end, phase, m, ctr[C_STEP_RUNNING], k, clk[STEP_MEAN] if m else 0.0,
                   drafted, drafts, n_accepted, emitted, prefill_tokens, ctr[C_STEP_BLOCKS], ctr[C_PREEMPTED_NOW])
    else:
        write_step(records, ctr, start, end, DECODE, ctr[C_STEP_CHARGED], m, k, clk[STEP_MEAN], drafted, drafts,
                   n_accepted, emitted, 0, 0, 0)
    return finished


def run_steps(paged, rows, rowf, reqi, scale, reci, recf, ctr, clk, sched, kv, key_block, slot_blocks, scratch,
              par, ks, accepted, arrivals, timed, decode, lag2, catch_up, prefill, chunk, ctx_step, prompt_step,
              chunk_step, prefill_overhead, exposed, overlapped, kv_read, theta, pad, by_tokens, kind, draws_i, draws_f, neg_rates, counts, track_lag, policy_kind,
              k_by_batch, gp, gp_rows, gp_prices, gp_scratch, gp_catch_up, k_max, prop, match_rate, seed, runs,
              run_start, run_len, records, itl_v, itl_w, stop_at, max_steps, itl_room):
    """Steps from ``clk[NOW]`` until a stop (the module docstring); returns the reason."""
    n_draws = draws_i.shape[0] if kind == 0 else draws_f.shape[0]
    cap = rows.shape[1]
    while True:
        now = clk[NOW]
        if timed:
            arrived = ctr[C_ARRIVED]
            while arrived < arrivals.shape[0] and arrivals[arrived] <= now:
                arrived += 1
            ctr[C_ARRIVED] = arrived
        if not has_work(ctr):
            if timed and ctr[C_ARRIVED] < arrivals.shape[0]:
                clk[NOW] = now + exact_delay(now, arrivals[ctr[C_ARRIVED]])  # the clock's idle wait, to the bit
                continue
            return IDLE
        if ctr[C_STEPS] >= max_steps:
            return LIMIT
        if (ctr[C_REC_POS] + 1 > ctr[C_REC_END] or ctr[C_ITL_POS] + itl_room > ctr[C_ITL_END]
                or ctr[C_DRAW_POS] + cap > n_draws):
            return REFILL
        dt = start_step(paged, rows, rowf, reqi, scale, reci, recf, ctr, clk, sched, kv, key_block, slot_blocks,
                        scratch, par, ks, accepted, decode, lag2, catch_up, prefill, chunk, ctx_step, prompt_step,
                        chunk_step, prefill_overhead, exposed, overlapped, kv_read, theta, pad, by_tokens, kind, draws_i, draws_f, neg_rates, counts, track_lag,
                        policy_kind, k_by_batch, gp, gp_rows, gp_prices, gp_catch_up, k_max, prop, match_rate, seed,
                        runs, run_start, run_len, now)
        if ctr[C_PHASE] < 0:
            return IDLE  # cannot happen: has_work said there was something (the caller raises)
        end = now + dt
        if end >= stop_at:
            clk[PENDING_END] = end
            return ARRIVAL
        finish_step(paged, rows, rowf, reqi, scale, reci, recf, ctr, clk, sched, kv, key_block, slot_blocks, par,
                    accepted, records, itl_v, itl_w, track_lag, policy_kind, gp, gp_rows, gp_scratch, k_max, prop, now,
                    end)
        clk[NOW] = end
        ctr[C_STEPS] += 1


def finish_pending(paged, rows, rowf, reqi, scale, reci, recf, ctr, clk, sched, kv, key_block, slot_blocks, par,
                   accepted, records, itl_v, itl_w, track_lag, policy_kind, gp, gp_rows, gp_scratch, k_max, prop):
    """Apply the step :func:`run_steps` left in flight (the clock is now at its end)."""
    end = clk[PENDING_END]
    finish_step(paged, rows, rowf, reqi, scale, reci, recf, ctr, clk, sched, kv, key_block, slot_blocks, par, accepted,
                records, itl_v, itl_w, track_lag, policy_kind, gp, gp_rows, gp_scratch, k_max, prop, clk[NOW], end)
    clk[NOW] = end
    ctr[C_STEPS] += 1


RULES = (_choose, start_step, finish_step, run_steps, finish_pending)
