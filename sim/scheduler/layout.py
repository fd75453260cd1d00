"""The engine's state, declared once: what each row of each array holds (numbers, no code).

A replica's state is a handful of numpy arrays (sim/serving/state.py builds them), so that
the rules (sim/serving/rules.py, sim/scheduler/) read and write it alike whether Python
interprets them step by step or numba runs them compiled (sim/jit.py). These are the indices.
It lives here, below the serving loop, because the schedulers, the proposal rules
(sim/speculation/proposals.py) and the loop all read it, and the loop imports them: none of them imports
the loop back.

Who writes what (docs/architecture.md, "Who owns the state"):

* the **queue** writes the request inputs (``REQ_*_IN``) as requests arrive or are routed;
* the **scheduler** decides: it admits, chunks, preempts, and so writes the waiting and
  prefilling queues (``SCHED``), the rows' membership and order, the KV blocks (``KV``), the
  plan of the step (``PLAN`` counters, ``SCHED`` plan rows) and ``scheduled_s``;
* the **loop** applies: the step's outcome (tokens emitted, rows' progress, rows retired, the
  per-request records and the step records).
"""

# ------------------------------------------------------------------ rows: one per running request
# int block ``rows[field, row]``
ROW_REQ, ROW_REMAINING, ROW_CONTEXT, ROW_LAG, ROW_SLOT = range(5)
ROW_INTS = 5
# ROW_REMAINING: output tokens still owed; ROW_CONTEXT: tokens whose KV is computed (prompt +
# emitted - 1); ROW_LAG: emitted tokens the draft has not been fed (loop.py's docstring); ROW_SLOT:
# the request's block table (vllm-v1).
# float block ``rowf[field, row]``
ROW_SCALE, ROW_LAST_EMIT = range(2)
ROW_FLOATS = 2
# ROW_SCALE: what the acceptance sampler reads for the row (alpha's scale, or the request id);
# ROW_LAST_EMIT: when the row's request emitted its latest token (its next ITL starts there).

# ------------------------------------------------------------ requests: indexed by queue position
# inputs, int block ``reqi[field, request]`` (written by the queue)
REQ_PROMPT, REQ_OUTPUT, REQ_RESERVE, REQ_PREFIX_KEY, REQ_PREFIX_BLOCKS, REQ_PROMPT_KEY, REQ_PROMPT_BLOCKS = range(7)
# REQ_RESERVE: KV tokens the v0 scheduler reserves at admission. Prefix caching (vllm-v1): the
# request's first REQ_PREFIX_BLOCKS blocks hold the dense cache keys REQ_PREFIX_KEY + j, its
# next ones up to REQ_PROMPT_BLOCKS the keys REQ_PROMPT_KEY + j (a shared prompt); the rest are
# its own (sim/scheduler/kvcache.py).
REQ_REMOTE = 7
# REQ_REMOTE (vllm-v1, a disaggregated decode replica: sim/disaggregated.py): the leading prompt tokens
# whose KV a prefill replica sent; the scheduler admits them as computed, as vLLM's KV connector
# (NIXL) has them (prompt - 1: the last prompt token is computed again for its logits). 0 elsewhere.
# records, int block ``reci[field, request]`` (the loop; the scheduler writes REC_CACHED, REC_PREEMPTIONS)
REC_EMITTED, REC_DECODE_STEPS, REC_DRAFTED, REC_ACCEPTED, REC_PREEMPTIONS, REC_CACHED = range(6)
REC_INTS = 6
# records, float block ``recf[field, request]``
REC_SCHEDULED, REC_FIRST_TOKEN, REC_FINISH, REC_LAST_EMIT = range(4)
REC_FLOATS = 4

# ------------------------------------------------------------------------ counters ``ctr[name]``
(C_RUNNING, C_HEAD, C_ARRIVED, C_PREFILLING, C_REQUEUED, C_REQUEUED_AT, C_KV_USED, C_TOTAL_REMAINING,
 C_TOTAL_CONTEXT, C_DECODE_COUNT, C_STATIC_BATCH,
 # the plan of the step being run (scheduler -> loop)
 C_PHASE, C_STEP_ROWS, C_STEP_K, C_RAGGED, C_DECODE_TOKENS, C_ADMIT, C_CHUNKS, C_CHUNK_TOKENS, C_PREEMPTED_NOW,
 C_STEP_BLOCKS, C_STEP_RUNNING, C_STEP_CHARGED,
 # KV blocks (vllm-v1) and the prefix cache's statistics
 C_FREE_BLOCKS, C_PEAK_BLOCKS, C_FREE_SLOTS, C_ADMISSIBLE, C_ARRIVED_PREV, C_CACHE_QUERIES, C_CACHE_HITS, C_RESUME_QUERIES, C_RESUME_HITS,
 # the compiled run's buffers
 C_DRAW_POS, C_REC_POS, C_REC_END, C_ITL_POS, C_ITL_END, C_STEPS,
 # the policy's k before a host matcher's rows cut theirs to what they proposed (sim.speculation.proposals)
 C_OFFERED_K,
 # the largest draft lag of the step's decoding rows (what the draft's catch-up is priced at)
 C_STEP_LAG,
 # disaggregated serving's KV held outside any running request (sim/disaggregated.py)
 C_HELD_BLOCKS, C_RESERVED,
 # the free-block queue's first and next positions (sim/scheduler/kvcache.py)
 C_QUEUE_HEAD, C_QUEUE_TAIL) = range(44)
