"""Two independent checks of the composition, from published measurements (no real run involved).

    python benchmarks/composed_vs_published.py

1. **The step.** SpecDecode-Bench (arXiv 2601.11580) fits vLLM's measured step times for
   Llama-3.1-8B on H100 (vLLM 0.10-0.11) as 5.89 ms + 21.0 us per batched token + 39.3 ns
   per token of KV cache read, plus 1.21 ms of engine overhead per step. The composed
   ``h100-llama-3.1-8b-llama-3.2-1b`` target decode pass (one token per sequence) is printed
   beside that fit's GPU part over batch and context.
2. **Multi-head attention.** vLLM's FlashAttention-3 generation table measures 1-8 KV heads;
   Llama-2-7b has 32 (multi-head). The composition prices b sequences x 32 KV heads as 4b
   sequences x 8 KV heads: the same KV bytes, read in the same number of (sequence, KV head)
   work units, one query row each. SGLang's FlashAttention-3 table and TensorRT-LLM's table
   for the same GPU measure 32 KV heads directly; within each, the mapped price is set
   beside the direct one (mapped / direct), so the equivalence is checked on a kernel that
   really ran multi-head attention.

Needs NVIDIA's kernel data (the gpu-data extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
FIT_STEP_S, FIT_PER_TOKEN_S, FIT_PER_KV_TOKEN_S = 5.89e-3, 21.0e-6, 39.3e-9
BATCHES = (1, 4, 16, 64, 128)
CONTEXTS = (256, 1024, 4096)
DIRECT = (("sglang", "0.5.14", "fa3"), ("trtllm", "1.3.0rc20", "torch_flow"))


def step_check() -> list[str]:
    from specbatch.commands.compose import pricers_for
    from sim.costmodel.profile import load_profile

    target = pricers_for(load_profile("h100-llama-3.1-8b-llama-3.2-1b"))["target"]
    lines = ["1. composed target decode (h100-llama-3.1-8b-llama-3.2-1b, one token per sequence) against the "
             "published fit's GPU step, 5.89 ms + 21.0 us x tokens + 39.3 ns x KV tokens (ms):",
             f"{'batch':>6}" + "".join(f"{f'context {c}':>24}" for c in CONTEXTS),
             f"{'':>6}" + f"{'composed':>10}{'fit':>7}{'ratio':>7}" * len(CONTEXTS)]
    ratios = []
    for b in BATCHES:
        cells = []
        for c in CONTEXTS:
            composed = float(target.decode(b, 1, c, 1))
            fit = FIT_STEP_S + FIT_PER_TOKEN_S * b + FIT_PER_KV_TOKEN_S * b * c
            ratios.append(composed / fit)
            cells.append(f"{composed * 1e3:>10.2f}{fit * 1e3:>7.2f}{composed / fit:>7.2f}")
        lines.append(f"{b:>6}" + "".join(cells))
    lines.append(f"ratio composed / fit: median {np.median(ratios):.3f}, range {min(ratios):.2f}-{max(ratios):.2f} "
                 f"over {len(ratios)} points")
    return lines


def mha_ratios() -> dict[str, pd.DataFrame]:
    """Per table that measures 32 KV heads: b, step, direct, mapped and their ratio mapped / direct."""
    from sim.compose.data import read_table, systems_dir

    root = systems_dir(None)
    out = {}
    for framework, version, kernel in DIRECT:
        frame = read_table(root, "h100_sxm", framework, version, ("attention", "generation_attention_perf.parquet"))
        frame = frame[(frame.kernel_source == kernel) & (frame.head_dim == 128) & (frame.kv_cache_dtype == "bfloat16")
                      & (frame.window_size == 0)]

        def latency(kv_heads: int) -> pd.Series:
            rows = frame[(frame.num_key_value_heads == kv_heads) & (frame.num_heads == kv_heads)]
            return rows.groupby(["batch_size", "step"]).latency_s.median()

        direct, mapped = latency(32), latency(8)
        pairs = [(b, step, t, mapped[(4 * b, step)]) for (b, step), t in direct.items() if (4 * b, step) in mapped.index]
        table = pd.DataFrame(pairs, columns=["b", "step", "direct", "mapped"])
        table["ratio"] = table.mapped / table.direct
        out[f"{framework} {version} ({kernel})"] = table
    return out


def mha_check() -> list[str]:
    lines = ["", "2. multi-head attention (32 KV heads, head size 128, H100): mapped (4b sequences x 8 KV heads) "
             "over direct (b x 32), per layer, within each table:"]
    for name, table in mha_ratios().items():
        ratio = table.ratio.to_numpy()
        lines.append(f"  {name}: {len(table)} points, mapped / direct median {np.median(ratio):.3f}, "
                     f"p10-p90 {np.percentile(ratio, 10):.2f}-{np.percentile(ratio, 90):.2f}, "
                     f"range {ratio.min():.2f}-{ratio.max():.2f}")
        for step in (511, 2047):
            row = table[table.step == step].set_index("b").ratio
            lines.append(f"    KV length {step + 1}: " + ", ".join(f"b={b} {r:.2f}" for b, r in row.items() if b <= 128))
    return lines


def main() -> int:
    sys.path.insert(0, str(ROOT))
    print("\n".join(step_check() + mha_check()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
