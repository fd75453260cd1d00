"""The vllm-v1 scheduler's KV-cache manager: paged blocks and prefix caching, as vLLM V1 keeps them.

The cache is ``P_BLOCKS`` blocks of ``P_BLOCK`` tokens. A request holding KV (running, or
partially prefilled) has a *slot*: its block table, ``slot_blocks[slot]`` = (blocks held,
blocks registered in the cache, block ids...). The interface the scheduler uses:

* :func:`lookup`: how many of a request's leading blocks the cache already holds;
* :func:`admit_slot` / :func:`grow_slot`: allocate what a step writes (touching cache hits);
* :func:`cache_slot`: register the request's blocks that are now full of known tokens;
* :func:`free_slot`: a finished or preempted request gives its blocks back.

Disaggregated serving (sim/disaggregated.py) holds blocks outside any running request, as vLLM's KV
connector (NIXL) does: a prefill replica's finished request keeps its blocks until the decode replica has
read them (:func:`hold_slot`, then :func:`release_held`: NIXL's delayed free), and a decode replica
allocates a prompt's blocks before reading its KV into them (:func:`reserve_blocks`; vLLM's
``WAITING_FOR_REMOTE_KVS``), which the request takes over when the scheduler admits it. Reserved blocks
are counted (``C_RESERVED``), not picked: they stay in the free queue, out of reach of admissions
(:func:`available`), so which cached contents they evict is decided when the request is admitted. A running
request that needs a block may borrow a reserved one (:func:`shortfall` counts every free block): a running
request is never preempted for KV on its way, and the request whose KV it was then waits for blocks at its
admission, as any waiting request does.

**Prefix caching** (vLLM's automatic prefix caching). A full block is identified by its
contents and everything before them (vLLM hashes a chain of block contents); the simulator
knows no tokens, so it identifies blocks by *keys* fixed before the run
(sim/serving/queues.py: :func:`prefix_keys`): block j of a request whose first
``REQ_PREFIX_BLOCKS`` blocks are a shared prefix (a system prompt) has key ``REQ_PREFIX_KEY + j``,
block j of a shared prompt (the same ``prompt_id``) has ``REQ_PROMPT_KEY + j``, and every other
block is the request's own (it can only be found again by the request itself, after a
preemption). ``key_block[key]`` is the block holding a key, or -1.

Blocks are reference-counted: requests whose prompts share a prefix share its blocks. A block
whose count falls to 0 goes to the tail of the *free queue* and keeps its contents; allocation
takes blocks from the head, evicting whatever they held (least recently freed first; a request's
blocks are freed last block first, so its tail goes before its shared prefix). A hit on a free
block takes it back out of the queue. vLLM keeps that queue as a doubly linked list; here it is a
ring of block ids in the order they were freed (``queue``, positions ``C_QUEUE_HEAD`` to
``C_QUEUE_TAIL``), each free block knowing its position (``kv[block, KV_QUEUED]``, -1 when in use):
a block taken out from the middle leaves a stale entry that allocation skips. The order is the
list's, but the blocks an admission allocates are read from consecutive entries, not each from
the one before it: a long run's free blocks are scattered over the cache's arrays, and a list
made every allocation wait for the previous one's cache miss (a quarter of a long run's compiled
time went to allocating blocks: docs/performance.md). Those rows are still scattered: an allocation
and a free each ask for the row of a block :data:`PREFETCH_AHEAD` entries further on (sim/prefetch.py),
which the cache then holds by the time its turn comes. Blocks are registered
when they are *scheduled* full (vLLM caches at allocation), so a second request with the same
prompt admitted in the same step finds the first one's blocks. At most ``(tokens - 1) //
P_BLOCK`` blocks can hit: the last token is always computed (its logits are needed).
"""

from __future__ import annotations

import numpy as np

