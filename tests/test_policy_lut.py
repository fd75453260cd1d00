"""The ``lut`` policy: tables built from hand-made cost curves, explicit tables, the CLI."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest

from policies import BatchView, PolicyError, make_policy
from policies.lut import LookupTable, build_lut
from specbatch.commands.cli import main
from tests.conftest import CPU_DEFAULT_FLAGS


def flat(b: int, k: int, c: float) -> float:
    """Verification as free as plain decoding: the target pass costs the same for any q; drafts are free."""
    return 0.020


def linear_in_q(b: int, k: int, c: float) -> float:
    """Target pass linear in the q = k + 1 tokens it verifies, and drafts that cost something."""
    return 0.010 * (k + 1) + 0.001 * k


def roofline(b: int, k: int, c: float) -> float:
    """Memory-bound (flat) at small batch, compute-bound (linear in b * q) at large batch."""
    return max(0.020, 0.0005 * b * (k + 1)) + 0.0004 * k


def test_flat_verification_cost_picks_the_largest_k():
    assert build_lut(flat, 0.6, 5, 64, 512) == [[1, 64, 5]]


def test_verification_cost_linear_in_q_picks_k_zero():
    assert build_lut(linear_in_q, 0.9, 7, 64, 512) == [[1, 64, 0]]


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
def test_roofline_cost_gives_k_non_increasing_in_batch_size(alpha):
    table = build_lut(roofline, alpha, 7, 128, 512)
    ks = [LookupTable(table=table).k_for(b) for b in range(1, 129)]
    assert all(a >= b for a, b in zip(ks, ks[1:])), table
    assert ks[0] >= 3 and ks[-1] == 0  # long speculation when memory-bound, none when compute-bound
    # Merged: consecutive rows differ in k, and the rows tile 1..max_batch without gaps.
    assert all(r[2] != s[2] for r, s in zip(table, table[1:]))
    assert [r[0] for r in table[1:]] == [r[1] + 1 for r in table[:-1]] and table[0][0] == 1


def test_build_lut_minimises_expected_time_per_token_with_ties_to_the_smaller_k():
    rng = np.random.default_rng(3)
    costs = rng.uniform(0.01, 0.05, size=(9, 6))  # [b][k], arbitrary

    def step_time(b, k, c):
        return float(costs[b, k])

    alpha = 0.65
    table = build_lut(step_time, alpha, 5, 8, 0)
    policy = LookupTable(table=table)
    for b in range(1, 9):
        per_token = costs[b] / ((1 - alpha ** (np.arange(6) + 1)) / (1 - alpha))
        assert policy.k_for(b) == int(np.argmin(per_token))
    # An exact tie goes to the smaller k: here k = 1 costs exactly E[tokens](1) times k = 0.
    tie = build_lut(lambda b, k, c: [1.0, 1.5, 9.0][k], 0.5, 2, 3, 0)
    assert tie == [[1, 3, 0]]


def test_bind_builds_the_table_from_the_cost_model_up_to_its_max_batch():
    class Table:
        max_batch = 40

        @staticmethod
        def step_time(b, k, c):
            assert c == 300
            return roofline(b, k, c)

    policy = make_policy("lut", {"alpha": 0.8, "k_max": 6, "context_tokens": 300})
    assert policy.max_k == 6 and policy.table is None
    policy.bind(7, Table())
    assert policy.table == build_lut(roofline, 0.8, 6, 40, 300)
    assert policy.table[-1][1] == 40
    assert policy.params() == {"alpha": 0.8, "k_max": 6, "context_tokens": 300}


def _view(batch_size: int) -> BatchView:
    view = BatchView(8)
    view.batch_size = view.running = batch_size
    return view


def test_k_lookup_for_covered_and_uncovered_batch_sizes():
    # Given out of order, with a gap 5..7 and nothing below 2 or above 32.
    policy = make_policy("lut", {"table": [[8, 16, 3], [2, 4, 6], [17, 32, 1]]})
    assert policy.table == [[2, 4, 6], [8, 16, 3], [17, 32, 1]]
    assert policy.max_k == 6 and policy.params() == {"table": [[2, 4, 6], [8, 16, 3], [17, 32, 1]]}
    expected = {1: 6,  # below the first range: the first range's k
                2: 6, 4: 6, 5: 6, 7: 6,  # a gap takes the range below
                8: 3, 16: 3, 17: 1, 32: 1, 33: 1, 1000: 1}  # above the last range: its k
    assert {b: policy.choose_k(_view(b)) for b in expected} == expected
    assert {b: policy.k_for(b) for b in expected} == expected


@pytest.mark.parametrize("table,needle", [
    ([], "non-empty"),
    ([[1, 4, 3], [4, 8, 2]], "overlaps"),
    ([[10, 20, 1], [1, 12, 3]], "overlaps"),
    ([[5, 2, 1]], "start 5 is after end 2"),
    ([[1, 4, -1]], "k must be >= 0"),
    ([[0, 4, 1]], "start batch size must be >= 1"),
    ([[1, 4]], "three whole numbers"),
    ([[1, 4, 2.5]], "three whole numbers"),
    ("1-4:3", "non-empty list"),
])
def test_bad_tables_are_rejected_naming_table(table, needle):
    with pytest.raises(PolicyError, match=needle) as info:
        make_policy("lut", {"table": table})
    assert info.value.field == "table"


@pytest.mark.parametrize("params,field", [
    ({}, "table"),
    ({"table": [[1, 4, 2]], "alpha": 0.7}, "table"),
    ({"table": [[1, 4, 2]], "k_max": 3}, "k_max"),
    ({"alpha": 1.2}, "alpha"),
    ({"alpha": 0.0}, "alpha"),
    ({"alpha": 0.7, "k_max": -1}, "k_max"),
    ({"alpha": 0.7, "context_tokens": -5}, "context_tokens"),
])
def test_bad_parameters_name_the_parameter(params, field):
    with pytest.raises(PolicyError) as info:
        make_policy("lut", params)
    assert info.value.field == field


def test_k_max_beyond_the_profile_names_the_parameter():
    with pytest.raises(PolicyError, match="k_max = 9 is beyond the profile's measured k_max = 7") as info:
        make_policy("lut", {"alpha": 0.7, "k_max": 9}).bind(7, None)
    assert info.value.field == "k_max"
    with pytest.raises(PolicyError, match="the table's largest k = 8") as info:
        make_policy("lut", {"table": [[1, 2, 8]]}).bind(7, None)
    assert info.value.field == "table"


SHORT = [*CPU_DEFAULT_FLAGS, "--num-requests", "40", "--rate", "4", "--records", "none"]


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_run_with_a_table_from_a_toml_config(capsys, tmp_path, synthetic_profile):
    config = tmp_path / "lut.toml"
    config.write_text('[policy]\nname = "lut"\ntable = [[1, 2, 5], [3, 8, 2], [9, 32, 0]]\n')
    code, out, _ = _run(capsys, "run", "--config", str(config), "--profile", str(synthetic_profile), *SHORT,
                        "--out", str(tmp_path / "run"))
    assert code == 0 and "Policy:" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["policy"] == {"name": "lut", "table": [[1, 2, 5], [3, 8, 2], [9, 32, 0]]}
    assert 0 < summary["metrics"]["mean_k"] <= 5


def test_specbatch_lut_prints_and_writes_a_config_that_run_accepts(capsys, tmp_path, synthetic_profile):
    out_file = tmp_path / "tables" / "lut.toml"
    code, out, err = _run(capsys, "lut", "--profile", str(synthetic_profile), "--alpha", "0.8", "--k-max", "5",
                          "--context", "256", "--max-batch", "16", "--out", str(out_file))
    assert code == 0 and err == ""
    table = tomllib.loads(out_file.read_text())["policy"]
    assert table["name"] == "lut"
    from sim.costmodel.model import CostModel
    from sim.costmodel.profile import load_profile
    step_time = CostModel(load_profile(str(synthetic_profile))).step_time
    assert table["table"] == build_lut(step_time, 0.8, 5, 16, 256)
    assert "ms/token (k)" in out and "speedup" in out
    for start, end, k in table["table"]:
        batch = str(start) if start == end else f"{start}-{end}"
        assert any(line.split()[:2] == [batch, str(k)] for line in out.splitlines()), (batch, out)
    code, _, err = _run(capsys, "run", "--config", str(out_file), "--profile", str(synthetic_profile), *SHORT,
                        "--out", str(tmp_path / "run"))
    assert code == 0, err


def test_specbatch_lut_prices_each_batch_and_k_as_the_cost_model_does(synthetic_profile):
    """The command evaluates its (batch, k) grid in one call on the machine's fitted model (the fit cache):
    each entry is the model's step_time there, and the table the one a point-by-point build gives."""
    from policies.lut import build_lut
    from sim.simulate import profile_and_costs
    from specbatch.commands.cli import step_times_at

    _, model, _ = profile_and_costs(str(synthetic_profile))
    grid = step_times_at(model, 3, 40, 700.0)
    for b in (1, 2, 17, 40):
        for k in range(4):
            assert grid(b, k, 700.0) == pytest.approx(model.step_time(b, k, 700.0), rel=1e-12)
    for alpha in (0.3, 0.7, 0.95):
        assert build_lut(grid, alpha, 3, 40, 700.0) == build_lut(model.step_time, alpha, 3, 40, 700.0)


