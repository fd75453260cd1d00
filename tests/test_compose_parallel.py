"""Replicas of several GPUs (issue 28): tensor parallelism, mixtures of experts, fp8, target-only profiles.

The arithmetic tests extend the hand-made tiny kernel data of tests/test_compose.py with
all-reduce, all-gather and MoE tables (power laws, which log-space interpolation reproduces
exactly) and check a split pass term by term. Tests on NVIDIA's data skip without the
gpu-data extra; the shipped profiles' tests need nothing.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate.configs import active_param_count, get_config, param_count
from specbatch.commands.cli import main as cli_main
from sim.costmodel.profile import load_profile
from tests.tiny_kernels import BW, BW_FACTOR, MEM_LATENCY, MEMORY, RESERVED, gemm_ms, gen_ms, write_tiny_gpu

HAVE_DATA = importlib.util.find_spec("aiconfigurator_core") is not None
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="aiconfigurator-core not installed (pip install -e \".[gpu-data]\")")


def reduce_ms(size, eager=False):
    return (3e-3 if eager else 1e-3) * size ** 0.5


def nccl_reduce_ms(size):
    """nccl-tests' all-reduce: a latency floor above the framework's graph table for small messages, below it for large."""
    return 4e-3 * size ** 0.25


def gather_ms(size):
    return 2e-3 * size ** 0.4


def experts_ms(tokens, routing="balanced"):
    return (2.0 if routing == "power_law_1.2" else 1.0) * 5e-3 * tokens ** 0.7


@pytest.fixture(scope="module")
def tiny_tp(tmp_path_factory) -> Path:
    """The tiny GPU of test_compose.py with 1 and 2 KV heads, collectives of 2 and 4 GPUs, and tiny-moe's experts."""
    pytest.importorskip("pyarrow", reason="writing Parquet needs pyarrow")
    pytest.importorskip("yaml", reason="the spec sheet is YAML")
    root = tmp_path_factory.mktemp("systems")
    data = write_tiny_gpu(root, kv_heads=(1, 2), heads_measured=(1, 16), gemm_dtypes=("bfloat16", "fp8"))
    folders = {"moe": data / "moe" / "vllm" / "0.24.0", "comm": data / "comm" / "vllm" / "0.24.0",
               "nccl": data / "comm" / "nccl" / "2.27.3"}
    for folder in folders.values():
        folder.mkdir(parents=True)
    sizes = [2 ** e for e in range(4, 24)]
    pd.DataFrame([dict(framework="vLLM", version="0.24.0", device="Tiny GPU", op_name="all_reduce",
                       kernel_source=f"vLLM_custom_{backend}", allreduce_dtype="bfloat16", num_gpus=g,
                       message_size=s, latency=reduce_ms(s, backend == "eager"), backend=f"vllm_{backend}")
                  for g in (2, 4) for s in sizes for backend in ("graph", "eager")]).to_parquet(
        folders["comm"] / "custom_allreduce_perf.parquet")
    pd.DataFrame([dict(framework="TRTLLM", version="2.27.3", device="Tiny GPU", op_name=op, kernel_source="NCCL",
                       nccl_dtype="half", num_gpus=g, message_size=s,
                       latency=gather_ms(s) if op == "all_gather" else nccl_reduce_ms(s))
                  for g in (2, 4) for s in sizes for op in ("all_gather", "all_reduce")]).to_parquet(
        folders["nccl"] / "nccl_perf.parquet")
    pd.DataFrame([dict(framework="VLLM", version="0.24.0", device="Tiny GPU", op_name="moe",
                       kernel_source="vllm_unquantizedfusedmoe_triton_tritonexperts", moe_dtype="bfloat16",
                       num_tokens=t, hidden_size=64, inter_size=32, topk=2, num_experts=4, moe_tp_size=tp,
                       moe_ep_size=1, distribution=routing, latency=experts_ms(t, routing) / tp)
                  for t in (1, 16, 16384) for tp in (1, 2) for routing in ("balanced", "power_law_1.2")]).to_parquet(
        folders["moe"] / "moe_perf.parquet")
    return root


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


GRID = ["--gpu", "tiny", "--batch-sizes", "1,2", "--k-max", "2", "--contexts", "100", "--prompts", "32"]