from sim.prefetch import prefetch
from sim.scheduler.layout import (C_FREE_BLOCKS, C_FREE_SLOTS, C_HELD_BLOCKS, C_QUEUE_HEAD, C_QUEUE_TAIL, C_RESERVED,
                                  KV_FIELDS, KV_KEY, KV_QUEUED, KV_REF, NO_KEY, P_BLOCK, P_BLOCKS, P_CACHING, P_MAX_BLOCKS,
                                  REQ_PREFIX_BLOCKS, REQ_PREFIX_KEY, REQ_PROMPT_BLOCKS, REQ_PROMPT_KEY,
                                  S_FREE_SLOT)

SLOT_HELD, SLOT_CACHED = 0, 1  # slot_blocks[slot, 0]: blocks held; [slot, 1]: blocks registered
SLOT_FIRST = 2  # slot_blocks[slot, 2 + j]: the request's block j
# Blocks ahead whose rows of ``kv`` an allocation or a free asks for (sim/prefetch.py): far enough for the
# row to arrive before its turn, near enough that a decode's next allocation, steps later, still finds it.
PREFETCH_AHEAD = 8


def key_of(reqi, r, j, max_blocks):
    """Block j of request r: a shared key (>= 0) or the request's own (<= -2)."""
    if j < reqi[REQ_PREFIX_BLOCKS, r]:
        return reqi[REQ_PREFIX_KEY, r] + j
    if j < reqi[REQ_PROMPT_BLOCKS, r]:
        return reqi[REQ_PROMPT_KEY, r] + j
    return -2 - (r * max_blocks + j)


def blocks_for(tokens, block):
    return (tokens + block - 1) // block


def _unlink(kv, blk, ctr):
    """A free block leaves the queue from wherever it is (a cache hit): its entry turns stale."""
    kv[blk, KV_QUEUED] = -1
    ctr[C_FREE_BLOCKS] -= 1


def _compact(kv, queue, ctr):
    """Drop the queue's stale entries, the live ones keeping their order; returns the new tail. The
    ring has room for twice the blocks, so this runs at most once per blocks-many hits on free blocks."""
    mask = queue.shape[0] - 1
    write = ctr[C_QUEUE_HEAD]
    for p in range(ctr[C_QUEUE_HEAD], ctr[C_QUEUE_TAIL]):
        blk = queue[p & mask]
        if kv[blk, KV_QUEUED] == p:
            queue[write & mask] = blk
            kv[blk, KV_QUEUED] = write
            write += 1
    ctr[C_QUEUE_TAIL] = write
    return write


def _push_free(kv, queue, blk, ctr):
    """``blk`` goes to the tail of the free queue (evicted last)."""
    tail = ctr[C_QUEUE_TAIL]
    if tail - ctr[C_QUEUE_HEAD] == queue.shape[0]:
        tail = _compact(kv, queue, ctr)
    queue[tail & (queue.shape[0] - 1)] = blk
    kv[blk, KV_QUEUED] = tail
    ctr[C_QUEUE_TAIL] = tail + 1
    ctr[C_FREE_BLOCKS] += 1


def _pop_free(kv, queue, key_block, ctr):
    """The block at the head of the free queue, its contents evicted."""
    mask = queue.shape[0] - 1
    p = ctr[C_QUEUE_HEAD]
    blk = queue[p & mask]
    while kv[blk, KV_QUEUED] != p:  # a stale entry: that block left the queue from the middle
        p += 1
        blk = queue[p & mask]
    ctr[C_QUEUE_HEAD] = p + 1
    prefetch(kv, queue[(p + PREFETCH_AHEAD) & mask])  # a later allocation's block: its row is then at hand
    kv[blk, KV_QUEUED] = -1
    ctr[C_FREE_BLOCKS] -= 1
    key = kv[blk, KV_KEY]
    if key >= 0 and key_block[key] == blk:
        key_block[key] = -1
    kv[blk, KV_KEY] = NO_KEY
    kv[blk, KV_REF] = 1
    return blk


