"""Disaggregated prefill and decode, as vLLM runs it with a KV connector (NIXL) behind its proxy, or as llm-d
routes it.

A request goes through two replicas, each the engine of a single replica unchanged:

1. **Prefill.** The cluster's router picks a prefill replica at the request's arrival (among the
   prefill pool); the proxy sends it there with ``max_tokens=1`` (vLLM's toy proxy and llm-d's sidecar
   do so), so the prefill replica schedules it as any request (chunked under its token budget, its
   prefix cache looked up), computes the whole prompt, samples one token and finishes. Its blocks stay
   held (NIXL's delayed free) until the decode side has read them.
2. **Blocks on the decode side.** The proxy then picks a decode replica (the router again, among the
   decode pool, where the requests handed to it count as waiting: sim.cluster.InboundSignals). The
   replica takes the request when its scheduler would reach it, allocating the prompt's blocks
   (vLLM's ``WAITING_FOR_REMOTE_KVS``; :class:`Handoff`), and the prompt's KV moves over the link
   (sim/serving/transfer.py: bytes, latency, bandwidth, queueing).
3. **Decode.** When the KV is there the request may be admitted with its prompt's KV counted as
   computed but for the last token (``REQ_REMOTE``: prompt - 1, as vLLM's scheduler sets
   ``num_computed_tokens`` once the connector has the blocks): the blocks set aside become its own, a
   one-token chunk gives the **client's first token**, then decode steps with its own KV budget,
   preemption and speculation.

With llm-d's flow (:class:`DecodeFirst`, ``--pd-threshold``) the decode replica is chosen at arrival, and
a prompt mostly cached there (fewer uncached tokens than the threshold) is prefilled by it alone.

The prefill replica's sampled token is the proxy's, never the client's: TTFT runs from the arrival to the
decode replica's first token (prefill queue + prefill + wait for blocks + transfer queue + transfer + decode
queue + the step that computes the last prompt token).

A prefill replica's finish starts a transfer at its instant, and a hand-off may reach a decode replica at
any instant, so in SimPy (sim/serving/clock.py ``simulate_disaggregated``) both pools run step by step.
Where every replica's steps run compiled and the router is a built-in one, vLLM's proxy flow over queued
links runs whole in one compiled call instead (sim/serving/compiled_disaggregated.py: SimPy's event order,
the same records); llm-d's flow, shared links and Python-stepped policies run in SimPy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import partial

import numpy as np

from sim.cluster import ClusterRecords, InboundSignals, ReplicaParts, ReplicaSignals, merge_loops
from sim.replica import ReplicaPlan
from sim.router import compiled_rule, make_router
from sim.scheduler.kvcache import remote_blocks, reserve_blocks
from sim.scheduler.layout import (C_HEAD, C_PREFILLING, C_REQUEUED, C_RUNNING, P_BLOCK, P_HOLD, P_MAX_SEQS,
                                  REQ_PROMPT, REQ_REMOTE)
from sim.serving import routing
from sim.serving.clock import simulate_disaggregated
from sim.serving.compiled_disaggregated import compiled_disaggregated_for
from sim.serving.queues import DecodeQueue, Dispatcher, Handoffs, PrefillQueue
from sim.serving.records import ReplicaRecords
from sim.serving.transfer import KVBytes, KVLinks, Link, SharedLinks, make_links


@dataclass
class Transfers:
    """Per request, its KV transfer: from which prefill replica to which decode replica, when its prefill
    was done, when the decode replica allocated its blocks, when the transfer started and ended, and the
    bytes moved (over all GPUs of the replica). -1 / NaN for a request prefilled on its decode replica."""

    prefill_replica: np.ndarray
    decode_replica: np.ndarray
    ready_s: np.ndarray
    reserved_s: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    nbytes: np.ndarray

    @property
    def sent(self) -> np.ndarray:
        """Which requests' KV crossed a link (the others were prefilled where they decoded)."""
        return self.prefill_replica >= 0


