"""The step rules every path runs: applying a step, joining and retiring rows.

Plain functions over the state's arrays (sim/scheduler/layout.py), in the subset of Python numba
compiles (sim/jit.py): the step-by-step loop (sim/serving/loop.py) calls them once a step, the
compiled runs (sim/serving/kernel.py) in their own loop; neither has a copy of its own. Per
step the work is one pass over the step's rows.

**Draft lag.** ``ROW_LAG`` counts a row's emitted tokens that the draft model has not yet been
fed. After a prefill it is 1 (the first token came from the target); after a speculative step
it is 1, or 2 when every draft token was accepted (the last draft token was sampled by the
draft but never fed back, and the bonus token is new); a k = 0 step adds 1. The draft's first
pass of the next speculative step feeds all of them (its *catch-up*), priced at the step's
largest lag (sim/costmodel/rules.py). ``track_lag`` says how lag moves (sim.speculation.methods):
0 no drafter keeps KV to catch up (none, Medusa, a host matcher); 1 a draft model, as above;
2 a head (EAGLE, MTP), whose first pass runs over every verified position, so it is 1 after
any speculative step.

**Ragged k.** Row i keeps min(G_i, k_i) draft tokens and emits that + 1, never more than it
still owes (surplus tokens are wasted); the step is charged as a uniform step at its largest k.

**Inter-token latencies** are kept compactly: the rows that last emitted at the end of the
previous decode step share one gap (this step's end minus that one), stored once with their
count; every other row (it has just joined, or sat a step out) stores its own gap.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim.scheduler.kvcache import free_slot
from sim.scheduler.v1 import drop_prefilled
from sim.scheduler.layout import (C_CHUNKS, C_DECODE_COUNT, C_HEAD, C_ITL_POS, C_KV_USED, C_REC_POS,
                                  C_RUNNING, C_STATIC_BATCH, C_TOTAL_CONTEXT, C_TOTAL_REMAINING, LAST_DECODE_END,
                                  REC_ACCEPTED, REC_DECODE_STEPS, REC_DRAFTED, REC_EMITTED, REC_FINISH,
                                  REC_FIRST_TOKEN, REC_LAST_EMIT, REC_SCHEDULED, REQ_OUTPUT, REQ_PROMPT, REQ_RESERVE,
                                  ROW_CONTEXT, ROW_LAG, ROW_LAST_EMIT, ROW_REMAINING, ROW_REQ, ROW_SCALE, ROW_SLOT,
                                  P_HOLD, S_CHUNK_ENTRY, S_CHUNK_TOKENS, S_HELD_REQ, S_HELD_SLOT, S_PF_DONE, S_PF_REQ,
                                  S_PF_SLOT, S_PF_TARGET, S_ROW_K)


def exact_delay(now, at):
    """A delay d >= 0 with now + d == at in floating point (where no float d gives ``at`` exactly, one
    landing just after it): how far the clock waits until ``at``, the same in SimPy's clock
    (sim/serving/clock.py) and in compiled runs' idle waits. now + (at - now) can miss ``at`` by an ulp."""
    d = at - now
    if d < 0.0:
        d = 0.0
    for _ in range(4):
        got = now + d
        if got == at:
            return d
        d = d + (at - got)  # at - got is exact: the two are within an ulp or two
        if d < 0.0:
            d = 0.0
    while now + d < at:
        d = np.nextafter(d, np.inf)
    return d


def routed_wake(idle_since, arrival):
    """Where a replica idle since ``idle_since`` wakes for a request routed to it that arrived at ``arrival``:
    where a single replica idle since then lands when it times out to the arrival, ``t + (arrival - t)``
    repeated while that falls short (the routed cluster, in SimPy and compiled, and a replica run apart
    from one). An ulp either side of ``arrival`` where no delay lands on it, so not always :func:`exact_delay`'s."""
    t = idle_since
    while t < arrival:
        t = t + (arrival - t)
    return t


def step_rows_stats(rows, m, track_lag):
    """The sum of rows [0, m)'s contexts and their largest lag (1 without a draft)."""
    total = 0
    lag = 1
    for i in range(m):
        total += rows[ROW_CONTEXT, i]
        if track_lag and rows[ROW_LAG, i] > lag:
            lag = rows[ROW_LAG, i]
    return total, lag


def write_itl(rowf, m, itl_v, itl_w, ctr, clk, end):
    """The step's inter-token gaps of rows [0, m) (module docstring); each row's last emission is now ``end``."""
    ref = clk[LAST_DECODE_END]
    steady = 0
    for i in range(m):
        if rowf[ROW_LAST_EMIT, i] == ref:
            steady += 1
    j = ctr[C_ITL_POS]
    if steady:
        itl_v[j] = end - ref
        itl_w[j] = steady
        j += 1
    for i in range(m):
        last = rowf[ROW_LAST_EMIT, i]
        if last != ref:
            itl_v[j] = end - last
            itl_w[j] = 1
            j += 1
        rowf[ROW_LAST_EMIT, i] = end
    ctr[C_ITL_POS] = j


