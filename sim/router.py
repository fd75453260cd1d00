"""Routers: which replica of a cluster serves an arriving request.

A router is asked once per request, at the request's arrival time, with the
replicas' state at that instant (every step that ended before it applied; a step
ending at the same instant is applied after the router acts). Ties go to the
lowest replica index, so routing is deterministic. The routers' rules are written once in
sim/serving/routing.py: these classes call them, and so does a compiled cluster
(sim/serving/cluster_kernel.py), which runs them itself for the exact classes in ``COMPILED_RULES``.

* ``round-robin``: request i (in arrival order) goes to replica i mod N.
* ``least-requests``: the replica with the fewest outstanding requests, i.e.
  requests routed to it that have not finished (waiting in its queue, being
  prefilled, or decoding).
* ``least-tokens``: the replica with the fewest outstanding tokens: over its
  unfinished requests, prompt tokens not yet prefilled plus output tokens not
  yet emitted. A waiting request counts prompt + output tokens; a running one its
  remaining output tokens (its prompt is in the KV cache, its first token out).
* ``prefix-aware``: llm-d's endpoint picker (gateway-api-inference-extension's scorers at the
  weights of llm-d's inference-scheduling profile): each replica scores ``prefix * P + queue * Q + kv * K`` and the highest
  wins. P is the share of the request's full prompt blocks (at most
  ``MAX_PREFIX_BLOCKS``) that lead the prompt and are held in that replica's own prefix cache;
  Q its waiting requests, min-max normalised over the replicas (1 for the shortest queue, 0
  for the longest, 1 for all when they are equal); K one minus its KV-cache usage (vLLM's
  ``kv_cache_usage_perc``). Weights default to llm-d's (3, 2, 2) and are set as
  ``prefix-aware:prefix=3:queue=2:kv=2``. It reads the vllm-v1 KV-cache manager, so it needs
  ``--scheduler vllm-v1`` with prefix caching (sim/config.py refuses it otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from sim.scheduler.layout import REQ_PROMPT
from sim.serving.routing import (LEAST_REQUESTS, LEAST_TOKENS, MAX_PREFIX_BLOCKS, PREFIX_AWARE, ROUND_ROBIN,  # noqa: F401
                                 first_least, in_turn, prefix_score, prompt_blocks, queue_score, weighted_score)
from workloads.numbers import read_number

ROUTERS = ("round-robin", "least-requests", "least-tokens")  # routers that read only the replicas' load
CACHE_ROUTERS = ("prefix-aware",)  # routers that read the replicas' KV caches (vllm-v1 with prefix caching)
ROUTER_NAMES = ROUTERS + CACHE_ROUTERS
# llm-d's inference-scheduling profile: prefix-cache-scorer 3, queue-scorer 2, kv-cache-utilization-scorer 2
PREFIX_AWARE_WEIGHTS = {"prefix": 3.0, "queue": 2.0, "kv": 2.0}


class ReplicaLoad(Protocol):
    def outstanding_requests(self) -> int: ...

    def outstanding_tokens(self) -> int: ...


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[ReplicaLoad], request: np.ndarray | None = None) -> int:
        chosen = self._next
        self._next = in_turn(chosen, len(replicas))
        return chosen


class LeastRequests:
    name = "least-requests"

    def choose(self, replicas: Sequence[ReplicaLoad], request: np.ndarray | None = None) -> int:
        return first_least([r.outstanding_requests() for r in replicas], len(replicas))


class LeastTokens:
    name = "least-tokens"

    def choose(self, replicas: Sequence[ReplicaLoad], request: np.ndarray | None = None) -> int:
        return first_least([r.outstanding_tokens() for r in replicas], len(replicas))


class ReplicaCache(ReplicaLoad, Protocol):
    """What the prefix-aware router reads of a replica, at the routing instant (read-only)."""

    block_size: int

    def waiting_requests(self) -> int: ...  # vLLM's num_requests_waiting: queued or preempted, not yet running

    def kv_usage(self) -> float: ...  # vLLM's kv_cache_usage_perc, in [0, 1]

    def key_block(self) -> np.ndarray: ...  # its KV-cache manager's key -> block map (-1: not held)


class PrefixAware:
    """llm-d's weighted scorers (the module docstring). ``request`` is the request's input column
    (sim/serving/queues.py: prompt tokens and prefix-cache keys). Each score is
    sim/serving/routing.py's rule, which a compiled cluster runs too; no step of the replicas is touched."""

    name = "prefix-aware"

    def __init__(self, prefix: float, queue: float, kv: float) -> None:
        self.weights = np.array([prefix, queue, kv])

    def scores(self, replicas: Sequence[ReplicaCache], request: np.ndarray) -> np.ndarray:
        """Each replica's weighted score (the router picks the first highest; sim/serving/routing.py)."""
        prefix = prefix_scores(replicas, request)
        queue = queue_scores(np.array([r.waiting_requests() for r in replicas], dtype=np.float64))
        return np.array([weighted_score(self.weights, prefix[i], queue[i], r.kv_usage())
                         for i, r in enumerate(replicas)])

    def choose(self, replicas: Sequence[ReplicaCache], request: np.ndarray) -> int:
        return int(np.argmax(self.scores(replicas, request)))  # argmax finds the first: the lowest index wins a tie