@dataclass
class DisaggregatedRecords:
    merged: ReplicaRecords  # the client's view: prefill's scheduling, decode's first token and finish
    prefill: ClusterRecords  # each pool's own records (requests in request-id order)
    decode: ClusterRecords
    transfers: Transfers
    step_replica: np.ndarray  # merged step -> its replica: prefill replicas 0..P-1, decode replicas P..P+D-1


class Handoff:
    """Prefilled requests to decode replicas, as vLLM's NIXL connector moves them.

    A prefilled request waits, in its decode replica's order of hand-offs, until that replica takes it:
    when every request it has taken and whose KV is there has been admitted, no preempted request waits,
    its running requests are under ``max_num_seqs`` (vLLM's scheduler reaches a waiting request only then)
    and its free blocks cover the prompt's, which it then allocates (vLLM's ``WAITING_FOR_REMOTE_KVS``).
    The transfer is then reserved on the links; when it ends, the decode replica may admit the request and
    the prefill replica frees the blocks it held (NIXL's delayed free). ``later(at, call)`` is the clock's
    (sim.serving.clock.simulate_disaggregated)."""

    def __init__(self, links: KVLinks | SharedLinks, router, loads: list[InboundSignals], decode_loops: list,
                 reqi: np.ndarray, prompt_tokens: np.ndarray, kv: KVBytes) -> None:
        self.links, self.router, self.loads, self.reqi = links, router, loads, reqi
        self.queues = [loop.queue for loop in decode_loops]
        self.states = [loop.state for loop in decode_loops]
        self.senders: list[PrefillQueue] = []
        self.waiting: list[deque] = [deque() for _ in decode_loops]  # per decode replica: requests not yet taken
        self.link_bytes = prompt_tokens.astype(np.float64) * kv.link_per_gpu  # what each GPU's link carries
        n = reqi.shape[1]
        self.transfers = Transfers(np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64),
                                   np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan),
                                   prompt_tokens.astype(np.float64) * kv.per_token)
        self.decode_of = np.full(n, -1, dtype=np.int64)  # a decode replica chosen at arrival (llm-d's flow)
        self.local = np.zeros(n, dtype=np.bool_)  # prefilled by its decode replica (llm-d's decider said so)
        self.later = None
        for index, queue in enumerate(self.queues):
            queue.on_step = partial(self.take, index)

    def sender(self, queue: PrefillQueue):
        """What a prefill replica's queue calls with the requests it finished."""
        self.senders.append(queue)
        return partial(self.prefilled, len(self.senders) - 1)

    def prefilled(self, sender: int, ids: np.ndarray, now: float) -> None:
        t = self.transfers
        touched = []
        for i in ids.tolist():
            receiver = int(self.decode_of[i])
            if receiver < 0:  # vLLM's proxy picks the decode instance once the prefill has returned
                receiver = self.router.choose(self.loads, self.reqi[:, i])
                self.loads[receiver].on_way(i, 1)
            t.prefill_replica[i], t.decode_replica[i], t.ready_s[i] = sender, receiver, now
            self.waiting[receiver].append(i)
            if receiver not in touched:
                touched.append(receiver)
        for receiver in touched:
            self.take(receiver, now)

    def prefill_here(self, request: int, receiver: int, now: float) -> None:
        """llm-d's decider sent ``request`` to decode replica ``receiver`` alone: it prefills it there, as any
        request (its KV is not remote), in its turn after the hand-offs before it."""
        self.local[request] = True
        self.reqi[REQ_REMOTE, request] = 0
        t = self.transfers
        t.decode_replica[request], t.nbytes[request] = receiver, 0.0
        self.waiting[receiver].append(request)
        self.take(receiver, now)

    def take(self, receiver: int, now: float) -> None:
        """Decode replica ``receiver`` takes the requests waiting for it, in order, while it has room."""
        waiting = self.waiting[receiver]
        if not waiting:
            return
        queue, state = self.queues[receiver], self.states[receiver]
        ctr, par = state.ctr, state.par
        t = self.transfers
        while waiting:
            i = waiting[0]
            if self.local[i]:  # it waits in the replica's queue as any request: nothing to allocate ahead
                waiting.popleft()
                self.loads[receiver].on_way(i, -1)
                queue.push(i, now)
                continue
            full = ctr[C_RUNNING] + ctr[C_PREFILLING] >= par[P_MAX_SEQS]
            if ctr[C_HEAD] < queue.ready_upto or ctr[C_REQUEUED] or full:
                return
            if not reserve_blocks(remote_blocks(int(self.reqi[REQ_PROMPT, i]), int(par[P_BLOCK])), ctr):
                return
            waiting.popleft()
            self.loads[receiver].on_way(i, -1)
            position = queue.push(i, now, ready=False)
            sender = int(t.prefill_replica[i])
            t.reserved_s[i] = now
            t.start_s[i] = self.links.send(sender, receiver, float(self.link_bytes[i]), now,
                                           partial(self.arrived, i, sender, receiver, position), self.later)

    def arrived(self, request: int, sender: int, receiver: int, position: int, end: float) -> None:
        self.transfers.end_s[request] = end
        self.queues[receiver].mark_ready(position, end)
        self.senders[sender].kv_read(request, end)


