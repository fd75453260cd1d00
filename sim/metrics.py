"""Serving metrics with the names and definitions of ``vllm bench serve``.

TTFT = first token - arrival; E2EL = finish - arrival; TPOT = (E2EL - TTFT) /
(output_tokens - 1) over requests with more than one output token; ITL = the gaps
between successive token chunks of a request (a speculative step delivers its
tokens as one chunk). Each has mean, median, std (population), p90 and p99 in ms.
Throughputs divide by the run's duration: from t = 0 (the first arrival) to the
last finish. Speculation metrics follow vLLM: acceptance rate = accepted /
drafted; mean acceptance length = 1 + accepted / drafts, a draft being one
sequence in one speculative step. Token goodput (SmartSpec) = generated tokens
per second of busy engine time.

For a cluster of replicas the same names describe the whole cluster: latencies over
all requests, throughputs over the cluster's duration, and speculation metrics over
every replica's steps (busy time summed over replicas, so token goodput stays per
second of one engine's busy time); :func:`replica_breakdown` gives each replica's.

Request goodput follows ``vllm bench serve --goodput``: a completed request is good when
each given SLO holds (TTFT, TPOT and E2EL <= their limits in ms; a one-token request's
TPOT counts as 0), and ``request_goodput`` = good requests / duration. vLLM's speculation
counters (``spec_decode_num_drafts`` ...) and its per-request ``speculative_decoding``
objects are built by :func:`spec_decode_section` and :func:`per_request_spec_decode`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PERCENTILES = (90, 99)
SLO_METRICS = ("ttft", "tpot", "e2el")  # vllm bench serve --goodput's keys, in ms
SPEC_DECODE_DETAIL = ("none", "summary", "detailed")  # vLLM's --per-request-spec-decode-metrics


def parse_goodput(raw) -> dict[str, float]:
    """SLOs in ms from vLLM's "ttft:500 tpot:50" (a flag's words, a string, or a TOML table)."""
    if isinstance(raw, dict):
        items = list(raw.items())
    else:
        words = raw.replace(",", " ").split() if isinstance(raw, str) else [w for x in raw for w in str(x).split()]
        items = []
        for word in words:
            name, sep, value = word.partition(":")
            if not sep:
                raise ValueError(f"'{word}' is not KEY:MS (e.g. ttft:500 tpot:50 e2el:3000)")
            items.append((name, value))
    if not items:
        raise ValueError("give at least one SLO: ttft:MS, tpot:MS or e2el:MS")
    slos: dict[str, float] = {}
    for name, value in items:
        if name not in SLO_METRICS:
            raise ValueError(f"'{name}' is not one of {', '.join(SLO_METRICS)}")
        try:
            ms = float(value) if not isinstance(value, bool) else float("nan")
        except (TypeError, ValueError):
            raise ValueError(f"'{value}' is not a number of milliseconds for {name}") from None
        if not (ms >= 0 and np.isfinite(ms)):
            raise ValueError(f"the {name} SLO must be a finite number of ms >= 0, got {value}")
        slos[name] = ms
    return {name: slos[name] for name in SLO_METRICS if name in slos}


def good_requests(ttft_s: np.ndarray, tpot_s: np.ndarray, e2el_s: np.ndarray, slos_ms: dict[str, float]) -> int:
    """Completed requests meeting every SLO; ``tpot_s`` is 0 for one-token requests, as vLLM counts them."""
    good = np.ones(ttft_s.shape[0], dtype=bool)
    for name, values in (("ttft", ttft_s), ("tpot", tpot_s), ("e2el", e2el_s)):
        if name in slos_ms:
            good &= values <= slos_ms[name] / 1000.0
    return int(good.sum())


def distribution_stats(prefix: str, values_s: np.ndarray, weights: np.ndarray | None = None,
                       percentiles=PERCENTILES) -> dict[str, float]:
    """mean/median/std and the ``percentiles`` (p90/p99 by default) in milliseconds; integer
    ``weights`` repeat values exactly. A percentile is named as vLLM names it: p99, p99.9."""
    names = ["mean", "median", "std"] + [f"p{percentile_word(p)}" for p in percentiles]
    if np.size(values_s) == 0 or (weights is not None and int(np.sum(weights)) == 0):
        return {f"{n}_{prefix}_ms": float("nan") for n in names}
    if weights is None:
        values = np.asarray(values_s, dtype=float) * 1000.0
        q = np.percentile(values, [50, *percentiles])
        mean, std = float(values.mean()), float(values.std())
    else:
        # Millions of gaps in a long run: one full-length temporary at a time beside the values.
        # Seconds and milliseconds sort alike, so the ranks are found on the seconds and only the
        # values at them are converted (the same doubles as converting all first).
        weights = np.asarray(weights)
        if weights.dtype.kind not in "iu":  # the engine's are int32 (sums over them are taken in int64)
            weights = weights.astype(np.int64)
        q = weighted_percentile(np.asarray(values_s, dtype=float), weights, [50, *percentiles], scale=1000.0)
        mean, std = weighted_mean_std(np.asarray(values_s, dtype=float) * 1000.0, weights)
    out = {f"mean_{prefix}_ms": mean, f"median_{prefix}_ms": float(q[0]), f"std_{prefix}_ms": std}
    out.update({f"{n}_{prefix}_ms": float(v) for n, v in zip(names[3:], q[1:])})
    return out


def weighted_mean_std(values: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """``np.average(values, weights)`` and the weighted standard deviation, the same doubles, with one
    full-length buffer beside ``values`` (np.average makes its product afresh each time: a third array)."""
    total = weights.sum(dtype=np.float64)  # np.average's own steps: sum(values * weights) / sum(weights)
    work = np.multiply(values, weights, dtype=np.float64)
    mean = float(work.sum() / total)
    np.subtract(values, mean, out=work)
    np.square(work, out=work)
    np.multiply(work, weights, out=work)
    return mean, float(np.sqrt(work.sum() / total))


def percentile_word(p: float) -> str:
    """99 -> '99', 99.9 -> '99.9', as vLLM names its percentiles."""
    return str(int(p)) if float(p).is_integer() else str(p)


def weighted_percentile(values: np.ndarray, weights: np.ndarray, percents, scale: float = 1.0) -> np.ndarray:
    """Equals ``np.percentile(np.repeat(values * scale, weights), percents)`` without building the repeat
    (or the scaled copy: ``scale`` > 0 keeps the order, and only the values at the ranks are scaled).

    The value at a rank r of the repeated values is the smallest value whose weight at or below it
    exceeds r, whatever order equal values take, so it is found without sorting every value: a long
    run's millions of gaps are bracketed around the ranks from a sorted sample, and only the few
    inside the bracket are sorted (:func:`_ranked`). The doubles are those of a full sort's."""
    total, ranks = int(weights.sum()), []
    for p in percents:
        h = (total - 1) * p / 100.0
        ranks.append((h, int(np.floor(h)), int(np.ceil(h))))
    at = _ranked(values, weights, total, sorted({r for _, lo, hi in ranks for r in (lo, hi)}))
    out = []
    for h, lo, hi in ranks:
        v_lo, v_hi = at[lo] * scale, at[hi] * scale
        out.append(v_lo + (h - lo) * (v_hi - v_lo))
    return np.asarray(out)


