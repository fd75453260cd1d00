"""The ``context`` policy: MagicDec's inflection on a hand-made cost, auto tables, explicit tables, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policies import BatchView, PolicyError, make_policy
from policies.context import ContextTable, build_context_table
from policies.lut import best_k, expected_tokens
from specbatch.commands.cli import main
from tests.conftest import CPU_DEFAULT_FLAGS


def magicdec(b: int, k: int, c: float) -> float:
    """A long-context decode step (MagicDec's model): the target pass is memory-bound on weights plus the
    KV cache (a b * c term) or compute-bound on b * (k + 1) tokens, whichever is larger; the draft keeps a
    constant-size KV cache (StreamingLLM), so its cost hardly grows with context or batch."""
    target = max(0.010 + 1e-6 * b * c, 0.001 * b * (k + 1))
    return target + k * (0.006 + 1e-5 * b)


BATCHES = [1, 2, 4, 8, 16, 32, 64]


def test_best_k_falls_with_batch_at_short_context_but_not_at_long_context():
    policy = ContextTable(table=build_context_table(magicdec, 0.7, 7, 64))
    short = [policy.k_for(b, 256) for b in BATCHES]
    long = [policy.k_for(b, 24000) for b in BATCHES]
    assert all(x >= y for x, y in zip(short, short[1:])) and short[0] > short[-1], short  # lut's finding
    assert all(x <= y for x, y in zip(long, long[1:])) and long[-1] > long[0], long  # MagicDec's inflection
    assert long[-1] > short[-1]  # at large batch, long context speculates more


def test_auto_table_equals_brute_force_per_bucket_at_its_midpoint():
    rng = np.random.default_rng(5)
    costs = rng.uniform(0.01, 0.05, size=(13, 6, 3))  # [b][k][bucket], arbitrary
    edges = [100, 300, 1000]

    def step_time(b, k, c):
        return float(costs[b, k, {50.0: 0, 200.5: 1, 650.5: 2}[c]])  # fails on any other context

    alpha = 0.6
    policy = make_policy("context", {"alpha": alpha, "k_max": 5, "context_buckets": edges})

    class Table:
        max_batch = 12

    table = Table()
    table.step_time = step_time
    policy.bind(7, table)
    per_token = costs / np.array([expected_tokens(alpha, k) for k in range(6)])[None, :, None]
    for j, (lo, hi) in enumerate([(0, 100), (101, 300), (301, 1000)]):
        for b in range(1, 13):
            want = int(np.argmin(per_token[b, :, j]))
            assert want == best_k(step_time, alpha, 5, b, (lo + hi) / 2)[0]
            for c in (lo, (lo + hi) / 2, hi):
                assert policy.k_for(b, c) == want, (b, c)
    assert policy.k_for(40, 5000) == int(np.argmin(per_token[12, :, 2]))  # beyond both: the last cell
    assert policy.params() == {"alpha": 0.6, "k_max": 5, "context_buckets": [100, 300, 1000]}


def test_buckets_with_equal_tables_are_merged():
    table = build_context_table(lambda b, k, c: 0.02, 0.6, 3, 8)  # context-free and flat: k_max everywhere
    assert table == [[1, 8, 0, 32768, 3]]


def _view(b: int, c: float) -> BatchView:
    view = BatchView(8)
    view.batch_size = view.running = b
    view.mean_context_tokens = c
    return view


def test_explicit_table_look_up_with_gaps_and_out_of_range_points():
    rows = [[1, 4, 0, 1023, 4], [5, 64, 0, 1023, 1], [1, 8, 2048, 8191, 3], [16, 64, 2048, 8191, 6]]
    policy = make_policy("context", {"table": rows[::-1]})
    assert policy.max_k == 6 and policy.params() == {"table": sorted(rows, key=lambda r: (r[2], r[0]))}
    expected = {(1, 0): 4, (4, 1023): 4, (5, 500): 1, (100, 10): 1,  # above the last batch range: its k
                (3, 1500): 4, (30, 1500): 1,  # a context gap takes the band below
                (8, 2048): 3, (12, 4000): 3,  # a batch gap takes the range below
                (16, 8191): 6, (1, 1e6): 3, (64, 1e6): 6, (0, 0): 4}
    assert {p: policy.k_for(*p) for p in expected} == expected
    assert {p: policy.choose_k(_view(*p)) for p in expected} == expected
    below = make_policy("context", {"table": [[4, 8, 100, 200, 2], [9, 16, 100, 200, 5]]})
    assert below.k_for(1, 10) == 2 and below.k_for(20, 300) == 5


@pytest.mark.parametrize("table,needle", [
    ([], "non-empty"),
    ([[1, 4, 0, 100, 3], [4, 8, 50, 200, 2]], "overlaps row 1"),
    ([[1, 4, 0, 100, 3], [2, 3, 100, 100, 2]], "overlaps"),
    ([[5, 2, 0, 10, 1]], "min_bs 5 is after max_bs 2"),
    ([[1, 2, 10, 0, 1]], "min_ctx 10 is after max_ctx 0"),
    ([[1, 4, 0, 10, -1]], "k must be >= 0"),
    ([[0, 4, 0, 10, 1]], "min_bs must be >= 1"),
    ([[1, 4, -1, 10, 1]], "min_ctx must be >= 0"),
    ([[1, 4, 2]], "five whole numbers"),
    ([[1, 4, 0, 10.5, 2]], "five whole numbers"),
])
def test_bad_tables_are_rejected_naming_table(table, needle):
    with pytest.raises(PolicyError, match=needle) as info:
        make_policy("context", {"table": table})
    assert info.value.field == "table"


def test_disjoint_rectangles_sharing_batch_sizes_are_accepted():
    make_policy("context", {"table": [[1, 4, 0, 100, 3], [1, 4, 101, 200, 2], [5, 8, 0, 200, 1]]})


@pytest.mark.parametrize("params,field", [
    ({}, "table"),
    ({"table": [[1, 4, 0, 9, 2]], "alpha": 0.7}, "table"),
    ({"table": [[1, 4, 0, 9, 2]], "context_buckets": [10]}, "context_buckets"),
    ({"alpha": 1.0}, "alpha"),
    ({"alpha": 0.7, "k_max": -1}, "k_max"),
    ({"alpha": 0.7, "context_buckets": []}, "context_buckets"),
    ({"alpha": 0.7, "context_buckets": [512, 256]}, "context_buckets"),
])
def test_bad_parameters_name_the_parameter(params, field):
    with pytest.raises(PolicyError) as info:
        make_policy("context", params)
    assert info.value.field == field


def test_k_max_beyond_the_profile_and_a_missing_cost_model():
    with pytest.raises(PolicyError, match="k_max = 9 is beyond") as info:
        make_policy("context", {"alpha": 0.7, "k_max": 9}).bind(7, None)
    assert info.value.field == "k_max"
    with pytest.raises(PolicyError, match="the table's largest k = 8") as info:
        make_policy("context", {"table": [[1, 2, 0, 10, 8]]}).bind(7, None)
    assert info.value.field == "table"
    with pytest.raises(PolicyError, match="cost model"):
        make_policy("context", {"alpha": 0.7}).bind(7, None)


SHORT = [*CPU_DEFAULT_FLAGS, "--num-requests", "30", "--rate", "4", "--records", "none"]


def test_cli_run_with_alpha_and_a_bad_table(capsys, tmp_path, synthetic_profile):
    code = main(["run", "--config", str(_write(tmp_path / "ok.toml", "alpha = 0.8")), "--profile",
                 str(synthetic_profile), *SHORT, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["policy"]["name"] == "context" and summary["policy"]["alpha"] == 0.8
    assert 0 < summary["metrics"]["mean_k"] <= 4
    code = main(["run", "--config", str(_write(tmp_path / "bad.toml", "table = [[1, 4, 0, 9, 3], [4, 8, 0, 9, 2]]")),
                 "--profile", str(synthetic_profile), *SHORT, "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "policy.table:" in err and "overlaps" in err


def _write(path, line):
    path.write_text(f'[policy]\nname = "context"\n{line}\n')
    return path
