"""benchmarks/replay_attention_term.py: the replay's dense-attention and host-latency terms, from
the H100 validation's shipped records (no GPU, no torch model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "results" / "validation-gpu-h100-records"
PROBE = ROOT / "benchmarks" / "results" / "replay_pass_probe-h100-graphs.txt"


@pytest.fixture(scope="module")
def term():
    return load_script("benchmarks/replay_attention_term.py", "replay_attention_term")


def test_step_contexts_interpolate_each_running_request(term):
    requests = pd.DataFrame({"first_token_s": [0.0, 1.0], "finish_s": [2.0, 3.0], "prompt_tokens": [100, 10],
                             "output_tokens": [20, 40]})
    steps = pd.DataFrame({"start_s": [0.5, 1.5, 2.5, 5.0]})
    mean, longest = term.step_contexts(requests, steps)
    # t = 0.5: only the first, a quarter through (105); t = 1.5: 115 and 10 + 40 / 4 = 20; t = 2.5: the second alone
    assert mean[:3] == pytest.approx([105.0, 67.5, 40.0]) and longest[:3] == pytest.approx([105.0, 115.0, 40.0])
    assert np.isnan(mean[3]) and longest[3] == 0.0  # nobody running


def test_the_shipped_records_split_the_replays_speed_into_its_two_terms(term):
    from sim.costmodel.model import CostModel
    from sim.costmodel.profile import load_profile

    model = CostModel(load_profile("h100-graphs-llama-3.1-8b-llama-3.2-1b"))
    per_pass = term.probe_latency(PROBE, model)
    assert 0 < per_pass < 1e-3
    for case in sorted(p for p in RECORDS.iterdir() if p.is_dir()):
        r = term.case_terms(case, model, 64, 16, per_pass)
        assert r["context_estimate_error"] < 0.02  # the reconstruction agrees with the recorded mean context
        assert r["term_share"] > 0 and r["measured_over_priced_plus_term"] < r["measured_over_priced"]
        assert r["measured_over_priced_plus_both"] < r["measured_over_priced_plus_term"]
