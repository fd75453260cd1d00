"""benchmarks/composed_vs_measured.py: errors, the gap's terms and sanity figures computed from the profiles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.costmodel.profile import load_profile
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
MEASURED = "h100-measured-llama-3.1-8b-llama-3.2-1b"
COMPOSED = "h100-llama-3.1-8b-llama-3.2-1b"


@pytest.fixture(scope="module")
def cvm():
    return load_script("benchmarks/composed_vs_measured.py", "composed_vs_measured")


def changed_copy(name: str, out: Path, factor: float = 1.0, floor_s: float = 0.0, per_layer_s: float = 0.0) -> Path:
    """The shipped profile with every latency times ``factor`` plus ``floor_s``, and ``per_layer_s`` per layer
    of the pass's model on prefill and decode points."""
    src = load_profile(name).path
    out.mkdir()
    meta = json.loads((src / "profile.json").read_text())
    table = pd.read_csv(src / "profile.csv")
    layers = table.model.map({role: m["config"]["num_layers"] for role, m in meta["models"].items()})
    added = floor_s + np.where(table.phase != "verify", layers * per_layer_s, 0.0)
    for col in [c for c in table.columns if c.startswith("latency_") and c != "latency_std_s"]:
        table[col] = table[col] * factor + added
    table["latency_std_s"] = table["latency_std_s"] * factor
    table.to_csv(out / "profile.csv", index=False)
    (out / "profile.json").write_text(json.dumps(meta))
    return out


def terms(cvm, composed, measured):
    both = cvm.joined(composed, measured)
    layers = cvm.layers(measured)
    kv_bytes = {role: m["kv_bytes_per_token"] for role, m in measured.meta["models"].items()}
    scale, floor = cvm.batch1_floor(both, layers)
    rates, cost = cvm.kv_rates(both, kv_bytes), cvm.per_token(both, layers, floor)
    return both, scale, floor, rates, cost, cvm.explained(both, layers, kv_bytes, floor, cost, rates)


def test_a_profile_against_itself_has_no_error_and_no_terms(cvm):
    p = load_profile(MEASURED)
    both, scale, floor, rates, cost, explained = terms(cvm, p, p)
    assert len(both) == int((p.points.status == "ok").sum())
    table = cvm.errors(both)
    assert (table.median_ape == 0).all() and (table.p90_ape == 0).all() and (table.bias == 0).all()
    assert scale == pytest.approx(1) and floor == pytest.approx(0, abs=1e-12)
    assert np.allclose(rates.measured, rates.composed) and len(rates) == 2 * 9
    assert np.allclose(cost.seconds, 0, atol=1e-15)
    assert np.allclose(explained, both.latency_median_s_composed)


def test_a_scaled_profile_shows_its_bias(cvm, tmp_path):
    measured = load_profile(MEASURED)
    slower = load_profile(changed_copy(MEASURED, tmp_path / "slower", factor=1.1))
    table = cvm.errors(cvm.joined(slower, measured))
    assert table.bias.to_numpy() == pytest.approx(0.1, rel=1e-9)
    assert table.median_ape.to_numpy() == pytest.approx(0.1, rel=1e-9)
    # the scale shows in the batch-1 split, the KV read rate and the per-token cost, not in a floor
    both, scale, floor, rates, cost, _ = terms(cvm, slower, measured)
    assert scale == pytest.approx(1 / 1.1) and floor == pytest.approx(0, abs=1e-12)
    assert np.allclose(rates.composed / rates.measured, 1 / 1.1)


