"""CUDA-graph padding in the cost model: vLLM V0 pads a decode batch to its capture sizes in
sequences, V1 in tokens, an eager engine (--enforce-eager, or a profile timed eagerly) not at all."""

from __future__ import annotations

import pytest

from sim.config import load_config
from sim.costmodel.model import graphed, v0_graph_batch_sizes
from sim.simulate import prepare
from tests.conftest import CPU_DEFAULTS

COMPOSED = "h100-llama-3.1-8b-llama-3.2-1b"


def prepared(**values):
    base = {"profile": COMPOSED, "workload.num_requests": 40, "workload.rate": 4.0, "engine.max_batch_size": 16,
            "policy.name": "fixed", "policy.k": 3}
    return prepare(load_config(CPU_DEFAULTS, {k: (v, f"--{k}") for k, v in {**base, **values}.items()}))


def test_v0_capture_sizes_are_vllms_up_to_the_first_that_holds_the_batch():
    assert v0_graph_batch_sizes(1) == (1,)
    assert v0_graph_batch_sizes(5) == (1, 2, 4, 8)
    assert v0_graph_batch_sizes(16) == (1, 2, 4, 8, 16)
    assert v0_graph_batch_sizes(256)[-3:] == (240, 248, 256) and len(v0_graph_batch_sizes(256)) == 35
    assert v0_graph_batch_sizes(1000)[-1] == 256  # beyond the largest graph a batch runs eagerly


def test_a_graphed_profile_is_a_cuda_one_not_timed_eagerly():
    assert graphed({"device": {"type": "cuda"}})  # composed: the kernels a graphed engine runs
    assert graphed({"device": {"type": "cuda"}, "timing": {"cuda_graphs": ["decode/target"]}})
    assert not graphed({"device": {"type": "cuda"}, "timing": {"cuda_graphs": []}})  # --no-cuda-graphs
    assert not graphed({"device": {"type": "cpu"}, "timing": {"cuda_graphs": []}})


@pytest.mark.parametrize("batch, padded", [(3, 4), (4, 4), (5, 8), (9, 16), (16, 16)])
def test_a_v0_decode_step_is_priced_on_its_padded_rows(batch, padded):
    run = prepared(**{"engine.scheduler": "v0"})
    c = 2 * run.table.context_step  # a tabulated column: no interpolation
    expected = run.cost_model.step_times(batch, 3, c, padded_batch=padded)
    assert run.table.decode_time(batch, 3, c) == pytest.approx(float(expected), rel=1e-12)
    if padded > batch:
        assert run.table.decode_time(batch, 3, c) > float(run.cost_model.step_times(batch, 3, c))


@pytest.mark.parametrize("scheduler", ["v0", "vllm-v1"])
def test_enforce_eager_prices_steps_unpadded(scheduler):
    run = prepared(**{"engine.scheduler": scheduler, "engine.enforce_eager": True})
    c = 2 * run.table.context_step
    assert run.table.decode_time(3, 3, c) == pytest.approx(float(run.cost_model.step_times(3, 3, c)), rel=1e-12)
    assert run.table.graph_pad is None or list(run.table.graph_pad) == [0]


def test_enforce_eager_is_written_only_when_set(tmp_path):
    from specbatch.commands.cli import main

    for flag, expect in (([], False), (["--enforce-eager"], True)):
        out = tmp_path / ("eager" if flag else "graphs")
        assert main(["run", "--num-requests", "20", "--out", str(out), "--records", "none", *flag]) == 0
        assert ("enforce_eager = true" in (out / "config.toml").read_text()) is expect
