"""The ``goodput`` policy (SmartSpec): the argmax, the online alpha estimate, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from policies import BatchView, PolicyError, make_policy
from policies.goodput import PRIOR_TESTS, Goodput
from policies.goodput_rules import FADE
from specbatch.commands.cli import main
from sim.simulate import execute, prepare
from tests.conftest import CPU_DEFAULT_FLAGS
from tests.synthetic import step_feedback


class Synthetic:
    """A roofline-shaped cost model: memory-bound at small batch, compute-bound at large, plus KV reads."""

    max_batch = 64

    def __init__(self):
        self.calls = 0

    def step_time(self, b: int, k: int, c: float) -> float:
        self.calls += 1
        draft = k * (0.002 + 2e-5 * b)
        target = max(0.020, 6e-4 * b * (k + 1)) + 2e-7 * b * c
        return draft + target + 1e-4 * k


def _view(b: int, ctx: float) -> BatchView:
    view = BatchView(8)
    view.batch_size = view.running = b
    view.mean_context_tokens = ctx
    return view


def _goodputs(cost, alpha, b, ctx, k_max):
    k = np.arange(k_max + 1)
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    return b * expected / np.array([cost.step_time(b, int(j), ctx) for j in k])


def test_choice_equals_the_brute_force_argmax():
    rng = np.random.default_rng(11)
    cost = Synthetic()
    chosen = set()
    for _ in range(400):
        b, ctx, alpha, k_max = int(rng.integers(1, 65)), float(rng.uniform(0, 4000)), float(rng.uniform(0.05, 0.95)), \
            int(rng.integers(0, 8))
        policy = Goodput(alpha_init=alpha, k_max=k_max)
        policy.bind(8, cost)
        g = _goodputs(cost, alpha, b, ctx, k_max)
        k = policy.choose_k(_view(b, ctx))
        assert k == int(np.argmax(g)) or g[k] == pytest.approx(g.max(), rel=1e-12), (b, ctx, alpha, k_max)
        assert policy.expected_goodput(b, k, ctx) == pytest.approx(g.max(), rel=1e-12)
        chosen.add(k)
    assert len(chosen) >= 4  # the draws exercise more than one answer


def test_k_zero_wins_ties_and_tie_break_is_a_relative_margin():
    class Flat:
        @staticmethod
        def step_time(b, k, c):
            # k = 1 gives exactly E[tokens](0.5, 1) = 1.5 times the tokens for 1.5 times the time.
            return [1.0, 1.5, 100.0][k]

    policy = Goodput(alpha_init=0.5, k_max=2)
    policy.bind(7, Flat())
    assert policy.choose_k(_view(4, 100)) == 0
    # 10% better per second at k = 1: chosen with no margin, not with a 20% margin.
    better = type("Better", (), {"step_time": staticmethod(lambda b, k, c: [1.0, 1.5 / 1.1, 100.0][k])})()
    policy.bind(7, better)
    assert policy.choose_k(_view(4, 100)) == 1
    cautious = Goodput(alpha_init=0.5, k_max=2, tie_break=0.2)
    cautious.bind(7, better)
    assert cautious.choose_k(_view(4, 100)) == 0


def test_each_step_prices_k_max_plus_one_candidates():
    cost = Synthetic()
    policy = Goodput(k_max=5)
    policy.bind(7, cost)
    policy.choose_k(_view(8, 500))
    assert cost.calls == 6



def test_observe_averages_accepted_and_tested_tokens_per_sequence_and_k_zero_at_the_prior_changes_nothing():
    policy = Goodput(alpha_init=0.8, smoothing=0.25, k_max=4)
    policy.bind(7, Synthetic())
    policy.observe(step_feedback(0, [0, 0]))
    assert policy.alpha_hat == 0.8
    # k = 3: one sequence kept all 3 (no rejection seen), one kept 1 and then saw a rejection:
    # per sequence 4 / 2 = 2 accepted out of (4 + 1) / 2 = 2.5 tested.
    accepted, tested = 0.75 * 0.8 + 0.25 * 2.0, 0.75 * 1.0 + 0.25 * 2.5
    policy.observe(step_feedback(3, [3, 1]))
    assert policy.alpha_hat == pytest.approx(accepted / tested)
    policy.observe(step_feedback(2, [0, 0]))  # both rejected at the first token: 0 accepted of 1 tested each
    accepted, tested = 0.75 * accepted, 0.75 * tested + 0.25 * 1.0
    assert policy.alpha_hat == pytest.approx(accepted / tested)
    policy.bind(7, Synthetic())  # a new run starts from alpha_init again
    assert policy.alpha_hat == 0.8


@pytest.mark.parametrize("n", [3, 64, 65, 300])  # both ways of counting, either side of the switch
def test_observe_counts_rejections_exactly_at_any_batch_size(n):
    rng = np.random.default_rng(n)
    accepted = np.minimum(rng.geometric(0.35, n) - 1, 4)
    policy = Goodput(alpha_init=0.5, smoothing=1.0, k_max=4)  # smoothing 1: the last step alone
    policy.observe(step_feedback(4, accepted.tolist()))
    rejected = int(np.count_nonzero(accepted < 4))
    assert policy.alpha_hat == pytest.approx(accepted.sum() / (accepted.sum() + rejected))
    totals_only = step_feedback(4, accepted.tolist())
    totals_only.accepted_per_sequence = None  # a driver that gives only totals: accepted / drafted
    policy.observe(totals_only)
    assert policy.alpha_hat == pytest.approx(accepted.sum() / (4 * n))


class RecordingGoodput(Goodput):
    """Goodput that remembers alpha_hat after every observation (loaded as module:Class)."""

    history: list[float] = []

    def observe(self, feedback):
        super().observe(feedback)
        RecordingGoodput.history.append(self.alpha_hat)


def test_alpha_estimate_converges_to_the_true_alpha_in_a_run(run_config):
    RecordingGoodput.history = []
    config = run_config(policy__name="tests.test_policy_goodput:RecordingGoodput", policy__alpha_init=0.9,
                        acceptance__alpha=0.6, workload__num_requests=120, workload__rate=2.0,
                        workload__prompt_tokens=64, workload__output_tokens=200)
    run = prepare(config)
    assert run.policy.alpha_hat == 0.9
    result = execute(run)
    history = np.asarray(RecordingGoodput.history)
    assert len(history) > 1000
    assert history[0] > 0.8  # it started from alpha_init = 0.9 ...
    assert history[len(history) // 2:].mean() == pytest.approx(0.6, abs=0.02)  # ... and settled at alpha
    assert history[-200:].mean() == pytest.approx(0.6, abs=0.06)
    # The run speculated more than one token on average, where accepted / drafted would be biased
    # low (to about 0.48 at k = 2): the estimate above is of alpha, not of that ratio.
    assert result.summary["mean_k"] > 1.5
    assert result.summary["acceptance_rate"] < 0.55


SHORT = [*CPU_DEFAULT_FLAGS, "--num-requests", "40", "--rate", "4", "--records", "none"]


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_run_with_policy_goodput(capsys, tmp_path, synthetic_profile):
    code, out, err = _run(capsys, "run", "--policy", "goodput", "--profile", str(synthetic_profile), *SHORT,
                          "--out", str(tmp_path / "run"))
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # The policy's defaults are recorded, so the summary says exactly what ran.
    assert summary["policy"] == {"name": "goodput", "alpha_init": 0.7, "smoothing": 0.1, "k_max": 4,
                                 "tie_break": 0.0}
    assert summary["metrics"]["completed"] == 40
    assert 1 <= summary["metrics"]["mean_k"] <= 4  # alpha 0.7 on linear costs: speculation pays


@pytest.mark.parametrize("policy,field", [
    ("k_max = 9", "policy.k_max"),
    ("alpha_init = 1.2", "policy.alpha_init"),
    ("smoothing = 0", "policy.smoothing"),
    ("tie_break = -0.1", "policy.tie_break"),
    ("k_max = 2.5", "policy.k_max"),
])
def test_bad_goodput_config_is_one_line_naming_the_parameter(capsys, tmp_path, synthetic_profile, policy, field):
    config = tmp_path / "bad.toml"
    config.write_text(f'[policy]\nname = "goodput"\n{policy}\n')
    code, _, err = _run(capsys, "run", "--config", str(config), "--profile", str(synthetic_profile), *SHORT,
                        "--out", str(tmp_path / "run"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:") and f"{field}:" in err
    assert f"{config}:3:" in err  # the file and line of the offending value
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("params,field", [
    ({"alpha_init": 0.0}, "alpha_init"),
    ({"smoothing": 1.5}, "smoothing"),
    ({"k_max": -1}, "k_max"),
    ({"k_max": True}, "k_max"),
])
def test_bad_parameters_raise_policy_error(params, field):
    with pytest.raises(PolicyError) as info:
        make_policy("goodput", params)
    assert info.value.field == field


def test_goodput_needs_a_cost_model():
    with pytest.raises(PolicyError, match="cost model"):
        Goodput().bind(7, None)


# The per-request variant: k_i = min(k*, remaining_i - 1).

def test_per_request_caps_each_k_at_what_the_sequence_still_needs():
    policy = Goodput(alpha_init=0.8, k_max=4, per_request=True)
    policy.bind(8, Synthetic())
    batch = Goodput(alpha_init=0.8, k_max=4)
    batch.bind(8, Synthetic())
    view = _view(6, 300)
    k_star = batch.choose_k(view)
    assert k_star >= 2  # speculation pays here, so the cap matters
    view.remaining_tokens = np.array([1, 2, 3, 50, 7, 2], dtype=np.int64)
    ks = policy.choose_k(view)
    assert ks.dtype == np.int64 and ks.tolist() == np.minimum(view.remaining_tokens - 1, k_star).tolist()
    view.remaining_tokens = np.array([9, 50, 7, 8, 9, 10], dtype=np.int64)
    assert policy.choose_k(view) == k_star and isinstance(policy.choose_k(view), int)  # nobody capped: uniform
    assert policy.params()["per_request"] is True and "per_request" not in batch.params()


def test_per_request_observe_counts_rejections_against_each_sequences_own_k():
    policy = Goodput(alpha_init=0.5, smoothing=1.0, k_max=4, per_request=True)
    fb = step_feedback(3, [3, 1, 0, 2])
    fb.k_per_sequence = np.array([3, 2, 0, 2])
    fb.drafted_tokens = 7
    policy.observe(fb)
    # Drafting sequences: 3 (k_i > 0). Rejections: only the one that kept 1 of 2. The k_i = 0 one tested nothing.
    assert policy.alpha_hat == pytest.approx((6 / 3) / ((6 + 1) / 3))


class RecordingPerRequest(Goodput):
    """Per-request goodput that checks every answer against the view (loaded as module:Class)."""

    ragged_steps = 0

    def choose_k(self, view):
        ks = super().choose_k(view)
        room = view.remaining_tokens - 1
        assert (np.asarray(ks) <= np.maximum(room, 0)).all() or np.ndim(ks) == 0 and (ks == 0 or room.min() >= ks)
        RecordingPerRequest.ragged_steps += np.ndim(ks) == 1
        return ks


def test_per_request_goodput_never_drafts_past_a_requests_end(run_config):
    RecordingPerRequest.ragged_steps = 0
    config = run_config(policy__name="tests.test_policy_goodput:RecordingPerRequest", policy__per_request=True,
                        acceptance__alpha=0.9, workload__num_requests=80, workload__rate=4.0,
                        workload__output_tokens="uniform:1:40")
    result = execute(prepare(config))
    assert RecordingPerRequest.ragged_steps > 20
    req = result.requests
    # Never more drafted tokens than a request had tokens to produce after its first, beyond its decode steps.
    assert (req.drafted_tokens <= (req.output_tokens - 1) * req.decode_steps).all()
    assert (req.accepted_tokens <= req.output_tokens - 1).all()
    same = execute(prepare(run_config(policy__name="goodput", policy__per_request=False, acceptance__alpha=0.9,
                                      workload__num_requests=80, workload__rate=4.0,
                                      workload__output_tokens="uniform:1:40")))
    assert result.summary["num_draft_tokens"] < same.summary["num_draft_tokens"]  # the capped drafts are saved


def test_per_request_must_be_a_boolean():
    with pytest.raises(PolicyError) as info:
        make_policy("goodput", {"per_request": "yes"})
    assert info.value.field == "per_request"


# Per-position acceptance: r_j from the sequences that tested position j, E[tokens](k) from their products.

def _brute_force_positions(accepted, ks, k_max):
    """Per position j = 1..k_max: (sequences that tested j, sequences that accepted it), one sequence at a time."""
    tested, kept = np.zeros(k_max), np.zeros(k_max)
    for a, k in zip(accepted, ks):
        for j in range(1, k_max + 1):
            tested[j - 1] += k >= j and a >= j - 1
            kept[j - 1] += a >= j
    return tested, kept


@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("n", [1, 5, 70])
def test_position_rates_are_accepted_over_tested_per_position(n, ragged):
    rng = np.random.default_rng(n + ragged)
    k_max, k = 5, 3
    ks = rng.integers(0, k + 1, n) if ragged else np.full(n, k)
    ks[0] = k
    accepted = np.minimum(rng.geometric(0.4, n) - 1, ks)
    fb = step_feedback(k, accepted.tolist())
    if ragged:
        fb.k_per_sequence, fb.drafted_tokens = ks, int(ks.sum())
    policy = Goodput(alpha_init=0.5, smoothing=1.0, k_max=k_max)  # smoothing 1: this step alone
    policy.bind(8, Synthetic())
    policy.observe(fb)
    tested, kept = _brute_force_positions(accepted, ks, k_max)
    # At smoothing 1 the EMAs are this step's counts, and alpha_hat counts as PRIOR_TESTS more tests.
    expected = (kept + PRIOR_TESTS * policy.alpha_hat) / (tested + PRIOR_TESTS)
    np.testing.assert_allclose(policy.position_rates, expected, rtol=1e-12)
    products = np.cumprod(expected)
    for j in range(k_max + 1):
        assert policy.expected_tokens(j) == pytest.approx(1 + products[:j].sum(), rel=1e-12)


def test_positions_start_at_alpha_init_so_the_first_choice_is_the_geometric_one():
    policy = Goodput(alpha_init=0.6, k_max=4)
    policy.bind(8, Synthetic())
    np.testing.assert_allclose(policy.position_rates, 0.6, rtol=1e-15)
    assert policy.expected_tokens(4) == pytest.approx((1 - 0.6 ** 5) / 0.4, rel=1e-12)


def test_position_estimates_follow_rates_that_fall_with_position():
    """P(a >= j) = 0.85, 0.55, 0.3, 0.15 (vLLM's per-position rates): each conditional rate is learnt,
    and E[tokens] is their sum of products, which one pooled rate gets wrong (here, too low at k = 1)."""
    rng = np.random.default_rng(5)
    unconditional = np.array([0.85, 0.55, 0.3, 0.15])
    policy = Goodput(alpha_init=0.7, smoothing=0.05, k_max=4)
    policy.bind(8, Synthetic())
    for _ in range(600):
        u = rng.random(256)
        policy.observe(step_feedback(4, (u[:, None] < unconditional).sum(axis=1).tolist()))
    conditional = unconditional / np.r_[1.0, unconditional[:-1]]
    np.testing.assert_allclose(policy.position_rates, conditional, atol=0.06)
    assert policy.expected_tokens(4) == pytest.approx(1 + unconditional.sum(), abs=0.1)
    a = policy.alpha_hat
    assert a < 0.75 and policy.expected_tokens(1) > 1 + a + 0.1  # the pooled rate would under-price k = 1


def test_a_position_no_longer_tested_fades_back_to_the_pooled_rate():
    policy = Goodput(alpha_init=0.7, smoothing=0.2, k_max=4)
    policy.bind(8, Synthetic())
    for _ in range(20):
        policy.observe(step_feedback(4, [3, 3, 3, 3, 3, 3, 4, 0]))  # position 4: 1 kept of 7 tested
    assert abs(policy.position_rates[3] - policy.alpha_hat) > 0.1  # position 4 has its own estimate ...
    for _ in range(40):
        policy.observe(step_feedback(1, [1, 0, 1, 1, 0, 1, 1, 1]))
    assert policy.position_rates[3] == pytest.approx(policy.alpha_hat, abs=1e-3)  # ... until its evidence fades
    assert policy.position_rates[0] == pytest.approx(0.75, abs=0.01)  # position 1, still tested: 6 of 8


class Linear:
    """One row's step as the H200 validation's refitted profile prices it: 7.35 ms at k = 0, 10.07 ms at
    k = 1 (the draft's first pass and the verification), 1.94 ms a draft token after."""

    @staticmethod
    def step_time(b, k, c):
        return 0.00735 + (0.00078 if k else 0.0) + 0.00194 * k


def test_a_k_zero_step_moves_the_estimates_back_towards_the_prior():
    policy = Goodput(alpha_init=0.7, smoothing=0.1, k_max=3)
    policy.bind(8, Linear())
    for k in (3, 2, 1):
        policy.observe(step_feedback(k, [0]))  # one row rejects its first draft, three steps running
    accepted = 0.7 * 0.9 ** 3
    assert policy.alpha_hat == pytest.approx(accepted, rel=1e-12)  # tested stays 1 a row
    r1 = policy.position_rates[0]
    assert r1 < 0.4 < policy.alpha_hat
    policy.observe(step_feedback(0, [0]))  # a k = 0 step: FADE of an observation's way back
    assert policy.alpha_hat == pytest.approx(accepted + FADE * 0.1 * (0.7 - accepted), rel=1e-12)
    assert r1 < policy.position_rates[0] < policy.alpha_hat
    for _ in range(800):
        policy.observe(step_feedback(0, [0]))
    np.testing.assert_allclose(policy.position_rates, 0.7, atol=1e-6)
    assert policy.alpha_hat == pytest.approx(0.7, abs=1e-6)


def test_early_rejections_do_not_hold_goodput_at_k_zero():
    """The H200 validation's goodput case (docs/validation.md): three rejections of one row priced every
    k >= 1 below k = 0, and a k = 0 step tested nothing again, so it stayed at k = 0 for good."""
    policy = Goodput(alpha_init=0.7, smoothing=0.1, k_max=3)
    policy.bind(8, Linear())
    assert policy.choose_k(_view(1, 300)) >= 1  # at the prior, speculation pays
    for k in (3, 2, 1):
        policy.observe(step_feedback(k, [0]))
    assert policy.choose_k(_view(1, 300)) == 0  # the evidence says so, for now
    steps = 0
    while policy.choose_k(_view(1, 300)) == 0:
        policy.observe(step_feedback(0, [0]))
        steps += 1
        assert steps < 40
    assert steps >= 1
    # Where acceptance is truly that low, goodput tries again only now and then: over 200 steps of
    # rows that keep no draft, about one step in ten speculates.
    tries = 0
    for _ in range(200):
        k = policy.choose_k(_view(1, 300))
        policy.observe(step_feedback(k, [0]))
        tries += k > 0
    assert 5 <= tries <= 30