def test_a_per_layer_floor_is_recovered_and_explains_the_gap(cvm, tmp_path):
    """Measured = composed + 40 us per layer: the split finds 40 us and scale 1, and composed + terms
    leaves no error on prefill and decode (the verification is left as composed)."""
    composed = load_profile(COMPOSED)
    measured = load_profile(changed_copy(COMPOSED, tmp_path / "floored", per_layer_s=40e-6))
    both, scale, floor, rates, cost, explained = terms(cvm, composed, measured)
    assert scale == pytest.approx(1, rel=1e-9) and floor == pytest.approx(40e-6, rel=1e-6)
    assert np.allclose(cost.seconds, 0, atol=1e-15)
    error = explained / both.latency_median_s_measured - 1
    assert np.abs(error[both.phase != "verify"]).max() < 1e-9
    table = cvm.errors(both).set_index(["phase", "model"])
    assert table.loc[("decode", "draft"), "bias"] < table.loc[("decode", "target"), "bias"] < 0


def test_regions_are_the_worst_two_per_phase_and_model(cvm):
    both = cvm.joined(load_profile(COMPOSED), load_profile(MEASURED))
    worst = cvm.regions(both)
    assert len(worst) == 2 * both.groupby(["phase", "model"]).ngroups
    for _, g in worst.groupby(["phase", "model"]):
        assert g.error.abs().is_monotonic_decreasing
    assert worst.points.sum() <= len(both) and (worst.points >= 1).all()


def test_the_what_if_adds_the_spec_latency_per_small_kernel_and_reprices_the_sampler(cvm):
    composed = load_profile(COMPOSED)
    both = cvm.joined(composed, load_profile(MEASURED))
    spec = composed.meta["device"]["spec"]
    added = cvm.corrected(both, composed) - both.latency_median_s_composed
    decode = both.phase == "decode"
    layers = both.model.map({"target": 32, "draft": 16})
    assert np.allclose(added[decode], layers[decode] * 5 * spec["mem_latency_s"])
    verify = both[both.phase == "verify"]
    k0 = verify[(verify.batch_size == 1) & (verify.query_tokens == 0)].index[0]
    vocab = composed.meta["models"]["target"]["config"]["vocab_size"]
    sampler = 8 * spec["mem_latency_s"] + vocab * 22 / (spec["mem_bw"] * spec["mem_bw_scaling"])
    assert cvm.corrected(both, composed)[k0] == pytest.approx(sampler)


def test_sanity_figures_come_from_the_sidecars(cvm):
    measured = load_profile(MEASURED)
    spec = {"mem_bw": 1e12, "bf16_flops": 1e15}
    decode, prefill = cvm.sanity(measured, spec)
    weights = measured.meta["models"]["target"]["weight_bytes"]
    assert f"weights {weights / 1e9:.2f} GB / 1.00 TB/s = {weights / 1e12 * 1e3:.2f} ms" in decode
    assert "of 1000 peak bf16" in prefill
    # the best prefill is chosen by achieved FLOP/s, which the parameter count in the sidecar sets
    target = measured.meta["models"]["target"]
    points = measured.points[(measured.points.phase == "prefill") & (measured.points.model == "target")
                             & (measured.points.status == "ok")]
    flops = points.batch_size * (2.0 * target["params"] * points.query_tokens + 2.0 * target["config"]["num_layers"]
                                 * points.query_tokens ** 2 * target["config"]["hidden_size"]) / points.latency_median_s
    assert f"= {flops.max() / 1e12:.0f} TFLOP/s" in prefill


def test_the_report_names_every_section_and_the_measured_profile_s_facts(cvm, capsys):
    assert cvm.main([]) == 0
    out = capsys.readouterr().out
    for phase in ("decode   draft", "decode   target", "prefill  target", "verify   target"):
        assert phase in out
    for section in ("largest median errors", "the gap, term by term", "KV-cache read rate", "what-if",
                    "hardware sanity"):
        assert section in out
    assert "1131 points: 978 ok, 153 oom, 0 error" in out and "(0 fallbacks)" in out
    cvm.main([])
    assert capsys.readouterr().out == out  # deterministic


def test_an_unknown_profile_is_one_error_line():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "composed_vs_measured.py"), "--measured", "nope"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and done.stderr.startswith("error: profile:")