def apply_decode(s, m, out, end):
    """Emit rows [0, m)'s tokens (each row's k this step: the plan's ``S_ROW_K``; what each kept:
    ``batch.accepted``). Returns (emitted, accepted, drafted, drafts, finishing): the step's totals
    (``drafts``: rows that proposed at least one token, vLLM's num_drafts) and whether a row is done."""
    rows, rowf, ks, accepted = s.batch.rows, s.batch.rowf, s.sched[S_ROW_K], s.batch.accepted
    reci, ctr, clk, track_lag = s.requests.ints, s.counters, s.clocks, s.track_lag
    write_itl(rowf, m, out.itl_values, out.itl_weights, ctr, clk, end)
    emitted_total = 0
    accepted_total = 0
    drafted = 0
    drafts = 0
    finishing = False
    for i in range(m):
        k = ks[i]
        r = rows[ROW_REQ, i]
        a = accepted[i] if k else 0
        emit = a + 1
        left = rows[ROW_REMAINING, i] - emit
        if left <= 0:
            finishing = True
            if left < 0:
                emit += left  # surplus tokens past the request's end are wasted
                left = 0
        rows[ROW_REMAINING, i] = left
        rows[ROW_CONTEXT, i] += emit
        reci[REC_EMITTED, r] += emit
        reci[REC_DECODE_STEPS, r] += 1
        reci[REC_DRAFTED, r] += k
        reci[REC_ACCEPTED, r] += a
        if track_lag:
            if k:
                rows[ROW_LAG, i] = 2 if a == k and track_lag == 1 else 1
            else:  # the target's token is news to the draft
                rows[ROW_LAG, i] += 1
        emitted_total += emit
        accepted_total += a
        drafted += k
        if k:
            drafts += 1
    ctr[C_TOTAL_REMAINING] -= emitted_total
    ctr[C_TOTAL_CONTEXT] += emitted_total
    ctr[C_DECODE_COUNT] += 1
    clk[LAST_DECODE_END] = end
    return emitted_total, accepted_total, drafted, drafts, finishing


def join_row(rows, rowf, ctr, r, remaining, context, scale, slot, end):
    """Request r starts decoding: a row at the end of the running rows (its first or next token was
    emitted at ``end``)."""
    b = ctr[C_RUNNING]
    rows[ROW_REQ, b] = r
    rows[ROW_REMAINING, b] = remaining
    rows[ROW_CONTEXT, b] = context
    rows[ROW_LAG, b] = 1
    rows[ROW_SLOT, b] = slot
    rowf[ROW_SCALE, b] = scale
    rowf[ROW_LAST_EMIT, b] = end
    ctr[C_RUNNING] = b + 1
    ctr[C_TOTAL_REMAINING] += remaining
    ctr[C_TOTAL_CONTEXT] += context


def retire(s, end):
    """Finished rows leave, the survivors keep their order; returns how many left. Their KV is
    released as the scheduler holds it: a v0 reservation, or (vllm-v1) their blocks, through the
    KV-cache manager."""
    rows, rowf, reqi, recf, ctr = s.batch.rows, s.batch.rowf, s.requests.inputs, s.requests.floats, s.counters
    b = ctr[C_RUNNING]
    kept = 0
    for i in range(b):
        if rows[ROW_REMAINING, i] == 0:
            r = rows[ROW_REQ, i]
            recf[REC_FINISH, r] = end
            ctr[C_TOTAL_CONTEXT] -= rows[ROW_CONTEXT, i]
            if s.paged:
                free_slot(rows[ROW_SLOT, i], s.blocks.kv, s.blocks.queue, s.blocks.slot_blocks, s.sched, ctr)
            else:
                ctr[C_KV_USED] -= reqi[REQ_RESERVE, r]
        else:
            if kept != i:
                for f in range(rows.shape[0]):
                    rows[f, kept] = rows[f, i]
                for f in range(rowf.shape[0]):
                    rowf[f, kept] = rowf[f, i]
            kept += 1
    ctr[C_RUNNING] = kept
    return b - kept


