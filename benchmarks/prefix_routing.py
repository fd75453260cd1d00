"""Routers on shared-prefix traffic: prefix-cache hit rate, TTFT and throughput of 4 replicas.

    python benchmarks/prefix_routing.py                      # the table docs/cluster.md shows
    python benchmarks/prefix_routing.py --rates 40,80,160 --seeds 0,1,2

The shipped default scenario (H100, Llama-3.1-8B with Llama-3.2-1B drafting k = 3, vllm-v1
with prefix caching) on 4 replicas, each with a 40,000-token KV cache, serving inference-perf's
``shared_prefix`` traffic: 64 system prompts of 2,048 tokens, 8 questions each (lognormal
256-token questions, 128-token answers). The system prompts alone (131,072 tokens) fill more
than three replicas' caches, so where a request lands decides whether its system prompt is
found or computed again. One row per router and total rate, each a ``specbatch sweep`` cell
run in this process (results are deterministic: the same table for the same code); with
several seeds, the mean over them.
"""

from __future__ import annotations

import argparse

import specbatch

ROUTERS = ("round-robin", "least-requests", "prefix-aware")
SCENARIO = {"workload": {"num_requests": 3000, "shared_prefix": "64:8:2048", "prompt_tokens": "lognormal:256:0.8:1024",
                         "output_tokens": "lognormal:128:0.8:512"},
            "engine": {"kv_cache_tokens": 40000}, "cluster": {"replicas": 4}}
COLUMNS = (("prefix_cache_hit_rate", "prefix-cache hit rate", 100.0, "{:.1f}%"),
           ("mean_ttft_ms", "mean TTFT (ms)", 1.0, "{:,.0f}"), ("p99_ttft_ms", "p99 TTFT (ms)", 1.0, "{:,.0f}"),
           ("request_throughput", "req/s", 1.0, "{:.1f}"), ("output_throughput", "output tok/s", 1.0, "{:,.0f}"))


def table(rates: list[float], seeds: list[int]) -> str:
    cells = specbatch.sweep({"scenario": SCENARIO, "axes": {"rate": rates, "router": list(ROUTERS), "seed": seeds}},
                            executor="serial")
    means = cells.groupby(["workload.rate", "cluster.router"], sort=False)[[c for c, *_ in COLUMNS]].mean()
    lines = ["| rate (req/s) | router | " + " | ".join(title for _, title, *_ in COLUMNS) + " |",
             "|---:|---|" + "---:|" * len(COLUMNS)]
    for (rate, router), row in means.iterrows():
        values = [fmt.format(scale * row[c]) for c, _, scale, fmt in COLUMNS]
        lines.append(f"| {rate:g} | {router} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="40,80", help="total request rates, comma-separated (default 40,80)")
    parser.add_argument("--seeds", default="0", help="seeds, comma-separated; the table gives their mean")
    args = parser.parse_args()
    print(table([float(r) for r in args.rates.split(",")], [int(s) for s in args.seeds.split(",")]))


if __name__ == "__main__":
    main()
