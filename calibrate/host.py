"""Host-side proposers, timed: n-gram prompt lookup and suffix matching, batched with numpy.

n-gram and suffix speculation run no GPU pass: after each step the engine's CPU looks, for every
running request, for the latest tokens earlier in that request's context and proposes the tokens
that followed. What that costs a step (the whole batch's look-ups) is this module's measurement,
the profile's ``propose`` phase (sim.costmodel.profile):

* ``ngram`` (vLLM's ``NgramProposer``): the longest n in [prompt_lookup_min, prompt_lookup_max]
  whose last n tokens occur earlier in the context; the k tokens after that occurrence;
* ``suffix`` (vLLM's ``suffix`` method, Arctic Inference's suffix decoding): the longest match of
  the context's suffix, up to ``max_depth`` tokens, anywhere earlier; up to k tokens after it.

Both are numpy, batched over the requests: one comparison of every context with its last token
finds the candidate positions, each then extended backwards (up to n, or the suffix depth), so
the time grows with batch x context. Contexts are token ids with text-like Zipf frequencies,
so that a common last token has as many candidates as in text. The engines run compiled versions (vLLM's n-gram matcher
is numba-compiled and threaded; suffix decoding keeps a C++ suffix tree, whose look-up does not
grow with the context), so this is the cost of a plain host implementation of the same
matchers, recorded as such in the profile. Only numpy is needed (calibrate's rule: torch, numpy,
pandas alone).
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

HOST_METHODS = ("ngram", "suffix")
NGRAM_LOOKUP = (5, 5)  # vLLM's prompt_lookup_min/max when neither is given
SUFFIX_DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth default
VOCAB = 32000  # token ids are drawn from this many,
ZIPF = 1.1  # with Zipf-law frequencies (exponent ~1, as natural text's): a common last token has many candidates


def match_lengths(contexts: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every earlier position j of each row whose token equals the row's last token, and how many tokens
    (up to ``depth``) end at j as the context ends: (rows, positions, lengths), in row order. One
    comparison of the whole batch finds the candidates; those still matching are extended backwards."""
    b, c = contexts.shape
    rows, pos = np.nonzero(contexts[:, :c - 1] == contexts[:, c - 1:c])
    length = np.ones(rows.shape[0], dtype=np.int64)
    live = np.arange(rows.shape[0])
    for t in range(1, min(depth, c - 1)):
        back = pos[live] - t
        ok = back >= 0
        r = rows[live]
        ok[ok] = contexts[r[ok], back[ok]] == contexts[r[ok], c - 1 - t]
        live = live[ok]
        if live.shape[0] == 0:
            break
        length[live] += 1
    return rows, pos, length


def _best_per_row(rows: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each row that has candidates, its largest key); ``rows`` sorted."""
    if rows.shape[0] == 0:
        return rows, key
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    return rows[starts], np.maximum.reduceat(key, starts)


def ngram_propose(contexts: np.ndarray, k: int, lookup: tuple[int, int] = NGRAM_LOOKUP) -> np.ndarray:
    """For each row of ``contexts`` (b x c token ids), the k tokens after the earliest earlier occurrence
    of its longest matching n-gram, n in [lookup]; -1 where nothing matched (or past the context)."""
    c = contexts.shape[1]
    rows, pos, length = match_lengths(contexts, lookup[1])
    keep = length >= lookup[0]
    key = np.minimum(length[keep], lookup[1]) * c + (c - 1 - pos[keep])  # longest n, then earliest
    rows, best = _best_per_row(rows[keep], key)
    return _after(contexts, rows, c - (best % c), k, None)


def suffix_propose(contexts: np.ndarray, k: int, max_depth: int = SUFFIX_DEPTH) -> np.ndarray:
    """For each row, the tokens after the earlier position whose preceding tokens match the context's
    suffix longest (up to ``max_depth``; the latest of equals); at most min(k, match length) of them (vLLM's
    suffix_decoding_max_spec_factor 1)."""
    c = contexts.shape[1]
    rows, pos, length = match_lengths(contexts, max_depth)
    rows, best = _best_per_row(rows, length * c + pos)  # longest, then latest
    return _after(contexts, rows, best % c + 1, k, best // c)


def _after(contexts: np.ndarray, rows: np.ndarray, start: np.ndarray, k: int, limit: np.ndarray | None) -> np.ndarray:
    """A (b x k) array: for each of ``rows``, up to k tokens of its context from ``start`` (at most
    ``limit``); -1 elsewhere."""
    b, c = contexts.shape
    out = np.full((b, k), -1, dtype=contexts.dtype)
    take = start[:, None] + np.arange(k)[None, :]
    ok = take < c
    if limit is not None:
        ok &= np.arange(k)[None, :] < limit[:, None]
    out[rows] = np.where(ok, contexts[rows[:, None], np.minimum(take, c - 1)], -1)
    return out


def sample_contexts(batch: int, context: int, seed: int = 0) -> np.ndarray:
    """``batch`` contexts of ``context`` token ids with text-like (Zipf) frequencies."""
    rng = np.random.default_rng(seed)
    return (np.minimum(rng.zipf(ZIPF, size=(batch, max(context, 2))), VOCAB) - 1).astype(np.int32)


def proposer(method: str):
    if method == "ngram":
        return ngram_propose
    if method == "suffix":
        return suffix_propose
    raise ValueError(f"'{method}' is not a host proposer ({', '.join(HOST_METHODS)})")


def time_proposer(method: str, batch: int, k: int, context: int, *, repeats: int = 5, budget_s: float = 0.5,
                  seed: int = 0) -> float:
    """Median seconds one step's proposals take for ``batch`` requests of ``context`` tokens, k each."""
    contexts = sample_contexts(batch, context, seed)
    propose = proposer(method)
    propose(contexts, k)  # warm-up
    samples, spent = [], 0.0
    while len(samples) < repeats and (spent < budget_s or len(samples) < 2):
        start = time.perf_counter()
        propose(contexts, k)
        elapsed = time.perf_counter() - start
        samples.append(elapsed)
        spent += elapsed
    return float(np.median(samples))


def host_info() -> dict:
    """The CPU the host times were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "numpy": np.__version__, "timing": "perf_counter, median"}
