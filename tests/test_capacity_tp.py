"""Capacity counts GPUs (issue 28): a replica of N GPUs costs N GPU-hours an hour, and tensor
parallelism is an axis of the search (``--tp 1,4``: four TP-1 replicas or one TP-4?)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from specbatch.commands.capacity.costing import costing, cost_per_million
from specbatch.commands.cli import main as cli_main

HAVE_DATA = importlib.util.find_spec("aiconfigurator_core") is not None
QUICK = ["--slo", "p99_ttft_ms=1000", "--policies", "none", "--seeds", "1", "--curve-points", "0", "--max-growth",
         "0.2", "--service-times", "10", "--min-requests", "100", "--quiet", "--jobs", "1"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_replica_of_n_gpus_costs_n_gpu_hours_an_hour():
    """Known answer: 10 req/s of 250 output tokens is 9M tokens an hour; 3 replicas of 4 GPUs at $2."""
    c = costing(max_rate=4.0, mean_output_tokens=250.0, target_rate=10.0, price=2.0, gpus_per_replica=4)
    assert c.replicas == 3 and c.fleet_cost_per_hour == pytest.approx(3 * 4 * 2.0)
    assert c.cost_per_m_at_target == pytest.approx(24.0 / 9.0)
    assert c.cost_per_m_at_max_rate == pytest.approx(cost_per_million(4.0, 250.0, 4, 2.0)) == pytest.approx(8 / 3.6)


def test_tp_as_an_axis_compares_the_profile_split_over_each_gpu_count(tmp_path, capsys):
    """The 8B pair at TP 1 and TP 4 (both shipped): the comparison says GPUs per replica and GPUs in all."""
    code, out, err = run_cli(capsys, "capacity", "--profile", "h100-llama-3.1-8b-llama-3.2-1b", "--tp", "1,4",
                             "--target-rate", "60", "--gpu-hour-price", "2", *QUICK, "--out", str(tmp_path / "c"))
    assert code == 0, err
    doc = json.loads((tmp_path / "c" / "capacity.json").read_text())
    assert doc["profile_order"] == ["h100-llama-3.1-8b-llama-3.2-1b", "h100-tp4-llama-3.1-8b-llama-3.2-1b"]
    assert doc["gpus_per_replica"] == {"h100-llama-3.1-8b-llama-3.2-1b": 1, "h100-tp4-llama-3.1-8b-llama-3.2-1b": 4}
    for name, gpus in doc["gpus_per_replica"].items():
        policy = doc["profiles"][name]["policies"]["none"]
        assert doc["profiles"][name]["gpus"] == gpus
        assert policy["fleet_cost_per_hour"] == pytest.approx(policy["replicas"] * gpus * 2.0)
    assert "GPUs / replica" in out and "GPUs for 60 req/s" in out
    report = (tmp_path / "c" / "report.md").read_text()
    assert "| GPUs / replica |" in report and "a replica of N GPUs costs N GPU-hours an hour" in report


@pytest.mark.parametrize("args, says", [
    (["--profile", "cpu-tinyllama-1.1b-llama-68m", "--tp", "2"], "is measured (a replica of 1 device(s)) and no shipped"),
    (["--profile", "h100-tp4-llama-2-70b", "--gpus-per-replica", "2"], "runs a replica on 4 GPU(s)"),
    (["--profile", "h100-tp4-llama-2-70b", "--tp", "3"], "'3' is not a tensor-parallel size"),
    (["--profile", "h100-tp4-llama-2-70b", "--tp", "4,4"], "4 is given twice")])
def test_a_split_the_search_cannot_cost_is_one_line_before_any_run(tmp_path, capsys, args, says):
    code, _, err = run_cli(capsys, "capacity", *args, *QUICK, "--out", str(tmp_path / "c"))
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "c").exists()


@pytest.mark.skipif(not HAVE_DATA, reason="composing a split needs aiconfigurator-core (the gpu-data extra)")
def test_a_split_no_profile_ships_is_composed_from_the_profiles_own_command(tmp_path, capsys, monkeypatch):
    """TP 2 of the 8B pair ships nowhere: composed from the shipped TP-1 profile's command, with its terms."""
    from specbatch.commands.capacity.parallel import variant
    from sim.costmodel.profile import load_profile

    monkeypatch.setenv("SPECBATCH_CACHE_DIR", str(tmp_path / "cache"))
    base = load_profile("h100-llama-3.1-8b-llama-3.2-1b")
    split = load_profile(variant(base, 2))
    assert split.gpus_per_replica == 2 and split.name == "h100-llama-3.1-8b-llama-3.2-1b-tp2"
    assert "--tp 2" in split.meta["command"]
    for term in ("request_latency_s", "exposed_overhead_s", "decode_overhead_s"):  # compose writes them (no carry)
        assert split.meta["engine_overhead"][term] == base.meta["engine_overhead"][term]
    assert variant(base, 1) == str(base.path) and variant(base, 4) == "h100-tp4-llama-3.1-8b-llama-3.2-1b"
