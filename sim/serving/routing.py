"""The load-based routers' rules, written once over a replica's state arrays (sim/scheduler/layout.py).

sim/router.py's routers call them as Python (through sim/cluster.py's ReplicaSignals and the loop's
``outstanding_*``); the compiled cluster (sim/serving/cluster_kernel.py) calls them compiled, in its
own loop. Ties go to the lowest replica index, so routing is deterministic.
"""

from __future__ import annotations

from sim.scheduler.layout import (C_HEAD, C_PREFILLING, C_REQUEUED, C_REQUEUED_AT, C_RUNNING, C_TOTAL_REMAINING,
                                  P_MAX_SEQS, REC_EMITTED, REQ_OUTPUT, REQ_PROMPT, S_PF_DONE, S_PF_REQ, S_PF_TARGET,
                                  S_REQUEUED)

# The routers a compiled cluster runs (sim/router.py names them): what the kernel is told to do.
ROUND_ROBIN, LEAST_REQUESTS, LEAST_TOKENS = range(3)


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


RULES = (in_turn, first_least, outstanding_requests, outstanding_tokens)
