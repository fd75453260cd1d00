"""The rejection sampler keeps the target distribution exactly (checked statistically, fixed seed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from calibrate.verify import PAD, verify, verify_logits  # noqa: E402

N = 100_000  # sequences per test: one vectorised call
CHI2_BOUND = 40.0  # 5 degrees of freedom: P(chi2 > 40) ~ 1e-7; seeds are fixed, so this cannot flake


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _chi2(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def _case(k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    target = torch.softmax(2 * torch.randn(k + 1, 6, generator=g), -1)
    draft = torch.softmax(2 * torch.randn(k, 6, generator=g), -1)
    draft_b = draft.expand(N, k, 6)
    tokens = torch.multinomial(draft_b.reshape(-1, 6), 1, generator=g).view(N, k)
    return target.expand(N, k + 1, 6), draft_b, tokens


def test_accepted_counts_and_token_layout() -> None:
    target, draft, tokens = _case(3)
    res = verify(target, draft, tokens, _gen(1))
    assert res.accepted.shape == (N,) and res.tokens.shape == (N, 4)
    assert int(res.accepted.min()) >= 0 and int(res.accepted.max()) <= 3
    pos = torch.arange(4)
    kept = pos < res.accepted[:, None]
    assert torch.equal(res.tokens[:, :3][kept[:, :3]], tokens[kept[:, :3]])  # accepted drafts come first
    assert (res.tokens[pos > res.accepted[:, None]] == PAD).all()
    last = res.tokens.gather(1, res.accepted[:, None]).squeeze(1)
    assert ((last >= 0) & (last < 6)).all()
    assert torch.equal(res.emitted, res.accepted + 1)


def test_emitted_tokens_follow_the_target_distribution() -> None:
    k = 3
    target, draft, tokens = _case(k, seed=3)
    res = verify(target, draft, tokens, _gen(4))
    for j in range(k + 1):
        reached = res.accepted >= j  # a token is emitted at position j
        assert int(reached.sum()) > 2_000
        assert _chi2(res.tokens[reached, j], target[0, j]) < CHI2_BOUND, f"position {j}"


def test_acceptance_rate_matches_theory() -> None:
    target, draft, tokens = _case(1, seed=5)
    res = verify(target, draft, tokens, _gen(6))
    alpha = float(torch.minimum(target[0, 0], draft[0, 0]).sum())  # P(accept) = sum_x min(p_t, p_d)
    observed = float(res.accepted.float().mean())
    assert abs(observed - alpha) < 5 * (alpha * (1 - alpha) / N) ** 0.5 + 1e-9


def test_k0_samples_the_target() -> None:
    target = torch.softmax(torch.randn(1, 6, generator=_gen(7)), -1).expand(N, 1, 6)
    res = verify(target, torch.empty(N, 0, 6), torch.empty(N, 0, dtype=torch.long), _gen(8))
    assert res.tokens.shape == (N, 1) and int(res.accepted.abs().sum()) == 0
    assert _chi2(res.tokens[:, 0], target[0, 0]) < CHI2_BOUND


def test_identical_draft_is_always_accepted_and_impossible_one_never() -> None:
    target, draft, tokens = _case(2, seed=9)
    same = verify(target[:1000, :, :].clone().index_copy(1, torch.arange(2), draft[:1000]), draft[:1000],
                  tokens[:1000], _gen(10))
    assert (same.accepted == 2).all()
    zero = target[:1000].clone()
    zero[:, 0].scatter_(1, tokens[:1000, :1], 0.0)  # the target never produces the drafted token
    res = verify(zero, draft[:1000], tokens[:1000], _gen(11))
    assert (res.accepted == 0).all() and (res.tokens[:, 0] != tokens[:1000, 0]).all()


def test_verify_logits_and_shape_check() -> None:
    logits = torch.randn(4, 3, 10, generator=_gen(12))
    draft = torch.softmax(torch.randn(4, 2, 10, generator=_gen(13)), -1)
    res = verify_logits(logits, draft, torch.zeros(4, 2, dtype=torch.long), _gen(14))
    assert res.tokens.shape == (4, 3)
    with pytest.raises(ValueError):
        verify(torch.softmax(logits, -1), draft, torch.zeros(4, 3, dtype=torch.long))