class DecodeFirst(Dispatcher):
    """llm-d's flow (its ``pd-profile-handler``): at a request's arrival the router first picks a decode
    replica, then the decision: when the prompt's tokens not already in that replica's prefix cache are
    fewer than ``threshold``, the decode replica prefills it itself; else a prefill replica is picked (the
    router again, among the prefill pool) and the KV goes to the decode replica chosen first. llm-d's
    default threshold, 0, disaggregates every request."""

    def __init__(self, arrival_s, reqi, scale, router, *, decode_router, decode_loads: list[InboundSignals],
                 handoff: Handoff, threshold: int) -> None:
        super().__init__(arrival_s, reqi, scale, router)
        self.decode_router, self.decode_loads = decode_router, decode_loads
        self.handoff, self.threshold = handoff, threshold

    def route(self, request: int, at: float) -> None:
        h = self.handoff
        column = h.reqi[:, request]
        receiver = self.decode_router.choose(self.decode_loads, column)
        self.decode_loads[receiver].on_way(request, 1)  # the decode replica holds it from now (llm-d's sidecar)
        signals = self.decode_loads[receiver]
        block = signals.block_size  # the prompt's blocks before its last token, which vLLM always computes
        cached = routing.leading_cached_blocks(h.reqi, request, (int(column[REQ_PROMPT]) - 1) // block,
                                               signals.key_block()) * block if block else 0
        if int(column[REQ_PROMPT]) - cached < self.threshold:
            h.prefill_here(request, receiver, at)
            return
        h.decode_of[request] = receiver
        super().route(request, at)


