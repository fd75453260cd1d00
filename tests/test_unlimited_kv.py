"""A profile without ``kv_capacity_tokens`` gives an unlimited KV budget (docs/profiles.md), under
either scheduler: no request is refused for its size and none is ever preempted.

The unlimited budget is room for every request at its longest at once. Under vllm-v1 a request
holds whole blocks and the speculation's lookahead slots, more than v0's reservation, so a
budget sized by v0's rule refused a lone request under vllm-v1 ("more than the budget ... the
profile's measured capacity").
"""

from __future__ import annotations

import pytest

import specbatch
from tests.synthetic import make_profile

LONE = {"num_requests": 1, "prompt_tokens": 1000, "output_tokens": 128}  # 1,128 tokens: not a multiple of 16
# Everyone at once; at most 40 x 1,216 tokens, so a budget of 10**6 is never reached.
CROWD = {"num_requests": 40, "rate": "inf", "prompt_tokens": "uniform:100:900", "output_tokens": "uniform:50:300"}


@pytest.fixture(scope="module")
def unlimited(tmp_path_factory):
    """The synthetic profile without a KV capacity."""
    return str(make_profile(tmp_path_factory.mktemp("profiles") / "unlimited", kv_capacity_tokens=None))


@pytest.mark.parametrize("scheduler", ["vllm-v1", "v0"])
@pytest.mark.parametrize("speculation", [{"policy": "fixed", "k": 4}, {"policy": "none"},
                                         {"speculative_config": '{"method": "eagle", "num_speculative_tokens": 3}'}])
def test_a_lone_long_request_runs(unlimited, scheduler, speculation, tmp_path):
    drafters = {"speculative_config": ("eagle",)}.get(next(iter(speculation)), ())
    profile = unlimited if not drafters else str(make_profile(tmp_path / "eagle", kv_capacity_tokens=None,
                                                              drafters=drafters))
    run = specbatch.run(profile=profile, scheduler=scheduler, **speculation, **LONE)
    assert run.summary["completed"] == 1


@pytest.mark.parametrize("block_size", [16, 7])
def test_under_vllm_v1_nothing_is_preempted_and_the_run_is_that_of_a_budget_no_run_reaches(unlimited, block_size):
    unbounded = specbatch.run(profile=unlimited, scheduler="vllm-v1", block_size=block_size, **CROWD)
    huge = specbatch.run(profile=unlimited, scheduler="vllm-v1", block_size=block_size, kv_cache_tokens=10**6,
                         **CROWD)
    assert unbounded.summary["completed"] == 40
    assert unbounded.summary["num_preemptions"] == 0
    assert unbounded.requests.equals(huge.requests) and unbounded.steps.equals(huge.steps)


def test_a_measured_capacity_still_refuses_a_request_that_cannot_fit(unlimited, tmp_path):
    small = str(make_profile(tmp_path / "small", kv_capacity_tokens=1100))
    with pytest.raises(specbatch.InputError, match="more than the budget of 1100 tokens .the profile's measured"):
        specbatch.run(profile=small, scheduler="vllm-v1", **LONE)


def test_a_budget_beyond_what_the_run_can_use_allocates_only_that(unlimited):
    """vllm-v1 holds KV as arrays of blocks: 2**40 tokens would be terabytes, and means the same as unlimited."""
    vast = specbatch.run(profile=unlimited, scheduler="vllm-v1", kv_cache_tokens=2**40, **CROWD)
    unbounded = specbatch.run(profile=unlimited, scheduler="vllm-v1", **CROWD)
    assert vast.requests.equals(unbounded.requests) and vast.steps.equals(unbounded.steps)
