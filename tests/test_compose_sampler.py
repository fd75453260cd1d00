"""vLLM's sampler priced for the sampling the requests ask for (sim/compose/sampler.py, issue 40).

Greedy (temperature 0) keeps its arithmetic (tests/test_compose.py); random sampling adds the
temperature, softmax and exponential race; top-p adds vLLM 0.15's sort over the vocabulary, read
from H100 measurements. The arithmetic is checked on the hand-made tiny GPU (tests/tiny_kernels.py).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from specbatch.commands.cli import main as cli_main
from sim.compose.sampler import SORT_GPU_BW, SORT_TABLE, sampler_time, sort_time
from sim.costmodel.profile import load_profile
from tests.conftest import load_script
from tests.tiny_kernels import BW, BW_FACTOR, MEM_LATENCY

HAVE_DATA = importlib.util.find_spec("aiconfigurator_core") is not None
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="aiconfigurator-core not installed (pip install -e \".[gpu-data]\")")
TINY = ["--gpu", "tiny", "--target", "tiny-llama", "--batch-sizes", "1,2", "--k-max", "2", "--contexts", "100",
        "--prompts", "32"]


def compose_tiny(tiny_data, tmp_path, capsys, *extra: str):
    out = tmp_path / ("tiny-" + "-".join(extra).replace("--", "") if extra else "tiny")
    code = cli_main(["compose", *TINY, *extra, "--kernel-data", str(tiny_data), "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 0, err
    return load_profile(out)


def verify_rows(profile, model: str = "target") -> dict[tuple[int, int], float]:
    rows = profile.points[(profile.points.phase == "verify") & (profile.points.model == model)]
    return {(int(r.batch_size), int(r.query_tokens)): float(r.latency_median_s) for r in rows.itertuples()}


def rounded(x: float) -> float:  # a profile keeps 4 significant digits
    return float(f"{x:.4g}")


def test_sampling_at_a_temperature_prices_its_passes_and_top_p_the_measured_sort(tiny_data, tmp_path, capsys):
    vocab, bw = 512, BW * BW_FACTOR  # tiny-llama's vocabulary; the tiny sheet's achievable bandwidth
    random = verify_rows(compose_tiny(tiny_data, tmp_path, capsys, "--sampling", "random"))
    top_p = compose_tiny(tiny_data, tmp_path, capsys, "--sampling", "top-p")
    for b in (1, 2):
        for k in (0, 1, 2):
            rows = b * vocab * (k + 1)
            passes = rows * (6 + 8 + 12 + 20)  # cast (read 2, write 4), temperature, softmax, the race
            rejection = b * vocab * (2 * k + 1) * 4 if k else 0  # target probabilities at k + 1, draft at k
            kernels = 7 if k else 6
            expected = kernels * MEM_LATENCY + (passes + rejection) / bw
            assert random[(b, k)] == rounded(expected)
            sort = float(sort_time(rows, BW))  # scaled from the H100's bandwidth to the tiny GPU's
            assert verify_rows(top_p)[(b, k)] == rounded(expected + sort)
    meta = top_p.meta
    assert meta["composition"]["sampling"] == "top-p" and "--sampling top-p" in meta["command"]
    assert any("sampling 'top-p'" in line and "#33538" in line for line in meta["composition"]["assumptions"])


def test_every_profile_prices_every_sampling_as_a_profile_composed_at_it_does(tiny_data, tmp_path, capsys):
    """verify / <mode>: what a run asking for that sampling prices (workload.sampling), point for point what
    composing at it puts in verify / target."""
    greedy = compose_tiny(tiny_data, tmp_path, capsys)
    for mode in ("greedy", "random", "top-p"):
        at_mode = greedy if mode == "greedy" else compose_tiny(tiny_data, tmp_path, capsys, "--sampling", mode)
        assert verify_rows(greedy, mode) == verify_rows(at_mode) == verify_rows(at_mode, mode)
        assert at_mode.samplings() == ["greedy", "random", "top-p"]


def test_a_greedy_profile_says_nothing_new(tiny_data, tmp_path, capsys):
    """The default keeps its sidecar: greedy profiles composed before the sampler modes are unchanged."""
    meta = compose_tiny(tiny_data, tmp_path, capsys).meta
    assert "sampling" not in meta["composition"] and "--sampling" not in meta["command"]
    assert any(line.startswith("sampling (vLLM V1's sampler)") for line in meta["composition"]["assumptions"])


def test_the_sort_reads_the_h100_measurements_and_scales_by_bandwidth():
    sizes = np.array([n for n, _ in SORT_TABLE], dtype=float)
    assert sort_time(sizes, SORT_GPU_BW) == pytest.approx([t for _, t in SORT_TABLE], rel=1e-12)
    between = sort_time(np.geomspace(sizes[0], sizes[-1], 200), SORT_GPU_BW)
    assert (np.diff(between) > 0).all()  # more rows or a wider vocabulary never sorts faster
    top_n, top_t = SORT_TABLE[-1]
    assert float(sort_time(4 * top_n, SORT_GPU_BW)) == pytest.approx(4 * top_t)  # past the table: per element
    assert float(sort_time(1, SORT_GPU_BW)) == pytest.approx(SORT_TABLE[0][1])  # below it: the launch-bound floor
    assert float(sort_time(sizes[3], SORT_GPU_BW / 2)) == pytest.approx(2 * SORT_TABLE[3][1])


def test_the_sampler_grows_with_the_batch_and_the_vocabulary():
    """Llama 3's 128k columns against Llama 2's 32k: top-p's sort is vocabulary-sized work per sequence."""
    h100 = dict(bw=0.8 * 3.35e12, mem_bw=3.35e12, latency=3e-6)
    batches = np.array([1, 8, 32, 64, 128])
    for mode in ("greedy", "random", "top-p"):
        times = sampler_time(batches, 0, 128256, mode, **h100)
        assert (np.diff(times) > 0).all()
    llama3, llama2 = (float(sampler_time(32, 0, v, "top-p", **h100)) for v in (128256, 32000))
    greedy, random = (float(sampler_time(32, 0, 128256, m, **h100)) for m in ("greedy", "random"))
    assert greedy < random < llama3 and llama3 > 2 * llama2
    assert 0.5e-3 < llama3 < 1.2e-3  # 32 x 128k fp32 logits sorted: between the measured 1.8M and 16.8M elements
    with pytest.raises(ValueError, match="nucleus"):
        sampler_time(1, 0, 32000, "nucleus", **h100)


