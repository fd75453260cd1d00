"""benchmarks/composed_vs_measured.py: errors, fits and sanity figures computed from the profiles."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from sim.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
MEASURED = "h100-measured-llama-3.1-8b-llama-3.2-1b"


@pytest.fixture(scope="module")
def cvm():
    spec = importlib.util.spec_from_file_location("composed_vs_measured", ROOT / "benchmarks" / "composed_vs_measured.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scaled_copy(name: str, tmp_path: Path, factor: float, floor_s: float = 0.0) -> Path:
    """The shipped profile with every latency times ``factor`` plus ``floor_s``."""
    src = load_profile(name).path
    out = tmp_path / f"{name}-x{factor}"
    out.mkdir()
    table = pd.read_csv(src / "profile.csv")
    for col in [c for c in table.columns if c.startswith("latency_") and c != "latency_std_s"]:
        table[col] = table[col] * factor + floor_s
    table["latency_std_s"] = table["latency_std_s"] * factor
    table.to_csv(out / "profile.csv", index=False)
    (out / "profile.json").write_text(json.dumps(json.loads((src / "profile.json").read_text())))
    return out


def test_a_profile_against_itself_has_no_error(cvm):
    p = load_profile(MEASURED)
    both = cvm.joined(p, p)
    assert len(both) == int((p.points.status == "ok").sum())
    table = cvm.summary(both)
    assert (table.median_ape == 0).all() and (table.bias == 0).all()


def test_a_scaled_profile_shows_its_bias_and_the_fit_recovers_scale_and_floor(cvm, tmp_path):
    measured = load_profile(MEASURED)
    slower = load_profile(scaled_copy(MEASURED, tmp_path, 1.1))
    table = cvm.summary(cvm.joined(slower, measured)).set_index(["phase", "model"])
    assert table.bias.to_numpy() == pytest.approx(0.1, rel=1e-9)
    # composed = measured x 2 + 1 ms, so measured = 0.5 x composed - 0.5 ms, with nothing left
    doubled = load_profile(scaled_copy(MEASURED, tmp_path, 2.0, 1e-3))
    fit = cvm.floor_and_scale(cvm.joined(doubled, measured))
    assert fit.scale.to_numpy() == pytest.approx(0.5, rel=1e-6)
    assert fit.floor_ms.to_numpy() == pytest.approx(-0.5, rel=1e-5)
    assert fit.left.max() < 1e-6


def test_sanity_figures_come_from_the_sidecars(cvm):
    measured = load_profile(MEASURED)
    spec = {"mem_bw": 1e12, "bf16_flops": 1e15}
    decode, prefill = cvm.sanity(measured, spec)
    weights = measured.meta["models"]["target"]["weight_bytes"]
    assert f"= {weights / 1e12 * 1e3:.2f} ms" in decode
    assert "of 1000 peak bf16" in prefill


def test_the_report_names_every_phase_and_the_measured_profile_s_facts(cvm, capsys):
    assert cvm.main([]) == 0
    out = capsys.readouterr().out
    for phase in ("decode   draft", "decode   target", "prefill  target", "verify   target"):
        assert phase in out
    assert "1131 points: 978 ok, 153 oom, 0 error" in out and "hardware sanity" in out