def lookup(reqi, r, num_tokens, resumed, kv, key_block, scratch, par):
    """How many leading blocks of request r's ``num_tokens`` known tokens the cache holds (their
    ids go to ``scratch[0]``). A resumed request may find its own blocks too (``scratch[1]`` maps
    its block index to the block still holding it)."""
    if not par[P_CACHING]:
        return 0
    block, max_blocks = par[P_BLOCK], par[P_MAX_BLOCKS]
    most = (num_tokens - 1) // block
    if resumed:  # which of its own blocks are still cached: one pass over the cache
        for j in range(most):
            scratch[1, j] = -1
        hi = -2 - r * max_blocks
        lo = hi - (max_blocks - 1)
        for blk in range(par[P_BLOCKS]):
            key = kv[blk, KV_KEY]
            if lo <= key <= hi:
                j = hi - key
                if j < most:
                    scratch[1, j] = blk
    hits = 0
    for j in range(most):
        key = key_of(reqi, r, j, max_blocks)
        if key >= 0:
            blk = key_block[key]
        elif resumed:
            blk = scratch[1, j]
        else:
            break
        if blk < 0:
            break
        scratch[0, hits] = blk
        hits += 1
    return hits


def available(ctr):
    """Free blocks an admission may take: those not reserved for KV on its way (disaggregated decode); never
    below 0, though running requests may have borrowed reserved blocks (:func:`shortfall`)."""
    left = ctr[C_FREE_BLOCKS] - ctr[C_RESERVED]
    return left if left > 0 else 0


def admission_need(hits, tokens, kv, scratch, par):
    """Free blocks a request takes when admitted with ``hits`` cached leading blocks (in ``scratch[0]``)
    and ``tokens`` slots filled: its new blocks, plus the hits that sit in the free queue."""
    need = blocks_for(tokens, par[P_BLOCK]) - hits
    for h in range(hits):
        if kv[scratch[0, h], KV_REF] == 0:
            need += 1
    return need


def admit_slot(hits, tokens, kv, queue, key_block, slot_blocks, sched, scratch, ctr, par):
    """A block table for a request whose first ``hits`` blocks (in ``scratch[0]``) are cached and
    whose step fills ``tokens`` slots in all; -1 when the free blocks do not cover it. A hit on a
    free block counts as an allocation (it leaves the free queue)."""
    if admission_need(hits, tokens, kv, scratch, par) > available(ctr):
        return -1
    ctr[C_FREE_SLOTS] -= 1
    slot = sched[S_FREE_SLOT, ctr[C_FREE_SLOTS]]
    for h in range(hits):
        blk = scratch[0, h]
        if kv[blk, KV_REF] == 0:
            _unlink(kv, blk, ctr)
        kv[blk, KV_REF] += 1
        slot_blocks[slot, SLOT_FIRST + h] = blk
    slot_blocks[slot, SLOT_HELD] = hits
    slot_blocks[slot, SLOT_CACHED] = hits
    grow_slot(slot, tokens, kv, queue, key_block, slot_blocks, ctr, par)
    return slot


def shortfall(slot, tokens, slot_blocks, ctr, par):
    """Blocks missing for the slot to hold ``tokens`` slots (<= 0: it fits now)."""
    return blocks_for(tokens, par[P_BLOCK]) - slot_blocks[slot, SLOT_HELD] - ctr[C_FREE_BLOCKS]


def grow_slot(slot, tokens, kv, queue, key_block, slot_blocks, ctr, par):
    """Allocate blocks until the slot holds ``tokens`` slots (a table never shrinks, as in vLLM)."""
    need = blocks_for(tokens, par[P_BLOCK])
    held = slot_blocks[slot, SLOT_HELD]
    while held < need:
        slot_blocks[slot, SLOT_FIRST + held] = _pop_free(kv, queue, key_block, ctr)
        held += 1
    slot_blocks[slot, SLOT_HELD] = held


