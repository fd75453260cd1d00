"""The composed-profile figures of docs/gpu-profiles.md and the README.

    python docs/generate.py      # rewrites every generated block, this table's among them
    python docs/figures/gpu_profile_table.py   # prints the table

Reads only the shipped profiles (no kernel data needed): for each composed profile, batch-1
decode against the bandwidth bound (weight bytes / HBM bandwidth), what verifying q tokens
costs relative to one at batch 1 and 64, and prefill throughput against peak bf16 FLOPs.
"""

from __future__ import annotations


from calibrate.configs import get_config
from sim.profile import load_profile, shipped_profiles



def _decode(profile, b, q, context):
    rows = profile.phase("decode", "target")
    row = rows[(rows.batch_size == b) & (rows.query_tokens == q) & (rows.context_tokens == context)]
    return float(row.latency_median_s.iloc[0]) if len(row) else float("nan")


def figures() -> str:
    lines = ["| profile | KV capacity (tokens) | b=1 decode (ms) | weights / HBM bw (ms) | ratio "
             "| verify q=2/4/8 vs q=1, b=1 | same, b=64 | prefill b=1 p=4096 (ms) | prefill FLOP/s vs peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in shipped_profiles():
        profile = load_profile(name)
        meta = profile.meta
        if meta.get("source") != "composed":
            continue
        spec = meta["device"]["spec"]
        context = int(profile.phase("decode", "target").context_tokens.min())
        one = _decode(profile, 1, 1, context)
        bound = meta["models"]["target"]["weight_bytes"] / spec["mem_bw"]
        ratios = {b: "/".join(f"{_decode(profile, b, q, context) / _decode(profile, b, 1, context):.2f}"
                              for q in (2, 4, 8)) for b in (1, 64)}
        prefill = profile.phase("prefill", "target")
        longest = prefill[prefill.batch_size == 1].sort_values("query_tokens").iloc[-1]
        params = meta["models"]["target"]["params"]
        cfg = get_config(meta["models"]["target"]["name"])
        p = int(longest.query_tokens)
        # 2 FLOPs per parameter per token, plus causal attention (QK^T and PV: 2 x 2 x p^2/2 x hidden per layer)
        flops = 2 * params * p + 2 * cfg.num_layers * p * p * cfg.hidden_size
        achieved = flops / float(longest.latency_median_s)
        lines.append(f"| {name} | {profile.kv_capacity_tokens:,} | {one * 1e3:.2f} | {bound * 1e3:.2f} | "
                     f"{one / bound:.2f} | {ratios[1]} | {ratios[64]} | "
                     f"{float(longest.latency_median_s) * 1e3:.1f} (p={p}) | "
                     f"{achieved / 1e12:.0f} / {spec['bf16_flops'] / 1e12:.0f} TFLOP/s ({achieved / spec['bf16_flops']:.0%}) |")
    return "\n".join(lines)


def main() -> None:
    print(figures())


if __name__ == "__main__":
    main()
