"""The vllm-v1 scheduler (vLLM V1's ``Scheduler.schedule``; docs/scheduling.md): one token budget a step.

A request is *running* from its admission until it finishes: first while its prompt (or, after a
preemption, its prompt and what it had emitted) is prefilled in chunks (``S_PF_*``, the
*prefilling* entries), then as a decoding row. vLLM keeps both in one running list in admission
order; here the rows come first and the prefilling entries after them, which is that order (a
request is only admitted once every earlier one's prompt is in, except the one whose chunk ran
the budget out). Each step, in order:

1. **Running requests**, in that order, until the budget is spent: a decoding row asks for 1 + k
   tokens (its newest token and k draft tokens, k from the policy), cut to what is left of the
   budget (its draft tokens dropped first; a row reached with nothing left sits the step out, as
   do all after it); a prefilling request for the rest of its prompt, cut the same way. Each
   needs the blocks its tokens write plus the speculation's lookahead slots
   (``P_LOOKAHEAD``, vLLM's ``num_lookahead_tokens``). When the free blocks do not cover them,
   the newest running request is **preempted** (its blocks freed, its progress lost, back to
   the head of the waiting queue), and the next newest, until they do; if that reaches the
   request itself, it is preempted too and the step schedules no more running requests.
2. **Waiting requests**, FCFS, preempted ones first, unless this step preempted someone (and, with
   asynchronous scheduling, only those that had arrived when the previous step was planned): while
   budget, ``max_num_seqs`` and blocks allow, a request starts prefilling. With prefix caching
   its leading blocks already in the cache (sim/scheduler/kvcache.py) count as computed: only
   the rest is prefilled and counted against the budget. It gets ``min(tokens left, budget
   left)``; without chunked prefill only a request whose tokens all fit. A request that does
   not fit stops the admissions (a waiting request never preempts). On a disaggregated decode
   replica (sim/disaggregated.py) the prompt's KV came from a prefill replica (``REQ_REMOTE``):
   those tokens count as computed, as vLLM's KV connector reports them, and only the last prompt
   token is computed here (its logits give the first token).

The plan goes into the counters (``C_STEP_ROWS`` rows decode, ``C_CHUNKS`` chunks...) and
``sched`` (``S_ROW_K``: each scheduled row's k, ``S_CHUNK_*``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.prefetch import prefetch
from sim.scheduler.kvcache import (SLOT_CACHED, SLOT_HELD, admission_need, admit_slot, available,
                                    cache_slot, free_slot, grow_slot, lookup, remote_blocks, shortfall)
from sim.scheduler.layout import (C_ADMISSIBLE, C_ARRIVED, C_ARRIVED_PREV, C_CACHE_HITS, C_CACHE_QUERIES, C_CHUNK_TOKENS, C_CHUNKS, C_DECODE_TOKENS,
                                  C_HEAD, C_PEAK_BLOCKS, C_PHASE, C_PREEMPTED_NOW, C_PREFILLING,
                                  C_RAGGED, C_REQUEUED, C_REQUEUED_AT, C_RESERVED, C_RESUME_HITS, C_RESUME_QUERIES, C_RUNNING,
                                  C_STEP_BLOCKS, C_STEP_K, C_STEP_ROWS, C_STEP_RUNNING, C_TOTAL_CONTEXT, C_TOTAL_REMAINING, DECODE, MIXED, N_PARAMS,
                                  LAST_STEP_END, NOTHING, P_ASYNC, P_BLOCK, P_BLOCKS, P_BUDGET, P_CACHING, P_CHUNKED,
                                  P_LOOKAHEAD,
                                  P_MAX_BLOCKS, P_MAX_SEQS, PREFILL, REC_CACHED, REC_EMITTED, REC_LAST_EMIT,
                                  REC_PREEMPTIONS, REC_SCHEDULED, REQ_PROMPT, REQ_REMOTE, ROW_CONTEXT, ROW_LAST_EMIT,
                                  ROW_REMAINING, ROW_REQ, ROW_SLOT, S_CHUNK_ENTRY, S_CHUNK_PREFIX, S_CHUNK_TOKENS, S_PF_DONE, S_PF_REQ,
                                  S_PF_SLOT, S_PF_TARGET, S_REQUEUED, S_ROW_K)

PREEMPTION = ("recompute",)  # vLLM V1 preempts by recompute only


def _requeue(r, sched, reci, ctr, par):
    """A preempted request waits at the head of the waiting queue (vLLM prepends it)."""
    at = ctr[C_REQUEUED_AT] - 1
    if at < 0:
        at += par[P_MAX_SEQS]
    sched[S_REQUEUED, at] = r
    ctr[C_REQUEUED_AT] = at
    ctr[C_REQUEUED] += 1
    reci[REC_PREEMPTIONS, r] += 1
    ctr[C_PREEMPTED_NOW] += 1


def _preempt_prefilling(sched, reci, ctr, kv, queue, slot_blocks, par):
    """Preempt the newest prefilling request: its blocks go back, its prefilled tokens are lost."""
    j = ctr[C_PREFILLING] - 1
    free_slot(sched[S_PF_SLOT, j], kv, queue, slot_blocks, sched, ctr)
    ctr[C_PREFILLING] = j
    _requeue(sched[S_PF_REQ, j], sched, reci, ctr, par)


def _preempt_row(rows, rowf, recf, sched, reci, ctr, kv, queue, slot_blocks, par):
    """Preempt the newest running row: its KV is dropped; it keeps what it emitted and when."""
    i = ctr[C_RUNNING] - 1
    r = rows[ROW_REQ, i]
    free_slot(rows[ROW_SLOT, i], kv, queue, slot_blocks, sched, ctr)
    recf[REC_LAST_EMIT, r] = rowf[ROW_LAST_EMIT, i]
    ctr[C_TOTAL_REMAINING] -= rows[ROW_REMAINING, i]
    ctr[C_TOTAL_CONTEXT] -= rows[ROW_CONTEXT, i]
    ctr[C_RUNNING] = i
    _requeue(r, sched, reci, ctr, par)


SLOTS_AHEAD = 4  # rows ahead whose block-table heads _schedule_rows asks for (sim/prefetch.py)


def _schedule_rows(s, budget):
    """Step 1 for the decoding rows; returns the budget left, or -1 when a row preempted itself."""
    ks, rows, rowf = s.batch.ks, s.batch.rows, s.batch.rowf
    reqi, reci, recf = s.requests.inputs, s.requests.ints, s.requests.floats
    ctr, sched, par = s.counters, s.sched, s.params
    kv, queue, key_block, slot_blocks = s.blocks.kv, s.blocks.queue, s.blocks.key_block, s.blocks.slot_blocks
    lookahead, block, caching = par[P_LOOKAHEAD], par[P_BLOCK], par[P_CACHING]
    m = 0
    top = 0
    tokens = 0
    i = 0
    while i < ctr[C_RUNNING] and budget > 0:
        if i + SLOTS_AHEAD < ctr[C_RUNNING]:  # each row's block table is a line of its own, far from the others'
            prefetch(slot_blocks, rows[ROW_SLOT, i + SLOTS_AHEAD])
        t = 1 + ks[i]
        if t > budget:
            t = budget
        slot = rows[ROW_SLOT, i]
        need = rows[ROW_CONTEXT, i] + t + lookahead
        if need > slot_blocks[slot, SLOT_HELD] * block:  # a new block (every block_size tokens; blocks_for, undivided)
            while shortfall(slot, need, slot_blocks, ctr, par) > 0:
                if ctr[C_PREFILLING] > 0:
                    _preempt_prefilling(sched, reci, ctr, kv, queue, slot_blocks, par)
                else:
                    last = ctr[C_RUNNING] - 1
                    _preempt_row(rows, rowf, recf, sched, reci, ctr, kv, queue, slot_blocks, par)
                    if last == i:
                        budget = -1
                        break
            if budget < 0:
                break
            grow_slot(slot, need, kv, queue, key_block, slot_blocks, ctr, par)
        r = rows[ROW_REQ, i]
        known = reqi[REQ_PROMPT, r] + reci[REC_EMITTED, r]
        if caching and known >= (slot_blocks[slot, SLOT_CACHED] + 1) * block:  # a block newly full of known tokens
            cache_slot(slot, reqi, r, known, kv, key_block, slot_blocks, par)
        sched[S_ROW_K, i] = t - 1
        if t - 1 > top:
            top = t - 1
        tokens += t
        budget -= t
        m += 1
        i += 1
    ragged = False
    for j in range(m):
        if sched[S_ROW_K, j] != top:
            ragged = True
    ctr[C_STEP_ROWS] = m
    ctr[C_STEP_K] = top
    ctr[C_RAGGED] = ragged
    ctr[C_DECODE_TOKENS] = tokens
    return budget


def _schedule_prefilling(s, budget):
    """Step 1 for the prefilling requests (the running list's tail); returns the budget left."""
    reqi, reci = s.requests.inputs, s.requests.ints
    ctr, sched, par = s.counters, s.sched, s.params
    kv, queue, key_block, slot_blocks = s.blocks.kv, s.blocks.queue, s.blocks.key_block, s.blocks.slot_blocks
    lookahead = par[P_LOOKAHEAD]
    j = 0
    while j < ctr[C_PREFILLING] and budget > 0:
        done, target = sched[S_PF_DONE, j], sched[S_PF_TARGET, j]
        t = target - done
        if t > budget:
            t = budget
        slot = sched[S_PF_SLOT, j]
        need = done + t + lookahead
        self_preempted = False
        while shortfall(slot, need, slot_blocks, ctr, par) > 0:
            last = ctr[C_PREFILLING] - 1
            _preempt_prefilling(sched, reci, ctr, kv, queue, slot_blocks, par)
            if last == j:
                self_preempted = True
                break
        if self_preempted:
            break
        grow_slot(slot, need, kv, queue, key_block, slot_blocks, ctr, par)
        cache_slot(slot, reqi, sched[S_PF_REQ, j], done + t, kv, key_block, slot_blocks, par)
        c = ctr[C_CHUNKS]
        sched[S_CHUNK_ENTRY, c] = j
        sched[S_CHUNK_TOKENS, c] = t
        ctr[C_CHUNKS] = c + 1
        budget -= t
        j += 1
    return budget


def _first_look(s, r, num_tokens, resumed):
    """What waiting request r starts from: (cached blocks found, tokens they hold, tokens counted as
    computed, blocks reserved for it). On a disaggregated decode replica (``REQ_REMOTE``) the prompt's KV
    was sent here, into blocks reserved when its transfer began (sim.scheduler.kvcache.reserve_blocks)."""
    reqi, par = s.requests.inputs, s.params
    hits = lookup(reqi, r, num_tokens, resumed, s.blocks.kv, s.blocks.key_block, s.blocks.scratch, par)
    cached = found = hits * par[P_BLOCK]
    reserved = 0
    if not resumed and reqi[REQ_REMOTE, r] > 0:
        reserved = remote_blocks(reqi[REQ_PROMPT, r], par[P_BLOCK])
        if reqi[REQ_REMOTE, r] > cached:
            cached = reqi[REQ_REMOTE, r]
    return hits, found, cached, reserved


def _reserved_idle(ctr):
    """Nothing runs and blocks are reserved for KV on its way (a disaggregated decode replica): a preempted
    request that does not fit would wait on requests queued behind it, whose blocks those are, so the
    waiting requests are admitted past it (vLLM's scheduler stops at it, and such a replica would stall)."""
    return ctr[C_RESERVED] > 0 and ctr[C_RUNNING] + ctr[C_PREFILLING] == 0


def _fits(s, r, resumed):
    """Whether waiting request r gets the blocks of its first chunk now (the budget all its own)."""
    ctr, par = s.counters, s.params
    num_tokens = s.requests.inputs[REQ_PROMPT, r] + s.requests.ints[REC_EMITTED, r]
    hits, found, cached, reserved = _first_look(s, r, num_tokens, resumed)
    t = num_tokens - cached
    if t > par[P_BUDGET]:
        t = par[P_BUDGET]
    return admission_need(hits, cached + t, s.blocks.kv, s.blocks.scratch, par) <= available(ctr) + reserved


def head_fits(s):
    """Whether the next waiting request (a preempted one first) gets its blocks now, with nothing else
    running: a replica whose blocks are held for KV transfers (sim/disaggregated.py) may have waiting
    requests and no room, and then waits for a transfer to give blocks back."""
    ctr = s.counters
    if ctr[C_REQUEUED] > 0:
        if _fits(s, s.sched[S_REQUEUED, ctr[C_REQUEUED_AT]], True):
            return True
        if not _reserved_idle(ctr):
            return False
    return ctr[C_HEAD] < ctr[C_ARRIVED] and _fits(s, ctr[C_HEAD], False)


def _has_waiting(ctr):
    """Whether :func:`_admit_waiting` has a request to look at: a preempted one, or one admissible now."""
    return ctr[C_REQUEUED] > 0 or ctr[C_HEAD] < ctr[C_ADMISSIBLE]


def _admit_waiting(s, budget, now):
    """Step 2: start prefilling waiting requests, FCFS, preempted ones first (none: :func:`_has_waiting`)."""
    reqi, reci, recf = s.requests.inputs, s.requests.ints, s.requests.floats
    ctr, sched, par = s.counters, s.sched, s.params
    kv, queue, key_block, slot_blocks, scratch = (s.blocks.kv, s.blocks.queue, s.blocks.key_block, s.blocks.slot_blocks,
                                                  s.blocks.scratch)
    skip_requeued = False
    while budget > 0 and ctr[C_RUNNING] + ctr[C_PREFILLING] < par[P_MAX_SEQS]:
        resumed = ctr[C_REQUEUED] > 0 and not skip_requeued
        if resumed:
            r = sched[S_REQUEUED, ctr[C_REQUEUED_AT]]
        elif ctr[C_HEAD] < ctr[C_ADMISSIBLE]:
            r = ctr[C_HEAD]
        else:
            break
        num_tokens = reqi[REQ_PROMPT, r] + reci[REC_EMITTED, r]
        hits, found, cached, reserved = _first_look(s, r, num_tokens, resumed)
        t = num_tokens - cached
        if t > budget:
            if not par[P_CHUNKED]:
                break
            t = budget
        ctr[C_RESERVED] -= reserved  # the blocks set aside while its KV was on its way are now its own
        slot = admit_slot(hits, cached + t, kv, queue, key_block, slot_blocks, sched, scratch, ctr, par)
        if slot < 0:
            ctr[C_RESERVED] += reserved
            if resumed and _reserved_idle(ctr):
                skip_requeued = True  # the requests whose KV is here hold the blocks: they go first
                continue
            break
        cache_slot(slot, reqi, r, cached + t, kv, key_block, slot_blocks, par)
        if resumed:
            at = ctr[C_REQUEUED_AT] + 1
            ctr[C_REQUEUED_AT] = 0 if at == par[P_MAX_SEQS] else at
            ctr[C_REQUEUED] -= 1
            ctr[C_RESUME_QUERIES] += num_tokens
            ctr[C_RESUME_HITS] += cached
        else:
            ctr[C_HEAD] += 1
            recf[REC_SCHEDULED, r] = now
            reci[REC_CACHED, r] = cached
            ctr[C_CACHE_QUERIES] += num_tokens
            ctr[C_CACHE_HITS] += found  # the prefix cache's own hits (vLLM counts a connector's apart)
        j = ctr[C_PREFILLING]
        sched[S_PF_REQ, j], sched[S_PF_DONE, j], sched[S_PF_TARGET, j], sched[S_PF_SLOT, j] = r, cached, num_tokens, slot
        ctr[C_PREFILLING] = j + 1
        c = ctr[C_CHUNKS]
        sched[S_CHUNK_ENTRY, c] = j
        sched[S_CHUNK_TOKENS, c] = t
        ctr[C_CHUNKS] = c + 1
        budget -= t
    return budget


def drop_prefilled(sched, ctr, completed):
    """The first ``completed`` prefilling entries have all their tokens in (their requests now decode
    or are done): they leave the prefilling queue, the rest keep their order."""
    left = ctr[C_PREFILLING] - completed
    for j in range(left):
        for f in (S_PF_REQ, S_PF_DONE, S_PF_TARGET, S_PF_SLOT):
            sched[f, j] = sched[f, j + completed]
    ctr[C_PREFILLING] = left


def admission_horizon(ctr, clk, par, now):
    """Which waiting requests this step may admit. With asynchronous scheduling (vLLM's
    ``--async-scheduling``) a busy engine plans each step while the previous one runs, so a step
    admits only the requests that had arrived when the previous step started; an engine with
    nothing in flight plans at once, with everything that has arrived."""
    busy = clk[LAST_STEP_END] == now and (ctr[C_RUNNING] > 0 or ctr[C_PREFILLING] > 0 or ctr[C_REQUEUED] > 0)
    ctr[C_ADMISSIBLE] = ctr[C_ARRIVED_PREV] if par[P_ASYNC] and busy else ctr[C_ARRIVED]
    ctr[C_ARRIVED_PREV] = ctr[C_ARRIVED]


def plan_v1(s, now):
    """Schedule one step (the module docstring) given each running row's k (``s.batch.ks``); returns its
    phase. ``s``: the replica's state (sim.serving.step.Replica)."""
    ctr, sched, par = s.counters, s.sched, s.params
    admission_horizon(ctr, s.clocks, par, now)
    ctr[C_PREEMPTED_NOW] = 0
    ctr[C_CHUNKS] = 0
    budget = _schedule_rows(s, par[P_BUDGET])
    # Each call passes the state's forty-odd arrays on the stack: made only when there is something to do,
    # which most steps of a long run do not have (the same steps: each returns at once otherwise).
    if budget > 0 and ctr[C_PREFILLING] > 0:
        budget = _schedule_prefilling(s, budget)
    if budget > 0 and ctr[C_PREEMPTED_NOW] == 0 and _has_waiting(ctr):
        budget = _admit_waiting(s, budget, now)
    chunk_tokens = 0
    for c in range(ctr[C_CHUNKS]):
        chunk_tokens += sched[S_CHUNK_TOKENS, c]
        sched[S_CHUNK_PREFIX, c] = sched[S_PF_DONE, sched[S_CHUNK_ENTRY, c]]  # computed before, or found cached
    ctr[C_CHUNK_TOKENS] = chunk_tokens
    used = par[P_BLOCKS] - available(ctr)  # blocks reserved for KV on its way are in use
    ctr[C_STEP_BLOCKS] = used
    ctr[C_STEP_RUNNING] = ctr[C_RUNNING]
    if used > ctr[C_PEAK_BLOCKS]:
        ctr[C_PEAK_BLOCKS] = used
    if ctr[C_STEP_ROWS]:
        ctr[C_PHASE] = MIXED if ctr[C_CHUNKS] else DECODE
    elif ctr[C_CHUNKS]:
        ctr[C_PHASE] = PREFILL
    else:
        ctr[C_PHASE] = NOTHING
    return ctr[C_PHASE]


RULES = (drop_prefilled, _requeue, _preempt_prefilling, _preempt_row, _schedule_rows, _schedule_prefilling, _first_look,
         _reserved_idle, _fits, head_fits, _has_waiting, _admit_waiting, admission_horizon, plan_v1)
INLINED = (_schedule_rows, plan_v1)  # compiled into their callers (sim/jit.py)


@dataclass
class V1Scheduler:
    """vLLM V1's scheduler (the module docstring), its KV in ``kv_budget_tokens // block_size`` blocks."""

    max_batch_size: int  # vLLM's max_num_seqs: running plus prefilling requests
    kv_budget_tokens: int
    max_num_batched_tokens: int
    block_size: int = 16
    chunked_prefill: bool = True
    prefix_caching: bool = True
    lookahead: int = 0  # vLLM's num_lookahead_tokens: the speculation's draft tokens
    async_scheduling: bool = False  # vLLM's --async-scheduling: a step is planned while the previous one runs

    name = "vllm-v1"
    paged = True
    static = False
    prefill = "packed"  # chunks are priced one step at a time (sim.costmodel.model's mixed-step formula)

    @property
    def total_blocks(self) -> int:
        return self.kv_budget_tokens // self.block_size

    def params(self, max_blocks_per_request: int) -> np.ndarray:
        par = np.zeros(N_PARAMS, dtype=np.int64)
        par[P_MAX_SEQS], par[P_BUDGET], par[P_BLOCK] = self.max_batch_size, self.max_num_batched_tokens, self.block_size
        par[P_LOOKAHEAD], par[P_CHUNKED], par[P_CACHING] = self.lookahead, self.chunked_prefill, self.prefix_caching
        par[P_MAX_BLOCKS], par[P_BLOCKS] = max_blocks_per_request, self.total_blocks
        par[P_ASYNC] = self.async_scheduling
        return par

    def initial_static_batch(self) -> int:
        return -1

