"""goodput prices what the engine charges (the draft's catch-up), and the issue-12 high-load case.

The GPU-like profile of issue 12 (tests/gpu_like.py): a target step of about 10 ms + 0.3 ms
per token of batch x q, a draft a tenth of it, max batch 64, alpha = 0.7, at 90% of the
saturation rate without speculation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from policies import BatchView
from policies.goodput import Goodput
from sim.simulate import execute, prepare
from tests.gpu_like import latency, make_gpu_like_profile

STUDIES = Path(__file__).resolve().parent.parent / "docs" / "studies"
SHORT = {"workload.prompt_tokens": "lognormal:32:0.5:128", "workload.output_tokens": "lognormal:32:0.5:128"}
HIGH_LOAD = 0.9
SEEDS = (0, 1, 2, 3)
NUM_REQUESTS = 300
# goodput's mean E2EL, averaged over the seeds, may exceed the average of each seed's best comparable
# policy by at most GOODPUT_MARGIN (as in tests/test_study_traffic_rates.py), and any one seed's by
# at most SEED_MARGIN: near saturation 300 requests are noisy. Measured with per-position pricing,
# geometric acceptance: +1.3% on average, worst seed +6.5% (free draft prefill; one pooled alpha:
# +0.6%, +5.3%); +4.2% on average, worst seed +6.2% (the issue's profile; one pooled alpha: +2.1%,
# +3.0%; over seeds 4..15 instead: +2.2% against +2.3%, so these four seeds are unlucky ones).
# Per-position acceptance: +0.2% on average, worst seed +3.6% (free draft prefill); +2.1%, worst
# seed +3.6% (the issue's profile).
GOODPUT_MARGIN = 0.05
SEED_MARGIN = 0.10
# Acceptance models the property must hold under: geometric alpha, and vLLM-style per-position
# rates P(a >= j) that fall faster than any one alpha (goodput learns them position by position).
ACCEPTANCE = {"geometric": {"acceptance.alpha": 0.7},
              "per-position": {"acceptance.model": "per-position", "acceptance.per_position": [0.85, 0.55, 0.3, 0.15]}}


class PricedGoodput(Goodput):
    """goodput that remembers, per decode step, the price of the k it chose (loaded as module:Class)."""

    prices: list[float] = []

    def choose_k(self, view):
        k = super().choose_k(view)
        PricedGoodput.prices.append(self.priced_time(view.batch_size, k, view.mean_context_tokens, view.max_lag))
        return k


@pytest.fixture(scope="module")
def gpu_like(tmp_path_factory) -> Path:
    return make_gpu_like_profile(tmp_path_factory.mktemp("profiles") / "gpu-like")


@pytest.fixture(scope="module")
def gpu_like_free_draft_prefill(tmp_path_factory) -> Path:
    """The same profile with a free draft prefill: a run with a draft then pays nothing that
    `none` does not, so goodput can be held to min(none, best fixed k) itself. The free prefill is the
    making of this profile's only: a profile made after it (``gpu_like``, in whatever order the tests
    run) has the draft's prefill priced."""
    import tests.gpu_like as module

    with pytest.MonkeyPatch.context() as free:
        free.setattr(module, "latency", lambda phase, model, b, q, c=0: (
            1e-9 if phase == "prefill" and model == "draft" else latency(phase, model, b, q)))
        return make_gpu_like_profile(tmp_path_factory.mktemp("profiles") / "gpu-like-free-draft-prefill")


def _rates():
    if str(STUDIES) not in sys.path:
        sys.path.insert(0, str(STUDIES))
    import rates
    return rates


def _config(profile: Path, policy: str, seed: int, rate: float, acceptance: dict, **extra):
    from serving import study_config

    _rates()
    return study_config(str(profile), policy, seed, {"engine.max_batch_size": 64, "workload.rate": rate,
                                                     "workload.num_requests": NUM_REQUESTS, **SHORT, **acceptance,
                                                     **extra})


def test_every_decode_step_costs_what_goodput_priced_it_at(gpu_like):
    rates = _rates()
    acceptance = ACCEPTANCE["geometric"]
    sat = rates.saturation_rate(str(gpu_like), num_requests=NUM_REQUESTS, extra={**SHORT, **acceptance})
    PricedGoodput.prices = []  # v0: every decode step is the policy's step alone (vllm-v1 adds chunks to some)
    run = prepare(_config(gpu_like, f"{__name__}:PricedGoodput", 0, HIGH_LOAD * sat, acceptance,
                          **{"engine.scheduler": "v0"}))
    steps = execute(run).steps
    decode = steps[steps.phase == 1]
    charged = (decode.end_s - decode.start_s).to_numpy()
    assert len(PricedGoodput.prices) == len(decode)
    assert (decode.k > 0).any() and (decode.k == 0).any()
    np.testing.assert_allclose(charged, PricedGoodput.prices, rtol=1e-9, atol=1e-12)