def compose(capsys, data: Path, out: Path, *args: str) -> tuple[int, str]:
    code, _, err = run_cli(capsys, "compose", *GRID, *args, "--kernel-data", str(data), "--out", str(out))
    return code, err


def points(out: Path):
    return load_profile(out).points.set_index(["phase", "model", "batch_size", "query_tokens", "context_tokens"])


def rounded(x):  # the profile keeps 4 significant digits
    return float(f"{x:.4g}")


# -- the arithmetic of a split pass -------------------------------------------------------------

def test_a_pass_split_over_two_gpus_is_one_gpus_share_plus_the_collectives(tiny_tp, tmp_path, capsys):
    """tiny-llama (hidden 64, 4 heads of 16, 2 KV heads, ffn 128, vocab 512, 2 layers) over 2 GPUs:
    2 query heads and 1 KV head per GPU, ffn 64, 256 vocabulary rows; two all-reduces per layer
    and one after the embedding (tokens x 64), the logits' all-gather (tokens x 512)."""
    out = tmp_path / "tp2"
    code, err = compose(capsys, tiny_tp, out, "--target", "tiny-llama", "--draft", "tiny-llama", "--tp", "2")
    assert code == 0, err
    pts = points(out)
    h, hd, heads, kv, f, vocab_gpu, vocab, layers = 64, 16, 2, 1, 64, 256, 512, 2
    gemms = [((heads + 2 * kv) * hd, h), (h, heads * hd), (2 * f, h), (h, f)]
    bw = BW * BW_FACTOR
    layer_bytes = 2 * (8 * h + 2 * (heads + kv) * hd + 3 * f) + 2 * kv * hd * 2
    pass_bytes = 2 * 6 * h

    def decode(b, q, c):
        t = b * q
        reduce = max(reduce_ms(t * h), nccl_reduce_ms(t * h))  # a running model's all-reduce: at least NCCL's
        per_layer = (sum(gemm_ms(t, n, k) for n, k in gemms) + gen_ms(b, c + q - 1, kv * 2 * q)
                     + 2 * reduce) * 1e-3
        return (layers * (per_layer + t * layer_bytes / bw) + t * pass_bytes / bw + reduce * 1e-3
                + (gemm_ms(t, vocab_gpu, h) + gather_ms(t * vocab)) * 1e-3)

    for b in (1, 2):
        for q in (1, 2, 3):
            assert pts.loc[("decode", "target", b, q, 100), "latency_median_s"] == rounded(decode(b, q, 100))
        for k in (0, 1, 2):  # sampling reads the whole vocabulary on every GPU after the all-gather
            assert pts.loc[("verify", "target", b, k, 0), "latency_median_s"] == rounded(
                2 * MEM_LATENCY + b * vocab * ((k + 1) * (2 + 4) + (2 * k + 1) * 4) / bw)
    meta = json.loads((out / "profile.json").read_text())
    assert meta["tensor_parallel_size"] == 2 and meta["draft_placement"]["tensor_parallel_size"] == 2
    assert meta["composition"]["collectives"]["all_gather"] == "NCCL 2.27.3 (nccl-tests)"
    assert any("tensor parallelism over 2 GPUs" in a for a in meta["composition"]["assumptions"])


def test_a_running_models_all_reduce_costs_at_least_a_synchronising_nccl_all_reduce(tiny_tp):
    """Small messages: the framework's graph table times them back to back below NCCL's handshake, and the
    running model pays NCCL's; large ones: the framework's kernel is the larger and is what is paid."""
    pricer = _pricers(tiny_tp, "tiny-llama", tp=2)["target"]
    small, large = 2, 256  # tokens: 128 and 16,384 elements of a 64-wide hidden state
    assert reduce_ms(small * 64) < nccl_reduce_ms(small * 64) and reduce_ms(large * 64) > nccl_reduce_ms(large * 64)
    assert float(pricer.collectives.kernel_all_reduce(small, 64)) == pytest.approx(reduce_ms(small * 64) * 1e-3)
    assert float(pricer.communication(small)[1]) == pytest.approx(nccl_reduce_ms(small * 64) * 1e-3)
    assert float(pricer.communication(large)[1]) == pytest.approx(reduce_ms(large * 64) * 1e-3)
    assert pricer.collectives.sources["all_reduce_floor"] == "NCCL 2.27.3 all_reduce (nccl-tests)"


