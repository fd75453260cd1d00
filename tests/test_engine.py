"""The SimPy replica: conservation, ordering, budgets, acceptance, and queueing theory."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.speculation.acceptance import expected_tokens_per_step
from sim.simulate import prepare, simulate


def check_invariants(result) -> None:
    req, steps = result.requests, result.steps
    # Every request finishes exactly once, in order arrival <= scheduled <= first token <= finish.
    assert not req[["scheduled_s", "first_token_s", "finish_s"]].isna().any().any()
    assert (req.scheduled_s >= req.arrival_s - 1e-12).all()
    assert (req.first_token_s > req.scheduled_s).all()
    assert (req.finish_s >= req.first_token_s).all()
    # Tokens are conserved: steps emit exactly the requested output tokens, no more.
    assert int(steps.emitted_tokens.sum()) == int(req.output_tokens.sum())
    # Prefill emits one token per admitted request; decode steps the rest.
    assert int(steps.emitted_tokens[steps.phase == 0].sum()) == len(req)
    # Time never runs backwards and steps never overlap on one replica.
    assert (steps.end_s > steps.start_s).all()
    assert (steps.start_s.to_numpy()[1:] >= steps.end_s.to_numpy()[:-1] - 1e-12).all()
    # Per-request counters agree with the step records.
    assert int(req.drafted_tokens.sum()) == int(steps.drafted_tokens.sum())
    assert int(req.accepted_tokens.sum()) == int(steps.accepted_tokens.sum())
    assert int(req.decode_steps.sum()) == int(steps.running[steps.phase == 1].sum())
    assert (req.accepted_tokens <= req.drafted_tokens).all()


def kv_in_use_at_step_starts(result, reserve_extra: int) -> np.ndarray:
    req = result.requests
    reserve = (req.prompt_tokens + req.output_tokens + reserve_extra).to_numpy()
    starts = result.steps.start_s.to_numpy()
    admitted = req.scheduled_s.to_numpy()[None, :] <= starts[:, None]
    still_running = req.finish_s.to_numpy()[None, :] > starts[:, None]
    return (reserve[None, :] * (admitted & still_running)).sum(axis=1)


def test_continuous_run_conserves_requests_and_tokens(run_config):
    result = simulate(run_config(workload__num_requests=400, workload__rate=4.0, policy__k=3))
    check_invariants(result)
    assert result.summary["completed"] == 400


def test_static_batching_runs_each_batch_to_completion(run_config):
    result = simulate(run_config(workload__num_requests=300, workload__rate=6.0, engine__batching="static",
                                 engine__max_batch_size=8))
    check_invariants(result)
    req = result.requests.sort_values("scheduled_s")
    # A batch is the set of requests scheduled together; the next starts only after all finish.
    batches = list(req.groupby("scheduled_s"))
    assert all(len(group) <= 8 for _, group in batches)
    for (_, first), (start_next, _) in zip(batches, batches[1:]):
        assert start_next >= first.finish_s.max() - 1e-12
    # Each step of a batch is charged at the batch's starting size, even as members finish.
    decode = result.steps[result.steps.phase == 1]
    assert (decode.batch_size >= decode.running).all()
    assert (decode.batch_size > decode.running).any()


def test_kv_budget_is_never_exceeded(run_config):
    config = run_config(workload__num_requests=300, workload__rate=50.0, engine__kv_cache_tokens=3000,
                        engine__max_batch_size=64, workload__prompt_tokens="uniform:100:600",
                        workload__output_tokens="uniform:10:200")
    result = simulate(config)
    check_invariants(result)
    in_use = kv_in_use_at_step_starts(result, reserve_extra=3)
    assert in_use.max() <= 3000
    assert in_use.max() > 3000 * 0.5  # the budget, not the batch limit, was binding


def test_a_request_larger_than_the_kv_budget_is_refused_before_running(run_config):
    from sim.errors import InputError

    with pytest.raises(InputError, match="engine.kv_cache_tokens"):
        prepare(run_config(engine__kv_cache_tokens=100, workload__num_requests=5))


@pytest.mark.parametrize("alpha,k", [(0.5, 1), (0.7, 3), (0.9, 5), (0.8, 7)])
def test_mean_tokens_per_speculative_step_matches_geometric_formula(run_config, alpha, k):
    # Long outputs so that truncation at a request's end is negligible.
    config = run_config(workload__num_requests=40, workload__rate=100.0, acceptance__alpha=alpha,
                        policy__k=k, workload__output_tokens=4000, workload__prompt_tokens=64)
    result = simulate(config)
    s = result.summary
    expected = expected_tokens_per_step(alpha, k)
    # Standard error of the mean over ~num_drafts samples; the variance of a+1 is below k^2.
    tolerance = 5 * k / np.sqrt(s["num_drafts"])
    assert s["mean_acceptance_length"] == pytest.approx(expected, abs=tolerance)
    decode = result.steps[result.steps.phase == 1]
    emitted_per_sequence = decode.emitted_tokens.sum() / decode.running.sum()
    assert emitted_per_sequence == pytest.approx(expected, abs=tolerance + 0.01)


def test_plain_decoding_emits_one_token_per_sequence_per_step(run_config):
    result = simulate(run_config(policy__name="none", workload__num_requests=100, workload__rate=5.0))
    check_invariants(result)
    decode = result.steps[result.steps.phase == 1]
    assert (decode.emitted_tokens == decode.running).all()
    assert (decode.k == 0).all() and result.summary["num_draft_tokens"] == 0


def test_single_server_matches_md1_queue(run_config):
    """One sequence at a time, fixed lengths, no speculation: an M/D/1 queue.

    Pollaczek-Khinchine for deterministic service S at utilisation rho = lambda S:
    mean wait in queue W = rho S / (2 (1 - rho)).
    """
    lam = 1.0
    config = run_config(policy__name="none", engine__batching="static", engine__max_batch_size=1,
                        workload__prompt_tokens=128, workload__output_tokens=3,
                        workload__num_requests=30000, workload__rate=lam, seed=7)
    result = simulate(config)
    req = result.requests
    service = (req.finish_s - req.scheduled_s).to_numpy()
    assert np.ptp(service) < 1e-9  # deterministic service
    s = float(service[0])
    # Scale the rate so rho = 0.6 exactly, whatever the synthetic costs are.
    lam = 0.6 / s
    config = run_config(policy__name="none", engine__batching="static", engine__max_batch_size=1,
                        workload__prompt_tokens=128, workload__output_tokens=3,
                        workload__num_requests=30000, workload__rate=lam, seed=7)
    req = simulate(config).requests
    rho = lam * s
    expected_wait = rho * s / (2 * (1 - rho))
    measured = float(req.queue_s.mean())
    assert measured == pytest.approx(expected_wait, rel=0.06)
    # Little's law on the whole system: L = lambda * W_total.
    assert float(req.e2el_s.mean()) == pytest.approx(expected_wait + s, rel=0.04)


def test_continuous_batching_of_one_equals_static_batching_of_one(run_config):
    common = dict(workload__num_requests=300, workload__rate=3.0, engine__max_batch_size=1, policy__k=2)
    a = simulate(run_config(engine__batching="continuous", **common))
    b = simulate(run_config(engine__batching="static", **common))
    pd.testing.assert_frame_equal(a.requests, b.requests)


def test_same_config_and_seed_give_identical_records(run_config):
    config = run_config(workload__num_requests=500, workload__rate=8.0, acceptance__distribution="beta")
    a, b = simulate(config), simulate(config)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    assert a.summary == b.summary or all(
        (x == y) or (x != x and y != y) for x, y in zip(a.summary.values(), b.summary.values()))
    c = simulate(run_config(workload__num_requests=500, workload__rate=8.0, acceptance__distribution="beta",
                            seed=1))
    assert not a.requests.finish_s.equals(c.requests.finish_s)


def test_higher_load_means_larger_batches_and_longer_waits(run_config):
    low = simulate(run_config(workload__num_requests=400, workload__rate=1.0))
    high = simulate(run_config(workload__num_requests=400, workload__rate=40.0))
    assert high.summary["mean_batch_size"] > 2 * low.summary["mean_batch_size"]
    assert high.summary["mean_ttft_ms"] > low.summary["mean_ttft_ms"]


def test_one_token_requests_finish_at_prefill(run_config):
    result = simulate(run_config(workload__num_requests=50, workload__rate=5.0, workload__output_tokens=1))
    check_invariants(result)
    req = result.requests
    assert (req.finish_s == req.first_token_s).all()
    assert (result.steps.phase == 0).all()


def test_a_policy_returning_k_outside_the_profile_is_reported(run_config, tmp_path, monkeypatch):
    (tmp_path / "badpolicy.py").write_text(
        "from policies import Policy\n"
        "class Greedy(Policy):\n"
        "    name = 'greedy'\n"
        "    max_k = 2\n"
        "    def choose_k(self, view):\n"
        "        return 99\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="outside 0..2"):
        simulate(run_config(policy__name="badpolicy:Greedy", workload__num_requests=5))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 60),
    rate=st.floats(0.2, 200.0),
    k=st.integers(0, 7),
    batch=st.integers(1, 16),
    batching=st.sampled_from(["continuous", "static"]),
    alpha=st.floats(0.05, 0.95),
    out_hi=st.integers(1, 80),
    kv=st.integers(300, 5000),
    seed=st.integers(0, 2**16),
)
def test_invariants_hold_for_any_small_run(run_config, n, rate, k, batch, batching, alpha, out_hi, kv, seed):
    config = run_config(workload__num_requests=n, workload__rate=rate, policy__k=k, engine__max_batch_size=batch,
                        engine__batching=batching, acceptance__alpha=alpha, seed=seed,
                        workload__prompt_tokens="uniform:1:200", workload__output_tokens=f"uniform:1:{out_hi}",
                        engine__kv_cache_tokens=kv)
    result = simulate(config)
    check_invariants(result)
    assert kv_in_use_at_step_starts(result, reserve_extra=k).max() <= kv
    decode = result.steps[result.steps.phase == 1]
    assert (decode.running <= batch).all()
    assert ((decode.accepted_tokens >= 0) & (decode.accepted_tokens <= decode.drafted_tokens)).all()


def test_policies_are_bound_to_the_runs_step_costs(run_config, tmp_path, monkeypatch):
    (tmp_path / "pricing.py").write_text(
        "from policies import Policy\n"
        "class Pricing(Policy):\n"
        "    name = 'pricing'\n"
        "    max_k = 3\n"
        "    seen = []\n"
        "    def bind(self, k_max, cost_model=None):\n"
        "        super().bind(k_max, cost_model)\n"
        "        self.cost = cost_model\n"
        "    def choose_k(self, view):\n"
        "        t = self.cost.step_time(view.batch_size, 3, view.mean_context_tokens)\n"
        "        Pricing.seen.append((view.batch_size, view.mean_context_tokens, t))\n"
        "        return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = simulate(run_config(policy__name="pricing:Pricing", workload__num_requests=30, workload__rate=5.0))
    import pricing

    from sim.costmodel.model import CostModel
    exact = CostModel(result.profile)
    assert len(pricing.Pricing.seen) == result.summary["num_decode_steps"]
    for b, c, t in pricing.Pricing.seen[:50]:
        assert t == pytest.approx(exact.step_time(b, 3, c), rel=5e-3)
    # A step costs what the policy was quoted, plus the draft's catch-up after a fully accepted
    # step (k is always 3, so the draft lags at most 2 tokens).
    decode = result.steps[result.steps.phase == 1]
    extra = (decode.end_s - decode.start_s).to_numpy() - [t for _, _, t in pricing.Pricing.seen]
    catch_up = [exact.catch_up_times(b, 2, c) for b, c, _ in pricing.Pricing.seen]
    assert np.all(np.isclose(extra, 0, atol=1e-12) | np.isclose(extra, catch_up, rtol=5e-3))
    assert 0 < np.count_nonzero(extra > 1e-12) < len(extra)


def test_a_profile_with_no_kv_capacity_refuses_every_request(run_config, tmp_path):
    import json

    from sim.errors import InputError
    from tests.synthetic import make_profile

    directory = make_profile(tmp_path / "full", kv_capacity_tokens=0)
    meta = json.loads((directory / "profile.json").read_text())
    assert meta["kv_capacity_tokens"] == 0
    config = run_config(profile=str(directory), workload__num_requests=5)
    with pytest.raises(InputError, match="the profile's measured capacity"):
        prepare(config)


# Ragged steps: a policy that returns one k per running sequence.

_RAGGED_POLICY = (
    "import numpy as np\n"
    "from policies import Policy\n"
    "class Ragged(Policy):\n"
    "    name = 'ragged'\n"
    "    max_k = 4\n"
    "    log = []\n"
    "    def __init__(self, mode='random'):\n"
    "        self.mode, self.rng = mode, np.random.default_rng(5)\n"
    "    def choose_k(self, view):\n"
    "        b = view.running\n"
    "        if self.mode == 'random':\n"
    "            ks = self.rng.integers(0, 5, b)\n"
    "        elif self.mode == 'remaining':\n"
    "            ks = view.remaining_tokens % 3\n"
    "        else:\n"
    "            ks = np.full(b, 2)\n"
    "        Ragged.log.append((view.batch_size, view.mean_context_tokens, ks.copy()))\n"
    "        return ks\n"
    "    def observe(self, fb):\n"
    "        ks = fb.k_per_sequence\n"
    "        if ks is not None:\n"
    "            assert fb.k == ks.max() and fb.drafted_tokens == ks.sum()\n"
    "            assert ((fb.accepted_per_sequence >= 0) & (fb.accepted_per_sequence <= ks)).all()\n"
    "            assert fb.accepted_tokens == fb.accepted_per_sequence.sum()\n"
    "        Ragged.log[-1] += (ks is not None,)\n")


@pytest.fixture
def ragged(tmp_path, monkeypatch):
    (tmp_path / "raggedpolicy.py").write_text(_RAGGED_POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import raggedpolicy

    raggedpolicy.Ragged.log.clear()
    yield raggedpolicy.Ragged
    raggedpolicy.Ragged.log.clear()


def test_a_ragged_step_drafts_sum_k_keeps_at_most_k_i_and_is_charged_padded(run_config, ragged):
    result = simulate(run_config(policy__name="raggedpolicy:Ragged", workload__num_requests=60, workload__rate=8.0,
                                 acceptance__alpha=0.8, engine__max_batch_size=8))
    check_invariants(result)
    decode = result.steps[result.steps.phase == 1]
    log = ragged.log
    assert len(log) == len(decode)
    assert sum(observed for *_, observed in log) > len(log) // 2  # most steps were ragged (and checked there)
    assert decode.drafted_tokens.tolist() == [int(ks.sum()) for _, _, ks, _ in log]
    assert decode.k.tolist() == [int(ks.max()) for _, _, ks, _ in log]
    # Charged as a uniform step at max k_i over the charged batch (padded drafting and verification).
    from sim.costmodel.model import CostModel

    exact = CostModel(result.profile)
    expected = [exact.step_time(b, int(ks.max()), c) for b, c, ks, _ in log]
    extra = (decode.end_s - decode.start_s).to_numpy() - expected
    # ... plus, at some steps, the draft's catch-up over the L tokens it lags behind.
    for (b, c, _, _), x, t in zip(log, extra, expected):  # within the step table's blending error
        assert min(abs(x - exact.catch_up_times(b, lag, c)) for lag in range(1, 12)) <= 5e-3 * t


def test_ragged_drafted_tokens_are_charged_to_each_request(run_config, ragged):
    # With alpha ~ 0 nothing is accepted, so a request's remaining count steps down by one and
    # k_i = remaining % 3 makes its drafted tokens a known sum over its output length.
    result = simulate(run_config(policy__name="raggedpolicy:Ragged", policy__mode="remaining",
                                 workload__num_requests=40, workload__rate=8.0, acceptance__alpha=1e-9,
                                 workload__output_tokens="uniform:1:30", engine__max_batch_size=8))
    check_invariants(result)
    req = result.requests
    assert int(req.accepted_tokens.sum()) == 0
    expected = [sum(r % 3 for r in range(1, n)) for n in req.output_tokens]
    assert req.drafted_tokens.tolist() == expected


def test_an_array_of_equal_k_runs_exactly_as_the_int(run_config, ragged):
    as_array = simulate(run_config(policy__name="raggedpolicy:Ragged", policy__mode="equal",
                                   workload__num_requests=40, workload__rate=5.0))
    as_int = simulate(run_config(policy__name="fixed", policy__k=2, workload__num_requests=40, workload__rate=5.0))
    assert not any(observed for *_, observed in ragged.log)  # never seen as ragged
    pd.testing.assert_frame_equal(as_array.steps, as_int.steps)
    pd.testing.assert_frame_equal(as_array.requests, as_int.requests)


@pytest.mark.parametrize("body, match", [
    ("np.zeros(view.running + 1, dtype=np.int64)", r"shape \(\d+,\); it must have one k per running"),
    ("np.full(view.running, -1)", r"in -1..-1, outside 0..2"),
    ("np.arange(view.running) + 3", r"outside 0..2"),
    ("np.ones(view.running)", "of dtype float64; it must be an integer array"),
    ("np.ones((view.running, 1), dtype=np.int64)", "shape"),
])
def test_a_bad_per_sequence_answer_is_one_error_naming_the_policy(run_config, tmp_path, monkeypatch, body, match):
    from sim.errors import InputError

    (tmp_path / "badarray.py").write_text(
        "import numpy as np\n"
        "from policies import Policy\n"
        "class Bad(Policy):\n"
        "    name = 'badarray'\n"
        "    max_k = 2\n"
        "    def choose_k(self, view):\n"
        f"        return {body}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "badarray", raising=False)  # each case loads its own
    with pytest.raises(InputError, match=match) as caught:
        simulate(run_config(policy__name="badarray:Bad", workload__num_requests=5))
    assert "policy 'badarray' returned per-sequence k" in str(caught.value)
    assert str(caught.value).startswith("policy.name: ") and "\n" not in str(caught.value)


@pytest.mark.parametrize("prefill", ["packed", "padded"])
def test_a_prefill_block_is_priced_at_its_mean_or_its_longest_prompt(run_config, prefill):
    # Everything arrives at once, so static batches of 4 mixed prompts are prefilled together.
    result = simulate(run_config(engine__prefill=prefill, engine__batching="static", engine__max_batch_size=4,
                                 workload__num_requests=12, workload__rate=1e6,
                                 workload__prompt_tokens="uniform:16:400", policy__name="none"))
    from sim.costmodel.model import CostModel

    exact = CostModel(result.profile)
    req = result.requests.sort_values("scheduled_s")
    prefills = result.steps[result.steps.phase == 0]
    blocks = [block.prompt_tokens.to_numpy() for _, block in req.groupby("scheduled_s", sort=True)]
    assert len(blocks) == len(prefills) and sum(p.max() > p.mean() for p in blocks) >= 2  # mixed blocks
    for (_, step), prompts in zip(prefills.iterrows(), blocks):
        priced_at = prompts.max() if prefill == "padded" else prompts.mean()
        expected = float(exact.prefill_times(len(prompts), priced_at, with_draft=False))
        assert step.end_s - step.start_s == pytest.approx(expected, rel=5e-3)
