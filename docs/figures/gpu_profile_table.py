"""The composed-profile figures of docs/gpu-profiles.md and the README.

    python docs/generate.py      # rewrites every generated block, this table's among them
    python docs/figures/gpu_profile_table.py   # prints the table

Reads only the shipped profiles (no kernel data needed): for each composed profile, batch-1
decode against the bandwidth bound (one GPU's weight bytes, the experts a token is routed to
for a mixture of experts, over HBM bandwidth), what verifying q tokens costs relative to one
at batch 1 and 64, and prefill throughput per GPU against its peak FLOPs (bf16, or fp8 for an
fp8 profile). A replica of several GPUs runs each pass on all of them at once.
"""

from __future__ import annotations


from calibrate.configs import active_param_count, get_config
from sim.costmodel.profile import load_profile, shipped_profiles



def param_count_of(cfg) -> int:
    from calibrate.configs import param_count

    return param_count(cfg)


def _decode(profile, b, q, context):
    rows = profile.phase("decode", "target")
    row = rows[(rows.batch_size == b) & (rows.query_tokens == q) & (rows.context_tokens == context)]
    return float(row.latency_median_s.iloc[0]) if len(row) else float("nan")


def figures() -> str:
    lines = ["| profile | GPUs | KV capacity (tokens) | b=1 decode (ms) | weights read / HBM bw (ms) | ratio "
             "| verify q=2/4/8 vs q=1, b=1 | same, b=64 | prefill b=1 p=4096 (ms) | prefill FLOP/s per GPU vs peak |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in shipped_profiles():
        profile = load_profile(name)
        meta = profile.meta
        if meta.get("source") != "composed":
            continue
        spec = meta["device"]["spec"]
        context = int(profile.phase("decode", "target").context_tokens.min())
        one = _decode(profile, 1, 1, context)
        target = meta["models"]["target"]
        cfg = get_config(target["name"])
        gpus = profile.gpus_per_replica
        unread = 0  # a mixture of experts reads the experts its token is routed to only
        if cfg.is_moe:
            expert_bytes = 2 if meta["dtype"] != "fp8" else 1
            unread = (param_count_of(cfg) - active_param_count(cfg)) * expert_bytes // gpus
        bound = (target["weight_bytes"] - unread) / spec["mem_bw"]
        ratios = {b: "/".join(f"{_decode(profile, b, q, context) / _decode(profile, b, 1, context):.2f}"
                              for q in (2, 4, 8)) for b in (1, 64)}
        prefill = profile.phase("prefill", "target")
        longest = prefill[prefill.batch_size == 1].sort_values("query_tokens").iloc[-1]
        p = int(longest.query_tokens)
        # 2 FLOPs per active parameter per token, plus causal attention (QK^T and PV: 2 x 2 x p^2/2 x the
        # query heads' width per layer), shared by the GPUs
        heads_width = cfg.num_heads * cfg.head_dim
        flops = (2 * active_param_count(cfg) * p + 2 * cfg.num_layers * p * p * heads_width) / gpus
        achieved = flops / float(longest.latency_median_s)
        peak = spec["fp8_flops"] if meta["dtype"] == "fp8" else spec["bf16_flops"]
        lines.append(f"| {name} | {gpus} | {profile.kv_capacity_tokens:,} | {one * 1e3:.2f} | {bound * 1e3:.2f} | "
                     f"{one / bound:.2f} | {ratios[1]} | {ratios[64]} | "
                     f"{float(longest.latency_median_s) * 1e3:.1f} (p={p}) | "
                     f"{achieved / 1e12:.0f} / {peak / 1e12:.0f} TFLOP/s ({achieved / peak:.0%}) |")
    return "\n".join(lines)


def main() -> None:
    print(figures())


if __name__ == "__main__":
    main()