def test_steps_past_the_largest_cuda_graph_all_reduce_eagerly(tiny_tp, tmp_path, capsys):
    """A 1,024-token prefill (past vLLM's 512-token capture size) pays the eager all-reduce table."""
    from sim.compose.parallel import GRAPH_TOKENS

    pricer = _pricers(tiny_tp, "tiny-llama", tp=2)["target"]
    assert float(pricer.communication(GRAPH_TOKENS)[1]) == pytest.approx(reduce_ms(GRAPH_TOKENS * 64) * 1e-3)
    assert float(pricer.communication(1024)[1]) == pytest.approx(reduce_ms(1024 * 64, eager=True) * 1e-3)
    # Past the table's largest message (2^23 elements): equal parts.
    assert float(pricer.collectives.all_gather(2 ** 25)) == pytest.approx(4 * gather_ms(2 ** 23) * 1e-3)


def _pricers(data: Path, target: str, tp: int = 1, draft: str | None = None, draft_tp: int | None = None,
             routing: str = "balanced", dtype: str = "bf16"):
    from sim.compose import ModelShape
    from sim.compose.build import Request, load_tables, make_pricers

    shapes = {role: ModelShape.of(get_config(name), param_count(get_config(name)))
              for role, name in (("target", target), ("draft", draft)) if name}
    request = Request("tiny", "vllm", "0.24.0", dtype, shapes["target"], shapes.get("draft"), (), {}, {},
                      kernel_data=str(data), tp=tp, draft_tp=draft_tp, moe_routing=routing)
    tables, root, _ = load_tables(request)
    return make_pricers(request, tables, root)


def test_a_mixture_of_experts_is_priced_from_the_moe_table_at_the_steps_tokens(tiny_tp):
    """tiny-moe: 4 experts of 32, top 2. A layer = QKV + O + the router (4 columns, priced at the table's
    narrowest 16) + the fused experts at the step's tokens; no SiLU-and-mul small op (inside the kernel)."""
    for tp in (1, 2):
        pricer = _pricers(tiny_tp, "tiny-moe", tp=tp)["target"]
        heads, kv = 4 // tp, 2 // tp
        for tokens in (1, 5, 64):
            expected = (gemm_ms(tokens, (heads + 2 * kv) * 16, 64) + gemm_ms(tokens, 64, heads * 16)
                        + gemm_ms(tokens, 16, 64) + experts_ms(tokens) / tp) * 1e-3
            assert float(pricer.layer_gemms(tokens)) == pytest.approx(expected, rel=1e-12)
        per_layer, _ = pricer.model.small_op_elements_per_token()
        assert per_layer == 8 * 64 + 2 * (heads + kv) * 16 + 4
    skewed = _pricers(tiny_tp, "tiny-moe", routing="power_law_1.2")["target"]
    balanced = _pricers(tiny_tp, "tiny-moe")["target"]
    assert float(skewed.experts(7) - balanced.experts(7)) == pytest.approx(experts_ms(7) * 1e-3)
    assert float(balanced.experts(3 * 16384)) == pytest.approx(3 * experts_ms(16384) * 1e-3)  # 3 launches


def test_fp8_prices_the_fp8_gemm_table_and_keeps_the_lm_head_bf16(tiny_tp):
    bf16 = _pricers(tiny_tp, "tiny-llama")["target"]
    fp8 = _pricers(tiny_tp, "tiny-llama", dtype="fp8")["target"]
    assert float(fp8.layer_gemms(8)) == pytest.approx(0.5 * float(bf16.layer_gemms(8)))
    assert float(fp8.lm_head(8)) == float(bf16.lm_head(8))


