"""A step's price looked up in a step table (:class:`sim.costmodel.model.StepTable`), as one set of rules.

The same functions price a step for :class:`~sim.costmodel.model.StepTable` (Python, on its rows as
lists) and inside compiled runs (numba, on the table's arrays): a row is indexed and measured
with ``len``, so both work (sim/jit.py). The formulas are docs/cost-model.md's.
"""

from __future__ import annotations


def blend(row, x):
    """Linear interpolation in a row of evenly spaced values at fractional column x."""
    j = int(x)
    if j >= len(row) - 1:
        return row[len(row) - 1]
    lo = row[j]
    return lo + (x - j) * (row[j + 1] - lo)


def catch_up_price(rows, lag, x):
    """The draft's first pass beyond q = 1 at ``lag`` (one batch size's rows [lag][column]);
    past the tabulated lags it grows linearly."""
    if lag < len(rows):
        return blend(rows[lag], x)
    top = len(rows) - 1
    at_top = blend(rows[top], x)
    slope = at_top - blend(rows[top - 1], x)
    return at_top + (lag - top) * slope


def decode_price(decode, lag2, catch_up, b, k, x, lag):
    """A decode step of b sequences at k (x: mean context in table columns) whose draft lags at
    most ``lag`` tokens: the table, the table at lag 2 (one look-up), or the catch-up added."""
    if k == 0 or lag <= 1:
        return blend(decode[b][k], x)
    if lag == 2:
        return blend(lag2[b][k], x)
    return blend(decode[b][k], x) + catch_up_price(catch_up[b], lag, x)


def tokens_price(decode, b, ks, m, x):
    """A ragged decode step priced by its tokens: the uniform step at the rows' mean k (kbar = sum of
    ks / m; b (kbar + 1) tokens), interpolated between the two integer ks around it. A host matcher's
    steps are priced so (vLLM flattens a step's tokens; a row without a match verifies one), not
    padded to the largest k."""
    total = 0
    for i in range(m):
        total += ks[i]
    kbar = total / m
    j = int(kbar)
    lo = blend(decode[b][j], x)
    if j + 1 >= len(decode[b]) or kbar == j:
        return lo
    return lo + (kbar - j) * (blend(decode[b][j + 1], x) - lo)


def padded_step(pad, tokens):
    """The tokens a step of ``tokens`` runs at: the next CUDA-graph capture size (``pad[tokens]``),
    or itself past the largest (an empty ``pad``: no graphs)."""
    return pad[tokens] if tokens < len(pad) else tokens


def prefix_attention_price(kv_read, theta, tokens, prefix, n):
    """X: what n prefill chunks add by attending to the tokens their requests already hold in the KV
    cache (``tokens[i]`` new ones after ``prefix[i]`` cached ones): per chunk the larger of reading
    that KV (kv_read per token) and attending to it (2 theta Q S)."""
    total = 0.0
    for i in range(n):
        if prefix[i]:
            read = kv_read * prefix[i]
            attend = 2.0 * theta * tokens[i] * prefix[i]
            total += read if read >= attend else attend
    return total


def chunk_price(chunk, step, overhead, exposed, overlapped, pad, decode_tokens, chunk_tokens, prefix_cost):
    """What a vllm-v1 step's prefill chunks add: P(pad(D + Q)) - P(pad(D)) + X, or for a step of
    chunks alone (D = 0) P(pad(Q)) + X with the engine's own work per step: overlapping the passes
    (the larger of the two) or added to them. X: :func:`prefix_attention_price`."""
    if decode_tokens == 0:
        passes = blend(chunk, padded_step(pad, chunk_tokens) / step) + prefix_cost + exposed
        if overlapped:
            return passes if passes >= overhead else overhead
        return passes + overhead
    return (blend(chunk, padded_step(pad, decode_tokens + chunk_tokens) / step)
            - blend(chunk, padded_step(pad, decode_tokens) / step) + prefix_cost)


def prefill_price(prefill, b, prompt_column):
    """A v0 prefill step of b prompts at ``prompt_column`` (the mean prompt, or the longest when padded)."""
    return blend(prefill[b], prompt_column)


RULES = (blend, catch_up_price, decode_price, tokens_price, padded_step, prefix_attention_price, chunk_price,
         prefill_price)
INLINED = (decode_price,)  # compiled into its callers (sim/jit.py)