def run_disaggregated(*, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                      prefix_keys: np.ndarray | None, acceptance_scale: np.ndarray, replica: ReplicaPlan,
                      decode_replica: ReplicaPlan, prefill_parts: list[ReplicaParts], decode_parts: list[ReplicaParts],
                      router: str, link: Link, kv: KVBytes, pd_threshold: int | None = None,
                      kv_transfers: str = "queued") -> DisaggregatedRecords:
    """Simulate the two pools and the transfers between them until every request has finished (the module
    docstring). ``replica`` / ``decode_replica``: what each pool's replicas are built from (their profiles
    may differ); ``kv``: the KV bytes a prompt token takes on each side; ``pd_threshold``: llm-d's flow
    (:class:`DecodeFirst`) with that threshold, else vLLM's proxy (decode replica chosen after the prefill);
    ``kv_transfers``: each link end carries one transfer at a time (queued) or all share it (shared)."""
    n = arrival_s.shape[0]
    prefill_inputs = replica.inputs(prompt_tokens, np.ones_like(output_tokens), prefix_keys)
    decode_inputs = decode_replica.inputs(prompt_tokens, output_tokens, prefix_keys, remote_tokens=prompt_tokens - 1)
    handoffs = Handoffs(decode_inputs, acceptance_scale)
    decode_loops = [decode_replica.loop(DecodeQueue(handoffs), p.policy, p.sampler) for p in decode_parts]
    loads = [InboundSignals(loop, decode_inputs) for loop in decode_loops]
    handoff = Handoff(make_links(kv_transfers, link, len(prefill_parts), len(decode_parts)), make_router(router), loads,
                      decode_loops, decode_inputs, prompt_tokens, kv)
    if pd_threshold is None:
        dispatcher = Dispatcher(arrival_s, prefill_inputs, acceptance_scale, make_router(router))
    else:
        dispatcher = DecodeFirst(arrival_s, prefill_inputs, acceptance_scale, make_router(router),
                                 decode_router=handoff.router, decode_loads=loads, handoff=handoff,
                                 threshold=pd_threshold)
    prefill_loops = []
    for p in prefill_parts:
        queue = PrefillQueue(dispatcher, None)
        queue.on_prefilled = handoff.sender(queue)
        loop = replica.loop(queue, p.policy, p.sampler)
        queue.state, queue.release_rule = loop.state, loop.rules.release_held
        loop.state.par[P_HOLD] = 1  # a finished request's blocks stay until the decode side has read them
        dispatcher.add(queue, ReplicaSignals(loop))
        prefill_loops.append(loop)
    compiled = compiled_disaggregated_for(dispatcher, handoff, prefill_loops, decode_loops,
                                          (replica.table, decode_replica.table),
                                          [p.sampler for p in prefill_parts + decode_parts],
                                          compiled_rule(dispatcher.router), compiled_rule(handoff.router),
                                          pd_threshold is None)
    if compiled is not None:  # both pools, the hand-offs and the transfers in compiled code
        compiled.run()
        del compiled
    else:
        simulate_disaggregated(dispatcher, prefill_loops, decode_loops, handoff)
    # Break the cycles back to the loops (dispatcher, queues, signals), so that merging frees each in turn.
    dispatcher.queues.clear()
    dispatcher.loads.clear()
    if isinstance(dispatcher, DecodeFirst):
        dispatcher.decode_loads, dispatcher.handoff = [], None
    loads.clear()
    handoff.loads, handoff.queues, handoff.states, handoff.senders = [], [], [], []
    for loop in prefill_loops + decode_loops:
        loop.close()
        loop.queue.waiter = None
        if isinstance(loop.queue, PrefillQueue):
            loop.queue.state = loop.queue.on_prefilled = None
        else:
            loop.queue.on_step = None
    prefill = merge_loops(prefill_loops, n)
    decode = merge_loops(decode_loops, n)
    merged, step_replica = _client_view(prefill, decode, len(prefill_parts), handoff.local)
    return DisaggregatedRecords(merged, prefill, decode, handoff.transfers, step_replica)


def _client_view(prefill: ClusterRecords, decode: ClusterRecords, prefill_count: int, local: np.ndarray):
    """The records a client sees: scheduled when its prefill began, its first token and finish from the
    decode replica, its decode steps and speculation from there, preemptions on both (``local``: requests
    prefilled on their decode replica, whose scheduling and prefix-cache hits are that replica's); every step
    of both pools, by start time then replica (decode replicas numbered after the prefill ones)."""
    p, d = prefill.merged, decode.merged
    scheduled = np.where(local, d.scheduled_s, p.scheduled_s)
    cached = np.where(local, d.cached_tokens, p.cached_tokens)
    step_replica = np.concatenate((prefill.step_replica, decode.step_replica + prefill_count))
    steps = {f: np.concatenate((p.steps[f], d.steps[f])) for f in p.steps}
    order = np.lexsort((step_replica, steps["start_s"]))
    merged = ReplicaRecords(scheduled, d.first_token_s, d.finish_s, d.decode_steps, d.drafted_tokens,
                            d.accepted_tokens, {f: v[order] for f, v in steps.items()}, d.itl_values, d.itl_weights,
                            p.preemptions + d.preemptions, cached, p.scheduler)
    return merged, step_replica[order]