def cache_slot(slot, reqi, r, known_tokens, kv, key_block, slot_blocks, par):
    """Register the slot's blocks now full of known tokens. A shared key already held by another
    block is left to that one (this block stays unregistered)."""
    if not par[P_CACHING]:
        return
    full = known_tokens // par[P_BLOCK]
    held = slot_blocks[slot, SLOT_HELD]
    if full > held:
        full = held
    max_blocks = par[P_MAX_BLOCKS]
    for j in range(slot_blocks[slot, SLOT_CACHED], full):
        blk = slot_blocks[slot, SLOT_FIRST + j]
        if kv[blk, KV_KEY] != NO_KEY:
            continue
        key = key_of(reqi, r, j, max_blocks)
        if key >= 0:
            if key_block[key] < 0:
                key_block[key] = blk
                kv[blk, KV_KEY] = key
        else:
            kv[blk, KV_KEY] = key
    if full > slot_blocks[slot, SLOT_CACHED]:
        slot_blocks[slot, SLOT_CACHED] = full


def free_slot(slot, kv, queue, slot_blocks, sched, ctr):
    """The slot's blocks go back (last block first: the tail is evicted before the prefix); the
    slot is free again."""
    for j in range(slot_blocks[slot, SLOT_HELD] - 1, -1, -1):
        if j >= PREFETCH_AHEAD:
            prefetch(kv, slot_blocks[slot, SLOT_FIRST + j - PREFETCH_AHEAD])
        blk = slot_blocks[slot, SLOT_FIRST + j]
        kv[blk, KV_REF] -= 1
        if kv[blk, KV_REF] == 0:
            _push_free(kv, queue, blk, ctr)
    slot_blocks[slot, SLOT_HELD] = 0
    slot_blocks[slot, SLOT_CACHED] = 0
    sched[S_FREE_SLOT, ctr[C_FREE_SLOTS]] = slot
    ctr[C_FREE_SLOTS] += 1


def hold_slot(slot, slot_blocks, sched, ctr):
    """A finished request's block table is freed but its blocks stay referenced (a disaggregated prefill
    replica, until the decode side has read them): returns them, for :func:`release_held`."""
    blocks = np.empty(slot_blocks[slot, SLOT_HELD], dtype=np.int64)
    hold_slot_into(slot, slot_blocks, sched, ctr, blocks)
    return blocks


def hold_slot_into(slot, slot_blocks, sched, ctr, dest):
    """:func:`hold_slot`, the blocks written into ``dest`` (a compiled run's store, which allocates nothing);
    returns how many."""
    held = slot_blocks[slot, SLOT_HELD]
    for j in range(held):
        dest[j] = slot_blocks[slot, SLOT_FIRST + j]
    ctr[C_HELD_BLOCKS] += held
    slot_blocks[slot, SLOT_HELD] = 0
    slot_blocks[slot, SLOT_CACHED] = 0
    sched[S_FREE_SLOT, ctr[C_FREE_SLOTS]] = slot
    ctr[C_FREE_SLOTS] += 1
    return held


def release_held(blocks, kv, queue, ctr):
    """Blocks kept by :func:`hold_slot` go back, as :func:`free_slot` gives a table's (last block first). A
    rule of its own (compiled where the engine is: sim.serving.loop.Rules), called once a transfer ends."""
    for j in range(blocks.shape[0] - 1, -1, -1):
        blk = blocks[j]
        kv[blk, KV_REF] -= 1
        if kv[blk, KV_REF] == 0:
            _push_free(kv, queue, blk, ctr)
    ctr[C_HELD_BLOCKS] -= blocks.shape[0]


def reserve_blocks(blocks, ctr):
    """Set ``blocks`` free blocks aside for a request whose KV is on its way (a disaggregated decode
    replica); False when fewer are available. The scheduler gives them back as it admits the request."""
    if blocks > available(ctr):
        return False
    ctr[C_RESERVED] += blocks
    return True


def remote_blocks(prompt_tokens, block):
    """What a decode replica reserves for a prompt whose KV a prefill replica sends: its whole prompt's blocks."""
    return blocks_for(prompt_tokens, block)


