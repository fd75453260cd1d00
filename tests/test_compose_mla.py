"""Multi-head latent attention (DeepSeek-V3, Kimi K2) composed from the kernel data's MLA module tables
(issue 40, item 1): the shape read from the config, the KV cache of one latent per token, the module's
prices as the tables hold them, and one-line refusals for what the tables did not measure."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from calibrate.configs import check_buildable, get_config, kv_bytes_per_token, param_count
from specbatch.commands.cli import main as cli_main
from sim.compose import ModelShape
from sim.errors import InputError

needs_data = pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                                reason="aiconfigurator-core not installed (pip install -e \".[gpu-data]\")")
GRID = ["--batch-sizes", "1,16,64", "--k-max", "2", "--contexts", "512,4000", "--prompts", "64,1024"]
# DeepSeek-V2-Lite's published config.json (the keys a shape reads): latent attention at other dimensions
V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "intermediate_size": 10944,
           "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "max_position_embeddings": 163840, "moe_intermediate_size": 1408,
           "moe_layer_freq": 1, "first_k_dense_replace": 1, "n_routed_experts": 64, "n_shared_experts": 2,
           "num_experts_per_tok": 6, "num_attention_heads": 16, "num_key_value_heads": 16,
           "num_hidden_layers": 27, "vocab_size": 102400, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


@needs_data
def test_deepseek_v3_reads_its_latent_attention_experts_and_dense_layers():
    config = get_config("deepseek-ai/DeepSeek-V3")
    assert (config.q_lora_rank, config.kv_lora_rank, config.qk_nope_head_dim, config.qk_rope_head_dim,
            config.v_head_dim) == (1536, 512, 128, 64, 128)
    assert (config.num_experts, config.experts_per_token, config.intermediate_size) == (256, 8, 2048)
    assert (config.shared_expert_intermediate_size, config.dense_layers, config.dense_intermediate_size) == (2048, 3, 18432)
    # one 576-wide latent per token and layer, not keys and values per head: 57x less than 128 heads of 192
    assert kv_bytes_per_token(config, "bfloat16") == 61 * 576 * 2
    shape = ModelShape.of(config, param_count(config))
    assert shape.sharded(8).kv_bytes_per_token(2) == shape.kv_bytes_per_token(2)  # the latent is on every GPU
    names = [name for name, _, _ in shape.sharded(8).attention_gemms()]
    assert names == ["qkv_a", "q_b", "kv_b", "o"]
    assert ("q_b", 16 * 192, 1536) in shape.sharded(8).attention_gemms()  # column-parallel up projection
    assert ("qkv_a", 1536 + 576, 7168) in shape.sharded(8).attention_gemms()  # replicated down projection


@needs_data
def test_calibrate_refuses_latent_attention_in_one_line():
    with pytest.raises(InputError, match="multi-head latent attention, which calibrate does not build"):
        check_buildable(get_config("deepseek-ai/DeepSeek-V3"))


@needs_data
def test_deepseek_v3_composes_on_eight_h200s_and_runs(tmp_path, capsys):
    from sim.costmodel.profile import load_profile

    out = tmp_path / "dsv3"
    code = cli_main(["compose", "--gpu", "h200_sxm", "--target", "deepseek-ai/DeepSeek-V3", "--tp", "8",
                     "--dtype", "fp8-block", *GRID, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    profile = load_profile(out)
    assert set(profile.points.status) == {"ok"} and profile.kv_capacity_tokens > 0
    target = profile.meta["models"]["target"]
    assert target["kv_bytes_per_token"] == 61 * 576 * 2 and target["tensor_parallel_size"] == 8
    said = " | ".join(profile.meta["composition"]["assumptions"])
    assert "multi-head latent attention priced as one measured block" in said and "at the GPU's 16 heads" in said
    # a pass of 3 query tokens per sequence costs more than one token's and less than three passes
    points = profile.points.set_index(["phase", "batch_size", "query_tokens", "context_tokens"]).latency_median_s
    one, three = points[("decode", 16, 1, 4000)], points[("decode", 16, 3, 4000)]
    assert one < three < 3 * one
    capsys.readouterr()
    assert cli_main(["run", "--profile", str(out), "--policy", "none", "--rate", "2", "--num-requests", "40",
                     "--records", "none", "--out", str(tmp_path / "run")]) == 0
    assert "Mean TPOT" in capsys.readouterr().out


@needs_data
def test_the_module_tables_price_a_layer_and_pack_query_tokens_into_heads():
    from sim.compose import data
    from sim.compose.mla import CONTEXT_TABLE, GENERATION_TABLE, MlaModule

    root = data.systems_dir(None)
    args = (root, "h200_sxm", "vllm", "0.24.0")
    context, generation = data.read_table(*args, CONTEXT_TABLE), data.read_table(*args, GENERATION_TABLE)
    module = MlaModule.from_frames(context, generation, "fp8-block", "test")
    assert module.backend == "FLASH_ATTN_MLA"
    row = generation[(generation.kernel_source == "FLASH_ATTN_MLA") & (generation.kv_cache_dtype == "bfloat16")
                     & (generation.gemm_type == "fp8_block") & (generation.num_heads == 16)
                     & (generation.batch_size == 64) & (generation.step == 2048)]
    assert float(module.decode(64, 1, 2049, 16)) == pytest.approx(row.latency_s.mean(), rel=0.1)
    # 4 query tokens of 16 heads read the latents once: priced as one token of 64 heads
    assert float(module.decode(64, 4, 2048, 16)) == pytest.approx(float(module.decode(64, 1, 2051, 64)))
    # more work never costs less: longer prompts, more prompts, longer contexts
    assert np.all(np.diff(module.prefill(4, np.array([64.0, 512, 1024, 4096, 16384]), 16)) > 0)
    assert np.all(np.diff(module.decode(np.array([1.0, 8, 64, 512]), 1, 4096, 16)) > 0)
    # past the table's edge in sequences x length: launches of fewer sequences, not a missing price
    assert np.isfinite(module.decode(1024, 1, 131072, 16))
    with pytest.raises(InputError, match="bf16 or fp8-block projections"):
        MlaModule.from_frames(context, generation, "fp8", "test")


@needs_data
def test_latent_attention_at_other_dimensions_is_refused_naming_the_key(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(V2_LITE, indent=2))
    config = get_config(str(path))
    assert (config.q_lora_rank, config.num_experts, config.shared_expert_intermediate_size) == (0, 64, 2816)
    code = cli_main(["compose", "--gpu", "h100_sxm", "--target", str(path), *GRID, "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "hidden_size" in err and "DeepSeek-V3's latent attention" in err
    assert not (tmp_path / "p").exists()
