"""Fidelity against real vLLM cannot silently regress: two minutes of a measured H100 run, its error bounded.

The file is requests 570-690 s into the BLIS project's real vLLM 0.15.1 run of Llama-2-7b on
one H100 SXM (general traffic: the last 30 s of the 8 req/s stage, the first 90 s of the
20 req/s one; ../shared/validation/vllm-h100, llama-2-7b-tp1-general): arrivals, lengths,
prompt ids (100 fixed prompts in turn) and the measured TTFT and E2E. It is simulated with
the run's own engine settings on the shipped composed profile, as benchmarks/real_vllm.py
does for the whole runs (docs/validation.md, "Against real vLLM on H100"). The bounds are
what the model reaches today with a margin: a change that makes it worse fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specbatch.commands.compare import compare_measured
from tests.conftest import load_script

WINDOW = Path(__file__).parent / "baselines" / "scenarios" / "vllm-h100-llama-2-7b-general.csv"
SETTINGS = {"profile": "h100-llama-2-7b-llama-68m", "policy.name": "none", "engine.scheduler": "vllm-v1",
            "engine.max_batch_size": 128, "engine.max_num_batched_tokens": 2048, "engine.block_size": 16,
            "engine.kv_cache_tokens": 7462 * 16, "engine.chunked_prefill": True}
# (metric, statistic): largest |relative error| allowed in each stage (mean E2E and ITL within 3.1% when
# the profile's terms were fitted to this model's runs, p99 E2E 9.8% (the window's first 30 s hold few
# requests); mean TTFT 25% since the frontend's latency is fitted on every dev model (10.4 ms) rather
# than on Llama-2-7b's runs alone (7.1 ms): a 25 ms TTFT moves by the difference, docs/validation.md)
BOUNDS = {("e2e", "mean"): 0.05, ("itl", "mean"): 0.05, ("e2e", "p99"): 0.12, ("ttft", "mean"): 0.32}


def test_two_minutes_of_a_real_h100_run_within_bounds():
    overrides = {key: (value, "test") for key, value in SETTINGS.items()}
    overrides["engine.enable_prefix_caching"] = (True, "test")
    comparison = compare_measured(WINDOW, None, overrides)
    assert list(comparison.stages.stage) == [0, 1] and comparison.stages.requests.sum() == 1952
    assert not comparison.stages.real_saturated.any()
    assert not comparison.stages.sim_saturated.any(), "the simulation falls behind where the real engine kept up"
    for (metric, stat), bound in BOUNDS.items():
        errors = comparison.error(metric, stat)
        assert errors.abs().max() <= bound, f"{stat} {metric}: {errors.to_dict()} beyond +-{bound:.0%}"


def test_the_window_simulates_request_for_request_with_the_runs_settings():
    """What the bounded test runs, checked without prefix caching: the same requests, in order, every stage."""
    overrides = {key: (value, "test") for key, value in SETTINGS.items()}
    comparison = compare_measured(WINDOW, None, overrides)
    samples = comparison.samples
    assert len(samples) == 1952 and samples.ok.all() and samples.real_ttft.notna().all()
    assert (samples.sim_e2e > samples.sim_ttft).all()
    assert comparison.result.config.engine.kv_cache_tokens == 119392


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/real_vllm.py", "real_vllm_bench")


RUN_7B = {"run": "llama-2-7b-tp1-general", "gpu": "H100-SXM-80GB", "tensor_parallel_size": 1,
          "model_config": {"hidden_dim": 4096, "intermediate_dim": 11008, "num_layers": 32, "num_heads": 32,
                           "num_kv_heads": 32, "vocab_size": 32000},
          "max_num_seqs": 128, "max_num_batched_tokens": 2048, "block_size": 16, "gpu_kv_blocks": 7462,
          "chunked_prefill": True, "prefix_caching": True}


def test_the_benchmark_simulates_a_run_on_the_profile_of_its_model_gpu_and_tp_size(bench):
    import json

    from sim.costmodel.profile import resolve_profile_path, shipped_profiles

    profiles = {n: json.loads((resolve_profile_path(n) / "profile.json").read_text()) for n in shipped_profiles()}
    assert bench.covering_profile(RUN_7B, profiles) == "h100-llama-2-7b-llama-68m"
    assert bench.covering_profile({**RUN_7B, "tensor_parallel_size": 4}, profiles) is None
    assert bench.covering_profile({**RUN_7B, "gpu": "A100-SXM-80GB"}, profiles) is None
    seventy = {**RUN_7B, "model_config": {**RUN_7B["model_config"], "hidden_dim": 8192, "num_layers": 80}}
    assert bench.covering_profile(seventy, profiles) is None
    settings = {k: v for k, (v, _) in bench.run_overrides(RUN_7B, "p").items()}
    assert settings["engine.kv_cache_tokens"] == 119392 and settings["engine.max_batch_size"] == 128
    assert settings["engine.scheduler"] == "vllm-v1" and settings["profile"] == "p"
    assert settings.get("engine.enable_prefix_caching", True) is True


def test_the_summary_is_the_median_over_stages_the_real_engine_kept_up_with(bench):
    def stage(name, kept, errors, sim_kept=True):
        table = [{"stage": name, "metric": m, "stat": s, "rel_error": errors.get((m, s), 0.0)}
                 for m in ("ttft", "itl", "e2e") for s in ("mean", "p50", "p90", "p99")]
        return {"stage": name, "real_saturated": not kept, "sim_saturated": not sim_kept, "rate_rps": 1.0}, table

    runs = []
    for run, cases in (("a", [(0, True, 0.01), (1, True, -0.05)]), ("b", [(0, True, 0.02), (1, False, 9.0)])):
        stages, table = [], []
        for name, kept, e in cases:
            row, rows = stage(name, kept, {("e2e", "mean"): e}, sim_kept=name == 0)
            stages.append(row)
            table += rows
        runs.append({"run": run, "stages": stages, "table": table})
    summary = bench.summarize({"runs": runs})
    assert summary["stages_judged"] == 3  # b's overloaded stage is not judged
    assert summary["median_abs_error"]["mean_e2e"] == pytest.approx(0.02)
    assert summary["sim_fell_behind_where_real_kept_up"] == ["a stage 1"]


def test_the_frontend_latency_is_fitted_in_closed_form_and_the_step_time_on_the_grid():
    from specbatch.commands.fit import best_latency, fit_on_grid, shifted_error

    # two stages 10 ms short on TTFT and E2E: a 10 ms latency closes both, ITL is untouched by it
    rows = [{"metric": m, "stat": "mean", "real": real, "sim": real - 0.010} for m, real in (("ttft", 0.05), ("e2e", 2.0))]
    assert best_latency(rows) == pytest.approx(0.010)
    assert shifted_error(0.008, 0.0076, "itl", 0.010) == pytest.approx(-0.05)
    assert shifted_error(0.05, 0.04, "ttft", 0.010) == pytest.approx(0.0)
    # ITL 5% short at no exposed time, exact at 0.4 ms: the grid value 0.4 ms wins
    grid = {e: rows + [{"metric": "itl", "stat": "mean", "real": 0.008, "sim": 0.0076 + e}] for e in (0.0, 2e-4, 4e-4)}
    terms, rms = fit_on_grid(grid)
    assert terms == {"exposed_overhead_s": 4e-4, "request_latency_s": pytest.approx(0.010)} and rms < 1e-9


def test_leaving_one_model_out_never_fits_on_the_model_it_scores(bench):
    rows = {run: {e: [{"stage": 0, "metric": "itl", "stat": "mean", "real": 0.01, "sim": 0.01 * (1 - bias) + e}]
                  for e in bench.EXPOSED_GRID_S}
            for run, bias in (("a1", 0.02), ("a2", 0.02), ("b1", 0.08), ("c1", 0.05))}
    model_of = {"a1": "a", "a2": "a", "b1": "b", "c1": "c"}
    folds = bench.leave_one_model_out(rows, model_of, ("exposed_overhead_s",))
    assert folds["a"]["fitted_on"] == ["b", "c"] and folds["b"]["fitted_on"] == ["a", "c"]
    # the step time b's runs want (0.8 ms) is never what b is scored with
    assert folds["b"]["terms"]["exposed_overhead_s"] < 8e-4
    none = bench.leave_one_model_out(rows, model_of, ())
    assert all(f["terms"] == {} for f in none.values())
    assert bench.held_out_rms(rows, model_of, folds) < bench.held_out_rms(rows, model_of, none)


def test_every_dev_run_is_simulated_or_listed_with_the_reason(bench, tmp_path):
    gpus = ["a100_sxm", "h100_sxm", "h100_pcie", "rtx_pro_6000_server", "l40s"]
    assert bench.data_gpu("H100-SXM-80GB", gpus) == "h100_sxm"
    assert bench.data_gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", gpus) == "rtx_pro_6000_server"
    assert bench.data_gpu("NVIDIA GeForce RTX 4090", gpus) is None
    # torch's device names, SXM4, and a name without a form factor: the data's one GPU of that family
    assert bench.data_gpu("NVIDIA H100 80GB HBM3", gpus) == "h100_sxm"
    assert bench.data_gpu("NVIDIA A100-SXM4-80GB", gpus) == "a100_sxm"
    assert bench.data_gpu("NVIDIA A100 80GB PCIe", gpus) is None  # a form factor the data does not have
    dp = {"run": "x", "model": "Qwen/Qwen3-30B-A3B", "gpu": "NVIDIA RTX PRO 6000", "tensor_parallel_size": 1,
          "data_parallel_size": 2, "enable_expert_parallel": True}
    profile, reason = bench.compose_for(dp, tmp_path)
    assert profile is None and "data parallelism (2 ranks with expert parallelism) is not simulated" in reason
    assert "\n" not in reason and not any(tmp_path.iterdir())
    run = bench.normalise({"run": "y", "max_num_seqs": 256, "max_num_batched_tokens": 2048, "block_size": None,
                           "gpu_kv_blocks": None, "enable_prefix_caching": None}, tmp_path)
    settings = {k: v for k, (v, _) in bench.run_overrides(run, "p").items()}
    assert settings["engine.block_size"] == 16 and "engine.kv_cache_tokens" not in settings
    assert settings["engine.chunked_prefill"] is True and settings.get("engine.enable_prefix_caching", True) is True


def test_a_data_folder_without_runs_is_one_line_before_any_work(bench, tmp_path, capsys):
    results = tmp_path / "r.json"
    assert bench.main(["--data", str(tmp_path), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--data" in err and "runs.json" in err
    assert not results.exists()