def request_block_keys(request, blocks):
    """The keys of a request's leading shared blocks, of its first ``blocks`` (what :func:`key_of`
    gives block by block, up to the first of the request's own blocks): a router looks them up
    before the request has a queue position, when no cache can hold its own blocks."""
    prefix_blocks = request[REQ_PREFIX_BLOCKS]
    keys = np.arange(min(blocks, max(prefix_blocks, request[REQ_PROMPT_BLOCKS])), dtype=np.int64)
    keys += np.where(keys < prefix_blocks, request[REQ_PREFIX_KEY], request[REQ_PROMPT_KEY])
    return keys


def held_keys(keys, key_block):
    """Which of ``keys`` a cache holds, read-only: unlike :func:`lookup` followed by
    :func:`admit_slot`, nothing is taken from the free queue, so no block's eviction order moves."""
    return key_block[keys] >= 0


def usage(ctr, par):
    """The share of the cache's blocks in use (vLLM's ``kv_cache_usage_perc``: blocks that are free but
    still hold cached contents count as free; blocks reserved for KV on its way count as used)."""
    return 1.0 - available(ctr) / par[P_BLOCKS] if par[P_BLOCKS] else 0.0


# Called for each block a decoding request fills (about 16M times in a million-request run): a call passed
# its four arrays' fields on the stack, and LLVM did not inline it by itself.
INLINED = (cache_slot,)  # compiled into its callers (sim/jit.py)
RULES = (key_of, blocks_for, _unlink, _compact, _push_free, _pop_free, lookup, available, admission_need, admit_slot, shortfall,
         grow_slot, cache_slot, free_slot, hold_slot_into, release_held, reserve_blocks, remote_blocks, usage)


