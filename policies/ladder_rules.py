"""SGLang's adaptive ladder (policies/sglang_adaptive.py) as rules: plain functions over its state's arrays.

:class:`policies.sglang_adaptive.SglangAdaptive` calls them step by step; the simulator's compiled
runs (sim/serving/kernel.py) call the same functions, compiled by numba, on the same arrays (the
policy hands them over in its :meth:`~policies.sglang_adaptive.SglangAdaptive.compiled_form`), so
there is one implementation of the controller, as for goodput (policies/goodput_rules.py).

State: ``scalars`` (the settings every slot shares, and the slot the last choice was made at) and
``slots[slot, field]``: each batch-size slot's ladder, its place on it, its EMA of accepted drafts,
its verify count, its hysteresis, and its steps from column ``STEPS`` on (``N_STEPS`` of them).
"""

from __future__ import annotations

EMA_ALPHA, WARMUP, INTERVAL, PLAYED = range(4)
N_SCALARS = 4
INDEX, EMA, VERIFIES, DOWN, UP, N_STEPS, STEPS = range(7)


def play(scalars, slots, slot):
    """The k a step at ``slot`` drafts: its ladder's current step. The slot is remembered for :func:`learn`."""
    scalars[PLAYED] = slot
    return int(slots[slot, STEPS + int(slots[slot, INDEX])])


def advance(slots, slot, mean_accepted, ema_alpha, warmup, interval):
    """SGLang's update after a verify: the EMA takes the batch's mean accepted drafts per request; past the
    warm-up, every ``interval`` verifies, the ladder steps down while the EMA is at or below the step below
    less a half plus the down hysteresis, then up while it is above its step less a half plus the up one."""
    ema = (1.0 - ema_alpha) * slots[slot, EMA] + ema_alpha * mean_accepted
    slots[slot, EMA] = ema
    verifies = int(slots[slot, VERIFIES]) + 1
    slots[slot, VERIFIES] = verifies
    if verifies <= warmup or (verifies - warmup) % interval:
        return
    i = int(slots[slot, INDEX])
    while i > 0 and ema <= slots[slot, STEPS + i - 1] - 0.5 + slots[slot, DOWN]:
        i -= 1
    while i < int(slots[slot, N_STEPS]) - 1 and ema > slots[slot, STEPS + i] - 0.5 + slots[slot, UP]:
        i += 1
    slots[slot, INDEX] = i


def learn(scalars, slots, mean_accepted, offered):
    """After a step with decode rows: the slot :func:`play` chose at moves by the step's mean accepted drafts
    per request, unless the step offered no draft (``offered`` = 0: nothing was verified)."""
    slot = int(scalars[PLAYED])
    scalars[PLAYED] = -1
    if slot >= 0 and offered:
        advance(slots, slot, mean_accepted, scalars[EMA_ALPHA], int(scalars[WARMUP]), int(scalars[INTERVAL]))


RULES = (play, advance, learn)