@pytest.mark.parametrize("flags,needle", [
    (["--alpha", "1.2"], "error: --alpha: must be inside (0, 1), got 1.2"),
    (["--alpha", "0.7", "--k-max", "9"], "error: --k-max: must be in 0..7 (the profile's measured k_max), got 9"),
    (["--alpha", "0.7", "--max-batch", "0"], "error: --max-batch: must be at least 1, got 0"),
])
def test_specbatch_lut_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, synthetic_profile, flags,
                                                               needle):
    out_file = tmp_path / "lut.toml"
    code, out, err = _run(capsys, "lut", "--profile", str(synthetic_profile), *flags, "--out", str(out_file))
    assert code == 2 and out == ""
    assert err.strip() == needle
    assert not out_file.exists()


@pytest.mark.parametrize("policy,field", [
    ('name = "lut"\nalpha = 0.7\nk_max = 9', "policy.k_max"),
    ('name = "lut"\nalpha = 1.2', "policy.alpha"),
    ('name = "lut"\ntable = [[1, 4, 3], [4, 8, 2]]', "policy.table"),
    ('name = "lut"\ntable = [[1, 4, 8]]', "policy.table"),
])
def test_bad_lut_config_is_one_line_naming_the_parameter(capsys, tmp_path, synthetic_profile, policy, field):
    config = tmp_path / "bad.toml"
    config.write_text(f"[policy]\n{policy}\n")
    code, _, err = _run(capsys, "run", "--config", str(config), "--profile", str(synthetic_profile), *SHORT,
                        "--out", str(tmp_path / "run"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and f"{field}:" in err and err.startswith("error:")
    assert not (tmp_path / "run").exists()
