"""A hand-made kernel data folder for composition tests: a tiny GPU whose every latency is a power law.

Log-log interpolation reproduces a power law exactly between grid points, so a composed pass
can be checked term by term against these functions (tests/test_compose.py for one GPU,
tests/test_compose_parallel.py for replicas of several GPUs and mixtures of experts). Needs
pyarrow (Parquet) and pyyaml (the spec sheet).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

BW, BW_FACTOR, MEM_LATENCY = 1e12, 0.5, 2e-6
MEMORY, RESERVED = 10_000_000_000, 1_000_000_000


def gemm_ms(m, n, k):
    return 1e-6 * m ** 0.5 * n * k ** 0.25


def gen_ms(batch, step, heads):
    return 1e-3 * batch ** 0.8 * step ** 0.5 * heads ** 0.3


def ctx_ms(batch, isl, heads):
    return 1e-4 * batch * isl ** 1.5 * heads ** 0.7


def attention_rows(fn, length: str, head_dim: int = 16, kv_heads=(2,), heads_measured=(2, 16)) -> pd.DataFrame:
    """Generation (``length="step"``) or context (``"isl"``) attention rows over a small grid."""
    rows = []
    for kv in kv_heads:
        for batch in (1, 16):
            for size in ((1, 4095) if length == "step" else (16, 4096)):
                for heads in heads_measured:
                    rows.append(dict(framework="VLLM", version="0.24.0", device="Tiny GPU", op_name="attention",
                                     kernel_source="vllm_flash_attn_fa3", batch_size=batch,
                                     isl=1 if length == "step" else size, num_heads=heads, num_key_value_heads=kv,
                                     head_dim=head_dim, beam_width=1, attn_dtype="bfloat16",
                                     kv_cache_dtype="bfloat16", step=size if length == "step" else 0, window_size=0,
                                     latency=fn(batch, size, heads)))
    return pd.DataFrame(rows)


def write_tiny_gpu(root: Path, *, kv_heads=(2,), heads_measured=(2, 16), gemm_dtypes=("bfloat16",),
                   fp8_speedup: float = 0.5) -> Path:
    """``root``/tiny.yaml and ``root``/data/tiny/{gemm,attention}/vllm/0.24.0/*.parquet; returns the
    data folder of the tiny GPU (``root``/data/tiny) for further tables."""
    (root / "tiny.yaml").write_text(
        f"gpu:\n  mem_bw: {BW}\n  mem_bw_empirical_scaling_factor: {BW_FACTOR}\n"
        f"  mem_empirical_constant_latency: {MEM_LATENCY}\n  mem_capacity: {MEMORY}\n"
        f"  bfloat16_tc_flops: 100000000000000\nmisc:\n  other_mem: {RESERVED}\n")
    data = root / "data" / "tiny"
    gemm_dir, attn_dir = data / "gemm" / "vllm" / "0.24.0", data / "attention" / "vllm" / "0.24.0"
    gemm_dir.mkdir(parents=True)
    attn_dir.mkdir(parents=True)
    grid = [(m, n, k) for m in (1, 64, 65536) for n in (16, 1024) for k in (16, 1024)]
    pd.DataFrame([dict(framework="VLLM", version="0.24.0", device="Tiny GPU", op_name="gemm",
                       kernel_source="torch.nn.functional.linear", gemm_dtype=dtype, m=m, n=n, k=k,
                       latency=gemm_ms(m, n, k) * (fp8_speedup if dtype == "fp8" else 1.0))
                  for m, n, k in grid for dtype in gemm_dtypes]).to_parquet(gemm_dir / "gemm_perf.parquet")
    attention_rows(gen_ms, "step", kv_heads=kv_heads, heads_measured=heads_measured).to_parquet(
        attn_dir / "generation_attention_perf.parquet")
    attention_rows(ctx_ms, "isl", kv_heads=kv_heads, heads_measured=heads_measured).to_parquet(
        attn_dir / "context_attention_perf.parquet")
    return data