def prefix_scores(replicas: Sequence[ReplicaCache], request: np.ndarray) -> np.ndarray:
    """Per replica, the share of the request's full prompt blocks (at most MAX_PREFIX_BLOCKS) that
    lead its prompt and are in that replica's cache (gateway-api-inference-extension's
    prefix-cache-scorer: matched leading blocks / the prompt's blocks; 0 for a prompt under a block)."""
    blocks = prompt_blocks(int(request[REQ_PROMPT]), replicas[0].block_size)
    column = request.reshape(-1, 1)
    return np.array([prefix_score(column, 0, blocks, r.key_block()) for r in replicas], dtype=np.float64)


def queue_scores(waiting: np.ndarray) -> np.ndarray:
    """gateway-api-inference-extension's queue-scorer over the replicas' waiting requests:
    (longest - own) / (longest - shortest), 1 for every replica when the queues are equal."""
    longest, shortest = waiting.max(), waiting.min()
    return np.array([queue_score(longest, shortest, own) for own in waiting], dtype=np.float64)


@dataclass(frozen=True)
class RouterSpec:
    """A router and its parameters, as written: ``NAME`` or ``NAME:KEY=VALUE:...`` (the policies'
    syntax). Only ``prefix-aware`` takes parameters: its weights ``prefix``, ``queue``, ``kv``."""

    name: str
    weights: tuple[tuple[str, float], ...] = ()

    @property
    def text(self) -> str:
        """The canonical spelling config.toml records: the name alone at llm-d's default weights."""
        if dict(self.weights) == PREFIX_AWARE_WEIGHTS or not self.weights:
            return self.name
        return ":".join([self.name, *(f"{k}={_number_text(v)}" for k, v in self.weights)])


def _number_text(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def parse_router(raw) -> RouterSpec:
    """``round-robin``, ``least-requests``, ``least-tokens``, ``prefix-aware`` or
    ``prefix-aware:prefix=3:queue=2:kv=2`` (any weights left out keep llm-d's default); a
    ValueError with one line otherwise."""
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"expected a router name such as least-requests, got {raw!r}")
    name, *pieces = [p.strip() for p in raw.strip().split(":")]
    if name not in ROUTER_NAMES:
        raise ValueError(f"'{name}' is not one of {', '.join(ROUTER_NAMES)}")
    if name not in CACHE_ROUTERS:
        if pieces:
            raise ValueError(f"'{name}' takes no parameters, got '{raw}'")
        return RouterSpec(name)
    weights = dict(PREFIX_AWARE_WEIGHTS)
    given: set[str] = set()
    for piece in pieces:
        key, sep, value = (p.strip() for p in piece.partition("="))
        if not sep or key not in weights:
            raise ValueError(f"'{piece}' in '{raw}' is not one of prefix=W, queue=W, kv=W")
        if key in given:
            raise ValueError(f"'{raw}' gives '{key}' twice")
        given.add(key)
        try:
            weight = read_number(value)
        except ValueError:  # not a number, NaN or an infinity
            weight = -1.0
        if weight < 0:
            raise ValueError(f"weight {key}={value} must be a number >= 0")
        weights[key] = weight
    if not any(weights.values()):
        raise ValueError(f"'{raw}': at least one weight must be above 0")
    return RouterSpec(name, tuple(weights.items()))


def router_text(raw) -> str:
    """The canonical spelling of a router spec (the config's value)."""
    return parse_router(raw).text


# The routers whose rule a compiled cluster runs (sim/serving/cluster_kernel.py), by exact class: a subclass
# (its own choose) is asked step by step.
COMPILED_RULES = {RoundRobin: ROUND_ROBIN, LeastRequests: LEAST_REQUESTS, LeastTokens: LEAST_TOKENS,
                  PrefixAware: PREFIX_AWARE}


def compiled_rule(router) -> int | None:
    """The rule a compiled cluster routes by for ``router`` (sim/serving/routing.py), or None."""
    return COMPILED_RULES.get(type(router))


def make_router(name: str) -> RoundRobin | LeastRequests | LeastTokens | PrefixAware:
    spec = parse_router(name)
    if spec.name == PrefixAware.name:
        return PrefixAware(**dict(spec.weights))
    routers = {cls.name: cls for cls in (RoundRobin, LeastRequests, LeastTokens)}
    return routers[spec.name]()
