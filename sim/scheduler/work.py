"""Whether a replica has a step to run: the one rule the clock, the loop and the compiled runs ask.

Both schedulers keep their queues in the same counters (sim/scheduler/layout.py): v0 never has
prefilling or requeued requests, so the rule is the same for both.
"""

from __future__ import annotations

from sim.scheduler.layout import C_ARRIVED, C_HEAD, C_PREFILLING, C_REQUEUED, C_RUNNING


def has_work(ctr):
    """Whether a step can run now: running or prefilling requests, requeued (preempted) ones, or waiting ones."""
    return ctr[C_RUNNING] > 0 or ctr[C_PREFILLING] > 0 or ctr[C_REQUEUED] > 0 or ctr[C_ARRIVED] > ctr[C_HEAD]


RULES = (has_work,)