BRACKET_FROM = 1 << 16  # fewer values than this are sorted whole
SAMPLE = 1 << 14        # about this many values sampled to bracket the ranks
MARGIN = 256            # sampled values either side of a rank's estimate (about 4 standard errors at the median)


def _ranked(values: np.ndarray, weights: np.ndarray, total: int, ranks: list[int]) -> dict[int, float]:
    """The value at each rank of the values repeated by their weights. Each rank's bracket [a, b] is
    checked against the whole array (the weight below a is at most the rank, the weight up to b
    exceeds it); a bracket the sample misjudged, or NaN anywhere, falls back to sorting everything."""
    n = values.shape[0]
    if n >= BRACKET_FROM and total > 0 and not np.isnan(values.sum()):
        stride = n // SAMPLE
        order = np.argsort(values[::stride])
        sample, cum = values[::stride][order], np.cumsum(weights[::stride][order], dtype=np.float64)
        brackets: dict[tuple[float, float], list[int]] = {}  # a rank's floor and ceiling often share one
        for rank in ranks:
            at = int(np.searchsorted(cum, rank * cum[-1] / total, side="right"))
            a = sample[at - MARGIN] if at - MARGIN >= 0 else -np.inf
            b = sample[at + MARGIN] if at + MARGIN < sample.shape[0] else np.inf
            brackets.setdefault((a, b), []).append(rank)
        found: dict[int, float] = {}
        for (a, b), inside in brackets.items():
            values_at = _ranked_between(values, weights, inside, a, b)
            if values_at is None:
                break
            found.update(values_at)
        else:
            return found
    return _ranked_between(values, weights, ranks, -np.inf, np.inf)