def transfer_columns(records: DisaggregatedRecords) -> dict[str, np.ndarray]:
    """requests.csv's columns of a disaggregated run: where each request was prefilled and decoded (decode
    replicas numbered after the prefill ones), and its KV transfer (when its prefill was done, when the decode
    replica allocated its blocks, when the transfer started and ended, the bytes it moved)."""
    t = records.transfers
    return {"prefill_replica": t.prefill_replica, "decode_replica": t.decode_replica + len(records.prefill.request_ids),
            "prefill_done_s": t.ready_s, "kv_blocks_allocated_s": t.reserved_s, "kv_transfer_start_s": t.start_s,
            "kv_transfer_end_s": t.end_s, "kv_transfer_bytes": t.nbytes}


def disaggregated_section(records: DisaggregatedRecords, link: Link, kv: KVBytes, profiles: tuple[str, str],
                          duration_s: float, pd_threshold: int | None = None, kv_transfers: str = "queued") -> dict:
    """summary.json's ``disaggregated``: how requests were sent (vLLM's proxy, or llm-d's decode-first flow
    and how many its decider kept on the decode pool), each pool's replicas and busy time, and the KV
    transfers (how many, their bytes, how long they took, waited for the decode replica's blocks and queued)."""
    t = records.transfers
    sent = t.sent
    flow = {"flow": "vllm-proxy"} if pd_threshold is None else {
        "flow": "llm-d-decode-first", "pd_threshold": pd_threshold,
        "prefilled_on_decode": int(np.count_nonzero(~sent))}
    took, waited, room = (t.end_s - t.start_s)[sent], (t.start_s - t.ready_s)[sent], (t.reserved_s - t.ready_s)[sent]
    stat = (lambda f, v: 1e3 * float(f(v))) if sent.any() else (lambda f, v: 0.0)
    return {**flow, "prefill": {"profile": profiles[0], **_pool(records.prefill, duration_s)},
            "decode": {"profile": profiles[1], **_pool(records.decode, duration_s)},
            "kv_transfer": {"link": link.name, "bandwidth_gb_s": link.bandwidth_gb_s, "latency_us": link.latency_us,
                            **({"sharing": kv_transfers} if kv_transfers != "queued" else {}),
                            "kv_bytes_per_token": kv.per_token, "link_bytes_per_token_per_gpu": kv.link_per_gpu,
                            "transfers": int(np.count_nonzero(sent)), "bytes": float(t.nbytes[sent].sum()),
                            "mean_transfer_ms": stat(np.mean, took),
                            "p99_transfer_ms": stat(lambda v: np.percentile(v, 99), took),
                            "mean_queue_ms": stat(np.mean, waited),
                            "p99_queue_ms": stat(lambda v: np.percentile(v, 99), waited),
                            "max_queue_ms": stat(np.max, waited),
                            "queued_transfers": int(np.count_nonzero(waited > 0)),
                            "mean_wait_for_blocks_ms": stat(np.mean, room),
                            "max_wait_for_blocks_ms": stat(np.max, room),
                            "waited_for_blocks": int(np.count_nonzero(room > 0))}}


def _pool(records: ClusterRecords, duration_s: float) -> dict:
    """One pool's replicas and their busy time over the run's duration, its steps and prefill tokens."""
    replicas = len(records.request_ids)
    steps = records.merged.steps
    busy = np.bincount(records.step_replica, weights=steps["end_s"] - steps["start_s"], minlength=replicas)
    fractions = busy / duration_s if duration_s > 0 else np.full(replicas, np.nan)
    return {"replicas": replicas, "busy_fraction": float(fractions.mean()),
            "busy_fraction_per_replica": [float(x) for x in fractions], "busy_time_s": float(busy.sum()),
            "num_steps": int(steps["start_s"].shape[0]),
            "num_prefill_tokens": int(steps["prefill_tokens"].sum(dtype=np.int64))}
