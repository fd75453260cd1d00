"""The SimPy replica: one process, one SimPy event per engine step.

Running requests are rows of numpy arrays, not processes; arrivals are a sorted
array the replica reads as its clock passes them, so the event queue holds only
the replica's own step timeouts. Per step the work is a handful of vectorised
numpy operations over the batch, whatever its size:

* prefill step: admit n requests from the queue head (the scheduler decides), charge
  the prefill curve, emit each request's first token;
* decode step: ask the policy for k, charge k draft passes + one target pass over
  k + 1 tokens + verification, draw accepted counts, emit min(a + 1, remaining).

Inter-token latencies are kept compactly: every row that was in the previous
decode step has the same gap (this step's end minus that step's end), so a step
stores one (gap, count) pair plus one gap per request on its first decode step.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np
import simpy

from policies.base import BatchView, Policy, StepFeedback
from sim.acceptance import AcceptanceSampler
from sim.costmodel import StepTable

PREFILL, DECODE = 0, 1
STEP_FIELDS = ("start_s", "end_s", "phase", "batch_size", "running", "k", "mean_context_tokens",
               "drafted_tokens", "accepted_tokens", "emitted_tokens")


@dataclass
class ReplicaRecords:
    """What one replica measured; arrays are indexed by request (in arrival order)."""

    scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    decode_steps: np.ndarray
    drafted_tokens: np.ndarray
    accepted_tokens: np.ndarray
    steps: dict[str, np.ndarray]
    itl_values: np.ndarray
    itl_weights: np.ndarray


class Replica:
    def __init__(self, env: simpy.Environment, *, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
                 output_tokens: np.ndarray, acceptance_scale: np.ndarray, kv_reserve: np.ndarray,
                 table: StepTable, scheduler, policy: Policy, sampler: AcceptanceSampler,
                 speculative: bool) -> None:
        self.env = env
        self.arrival_s = arrival_s
        self._arrivals = arrival_s.tolist()  # bisect on a list is the cheapest clock check
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.acceptance_scale = acceptance_scale
        self.kv_reserve = kv_reserve
        self.table = table
        self.scheduler = scheduler
        self.policy = policy
        self.sampler = sampler
        self.speculative = speculative
        n = arrival_s.shape[0]
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.decode_steps = np.zeros(n, dtype=np.int64)
        self.drafted = np.zeros(n, dtype=np.int64)
        self.accepted = np.zeros(n, dtype=np.int64)
        cap = scheduler.max_batch_size
        self.row_req = np.zeros(cap, dtype=np.int64)
        self.row_remaining = np.zeros(cap, dtype=np.int64)
        self.row_context = np.zeros(cap, dtype=np.int64)
        self.row_drafted = np.zeros(cap, dtype=np.int64)
        self.row_accepted = np.zeros(cap, dtype=np.int64)
        self.row_steps = np.zeros(cap, dtype=np.int64)
        self.row_scale = np.zeros(cap)
        self.row_first_token_s = np.zeros(cap)
        self._rows = (self.row_req, self.row_remaining, self.row_context, self.row_drafted,
                      self.row_accepted, self.row_steps, self.row_scale, self.row_first_token_s)
        self.running = 0
        self.kv_used = 0
        self.queue_head = 0
        self.arrived = 0
        self.fresh = 0  # rows admitted since the last decode step (at the end of the arrays)
        self.last_decode_end = 0.0
        self.steps: dict[str, list] = {f: [] for f in STEP_FIELDS}
        self.itl_values: list[float] = []
        self.itl_weights: list[int] = []
        self.view = BatchView(table.k_max)
        self.feedback = StepFeedback()
        self.process = env.process(self._run())

    def records(self) -> ReplicaRecords:
        steps = {f: np.asarray(v, dtype=np.int64 if f in ("phase", "batch_size", "running", "k", "drafted_tokens",
                                                             "accepted_tokens", "emitted_tokens") else np.float64)
                 for f, v in self.steps.items()}
        return ReplicaRecords(self.scheduled_s, self.first_token_s, self.finish_s, self.decode_steps,
                              self.drafted, self.accepted, steps,
                              np.asarray(self.itl_values, dtype=np.float64),
                              np.asarray(self.itl_weights, dtype=np.int64))

    def _run(self):
        env, arrivals, total = self.env, self._arrivals, len(self._arrivals)
        admit = self.scheduler.admit
        while True:
            now = env.now
            self.arrived = bisect_right(arrivals, now, self.arrived)
            waiting = self.arrived - self.queue_head
            if self.running == 0 and waiting == 0:
                if self.arrived == total:
                    return
                yield env.timeout(arrivals[self.arrived] - now)
                continue
            n = admit(self.running, self.kv_used,
                      self.kv_reserve[self.queue_head:self.arrived]) if waiting else 0
            if n:
                yield from self._prefill(n)
            elif self.running:
                yield from self._decode()
            else:
                raise RuntimeError("a waiting request can never be admitted (checked before the run)")

    def _prefill(self, n: int):
        env, head = self.env, self.queue_head
        idx = slice(head, head + n)
        self.queue_head += n
        prompts = self.prompt_tokens[idx]
        mean_prompt = float(prompts.mean())
        self.kv_used += int(self.kv_reserve[idx].sum())
        start = env.now
        yield env.timeout(self.table.prefill_time(n, mean_prompt))
        end = env.now
        self.scheduled_s[idx] = start
        self.first_token_s[idx] = end
        outputs = self.output_tokens[idx]
        more = outputs > 1
        joining = int(np.count_nonzero(more))
        if joining < n:  # one-token requests end with their prefill
            done = np.flatnonzero(~more) + head
            self.finish_s[done] = end
            self.kv_used -= int(self.kv_reserve[done].sum())
        if joining:
            lo, hi = self.running, self.running + joining
            req = np.flatnonzero(more) + head if joining < n else np.arange(head, head + n)
            self.row_req[lo:hi] = req
            self.row_remaining[lo:hi] = self.output_tokens[req] - 1
            self.row_context[lo:hi] = self.prompt_tokens[req]
            self.row_drafted[lo:hi] = 0
            self.row_accepted[lo:hi] = 0
            self.row_steps[lo:hi] = 0
            self.row_scale[lo:hi] = self.acceptance_scale[req]
            self.row_first_token_s[lo:hi] = end
            self.running = hi
            self.fresh += joining
        self.scheduler.on_admit(n, self.running)
        self._record(start, end, PREFILL, n, self.running, 0, mean_prompt, 0, 0, n)

    def _decode(self):
        env, b = self.env, self.running
        charged = self.scheduler.charged_batch_size(b)
        context = self.row_context[:b]
        remaining = self.row_remaining[:b]
        mean_context = float(context.sum()) / b
        start = env.now
        view = self.view
        view.now_s, view.step, view.batch_size = start, len(self.steps["start_s"]), charged
        view.mean_context_tokens, view.context_tokens, view.remaining_tokens = mean_context, context, remaining
        k = self.policy.choose_k(view)
        if k.__class__ is not int:
            k = _checked_k(k, self.table.k_max, self.policy)
        elif not 0 <= k <= self.table.k_max:
            _checked_k(k, self.table.k_max, self.policy)
        dt = self.table.decode_time(charged, k, mean_context)
        yield env.timeout(dt)
        end = env.now
        if k:
            accepted = self.sampler.accepted(self.row_scale[:b], k)
            emitted = accepted + 1
            np.minimum(emitted, remaining, out=emitted)
            self.row_drafted[:b] += k
            self.row_accepted[:b] += accepted
            accepted_total = int(accepted.sum())
        else:
            accepted = None
            emitted = 1
            accepted_total = 0
        remaining -= emitted
        context += emitted
        self.row_steps[:b] += 1
        emitted_total = int(emitted.sum()) if k else b
        steady = b - self.fresh
        if steady:
            self.itl_values.append(end - self.last_decode_end)
            self.itl_weights.append(steady)
        if self.fresh:
            self.itl_values.extend((end - self.row_first_token_s[steady:b]).tolist())
            self.itl_weights.extend([1] * self.fresh)
            self.fresh = 0
        self.last_decode_end = end
        if np.count_nonzero(remaining) < b:
            self._retire(b, end)
        fb = self.feedback
        fb.now_s, fb.step, fb.batch_size, fb.k, fb.step_time_s = end, view.step, charged, k, dt
        fb.drafted_tokens, fb.accepted_tokens = k * b, accepted_total
        if accepted is not None:
            fb.accepted_per_sequence = accepted
        self.policy.observe(fb)
        self._record(start, end, DECODE, charged, b, k, mean_context, k * b, accepted_total, emitted_total)

    def _retire(self, b: int, now: float) -> None:
        """Record finished rows and compact the survivors to the front, keeping their order."""
        done = self.row_remaining[:b] == 0
        rows = np.flatnonzero(done)
        req = self.row_req[rows]
        self.finish_s[req] = now
        self.decode_steps[req] = self.row_steps[rows]
        self.drafted[req] = self.row_drafted[rows]
        self.accepted[req] = self.row_accepted[rows]
        self.kv_used -= int(self.kv_reserve[req].sum())
        keep = ~done
        survivors = b - rows.shape[0]
        for array in self._rows:
            array[:survivors] = array[:b][keep]
        self.running = survivors

    def _record(self, *values) -> None:
        for field, value in zip(STEP_FIELDS, values):
            self.steps[field].append(value)


def _checked_k(k, k_max: int, policy: Policy) -> int:
    if isinstance(k, (bool, float)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"policy '{policy.name}' returned k = {k!r}; it must return an int")
    if not 0 <= int(k) <= k_max:
        raise ValueError(f"policy '{policy.name}' returned k = {int(k)}, outside 0..{k_max} (the profile's range)")
    return int(k)
