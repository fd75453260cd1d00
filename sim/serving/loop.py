"""One replica's serving loop: schedule -> execute -> apply, the same for every backend and clock.

Running requests are rows of numpy arrays, not processes. A clock driver
(:mod:`sim.serving.clock`) calls, per step:

* :meth:`ServingLoop.schedule`: the scheduler admits a block of the queue head
  (a prefill step), else the running rows decode, else the replica is idle;
* ``start_prefill`` / ``start_decode`` (*execute*): for a decode step the policy
  picks k (an int, or one k per row: a *ragged* step, run padded to the largest,
  as vLLM and TensorRT-LLM run it), then the :class:`StepBackend` prices the step
  (the simulator: its duration is returned and the clock waits it out) or runs it
  (the real replay: the clock measures it), and decides how many draft tokens each
  row keeps;
* ``finish_prefill`` / ``finish_decode`` (*apply*): tokens are emitted (a request
  never emits more than its output length; surplus tokens are wasted), finished rows
  retire, the policy observes the step, and the step is recorded.

Per step the work is a handful of vectorised numpy operations over the batch,
whatever its size; request-level sums are kept as Python ints.

**Draft lag.** ``row_lag`` counts a row's emitted tokens that the draft model has not
yet seen (fed as input). After a prefill it is 1 (the first token came from the
target); after a speculative step it is 1, or 2 when every draft token was accepted
(the last draft token was sampled by the draft but never fed back, and the bonus
token is new); a k = 0 step adds 1. The draft's first pass of the next speculative
step feeds all of them (its *catch-up*); a lag L > 1 costs t_draft(b, L, c) -
t_draft(b, 1, c) on top of the step (:meth:`sim.costmodel.StepTable.decode_time_at_lag`).

**Ragged k.** Sequence i keeps min(G_i, k_i) draft tokens and emits that + 1;
drafted tokens are sum k_i (per request and per step); the step record's ``k`` is
K = max k_i and the step is charged as a uniform step at K. An array whose k_i are
all equal runs exactly as the int k.

**Inter-token latencies** are kept compactly: every row that was in the previous
decode step has the same gap (this step's end minus that step's end), so a step
stores one (gap, count) pair plus one gap per request on its first decode step.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from policies.base import BatchView, Policy, StepFeedback
from sim.errors import InputError
from sim.serving.records import (DECODE, MIXED, PREFILL, STEP_DTYPE_V1, ReplicaRecords, buffer_array, grown,
                                 step_buffer, step_columns, value_buffer)

IDLE = -1  # schedule(): nothing to run until a request arrives


class StepBackend(Protocol):
    """What executes a step: prices it (simulated time) or runs it (measured time).

    ``prefill`` and ``decode`` return the step's duration in seconds, or None when the
    step really ran and the clock measures it. ``decode`` also returns the accepted
    draft tokens per running row (None at k = 0). Backends that keep per-row state of
    their own (KV caches) set ``follows_rows`` and are told what the loop applied.
    """

    follows_rows: bool

    def prefill(self, queue, head: int, n: int, mean_prompt: float) -> float | None: ...

    def decode(self, view: BatchView, k: int, ragged: np.ndarray | None, scale: np.ndarray,
               lag: np.ndarray | None) -> tuple[float | None, np.ndarray | None]: ...

    def commit(self) -> None:
        """The decode step's outcome is final: write its tokens (follows_rows only)."""

    def retire(self, done: np.ndarray) -> None:
        """Rows flagged in ``done`` (over the rows before, in order) have left (follows_rows only)."""


