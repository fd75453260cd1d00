"""The step, written once: schedule, choose k, plan, run, update (nano-vllm's ``step()``).

Every replica step, interpreted or compiled, is these functions called in this order:

1. :func:`begin`: the scheduler's first look (v0 decides the step's kind here; vllm-v1 schedules
   after k is known): how many running rows a policy chooses k for, the batch size they are
   charged at and their mean context: *the* view a policy sees (``BatchView``, policies/base.py);
2. the policy's k: a Python policy (sim/serving/loop.py) or its compiled form
   (sim/serving/kernel.py's ``choose``), spread over the rows by :func:`plan`;
3. :func:`plan`: the scheduler's decision, the **plan** (sim/serving/plan.py reads it): the rows
   scheduled and each one's k after a host matcher's rows cut theirs (sim.speculation.proposals), the
   prefill chunks and their cached prefixes (vllm-v1) or the prompts admitted (v0) and the length
   they are priced at, the batch size the decodes are charged at, their mean context and largest
   draft lag;
4. the backend runs the plan: :func:`price` is the simulator's (the step table's price: the one
   place that decides how a step is priced), a real replay runs it on a GPU, a playback reads it;
   a compiled run draws acceptance with :func:`draw`, a Python one with its sampler;
5. :func:`update`: the step's outcome is applied (tokens emitted, prefilled requests joining the
   rows, finished ones retiring and giving their KV back) and recorded.

The state these read and write is grouped by owner in named tuples of arrays (:class:`Replica`:
the running rows, the requests, the KV-cache manager's blocks, the scheduler's counters and
queues), which numba compiles as it does arrays. The plan lives in the scheduler's plan slots
(``C_STEP_*``, ``S_ROW_K``, ``S_CHUNK_*``, sim/scheduler/layout.py); only :func:`plan` writes them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim.costmodel.rules import chunk_price, decode_price, prefill_price, prefix_attention_price, tokens_price
from sim.speculation.proposals import count_accepted, propose_rows
from sim.scheduler.layout import (C_ADMIT, C_CHUNK_TOKENS, C_CHUNKS, C_DECODE_TOKENS, C_DRAW_POS, C_OFFERED_K,
                                  C_PHASE, C_PREEMPTED_NOW, C_RAGGED, C_RUNNING, C_STEP_BLOCKS, C_STEP_CHARGED,
                                  C_STEP_K, C_STEP_LAG, C_STEP_ROWS, C_STEP_RUNNING, C_TOTAL_CONTEXT, DECODE,
                                  LAST_STEP_END, MIXED, PREFILL, REQ_OUTPUT, ROW_REMAINING, ROW_SCALE,
                                  S_CHUNK_PREFIX, S_CHUNK_TOKENS, S_ROW_K, STEP_MEAN, STEP_PROMPT, C_HEAD)
from sim.scheduler.v0 import charged_batch, plan_v0, prefill_prompt
from sim.scheduler.v1 import plan_v1
from sim.serving.rules import (StepRecord, apply_chunks, apply_decode, apply_prefill, retire, step_rows_stats,
                               write_step)


class Batch(NamedTuple):
    """The running rows (layout.py ``ROW_*``), the k each is given, what each kept, which just finished."""

    rows: np.ndarray
    rowf: np.ndarray
    ks: np.ndarray
    accepted: np.ndarray
    done: np.ndarray  # update: the rows before retirement that finished (backends that follow rows)


class Requests(NamedTuple):
    """Per request: the queue's inputs (``REQ_*``, each one's acceptance scale) and its records (``REC_*``)."""

    inputs: np.ndarray
    scale: np.ndarray
    ints: np.ndarray
    floats: np.ndarray


class Blocks(NamedTuple):
    """The KV-cache manager's arrays (sim/scheduler/kvcache.py; vllm-v1)."""

    kv: np.ndarray
    queue: np.ndarray  # the free blocks, in the order they were freed
    key_block: np.ndarray
    slot_blocks: np.ndarray
    scratch: np.ndarray


class Replica(NamedTuple):
    """One replica's state, by owner; ``counters``/``clocks``/``sched``/``params``: the scheduler's
    counters, clocks, queues and plan rows, and settings (layout.py)."""

    batch: Batch
    requests: Requests
    blocks: Blocks
    counters: np.ndarray
    clocks: np.ndarray
    sched: np.ndarray
    params: np.ndarray
    paged: bool  # vllm-v1 (else v0)
    track_lag: int  # how the drafter's lag moves (sim/serving/rules.py)


