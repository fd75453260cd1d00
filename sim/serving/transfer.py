"""KV-cache transfers of disaggregated serving: what moving a prompt's KV blocks from a prefill replica to a
decode replica costs, and how transfers queue on the links (docs/cluster.md, "Disaggregated prefill and
decode").

A transfer moves the prompt's KV, ``kv_bytes_per_token`` (per GPU, as the profile records it, the
drafter's KV with the target's) times the prompt's tokens, from each GPU of the prefill replica to its
peer on the decode replica, all GPUs at once over their own links (tensor parallelism splits the KV heads
over the GPUs, and each GPU has its own NVLink ports and, on an H100 node, its own RDMA NIC). It takes
``latency + bytes / bandwidth``. By default (:class:`KVLinks`) a prefill replica's sending end and a decode
replica's receiving end each carry one transfer at a time: a transfer starts when the decode replica has
set its blocks aside and both ends are free, in that order, so transfers queue when a link is busy. With
``kv_transfers = "shared"`` (:class:`SharedLinks`) transfers start at once and share each end's bandwidth.
Where the pools' tensor-parallel sizes differ, each GPU carries its share per GPU of the side with the
larger share (vLLM's NIXL reads across TP sizes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

GB = 1e9  # link bandwidths are quoted in decimal gigabytes per second


@dataclass(frozen=True)
class Link:
    """A link's two stated parameters."""

    name: str
    bandwidth_gb_s: float  # per GPU and direction, GB/s
    latency_us: float  # a transfer's fixed cost, microseconds

    def seconds(self, nbytes: float) -> float:
        """How long ``nbytes`` (per GPU) take once the transfer has started."""
        return self.latency_us * 1e-6 + nbytes / (self.bandwidth_gb_s * GB)


# Published figures (docs/cluster.md gives the sources): an H100 SXM's NVLink 4 moves 900 GB/s per GPU, both
# directions together; a DGX H100 gives each GPU one ConnectX-7 NIC at 400 Gb/s (50 GB/s each way).
# The latencies are round figures of the hardware's one-way latency, not a measurement of a KV connector.
LINKS = {"rdma": Link("rdma", 50.0, 5.0), "nvlink": Link("nvlink", 450.0, 2.0)}
KV_LINKS = tuple(LINKS)  # the config's choices; the first is the default (pools on different nodes)


def link_for(name: str, bandwidth_gb_s: float | None = None, latency_us: float | None = None) -> Link:
    """The named link, with either parameter overridden where given."""
    base = LINKS[name]
    return Link(name, base.bandwidth_gb_s if bandwidth_gb_s is None else bandwidth_gb_s,
                base.latency_us if latency_us is None else latency_us)


@dataclass(frozen=True)
class KVBytes:
    """What one prompt token's KV takes (the target's and the drafter's): bytes on each GPU of a prefill
    replica and of a decode replica (their tensor-parallel sizes may differ), and a prefill replica's GPUs."""

    prefill_per_gpu: int
    decode_per_gpu: int
    prefill_gpus: int

    @property
    def per_token(self) -> int:
        """Over a whole replica: the bytes a transfer moves per prompt token."""
        return self.prefill_per_gpu * self.prefill_gpus

    @property
    def link_per_gpu(self) -> int:
        """What each GPU's link carries per prompt token: every GPU sends (or receives) its share at once,
        and the side with the larger share per GPU sets the time."""
        return max(self.prefill_per_gpu, self.decode_per_gpu)


class KVLinks:
    """The links between ``prefill`` and ``decode`` replicas, each end carrying one transfer at a time
    (``kv_transfers = "queued"``): when each end is next free."""

    def __init__(self, link: Link, prefill: int, decode: int) -> None:
        self.link = link
        self.send_free = [0.0] * prefill
        self.receive_free = [0.0] * decode

    def reserve(self, sender: int, receiver: int, nbytes: float, ready_s: float) -> tuple[float, float]:
        """A transfer of ``nbytes`` per GPU from prefill replica ``sender`` to decode replica ``receiver``,
        ready at ``ready_s``: (its start, its end). Both ends are busy until it ends."""
        start = max(ready_s, self.send_free[sender], self.receive_free[receiver])
        end = start + self.link.seconds(nbytes)
        self.send_free[sender] = self.receive_free[receiver] = end
        return start, end

    def send(self, sender: int, receiver: int, nbytes: float, now: float, on_end, later) -> float:
        """Start a transfer ready ``now``; ``on_end(end)`` runs at its end (``later(at, call)``, the clock's).
        Returns when it starts."""
        start, end = self.reserve(sender, receiver, nbytes, now)
        later(end, partial(on_end, end))
        return start


class SharedLinks:
    """The links between ``prefill`` and ``decode`` replicas, shared by the transfers in flight
    (``kv_transfers = "shared"``: NIXL reads many requests' blocks at once): a transfer starts at once, and
    moves its bytes at the bandwidth over the number of transfers in flight on the busier of its two ends,
    rates changing as transfers start and end (a fluid model); it ends ``latency`` after its last byte."""

    def __init__(self, link: Link, prefill: int, decode: int) -> None:
        self.link = link
        self.sending = [0] * prefill  # transfers in flight per end
        self.receiving = [0] * decode
        self.flows: dict[int, list] = {}  # id -> [sender, receiver, bytes left, on_end]
        self.next_id = 0
        self.since = 0.0  # when the bytes left were last brought up to date
        self.version = 0  # the wake-up scheduled last; earlier ones are stale
        self.later = None

    def _rate(self, flow: list) -> float:
        return self.link.bandwidth_gb_s * GB / max(self.sending[flow[0]], self.receiving[flow[1]])

    def _advance(self, now: float) -> None:
        elapsed = now - self.since
        if elapsed > 0:
            for flow in self.flows.values():
                flow[2] -= elapsed * self._rate(flow)
        self.since = now

    def send(self, sender: int, receiver: int, nbytes: float, now: float, on_end, later) -> float:
        self.later = later
        self._advance(now)
        self.flows[self.next_id] = [sender, receiver, float(nbytes), on_end]
        self.next_id += 1
        self.sending[sender] += 1
        self.receiving[receiver] += 1
        self._schedule(now)
        return now

    def _schedule(self, now: float) -> None:
        """Wake when the next transfer's last byte is through (none: nothing in flight)."""
        self.version += 1
        if not self.flows:
            return
        at = min(now + max(flow[2], 0.0) / self._rate(flow) for flow in self.flows.values())
        self.later(at, partial(self._wake, self.version, at))

    def _wake(self, version: int, now: float) -> None:
        if version != self.version:  # a transfer started or ended since: rates changed, another wake is due
            return
        since = self.since  # the wake's time was computed from here, with these rates: the same sums again
        done = [key for key, flow in self.flows.items() if since + max(flow[2], 0.0) / self._rate(flow) <= now]
        self._advance(now)
        for key in done:  # in the order they started
            sender, receiver, _, on_end = self.flows.pop(key)
            self.sending[sender] -= 1
            self.receiving[receiver] -= 1
            end = now + self.link.latency_us * 1e-6
            self.later(end, partial(on_end, end))
        self._schedule(now)


KV_TRANSFERS = ("queued", "shared")  # the config's choices (cluster.kv_transfers); the first is the default


def make_links(kind: str, link: Link, prefill: int, decode: int) -> KVLinks | SharedLinks:
    return SharedLinks(link, prefill, decode) if kind == "shared" else KVLinks(link, prefill, decode)
