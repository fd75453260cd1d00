"""Model configs, grid defaults and overrides, timer statistics (no torch needed except the last)."""

from __future__ import annotations

import pytest

from calibrate.configs import get_config, known_models, param_count
from calibrate.grid import CPU_BATCHES, CUDA_BATCHES, default_grid
from calibrate.timing import Measurement, TimerConfig, _repeat, time_cpu
from sim.errors import InputError


@pytest.mark.parametrize("name, params_m", [
    ("opt-125m", 125.2), ("opt-1.3b", 1315.8), ("opt-6.7b", 6658.5), ("opt-13b", 12853.5),
    ("llama-68m", 68.0), ("llama-160m", 162.4), ("tinyllama-1.1b", 1100.0), ("llama-2-7b", 6738.4),
    ("llama-3.2-1b", 1235.8), ("llama-3.1-8b", 8030.3),
])
def test_published_shapes_give_published_sizes(name: str, params_m: float) -> None:
    assert param_count(get_config(name)) / 1e6 == pytest.approx(params_m, abs=0.1)


def test_unknown_model_names_the_field_and_lists_known_names() -> None:
    with pytest.raises(InputError) as err:
        get_config("gpt-5", field="draft")
    assert err.value.field == "draft" and "tinyllama-1.1b" in str(err.value)
    assert {"tiny-opt", "tiny-llama"} <= set(known_models())


def test_cpu_defaults() -> None:
    grid = default_grid("cpu", 2048)
    assert grid.batch_sizes == CPU_BATCHES and grid.query_tokens == tuple(range(1, 9)) and grid.k_max == 7
    assert grid.contexts == (128, 512, 1024) and grid.prompts == (32, 128, 512)
    points = grid.points()
    assert all(p.batch_size * p.query_tokens <= grid.max_prefill_tokens for p in points if p.phase == "prefill")
    phases = {(p.phase, p.model) for p in points}
    assert phases == {("prefill", "target"), ("prefill", "draft"), ("decode", "draft"), ("decode", "target"),
                      ("verify", "target")}
    assert {p.query_tokens for p in points if p.phase == "verify"} == set(range(8))
    draft_q = {p.query_tokens for p in points if (p.phase, p.model) == ("decode", "draft")}
    assert draft_q == {1, 2, 3}  # a draft step, and its catch-up passes
    assert len({p.key for p in points}) == len(points)
    assert grid.to_dict()["k_max"] == 7


def test_cuda_defaults_follow_the_model_length() -> None:
    grid = default_grid("cuda", 2048)
    assert grid.batch_sizes == CUDA_BATCHES and grid.k_max == 8
    assert grid.contexts == (128, 256, 512, 1024, 2039) and grid.prompts[-1] == 2048
    long = default_grid("cuda", 131072)
    assert long.contexts[-2:] == (65536, 131063) and long.prompts[-1] == 4096


def test_overrides_and_errors() -> None:
    grid = default_grid("cpu", 2048, batch_sizes=[4, 1, 4], k_max=2, contexts=None, repeats=5)
    assert grid.batch_sizes == (1, 4) and grid.query_tokens == (1, 2, 3) and grid.repeats == 5
    with pytest.raises(InputError, match="contexts"):
        default_grid("cpu", 2048, contexts=[2045])
    with pytest.raises(InputError) as err:
        default_grid("cpu", 2048, batch_sizes=[0, 2])
    assert err.value.field == "batch_sizes"
    with pytest.raises(InputError):
        default_grid("cpu", 2048, k_max=3, query_tokens=[1, 2])
    with pytest.raises(InputError):
        default_grid("cpu", 256, prompts=[512])


def test_timer_statistics_and_budget() -> None:
    m = Measurement((0.3, 0.1, 0.2))
    s = m.stats()
    assert s["samples"] == 3 and s["latency_median_s"] == pytest.approx(0.2)
    assert s["latency_min_s"] == pytest.approx(0.1) and s["latency_std_s"] == pytest.approx(0.1)
    assert s["latency_p10_s"] <= s["latency_median_s"] <= s["latency_p90_s"]
    calls = []
    assert _repeat(lambda: calls.append(1) or 0.01, TimerConfig(warmup=2, repeats=4, budget_s=10)) == (0.01,) * 4
    assert len(calls) == 6
    calls.clear()
    long = _repeat(lambda: calls.append(1) or 5.0, TimerConfig(warmup=3, repeats=4, budget_s=2))
    assert long == (5.0,) and len(calls) == 2  # one warm-up and one sample once the budget is spent


def test_time_cpu_counts_samples() -> None:
    m = time_cpu(lambda: sum(range(1000)), TimerConfig(warmup=1, repeats=3))
    assert len(m.samples) == 3 and all(s > 0 for s in m.samples) and not m.graph