class Prices(NamedTuple):
    """The step table as :func:`price` reads it (sim.costmodel.model.StepTable; sim/costmodel/rules.py)."""

    decode: np.ndarray
    decode_lag2: np.ndarray
    catch_up: np.ndarray
    prefill: np.ndarray
    chunk: np.ndarray
    context_step: float
    prompt_step: float
    chunk_step: float
    prefill_overhead: float
    exposed_overhead: float
    overlapped: bool
    kv_read_cost: float
    attention_coefficient: float
    graph_pad: np.ndarray
    ragged_by_tokens: bool  # a host matcher's ragged step is priced by its tokens (sim.serving.priced)


class Proposer(NamedTuple):
    """How rows propose (sim.speculation.proposals; mode 0: every row proposes its k)."""

    mode: int
    match_rate: float
    seed: int
    runs: np.ndarray
    start: np.ndarray
    length: np.ndarray


class Draws(NamedTuple):
    """A compiled run's acceptance draws (sim.speculation.acceptance's buffer, read in place) and their tally."""

    kind: int
    ints: np.ndarray
    floats: np.ndarray
    negative_rates: np.ndarray
    counts: np.ndarray


class Records(NamedTuple):
    """Where steps and inter-token gaps are recorded (sim.serving.records.Buffers)."""

    steps: np.ndarray
    itl_values: np.ndarray
    itl_weights: np.ndarray


def begin(s):
    """The scheduler's first look: (rows a policy chooses k for, the batch size they are charged at,
    their mean context). v0 plans here (a prefill, a decode or nothing: ``C_PHASE``); vllm-v1
    plans once k is known, over its running rows."""
    ctr = s.counters
    if s.paged:
        b = ctr[C_RUNNING]
        charged = b
    else:
        if plan_v0(s.requests.inputs, ctr, s.params) != DECODE:
            return 0, 0, 0.0
        b = ctr[C_RUNNING]
        charged = charged_batch(ctr, b)
    if b == 0:
        return 0, 0, 0.0
    return b, charged, ctr[C_TOTAL_CONTEXT] / b


def plan(s, b, k, ragged, proposer, now):
    """The step's plan, given the policy's k for the ``b`` rows :func:`begin` offered (``ragged``:
    one k per row, already in ``ks``; else k for all); returns the step's kind (``C_PHASE``) and
    the rows it decodes."""
    ctr, clk, sched, batch = s.counters, s.clocks, s.sched, s.batch
    ks = batch.ks
    if b and not ragged:
        for i in range(b):
            ks[i] = k
    if s.paged:
        if b and proposer.mode:
            ctr[C_OFFERED_K] = k
            propose_rows(ks, b, batch.rows, batch.rowf, s.requests.inputs, proposer)
        phase = plan_v1(s, now)
    else:
        phase = ctr[C_PHASE]
        if phase == PREFILL:
            priced, mean = prefill_prompt(s.requests.inputs, ctr, s.params)
            clk[STEP_PROMPT] = priced
            clk[STEP_MEAN] = mean
            return phase, 0
        if phase != DECODE:
            return phase, 0
        for i in range(b):
            sched[S_ROW_K, i] = ks[i]
        ctr[C_STEP_K] = k
        ctr[C_RAGGED] = ragged
        if proposer.mode:
            ctr[C_OFFERED_K] = k
            top, cut = propose_rows(sched[S_ROW_K], b, batch.rows, batch.rowf, s.requests.inputs, proposer)
            ctr[C_STEP_K] = top
            ctr[C_RAGGED] = cut
    m = ctr[C_STEP_ROWS] if phase == DECODE or phase == MIXED else 0
    if m:
        total, lag = step_rows_stats(batch.rows, m, s.track_lag)
        ctr[C_STEP_CHARGED] = charged_batch(ctr, m)
        ctr[C_STEP_LAG] = lag
        clk[STEP_MEAN] = total / m
    return phase, m


def decode_rows(s):
    """The rows the plan decodes (0: none)."""
    phase = s.counters[C_PHASE]
    return s.counters[C_STEP_ROWS] if phase == DECODE or phase == MIXED else 0