def _mean_e2el(profile: Path, policies: list[tuple[str, str, dict]], acceptance: dict) -> dict[tuple, float]:
    from sim.simulate import simulate

    rates = _rates()
    sat = rates.saturation_rate(str(profile), num_requests=NUM_REQUESTS, extra={**SHORT, **acceptance})
    out = {}
    for seed in SEEDS:
        for label, name, extra in policies:
            summary = simulate(_config(profile, name, seed, HIGH_LOAD * sat, acceptance, **extra)).summary
            out[label, seed] = summary["mean_e2el_ms"]
    return out


FIXED = [(f"k={k}", "fixed", {"policy.k": k}) for k in range(1, 5)]
GOODPUT = [("goodput", "goodput", {})]


@pytest.mark.parametrize("acceptance", sorted(ACCEPTANCE))
def test_high_load_goodput_never_much_worse_than_none_or_best_fixed_k(gpu_like_free_draft_prefill, acceptance):
    """Where a draft costs nothing unless it drafts, goodput tracks the better of `none` and fixed k."""
    e2el = _mean_e2el(gpu_like_free_draft_prefill, [("none", "none", {}), *FIXED, *GOODPUT], ACCEPTANCE[acceptance])
    _assert_tracks(e2el, ("none", "k=1", "k=2", "k=3", "k=4"))


def _assert_tracks(e2el: dict[tuple, float], baselines: tuple[str, ...]) -> None:
    best = {seed: min(e2el[label, seed] for label in baselines) for seed in SEEDS}
    for seed in SEEDS:
        assert e2el["goodput", seed] <= best[seed] * (1 + SEED_MARGIN), (seed, e2el)
    mean_goodput = sum(e2el["goodput", seed] for seed in SEEDS) / len(SEEDS)
    assert mean_goodput <= sum(best.values()) / len(SEEDS) * (1 + GOODPUT_MARGIN), e2el


@pytest.mark.parametrize("acceptance", sorted(ACCEPTANCE))
def test_high_load_with_the_drafts_prefill(gpu_like, acceptance, monkeypatch):
    """With the draft's prefill charged (the issue's profile), `none` is the only policy that does not
    pay it; goodput tracks the best policy that keeps the draft: fixed k, or never drafting (the
    benchmark's DraftIdle, benchmarks/goodput_vs_fixed.py)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    idle = ("draft-idle", "goodput_vs_fixed:DraftIdle", {})
    e2el = _mean_e2el(gpu_like, [("none", "none", {}), idle, *FIXED, *GOODPUT], ACCEPTANCE[acceptance])
    _assert_tracks(e2el, ("draft-idle", "k=1", "k=2", "k=3", "k=4"))
    for seed in SEEDS:
        # The draft's prefill alone costs more than the margin at this load: `none` beats even a
        # run that never drafts (docs/policy-goodput.md says so).
        assert e2el["none", seed] < e2el["draft-idle", seed] / (1 + GOODPUT_MARGIN), (seed, e2el)


class WithCatchUp:
    """A cost model whose speculative steps pay the draft's catch-up: 1.4 ms per lagging token at b = 47."""

    max_batch = 64

    @staticmethod
    def step_time(b, k, c):
        return 0.010 + 3e-4 * b * (k + 1) + k * 0.1 * (0.010 + 3e-4 * b)

    @staticmethod
    def catch_up_time(b, lag, c):
        return 0.1 * 3e-4 * b * (max(lag, 1) - 1)


@pytest.mark.parametrize("lag", [1, 2, 5, 40, 900])
def test_the_catch_up_is_priced_into_every_k_from_one(lag):
    cost = WithCatchUp()
    policy = Goodput(alpha_init=0.7, k_max=4)
    policy.bind(8, cost)
    view = BatchView(8)
    view.batch_size = view.running = 47
    view.lag_tokens = np.array([1] * 46 + [lag])
    expected = [(1 - 0.7 ** (k + 1)) / 0.3 / (cost.step_time(47, k, 0) + (cost.catch_up_time(47, lag, 0) if k else 0))
                for k in range(5)]
    assert policy.choose_k(view) == int(np.argmax(expected))
    assert policy.expected_goodput(47, 1, 0, lag) == pytest.approx(47 * expected[1])
    if lag == 900:  # the issue's step: 1.29 s of catch-up on a 42 ms step is never worth it
        assert policy.choose_k(view) == 0
    if lag == 1:
        assert policy.choose_k(view) == 1