def _ranked_between(values: np.ndarray, weights: np.ndarray, ranks: list[int], a: float, b: float):
    """The value at each of ``ranks``, sorting only the values in [a, b]; None when one is not there."""
    whole = a == -np.inf and b == np.inf
    if whole:
        below, sub_v, sub_w = 0, values, weights
    else:
        under = values < a
        below = int(np.sum(weights, where=under))
        inside = values <= b
        np.logical_and(inside, ~under, out=inside)
        sub_v, sub_w = values[inside], weights[inside]
    # Equal values may sort in any order: a rank falls on one of them, and they are one value.
    order = np.argsort(sub_v)
    cum = sub_w[order].astype(np.int64, copy=False)  # int32 weights: their running sum could pass 2**31
    np.cumsum(cum, out=cum)
    out = {}
    for r in ranks:
        if not whole and not (below <= r < below + (int(cum[-1]) if cum.size else 0)):
            return None
        out[r] = sub_v[order[np.searchsorted(cum, r - below, side="right")]]
    return out


def summarize(arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
              first_token_s: np.ndarray, finish_s: np.ndarray, itl_values: np.ndarray, itl_weights: np.ndarray,
              steps: "dict[str, np.ndarray] | StepTotals", slos_ms: dict[str, float] | None = None) -> dict[str, float | int]:
    done = ~np.isnan(finish_s)
    completed = int(done.sum())
    duration = float(finish_s[done].max()) if completed else 0.0
    ttft = first_token_s[done] - arrival_s[done]
    e2el = finish_s[done] - arrival_s[done]
    out_tok = output_tokens[done]
    multi = out_tok > 1
    tpot = (e2el[multi] - ttft[multi]) / (out_tok[multi] - 1)
    total_out, total_in = int(out_tok.sum()), int(prompt_tokens[done].sum())
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: float("nan"))
    summary: dict[str, float | int] = {
        "completed": completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "duration_s": duration,
        "request_throughput": rate(completed),
        "output_throughput": rate(total_out),
        "total_token_throughput": rate(total_in + total_out),
    }
    if slos_ms:
        all_tpot = np.where(out_tok > 1, (e2el - ttft) / np.maximum(out_tok - 1, 1), 0.0)
        good = good_requests(ttft, all_tpot, e2el, slos_ms)
        summary.update({"good_completed": good, "request_goodput": rate(good)})
    summary.update(distribution_stats("ttft", ttft))
    summary.update(distribution_stats("tpot", tpot))
    summary.update(distribution_stats("itl", itl_values, itl_weights))
    summary.update(distribution_stats("e2el", e2el))
    summary.update(speculation_stats(steps))
    return summary


STEP_BLOCK = 1 << 16  # steps summed at a time (StepTotals): the same float sums whether a run's steps are whole


@dataclass
class StepTotals:
    """What the summary takes from the step records, summed over blocks of :data:`STEP_BLOCK` steps in order.

    A run whose steps stay in memory sums them here block by block (:func:`step_totals`); one whose steps
    go to its file as it runs, kept nowhere (``specbatch run``: sim/serving/records.py ``StepSink``), adds
    each block as it is handed over: the same blocks, so the same floats. Integer totals are exact; a
    mean of k or of the batch is its exact integer sum over the count, as numpy's mean of the column is.
    """

    steps: int = 0
    decode_steps: int = 0  # decode steps, and vllm-v1's mixed steps (which decode too)
    drafts: int = 0  # rows that proposed (a host matcher's misses and rows a budget cut to 0 did not)
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    decode_k: int = 0  # k summed over the decode steps
    decode_running: int = 0  # the batch (rows running) summed over the decode steps
    busy_s: float = 0.0
    mixed_steps: int = 0  # vllm-v1
    prefill_tokens: int = 0  # vllm-v1
    peak_kv_blocks: int = 0  # vllm-v1

    def add(self, steps: dict[str, np.ndarray]) -> None:
        """One block's steps (at most :data:`STEP_BLOCK`, starting at a multiple of it)."""
        phase = steps["phase"]
        decode = phase != 0
        self.steps += int(phase.shape[0])
        self.decode_steps += int(np.count_nonzero(decode))
        self.drafts += int(steps["drafts"].sum())
        self.drafted += int(steps["drafted_tokens"].sum())
        self.accepted += int(steps["accepted_tokens"].sum())
        self.emitted += int(steps["emitted_tokens"].sum())
        self.decode_k += int(steps["k"][decode].sum(dtype=np.int64))
        self.decode_running += int(steps["running"][decode].sum(dtype=np.int64))
        self.busy_s += float(np.sum(steps["end_s"] - steps["start_s"]))
        if "kv_blocks" in steps:
            self.mixed_steps += int(np.count_nonzero(phase == 2))
            self.prefill_tokens += int(steps["prefill_tokens"].sum(dtype=np.int64))
            if phase.shape[0]:
                self.peak_kv_blocks = max(self.peak_kv_blocks, int(steps["kv_blocks"].max()))