def test_an_unknown_sampling_is_one_line_before_any_work(tiny_data, tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as stop:
        cli_main(["compose", *TINY, "--sampling", "nucleus", "--kernel-data", str(tiny_data), "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--sampling" in err[-1] and "nucleus" in err[-1] and not out.exists()


def test_the_benchmark_simulates_each_run_with_the_sampling_vllm_did():
    """A run is covered by a shipped profile composed at its requests' sampling (the Llama-2 runs': top-p, their
    model's generation_config.json): the 70B's; the 7B pair (greedy) is not, and the run is simulated on the
    profile compose writes for it. Either way the run asks for its sampling (workload.sampling)."""
    from sim.costmodel.profile import resolve_profile_path, shipped_profiles

    bench = load_script("benchmarks/real_vllm.py", "real_vllm_bench_sampling")
    profiles = {n: json.loads((resolve_profile_path(n) / "profile.json").read_text()) for n in shipped_profiles()}
    llama2 = {"hidden_dim": 4096, "intermediate_dim": 11008, "num_layers": 32, "num_heads": 32, "num_kv_heads": 32,
              "vocab_size": 32000}
    run_7b = {"gpu": "H100-SXM-80GB", "tensor_parallel_size": 1, "model": "meta-llama/Llama-2-7b-hf",
              "engine": "vllm 0.15.1 (V1 engine)", "model_config": llama2}
    assert bench.run_sampling(run_7b) == "top-p" and bench.covering_profile(run_7b, profiles) is None
    assert bench.run_overrides(run_7b | {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
                               "h100-llama-2-7b-llama-68m")["workload.sampling"] == ("top-p", "runs.json")
    assert bench.covering_profile({**run_7b, "model": "an/unrecorded-model"}, profiles) == "h100-llama-2-7b-llama-68m"
    assert bench.built_in_of(run_7b) == ["llama-2-7b"]
    sampled = {model: bench.run_sampling({**run_7b, "model": model}) for model in (
        "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-14B", "mistralai/Mixtral-8x22B-v0.1",
        "meta-llama/CodeLlama-34b-Instruct-hf", "codellama/CodeLlama-34b-Instruct-hf")}
    assert sampled == {"meta-llama/Llama-3.1-8B-Instruct": "top-p", "Qwen/Qwen3-14B": "top-p",
                       "mistralai/Mixtral-8x22B-v0.1": "random", "meta-llama/CodeLlama-34b-Instruct-hf": "random",
                       "codellama/CodeLlama-34b-Instruct-hf": "random"}
    assert bench.run_sampling({**run_7b, "engine": None, "vllm_version": "0.19.0"}) == "greedy"  # not recorded
    run_70b = {**run_7b, "model": "meta-llama/Llama-2-70b-hf", "tensor_parallel_size": 4,
               "model_config": {**llama2, "hidden_dim": 8192, "intermediate_dim": 28672, "num_layers": 80,
                                "num_heads": 64, "num_kv_heads": 8}}
    assert bench.covering_profile(run_70b, profiles) == "h100-tp4-llama-2-70b"
    assert load_profile("h100-tp4-llama-2-70b").sampling == "top-p"
    assert load_profile("h100-tp2-mixtral-8x7b").sampling == "random"
    assert bench.profile_sampling(profiles["h100-tp4-llama-2-70b"]) == "top-p"


@needs_data
def test_top_p_is_what_makes_a_llama_3_step_slower_on_two_gpus_than_on_one():
    """benchmarks/step_terms.py's table: the sort is the same time on each GPU of a group, so it is a larger
    share of the shorter two-GPU step."""
    terms = load_script("benchmarks/step_terms.py", "step_terms_sampling").terms
    one, two = (terms("llama-3.1-8b", "h100_sxm", tp, 32, 1024, "top-p") for tp in (1, 2))
    assert one["sampler"][2] == pytest.approx(two["sampler"][2])
    share = {tp: t["sampler"][2] / sum(v[2] for v in t.values()) for tp, t in ((1, one), (2, two))}
    assert share[2] > 1.5 * share[1] > 0.12
    assert one["sampler"][1] < 0.05e-3  # greedy: a cast and an argmax


def test_the_python_api_composes_the_sampling_the_command_does(tiny_data, tmp_path, capsys):
    import specbatch

    cli = compose_tiny(tiny_data, tmp_path, capsys, "--sampling", "top-p")
    api = specbatch.compose("tiny", "tiny-llama", tmp_path / "api", sampling="top-p", kernel_data=str(tiny_data),
                            batch_sizes=[1, 2], k_max=2, contexts=[100], prompts=[32])
    assert verify_rows(api) == verify_rows(cli) and api.meta["composition"]["sampling"] == "top-p"
    with pytest.raises(specbatch.InputError, match="sampling"):
        specbatch.compose("tiny", "tiny-llama", tmp_path / "bad", sampling="nucleus", kernel_data=str(tiny_data))