def test_the_debt_of_k0_steps_is_spread_over_the_rows_remaining_tokens():
    """Past a lag of 2 the catch-up is debt a k = 0 step only grows: priced per step at E[tokens](k) /
    horizon of it (the rows' mean remaining tokens), it no longer keeps the policy at k = 0 until
    the lagging rows finish; what recurs (up to lag 2) is still priced whole."""
    cost = WithCatchUp()
    policy = Goodput(alpha_init=0.7, k_max=4)
    policy.bind(8, cost)
    b, lag, horizon = 20, 300, 150
    view = BatchView(8)
    view.batch_size = view.running = b
    view.lag_tokens = np.array([1] * (b - 1) + [lag])
    view.remaining_tokens = np.full(b, horizon)
    tokens = [(1 - 0.7 ** (k + 1)) / 0.3 for k in range(5)]
    recurring = cost.catch_up_time(b, 2, 0)
    debt = cost.catch_up_time(b, lag, 0) - recurring
    spread = [1 / cost.step_time(b, 0, 0)] + [
        tokens[k] / (cost.step_time(b, k, 0) + recurring + debt * tokens[k] / horizon) for k in range(1, 5)]
    whole = [1 / cost.step_time(b, 0, 0)] + [
        tokens[k] / (cost.step_time(b, k, 0) + recurring + debt) for k in range(1, 5)]
    assert int(np.argmax(whole)) == 0  # priced whole, 179 ms of catch-up on a 24 ms step
    assert policy.choose_k(view) == int(np.argmax(spread)) >= 1
    view.remaining_tokens = np.full(b, 1)  # a token left each: the catch-up buys nothing more, priced whole
    assert policy.choose_k(view) == 0
    view.lag_tokens = np.array([1] * (b - 1) + [2])  # lag 2 recurs: whole, whatever the horizon
    view.remaining_tokens = np.full(b, horizon)
    at_two = [1 / cost.step_time(b, 0, 0)] + [tokens[k] / (cost.step_time(b, k, 0) + recurring) for k in range(1, 5)]
    assert policy.choose_k(view) == int(np.argmax(at_two))


# The issue's traffic (prompts ~256, outputs ~200 tokens) on the issue-12 profile with a free draft
# prefill, at 80% of saturation: the batch sits where k = 1 and k = 0 deliver about the same tokens
# per second, so goodput's k = 0 steps build a draft lag of hundreds of tokens. Priced whole, that
# catch-up kept it at k = 0 until the lagging rows finished: +5.0% over fixed k = 1 on seed 2 under
# both schedulers (+2.3% / +2.7% on seed 0). With the debt spread: at most +2.7% (seed 0, v0).
ISSUE_TRAFFIC = {"workload.prompt_tokens": "lognormal:256:0.5:1024", "workload.output_tokens": "lognormal:200:0.5:1024",
                 "workload.num_requests": 400}
LOCK_IN_LOAD = 0.8
LOCK_IN_MARGIN = 0.03


@pytest.mark.parametrize("scheduler", ["vllm-v1", "v0"])
def test_k0_stretches_do_not_lock_goodput_out_of_speculating(gpu_like_free_draft_prefill, scheduler):
    from sim.simulate import simulate

    rates = _rates()
    acceptance = ACCEPTANCE["geometric"]
    extra = {**ISSUE_TRAFFIC, "engine.scheduler": scheduler}
    sat = rates.saturation_rate(str(gpu_like_free_draft_prefill), num_requests=400,
                                extra={k: v for k, v in extra.items() if k != "workload.num_requests"} | acceptance)
    for seed in (0, 1, 2):
        e2el = {}
        for label, name, more in [("none", "none", {}), *FIXED[:3], *GOODPUT]:
            config = _config(gpu_like_free_draft_prefill, name, seed, LOCK_IN_LOAD * sat, acceptance, **extra, **more)
            e2el[label] = simulate(config).summary["mean_e2el_ms"]
        best = min(v for label, v in e2el.items() if label != "goodput")
        assert e2el["goodput"] <= best * (1 + LOCK_IN_MARGIN), (seed, e2el)


def test_the_spread_catch_up_is_the_same_compiled_and_interpreted(gpu_like_free_draft_prefill):
    """The kernel prices goodput's candidates with the same rule (policies/goodput_rules.py): records
    to the bit, on a run whose k = 0 stretches leave lags far beyond 2."""
    rates = _rates()
    acceptance = ACCEPTANCE["geometric"]
    sat = rates.saturation_rate(str(gpu_like_free_draft_prefill), num_requests=400,
                                extra={k: v for k, v in ISSUE_TRAFFIC.items() if k != "workload.num_requests"}
                                | acceptance)
    runs = [execute(prepare(_config(gpu_like_free_draft_prefill, "goodput", 2, LOCK_IN_LOAD * sat, acceptance,
                                    **ISSUE_TRAFFIC, **{"engine.jit": jit}))) for jit in ("off", "on")]
    off, on = runs
    assert off.summary == on.summary
    for name, column in off.step_columns.items():
        assert np.array_equal(column, on.step_columns[name]), name
    k = off.step_columns["k"][off.step_columns["phase"] != 0]  # decode steps
    after_two_zeros = (k[2:] > 0) & (k[1:-1] == 0) & (k[:-2] == 0)
    assert after_two_zeros.sum() >= 2  # it speculated again after k = 0 stretches (lags of 3 or more)