def test_kv_capacity_is_the_gpus_free_memory_over_a_tokens_bytes_on_them(tiny_tp, tmp_path, capsys):
    """Every GPU holds its KV heads of every token and the same block count: at tp 2 each GPU holds half
    the weights and 1 of the 2 KV heads, so the replica holds about twice the tokens."""
    from sim.compose import ModelShape

    shape = ModelShape.of(get_config("tiny-llama"), param_count(get_config("tiny-llama")))
    budget = int(0.9 * MEMORY)
    for tp in (1, 2):
        out = tmp_path / f"tp{tp}"
        assert compose(capsys, tiny_tp, out, "--target", "tiny-llama", "--tp", str(tp))[0] == 0
        split = shape.sharded(tp)
        expected = (budget - split.weight_bytes(2) - RESERVED) // split.kv_bytes_per_token(2)
        meta = json.loads((out / "profile.json").read_text())
        assert meta["kv_capacity_tokens"] == expected
        assert meta["memory"]["gpus"] == tp and meta["memory"]["kv_bytes_per_token"] == 2 * 2 * (2 // tp) * 16 * 2
    # The draft on one GPU of the group: its whole weights and KV sit there and set every GPU's count.
    out = tmp_path / "draft1"
    assert compose(capsys, tiny_tp, out, "--target", "tiny-llama", "--draft", "tiny-moe", "--tp", "2",
                   "--draft-tp", "1")[0] == 0
    meta = json.loads((out / "profile.json").read_text())
    draft = ModelShape.of(get_config("tiny-moe"), param_count(get_config("tiny-moe")))
    per_gpu = shape.sharded(2).weight_bytes(2) + draft.weight_bytes(2)
    per_token = shape.sharded(2).kv_bytes_per_token(2) + draft.kv_bytes_per_token(2)
    assert meta["kv_capacity_tokens"] == (budget - per_gpu - RESERVED) // per_token
    assert meta["draft_placement"]["tensor_parallel_size"] == 1 and "one GPU" in meta["draft_placement"]["summary"]
    assert meta["models"]["draft"]["tensor_parallel_size"] == 1


def test_the_weights_split_as_vllm_shards_them():
    """Per GPU: every linear layer, expert and the vocabulary rows / tp; norms replicated; KV heads split,
    or replicated to one per GPU when there are fewer KV heads than GPUs."""
    from sim.compose import ModelShape

    c = get_config("llama-3.1-70b")
    whole = ModelShape.of(c, param_count(c))
    for tp in (2, 4, 8):
        split = whole.sharded(tp)
        replicated = 2 * (c.num_layers * 2 * c.hidden_size + c.hidden_size)  # the norms, bf16
        assert split.weight_bytes(2) - replicated / 1 == pytest.approx((whole.weight_bytes(2) - replicated) / tp,
                                                                       rel=1e-3)
    assert whole.sharded(8).kv_heads == 1 and whole.sharded(4).kv_heads == 2
    qwen = ModelShape.of(get_config("qwen3-30b-a3b"), 0)
    assert qwen.sharded(4).kv_heads == 1 and qwen.sharded(8).kv_heads == 1  # 4 KV heads, replicated at 8
    assert qwen.sharded(8).kv_bytes_per_token(2) == qwen.sharded(4).kv_bytes_per_token(2)


# -- model shapes -----------------------------------------------------------------------------

@pytest.mark.parametrize("name, published, rel", [
    # Hugging Face's safetensors totals as their cards round them; Mistral's and Qwen's cards.
    ("llama-2-70b", 69.0e9, 0.001), ("llama-3.1-70b", 70.6e9, 0.001), ("codellama-34b", 33.7e9, 0.002),
    ("mixtral-8x7b", 46.7e9, 0.001), ("qwen3-30b-a3b", 30.5e9, 0.002)])
def test_new_targets_match_their_published_parameter_counts(name, published, rel):
    assert param_count(get_config(name)) == pytest.approx(published, rel=rel)


@pytest.mark.parametrize("name, active", [("mixtral-8x7b", 12.9e9), ("qwen3-30b-a3b", 3.3e9)])
def test_a_mixture_of_experts_activates_its_published_share(name, active):
    """Mistral: 'uses 12.9B parameters per token'; Qwen3-30B-A3B: '3.3B activated'."""
    assert active_param_count(get_config(name)) == pytest.approx(active, rel=0.02)


def test_calibrate_refuses_what_it_cannot_build_in_one_line(tmp_path, capsys):
    from calibrate.cli import main as calibrate_main

    code = calibrate_main(["--target", "mixtral-8x7b", "--draft", "tiny-llama", "--device", "cpu",
                           "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "mixture of experts" in err and "specbatch compose" in err
    assert not (tmp_path / "x").exists()


def test_a_head_drafter_is_a_shape_priced_like_any_other(tiny_tp):
    """ModelShape.head_of: one layer at the target's width, its input fusion GEMM (2h -> h) once a pass."""
    from sim.compose import ModelShape
    from sim.compose.build import Request, load_tables
    from sim.compose.price import PassPricer

    target = ModelShape.of(get_config("tiny-llama"), param_count(get_config("tiny-llama")))
    head = ModelShape.head_of(target, "tiny-eagle")
    layer = sum(n * k for _, n, k in target.layer_gemms())
    assert head.num_layers == 1 and head.params == layer + 2 * 64 * 64 + 2 * 64 + 64
    assert head.weight_bytes(2) == 2 * head.params  # its LM head and embedding are the target's
    tables = load_tables(Request("tiny", "vllm", "0.24.0", "bf16", target, None, (), {}, {},
                                 kernel_data=str(tiny_tp)))[0]
    one_layer = PassPricer(ModelShape.head_of(target, "no-fc", fused_inputs=0), tables)
    fused = PassPricer(head, tables)
    parts, plain = fused.decode_parts(2, 1, 100, 1), one_layer.decode_parts(2, 1, 100, 1)
    assert float(parts["gemm"] - plain["gemm"]) == pytest.approx(gemm_ms(2, 64, 128) * 1e-3)


# -- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--target", "tiny-llama", "--tp", "3"], "tensor parallelism of 3 GPUs"),
    (["--target", "tiny-llama", "--tp", "8"], "4 attention heads do not split over 8 GPUs"),
    (["--target", "tiny-llama", "--draft", "tiny-llama", "--tp", "2", "--draft-tp", "4"],
     "the target's group (2) or on one GPU of it (1), not 4"),
    (["--target", "tiny-llama", "--tp", "2", "--draft-tp", "1"], "a target-only profile has no draft to place"),
    (["--target", "tiny-moe", "--moe-routing", "zipf"], "'zipf' is not one of balanced"),
    (["--target", "tiny-moe", "--tp", "4"], "the MoE table has this model's experts at tensor-parallel sizes [1, 2]")])
def test_a_split_vllm_would_refuse_is_one_line_before_any_work(tiny_tp, tmp_path, capsys, args, says):
    code, err = compose(capsys, tiny_tp, tmp_path / "x", *args)
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "x").exists()


