"""A team's own regression test of its policy class, with specbatch's pytest helper.

Put a file like this in your test suite; it fails with the table of regressed metrics
when a change to the policy makes latency worse or throughput lower than the baseline
recorded. Run it here with

    PYTHONPATH=docs/examples python -m pytest docs/examples/test_my_policy_regress.py

tests/test_regress.py runs it, so it cannot drift from the helper's interface.
"""

from __future__ import annotations

from pathlib import Path

from my_policy import SmallBatchSpec
from specbatch import assert_no_regression

BASELINE = Path(__file__).with_name("my_policy_baseline.toml")


def test_small_batch_spec_has_not_regressed():
    # policy= replaces every scenario's policy with this class (imported as my_policy:SmallBatchSpec);
    # the scenarios' own parameters for it (threshold = 8) are kept because the names match.
    comparison = assert_no_regression(BASELINE, policy=SmallBatchSpec)
    assert {run.name for run in comparison.runs} == {"light-load", "heavy-load"}