class ServingLoop:
    """One replica: a queue (:mod:`sim.serving.queues`), a scheduler, a policy and a step backend."""

    def __init__(self, queue, *, scheduler, policy: Policy, backend: StepBackend, k_max: int) -> None:
        self.queue = queue
        self.scheduler = scheduler
        self.policy = policy
        self.backend = backend
        self.k_max = k_max
        n = queue.capacity
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.decode_steps = np.zeros(n, dtype=np.int64)
        self.drafted = np.zeros(n, dtype=np.int64)
        self.accepted = np.zeros(n, dtype=np.int64)
        if hasattr(queue, "on_grow"):  # a routed queue grows as requests come: so do the arrays above
            queue.on_grow = self._grow_requests
        cap = scheduler.max_batch_size
        # Row state lives in two field-major blocks so that retiring rows compacts every
        # field with one fancy-indexed copy per block; the names below are views into them.
        self._int_rows = np.zeros((7, cap), dtype=np.int64)
        self._float_rows = np.zeros((2, cap))
        (self.row_req, self.row_remaining, self.row_final_context, self.row_accepted,
         self.row_joined_step,  # decode steps run before the row joined
         self.row_joined_k,  # sum of k over those steps
         self.row_lag) = self._int_rows  # emitted tokens the draft has not seen (module docstring)
        self.row_scale, self.row_first_token_s = self._float_rows
        self.running = 0
        self.kv_used = 0
        self.fresh = 0  # rows admitted since the last decode step (at the end of the arrays)
        self.total_remaining = 0  # Python-int sums over the running rows, kept in step
        self.total_final_context = 0
        self.decode_count = 0
        self.k_sum = 0
        self.last_decode_end = 0.0
        self.step_rows = step_buffer()  # append((...)) in sim.serving.records.STEP_DTYPE order
        self.itl_values = value_buffer(np.float64)  # append(x) / extend(xs), like lists
        self.itl_weights = value_buffer(np.int64)
        self.view = BatchView(k_max)
        self.feedback = StepFeedback()
        self._ragged = None  # this step's per-sequence k, when the policy returned an array
        # Fill in feedback only for policies that listen (fixed and none do not).
        self._observes = type(policy).observe is not Policy.observe
        self._tracks_lag = policy.max_k > 0  # a run with a draft pays its catch-up
        # The lag after a speculative step at k, indexed by the row's accepted count: 2 where
        # every draft was kept (the last one was never fed to the draft), else 1.
        self._lag_after = [np.array([1] * k + [2], dtype=np.int64) for k in range(k_max + 1)]
        self._follows = backend.follows_rows
        self.decode_runs = None  # sim.serving.compiled.DecodeRuns, when stretches of decode steps run compiled
        self._on_finish = getattr(queue, "finished", None)  # a client with a concurrency limit listens
        self._cap, self._admit = scheduler.max_batch_size, getattr(scheduler, "admit", None)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.prefilling: list[list[int]] = []  # vllm-v1: [request, tokens prefilled, tokens to prefill], FCFS
        self.requeued: list[int] = []  # vllm-v1: preempted requests, at the head of the waiting queue
        if scheduler.name == "vllm-v1":  # the same loop; a step is a mixed step (section "vllm-v1" below)
            self._init_v1(n)

    def close(self) -> None:
        """Break the references that point back at this loop (its compiled decode runs, the queue's
        growth hook, the vllm-v1 mode's bound step methods), so that dropping the loop frees its
        arrays at once instead of at the garbage collector's next full pass."""
        self.decode_runs = None
        if getattr(self.queue, "on_grow", None) is not None:
            self.queue.on_grow = None
        for name in ("schedule", "start_decode", "finish_decode"):
            self.__dict__.pop(name, None)

    # Per-request arrays (indexed by queue position) and what a request's entry starts as.
    _PER_REQUEST = {"scheduled_s": np.nan, "first_token_s": np.nan, "finish_s": np.nan, "decode_steps": 0,
                    "drafted": 0, "accepted": 0, "preemptions": 0, "preempted_remaining": 0, "last_emit_s": 0.0}

    def _grow_requests(self, capacity: int) -> None:
        for name, start in self._PER_REQUEST.items():
            if hasattr(self, name):  # the v1 mode's own arrays exist only in v1 loops
                setattr(self, name, grown(getattr(self, name), capacity, start))

    # ------------------------------------------------------------ schedule
    def schedule(self) -> int:
        """The next step: n > 0 admits and prefills n requests, 0 decodes, IDLE waits for arrivals."""
        queue = self.queue
        head = queue.head
        waiting = queue.arrived - head
        if waiting and self.running < self._cap:
            n = self._admit(self.running, self.kv_used, queue.kv_reserve[head:head + waiting])
            if n:
                return n
        if self.running:
            return 0
        if waiting:
            raise RuntimeError("a waiting request can never be admitted (checked before the run)")
        return IDLE

    # ------------------------------------------------------------- prefill
    def start_prefill(self, n: int, now: float) -> float | None:
        queue = self.queue
        head, cum = queue.head, queue.prefix
        self._mean_prompt = (cum["prompt"][head + n] - cum["prompt"][head]) / n
        self.kv_used += cum["reserve"][head + n] - cum["reserve"][head]
        return self.backend.prefill(queue, head, n, self._mean_prompt)

    def finish_prefill(self, n: int, start: float, end: float) -> None:
        queue = self.queue
        head, cum = queue.head, queue.prefix
        idx = slice(head, head + n)
        queue.head += n
        self.scheduled_s[idx] = start
        self.first_token_s[idx] = end
        joining = cum["multi"][head + n] - cum["multi"][head]
        if joining == n:  # the common case: every request continues, a contiguous block
            req = idx
            self.total_remaining += cum["remaining"][head + n] - cum["remaining"][head]
            self.total_final_context += cum["final"][head + n] - cum["final"][head]
        else:  # one-token requests end with their prefill
            more = queue.output_tokens[idx] > 1
            done = np.flatnonzero(~more) + head
            self.finish_s[done] = end
            self.kv_used -= int(np.add.reduce(queue.kv_reserve[done]))
            if self._on_finish is not None:
                self._on_finish(done.shape[0], end)
            req = np.flatnonzero(more) + head
            self.total_remaining += int(np.add.reduce(queue.output_tokens[req] - 1))
            self.total_final_context += int(np.add.reduce(queue.final_context[req]))
            if self._follows:
                self.backend.retire(np.concatenate((np.zeros(self.running, bool), ~more)))
        if joining:
            lo, hi = self.running, self.running + joining
            self._int_rows[:4, lo:hi] = queue.joining_ints[:, req]
            self.row_joined_step[lo:hi] = self.decode_count
            self.row_joined_k[lo:hi] = self.k_sum
            self.row_lag[lo:hi] = 1
            self.row_scale[lo:hi] = queue.acceptance_scale[req]
            self.row_first_token_s[lo:hi] = end
            self.running = hi
            self.fresh += joining
        self.scheduler.on_admit(n, self.running)
        self.step_rows.append((start, end, PREFILL, n, self.running, 0, self._mean_prompt, 0, 0, n))

    # -------------------------------------------------------------- decode
    def start_decode(self, now: float) -> float | None:
        b = self.running
        k, ragged = self._choose_k(now, b)
        dt, self._step_accepted = self.backend.decode(self.view, k, ragged, self.row_scale[:b],
                                                      self.row_lag[:b] if self._tracks_lag else None)
        self._dt = dt
        return dt

    def _choose_k(self, now: float, b: int) -> tuple[int, np.ndarray | None]:
        """The policy's k for the b running rows (set on the view it saw), checked."""
        charged = self._charged = self.scheduler.charged_batch_size(b)
        mean_context = self._mean_context = (self.total_final_context - self.total_remaining) / b
        view = self.view
        view.now_s, view.step, view.batch_size, view.running = now, len(self.step_rows), charged, b
        view.mean_context_tokens, view.remaining_tokens = mean_context, self.row_remaining[:b]
        view.final_context_tokens = self.row_final_context[:b]
        view.lag_tokens = self.row_lag[:b]
        k = self.policy.choose_k(view)
        ragged = None
        if k.__class__ is not int or not 0 <= k <= self.k_max:
            k = checked_k(k, self.k_max, self.policy, b)
            if k.__class__ is not int:  # ragged: one k per sequence, charged padded to the largest
                ragged = k
                k = int(np.maximum.reduce(k))
        self._k, self._ragged = k, ragged
        return k, ragged

    def finish_decode(self, start: float, end: float) -> None:
        drafted, accepted_total, emitted_total = self._apply_decode(start, end)
        self.step_rows.append((start, end, DECODE, self._charged, self._step_running, self._k, self._mean_context,
                               drafted, accepted_total, emitted_total))

    def _apply_decode(self, start: float, end: float) -> tuple[int, int, int]:
        """Emit the decode step's tokens, retire finished rows, tell the policy; returns the step's
        drafted, accepted and emitted token counts (``running`` is then the rows left)."""
        if self._follows:
            self.backend.commit()
        b, k, ragged, accepted = self.running, self._k, self._ragged, self._step_accepted
        remaining = self.row_remaining[:b]
        drafted = k * b
        if k:
            if ragged is not None:  # each sequence kept at most its own k_i; per-row drafted gets sum of k_i
                drafted = int(np.add.reduce(ragged))
                self.row_joined_k[:b] += k - ragged  # drafted per row = k_sum - joined_k
            self.row_accepted[:b] += accepted
            accepted_total = int(np.add.reduce(accepted))
            remaining -= accepted + 1  # goes negative where a request ends mid-step
            emitted_total = accepted_total + b
        else:
            accepted_total, emitted_total = 0, b
            remaining -= 1
        finishing = np.minimum.reduce(remaining) <= 0
        if finishing:  # surplus tokens past a request's end are wasted, not emitted
            surplus = remaining[remaining < 0]
            emitted_total += int(np.add.reduce(surplus))
            np.maximum(remaining, 0, out=remaining)
        self.total_remaining -= emitted_total
        if self._tracks_lag:
            lag = self.row_lag[:b]
            if k:
                self._lag_after[k].take(accepted, out=lag)
            else:  # the target's token is news to the draft
                lag += 1
        self.decode_count += 1
        self.k_sum += k
        steady = b - self.fresh
        if steady:
            self.itl_values.append(end - self.last_decode_end)
            self.itl_weights.append(steady)
        if self.fresh:
            self.itl_values.extend((end - self.row_first_token_s[steady:b]).tolist())
            self.itl_weights.extend([1] * self.fresh)
            self.fresh = 0
        self.last_decode_end = end
        if finishing:
            self._retire(b, end)
        charged = self._charged
        if self._observes:
            fb = self.feedback
            fb.now_s, fb.step, fb.batch_size, fb.k = end, len(self.step_rows), charged, k
            fb.step_time_s = self._dt if self._dt is not None else end - start
            fb.drafted_tokens, fb.accepted_tokens, fb.accepted_per_sequence = drafted, accepted_total, accepted
            fb.k_per_sequence = ragged
            self.policy.observe(fb)
        self._step_running = b
        return drafted, accepted_total, emitted_total

    def _retire(self, b: int, now: float) -> None:
        """Record finished rows and compact the survivors to the front, keeping their order."""
        done = self.row_remaining[:b] == 0
        rows = np.flatnonzero(done)
        req = self.row_req[rows]
        self.finish_s[req] = now
        self.decode_steps[req] += self.decode_count - self.row_joined_step[rows]  # += : a preempted request's
        self.drafted[req] += self.k_sum - self.row_joined_k[rows]  # earlier rows were added when preempted
        self.accepted[req] += self.row_accepted[rows]
        self.kv_used -= int(np.add.reduce(self.queue.kv_reserve[req]))
        self.total_final_context -= int(np.add.reduce(self.row_final_context[rows]))
        keep = np.flatnonzero(~done)
        survivors = keep.shape[0]
        self._int_rows[:, :survivors] = self._int_rows[:, keep]
        self._float_rows[:, :survivors] = self._float_rows[:, keep]
        self.running = survivors
        if self._follows:
            self.backend.retire(done)
        if self._on_finish is not None:
            self._on_finish(rows.shape[0], now)

    # ------------------------------------------------------------ vllm-v1
    # Every step is one mixed step (for the clock: schedule() answers 0, "run a step", or IDLE):
    # the running rows decode with their 1 + k tokens, then prefill chunks fill the token
    # budget (sim.scheduler.ChunkedPrefillScheduler says how; docs/scheduling.md). A request
    # joins the rows when its last chunk is in, emitting a token (its first, or after a
    # preemption the next one); preempted rows leave from the tail and wait at the queue head.

    def _init_v1(self, n: int) -> None:
        self.step_rows = step_buffer(STEP_DTYPE_V1)  # its records carry three more columns
        self.schedule, self.start_decode, self.finish_decode = self._schedule_v1, self._start_v1, self._finish_v1
        self.blocks_used = 0  # rows' and partial prefills' blocks, between steps
        self._row_blocks = 0  # the rows' part of it
        self.peak_blocks = 0
        self.preempted_remaining = np.zeros(n, dtype=np.int64)  # a preempted request's output still owed
        self.last_emit_s = np.zeros(n)  # ... and when it emitted its last token (its next ITL starts there)
        self._chunks: list[tuple[list[int], int]] = []

    def _schedule_v1(self) -> int:
        queue = self.queue
        if self.running or self.prefilling or self.requeued or queue.arrived > queue.head:
            return 0
        return IDLE

    def _start_v1(self, now: float) -> float | None:
        sched, b = self.scheduler, self.running
        free = sched.total_blocks - self.blocks_used
        budget = sched.max_num_batched_tokens
        self._preempted_now = 0
        k = ragged = None
        if b:
            k, ragged = self._choose_k(now, b)
            ctx = self.row_final_context[:b] - self.row_remaining[:b]
            ends = sched.blocks(ctx + 1 + (k if ragged is None else ragged))  # blocks each row needs now
            need = int(np.add.reduce(ends)) - self._row_blocks  # rows hold blocks(ctx) between steps
            while need > free and self.prefilling:  # the newest first: partially prefilled requests ...
                free += self._preempt_prefilling(len(self.prefilling) - 1)
            if need > free:  # ... then the newest rows
                held = sched.blocks(ctx)
                m = sched.victims(ends - held, held, free)
                free += int(np.add.reduce(held[b - m:]))
                need -= int(np.add.reduce(ends[b - m:] - held[b - m:]))
                self._preempt_rows(m)
                b = self.running
                if ragged is not None:  # the survivors' ks: one k again if they agree
                    k, ragged = collapsed(ragged[:b]) if b else (k, None)
                self._ragged = ragged
            free -= need
            budget -= b + (k * b if ragged is None else int(np.add.reduce(ragged)))
        self._chunks = chunks = []
        budget_after_decodes = budget
        for index, entry in enumerate(self.prefilling):  # continue partial prefills, FCFS
            if budget <= 0:
                break
            done = entry[1]
            tokens = min(entry[2] - done, budget)
            blocks = sched.blocks(done + tokens) - sched.blocks(done)
            if blocks > free:  # vLLM preempts from the running tail: this request and any after it
                while len(self.prefilling) > index:
                    free += self._preempt_prefilling(len(self.prefilling) - 1)
                break
            free -= blocks
            budget -= tokens
            chunks.append((entry, tokens))
        if self._preempted_now:  # as vLLM v1: a step that preempts starts no waiting request
            self._free_after_admit = free
        else:
            budget = self._admit_waiting(now, budget, free, b)
        self._chunk_tokens = budget_after_decodes - budget
        self.blocks_used = self._step_blocks = used = sched.total_blocks - self._free_after_admit
        if used > self.peak_blocks:
            self.peak_blocks = used
        if not b and not chunks:
            raise RuntimeError("a vllm-v1 step with nothing to run (checked before the run)")
        self._v1_running = b
        dt = 0.0
        self._step_accepted = None
        if b:
            view = self.view
            if b != view.running:  # rows were preempted after the policy chose k
                view.batch_size = view.running = self._charged = b
                view.mean_context_tokens = self._mean_context = (self.total_final_context - self.total_remaining) / b
                view.remaining_tokens, view.final_context_tokens = self.row_remaining[:b], self.row_final_context[:b]
            self._k = k
            dt, self._step_accepted = self.backend.decode(view, k, ragged, self.row_scale[:b],
                                                          self.row_lag[:b] if self._tracks_lag else None)
        if chunks:
            dt += self.backend.chunks(sched.max_num_batched_tokens - budget_after_decodes, self._chunk_tokens)
        self._dt = dt
        return dt

    def _admit_waiting(self, now: float, budget: int, free: int, running: int) -> int:
        """Start prefilling waiting requests, FCFS (preempted ones first), while budget, blocks and
        max_num_seqs allow; a waiting request that does not fit stops the admissions (it never preempts).
        Returns the budget left."""
        sched, queue = self.scheduler, self.queue
        while budget > 0 and running + len(self.prefilling) < self._cap:
            if self.requeued:
                req = self.requeued[0]
                owed = self.preempted_remaining[req]
                target = int(queue.prompt_tokens[req]) + (int(queue.output_tokens[req]) - int(owed)
                                                          if self.first_token_s[req] == self.first_token_s[req] else 0)
            elif queue.head < queue.arrived:
                req = queue.head
                target = int(queue.prompt_tokens[req])
            else:
                break
            tokens = sched.chunk(target, budget)
            blocks = sched.blocks(tokens)
            if not tokens or blocks > free:
                break
            if self.requeued:
                del self.requeued[0]
            else:
                queue.head += 1
                self.scheduled_s[req] = now
            entry = [req, 0, target]
            self.prefilling.append(entry)
            self._chunks.append((entry, tokens))
            free -= blocks
            budget -= tokens
        self._free_after_admit = free
        return budget

    def _preempt_prefilling(self, index: int) -> int:
        """Preempt a partially prefilled request: back to the waiting head; returns the blocks it freed."""
        req, done, _ = self.prefilling.pop(index)
        self.requeued.insert(0, req)
        self.preemptions[req] += 1
        self._preempted_now += 1
        return self.scheduler.blocks(done)

    def _preempt_rows(self, m: int) -> None:
        """Preempt the last ``m`` rows (the newest): their KV is dropped, they wait at the queue head
        for recompute, oldest first (vLLM prepends each one it pops from the running tail)."""
        b = self.running
        lo = b - m
        rows = slice(lo, b)
        req = self.row_req[rows].copy()
        self.decode_steps[req] += self.decode_count - self.row_joined_step[rows]
        self.drafted[req] += self.k_sum - self.row_joined_k[rows]
        self.accepted[req] += self.row_accepted[rows]
        self.preempted_remaining[req] = self.row_remaining[rows]
        steady = b - self.fresh  # rows that emitted in the last decode step; later rows joined since
        self.last_emit_s[req] = np.where(np.arange(lo, b) < steady, self.last_decode_end,
                                         self.row_first_token_s[rows])
        self.fresh -= min(self.fresh, m)
        self.total_remaining -= int(np.add.reduce(self.row_remaining[rows]))
        self.total_final_context -= int(np.add.reduce(self.row_final_context[rows]))
        self.preemptions[req] += 1
        self._preempted_now += m
        self.requeued[:0] = req.tolist()
        self.running = lo

    def _finish_v1(self, start: float, end: float) -> None:
        b = self._v1_running
        drafted = accepted_total = emitted_total = 0
        if b:
            drafted, accepted_total, emitted_total = self._apply_decode(start, end)
        prefill_tokens = 0
        for entry, tokens in self._chunks:
            entry[1] += tokens
            prefill_tokens += tokens
            if entry[1] == entry[2]:
                self.prefilling.remove(entry)
                emitted_total += 1
                self._join(entry[0], end)
        sched = self.scheduler
        r = self.running
        used = self._row_blocks = (int(np.add.reduce(sched.blocks(self.row_final_context[:r] - self.row_remaining[:r])))
                                   if r else 0)
        for entry in self.prefilling:
            used += sched.blocks(entry[1])
        self.blocks_used = used
        phase = (DECODE if not self._chunks else MIXED) if b else PREFILL
        self.step_rows.append((start, end, phase, b, b, self._k if b else 0, self._mean_context if b else 0.0,
                               drafted, accepted_total, emitted_total, prefill_tokens, self._step_blocks,
                               self._preempted_now))

    def _join(self, req: int, end: float) -> None:
        """A request's last chunk is in: it emits a token and, unless that was its last, joins the rows."""
        queue = self.queue
        if self.first_token_s[req] != self.first_token_s[req]:  # NaN: its first token
            self.first_token_s[req] = end
            remaining = int(queue.output_tokens[req]) - 1
        else:  # recomputed after a preemption: its next token, one inter-token gap
            remaining = int(self.preempted_remaining[req]) - 1
            self.itl_values.append(end - self.last_emit_s[req])
            self.itl_weights.append(1)
        if remaining == 0:
            self.finish_s[req] = end
            if self._on_finish is not None:
                self._on_finish(1, end)
            return
        r = self.running
        self._int_rows[:, r] = (req, remaining, queue.final_context[req], 0, self.decode_count, self.k_sum, 1)
        self.row_scale[r] = queue.acceptance_scale[req]
        self.row_first_token_s[r] = end
        self.running = r + 1
        self.fresh += 1
        self.total_remaining += remaining
        self.total_final_context += int(queue.final_context[req])

    # ------------------------------------------------------------- results
    def outstanding_requests(self) -> int:
        """Given to this replica and not finished: waiting (or being prefilled) plus running."""
        return self.queue.count - self.queue.head + self.running + len(self.prefilling) + len(self.requeued)

    def outstanding_tokens(self) -> int:
        """Prompt tokens not yet prefilled plus output tokens not yet emitted, over unfinished requests."""
        queue = self.queue
        cum, head, end = queue.prefix, queue.head, queue.count
        waiting_prompt = cum["prompt"][end] - cum["prompt"][head]
        waiting_output = cum["remaining"][end] - cum["remaining"][head] + (end - head)
        tokens = waiting_prompt + waiting_output + self.total_remaining
        if self.prefilling or self.requeued:  # vllm-v1: prompts (or recomputes) not yet in, and their outputs
            for req, done, target in self.prefilling:
                tokens += target - done + self._owed(req)
            for req in self.requeued:
                tokens += int(queue.prompt_tokens[req]) + self._owed(req)
        return tokens

    def _owed(self, req: int) -> int:
        """Output tokens a request not in the rows still owes."""
        if self.first_token_s[req] != self.first_token_s[req]:
            return int(self.queue.output_tokens[req])
        return int(self.preempted_remaining[req])

    def records(self) -> ReplicaRecords:
        v1 = self.scheduler.name == "vllm-v1"
        return ReplicaRecords(self.scheduled_s, self.first_token_s, self.finish_s, self.decode_steps,
                              self.drafted, self.accepted, step_columns(self.step_rows),
                              buffer_array(self.itl_values), buffer_array(self.itl_weights),
                              self.preemptions if v1 else None)


