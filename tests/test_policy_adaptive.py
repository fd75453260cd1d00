"""The ``adaptive`` policy: a bandit that finds the best k from step times alone, the switch-off rule, the CLI."""

from __future__ import annotations

import numpy as np
import pytest

from policies import BatchView, PolicyError, StepFeedback, make_policy
from policies.adaptive import Adaptive
from specbatch.commands.cli import main
from sim.config import load_config
from sim.serving.records import DECODE
from sim.simulate import simulate
from tests.synthetic import make_profile
from tests.conftest import CPU_DEFAULTS


def knee_at_four(phase: str, model: str, b: int, q: int, c: int) -> float:
    """The target verifies up to 4 tokens per sequence for the price of 1, and each token beyond costs a
    full pass: at alpha = 0.9, k = 3 is clearly best (time per token 9% below k = 2, 45% below k = 4)."""
    if phase == "prefill":
        return 0.005 + 1e-5 * b * q
    if phase == "decode":
        if model == "draft":
            return 0.0005
        return 0.020 * (1 + 0.02 * b) * max(1, q - 3)
    return 0.0002


@pytest.fixture(scope="module")
def knee_profile(tmp_path_factory):
    return make_profile(tmp_path_factory.mktemp("profiles") / "knee", knee_at_four, batch=(1, 2, 4, 8, 16))


def _simulate(profile, alpha=0.9, **policy):
    flags = {"profile": (str(profile), "--profile"), "policy.name": ("adaptive", "--policy"),
             "acceptance.alpha": (alpha, "--alpha"), "workload.num_requests": (40, "--num-requests"),
             "workload.rate": (2.0, "--rate"), "workload.prompt_tokens": (32, "--prompt-tokens"),
             "workload.output_tokens": (150, "--output-tokens"), "engine.max_batch_size": (16, "--max-batch-size")}
    for key, value in policy.items():
        flags[f"policy.{key}"] = (value, f"--{key}")
    result = simulate(load_config(CPU_DEFAULTS, flags))
    return result, result.steps.k[result.steps.phase == DECODE].to_numpy()


def test_bandit_settles_on_the_best_k(knee_profile):
    _, ks = _simulate(knee_profile)
    assert len(ks) > 300
    later = ks[len(ks) // 2:]
    assert np.mean(later == 3) > 0.7, np.bincount(later, minlength=5)
    assert np.mean(later == 4) < 0.1  # the expensive arm is hardly re-tried


def test_runs_are_deterministic(knee_profile):
    (a, ka), (b, kb) = _simulate(knee_profile), _simulate(knee_profile)
    assert np.array_equal(ka, kb) and a.summary == b.summary


def test_low_acceptance_switches_speculation_off(knee_profile):
    _, plain = _simulate(knee_profile, alpha=0.05)
    policy_params = {"disable_below": 0.3, "cooldown_steps": 40}
    result, ks = _simulate(knee_profile, alpha=0.05, **policy_params)
    # Verifying up to 4 tokens is free here, so even at alpha = 0.05 the bandit alone keeps drafting (k >= 1
    # is a little better than k = 0; about 80% of steps draft). The rule turns speculation off for runs of
    # 40 steps at a time, and far fewer steps draft.
    assert np.mean(ks > 0) < 0.5 * np.mean(plain > 0)
    runs = np.diff(np.flatnonzero(np.diff(np.r_[1, ks, 1] == 0)))[::2]  # lengths of runs of k = 0
    assert runs.max() >= 40


def _view(b: int) -> BatchView:
    view = BatchView(4)
    view.batch_size = view.running = b
    return view


def _feedback(b: int, k: int, accepted: int, step_time_s: float) -> StepFeedback:
    fb = StepFeedback()
    fb.batch_size, fb.k, fb.step_time_s = b, k, step_time_s
    fb.drafted_tokens, fb.accepted_tokens = k * b, accepted
    return fb


def test_reward_is_tokens_per_sequence_per_second_and_arms_are_tried_in_order():
    policy = Adaptive(k_max=2, discount=1.0, exploration=0.0, by_batch_size=False)
    tokens_per_s = {0: 10.0, 1: 30.0, 2: 20.0}  # per sequence
    for expected_k in (0, 1, 2):
        k = policy.choose_k(_view(4))
        assert k == expected_k  # unplayed arms first, k = 0 upwards
        policy.observe(_feedback(4, k, accepted=4 * k, step_time_s=(k + 1) / tokens_per_s[k]))
    assert policy.means(4) == pytest.approx([10.0, 30.0, 20.0])
    assert policy.choose_k(_view(8)) == 1  # greedy with no exploration; one bandit for every batch size


def test_one_bandit_per_power_of_two_batch_bucket():
    policy = Adaptive()
    assert [policy.bucket(b) for b in (1, 2, 3, 4, 7, 8, 31, 32)] == [0, 1, 1, 2, 2, 3, 4, 5]
    assert Adaptive(by_batch_size=False).bucket(32) == 0


def test_discount_forgets_old_rewards():
    policy = Adaptive(k_max=0, discount=0.5)
    for t in (1.0, 1.0, 1.0, 0.1):  # rewards 1, 1, 1, then 10 tokens per second
        policy.choose_k(_view(1))
        policy.observe(_feedback(1, 0, 0, t))
    assert policy.means(1)[0] == pytest.approx((10 + 0.5 + 0.25 + 0.125) / (1 + 0.5 + 0.25 + 0.125))


@pytest.mark.parametrize("params,field", [
    ({"discount": -0.5}, "discount"),
    ({"discount": 0.0}, "discount"),
    ({"exploration": -1}, "exploration"),
    ({"k_max": -1}, "k_max"),
    ({"k_max": 2.0}, "k_max"),
    ({"by_batch_size": 1}, "by_batch_size"),
    ({"disable_below": 1.5}, "disable_below"),
    ({"cooldown_steps": 0}, "cooldown_steps"),
    ({"probe_steps": 0}, "probe_steps"),
])
def test_bad_parameters_raise_policy_error(params, field):
    with pytest.raises(PolicyError) as info:
        make_policy("adaptive", params)
    assert info.value.field == field


@pytest.mark.parametrize("policy,field", [("k_max = 9", "policy.k_max"), ("discount = -0.1", "policy.discount")])
def test_bad_config_is_one_line_through_the_cli(capsys, tmp_path, synthetic_profile, policy, field):
    config = tmp_path / "bad.toml"
    config.write_text(f'[policy]\nname = "adaptive"\n{policy}\n')
    code = main(["run", "--config", str(config), "--profile", str(synthetic_profile), "--num-requests", "10",
                 "--records", "none", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:") and f"{field}:" in err
    assert f"{config}:3:" in err
    assert not (tmp_path / "run").exists()
