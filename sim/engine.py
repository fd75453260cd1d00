"""The SimPy replica: one process, one SimPy event per engine step.

Running requests are rows of numpy arrays, not processes; arrivals are a sorted
array the replica reads as its clock passes them, so the event queue holds only
the replica's own step timeouts. Per step the work is a handful of vectorised
numpy operations over the batch, whatever its size:

* prefill step: admit n requests from the queue head (the scheduler decides), charge
  the prefill curve, emit each request's first token;
* decode step: ask the policy for k, charge k draft passes + one target pass over
  k + 1 tokens + verification, draw accepted counts, emit min(a + 1, remaining).
  The draft's first pass also feeds what it has not seen (its *catch-up*): each row
  keeps a lag, 1 normally, 2 after it accepted all k drafts, +1 per k = 0 step; a
  step whose largest lag L exceeds 1 adds t_draft(b, L, c) - t_draft(b, 1, c).

A policy may also return one k per running sequence (an integer numpy array of
length ``view.running``, each in 0..max_k): a *ragged* step. It is charged as
vLLM and TensorRT-LLM run it, padded to K = max(k_i): K draft passes at the full
charged batch, one target pass over K + 1 tokens per sequence and verification of
K, i.e. exactly ``decode_time(b, K, c)``, the price of a uniform step at K. (The
draft passes could in principle shrink to the b_j = #{i: k_i >= j} sequences still
drafting, but batched drafting keeps the batch's shape, and a draft pass at small
batch is weight-bound, so the saving would be small; padding also keeps a ragged
step priced by the same table a policy predicts with.) Sequence i keeps
min(G_i, k_i) draft tokens and emits that + 1; drafted tokens are sum k_i (per
request and per step). The step record's ``k`` is K, and every running sequence
counts as a draft in the step's ``running``. An array whose k_i are all equal
runs exactly as the int k.

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
from sim.errors import InputError

PREFILL, DECODE = 0, 1
STEP_FIELDS = ("start_s", "end_s", "phase", "batch_size", "running", "k", "mean_context_tokens",
               "drafted_tokens", "accepted_tokens", "emitted_tokens")
FLOAT_STEP_FIELDS = ("start_s", "end_s", "mean_context_tokens")


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
                 table: StepTable, scheduler, policy: Policy, sampler: AcceptanceSampler) -> None:
        self.env = env
        self._arrivals = arrival_s.tolist()  # bisect on a list is the cheapest clock check
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        # A sequence's context is final_context - remaining, so only `remaining` moves per step.
        self.final_context = prompt_tokens + output_tokens - 1
        self.acceptance_scale = acceptance_scale
        self.kv_reserve = kv_reserve
        self.table = table
        self.scheduler = scheduler
        self.policy = policy
        self.sampler = sampler
        n = prompt_tokens.shape[0]  # a routed replica (sim.cluster) has no arrival array
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.decode_steps = np.zeros(n, dtype=np.int64)
        self.drafted = np.zeros(n, dtype=np.int64)
        self.accepted = np.zeros(n, dtype=np.int64)
        cap = scheduler.max_batch_size
        # Row state lives in two field-major blocks so that retiring rows compacts every
        # field with one fancy-indexed copy per block; the names below are views into them.
        self._int_rows = np.zeros((7, cap), dtype=np.int64)
        self._float_rows = np.zeros((2, cap))
        (self.row_req, self.row_remaining, self.row_final_context, self.row_accepted,
         self.row_joined_step,  # decode steps run before the row joined
         self.row_joined_k,  # sum of k over those steps
         self.row_lag) = self._int_rows  # emitted tokens the draft has not seen, minus the usual 1
        self.row_scale, self.row_first_token_s = self._float_rows
        # What a request brings to its row when it joins (the first four int fields), and
        # prefix sums over requests so that admitting a queue block costs O(1) arithmetic.
        self._joining_ints = np.stack([np.arange(n), output_tokens - 1, self.final_context, np.zeros(n, np.int64)])
        self._prefix = {name: np.concatenate(([0], np.cumsum(values))).tolist() for name, values in (
            ("prompt", prompt_tokens), ("reserve", kv_reserve), ("multi", output_tokens > 1),
            ("remaining", output_tokens - 1), ("final", self.final_context))}
        self.running = 0
        self.kv_used = 0
        self.queue_head = 0
        self.arrived = 0
        self.fresh = 0  # rows admitted since the last decode step (at the end of the arrays)
        self.total_remaining = 0  # Python-int sums over the running rows, kept in step
        self.total_final_context = 0
        self.decode_count = 0
        self.k_sum = 0
        self.last_decode_end = 0.0
        self.step_rows: list[tuple] = []
        self.itl_values: list[float] = []
        self.itl_weights: list[int] = []
        self.view = BatchView(table.k_max)
        self.feedback = StepFeedback()
        self._ragged = None  # this step's per-sequence k, when the policy returned an array
        # Fill in feedback only for policies that listen (fixed and none do not).
        self._observes = type(policy).observe is not Policy.observe
        self._tracks_lag = policy.max_k > 0  # a run with a draft pays its catch-up
        self._pads_prefill = scheduler.prefill == "padded"
        self.process = env.process(self._run())

    def records(self) -> ReplicaRecords:
        return ReplicaRecords(self.scheduled_s, self.first_token_s, self.finish_s, self.decode_steps,
                              self.drafted, self.accepted, step_columns(self.step_rows),
                              np.asarray(self.itl_values, dtype=np.float64),
                              np.asarray(self.itl_weights, dtype=np.int64))

    def _run(self):
        # Steps are split into a start (decide, price) and a finish (apply) around one
        # timeout, rather than sub-generators, to keep SimPy's per-step overhead minimal.
        env, arrivals, total = self.env, self._arrivals, len(self._arrivals)
        admit, timeout, cap = self.scheduler.admit, env.timeout, self.scheduler.max_batch_size
        while True:
            now = env.now
            self.arrived = bisect_right(arrivals, now, self.arrived)
            waiting = self.arrived - self.queue_head
            if self.running == 0 and waiting == 0:
                if self.arrived == total:
                    return
                yield timeout(arrivals[self.arrived] - now)
                continue
            n = admit(self.running, self.kv_used,
                      self.kv_reserve[self.queue_head:self.arrived]) if waiting and self.running < cap else 0
            if n:
                yield timeout(self._start_prefill(n, now))
                self._finish_prefill(n, now, env.now)
            elif self.running:
                yield timeout(self._start_decode(now))
                self._finish_decode(now, env.now)
            else:
                raise RuntimeError("a waiting request can never be admitted (checked before the run)")

    def _start_prefill(self, n: int, now: float) -> float:
        head, cum = self.queue_head, self._prefix
        self._mean_prompt = (cum["prompt"][head + n] - cum["prompt"][head]) / n
        self.kv_used += cum["reserve"][head + n] - cum["reserve"][head]
        if self._pads_prefill and n > 1:  # a right-padded batch costs as n prompts of the longest
            return self.table.prefill_time(n, float(np.maximum.reduce(self.prompt_tokens[head:head + n])))
        return self.table.prefill_time(n, self._mean_prompt)

    def _finish_prefill(self, n: int, start: float, end: float) -> None:
        head, cum = self.queue_head, self._prefix
        idx = slice(head, head + n)
        self.queue_head += n
        self.scheduled_s[idx] = start
        self.first_token_s[idx] = end
        joining = cum["multi"][head + n] - cum["multi"][head]
        if joining == n:  # the common case: every request continues, a contiguous block
            req = idx
            self.total_remaining += cum["remaining"][head + n] - cum["remaining"][head]
            self.total_final_context += cum["final"][head + n] - cum["final"][head]
        else:  # one-token requests end with their prefill
            more = self.output_tokens[idx] > 1
            done = np.flatnonzero(~more) + head
            self.finish_s[done] = end
            self.kv_used -= int(np.add.reduce(self.kv_reserve[done]))
            req = np.flatnonzero(more) + head
            self.total_remaining += int(np.add.reduce(self.output_tokens[req] - 1))
            self.total_final_context += int(np.add.reduce(self.final_context[req]))
        if joining:
            lo, hi = self.running, self.running + joining
            self._int_rows[:4, lo:hi] = self._joining_ints[:, req]
            self.row_joined_step[lo:hi] = self.decode_count
            self.row_joined_k[lo:hi] = self.k_sum
            self.row_lag[lo:hi] = 0
            self.row_scale[lo:hi] = self.acceptance_scale[req]
            self.row_first_token_s[lo:hi] = end
            self.running = hi
            self.fresh += joining
        self.scheduler.on_admit(n, self.running)
        self.step_rows.append((start, end, PREFILL, n, self.running, 0, self._mean_prompt, 0, 0, n))

    def _start_decode(self, now: float) -> float:
        b = self.running
        charged = self._charged = self.scheduler.charged_batch_size(b)
        mean_context = self._mean_context = (self.total_final_context - self.total_remaining) / b
        view = self.view
        view.now_s, view.step, view.batch_size, view.running = now, len(self.step_rows), charged, b
        view.mean_context_tokens, view.remaining_tokens = mean_context, self.row_remaining[:b]
        view.final_context_tokens = self.row_final_context[:b]
        k = self.policy.choose_k(view)
        if k.__class__ is not int or not 0 <= k <= self.table.k_max:
            k = checked_k(k, self.table.k_max, self.policy, b)
            if k.__class__ is not int:  # ragged: one k per sequence, charged padded to the largest
                self._ragged = k
                k = int(np.maximum.reduce(k))
        self._k = k
        extra = int(np.maximum.reduce(self.row_lag[:b])) if k and self._tracks_lag else 0
        if not extra:
            dt = self.table.decode_time(charged, k, mean_context)
        elif extra == 1:  # the usual catch-up, after a fully accepted step: one look-up
            dt = self.table.decode_time_lag2(charged, k, mean_context)
        else:
            dt = self.table.decode_time(charged, k, mean_context) + self.table.catch_up_time(charged, extra + 1,
                                                                                             mean_context)
        self._dt = dt
        return dt

    def _finish_decode(self, start: float, end: float) -> None:
        b, k = self.running, self._k
        remaining = self.row_remaining[:b]
        drafted, ragged = k * b, self._ragged
        if k:
            if ragged is None:
                accepted = self.sampler.accepted(self.row_scale[:b], k)
            else:  # each sequence keeps at most its own k_i; per-row drafted gets sum of k_i
                self._ragged = None
                accepted = self.sampler.accepted(self.row_scale[:b], ragged)
                drafted = int(np.add.reduce(ragged))
                self.row_joined_k[:b] += k - ragged  # drafted per row = k_sum - joined_k
            self.row_accepted[:b] += accepted
            accepted_total = int(np.add.reduce(accepted))
            remaining -= accepted + 1  # goes negative where a request ends mid-step
            emitted_total = accepted_total + b
        else:
            accepted, accepted_total, emitted_total = None, 0, b
            remaining -= 1
        finishing = np.minimum.reduce(remaining) <= 0
        if finishing:  # surplus tokens past a request's end are wasted, not emitted
            surplus = remaining[remaining < 0]
            emitted_total += int(np.add.reduce(surplus))
            np.maximum(remaining, 0, out=remaining)
        self.total_remaining -= emitted_total
        if self._tracks_lag:  # a fully accepted row's last draft token is news to the draft
            if k:
                np.equal(accepted, k, out=self.row_lag[:b])
            else:
                self.row_lag[:b] += 1
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
            fb.now_s, fb.step, fb.batch_size, fb.k, fb.step_time_s = end, len(self.step_rows), charged, k, self._dt
            fb.drafted_tokens, fb.accepted_tokens, fb.accepted_per_sequence = drafted, accepted_total, accepted
            fb.k_per_sequence = ragged
            self.policy.observe(fb)
        self.step_rows.append((start, end, DECODE, charged, b, k, self._mean_context, drafted, accepted_total,
                               emitted_total))

    def _retire(self, b: int, now: float) -> None:
        """Record finished rows and compact the survivors to the front, keeping their order."""
        done = self.row_remaining[:b] == 0
        rows = np.flatnonzero(done)
        req = self.row_req[rows]
        self.finish_s[req] = now
        self.decode_steps[req] = self.decode_count - self.row_joined_step[rows]
        self.drafted[req] = self.k_sum - self.row_joined_k[rows]
        self.accepted[req] = self.row_accepted[rows]
        self.kv_used -= int(np.add.reduce(self.kv_reserve[req]))
        self.total_final_context -= int(np.add.reduce(self.row_final_context[rows]))
        keep = np.flatnonzero(~done)
        survivors = keep.shape[0]
        self._int_rows[:, :survivors] = self._int_rows[:, keep]
        self._float_rows[:, :survivors] = self._float_rows[:, keep]
        self.running = survivors


def step_columns(step_rows: list[tuple]) -> dict[str, np.ndarray]:
    """The per-step records (tuples in STEP_FIELDS order) as typed columns."""
    table = np.array(step_rows, dtype=np.float64).reshape(-1, len(STEP_FIELDS))
    return {f: table[:, i] if f in FLOAT_STEP_FIELDS else table[:, i].astype(np.int64)
            for i, f in enumerate(STEP_FIELDS)}


def checked_k(k, k_max: int, policy: Policy, running: int):
    """A policy's bad answer ends the run with one line naming it (and nothing written).

    Returns an int k, or for a per-sequence answer an int64 array of ``running`` values
    (collapsed to an int when they are all equal, which runs exactly as that int).
    """
    if isinstance(k, np.ndarray):
        return _checked_ks(k, k_max, policy, running)
    if isinstance(k, (bool, float)) or not isinstance(k, (int, np.integer)):
        raise InputError(f"policy '{policy.name}' returned k = {k!r}; it must return an int", field="policy.name")
    if not 0 <= int(k) <= k_max:
        raise InputError(f"policy '{policy.name}' returned k = {int(k)}, outside 0..{k_max} "
                         "(its max_k, within what the profile measured)", field="policy.name")
    return int(k)


def _checked_ks(ks: np.ndarray, k_max: int, policy: Policy, running: int):
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
