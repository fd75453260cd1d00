"""The KV cache's free-block queue (sim/scheduler/kvcache.py): a ring with stale entries that must
give the blocks in exactly the order vLLM's doubly linked free list gives them."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.scheduler import kvcache
from sim.scheduler.layout import C_FREE_BLOCKS, C_QUEUE_HEAD, C_QUEUE_TAIL, KV_QUEUED, KV_REF, N_COUNTERS


def fresh(blocks: int):
    manager = kvcache.KVCacheManager(num_blocks=blocks, max_blocks_per_request=4, slots=2, num_keys=1)
    ctr = np.zeros(N_COUNTERS, dtype=np.int64)
    manager.start(ctr)
    return manager, ctr


def queued(manager, ctr) -> list[int]:
    """The free blocks in queue order, read off the ring (its live entries)."""
    mask = manager.queue.shape[0] - 1
    out = []
    for p in range(int(ctr[C_QUEUE_HEAD]), int(ctr[C_QUEUE_TAIL])):
        blk = int(manager.queue[p & mask])
        if manager.kv[blk, KV_QUEUED] == p:
            out.append(blk)
    return out


# Each operation: 0 take the head (an allocation), 1 give back a block in use (a free), 2 take a free block
# from the middle (a cache hit on it); the int picks which block.
operations = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10**6)), max_size=400)


@settings(max_examples=150, deadline=None)
@given(blocks=st.integers(1, 12), ops=operations)
def test_the_ring_gives_the_blocks_in_the_linked_lists_order(blocks, ops):
    manager, ctr = fresh(blocks)
    kv, queue = manager.kv, manager.queue
    order = list(range(blocks))  # the reference: vLLM's free list, least recently freed first
    for op, pick in ops:
        if op == 0 and order:
            assert kvcache._pop_free(kv, queue, manager.key_block, ctr) == order.pop(0)
        elif op == 1 and len(order) < blocks:
            blk = sorted(set(range(blocks)) - set(order))[pick % (blocks - len(order))]
            kv[blk, KV_REF] = 0
            kvcache._push_free(kv, queue, blk, ctr)
            order.append(blk)
        elif op == 2 and order:
            blk = order.pop(pick % len(order))
            kvcache._unlink(kv, blk, ctr)
            kv[blk, KV_REF] = 1
        assert queued(manager, ctr) == order
        assert ctr[C_FREE_BLOCKS] == len(order)
        assert 0 <= ctr[C_QUEUE_TAIL] - ctr[C_QUEUE_HEAD] <= queue.shape[0]


def test_a_full_ring_of_stale_entries_is_compacted_in_order():
    manager, ctr = fresh(4)
    kv, queue = manager.kv, manager.queue
    assert queue.shape[0] == 8  # twice the blocks, a power of two
    for _ in range(3):  # block 3 taken from the middle and given back: one stale entry each time
        kvcache._unlink(kv, 3, ctr)
        kvcache._push_free(kv, queue, 3, ctr)
    kvcache._unlink(kv, 1, ctr)
    assert ctr[C_QUEUE_TAIL] - ctr[C_QUEUE_HEAD] == 7
    kvcache._push_free(kv, queue, 1, ctr)  # fills the ring
    kvcache._unlink(kv, 0, ctr)
    kvcache._push_free(kv, queue, 0, ctr)  # no room: the stale entries go first
    assert ctr[C_QUEUE_TAIL] - ctr[C_QUEUE_HEAD] == 4
    assert queued(manager, ctr) == [2, 3, 1, 0]
    manager.check(ctr)