def prefix_keys(requests, block_size: int) -> tuple[np.ndarray | None, int]:
    """Each request's shared prefix-cache keys (rows REQ_PREFIX_KEY .. REQ_PROMPT_BLOCKS of a queue's
    inputs, sim/serving/queues.py) and how many keys there are; (None, 0) when nothing is shared.

    Requests with the same ``prefix_id`` share their first ``prefix_tokens // block_size`` blocks
    (a system prompt); requests with the same ``prompt_id`` share every full block of their prompt
    (the same prompt sent again), as far as the group's shortest prompt reaches: a prompt sent
    twice can come back a token or two longer from the tokenizer, and blocks past the shortest
    one's are not the same. Each group's keys are a dense range, in order of first appearance."""
    n = len(requests)
    prompt_id, prefix_id = requests.prompt_id, requests.prefix_id
    if prompt_id is None and prefix_id is None:
        return None, 0
    keys = np.zeros((4, n), dtype=np.int64)
    used = 0
    if prefix_id is not None:
        given = prefix_id >= 0
        groups, first, inverse = np.unique(np.where(given, prefix_id, -1), return_index=True, return_inverse=True)
        blocks = np.where(given, requests.prefix_tokens // block_size, 0)
        group_blocks = np.zeros(groups.shape[0], dtype=np.int64)
        np.maximum.at(group_blocks, inverse, blocks)
        base = used + np.concatenate(([0], np.cumsum(group_blocks)[:-1]))
        keys[0], keys[1] = base[inverse], blocks
        used += int(group_blocks.sum())
    if prompt_id is not None:
        given = prompt_id >= 0
        groups, inverse = np.unique(np.where(given, prompt_id, -1), return_inverse=True)
        shortest = np.full(groups.shape[0], np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(shortest, inverse, requests.prompt_tokens)
        group_blocks = np.where(groups >= 0, shortest // block_size, 0)
        base = used + np.concatenate(([0], np.cumsum(group_blocks)[:-1]))
        keys[2], keys[3] = base[inverse], np.where(given, group_blocks[inverse], 0)
        used += int(group_blocks.sum())
    return keys, used


class KVCacheManager:
    """The cache's arrays, as one replica's vllm-v1 scheduler holds them (the rules above work on them)."""

    def __init__(self, num_blocks: int, max_blocks_per_request: int, slots: int, num_keys: int) -> None:
        self.num_blocks = num_blocks
        self.kv = np.zeros((max(num_blocks, 1), KV_FIELDS), dtype=np.int64)
        self.kv[:, KV_KEY] = NO_KEY
        # the free queue: every block, in order; a ring of a power of two (positions are masked, not
        # divided) of at least twice the blocks (stale entries are compacted away when it fills)
        self.queue = np.zeros(1 << (2 * max(int(num_blocks), 1) - 1).bit_length(), dtype=np.int64)
        self.queue[:num_blocks] = np.arange(num_blocks)
        self.kv[:num_blocks, KV_QUEUED] = np.arange(num_blocks)
        self.key_block = np.full(max(num_keys, 1), -1, dtype=np.int64)
        self.slot_blocks = np.zeros((slots, SLOT_FIRST + max_blocks_per_request), dtype=np.int64)
        self.scratch = np.zeros((2, max_blocks_per_request), dtype=np.int64)
        self.held: dict[int, np.ndarray] = {}  # a disaggregated prefill replica: finished requests' kept blocks

    def start(self, ctr) -> None:
        """The scheduler's counters as the cache starts: every block free, in the queue in order."""
        ctr[C_FREE_BLOCKS] = self.num_blocks
        ctr[C_QUEUE_HEAD], ctr[C_QUEUE_TAIL] = 0, self.num_blocks

    def hold(self, request: int, slot: int, sched, ctr) -> None:
        """``request`` (a queue position) finished on a disaggregated prefill replica: its blocks stay until
        :meth:`release` (sim/disaggregated.py calls it when the decode side has read them)."""
        self.held[request] = hold_slot(slot, self.slot_blocks, sched, ctr)

    def release(self, request: int, ctr, par, rule=release_held) -> None:
        """``request``'s held blocks go back (``rule``: :func:`release_held`, or its compiled twin)."""
        rule(self.held.pop(request), self.kv, self.queue, ctr)

    def check(self, ctr) -> None:
        """The cache's invariants (tests): counts match the free queue and the tables."""
        kv, n, queue = self.kv, self.num_blocks, self.queue
        head, tail = int(ctr[C_QUEUE_HEAD]), int(ctr[C_QUEUE_TAIL])
        assert 0 <= tail - head <= queue.shape[0], "the free queue overran its ring"
        positions = np.arange(head, tail)
        entries = queue[positions & (queue.shape[0] - 1)]
        live = entries[kv[entries, KV_QUEUED] == positions]
        assert (kv[live, KV_REF] == 0).all(), "a block in the free queue is referenced"
        assert live.shape[0] == ctr[C_FREE_BLOCKS], "free-block count and free queue disagree"
        queued = np.flatnonzero(kv[:n, KV_QUEUED] >= 0)
        assert np.array_equal(np.sort(live), queued), "a free block is not in the queue once, at its position"
        assert (kv[:n, KV_REF] >= 0).all(), "a negative reference count"
        held = self.slot_blocks[:, SLOT_HELD]
        refs = np.zeros(n, dtype=np.int64)
        for slot in np.flatnonzero(held):
            np.add.at(refs, self.slot_blocks[slot, SLOT_FIRST:SLOT_FIRST + held[slot]], 1)
        for blocks in self.held.values():
            np.add.at(refs, blocks, 1)
        assert (refs == kv[:n, KV_REF]).all(), "reference counts and block tables disagree"
        assert sum(b.shape[0] for b in self.held.values()) == ctr[C_HELD_BLOCKS], "held blocks miscounted"
        assert ctr[C_RESERVED] >= 0, "a negative reservation"
        mapped = np.flatnonzero(self.key_block >= 0)
        assert (kv[self.key_block[mapped], KV_KEY] == mapped).all(), "a key maps to a block that holds another"
