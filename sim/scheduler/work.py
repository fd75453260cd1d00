"""Whether a replica has a step to run: the one rule the clock, the loop and the compiled runs ask.

Both schedulers keep their queues in the same counters (sim/scheduler/layout.py): v0 never has
prefilling or requeued requests, so the rule is the same for both.
"""

from __future__ import annotations

from sim.scheduler.layout import C_ARRIVED, C_HEAD, C_HELD_BLOCKS, C_PREFILLING, C_REQUEUED, C_RESERVED, C_RUNNING
from sim.scheduler.v1 import head_fits


def has_work(ctr):
    """Whether a step can run now: running or prefilling requests, requeued (preempted) ones, or waiting ones."""
    return ctr[C_RUNNING] > 0 or ctr[C_PREFILLING] > 0 or ctr[C_REQUEUED] > 0 or ctr[C_ARRIVED] > ctr[C_HEAD]


def can_step(s):
    """:func:`has_work` for a replica that may hold blocks outside its running requests (a disaggregated
    replica, sim/disaggregated.py): with nothing running, waiting requests are work only if the next one
    fits; else the replica waits until a transfer gives blocks back. Elsewhere it is :func:`has_work`."""
    ctr = s.counters
    if not has_work(ctr):
        return False
    if ctr[C_RUNNING] > 0 or ctr[C_PREFILLING] > 0 or (ctr[C_HELD_BLOCKS] == 0 and ctr[C_RESERVED] == 0):
        return True
    return head_fits(s)


RULES = (has_work, can_step)
