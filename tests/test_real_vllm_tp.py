"""Fidelity of replicas of several GPUs against real vLLM cannot silently regress (issue 28).

Two windows of the BLIS project's real vLLM 0.15.1 runs on H100 SXM (../shared/validation/
vllm-h100; general traffic, requests 570-690 s into the run: the last 30 s of the 8 req/s
stage, the first 90 s of the 20 req/s one): Llama-2-70b on four GPUs and Mixtral-8x7B (a
mixture of experts) on two. Each is simulated with the run's own engine settings on the
shipped target-only composed profile of its model, GPU and tensor-parallel size, as
benchmarks/real_vllm.py does for the whole runs (docs/validation.md). The bounds are what the
model reaches today with a margin. Since each all-reduce is priced at least at a synchronising NCCL
all-reduce (issue 40), the 70B window's mean ITL at 20 req/s is within 2% (it was 11% low), and its
first 30 s (few requests: the p99 is two or three of them) are simulated slower than they ran.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specbatch.commands.compare import compare_measured
from tests.conftest import load_script

WINDOWS = Path(__file__).parent / "baselines" / "scenarios"
SETTINGS = {"policy.name": "none", "engine.scheduler": "vllm-v1", "engine.max_batch_size": 128,
            "engine.max_num_batched_tokens": 2048, "engine.block_size": 16, "engine.chunked_prefill": True,
            "engine.enable_prefix_caching": True}
CASES = {  # window file, profile, vLLM's logged KV blocks (runs.json), |relative error| bounds per stage
    "llama-2-70b-tp4": ("vllm-h100-llama-2-70b-tp4-general.csv", "h100-tp4-llama-2-70b", 31356,
                        {("e2e", "mean"): 0.16, ("itl", "mean"): 0.16, ("e2e", "p99"): 0.36, ("ttft", "mean"): 0.45}),
    "mixtral-8x7b-tp2": ("vllm-h100-mixtral-8x7b-tp2-general.csv", "h100-tp2-mixtral-8x7b", 27510,
                         {("e2e", "mean"): 0.08, ("itl", "mean"): 0.08, ("e2e", "p99"): 0.12, ("ttft", "mean"): 0.40}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_minutes_of_a_real_multi_gpu_run_within_bounds(case):
    window, profile, blocks, bounds = CASES[case]
    overrides = {key: (value, "test") for key, value in
                 {**SETTINGS, "profile": profile, "engine.kv_cache_tokens": blocks * 16}.items()}
    comparison = compare_measured(WINDOWS / window, None, overrides)
    assert list(comparison.stages.stage) == [0, 1]
    assert not comparison.stages.real_saturated.any()
    assert not comparison.stages.sim_saturated.any(), "the simulation falls behind where the real engine kept up"
    for (metric, stat), bound in bounds.items():
        errors = comparison.error(metric, stat)
        assert errors.abs().max() <= bound, f"{case} {stat} {metric}: {errors.to_dict()} beyond +-{bound:.0%}"


def test_the_benchmark_finds_the_multi_gpu_profile_of_each_run():
    import json

    from sim.costmodel.profile import resolve_profile_path, shipped_profiles

    bench = load_script("benchmarks/real_vllm.py", "real_vllm_bench_tp")
    profiles = {n: json.loads((resolve_profile_path(n) / "profile.json").read_text()) for n in shipped_profiles()}
    shapes = {"llama-2-70b": (8192, 28672, 80, 64, 8), "mixtral-8x7b": (4096, 14336, 32, 32, 8),
              "codellama-34b": (8192, 22016, 48, 64, 8)}
    ids = {"llama-2-70b": "meta-llama/Llama-2-70b-hf", "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
           "codellama-34b": "codellama/CodeLlama-34b-Instruct-hf"}  # the runs' models: each profile prices their sampling
    for model, tp, profile in (("llama-2-70b", 4, "h100-tp4-llama-2-70b"), ("mixtral-8x7b", 2, "h100-tp2-mixtral-8x7b"),
                               ("codellama-34b", 2, "h100-tp2-codellama-34b")):
        hidden, ffn, layers, heads, kv = shapes[model]
        run = {"gpu": "H100-SXM-80GB", "tensor_parallel_size": tp, "model": ids[model], "engine": "vllm 0.15.1",
               "model_config": {"hidden_dim": hidden, "intermediate_dim": ffn, "num_layers": layers,
                                "num_heads": heads, "num_kv_heads": kv, "vocab_size": 32000}}
        assert bench.covering_profile(run, profiles) == profile
        assert bench.covering_profile({**run, "tensor_parallel_size": 8}, profiles) is None
        assert bench.covering_profile({**run, "model": "an/unrecorded-model"}, profiles) is None  # greedy: not theirs
