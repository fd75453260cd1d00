"""Any model from its Hugging Face config.json (issue 40, item 1): finding the file, reading the shape,
composing each family on H100, and parameter counts against the published sizes.

No network: configs come from aiconfigurator-core's ``model_configs`` (tests that need it skip with
one line without it) or are written here, from the published config.json files, into tmp_path or a
folder laid out like the Hugging Face cache.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from calibrate.configs import NEWER_FIELDS, active_param_count, get_config, known_models, param_count
from specbatch.commands.cli import main as cli_main
from sim.compose import ModelShape
from sim.errors import InputError

HAVE_DATA = importlib.util.find_spec("aiconfigurator_core") is not None
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="aiconfigurator-core not installed (pip install -e \".[gpu-data]\")")

# Published config.json files (the keys a shape reads), for models aiconfigurator-core does not ship.
LLAMA_2_7B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
              "max_position_embeddings": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
              "num_key_value_heads": 32, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
              "torch_dtype": "float16", "vocab_size": 32000}
LLAMA_3_2_1B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
                "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 16,
                "num_key_value_heads": 8, "head_dim": 64, "rope_theta": 500000.0, "tie_word_embeddings": True,
                "torch_dtype": "bfloat16", "vocab_size": 128256}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
              "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
              "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000}
QWEN2_5_7B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
              "max_position_embeddings": 131072, "max_window_layers": 28, "num_attention_heads": 28,
              "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
              "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "use_sliding_window": False, "vocab_size": 152064}
QWEN3_14B = {"architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 5120, "intermediate_size": 17408,
             "max_position_embeddings": 40960, "max_window_layers": 40, "num_attention_heads": 40,
             "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
             "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
             "use_sliding_window": False, "vocab_size": 151936}
QWEN1_5_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "decoder_sparse_step": 1, "hidden_size": 2048,
               "intermediate_size": 5632, "max_position_embeddings": 8192, "moe_intermediate_size": 1408,
               "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
               "num_key_value_heads": 16, "shared_expert_intermediate_size": 5632, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936}
WRITTEN = {"meta-llama/Llama-2-7b-hf": LLAMA_2_7B, "meta-llama/Llama-3.2-1B": LLAMA_3_2_1B,
           "mistralai/Mistral-7B-v0.1": MISTRAL_7B, "Qwen/Qwen2.5-7B": QWEN2_5_7B, "Qwen/Qwen3-14B": QWEN3_14B,
           "Qwen/Qwen1.5-MoE-A2.7B": QWEN1_5_MOE}

# (model, published total parameters, published active parameters or None, relative tolerance)
PUBLISHED = [
    ("meta-llama/Llama-2-7b-hf", 6.74e9, None, 0.005),
    ("meta-llama/Llama-3.2-1B", 1.24e9, None, 0.005),
    ("meta-llama/Meta-Llama-3.1-8B", 8.03e9, None, 0.005),
    ("meta-llama/Meta-Llama-3.1-70B", 70.6e9, None, 0.005),
    ("mistralai/Mistral-7B-v0.1", 7.24e9, None, 0.005),
    ("Qwen/Qwen2.5-7B", 7.62e9, None, 0.005),
    ("Qwen/Qwen3-14B", 14.8e9, None, 0.005),
    ("Qwen/Qwen3-32B", 32.8e9, None, 0.005),
    ("Qwen/Qwen1.5-MoE-A2.7B", 14.3e9, 2.7e9, 0.01),
    ("Qwen/Qwen3-30B-A3B", 30.5e9, 3.3e9, 0.02),  # the model card rounds 3.35B active to 3.3B
    ("mistralai/Mixtral-8x7B-v0.1", 46.7e9, 12.9e9, 0.005),
    ("mistralai/Mixtral-8x22B-v0.1", 141e9, 39e9, 0.005),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", 141e9, 39e9, 0.005),  # a built-in: its 32,768-token vocabulary
    # the published 109B counts the vision encoder too, which serving text does not run (nor is priced)
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 109e9, 17e9, 0.015),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", 400e9, 17e9, 0.015),
    # DeepSeek's 671B and 37B leave out the multi-token-prediction layer (the checkpoint's 685B holds it)
    ("deepseek-ai/DeepSeek-V3", 671e9, 37e9, 0.015),
    ("moonshotai/Kimi-K2-Instruct", 1.0e12, 32e9, 0.03),  # "1 trillion total, 32 billion activated"
]


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face hub cache (HF_HUB_CACHE), so no user's cache is read."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def cache_model(cache: Path, model_id: str, config: dict, revision: str = "abc123") -> Path:
    """Write ``config`` where huggingface_hub would keep ``model_id``'s config.json."""
    repo = cache / ("models--" + model_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    (snapshot / "config.json").write_text(json.dumps(config, indent=2))
    return snapshot / "config.json"


def resolve(model: str, cache: Path):
    """A published model's config: written into the cache for WRITTEN ones, else aiconfigurator-core's."""
    if model in WRITTEN:
        cache_model(cache, model, WRITTEN[model])
    elif not HAVE_DATA:
        pytest.skip("aiconfigurator-core not installed: its shipped configs are not there")
    return get_config(model, "target")


# -- finding the file ---------------------------------------------------------------------

def test_a_path_a_folder_and_a_cached_id_read_the_same_shape(tmp_path, hf_cache):
    folder = tmp_path / "Qwen3-14B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_14B))
    by_path, by_folder = get_config(str(folder / "config.json")), get_config(str(folder))
    cache_model(hf_cache, "Qwen/Qwen3-14B", QWEN3_14B)
    by_id = get_config("Qwen/Qwen3-14B")
    assert by_path == by_folder
    assert by_path.name == "Qwen3-14B" and by_id.name == "Qwen/Qwen3-14B"
    assert "Hugging Face cache, snapshot abc123" in by_id.source
    shape = {k: v for k, v in by_id.to_dict().items() if k not in ("name", "source")}
    assert shape == {k: v for k, v in by_path.to_dict().items() if k not in ("name", "source")}
    assert (by_id.num_layers, by_id.hidden_size, by_id.num_heads, by_id.num_kv_heads, by_id.head_dim,
            by_id.intermediate_size, by_id.vocab_size, by_id.qk_norm, by_id.tie_word_embeddings, by_id.dtype) == \
        (40, 5120, 40, 8, 128, 17408, 151936, True, False, "bfloat16")
    # a file inside a cache folder is named as the cache names it
    assert get_config(str(hf_cache / "models--Qwen--Qwen3-14B" / "snapshots" / "abc123")).name == "Qwen/Qwen3-14B"


def test_hf_home_is_respected_when_hf_hub_cache_is_not_set(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cache_model(tmp_path / "hf" / "hub", "someone/Tiny-Mistral", {**MISTRAL_7B, "num_hidden_layers": 2})
    assert get_config("someone/Tiny-Mistral").num_layers == 2


def test_the_cache_wins_over_the_shipped_config_and_refs_main_picks_the_snapshot(hf_cache):
    cache_model(hf_cache, "mistralai/Mixtral-8x7B-v0.1", {**json.loads(json.dumps(LLAMA_2_7B)),
                                                           "num_hidden_layers": 3}, revision="bbb")
    older = hf_cache / "models--mistralai--Mixtral-8x7B-v0.1" / "snapshots" / "aaa"
    older.mkdir()
    (older / "config.json").write_text(json.dumps(LLAMA_2_7B))
    assert get_config("mistralai/Mixtral-8x7B-v0.1").num_layers == 3  # refs/main says bbb, not the first by name


def test_the_built_in_names_keep_their_shapes_and_their_sidecar_record():
    for name in known_models():
        record = get_config(name).to_dict()
        assert not set(record) & set(NEWER_FIELDS), name  # shipped profiles record these dicts byte for byte


@needs_data
def test_a_shipped_llama_config_reads_as_the_built_in_llama(hf_cache):
    built_in, read = get_config("llama-3.1-8b"), get_config("meta-llama/Meta-Llama-3.1-8B")
    differ = {k for k in built_in.to_dict() if built_in.to_dict()[k] != read.to_dict().get(k)}
    assert differ == {"name", "source", "notes"}
    assert read.dtype == "bfloat16" and "aiconfigurator-core model_configs/" in read.source


# -- bad input: one line naming the key, the file and its line --------------------------------

def write(tmp_path: Path, config: dict | str) -> Path:
    path = tmp_path / "config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config, indent=2))
    return path


def test_a_missing_key_is_named_with_the_file_and_line(tmp_path, hf_cache):
    path = write(tmp_path, {k: v for k, v in QWEN3_14B.items() if k != "num_hidden_layers"})
    with pytest.raises(InputError) as err:
        get_config(str(path), "target")
    assert err.value.field == "num_hidden_layers" and err.value.source == str(path)
    assert "missing" in err.value.message


def test_a_bad_value_names_its_line(tmp_path, hf_cache):
    path = write(tmp_path, {**QWEN3_14B, "hidden_size": "big"})
    with pytest.raises(InputError) as err:
        get_config(str(path))
    lines = path.read_text().splitlines()
    assert err.value.field == "hidden_size" and '"hidden_size"' in lines[err.value.line - 1]


def test_an_inconsistent_shape_names_the_config_key_and_its_line(tmp_path, hf_cache):
    path = write(tmp_path, {**QWEN3_14B, "num_key_value_heads": 7})  # 40 query heads do not group over 7
    with pytest.raises(InputError) as err:
        get_config(str(path))
    assert err.value.field == "num_attention_heads" and err.value.source == str(path)
    assert '"num_attention_heads"' in path.read_text().splitlines()[err.value.line - 1]


def test_an_unpriced_architecture_is_refused_naming_the_key(tmp_path, hf_cache):
    path = write(tmp_path, {**QWEN3_14B, "architectures": ["GptOssForCausalLM"]})
    with pytest.raises(InputError) as err:
        get_config(str(path), "target")
    assert err.value.field == "architectures" and err.value.line == 2
    assert "GptOssForCausalLM is not priced yet" in err.value.message and "Qwen3MoeForCausalLM" in err.value.message


@needs_data
def test_deepseek_v3_2s_sparse_attention_is_refused_in_one_line(hf_cache, tmp_path, capsys):
    code = cli_main(["compose", "--gpu", "h200_sxm", "--target", "deepseek-ai/DeepSeek-V3.2", "--tp", "8",
                     "--dtype", "fp8-block", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "DeepseekV32ForCausalLM" in err and "sparse attention" in err and "architectures" in err
    assert not (tmp_path / "p").exists()


def test_not_json_names_the_line(tmp_path, hf_cache):
    path = write(tmp_path, '{\n  "architectures": ["LlamaForCausalLM"],\n  "hidden_size": 4096,,\n}')
    with pytest.raises(InputError) as err:
        get_config(str(path))
    assert err.value.line == 3 and "not JSON" in err.value.message


def test_an_unknown_name_says_what_was_looked_for(hf_cache):
    with pytest.raises(InputError) as err:
        get_config("nobody/no-such-model", "draft")
    assert err.value.field == "draft" and str(hf_cache) in err.value.message and "llama-3.1-8b" in err.value.message


def test_calibrate_builds_a_dense_llama_config_and_refuses_what_it_cannot_build(tmp_path, hf_cache, capsys):
    from calibrate.cli import _settings, build_parser, main

    cache_model(hf_cache, "Qwen/Qwen2.5-7B", QWEN2_5_7B)
    code = main(["--target", "Qwen/Qwen2.5-7B", "--draft", "llama-68m", "--out", str(tmp_path / "p"),
                 "--device", "cpu"])
    assert code == 2 and "q/k/v biases" in capsys.readouterr().err and not (tmp_path / "p").exists()
    tiny = write(tmp_path, {**LLAMA_2_7B, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 32000})
    settings = _settings(build_parser().parse_args(["--target", str(tiny), "--draft", "llama-68m", "--out",
                                                    str(tmp_path / "q"), "--device", "cpu"]))
    assert settings.target == str(tiny) and get_config(settings.target).num_layers == 2


# -- the shape: parameter counts against the published sizes ---------------------------------

@pytest.mark.parametrize("model, total, active, rel", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_counts_match_the_published_sizes(model, total, active, rel, hf_cache):
    config = resolve(model, hf_cache)
    assert param_count(config) == pytest.approx(total, rel=rel)
    assert active_param_count(config) == pytest.approx(active or total, rel=rel)
    # the composition's GEMMs, experts and vocabulary account for all of it but the norms and biases
    shape = ModelShape.of(config, param_count(config))
    rest = shape.params - shape.gemm_params() - shape.vocab_params()
    assert 0 <= rest < 1e-3 * shape.params


def test_the_families_read_their_layers_as_vllm_builds_them(hf_cache):
    mistral = resolve("mistralai/Mistral-7B-v0.1", hf_cache)
    assert (mistral.sliding_window, mistral.window_layers) == (4096, 32)
    qwen2 = resolve("Qwen/Qwen2.5-7B", hf_cache)
    assert qwen2.attention_bias and not qwen2.sliding_window  # use_sliding_window is false
    moe = resolve("Qwen/Qwen1.5-MoE-A2.7B", hf_cache)
    assert (moe.num_experts, moe.experts_per_token, moe.intermediate_size, moe.shared_expert_intermediate_size,
            moe.dense_layers) == (60, 4, 1408, 5632, 0)
    shape = ModelShape.of(moe, param_count(moe)).sharded(2)
    assert ("shared_gate_up", 5632, 2048) in shape.layer_gemms()


@needs_data
def test_llama_4_reads_its_text_model_its_dense_layers_and_its_attention_chunks(hf_cache):
    scout = get_config("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    maverick = get_config("meta-llama/Llama-4-Maverick-17B-128E-Instruct")
    for model in (scout, maverick):  # every 4th layer attends globally (no rotary), the rest within 8192-token chunks
        assert (model.hidden_size, model.num_layers, model.sliding_window, model.window_layers) == (5120, 48, 8192, 36)
        assert model.shared_expert_intermediate_size == model.intermediate_size == 8192
    assert (scout.num_experts, scout.dense_layers, scout.qk_norm) == (16, 0, True)
    assert (maverick.num_experts, maverick.dense_layers, maverick.dense_intermediate_size) == (128, 24, 16384)
    groups = ModelShape.of(maverick, param_count(maverick)).layer_groups()
    assert [(g.num_layers, g.num_experts, g.intermediate_size) for g in groups] == [(24, 128, 8192), (24, 0, 16384)]


# -- composing each family on H100 -------------------------------------------------------------

GRID = ["--batch-sizes", "1,16", "--k-max", "2", "--contexts", "512,4000", "--prompts", "64,1024"]  # Llama 2 holds 4096
FAMILIES = [  # (model, GPUs, dtype): as each is served on H100s
    ("meta-llama/Llama-2-7b-hf", 1, "bf16"),
    ("meta-llama/Meta-Llama-3.1-8B", 1, "bf16"),
    ("mistralai/Mistral-7B-v0.1", 1, "bf16"),
    ("Qwen/Qwen2.5-7B", 1, "bf16"),
    ("Qwen/Qwen3-14B", 1, "bf16"),
    ("Qwen/Qwen3-32B", 2, "bf16"),
    ("Qwen/Qwen3-30B-A3B", 1, "bf16"),
    ("mistralai/Mixtral-8x7B-v0.1", 2, "bf16"),
    ("mistralai/Mixtral-8x22B-v0.1", 8, "bf16"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 4, "bf16"),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", 8, "fp8"),
]


@needs_data
@pytest.mark.parametrize("model, tp, dtype", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_each_family_composes_on_h100(model, tp, dtype, hf_cache, tmp_path, capsys):
    from sim.costmodel.profile import load_profile

    config = resolve(model, hf_cache)
    out = tmp_path / "profile"
    code = cli_main(["compose", "--gpu", "h100_sxm", "--target", model, "--tp", str(tp), "--dtype", dtype,
                     *GRID, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    profile = load_profile(out)
    assert set(profile.points.status) == {"ok"} and profile.kv_capacity_tokens > 0
    target = profile.meta["models"]["target"]
    assert target["name"] == model and target["params"] == param_count(config)
    assert target["config"] == config.to_dict() and target["tensor_parallel_size"] == tp
    assert profile.meta["command"].startswith(f"specbatch compose --gpu h100_sxm --target {model} ")
    said = " | ".join(profile.meta["composition"]["assumptions"])  # what is unlike other models is stated
    assert (f"{config.window_layers} of {config.num_layers} layers attend to at most" in said) == bool(config.window_layers)
    assert (f"in {config.moe_layers} of {config.num_layers} layers" in said) == bool(config.dense_layers)
    assert ("a shared expert" in said) == bool(config.shared_expert_intermediate_size)


@needs_data
def test_a_shipped_config_composes_the_built_in_models_profile_to_the_byte(tmp_path, capsys, hf_cache):
    rows = {}
    for name in ("llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B"):
        out = tmp_path / name.replace("/", "--")
        assert cli_main(["compose", "--gpu", "h100_sxm", "--target", name, *GRID, "--out", str(out)]) == 0
        rows[name] = (out / "profile.csv").read_text()
    capsys.readouterr()
    assert rows["llama-3.1-8b"] == rows["meta-llama/Meta-Llama-3.1-8B"]


# -- windowed layers on the hand-made tables ---------------------------------------------------

def test_a_windowed_layer_reads_the_window_and_prefills_by_its_flops(tiny_data):
    """tiny-llama's two layers, one of them windowed to 100 tokens: a decode over 1000 tokens reads 1000
    keys in one layer and 100 in the other; a 400-token prompt costs a full causal prefill in one and
    prefill(100) x (1 + 2 x 300 / 100) in the other."""
    from dataclasses import replace

    from sim.compose.build import Request, load_tables
    from sim.compose.price import PassPricer

    c = get_config("tiny-llama")
    plain = ModelShape.of(c, param_count(c))
    windowed = replace(plain, sliding_window=100, window_layers=1)
    tables = load_tables(Request("tiny", "vllm", "0.24.0", "bf16", plain, None, (), {}, {},
                                 kernel_data=str(tiny_data)))[0]
    full, win = PassPricer(plain, tables), PassPricer(windowed, tables)
    decode = float(win.decode_parts(4, 2, 1000)["attention"])
    assert decode == pytest.approx(float(full.decode_attention(4, 2, 1000) + full.decode_attention(4, 2, 100)),
                                   rel=1e-12)
    assert float(win.decode_parts(4, 2, 80)["attention"]) == float(full.decode_parts(4, 2, 80)["attention"])
    prefill = float(win.prefill_parts(2, 400)["attention"])
    assert prefill == pytest.approx(float(full.context_attention(2, 400) + 7 * full.context_attention(2, 100)),
                                    rel=1e-12)
    # the GEMMs, small ops and LM head do not depend on the window
    for part in ("gemm", "small_ops", "lm_head"):
        assert float(win.decode_parts(4, 2, 1000)[part]) == float(full.decode_parts(4, 2, 1000)[part])


# -- every command that takes a model ----------------------------------------------------------

@needs_data
def test_the_python_api_and_capacitys_tensor_parallel_variants_take_a_hugging_face_model(hf_cache, tmp_path):
    """specbatch.compose with a cached id as target and a shipped one as draft; capacity --tp composes the
    same models again at another split from the profile's own command, resolving the ids again."""
    import specbatch
    from specbatch.commands.capacity.parallel import variant
    from sim.costmodel.profile import load_profile

    cache_model(hf_cache, "Qwen/Qwen3-14B", QWEN3_14B)
    profile = specbatch.compose("h100_sxm", "Qwen/Qwen3-14B", tmp_path / "q14", draft="Qwen/Qwen3-0.6B",
                                batch_sizes=[1, 16], k_max=2, contexts=[512], prompts=[64])
    models = profile.meta["models"]
    assert (models["target"]["name"], models["draft"]["name"]) == ("Qwen/Qwen3-14B", "Qwen/Qwen3-0.6B")
    assert models["draft"]["params"] == pytest.approx(0.6e9, rel=0.01)  # Qwen3-0.6B's card: 0.6B, tied embeddings
    split = load_profile(variant(profile, 2))
    assert split.gpus_per_replica == 2 and split.meta["models"]["target"]["params"] == models["target"]["params"]


@needs_data
def test_list_models_names_the_shipped_configs_it_can_price(capsys):
    from calibrate.cli import main

    assert main(["--list-models"]) == 0
    listed = capsys.readouterr().out.splitlines()[-1]
    assert "meta-llama/Llama-4-Scout-17B-16E-Instruct" in listed and "mistralai/Mixtral-8x22B-v0.1" in listed
    assert "deepseek-ai/DeepSeek-V3," in listed  # latent attention is priced from the MLA module tables
    assert "deepseek-ai/DeepSeek-V3.2" not in listed and "openai/gpt-oss-20b" not in listed


def test_a_model_calibrated_from_its_config_json_is_replayed_from_the_profiles_record(tmp_path, hf_cache, capsys):
    """calibrate --target FOLDER times a Llama read from its config.json; the real replay rebuilds it from
    what the sidecar recorded, so it runs after the file is gone."""
    pytest.importorskip("torch")
    import shutil

    from calibrate.cli import main as calibrate_main
    from tests.test_replay import TINY_GRID

    folder = tmp_path / "my-tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "max_position_embeddings": 2048, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "vocab_size": 512}))
    out = tmp_path / "profile"
    assert calibrate_main(["--target", str(folder), "--draft", "tiny-llama", "--out", str(out), *TINY_GRID]) == 0
    meta = json.loads((out / "profile.json").read_text())
    assert meta["models"]["target"]["name"] == "my-tiny-llama" and meta["name"].endswith("-my-tiny-llama-tiny-llama")
    shutil.rmtree(folder)
    run = tmp_path / "real"
    assert cli_main(["replay", "--profile", str(out), "--num-requests", "3", "--rate", "50", "--prompt-tokens", "8",
                     "--output-tokens", "4", "--out", str(run)]) == 0, capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["metrics"]["completed"] == 3


def test_an_id_a_built_in_was_copied_from_resolves_to_it_offline(hf_cache):
    """Qwen/Qwen3-14B ships with neither aiconfigurator-core nor a fresh cache: its id is the built-in
    qwen3-14b, the same shape as its published config.json read from a cache."""
    built_in = get_config("qwen3-14b")
    assert get_config("Qwen/Qwen3-14B", "target") is built_in and get_config("qwen/qwen3-14b") is built_in
    assert param_count(built_in) == pytest.approx(14.8e9, rel=0.005)
    cache_model(hf_cache, "Qwen/Qwen3-14B", WRITTEN["Qwen/Qwen3-14B"])
    read = get_config("Qwen/Qwen3-14B")  # now the cached file wins, and reads as the built-in's shape
    from dataclasses import replace

    shape = ModelShape.of(read, param_count(read))
    assert read is not built_in and replace(shape, name="qwen3-14b") == ModelShape.of(built_in, param_count(built_in))


def test_a_published_fine_tune_of_the_same_shape_resolves_to_its_base_offline(hf_cache):
    from calibrate.variants import SAME_SHAPE

    assert set(SAME_SHAPE.values()) <= set(known_models())  # every base is a built-in
    llama = get_config("llama-3.1-8b")
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/llama-3.1-8b-instruct",
                 "META-LLAMA/META-LLAMA-3.1-8B-INSTRUCT"):
        assert get_config(name, "target") is llama
    assert get_config("mistralai/Mixtral-8x7B-Instruct-v0.1") is get_config("mixtral-8x7b")
    # a fine-tune whose vocabulary differs is its own built-in, not its base's shape
    instruct = get_config("mistralai/Mixtral-8x22B-Instruct-v0.1")
    assert instruct.name == "mixtral-8x22b-instruct" and instruct.vocab_size == 32768
    # the user's own config.json wins over the table
    cache_model(hf_cache, "meta-llama/Llama-3.1-8B-Instruct", {**LLAMA_3_2_1B, "vocab_size": 128000})
    assert get_config("meta-llama/Llama-3.1-8B-Instruct").vocab_size == 128000
    with pytest.raises(InputError, match="unknown model 'meta-llama/Llama-3.1-8B-Instruc'"):
        get_config("meta-llama/Llama-3.1-8B-Instruc")


@needs_data
def test_a_shipped_or_cached_id_matches_whatever_its_case_and_keeps_its_own_spelling(hf_cache):
    shipped = get_config("mistralai/mixtral-8x22b-v0.1")
    assert shipped.name == "mistralai/Mixtral-8x22B-v0.1" and shipped.num_experts == 8
    cache_model(hf_cache, "Org/Some-Model", LLAMA_2_7B)
    cached = get_config("org/some-model")
    assert cached.name == "Org/Some-Model" and cached.num_layers == 32


def test_the_framework_version_defaults_to_the_newest_the_gpu_has(tmp_path):
    """--framework-version: NVIDIA's data has A100 at an older vLLM than H100; the default is each GPU's
    newest, compared as version numbers (0.14.0 after 0.9.0)."""
    from sim.compose import data

    for version in ("0.9.0", "0.14.0", "0.2.1"):
        (tmp_path / "data" / "gpu_x" / "gemm" / "vllm" / version).mkdir(parents=True)
    (tmp_path / "gpu_x.yaml").write_text("x: 1\n")
    assert data.newest_version(tmp_path, "gpu_x", "vllm") == "0.14.0"
    with pytest.raises(InputError) as err:
        data.newest_version(tmp_path, "gpu_x", "sglang")
    assert err.value.field == "framework" and "vllm" in err.value.message