def apply_prefill(s, n, start, end):
    """A v0 prefill of the n requests at the queue head: each emits its first token; those with
    more to emit join the rows, the others finish. Returns how many finished."""
    rows, rowf, ctr = s.batch.rows, s.batch.rowf, s.counters
    reqi, scale, reci, recf = s.requests.inputs, s.requests.scale, s.requests.ints, s.requests.floats
    head = ctr[C_HEAD]
    finished = 0
    for r in range(head, head + n):
        recf[REC_SCHEDULED, r] = start
        recf[REC_FIRST_TOKEN, r] = end
        reci[REC_EMITTED, r] = 1
        output = reqi[REQ_OUTPUT, r]
        if output > 1:
            join_row(rows, rowf, ctr, r, output - 1, reqi[REQ_PROMPT, r], scale[r], -1, end)
        else:
            recf[REC_FINISH, r] = end
            ctr[C_KV_USED] -= reqi[REQ_RESERVE, r]
            finished += 1
    ctr[C_HEAD] = head + n
    if ctr[C_STATIC_BATCH] >= 0:  # static batching: steps are charged at the batch's size at its start
        ctr[C_STATIC_BATCH] = ctr[C_RUNNING]
    return finished


def apply_chunks(s, out, end):
    """A vllm-v1 step's prefill chunks are in. A request whose last chunk this was emits a token
    (its first, or after a preemption its next: one inter-token gap from its last) and joins the
    rows, or finishes (a disaggregated prefill replica's request keeps its blocks: ``S_HELD_*``, in
    finishing order). Returns (emitted, prefill tokens, finished)."""
    rows, rowf, ctr, sched, par = s.batch.rows, s.batch.rowf, s.counters, s.sched, s.params
    reqi, scale, reci, recf = s.requests.inputs, s.requests.scale, s.requests.ints, s.requests.floats
    itl_v, itl_w = out.itl_values, out.itl_weights
    emitted = 0
    tokens = 0
    finished = 0
    completed = 0  # the completed entries are the first ones (sim/scheduler/v1.py)
    for c in range(ctr[C_CHUNKS]):
        j = sched[S_CHUNK_ENTRY, c]
        sched[S_PF_DONE, j] += sched[S_CHUNK_TOKENS, c]
        tokens += sched[S_CHUNK_TOKENS, c]
        if sched[S_PF_DONE, j] < sched[S_PF_TARGET, j]:
            continue
        completed += 1
        r = sched[S_PF_REQ, j]
        before = reci[REC_EMITTED, r]
        reci[REC_EMITTED, r] = before + 1
        emitted += 1
        if before == 0:
            recf[REC_FIRST_TOKEN, r] = end
        else:
            pos = ctr[C_ITL_POS]
            itl_v[pos] = end - recf[REC_LAST_EMIT, r]
            itl_w[pos] = 1
            ctr[C_ITL_POS] = pos + 1
        remaining = reqi[REQ_OUTPUT, r] - before - 1
        if remaining == 0:
            recf[REC_FINISH, r] = end
            if par[P_HOLD]:  # a disaggregated prefill replica: the blocks stay until the decode side read them
                sched[S_HELD_REQ, finished] = r
                sched[S_HELD_SLOT, finished] = sched[S_PF_SLOT, j]
            else:
                free_slot(sched[S_PF_SLOT, j], s.blocks.kv, s.blocks.queue, s.blocks.slot_blocks, sched, ctr)
            finished += 1
        else:
            join_row(rows, rowf, ctr, r, remaining, sched[S_PF_TARGET, j], scale[r], sched[S_PF_SLOT, j], end)
    if completed:
        drop_prefilled(sched, ctr, completed)
    return emitted, tokens, finished


class StepRecord(NamedTuple):
    """One step as recorded (sim.serving.records.STEP_DTYPE's fields, in order)."""

    start_s: float
    end_s: float
    phase: int
    batch_size: int  # what the decodes are charged at (v0 prefill: the prompts admitted)
    running: int
    k: int
    mean_context_tokens: float
    drafted_tokens: int
    drafts: int  # rows that proposed at least one token (vLLM's num_drafts)
    accepted_tokens: int
    emitted_tokens: int
    prefill_tokens: int
    kv_blocks: int
    preemptions: int


def write_step(steps, ctr, step):
    """Append ``step`` (a :class:`StepRecord`) to the step records."""
    rec = steps[ctr[C_REC_POS]]
    rec["start_s"] = step.start_s
    rec["end_s"] = step.end_s
    rec["phase"] = step.phase
    rec["batch_size"] = step.batch_size
    rec["running"] = step.running
    rec["k"] = step.k
    rec["mean_context_tokens"] = step.mean_context_tokens
    rec["drafted_tokens"] = step.drafted_tokens
    rec["drafts"] = step.drafts
    rec["accepted_tokens"] = step.accepted_tokens
    rec["emitted_tokens"] = step.emitted_tokens
    rec["prefill_tokens"] = step.prefill_tokens
    rec["kv_blocks"] = step.kv_blocks
    rec["preemptions"] = step.preemptions
    ctr[C_REC_POS] += 1


RULES = (exact_delay, routed_wake, step_rows_stats, write_itl, apply_decode, join_row, retire, apply_prefill,
         apply_chunks, write_step)
INLINED = (step_rows_stats, write_itl, apply_decode)  # compiled into their callers (sim/jit.py)
