"""``specbatch capacity --pd-ratios / --gpu-budget``: disaggregated splits beside aggregated serving.

End to end on the hand-made profile (tests/synthetic.py): each split's answer is a rate that a longer
run on fresh seeds keeps up with within the SLOs, the aggregated rows are there and compared on the
same GPUs, the report is the same bytes twice, and every impossible ask is one line before any run.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from specbatch.commands.capacity.disaggregated import Split, parse_ratios, plan_splits
from specbatch.commands.cli import main
from sim.errors import InputError

# Small and quick: 2 seeds, short runs, a loose tolerance; TTFT and TPOT both bound the answer.
ARGS = ["--scheduler", "vllm-v1", "--max-batch-size", "16", "--max-num-batched-tokens", "512",
        "--prompt-tokens", "uniform:32:256", "--output-tokens", "uniform:8:48", "--policies", "none,fixed:k=2",
        "--slo", "p99_ttft_ms=400", "--slo", "p90_tpot_ms=60", "--seeds", "2", "--min-requests", "60",
        "--service-times", "10", "--max-growth", "0.05", "--tolerance", "0.1", "--curve-points", "1",
        "--target-rate", "30", "--gpu-hour-price", "2"]
RATIOS = ["--pd-ratios", "1:1,1:2"]


@pytest.fixture(scope="module")
def report(synthetic_profile, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pd") / "report"
    assert main(["capacity", "--quiet", "--profile", str(synthetic_profile), *ARGS, *RATIOS, "--jobs", "1",
                 "--out", str(out)]) == 0
    return out


def test_each_split_s_answer_keeps_up_within_the_slos_in_a_longer_run(report, synthetic_profile):
    from sim.config import load_config
    from specbatch.commands.capacity.search import run_point

    doc = json.loads((report / "capacity.json").read_text())
    for name, (prefill, decode) in {"1P:1D": (1, 1), "1P:2D": (1, 2)}.items():
        for label, found in doc["profiles"][name]["policies"].items():
            rate = found["max_rate_req_s"]
            assert rate > 0, (name, label)
            flags = {"profile": (str(synthetic_profile), "--profile"),
                     "cluster.prefill_replicas": (prefill, "x"), "cluster.decode_replicas": (decode, "x"),
                     "engine.max_batch_size": (16, "x"), "engine.max_num_batched_tokens": (512, "x"),
                     "workload.prompt_tokens": ("uniform:32:256", "x"), "workload.output_tokens": ("uniform:8:48", "x"),
                     "policy.name": (found["policy"]["name"], "x")}
            config = load_config(None, flags)
            config = replace(config, policy=replace(config.policy, params={k: v for k, v in found["policy"].items()
                                                                           if k != "name"}))
            # four times the search's longest look, on seeds the search never ran
            n = 4 * max(p["requests_per_seed"] for p in found["points"] if p["rate_req_s"] == rate)
            run = run_point(config, rate, 11, n, 0.5)
            measured = run.ttft_s.size
            assert measured > 100
            assert np.percentile(run.ttft_s, 99) * 1e3 <= 400 * 1.1, (name, label)
            tpot = run.tpot_s[~np.isnan(run.tpot_s)]
            assert np.percentile(tpot, 90) * 1e3 <= 60 * 1.1, (name, label)
            g = run.growth  # the queue kept up: the measured window served what arrived in it
            assert g is not None and g.served >= 0.95 * g.arrived, (name, label, g.served, g.arrived)


def test_aggregated_rows_beside_each_split_on_the_same_gpus(report):
    doc = json.loads((report / "capacity.json").read_text())
    assert doc["profile_order"] == ["aggregated", "1P:1D", "1P:2D"]
    rows = doc["disaggregated"]["comparison"]
    assert [(r["split"], r["policy"]) for r in rows] == [(s, p) for s in ("1P:1D", "1P:2D")
                                                          for p in ("none", "fixed:k=2")]
    aggregated = doc["profiles"]["aggregated"]["policies"]
    for r in rows:
        assert r["gpus"] == r["prefill_replicas"] + r["decode_replicas"] == r["prefill_gpus"] + r["decode_gpus"]
        one = aggregated[r["policy"]]["max_rate_req_s"]
        assert r["aggregated_same_gpus_rate"] == pytest.approx(r["gpus"] * one)
        assert r["rate_per_gpu"] == pytest.approx(r["max_rate"] / r["gpus"])
        assert r["max_rate"] == doc["profiles"][r["split"]]["policies"][r["policy"]]["max_rate_req_s"]
        # a target of 30 req/s: whole units, each carrying at most its max rate
        assert r["gpus_for_target"] % r["gpus"] == 0 and r["gpus_for_target"] / r["gpus"] * r["max_rate"] >= 30
        assert r["aggregated_gpus_for_target"] * one >= 30
    assert doc["gpus_per_replica"] == {"aggregated": 1, "1P:1D": 2, "1P:2D": 3}
    text = (report / "report.md").read_text()
    assert "## Disaggregated against aggregated" in text and "aggregated on the same GPUs (req/s)" in text
    assert (report / "disaggregated_frontier.png").stat().st_size > 1000


def test_the_report_is_the_same_bytes_twice(report, synthetic_profile, tmp_path):
    again = tmp_path / "again"
    assert main(["capacity", "--quiet", "--profile", str(synthetic_profile), *ARGS, *RATIOS, "--jobs", "2",
                 "--out", str(again)]) == 0
    for name in ("capacity.json", "report.md", "disaggregated_frontier.png"):
        assert (again / name).read_bytes() == (report / name).read_bytes(), name


def test_the_python_api_gives_the_same_splits(report, synthetic_profile, tmp_path, monkeypatch):
    import specbatch

    flags = dict(zip(ARGS[::2], ARGS[1::2]))
    result = specbatch.capacity(profile=str(synthetic_profile), pd_ratios=["1:1", "1:2"],
                                slo=["p99_ttft_ms=400", "p90_tpot_ms=60"], policies=flags["--policies"], seeds=2,
                                min_requests=60, service_times=10.0, max_growth=0.05, tolerance=0.1, curve_points=1,
                                target_rate=30.0, gpu_hour_price=2.0, scheduler="vllm-v1", max_batch_size=16,
                                max_num_batched_tokens=512, prompt_tokens="uniform:32:256",
                                output_tokens="uniform:8:48")
    doc = json.loads((report / "capacity.json").read_text())
    assert list(result.splits.max_rate) == [r["max_rate"] for r in doc["disaggregated"]["comparison"]]
    assert set(result.table.profile) == {"aggregated", "1P:1D", "1P:2D"}
    # the same report, figures and all; without matplotlib none, and it says so where the frontier would be
    result.result.write(tmp_path / "api")
    assert (tmp_path / "api" / "capacity.json").read_bytes() == (report / "capacity.json").read_bytes()
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    result.result.write(tmp_path / "plain")
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["capacity.json", "report.html", "report.md"]
    text = (tmp_path / "plain" / "report.md").read_text()
    assert "## Disaggregated against aggregated" in text and "No figures: matplotlib is not installed" in text


def test_ratios_and_budgets():
    assert parse_ratios("1:1, 1:2,2:3") == ((1, 1), (1, 2), (2, 3))
    assert [s.name for s in plan_splits(None, 4, 1, 1)] == ["1P:3D", "2P:2D", "3P:1D"]
    assert [s.name for s in plan_splits("1:1,1:3", 8, 1, 1)] == ["4P:4D", "2P:6D"]
    assert plan_splits("1:2", None, 2, 1) == (Split(1, 2, 2, 1),) and Split(1, 2, 2, 1).gpus == 4
    assert [s.name for s in plan_splits(None, 6, 2, 2)] == ["1P:2D", "2P:1D"]


@pytest.mark.parametrize("args, says", [
    (["--pd-ratios", "1:0"], "--pd-ratios: '1:0' has no decode replica"),
    (["--pd-ratios", "0:2"], "--pd-ratios: '0:2' has no prefill replica"),
    (["--pd-ratios", "1-2"], "--pd-ratios: '1-2' is not PREFILL:DECODE replicas"),
    (["--pd-ratios", "1:2,1:2"], "--pd-ratios: 1:2 is given twice"),
    (["--gpu-budget", "1"], "--gpu-budget: disaggregated serving needs at least 2 GPUs"),
    (["--pd-ratios", "2:3", "--gpu-budget", "4"], "--gpu-budget: 2:3 takes 5 GPUs, more than the budget of 4"),
    (["--pd-ratios", "1:1", "--scheduler", "v0"], "--scheduler: disaggregated serving runs under --scheduler vllm-v1"),
    (["--decode-profile", "x"], "--decode-profile: applies only to disaggregated serving"),
    (["--kv-link", "nvlink"], "--kv-link: applies only to disaggregated serving"),
    (["--pd-ratios", "1:1", "--tp", "1,2"], "--pd-ratios: compares splits of one profile"),
    (["--prefill-profile", "x"], "--prefill-profile: applies only to disaggregated serving"),
    (["--pd-threshold", "100"], "--pd-threshold: applies only to disaggregated serving"),
])
def test_impossible_asks_are_one_line_before_any_run(args, says, synthetic_profile, tmp_path, capsys, monkeypatch):
    import specbatch.commands.capacity.search as search

    monkeypatch.setattr(search, "search_capacity", lambda *a, **k: pytest.fail("the search ran"))
    out = tmp_path / "report"
    code = main(["capacity", "--quiet", "--profile", str(synthetic_profile), "--slo", "p99_ttft_ms=400",
                 "--out", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2 and says in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_scenario_s_own_pools_are_refused_for_the_aggregated_side(synthetic_profile, tmp_path, capsys):
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'profile = "{synthetic_profile}"\n\n[cluster]\nprefill_replicas = 1\ndecode_replicas = 2\n')
    for extra in ([], ["--pd-ratios", "1:1"]):
        code = main(["capacity", "--quiet", "--config", str(scenario), "--slo", "p99_ttft_ms=400", *extra])
        err = capsys.readouterr().err
        assert code == 2 and f"{scenario}:4: cluster.prefill_replicas: a capacity search sizes disaggregated " \
                              "serving with --pd-ratios" in err and err.count("\n") == 1, err


def test_plan_splits_refuses_before_building_anything():
    with pytest.raises(InputError, match="no split of whole replicas"):
        plan_splits(None, 5, 2, 2)


@pytest.mark.slow
def test_the_committed_pd_example_is_what_the_code_gives_today():
    """One split's search of docs/capacity-pd-example (docs/capacity_examples.py) again: the same rates,
    verdicts, run lengths and max rate, or the committed report (and the docs' table read from it) is stale."""
    import sys

    from specbatch.commands.capacity.search import search_capacity
    from tests.conftest import load_script

    examples = load_script("docs/capacity_examples.py", "capacity_examples_pd")
    try:
        plan = examples.plan("pd")
    finally:
        sys.modules.pop("capacity_examples_pd", None)
    label = next(label for label, (name, policy) in plan.members.items() if (name, policy) == ("1P:2D", "none"))
    settings = replace(plan.inputs.settings, curve_points=0)
    fresh = search_capacity({label: plan.configs[label]}, plan.inputs.slos, settings, jobs=1)[label]
    folder = Path(examples.ROOT) / examples.EXAMPLES["pd"][0]
    old = json.loads((folder / "capacity.json").read_text())["profiles"]["1P:2D"]["policies"]["none"]
    searched = [(p["rate_req_s"], p["verdict"], p["requests_per_seed"]) for p in old["points"] if not p["curve_point"]]
    again = [(rate, p.verdict, p.requests) for rate, p in fresh.points.items()]
    stale = "docs/capacity-pd-example is stale: run python docs/capacity_examples.py pd && python docs/generate.py " \
            "--only docs/capacity.md"
    assert [v for _, v, _ in again] == [v for _, v, _ in searched], stale
    assert [n for _, _, n in again] == [n for _, _, n in searched], stale
    assert [r for r, _, _ in again] == pytest.approx([r for r, _, _ in searched], rel=1e-9), stale
    assert fresh.max_rate == pytest.approx(old["max_rate_req_s"], rel=1e-9), stale


def test_the_prefill_pool_on_its_own_profile(synthetic_profile, tmp_path):
    """--prefill-profile: each split's prefill pool runs on it, its decode pool and the aggregated replica on
    --profile (or the decode pool on --decode-profile); a profile of other models is one line before any run."""
    from specbatch.commands.capacity.cli import plan_capacity
    from tests.synthetic import linear_latency, make_profile

    faster = make_profile(tmp_path / "faster", lambda *point: 0.5 * linear_latency(*point))
    flags = {"profile": (str(synthetic_profile), "--profile"), "engine.scheduler": ("vllm-v1", "--scheduler")}
    plan = plan_capacity(None, flags, slos=["p99_ttft_ms=400"], policies="none", pd_ratios="1:2",
                         prefill_profile=str(faster), gpu_hour_price=2.0)
    split, aggregated = plan.configs["1P:2D / none"], plan.configs["aggregated / none"]
    assert split.profile == str(faster) and split.cluster.decode_profile == str(synthetic_profile)
    assert aggregated.profile == str(synthetic_profile) and aggregated.cluster.prefill_replicas == 0
    assert plan.inputs.splits.prefill_profile == str(faster)
    decode_too = plan_capacity(None, {**flags, "cluster.decode_profile": (str(faster), "--decode-profile")},
                               slos=["p99_ttft_ms=400"], policies="none", pd_ratios="1:2", prefill_profile=str(faster),
                               gpu_hour_price=2.0)
    assert decode_too.configs["1P:2D / none"].cluster.decode_profile == str(faster)
    other = make_profile(tmp_path / "other", label="other")
    with pytest.raises(InputError) as caught:
        plan_capacity(None, flags, slos=["p99_ttft_ms=400"], policies="none", pd_ratios="1:2",
                      prefill_profile=str(other), gpu_hour_price=2.0)
    assert "same models" in str(caught.value) and "\n" not in str(caught.value)
