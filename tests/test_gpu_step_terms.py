"""benchmarks/gpu_step_terms.py: the GPU measurement of the step's terms, dry-run on the CPU (tiny sizes),
so the one run it gets on a lent GPU cannot fail on its bookkeeping."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import load_script  # noqa: E402


@pytest.fixture(scope="module")
def terms():
    return load_script("benchmarks/gpu_step_terms.py", "gpu_step_terms")


@pytest.fixture(scope="module")
def dry_run(terms, tmp_path_factory):
    out = tmp_path_factory.mktemp("terms")
    doc = terms.measure(out, 150.0, dry_run=True)
    return out, doc


def small(terms, monkeypatch) -> None:
    """One model, one batch, one context: the bookkeeping tests need points, not sizes (nor torch's profiler,
    which the dry run's own test exercises)."""
    monkeypatch.setattr(terms, "profiled_kernels", lambda fn, plan, runs: [("aten::linear", 1e-4), ("aten::add", 1e-5)])
    monkeypatch.setattr(terms, "DRY_PLAN", replace(
        terms.DRY_PLAN, sampler_models=("tiny-llama",), sampler_batches=(1,), attention_batches=(1,),
        contexts=(32,), decode_models=("tiny-llama",), decode_batches=(1,), decode_contexts=(16,),
        kernel_points=(("tiny-llama", 1, 32),), floor_tokens=(1,), ragged_points=(("tiny-llama", 2, 1, 16),)))


def timed_points(section):
    return [p for p in section["points"] if "median_s" in p]


def test_the_dry_run_writes_every_section_with_positive_finite_times(dry_run, terms):
    out, doc = dry_run
    written = json.loads((out / terms.RESULT).read_text())
    assert written["sections"].keys() == set(terms.SECTIONS) and written["dry_run"] is True
    assert written["device"]["type"] == "cpu" and written["versions"]["torch"] == torch.__version__
    for name, section in written["sections"].items():
        assert section["status"] == "done", (name, section)
        if name == "kernels":
            continue  # its points hold the kernels' spans, checked below
        points = timed_points(section)
        assert points, name
        for p in points:
            assert math.isfinite(p["median_s"]) and 0 < p["p10_s"] <= p["median_s"] <= p["p90_s"], p
    sampler = written["sections"]["sampler"]["points"]
    assert {p["term"] for p in sampler} == set(terms.SAMPLER_TERMS)
    assert {(p["vocab"], p["hidden"]) for p in sampler} == {(512, 64), (32000, 768)}
    attention = written["sections"]["attention"]["points"]
    # the same KV bytes in both layouts at a grid point; varlen is CUDA only, its call checked on meta tensors
    gqa = {(p["batch"], p["kv_bytes"]) for p in attention if p["layout"] == "gqa" and "kv_bytes" in p}
    mha = {(p["batch"], p["kv_bytes"]) for p in attention if p["layout"] == "mha" and "kv_bytes" in p}
    assert gqa == mha and gqa
    assert all(p["unavailable"].startswith("unavailable: dense: the split kernel is CUDA's") for p in attention
               if p["variant"] == "varlen")
    ragged = [p for p in attention if p["layout"] == "gqa-ragged" and p["variant"] == "masked_sdpa"]
    assert ragged and all(p["useful_bytes"] < p["kv_bytes"] for p in ragged)
    decode = written["sections"]["decode_step"]["points"]
    assert {p["model"] for p in decode} == {"tiny-llama", "llama-68m"} and len(timed_points({"points": decode})) == 8
    kernels = written["sections"]["kernels"]["points"]
    assert [(p["model"], p["batch"]) for p in kernels] == [("tiny-llama", 1), ("tiny-llama", 2)]
    for p in kernels:  # every operator the pass ran is in one class, and the classes add up
        assert p["kernels"] == sum(p[f"{c}_kernels"] for c in terms.KERNEL_CLASSES) > 0
        assert p["kernels_s"] == pytest.approx(sum(p[f"{c}_s"] for c in terms.KERNEL_CLASSES))
        assert p["gemm_kernels"] > 0 and p["attention_kernels"] > 0 and p["graph_s"] > 0
        tops = [t["s"] for t in p["small_top"]]
        assert tops == sorted(tops, reverse=True) and sum(tops) <= p["small_s"] * (1 + 1e-9)
    ragged = written["sections"]["ragged"]["points"]
    assert [(p["query_tokens"], p["lengths"]) for p in ragged] == [(1, "uniform"), (1, "ragged"), (3, "uniform"),
                                                                   (3, "ragged")]
    assert all(p["longest"] > p["context"] for p in ragged if p["lengths"] == "ragged")
    floor = written["sections"]["floor"]["points"]
    assert {(p["op"], p["tokens"]) for p in floor} == {(op, n) for op in terms.FLOOR_OPS for n in (1, 4)}
    assert all(p["per_kernel_s"] < p["median_s"] for p in floor)
    sustained = {p["mode"]: p for p in written["sections"]["sustained"]["points"]}
    assert sustained.keys() == {"calibration", "back_to_back", "steps"}
    assert sustained["back_to_back"]["samples"] == 10 * terms.DRY_PLAN.repeats
    windows = sustained["steps"]["windows"]
    assert windows and all(w["steps"] > 0 and 0 < w["target_median_s"] < w["step_median_s"] for w in windows)
    assert [w["t_s"] for w in windows] == sorted(w["t_s"] for w in windows)


def test_varlen_reads_each_rows_own_keys(terms, monkeypatch):
    """The model's split path (token-major cache, one length per row) gives what its masked attention gives,
    with a per-row reference in place of the CUDA-only kernel."""
    import torch.nn.functional as F

    from calibrate import attention

    def reference(q, k, v, s, causal):
        rows = []
        for i, n in enumerate(s.used_k.tolist()):
            start = int(s.cu_k[i])
            keys, vals = k[start:start + n].transpose(0, 1)[None], v[start:start + n].transpose(0, 1)[None]
            rows.append(F.scaled_dot_product_attention(q[i][None, :, None], keys, vals, enable_gqa=True)[0, :, 0])
        return torch.stack(rows)

    plan = replace(terms.DRY_PLAN, dtype="float32")
    gen = torch.Generator().manual_seed(0)
    point = terms.AttentionPoint(terms.model_config("tiny-llama"), [5, 64, 17], plan, gen)
    monkeypatch.setattr(attention, "_flash_varlen", reference)
    assert point.varlen_error(point.varlen()) < 1e-5


def test_a_failed_point_or_section_is_recorded_and_the_rest_goes_on(terms, tmp_path, monkeypatch):
    small(terms, monkeypatch)
    calls = []
    real = terms.timed

    def flaky(fn, plan):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected failure")
        return real(fn, plan)

    def broken(rec, plan, gen):
        raise MemoryError("injected section failure")

    monkeypatch.setattr(terms, "timed", flaky)
    monkeypatch.setitem(terms.MEASURES, "attention", broken)
    doc = terms.measure(tmp_path, 150.0, dry_run=True)
    assert doc == json.loads((tmp_path / terms.RESULT).read_text())
    sampler, attention, decode = (doc["sections"][s] for s in terms.SECTIONS[:3])
    failed = [p for p in sampler["points"] if "error" in p]
    assert [(p["term"], p["error"]) for p in failed] == [(terms.SAMPLER_TERMS[2], "RuntimeError: injected failure")]
    assert sampler["status"] == "partial" and len(timed_points(sampler)) == len(terms.SAMPLER_TERMS) - 1
    assert attention["status"] == "failed" and attention["error"] == "MemoryError: injected section failure"
    assert decode["status"] == "done" and len(timed_points(decode)) == 1


def test_the_budget_is_shared_between_sections_and_skips_what_is_over(terms, tmp_path, monkeypatch):
    """A fake clock: every timed point takes 1 s. Of 10 s (shares 1 : 1 : 3 : 1 : 0.5 : 1), the sampler gets
    1/7.5, attention 1/6.5 of the rest, the decode step 3/5.5 of what is left, and so on; a point is skipped
    once its section's share is spent, and what a section leaves goes to the next."""
    small(terms, monkeypatch)
    clock = [0.0]
    monkeypatch.setattr(terms, "now", lambda: clock[0])

    def one_second(fn, plan):
        clock[0] += 1.0
        return {"median_s": 1e-3, "p10_s": 1e-3, "p90_s": 1e-3, "samples": 1, "graph": False}

    monkeypatch.setattr(terms, "timed", one_second)
    # the sustained section times by the clock itself (a fixed run of steps), which a fake one never ends
    doc = terms.measure(tmp_path, 10.0, dry_run=True, sections=terms.SECTIONS[:-1])
    sampler, attention, decode = (doc["sections"][s]["points"] for s in terms.SECTIONS[:3])
    assert len(timed_points({"points": sampler})) == 2
    assert all(p["skipped"].startswith("out of time") for p in sampler[2:])
    assert [p["variant"] for p in attention if "median_s" in p] == ["masked_sdpa", "sdpa"]
    assert len(timed_points({"points": decode})) == 1
    assert [p["batch"] for p in doc["sections"]["kernels"]["points"] if "graph_s" in p] == [1]
    assert len(timed_points(doc["sections"]["floor"])) == 2  # of 3: its share (4 s x 0.5 / 1.5) ends after two
    assert [p["lengths"] for p in timed_points(doc["sections"]["ragged"])] == ["uniform", "ragged"]
    assert doc["sections"]["sampler"]["status"] == "partial"

    nothing = terms.measure(tmp_path, 0.0, dry_run=True)
    for section in nothing["sections"].values():
        assert section["points"] and all(p["skipped"].startswith("out of time") for p in section["points"])


def test_compare_prices_whatever_points_exist_and_says_what_it_cannot(dry_run, terms):
    pytest.importorskip("sim.compose.build")
    out, _ = dry_run
    text = terms.compare(out / terms.RESULT, "h200_sxm")
    assert text == terms.compare(out / terms.RESULT, "h200_sxm")  # deterministic: it goes into generated docs
    tables = text.split("\n\n")
    tiny = next(t for t in tables if t.startswith("decode step, tiny-llama"))
    composed = next(t for t in tables if t.startswith("decode step, llama-68m"))
    # tiny-llama's head size (16) is in no attention table: its step has no price; llama-68m's has
    assert all(line.endswith(terms.NOT_COMPOSED) for line in tiny.splitlines()[2:])
    assert all(line.endswith("%") for line in composed.splitlines()[2:]) and len(composed.splitlines()) == 6
    sampler = next(t for t in tables if t.startswith("LM head and sampler, vocabulary 32000"))
    assert [line.split()[0] for line in sampler.splitlines()[2:]] == [
        "lm_head", "lm_head", "greedy", "greedy", "random", "random", "top_p", "top_p", "rejection", "rejection"]
    assert terms.NOT_COMPOSED not in sampler
    ragged = next(t for t in tables if "gqa-ragged" in t.splitlines()[0])
    assert "varlen        unavailable: dense: the split kernel is CUDA's" in ragged


def test_compare_on_a_gpu_shaped_point_and_on_failed_ones(dry_run, terms, tmp_path):
    """A decode point of the GPU grid is priced as compose prices it (pass + greedy sampler); a failed or
    skipped point is listed with why; a missing section is no table."""
    pytest.importorskip("sim.compose.build")
    out, _ = dry_run
    doc = json.loads((out / terms.RESULT).read_text())
    del doc["sections"]["attention"]
    doc["sections"]["decode_step"]["points"] = [
        {"model": "llama-3.1-8b", "batch": 32, "context": 1024, "kv_bytes": 1, "median_s": 8e-3, "p10_s": 8e-3,
         "p90_s": 8e-3, "samples": 10, "graph": True},
        {"model": "llama-3.1-8b", "batch": 64, "context": 1024, "error": "OutOfMemoryError: CUDA out of memory"},
        {"model": "llama-2-7b", "batch": 128, "context": 4096, "skipped": "KV cache 275.1 GB over the 60 GB limit"}]
    path = tmp_path / terms.RESULT
    path.write_text(json.dumps(doc))
    text = terms.compare(path, "h200_sxm")
    assert "decode attention" not in text
    composer = terms.Composer("h200_sxm")
    priced = composer.decode_step("llama-3.1-8b", 32, 1024)
    p = composer.pricer("llama-3.1-8b")
    assert priced == pytest.approx(float(sum(p.decode_parts(32, 1, 1024).values()) + p.verify(32, 0, "greedy")))
    assert f"{1e3 * priced:13.3f}{100 * (8e-3 / priced - 1):+9.1f}%" in text
    assert "    64     1024  error: OutOfMemoryError: CUDA out of memory" in text
    assert "   128     4096  skipped: KV cache 275.1 GB over the 60 GB limit" in text


def test_compare_without_a_measured_file_says_so_in_one_line(terms, tmp_path, capsys):
    assert terms.main(["compare", "--measured", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no measured file" in err


def test_an_interrupted_run_keeps_what_finished(terms, tmp_path, monkeypatch):
    """Ctrl-C, or the SIGTERM of a machine's timeout, stops the run with the JSON written and saying where."""
    small(terms, monkeypatch)
    calls = []
    real = terms.timed

    def interrupted(fn, plan):
        calls.append(1)
        if len(calls) == 8:  # the second point of the attention section
            raise KeyboardInterrupt
        return real(fn, plan)

    monkeypatch.setattr(terms, "timed", interrupted)
    doc = json.loads(((terms.measure(tmp_path, 150.0, dry_run=True) and tmp_path) / terms.RESULT).read_text())
    assert doc["interrupted"] is True and list(doc["sections"]) == ["sampler", "attention"]
    assert doc["sections"]["sampler"]["status"] == "done" and doc["sections"]["attention"]["status"] == "interrupted"
    assert len(timed_points(doc["sections"]["attention"])) == 1


@pytest.mark.parametrize("name, kind", [
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "gemm"),
    ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>", "attention"),
    ("void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>", "attention"),
    ("aten::_flash_attention_forward", "attention"), ("aten::linear", "gemm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "small"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel>", "small"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::OpaqueType<2u>>", "small"),
])
def test_a_kernel_is_classed_by_its_name(terms, name, kind):
    assert terms.kernel_class(name) == kind


def test_the_shipped_gpu_terms_are_a_gpu_run_with_every_section(terms):
    """benchmarks/results/gpu_step_terms.json (docs/gpu-profiles.md's tables): measured on a GPU, every section
    done, and its decode pass taken apart adds up."""
    doc = json.loads(terms.DEFAULT_MEASURED.read_text())
    assert doc["dry_run"] is False and doc["device"]["type"] == "cuda"
    # every section measured by 2026-11-28's calls (the sustained passes came after them: the next GPU's)
    assert set(terms.SECTIONS) - {"sustained"} <= doc["sections"].keys() <= set(terms.SECTIONS)
    assert all(s["status"] == "done" for s in doc["sections"].values())
    for p in doc["sections"]["kernels"]["points"]:
        assert p["kernels_s"] == pytest.approx(sum(p[f"{c}_s"] for c in terms.KERNEL_CLASSES))
        assert p["gemm_kernels"] > 0 and p["attention_kernels"] > 0 and p["small_kernels"] > p["gemm_kernels"]


def test_the_sustained_table_reads_each_window_against_calibrations_time(terms):
    state = {"sm_mhz": 1980.0, "mem_mhz": 3201.0, "power_w": 410.5, "temp_c": 61.0, "throttle": "0x0000000000000000"}
    doc = {"sections": {"sustained": {"settings": {"target": "llama-3.1-8b", "draft": "llama-3.2-1b", "rows": 16,
                                                   "query_tokens": 4, "context": 512},
                                      "points": [{"mode": "calibration", "median_s": 0.010, **state},
                                                 {"mode": "back_to_back", "median_s": 0.0102, **state},
                                                 {"mode": "steps", "windows": [
                                                     {"t_s": 2.0, "steps": 100, "target_median_s": 0.0101,
                                                      "step_median_s": 0.0161, **state},
                                                     {"t_s": 44.0, "steps": 98, "target_median_s": 0.0105,
                                                      "step_median_s": 0.0167, **state,
                                                      "throttle": "0x0000000000000004"}]}]}}}
    lines = terms.sustained_table(doc)
    assert "3 llama-3.2-1b passes, then it" in lines[1]
    assert lines[2].split()[:3] == ["calibration", "10.000", "1.000"] and "1980 MHz SM" in lines[2]
    assert lines[3].split()[:3] == ["back_to_back", "10.200", "1.020"]
    assert lines[5].split()[:4] == ["2.0", "10.100", "1.010", "16.100"] and "throttle" not in lines[5]
    assert lines[6].split()[:3] == ["44.0", "10.500", "1.050"] and "throttle 0x0000000000000004" in lines[6]
    assert terms.sustained_table({"sections": {}}) == []


def test_the_gpu_state_is_read_from_nvidia_smi_or_left_out(terms, monkeypatch):
    import subprocess

    line = "1980, 3201, 410.52, 61, 0x0000000000000000\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, line, ""))
    assert terms.gpu_state() == {"sm_mhz": 1980.0, "mem_mhz": 3201.0, "power_w": 410.52, "temp_c": 61.0,
                                 "throttle": "0x0000000000000000"}

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")
    monkeypatch.setattr(subprocess, "run", missing)
    assert terms.gpu_state() == {}