def step_totals(steps: "dict[str, np.ndarray] | StepTotals") -> StepTotals:
    """The totals of a run's step columns (or the totals themselves)."""
    if isinstance(steps, StepTotals):
        return steps
    totals = StepTotals()
    count = len(steps["phase"])
    for lo in range(0, max(count, 1), STEP_BLOCK):
        totals.add({name: values[lo:lo + STEP_BLOCK] for name, values in steps.items()})
    return totals


def speculation_stats(steps: "dict[str, np.ndarray] | StepTotals") -> dict[str, float | int]:
    t = step_totals(steps)
    nan = float("nan")
    return {
        "num_steps": t.steps,
        "num_decode_steps": t.decode_steps,
        "num_prefill_steps": t.steps - t.decode_steps,
        "num_drafts": t.drafts,
        "num_draft_tokens": t.drafted,
        "num_accepted_tokens": t.accepted,
        "acceptance_rate": t.accepted / t.drafted if t.drafted else nan,
        "mean_acceptance_length": 1 + t.accepted / t.drafts if t.drafts else nan,
        "mean_k": t.decode_k / t.decode_steps if t.decode_steps else nan,
        "mean_batch_size": t.decode_running / t.decode_steps if t.decode_steps else nan,
        "busy_time_s": t.busy_s,
        "token_goodput": t.emitted / t.busy_s if t.busy_s > 0 else nan,
    }


# What only a vllm-v1 run's summary has (scheduler_stats' keys); the prefix cache's with caching on.
SCHEDULER_STATS = ("num_preemptions", "num_preempted_requests", "num_mixed_steps", "num_prefill_tokens",
                   "peak_kv_blocks")
PREFIX_CACHE_STATS = ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate",
                      "resumed_prefix_cache_queries", "resumed_prefix_cache_hits")


def scheduler_stats(records, prefix_caching: bool = False, steps: StepTotals | None = None) -> dict[str, float | int]:
    """The vllm-v1 scheduler's own figures: preemptions, mixed steps, prefill chunks, peak KV blocks;
    and the prefix cache's, as vLLM counts them: prompt tokens looked up and found when requests
    are first scheduled (the hit rate is their ratio), and apart from those, the look-ups of
    preempted requests resumed. ``steps``: the step totals, where the records keep no steps."""
    t = step_totals(records.steps if steps is None else steps)
    out = dict(zip(SCHEDULER_STATS, (
        int(records.preemptions.sum()),
        int(np.count_nonzero(records.preemptions)),
        t.mixed_steps,
        t.prefill_tokens,
        t.peak_kv_blocks,
    )))
    if prefix_caching:
        counters = records.scheduler or {}
        queries, hits = counters.get("prefix_cache_queries", 0), counters.get("prefix_cache_hits", 0)
        out.update(zip(PREFIX_CACHE_STATS, (queries, hits, hits / queries if queries else 0.0,
                                            counters.get("resumed_prefix_cache_queries", 0),
                                            counters.get("resumed_prefix_cache_hits", 0))))
    return out


