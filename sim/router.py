"""Routers: which replica of a cluster serves an arriving request.

A router is asked once per request, at the request's arrival time, with the
replicas' state at that instant (every step that ended before it applied; a step
ending at the same instant is applied after the router acts). Ties go to the
lowest replica index, so routing is deterministic.

* ``round-robin``: request i (in arrival order) goes to replica i mod N.
* ``least-requests``: the replica with the fewest outstanding requests, i.e.
  requests routed to it that have not finished (waiting in its queue, being
  prefilled, or decoding).
* ``least-tokens``: the replica with the fewest outstanding tokens: over its
  unfinished requests, prompt tokens not yet prefilled plus output tokens not
  yet emitted. A waiting request counts prompt + output tokens; a running one its
  remaining output tokens (its prompt is in the KV cache, its first token out).
"""

from __future__ import annotations

from typing import Protocol, Sequence

ROUTERS = ("round-robin", "least-requests", "least-tokens")


class ReplicaLoad(Protocol):
    def outstanding_requests(self) -> int: ...

    def outstanding_tokens(self) -> int: ...


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[ReplicaLoad]) -> int:
        chosen = self._next
        self._next = (chosen + 1) % len(replicas)
        return chosen


class LeastRequests:
    name = "least-requests"

    def choose(self, replicas: Sequence[ReplicaLoad]) -> int:
        loads = [r.outstanding_requests() for r in replicas]
        return loads.index(min(loads))  # index() finds the first: the lowest replica wins a tie


class LeastTokens:
    name = "least-tokens"

    def choose(self, replicas: Sequence[ReplicaLoad]) -> int:
        loads = [r.outstanding_tokens() for r in replicas]
        return loads.index(min(loads))


def make_router(name: str) -> RoundRobin | LeastRequests | LeastTokens:
    routers = {cls.name: cls for cls in (RoundRobin, LeastRequests, LeastTokens)}
    if name not in routers:
        raise ValueError(f"unknown router '{name}'; one of {', '.join(ROUTERS)}")
    return routers[name]()
