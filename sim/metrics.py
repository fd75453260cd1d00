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
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PERCENTILES = (90, 99)


def distribution_stats(prefix: str, values_s: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """mean/median/std/p90/p99 in milliseconds; integer ``weights`` repeat values exactly."""
    values = np.asarray(values_s, dtype=float) * 1000.0
    names = ["mean", "median", "std"] + [f"p{p}" for p in PERCENTILES]
    if values.size == 0 or (weights is not None and int(np.sum(weights)) == 0):
        return {f"{n}_{prefix}_ms": float("nan") for n in names}
    if weights is None:
        q = np.percentile(values, [50, *PERCENTILES])
        mean, std = float(values.mean()), float(values.std())
    else:
        weights = np.asarray(weights, dtype=np.int64)
        q = weighted_percentile(values, weights, [50, *PERCENTILES])
        mean = float(np.average(values, weights=weights))
        std = float(np.sqrt(np.average((values - mean) ** 2, weights=weights)))
    out = {f"mean_{prefix}_ms": mean, f"median_{prefix}_ms": float(q[0]), f"std_{prefix}_ms": std}
    out.update({f"p{p}_{prefix}_ms": float(v) for p, v in zip(PERCENTILES, q[1:])})
    return out


def weighted_percentile(values: np.ndarray, weights: np.ndarray, percents) -> np.ndarray:
    """Equals ``np.percentile(np.repeat(values, weights), percents)`` without building the repeat."""
    order = np.argsort(values, kind="stable")
    sorted_values, cum = values[order], np.cumsum(weights[order])
    total = int(cum[-1])
    out = []
    for p in percents:
        h = (total - 1) * p / 100.0
        lo, hi = int(np.floor(h)), int(np.ceil(h))
        v_lo = sorted_values[np.searchsorted(cum, lo, side="right")]
        v_hi = sorted_values[np.searchsorted(cum, hi, side="right")]
        out.append(v_lo + (h - lo) * (v_hi - v_lo))
    return np.asarray(out)


def summarize(arrival_s: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
              first_token_s: np.ndarray, finish_s: np.ndarray, itl_values: np.ndarray, itl_weights: np.ndarray,
              steps: dict[str, np.ndarray]) -> dict[str, float | int]:
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
    summary.update(distribution_stats("ttft", ttft))
    summary.update(distribution_stats("tpot", tpot))
    summary.update(distribution_stats("itl", itl_values, itl_weights))
    summary.update(distribution_stats("e2el", e2el))
    summary.update(speculation_stats(steps))
    return summary


def speculation_stats(steps: dict[str, np.ndarray]) -> dict[str, float | int]:
    decode = steps["phase"] != 0  # decode steps, and vllm-v1's mixed steps (which decode too)
    k, running = steps["k"][decode], steps["running"][decode]
    drafted = int(steps["drafted_tokens"].sum())
    accepted = int(steps["accepted_tokens"].sum())
    drafts = int(running[k > 0].sum())
    busy = float(np.sum(steps["end_s"] - steps["start_s"]))
    nan = float("nan")
    return {
        "num_steps": int(steps["phase"].shape[0]),
        "num_decode_steps": int(decode.sum()),
        "num_prefill_steps": int((~decode).sum()),
        "num_drafts": drafts,
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else nan,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else nan,
        "mean_k": float(k.mean()) if k.size else nan,
        "mean_batch_size": float(running.mean()) if running.size else nan,
        "busy_time_s": busy,
        "token_goodput": float(steps["emitted_tokens"].sum()) / busy if busy > 0 else nan,
    }


def scheduler_stats(records) -> dict[str, float | int]:
    """The vllm-v1 scheduler's own figures: preemptions, mixed steps, prefill chunks, peak KV blocks."""
    steps = records.steps
    mixed = steps["phase"] == 2
    return {
        "num_preemptions": int(records.preemptions.sum()),
        "num_preempted_requests": int(np.count_nonzero(records.preemptions)),
        "num_mixed_steps": int(mixed.sum()),
        "num_prefill_tokens": int(steps["prefill_tokens"].sum()),
        "peak_kv_blocks": int(steps["kv_blocks"].max()) if steps["kv_blocks"].size else 0,
    }


def by_label(table: pd.DataFrame) -> dict | None:
    """Per-label completed, mean/p99 E2EL, mean TTFT and mean acceptance length (requests.csv's label).

    Acceptance length here is per decode step, 1 + accepted / decode steps, which is vLLM's
    1 + accepted / drafts when every decode step speculates.
    """
    if "label" not in table:
        return None
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
                      request_ids: list[np.ndarray], records: list, duration_s: float) -> list[dict]:
    """Each replica's own summary (same names as the cluster's) over the requests it served.

    A replica's ``duration_s`` and throughputs run from t = 0 to its own last finish;
    ``busy_fraction`` is its busy engine time over the whole cluster's duration.
    """
    out = []
    for index, (ids, rec) in enumerate(zip(request_ids, records)):
        summary = summarize(arrival_s[ids], prompt_tokens[ids], output_tokens[ids], rec.first_token_s,
                            rec.finish_s, rec.itl_values, rec.itl_weights, rec.steps)
        busy = summary["busy_time_s"] / duration_s if duration_s > 0 else float("nan")
        out.append({"replica": index, "requests": int(ids.shape[0]), "busy_fraction": busy, **summary})
    return out