def test_a_gpu_count_the_collectives_were_not_measured_for_is_one_line(tiny_tp, tmp_path, capsys):
    import shutil

    root = tmp_path / "systems"
    shutil.copytree(tiny_tp, root)
    table = root / "data" / "tiny" / "comm" / "vllm" / "0.24.0" / "custom_allreduce_perf.parquet"
    frame = pd.read_parquet(table)
    frame[frame.num_gpus == 4].to_parquet(table)
    code, err = compose(capsys, root, tmp_path / "x", "--target", "tiny-llama", "--tp", "2")
    assert code == 2 and "measured collectives of 4 GPUs, not 2" in err, err


# -- target-only profiles ---------------------------------------------------------------------

def test_a_target_only_profile_runs_policy_none_and_refuses_speculation_in_one_line(tiny_tp, tmp_path, capsys):
    out = tmp_path / "target-only"
    assert compose(capsys, tiny_tp, out, "--target", "tiny-llama", "--tp", "2")[0] == 0
    profile = load_profile(out)
    assert not profile.has_draft and profile.gpus_per_replica == 2
    assert set(profile.points.model) == {"target", "greedy", "random", "top-p"}  # no draft: the target's, and
    assert set(profile.points.phase[profile.points.model != "target"]) == {"verify"}  # its sampler per sampling
    base = ["run", "--profile", str(out), "--num-requests", "20", "--prompt-tokens", "16", "--output-tokens", "8"]
    code, stdout, err = run_cli(capsys, *base, "--policy", "none", "--out", str(tmp_path / "r"))
    assert code == 0, err
    for policy in (["--policy", "fixed", "--k", "2"], ["--policy", "goodput"]):
        code, _, err = run_cli(capsys, *base, *policy, "--out", str(tmp_path / "s"))
        assert code == 2 and err.count("\n") == 1, err
        assert "has no draft model (a target-only profile): only --policy none runs on it" in err
    assert not (tmp_path / "s").exists()
    code, stdout, _ = run_cli(capsys, "profiles", str(out))
    assert "no draft (target only" in stdout and "2 GPUs per replica" in stdout


