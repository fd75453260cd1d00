"""Disaggregated prefill and decode, as vLLM runs it with a KV connector (NIXL) behind its proxy.

A request goes through two replicas, each the engine of a single replica unchanged:

1. **Prefill.** The cluster's router picks a prefill replica at the request's arrival (among the
   prefill pool); the proxy sends it there with ``max_tokens=1`` (vLLM's toy proxy and llm-d's sidecar
   do so), so the prefill replica schedules it as any request (chunked under its token budget, its
   prefix cache looked up), computes the whole prompt, samples one token and finishes.
2. **Transfer.** The proxy then picks a decode replica (the router again, among the decode pool,
   where the requests whose KV is on its way count as waiting: sim.cluster.InboundSignals) and the
   prompt's KV moves over the link (sim/serving/transfer.py: bytes, latency, bandwidth, queueing).
3. **Decode.** When the KV is there the request joins the decode replica's waiting queue with its
   prompt's KV counted as computed but for the last token (``REQ_REMOTE``: prompt - 1, as vLLM's
   scheduler sets ``num_computed_tokens`` once the connector has the blocks), which its scheduler admits
   through its KV-cache manager: blocks for the whole prompt, a one-token chunk whose logits give the
   **client's first token**, then decode steps with its own KV budget, preemption and speculation.

The prefill replica's sampled token is the proxy's, never the client's: TTFT runs from the arrival to the
decode replica's first token (prefill queue + prefill + transfer queue + transfer + decode queue + the
step that computes the last prompt token). Both pools run step by step, with the rules compiled: a
prefill replica's finish starts a transfer at its instant, and a hand-off may reach a decode replica at
any instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from sim.cluster import ClusterRecords, InboundSignals, ReplicaParts, ReplicaSignals, merge_loops
from sim.replica import ReplicaPlan
from sim.router import make_router
from sim.serving.clock import simulate_disaggregated
from sim.serving.queues import DecodeQueue, Dispatcher, Handoffs, PrefillQueue
from sim.serving.records import ReplicaRecords
from sim.serving.transfer import KVBytes, KVLinks, Link


@dataclass
class Transfers:
    """Per request, its KV transfer: from which prefill replica to which decode replica, when its prefill
    was done, when the transfer started and ended, and the bytes moved (over all GPUs of the replica)."""

    prefill_replica: np.ndarray
    decode_replica: np.ndarray
    ready_s: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    nbytes: np.ndarray


@dataclass
class DisaggregatedRecords:
    merged: ReplicaRecords  # the client's view: prefill's scheduling, decode's first token and finish
    prefill: ClusterRecords  # each pool's own records (requests in request-id order)
    decode: ClusterRecords
    transfers: Transfers
    step_replica: np.ndarray  # merged step -> its replica: prefill replicas 0..P-1, decode replicas P..P+D-1


class Handoff:
    """Prefilled requests to decode replicas: the decode replica is chosen, the transfer reserved on the
    links and the request pushed into that replica's queue when the transfer ends. ``later(at, call)`` is
    the clock's (sim.serving.clock.simulate_disaggregated)."""

    def __init__(self, links: KVLinks, router, loads: list[InboundSignals], queues: list[DecodeQueue],
                 reqi: np.ndarray, prompt_tokens: np.ndarray, kv: KVBytes) -> None:
        self.links, self.router, self.loads, self.queues, self.reqi = links, router, loads, queues, reqi
        self.link_bytes = prompt_tokens.astype(np.float64) * kv.link_per_gpu  # what each GPU's link carries
        n = reqi.shape[1]
        self.transfers = Transfers(np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64),
                                   np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan),
                                   prompt_tokens.astype(np.float64) * kv.per_token)
        self.later = None

    def sender(self, prefill_replica: int):
        """What prefill replica ``prefill_replica``'s queue calls with the requests it finished."""
        return partial(self.prefilled, prefill_replica)

    def prefilled(self, sender: int, ids: np.ndarray, now: float) -> None:
        t = self.transfers
        for i in ids.tolist():
            receiver = self.router.choose(self.loads, self.reqi[:, i])
            start, end = self.links.reserve(sender, receiver, float(self.link_bytes[i]), now)
            t.prefill_replica[i], t.decode_replica[i] = sender, receiver
            t.ready_s[i], t.start_s[i], t.end_s[i] = now, start, end
            self.loads[receiver].on_way(i, 1)
            self.later(end, partial(self.arrived, i, receiver, end))

    def arrived(self, request: int, receiver: int, end: float) -> None:
        self.loads[receiver].on_way(request, -1)
        self.queues[receiver].push(request, end)