N_COUNTERS = 44
# C_ADMISSIBLE: the waiting requests a step may admit (vllm-v1 with asynchronous scheduling: those that
# had arrived when the previous step started, when it was planned); C_ARRIVED_PREV: C_ARRIVED then.
# C_CACHE_*: prefix-cache look-ups of requests scheduled for the first time (tokens asked, tokens
# found, as vLLM counts them); C_RESUME_*: of preempted requests resumed (vLLM keeps them apart).
# C_STEP_BLOCKS: KV blocks in use during the step (vllm-v1); C_STEP_RUNNING: rows running when it started;
# C_STEP_CHARGED: the batch size its decodes are charged at.
# C_HELD_BLOCKS: a prefill replica's block references kept for finished requests until a decode replica has
# read their KV (NIXL's delayed free; kvcache.hold_slot / release_held). C_RESERVED: a decode replica's blocks
# allocated to requests whose KV is on its way (vLLM's WAITING_FOR_REMOTE_KVS), taken from the free blocks
# (kvcache.reserve_blocks) and given to the request when the scheduler admits it.

# floats ``clk[name]``: the clock, the end of the last decode step (ITLs), a compiled run's step in
# flight, the step's mean context (decodes) or mean prompt (a v0 prefill), the prompt length a v0
# prefill is priced at (its mean, or padded its longest)
NOW, LAST_DECODE_END, PENDING_END, STEP_MEAN, LAST_STEP_END, STEP_PROMPT = range(6)
N_CLOCKS = 6

# ------------------------------------------------------- scheduler queues and plan ``sched[field, i]``
# prefilling entries (vllm-v1), in running order; the waiting ring of preempted requests; the
# step's per-row speculative tokens; its chunks; the free block-table slots.
(S_PF_REQ, S_PF_DONE, S_PF_TARGET, S_PF_SLOT, S_REQUEUED, S_ROW_K, S_CHUNK_ENTRY, S_CHUNK_TOKENS,
 S_CHUNK_PREFIX, S_FREE_SLOT, S_HELD_REQ, S_HELD_SLOT) = range(12)
SCHED_FIELDS = 12
# S_CHUNK_PREFIX: the tokens a chunk's request already holds in the KV cache (what it attends to beyond itself).
# S_HELD_REQ, S_HELD_SLOT (P_HOLD): the requests a step finished and the block tables they keep, in finishing
# order, until the queue hands them over (sim.serving.queues.PrefillQueue).

# ------------------------------------------------------------------ step kinds (records' phase)
PREFILL, DECODE, MIXED = 0, 1, 2  # MIXED: a vllm-v1 step of decodes and prefill chunks
NOTHING = -1  # a plan with nothing to run: the replica waits for arrivals

# ------------------------------------------------------------------ scheduler parameters ``par[name]``
(P_MAX_SEQS, P_BUDGET, P_BLOCK, P_LOOKAHEAD, P_CHUNKED, P_CACHING, P_KV_BUDGET, P_STATIC, P_PADDED,
 P_MAX_BLOCKS, P_BLOCKS, P_ASYNC, P_HOLD) = range(13)
N_PARAMS = 13
# P_MAX_BLOCKS: the longest block table a request can need; P_BLOCKS: the KV cache's blocks. P_HOLD: a
# disaggregated prefill replica: a finished request keeps its blocks (S_HELD_*) until its KV has been read.

# -------------------------------------------------------------- KV blocks ``kv[block, field]`` (vllm-v1)
KV_KEY, KV_REF, KV_QUEUED = range(3)
KV_FIELDS = 4  # three fields, padded to 32 bytes: a block's fields never straddle a cache line
NO_KEY = -1  # a block holding nothing reusable; keys >= 0 are shared; <= -2 a request's own (kvcache.py)

# -------------------------------------------------------------- compiled runs' stop reasons
IDLE, ARRIVAL, REFILL, LIMIT, DONE = 0, 1, 2, 3, 4
MANY = 1 << 62

# acceptance samplers a compiled run draws for (sim.speculation.acceptance)
SHARED, SCALED, POSITIONS = 0, 1, 2
