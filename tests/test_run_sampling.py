"""The sampling a run's requests ask for, priced at run time (issue 40: a profile prices every sampling).

A composed profile holds verify points for each sampler path (greedy, random, top-p: sim/compose/sampler.py);
``workload.sampling`` (``--sampling``, or vllm bench serve's ``--temperature/--top-p/--top-k/--min-p``) picks
the one a run prices, the profile's own (``verify / target``) where nothing is asked.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.compose.sampler import sampling_of
from sim.config import load_config
from sim.costmodel.model import CostModel
from sim.costmodel.profile import SAMPLERS, load_profile
from specbatch.commands.cli import main as cli_main
from tests.conftest import CPU_DEFAULTS

DEFAULT = "h100-llama-3.1-8b-llama-3.2-1b"
SMALL = ["--num-requests", "300", "--rate", "18", "--seed", "3"]


def run(capsys, tmp_path, name: str, *argv: str) -> tuple[int, dict, str]:
    out = tmp_path / name
    code = cli_main(["run", *argv, "--out", str(out)])
    _, err = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    return code, summary.get("metrics", {}), err


@pytest.mark.parametrize("params, mode", [
    ({}, "greedy"),  # vllm bench serve sends temperature 0 unless given one
    ({"top_p": 0.9}, "greedy"),  # ... so a top-p alone is unused: vLLM samples greedily
    ({"temperature": 0.0, "top_k": 20}, "greedy"),
    ({"temperature": 1e-6}, "greedy"),  # under vLLM's _SAMPLING_EPS
    ({"temperature": 0.6}, "random"),
    ({"temperature": 0.6, "top_p": 1.0, "top_k": -1, "min_p": 0.1}, "random"),  # no filter that sorts
    ({"temperature": 0.6, "top_p": 0.9}, "top-p"),  # Llama 3's generation_config.json
    ({"temperature": 0.6, "top_k": 20}, "top-p"),  # top-k alone: priced as the sort (an upper bound)
])
def test_request_parameters_pick_the_sampler_path_vllm_runs(params, mode):
    assert sampling_of(params.pop("temperature", None), **params) == mode


def test_a_composed_profile_prices_every_sampling_and_top_p_costs_most(capsys, tmp_path):
    profile = load_profile(DEFAULT)
    assert profile.sampling == "greedy" and profile.samplings() == list(SAMPLERS)
    times = {}
    for mode in SAMPLERS:
        code, summary, err = run(capsys, tmp_path, mode, "--profile", DEFAULT, *SMALL, "--sampling", mode)
        assert code == 0, err
        times[mode] = summary["mean_tpot_ms"]
    code, own, err = run(capsys, tmp_path, "own", "--profile", DEFAULT, *SMALL)
    assert code == 0, err
    assert own["mean_tpot_ms"] == times["greedy"]  # the profile's own sampling, asked or not
    assert times["greedy"] < times["random"] < times["top-p"]
    assert 'sampling = "top-p"' in (tmp_path / "top-p" / "config.toml").read_text()
    assert "sampling" not in (tmp_path / "own" / "config.toml").read_text()  # nothing asked, nothing recorded
    assert cli_main(["profiles", DEFAULT]) == 0
    assert "sampling     greedy (its verify / target points); --sampling random, top-p priced too" in \
        capsys.readouterr().out


def test_the_verify_curve_a_run_prices_is_the_profile_s_points_for_its_sampling():
    profile = load_profile(DEFAULT)
    model = CostModel(profile)
    for mode in SAMPLERS:
        points = profile.phase("verify", mode)
        priced = model.with_sampling(mode)
        assert priced.sampling == mode
        got = priced.verify(batch_size=points.batch_size.to_numpy(float), query_tokens=points.query_tokens.to_numpy(float))
        assert got == pytest.approx(points.latency_median_s.to_numpy(), rel=1e-9)
    assert model.with_sampling("greedy") is model
    # the fit cache's round trip keeps every sampling
    again = CostModel.from_state(profile, model.state())
    b, k = np.array([1.0, 32.0, 256.0]), np.array([0.0, 3.0, 5.0])
    for mode in SAMPLERS:
        assert np.array_equal(again.with_sampling(mode).verify(batch_size=b, query_tokens=k),
                              model.with_sampling(mode).verify(batch_size=b, query_tokens=k))


def test_a_profile_s_own_sampling_is_what_it_prices_without_asking(capsys, tmp_path):
    """The Llama-2-70b profile was composed at top-p (its real runs' sampling): asking for it changes nothing."""
    name = "h100-tp4-llama-2-70b"
    assert load_profile(name).sampling == "top-p"
    base = ["--profile", name, "--policy", "none", *SMALL, "--rate", "4"]
    _, own, _ = run(capsys, tmp_path, "own", *base)
    _, asked, _ = run(capsys, tmp_path, "asked", *base, "--sampling", "top-p")
    _, greedy, _ = run(capsys, tmp_path, "greedy", *base, "--sampling", "greedy")
    assert own["mean_tpot_ms"] == asked["mean_tpot_ms"] and greedy["mean_tpot_ms"] < own["mean_tpot_ms"]


def test_vllm_bench_serve_s_sampling_flags_are_the_sampling_they_ask_for(capsys, tmp_path):
    assert cli_main(["run", "--profile", DEFAULT, *SMALL, "--temperature", "0.6", "--records", "none",
                     "--out", str(tmp_path / "printed")]) == 0
    assert [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("Sampling:")] == \
        [["Sampling:", "random"]]
    _, flags, err = run(capsys, tmp_path, "flags", "--profile", DEFAULT, *SMALL, "--temperature", "0.6", "--top-p", "0.9")
    _, named, _ = run(capsys, tmp_path, "named", "--profile", DEFAULT, *SMALL, "--sampling", "top-p")
    assert flags["mean_tpot_ms"] == named["mean_tpot_ms"], err
    _, unused, _ = run(capsys, tmp_path, "unused", "--profile", DEFAULT, *SMALL, "--top-p", "0.9")
    _, greedy, _ = run(capsys, tmp_path, "greedy", "--profile", DEFAULT, *SMALL)
    assert unused["mean_tpot_ms"] == greedy["mean_tpot_ms"]  # temperature 0: the top-p is not applied


def test_a_profile_without_points_for_the_sampling_is_one_line_before_any_work(capsys, tmp_path):
    out = tmp_path / "never"
    code = cli_main(["run", "--config", str(CPU_DEFAULTS), "--num-requests", "5", "--sampling", "top-p",
                     "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "workload.sampling" in err and "prices only greedy" in err and "--sampling top-p" in err
    assert not out.exists()


def test_a_bad_sampling_in_a_config_names_the_file_and_line(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[workload]\nrate = 2.0\nsampling = "nucleus"\n')
    with pytest.raises(Exception) as info:
        load_config(config, {})
    text = str(info.value)
    assert "workload.sampling" in text and "c.toml:3" in text and "nucleus" in text


def test_the_api_takes_vllm_s_sampling_names():
    import specbatch

    result = specbatch.run(profile=DEFAULT, num_requests=40, temperature=0.6, top_p=0.9, records="none")
    assert result.config.workload.sampling == "top-p"
    result = specbatch.run(profile=DEFAULT, num_requests=40, sampling="random", records="none")
    assert result.config.workload.sampling == "random"


def test_capacity_searches_at_the_sampling_asked_for():
    """Capacity's runs are the scenario's: its --sampling reaches every one of them."""
    import argparse

    from specbatch.commands.capacity.cli import add_arguments, scenario_flags
    from specbatch.commands.capacity.inputs import base_config
    from specbatch.commands.flags import run_overrides

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--sampling", "top-p", "--slo", "p99_ttft_ms=1000"])
    assert base_config(None, run_overrides(args, scenario_flags())).workload.sampling == "top-p"
