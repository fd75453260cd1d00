"""The routers' rules, written once over a replica's state arrays (sim/scheduler/layout.py).

sim/router.py's routers call them as Python (through sim/cluster.py's ReplicaSignals and the loop's
``outstanding_*``; prefix-aware's scores); the compiled cluster (sim/serving/cluster_kernel.py) calls them compiled, in its
own loop. Ties go to the lowest replica index, so routing is deterministic.
"""

from __future__ import annotations

from sim.scheduler.layout import (C_HEAD, C_PREFILLING, C_REQUEUED, C_REQUEUED_AT, C_RUNNING, C_TOTAL_REMAINING,
                                  P_MAX_SEQS, REC_EMITTED, REQ_OUTPUT, REQ_PREFIX_BLOCKS, REQ_PROMPT,
                                  REQ_PROMPT_BLOCKS, S_PF_DONE, S_PF_REQ, S_PF_TARGET, S_REQUEUED)
from sim.scheduler.kvcache import key_of

# The routers a compiled cluster runs (sim/router.py names them): what the kernel is told to do.
ROUND_ROBIN, LEAST_REQUESTS, LEAST_TOKENS, PREFIX_AWARE = range(4)
# gateway-api-inference-extension's prefix-cache-scorer matches at most 256 blocks of a prompt
MAX_PREFIX_BLOCKS = 256


def in_turn(chosen, n):
    """Round-robin: the replica after ``chosen``, of ``n``."""
    return (chosen + 1) % n


def first_least(loads, n):
    """The index of the smallest of ``loads[:n]``, the first one at a tie."""
    best = 0
    for i in range(1, n):
        if loads[i] < loads[best]:
            best = i
    return best


def outstanding_requests(ctr, count):
    """Given to the replica (``count``: its queue's length) and not finished: waiting (or being
    prefilled) plus running plus preempted."""
    return count - ctr[C_HEAD] + ctr[C_RUNNING] + ctr[C_PREFILLING] + ctr[C_REQUEUED]


def outstanding_tokens(ctr, par, sched, reqi, reci, waiting):
    """Prompt tokens not yet prefilled plus output tokens not yet emitted, over the replica's
    unfinished requests; ``waiting``: the prompt and output tokens of those not yet taken from its queue."""
    tokens = waiting + ctr[C_TOTAL_REMAINING]
    for j in range(ctr[C_PREFILLING]):  # vllm-v1: prompts (or recomputes) not yet in, and their outputs
        req = sched[S_PF_REQ, j]
        tokens += sched[S_PF_TARGET, j] - sched[S_PF_DONE, j] + reqi[REQ_OUTPUT, req] - reci[REC_EMITTED, req]
    cap = par[P_MAX_SEQS]
    for j in range(ctr[C_REQUEUED]):
        req = sched[S_REQUEUED, (ctr[C_REQUEUED_AT] + j) % cap]
        tokens += reqi[REQ_PROMPT, req] + reqi[REQ_OUTPUT, req]
    return tokens


def waiting_requests(ctr, count):
    """vLLM's num_requests_waiting: routed to the replica and not yet taken by its scheduler, plus the
    preempted ones waiting again."""
    return count - ctr[C_HEAD] + ctr[C_REQUEUED]


def prompt_blocks(prompt, block_size):
    """The prompt's full blocks the prefix-cache scorer weighs (at most MAX_PREFIX_BLOCKS)."""
    return min(prompt // block_size, MAX_PREFIX_BLOCKS)


def leading_cached_blocks(reqi, r, blocks, key_block):
    """How many of request ``r``'s (a column of ``reqi``) first ``blocks`` prompt blocks a cache
    (``key_block``, read-only: nothing moves in its eviction order) holds, counted up to the first miss;
    only the request's shared blocks can be held (its own are made when it is admitted)."""
    shared = min(blocks, max(reqi[REQ_PREFIX_BLOCKS, r], reqi[REQ_PROMPT_BLOCKS, r]))
    for j in range(shared):
        if key_block[key_of(reqi, r, j, 1)] < 0:
            return j
    return shared


def prefix_score(reqi, r, blocks, key_block):
    """The prefix-cache scorer for one replica: the share of request ``r``'s ``blocks`` leading prompt
    blocks held in its cache (:func:`leading_cached_blocks`); 0 for a prompt under a block."""
    if blocks == 0:
        return 0.0
    return leading_cached_blocks(reqi, r, blocks, key_block) / blocks


def queue_score(longest, shortest, own):
    """The queue scorer: (longest - own) / (longest - shortest) over the replicas' waiting requests,
    1 when every queue is as long."""
    spread = longest - shortest
    return 1.0 if spread == 0 else (longest - own) / spread


def weighted_score(weights, prefix, queue, used):
    """llm-d's weighted sum of the prefix, queue and KV-cache-utilisation scores (``used``: the KV usage)."""
    return weights[0] * prefix + weights[1] * queue + weights[2] * (1.0 - used)


RULES = (in_turn, first_least, outstanding_requests, outstanding_tokens, waiting_requests, prompt_blocks,
         leading_cached_blocks, prefix_score, queue_score, weighted_score)