def run_disaggregated(*, arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                      prefix_keys: np.ndarray | None, acceptance_scale: np.ndarray, replica: ReplicaPlan,
                      decode_replica: ReplicaPlan, prefill_parts: list[ReplicaParts], decode_parts: list[ReplicaParts],
                      router: str, link: Link, kv: KVBytes) -> DisaggregatedRecords:
    """Simulate the two pools and the transfers between them until every request has finished (the module
    docstring). ``replica`` / ``decode_replica``: what each pool's replicas are built from (their profiles
    may differ); ``kv``: the KV bytes a prompt token takes on each side."""
    n = arrival_s.shape[0]
    prefill_inputs = replica.inputs(prompt_tokens, np.ones_like(output_tokens), prefix_keys)
    decode_inputs = decode_replica.inputs(prompt_tokens, output_tokens, prefix_keys, remote_tokens=prompt_tokens - 1)
    dispatcher = Dispatcher(arrival_s, prefill_inputs, acceptance_scale, make_router(router))
    handoffs = Handoffs(decode_inputs, acceptance_scale)
    decode_loops = [decode_replica.loop(DecodeQueue(handoffs), p.policy, p.sampler) for p in decode_parts]
    loads = [InboundSignals(loop, decode_inputs) for loop in decode_loops]
    handoff = Handoff(KVLinks(link, len(prefill_parts), len(decode_parts)), make_router(router), loads,
                      [loop.queue for loop in decode_loops], decode_inputs, prompt_tokens, kv)
    prefill_loops = []
    for index, p in enumerate(prefill_parts):
        queue = PrefillQueue(dispatcher, handoff.sender(index))
        loop = replica.loop(queue, p.policy, p.sampler)
        queue.state = loop.state
        dispatcher.add(queue, ReplicaSignals(loop))
        prefill_loops.append(loop)
    simulate_disaggregated(dispatcher, prefill_loops, decode_loops, handoff)
    # Break the cycles back to the loops (dispatcher, queues, signals), so that merging frees each in turn.
    dispatcher.queues.clear()
    dispatcher.loads.clear()
    loads.clear()
    handoff.loads, handoff.queues = [], []
    for loop in prefill_loops + decode_loops:
        loop.close()
        loop.queue.waiter = None
        if isinstance(loop.queue, PrefillQueue):
            loop.queue.state = loop.queue.on_prefilled = None
    prefill = merge_loops(prefill_loops, n)
    decode = merge_loops(decode_loops, n)
    merged, step_replica = _client_view(prefill, decode, len(prefill_parts))
    return DisaggregatedRecords(merged, prefill, decode, handoff.transfers, step_replica)


def _client_view(prefill: ClusterRecords, decode: ClusterRecords, prefill_count: int):
    """The records a client sees: scheduled when its prefill began, its first token and finish from the
    decode replica, its decode steps and speculation from there, preemptions on both; every step of both
    pools, by start time then replica (decode replicas numbered after the prefill ones)."""
    p, d = prefill.merged, decode.merged
    step_replica = np.concatenate((prefill.step_replica, decode.step_replica + prefill_count))
    steps = {f: np.concatenate((p.steps[f], d.steps[f])) for f in p.steps}
    order = np.lexsort((step_replica, steps["start_s"]))
    merged = ReplicaRecords(p.scheduled_s, d.first_token_s, d.finish_s, d.decode_steps, d.drafted_tokens,
                            d.accepted_tokens, {f: v[order] for f, v in steps.items()}, d.itl_values, d.itl_weights,
                            p.preemptions + d.preemptions, p.cached_tokens, p.scheduler)
    return merged, step_replica[order]


def transfer_columns(records: DisaggregatedRecords) -> dict[str, np.ndarray]:
    """requests.csv's columns of a disaggregated run: where each request was prefilled and decoded (decode
    replicas numbered after the prefill ones), and its KV transfer (when its prefill was done, when the
    transfer started and ended, the bytes it moved)."""
    t = records.transfers
    return {"prefill_replica": t.prefill_replica, "decode_replica": t.decode_replica + len(records.prefill.request_ids),
            "prefill_done_s": t.ready_s, "kv_transfer_start_s": t.start_s, "kv_transfer_end_s": t.end_s,
            "kv_transfer_bytes": t.nbytes}


def disaggregated_section(records: DisaggregatedRecords, link: Link, kv: KVBytes, profiles: tuple[str, str],
                          duration_s: float) -> dict:
    """summary.json's ``disaggregated``: each pool's replicas and busy time, and the KV transfers (how many,
    their bytes, how long they took and queued for a link)."""
    t = records.transfers
    took, waited = t.end_s - t.start_s, t.start_s - t.ready_s
    return {"prefill": {"profile": profiles[0], **_pool(records.prefill, duration_s)},
            "decode": {"profile": profiles[1], **_pool(records.decode, duration_s)},
            "kv_transfer": {"link": link.name, "bandwidth_gb_s": link.bandwidth_gb_s, "latency_us": link.latency_us,
                            "kv_bytes_per_token": kv.per_token, "link_bytes_per_token_per_gpu": kv.link_per_gpu,
                            "transfers": int(t.end_s.shape[0]), "bytes": float(t.nbytes.sum()),
                            "mean_transfer_ms": 1e3 * float(took.mean()),
                            "p99_transfer_ms": 1e3 * float(np.percentile(took, 99)),
                            "mean_queue_ms": 1e3 * float(waited.mean()),
                            "p99_queue_ms": 1e3 * float(np.percentile(waited, 99)),
                            "max_queue_ms": 1e3 * float(waited.max()),
                            "queued_transfers": int(np.count_nonzero(waited > 0))}}


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