def by_label(table) -> dict | None:
    """Per-label completed, mean/p99 E2EL, mean TTFT and mean acceptance length (requests.csv's label).

    Acceptance length here is per decode step, 1 + accepted / decode steps, which is vLLM's
    1 + accepted / drafts when every decode step speculates.
    """
    if "label" not in table:
        return None
    import pandas as pd  # only a labelled trace needs the group-by

    table = pd.DataFrame(table, copy=False) if not isinstance(table, pd.DataFrame) else table
    out = {}
    for label, rows in table.groupby("label", sort=True):
        done = rows[rows.finish_s.notna()]
        steps = int(done.decode_steps.sum())
        e2el, ttft = done.e2el_s.to_numpy(), done.ttft_s.to_numpy()
        out[str(label)] = {
            "requests": int(len(rows)),
            "completed": int(len(done)),
            "mean_e2el_ms": float(e2el.mean() * 1e3) if e2el.size else float("nan"),
            "p99_e2el_ms": float(np.percentile(e2el, 99) * 1e3) if e2el.size else float("nan"),
            "mean_ttft_ms": float(ttft.mean() * 1e3) if ttft.size else float("nan"),
            "mean_acceptance_length": 1.0 + int(done.accepted_tokens.sum()) / steps if steps else float("nan"),
        }
    return out


def replica_breakdown(arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                      request_ids: list[np.ndarray], records: list, duration_s: float,
                      prefix_caching: bool = False) -> list[dict]:
    """Each replica's own summary (same names as the cluster's) over the requests it served, with its
    vllm-v1 scheduler's figures (preemptions, peak KV blocks, its own prefix cache's hits: what a
    prefix-aware router changes) where the run has them.

    A replica's ``duration_s`` and throughputs run from t = 0 to its own last finish;
    ``busy_fraction`` is its busy engine time over the whole cluster's duration.
    """
    out = []
    for index, (ids, rec) in enumerate(zip(request_ids, records)):
        summary = summarize(arrival_s[ids], prompt_tokens[ids], output_tokens[ids], rec.first_token_s,
                            rec.finish_s, rec.itl_values, rec.itl_weights, rec.steps)
        if rec.scheduler is not None:
            summary.update(scheduler_stats(rec, prefix_caching))
        busy = summary["busy_time_s"] / duration_s if duration_s > 0 else float("nan")
        out.append({"replica": index, "requests": int(ids.shape[0]), "busy_fraction": busy, **summary})
    return out


def spec_decode_section(summary: dict, accepted_per_pos: np.ndarray) -> dict:
    """vLLM's speculation counters (its Prometheus names, without ``vllm:``/``_total``) and the
    per-position acceptance rate = accepted at position j / drafts, as vLLM's logger prints it.
    Its mean acceptance length and acceptance rate are the summary's own."""
    drafts = int(summary["num_drafts"])
    per_pos = [int(x) for x in accepted_per_pos]
    nan = float("nan")
    return {
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": int(summary["num_draft_tokens"]),
        "spec_decode_num_accepted_tokens": int(summary["num_accepted_tokens"]),
        "spec_decode_num_accepted_tokens_per_pos": per_pos,
        "acceptance_rate_per_pos": [x / drafts if drafts else nan for x in per_pos],
    }


def per_request_spec_decode(steps, num_spec_tokens: int, detailed: bool) -> list[dict]:
    """Each request's ``metrics.speculative_decoding`` object, as vLLM's
    ``--per-request-spec-decode-metrics summary|detailed`` returns it (``steps``:
    :class:`sim.speculation.acceptance.PerRequestSteps`)."""
    offset = steps.offset
    n = offset.shape[0] - 1
    spec_steps = np.diff(offset)
    req = np.repeat(np.arange(n), spec_steps)
    accepted = np.bincount(req, weights=steps.accepted, minlength=n).astype(np.int64)
    drafted = np.bincount(req, weights=steps.drafted, minlength=n).astype(np.int64)
    width = num_spec_tokens + 1
    hist = np.bincount(req * width + np.minimum(steps.accepted, num_spec_tokens), minlength=n * width)
    hist = hist.reshape(n, width)
    out = []
    for r in range(n):
        s, d, a = int(spec_steps[r]), int(drafted[r]), int(accepted[r])
        item = {"request_id": r, "mean_acceptance_length": 1 + a / s if s else None,
                "draft_acceptance_rate": a / d if d else None, "acceptance_histogram": hist[r].tolist(),
                "num_spec_steps": s, "num_accepted_draft_tokens": a, "num_draft_tokens": d,
                "num_spec_tokens": num_spec_tokens}
        if detailed:
            lo, hi = offset[r], offset[r + 1]
            item["per_step_accepted"] = steps.accepted[lo:hi].tolist()
            item["per_step_drafted"] = steps.drafted[lo:hi].tolist()
        out.append(item)
    return out