def checked_k(k, k_max: int, policy: Policy, running: int):
    """A policy's bad answer ends the run with one line naming it (and nothing written).

    Returns an int k, or for a per-sequence answer an int64 array of ``running`` values
    (collapsed to an int when they are all equal, which runs exactly as that int).
    """
    if isinstance(k, np.ndarray):
        return checked_ks(k, k_max, policy, running)
    if isinstance(k, (bool, float)) or not isinstance(k, (int, np.integer)):
        raise InputError(f"policy '{policy.name}' returned k = {k!r}; it must return an int", field="policy.name")
    if not 0 <= int(k) <= k_max:
        raise InputError(f"policy '{policy.name}' returned k = {int(k)}, outside 0..{k_max} "
                         "(its max_k, within what the profile measured)", field="policy.name")
    return int(k)


def checked_ks(ks: np.ndarray, k_max: int, policy: Policy, running: int):
    """:func:`checked_k` for a per-sequence answer."""
    where = f"policy '{policy.name}' returned per-sequence k"
    if ks.dtype.kind not in "iu":
        raise InputError(f"{where} of dtype {ks.dtype}; it must be an integer array", field="policy.name")
    if ks.shape != (running,):
        raise InputError(f"{where} of shape {ks.shape}; it must have one k per running sequence, "
                         f"shape ({running},)", field="policy.name")
    lo, hi = int(np.minimum.reduce(ks)), int(np.maximum.reduce(ks))
    if lo < 0 or hi > k_max:
        raise InputError(f"{where} in {lo}..{hi}, outside 0..{k_max} "
                         "(its max_k, within what the profile measured)", field="policy.name")
    if lo == hi:
        return hi
    return ks.astype(np.int64)  # a copy: the policy may reuse its array


def collapsed(ks: np.ndarray) -> tuple[int, np.ndarray | None]:
    """Per-sequence ks as (k, ragged): one k when every sequence has the same, else the largest
    (what the step is charged at) and the array (as :func:`checked_ks` answers, which has its
    bounds already)."""
    hi = int(np.maximum.reduce(ks))
    return (hi, None) if int(np.minimum.reduce(ks)) == hi else (hi, ks)