def test_a_sidecar_without_a_draft_whose_points_time_one_is_refused(tmp_path):
    import shutil

    from sim.errors import InputError

    src = load_profile("h100-llama-3.1-8b-llama-3.2-1b").path
    shutil.copytree(src, tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "profile.json").read_text())
    del meta["models"]["draft"]
    (tmp_path / "p" / "profile.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match="names no draft model .* but the points time one"):
        load_profile(tmp_path / "p")


# -- the shipped profiles of several GPUs ------------------------------------------------------

SHIPPED_TP = ["h100-tp4-llama-2-70b", "h100-tp2-mixtral-8x7b", "h100-tp2-codellama-34b",
              "h100-tp4-llama-3.1-70b-llama-3.1-8b", "h100-tp4-llama-3.1-70b-llama-3.2-1b",
              "h100-tp4-llama-3.1-8b-llama-3.2-1b", "h200-tp2-llama-3.1-70b-llama-3.2-1b"]


@pytest.mark.parametrize("name", SHIPPED_TP)
def test_shipped_multi_gpu_profiles_say_how_they_are_split(name):
    profile = load_profile(name)
    gpus = int(name.split("-tp")[1].split("-")[0])
    assert profile.gpus_per_replica == gpus == profile.meta["memory"]["gpus"]
    assert profile.has_draft == (name.count("llama-3.") == 2)
    assert f"--tp {gpus}" in profile.meta["command"]
    if profile.has_draft:
        assert profile.meta["draft_placement"]["tensor_parallel_size"] == gpus


def test_the_validation_runs_kv_caches_are_what_vllm_logged_within_ten_percent():
    """The memory model (weights per GPU, the spec sheet's reserve) is not fitted to the runs: vLLM
    0.15.1 logged 31,356 / 27,510 / 26,602 blocks of 16 tokens for these targets (runs.json)."""
    for name, blocks in (("h100-tp4-llama-2-70b", 31356), ("h100-tp2-mixtral-8x7b", 27510),
                         ("h100-tp2-codellama-34b", 26602)):
        assert load_profile(name).kv_capacity_tokens == pytest.approx(16 * blocks, rel=0.10), name


def test_splitting_the_8b_pair_over_four_gpus_is_faster_but_not_four_times():
    """The same pass on 4 GPUs: a quarter of the weights to read, plus two all-reduces a layer."""
    def decode(name, b):
        rows = load_profile(name).phase("decode", "target")
        return float(rows[(rows.batch_size == b) & (rows.query_tokens == 1) & (rows.context_tokens == 128)]
                     .latency_median_s.iloc[0])

    for b in (1, 32, 256):
        one, four = decode("h100-llama-3.1-8b-llama-3.2-1b", b), decode("h100-tp4-llama-3.1-8b-llama-3.2-1b", b)
        assert one / 4 < four < one, (b, one, four)


def test_the_fp8_profile_reads_about_half_the_bytes():
    fp8 = load_profile("h200-tp2-llama-3.1-70b-llama-3.2-1b").meta
    assert fp8["dtype"] == "fp8" and fp8["composition"]["kernels"]["gemm"]
    c = get_config("llama-3.1-70b")
    assert fp8["models"]["target"]["weight_bytes"] == pytest.approx(param_count(c) / 2, rel=0.05)


@needs_data
@pytest.mark.parametrize("target, tp", [("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 4), ("mixtral-8x7b", 8),
                                        ("llama-3.1-70b", 8)])
def test_the_kernel_data_composes_the_new_targets_at_every_split_it_measured(target, tp, tmp_path, capsys):
    code, _, err = run_cli(capsys, "compose", "--gpu", "h100_sxm", "--target", target, "--tp", str(tp),
                           "--batch-sizes", "1,16,128", "--contexts", "512,4096", "--k-max", "2", "--prompts", "64,1024",
                           "--out", str(tmp_path / "p"))
    assert code == 0, err
    profile = load_profile(tmp_path / "p")
    assert profile.gpus_per_replica == tp and (profile.skipped.status != "error").all()


@needs_data
def test_a_skewed_routing_costs_more_than_a_balanced_one(tmp_path, capsys):
    """Where every expert has tokens (64 and more a step): one busier expert is the step's critical path."""
    out = {}
    for routing in ("balanced", "power_law_1.2"):
        assert run_cli(capsys, "compose", "--gpu", "h100_sxm", "--target", "mixtral-8x7b", "--tp", "2",
                       "--moe-routing", routing, "--batch-sizes", "64,256", "--contexts", "512", "--k-max", "1",
                       "--prompts", "512", "--out", str(tmp_path / routing))[0] == 0
        out[routing] = load_profile(tmp_path / routing).phase("decode", "target").latency_median_s.to_numpy()
    assert (out["power_law_1.2"] > out["balanced"]).all()
    meta = load_profile(tmp_path / "power_law_1.2").meta
    assert meta["composition"]["moe_routing"] == "power_law_1.2"
    assert any("routing assumed 'power_law_1.2'" in a for a in meta["composition"]["assumptions"])


def test_every_layers_collectives_are_part_of_a_split_pass():
    """At batch 1 a 70B decode on 4 GPUs is at least its per-GPU weights over the bandwidth, plus
    161 all-reduces of about 5 us (two per layer and the embedding's)."""
    meta = load_profile("h100-tp4-llama-2-70b").meta
    rows = load_profile("h100-tp4-llama-2-70b").phase("decode", "target")
    t = float(rows[(rows.batch_size == 1) & (rows.query_tokens == 1)].latency_median_s.min())
    bound = meta["models"]["target"]["weight_bytes"] / meta["device"]["spec"]["mem_bw"]
    assert bound + 161 * 4e-6 < t < 1.5 * bound
    assert np.isclose(meta["models"]["target"]["weight_bytes"], param_count(get_config("llama-2-70b")) * 2 / 4,
                      rtol=1e-3)


@needs_data
def test_the_python_api_composes_what_the_command_does(tmp_path, capsys):
    import specbatch

    grid = ["--batch-sizes", "1,8", "--contexts", "512", "--k-max", "1", "--prompts", "64"]
    assert run_cli(capsys, "compose", "--gpu", "h100_sxm", "--target", "llama-3.1-70b", "--draft", "llama-3.2-1b",
                   "--tp", "4", "--draft-tp", "1", *grid, "--out", str(tmp_path / "cli"))[0] == 0
    profile = specbatch.compose("h100_sxm", "llama-3.1-70b", tmp_path / "api", draft="llama-3.2-1b", tp=4, draft_tp=1,
                                batch_sizes=[1, 8], contexts=[512], k_max=1, prompts=[64])
    assert profile.gpus_per_replica == 4 and profile.meta["draft_placement"]["tensor_parallel_size"] == 1
    assert (tmp_path / "api" / "profile.csv").read_text() == (tmp_path / "cli" / "profile.csv").read_text()
    with pytest.raises(specbatch.InputError, match="tensor parallelism of 3 GPUs"):
        specbatch.compose("h100_sxm", "llama-3.1-70b", tmp_path / "bad", tp=3)


@pytest.mark.parametrize("value", [0, "4", 2.5, True])
def test_a_sidecars_gpus_per_replica_must_be_a_whole_number(tmp_path, value):
    import shutil

    from sim.errors import InputError

    shutil.copytree(load_profile("h100-tp2-codellama-34b").path, tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "profile.json").read_text())
    meta["tensor_parallel_size"] = value
    (tmp_path / "p" / "profile.json").write_text(json.dumps(meta, indent=1))
    with pytest.raises(InputError, match="tensor_parallel_size.*expected the GPUs of one replica"):
        load_profile(tmp_path / "p")
