"""specbatch validate's parts against real replays of tiny models on the CPU (seconds each)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from calibrate.cli import main as calibrate_main
from calibrate.replay import replay_config, step_overheads
from specbatch.commands.cli import main
from specbatch.commands.fidelity import logic_check
from tests.test_replay import TINY_GRID, scenario

FLAGS = ["--num-requests", "12", "--rate", "30", "--prompt-tokens", "uniform:4:24", "--output-tokens",
         "uniform:2:20", "--max-batch-size", "4", "--alpha", "0.7"]


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("validation") / "tiny"
    assert calibrate_main(["--target", "tiny-llama", "--draft", "tiny-llama", "--out", str(out), *TINY_GRID]) == 0
    return out


def test_validate_repeat_reports_noise_floor_logic_and_step_costs(tiny_profile, tmp_path, capsys):
    out = tmp_path / "val"
    code = main(["validate", "--profile", str(tiny_profile), *FLAGS, "--policy", "fixed", "--k", "2",
                 "--repeat", "2", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    for text in ("x 2 replays", "real CV", "speed-corrected", "TOST", "cost model per step", "scheduling logic"):
        assert text in printed
    doc = json.loads((out / "validation.json").read_text())
    assert doc["repeats"] == 2 and len(doc["replays"]) == 2
    floor = {r["metric"]: r for r in doc["noise_floor"]}
    assert floor["mean_e2el_ms"]["repeats"] == 2 and floor["mean_e2el_ms"]["cv"] >= 0
    reals = [json.loads((out / folder / "summary.json").read_text())["metrics"] for folder in ("real", "real-2")]
    values = [r["mean_e2el_ms"] for r in reals]
    assert floor["mean_e2el_ms"]["min"] == pytest.approx(min(values))
    assert floor["mean_e2el_ms"]["range"] == pytest.approx((max(values) - min(values)) / np.mean(values))
    # Pooled: the real mean E2EL is over the 24 requests of both replays.
    rows = {r["metric"]: r for r in doc["metrics"]}
    pooled = pd.concat([pd.read_csv(out / f / "requests.csv") for f in ("real", "real-2")])
    assert rows["mean_e2el_ms"]["real"] == pytest.approx(1e3 * pooled.e2el_s.mean())
    assert {t["latency"] for t in doc["ks_tests_corrected"]} == {"E2EL", "TTFT", "TPOT"}
    assert doc["tost"]["raw"]["n_pairs"] == 24 and "equivalent" in doc["tost"]["speed_corrected"]
    logic = doc["logic"]
    assert logic["reproduced"] and logic["passed"], logic
    assert logic["e2el"]["max_abs_residual"] <= 1e-9 and logic["e2el"]["overhead_term"] >= 0
    costs = pd.read_csv(out / "step_costs.csv")
    steps = sum(len(pd.read_csv(out / f / "steps.csv")) for f in ("real", "real-2"))
    assert len(costs) == steps and set(costs.replay) == {1, 2}
    groups = [r["group"] for r in doc["step_cost"]]
    assert groups[0] == "prefill" and "decode k=2" in groups and groups[-1] == "all steps"
    assert all(r["median_ape"] >= 0 for r in doc["step_cost"])
    assert len(doc["drift"]) == 2 and len(doc["drift"][0]["speed_ratio"]) == 8
    for figure in ("latency_cdf.png", "step_cost.png"):
        assert (out / figure).stat().st_size > 0


@pytest.mark.parametrize("batching,policy", [("static", "goodput"), ("continuous", "none")])
def test_the_loop_reproduces_a_real_replay_from_its_measured_steps(tiny_profile, batching, policy):
    real, measured = replay_config(scenario(tiny_profile, **{"engine.batching": batching, "policy.name": policy,
                                                             "workload.num_requests": 14, "workload.rate": 60.0}))
    logic = logic_check(real, measured)
    assert logic["reproduced"] and logic["passed"], logic
    # The simulated timeline is the replay's plus the engine's work between steps, nothing else.
    assert logic["ttft"]["max_abs_residual"] <= 1e-9
    assert logic["between_steps_ms"]["total_s"] >= 0


def test_calibrated_overhead_charges_the_time_between_steps(tiny_profile):
    _, measured = replay_config(scenario(tiny_profile, **{"policy.name": "fixed", "policy.k": 2}))
    out = step_overheads(measured)
    steps = measured.steps
    decode = steps.phase.to_numpy() == 1
    inside = ((steps.end_s - steps.start_s).to_numpy() - measured.step_passes_s)[decode]
    between = (measured.recorded_steps().until_s - steps.end_s.to_numpy())[decode]
    assert out["decode_between_steps_s"] == pytest.approx(between.mean()) and between.min() >= 0
    assert out["decode_overhead_s"] == pytest.approx(np.median(inside) + between.mean())


def test_repeat_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--repeat", "0"])
    assert "--repeat: must be a whole number >= 1" in capsys.readouterr().err


def test_python_api_validate_returns_the_document(tiny_profile, tmp_path):
    import specbatch

    doc = specbatch.validate(profile=str(tiny_profile), num_requests=8, rate=30.0, prompt_tokens="uniform:4:24",
                             output_tokens="uniform:2:12", max_batch_size=4, policy="fixed", k=2, repeat=2,
                             out=str(tmp_path / "api"))
    assert doc["repeats"] == 2 and doc["logic"]["passed"] and "scheduling logic" in doc["report"]
    assert json.loads((tmp_path / "api" / "validation.json").read_text())["noise_floor"] == doc["noise_floor"]
    with pytest.raises(specbatch.InputError, match="repeat"):
        specbatch.validate(profile=str(tiny_profile), repeat=0)
