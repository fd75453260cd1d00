"""The acceptance model (sim/speculation/acceptance.py): how many draft tokens a verification step keeps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.speculation.acceptance import (AcceptanceSampler, AcceptanceSpec, PositionSampler, SharedAlphaSampler, acceptance_scale,
                            expected_tokens_per_step)


def _truncated_geometric(alpha: float, k: int) -> np.ndarray:
    """Exact P(a = j), j = 0..k, for a = min(G, k) with P(G >= j) = alpha^j."""
    p = np.array([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k])
    assert math.isclose(p.sum(), 1.0)
    return p


def _draw(alphas: np.ndarray, k: int, seed: int = 0, batch: int = 1000, block: int = 1 << 16) -> np.ndarray:
    """Accepted counts for every row of ``alphas``, drawn ``batch`` rows per step."""
    sampler = AcceptanceSampler(np.random.default_rng(seed), block=block)
    scale = acceptance_scale(alphas)
    return np.concatenate([sampler.accepted(scale[i:i + batch], k) for i in range(0, alphas.size, batch)])


@pytest.mark.parametrize("alpha", [0.001, 0.3, 0.7, 0.999])
@pytest.mark.parametrize("k", [0, 1, 4])
def test_accepted_counts_are_integers_in_zero_to_k(alpha, k):
    a = _draw(np.full(5000, alpha), k)
    assert a.dtype == np.int64 and a.shape == (5000,)
    assert a.min() >= 0 and a.max() <= k
    if k == 0:
        assert not a.any()


@pytest.mark.parametrize("alpha,k", [(0.7, 4), (0.5, 2), (0.9, 6)])
def test_probability_of_at_least_j_accepted_is_alpha_to_the_j(alpha, k):
    n = 100_000
    a = _draw(np.full(n, alpha), k, seed=1)
    for j in range(1, k + 1):
        p = alpha**j
        assert abs(np.mean(a >= j) - p) < 5 * math.sqrt(p * (1 - p) / n), j
    assert a.max() == k  # the cap is reached, and never exceeded


@pytest.mark.parametrize("alpha,k", [(0.7, 3), (0.4, 5), (0.95, 8)])
def test_mean_emitted_tokens_match_expected_tokens_per_step(alpha, k):
    n = 100_000
    a = _draw(np.full(n, alpha), k, seed=2)
    p = _truncated_geometric(alpha, k)
    j = np.arange(k + 1)
    var = float(np.sum(p * j**2) - np.sum(p * j) ** 2)
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert abs(np.mean(a + 1) - expected) < 5 * math.sqrt(var / n)


def test_each_row_uses_its_own_alpha():
    n, k = 60_000, 4
    alphas = np.where(np.arange(n) % 2 == 0, 0.3, 0.9)  # interleaved so every step mixes the groups
    a = _draw(alphas, k, seed=3, batch=777)
    for alpha, rows in ((0.3, a[0::2]), (0.9, a[1::2])):
        p = _truncated_geometric(alpha, k)
        j = np.arange(k + 1)
        mean, var = float(np.sum(p * j)), float(np.sum(p * j**2) - np.sum(p * j) ** 2)
        assert abs(rows.mean() - mean) < 5 * math.sqrt(var / rows.size), alpha


def test_draws_continue_correctly_across_small_blocks():
    # block=5 forces a refill almost every step; the statistics must not change.
    n, alpha, k = 40_000, 0.6, 3
    a = _draw(np.full(n, alpha), k, seed=4, batch=13, block=5)
    p = alpha**2
    assert abs(np.mean(a >= 2) - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_sampler_is_deterministic_for_a_seed():
    alphas = np.random.default_rng(9).uniform(0.1, 0.95, 3000)
    np.testing.assert_array_equal(_draw(alphas, 5, seed=8, batch=100, block=64),
                                  _draw(alphas, 5, seed=8, batch=100, block=64))
    assert not np.array_equal(_draw(alphas, 5, seed=8), _draw(alphas, 5, seed=9))


@pytest.mark.parametrize("block", [1, 7, 64])
@pytest.mark.parametrize("alpha", [0.35, 0.8])
def test_shared_alpha_sampler_gives_exactly_the_general_samplers_counts(block, alpha):
    scale = float(acceptance_scale(np.array([alpha]))[0])
    general = AcceptanceSampler(np.random.default_rng(123), block=block)
    shared = SharedAlphaSampler(np.random.default_rng(123), scale, block=block)
    plan = np.random.default_rng(0)
    total = 0
    for _ in range(300):
        n = int(plan.choice([0, 1, 2, 5, block - 1, block, block + 1, 3 * block + 2]))
        k = int(plan.integers(0, 8))
        expected = general.accepted(np.full(n, scale), k)
        got = shared.accepted(np.full(n, scale), k)
        assert got.dtype == expected.dtype == np.int64
        np.testing.assert_array_equal(got, expected)
        total += int(expected.sum())
    assert total > 0


# ---------------------------------------------------------------------------------------------- spec


@pytest.mark.parametrize("alpha", [0.0, 1.0, 1.5, -0.2, math.nan])
def test_spec_rejects_alpha_outside_the_open_unit_interval(alpha):
    with pytest.raises(ValueError, match="alpha must be inside \\(0, 1\\)"):
        AcceptanceSpec(alpha=alpha)


def test_spec_rejects_unknown_distribution():
    with pytest.raises(ValueError, match="distribution must be one of fixed, beta"):
        AcceptanceSpec(alpha=0.5, distribution="uniform")


@pytest.mark.parametrize("concentration", [0.0, -1.0, math.inf, math.nan])
def test_spec_rejects_bad_concentration(concentration):
    with pytest.raises(ValueError, match="concentration"):
        AcceptanceSpec(alpha=0.5, distribution="beta", concentration=concentration)


def test_fixed_distribution_gives_every_request_alpha():
    np.testing.assert_array_equal(AcceptanceSpec(alpha=0.65).request_alphas(np.random.default_rng(0), 4),
                                  np.full(4, 0.65))


@pytest.mark.parametrize("alpha,concentration", [(0.7, 10.0), (0.2, 3.0), (0.9, 50.0)])
def test_beta_request_alphas_have_mean_alpha_and_variance_set_by_concentration(alpha, concentration):
    n = 50_000
    draws = AcceptanceSpec(alpha, "beta", concentration).request_alphas(np.random.default_rng(5), n)
    var = alpha * (1 - alpha) / (concentration + 1)  # Beta(alpha c, (1 - alpha) c)
    assert abs(draws.mean() - alpha) < 5 * math.sqrt(var / n)
    centred = draws - draws.mean()
    se_var = math.sqrt((np.mean(centred**4) - draws.var() ** 2) / n)
    assert abs(draws.var() - var) < 5 * se_var


def test_beta_request_alphas_lie_strictly_inside_the_unit_interval():
    # A tiny concentration pushes most Beta draws to exactly 0.0 or 1.0 in floating point.
    draws = AcceptanceSpec(0.5, "beta", 0.01).request_alphas(np.random.default_rng(6), 10_000)
    assert np.all(draws > 0) and np.all(draws < 1)
    scale = acceptance_scale(draws)
    assert np.all(np.isfinite(scale)) and np.all(scale > 0)


# ---------------------------------------------------------------------------------------------- formulas


@pytest.mark.parametrize("alpha,k,expected", [
    (0.5, 0, 1.0),
    (0.5, 1, 1.5),
    (0.5, 3, 1.875),
    (0.7, 3, 1 + 0.7 + 0.49 + 0.343),
    (0.9, 7, sum(0.9**j for j in range(8))),
])
def test_expected_tokens_per_step_formula(alpha, k, expected):
    assert expected_tokens_per_step(alpha, k) == pytest.approx(expected, rel=1e-12)


def test_expected_tokens_per_step_is_vectorised():
    np.testing.assert_allclose(expected_tokens_per_step(np.array([0.5, 0.7]), 2), [1.75, 2.19])


def test_acceptance_scale_is_one_over_minus_log_alpha():
    np.testing.assert_allclose(acceptance_scale(np.array([math.exp(-1), math.exp(-0.5)])), [1.0, 2.0])


@pytest.mark.parametrize("make", [
    lambda rng, block: AcceptanceSampler(rng, block=block),
    lambda rng, block: SharedAlphaSampler(rng, 2.5, block=block),
    lambda rng, block: PositionSampler(rng, np.array([0.8, 0.6, 0.5, 0.4]), block=block)])
@pytest.mark.parametrize("block", [1, 6, 50])
def test_blocks_drawn_ahead_give_the_stream_drawn_in_one_go(make, block):
    """Each refill's next block is drawn on a worker thread while the run goes on; the counts are those of
    the stream drawn at once, whatever sizes the steps ask for (larger than a block too), and a sampler
    pickled with a block in flight goes on with the same stream."""
    import pickle

    plan = np.random.default_rng(1)
    sizes = [int(plan.choice([0, 1, 3, block, block + 1, 4 * block + 3])) for _ in range(200)]
    ks = [int(plan.integers(0, 6)) for _ in sizes]
    scale = acceptance_scale(np.full(max(sizes), 0.7))
    ahead = make(np.random.default_rng(5), block)
    assert type(ahead).draws_ahead
    once = make(np.random.default_rng(5), 10 * sum(sizes) + block)  # one block holds every draw: never refills
    for step, (n, k) in enumerate(zip(sizes, ks)):
        if step == 100:
            ahead = pickle.loads(pickle.dumps(ahead))
        np.testing.assert_array_equal(ahead.accepted(scale[:n], k), once.accepted(scale[:n], k))
    assert ahead._ahead is not None  # a block was being drawn ahead


def test_a_process_forked_after_drawing_ahead_draws_on_its_own_thread():
    """A child forked from a process whose draws thread ran (a user's own fork-based pool) gets a fresh
    one: the inherited executor has no thread in the child, and a block submitted to it would never come."""
    import os
    import subprocess
    import sys

    script = """
import os, numpy as np
from sim.speculation.acceptance import AcceptanceSampler, acceptance_scale
scale = acceptance_scale(np.full(8, 0.7))
AcceptanceSampler(np.random.default_rng(0), block=4).accepted(scale, 3)  # starts the parent's thread
pid = os.fork()
if pid == 0:
    sampler = AcceptanceSampler(np.random.default_rng(1), block=4)
    for _ in range(5):
        sampler.accepted(scale, 3)  # each refill waits for a block drawn ahead
    os._exit(0)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