def price(s, p):
    """What the plan costs by the step table (the simulator's backend; sim.costmodel.rules): a v0
    prefill at its priced prompt length; decodes at their charged batch size, mean context and
    largest k (a host matcher's ragged step by its tokens) with the draft's catch-up at the
    largest lag; a vllm-v1 step's chunks on top."""
    ctr, clk = s.counters, s.clocks
    if not s.paged and ctr[C_PHASE] == PREFILL:
        return prefill_price(p.prefill, ctr[C_ADMIT], clk[STEP_PROMPT] / p.prompt_step)
    m = decode_rows(s)
    dt = 0.0
    if m:
        charged, x = ctr[C_STEP_CHARGED], clk[STEP_MEAN] / p.context_step
        if p.ragged_by_tokens and ctr[C_RAGGED]:
            dt = tokens_price(p.decode, charged, s.sched[S_ROW_K], m, x)
        else:
            dt = decode_price(p.decode, p.decode_lag2, p.catch_up, charged, ctr[C_STEP_K], x, ctr[C_STEP_LAG])
    if s.paged and ctr[C_CHUNK_TOKENS]:
        sched = s.sched
        prefix_cost = prefix_attention_price(p.kv_read_cost, p.attention_coefficient, sched[S_CHUNK_TOKENS],
                                             sched[S_CHUNK_PREFIX], ctr[C_CHUNKS])
        dt += chunk_price(p.chunk, p.chunk_step, p.prefill_overhead, p.exposed_overhead, p.overlapped, p.graph_pad,
                          ctr[C_DECODE_TOKENS] if m else 0, ctr[C_CHUNK_TOKENS], prefix_cost)
    return dt


def draw(s, d):
    """The draft tokens each decoded row keeps, from a compiled run's draw buffer (sim.speculation.acceptance)."""
    m = decode_rows(s)
    ctr = s.counters
    if not m or not ctr[C_STEP_K]:
        return
    pos = ctr[C_DRAW_POS]
    accepted = s.batch.accepted
    count_accepted(d.kind, d.ints, d.floats, pos, s.batch.rowf[ROW_SCALE], s.sched[S_ROW_K], m, d.negative_rates,
                   accepted)
    for i in range(m):
        d.counts[accepted[i]] += 1
    ctr[C_DRAW_POS] = pos + m


def update(s, out, start, end, flag_done):
    """Apply the plan, run from ``start`` to ``end``, and record the step. Returns (requests finished,
    tokens emitted, accepted, drafted, rows that drafted, rows flagged in ``batch.done``: with
    ``flag_done``, the rows before retirement (v0: and the prompts just prefilled) that finished)."""
    ctr, clk, batch = s.counters, s.clocks, s.batch
    clk[LAST_STEP_END] = end
    phase = ctr[C_PHASE]
    if phase == PREFILL and not s.paged:
        n = ctr[C_ADMIT]
        flagged = _flag_prefilled(s, n) if flag_done else 0
        finished = apply_prefill(s, n, start, end)
        write_step(out.steps, ctr, StepRecord(start, end, PREFILL, n, ctr[C_RUNNING], 0, clk[STEP_MEAN], 0, 0, 0, n,
                                              0, 0, 0))
        return finished, n, 0, 0, 0, flagged if finished else 0
    m = decode_rows(s)
    emitted = accepted = drafted = drafts = 0
    finishing = False
    if m:
        emitted, accepted, drafted, drafts, finishing = apply_decode(s, m, out, end)
    finished = 0
    prefill_tokens = 0
    if s.paged and ctr[C_CHUNKS]:  # a call passes the state's arrays on the stack: only for a step with chunks
        more, prefill_tokens, finished = apply_chunks(s, out, end)
        emitted += more
    flagged = 0
    if finishing:
        if flag_done:
            flagged = ctr[C_RUNNING]
            for i in range(flagged):
                batch.done[i] = batch.rows[ROW_REMAINING, i] == 0
        finished += retire(s, end)
    k = ctr[C_STEP_K] if m else 0
    mean = clk[STEP_MEAN] if m else 0.0
    if s.paged:
        step = StepRecord(start, end, phase, m, ctr[C_STEP_RUNNING], k, mean, drafted, drafts, accepted, emitted,
                          prefill_tokens, ctr[C_STEP_BLOCKS], ctr[C_PREEMPTED_NOW])
    else:
        step = StepRecord(start, end, DECODE, ctr[C_STEP_CHARGED], m, k, mean, drafted, drafts, accepted, emitted,
                          0, 0, 0)
    write_step(out.steps, ctr, step)
    return finished, emitted, accepted, drafted, drafts, flagged


def _flag_prefilled(s, n):
    """v0: flags the rows as a backend that follows them sees them after a prefill of n prompts (the
    running rows, then the prompts; a one-token request ends with its prefill). Returns how many."""
    running, head = s.counters[C_RUNNING], s.counters[C_HEAD]
    for i in range(running):
        s.batch.done[i] = False
    for i in range(n):
        s.batch.done[running + i] = s.requests.inputs[REQ_OUTPUT, head + i] == 1
    return running + n


RULES = (begin, plan, decode_rows, price, draw, update, _flag_prefilled)
INLINED = (begin, plan, decode_rows, price, draw, update)  # compiled into their callers (sim/jit.py)
