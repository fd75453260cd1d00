"""The verification kernel: speculative rejection sampling over the vocabulary for a batch.

Leviathan et al. (arXiv 2211.17192) / Chen et al. (arXiv 2302.01318): draft token x_j is
kept with probability min(1, p_t(x_j) / p_d(x_j)); at the first rejection a corrected token
is drawn from the residual max(0, p_t - p_d) (renormalised); if all k drafts are kept, a
bonus token is drawn from p_t at position k. The emitted tokens are then distributed
exactly as if sampled from the target alone, which the tests check statistically.

Everything is vectorised over batch and positions (no Python loop, no host sync), so the
timing of this module is the cost a serving engine pays per step. Sampling uses the
exponential race argmax(p / E), E ~ Exp(1): it needs no normalisation and no sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD = -1  # emitted-token slots past a sequence's accepted + 1 tokens


@dataclass(frozen=True)
class VerifyResult:
    accepted: torch.Tensor  # [b] long, in [0, k]
    tokens: torch.Tensor  # [b, k + 1] long: accepted drafts, then the corrected/bonus token, then PAD

    @property
    def emitted(self) -> torch.Tensor:
        """Tokens emitted per sequence: accepted + 1."""
        return self.accepted + 1


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of (possibly unnormalised) ``probs [..., V]``."""
    race = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return (probs.float() / race).argmax(dim=-1)


def verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
           generator: torch.Generator | None = None) -> VerifyResult:
    """Rejection-sample a batch: ``target_probs [b, k+1, V]``, ``draft_probs [b, k, V]``, ``draft_tokens [b, k]``.

    k = 0 is plain sampling of one token per sequence from ``target_probs[:, 0]``.
    """
    b, k = draft_tokens.shape
    if target_probs.shape[:2] != (b, k + 1) or draft_probs.shape[:2] != (b, k):
        raise ValueError(f"shapes disagree: target {tuple(target_probs.shape)}, draft {tuple(draft_probs.shape)}, "
                         f"tokens {tuple(draft_tokens.shape)}")
    rows = torch.arange(b, device=draft_tokens.device)
    if k == 0:
        accepted = torch.zeros(b, dtype=torch.long, device=draft_tokens.device)
        return VerifyResult(accepted, sample(target_probs[:, 0], generator)[:, None])

    index = draft_tokens[..., None]
    p_target = target_probs[:, :k].gather(-1, index).squeeze(-1).float()
    p_draft = draft_probs.gather(-1, index).squeeze(-1).float()
    u = torch.rand(b, k, device=draft_tokens.device, generator=generator)
    keep = u * p_draft < p_target  # u < p_t / p_d without dividing by zero
    accepted = keep.long().cumprod(dim=1).sum(dim=1)  # drafts kept before the first rejection

    # Where we stop: the residual at the first rejected position, or p_t[k] when all are kept.
    stop_target = target_probs[rows, accepted].float()
    all_kept = accepted == k
    stop_draft = draft_probs[rows, accepted.clamp(max=k - 1)].float()
    residual = (stop_target - stop_draft).clamp_(min=0)
    residual = torch.where(all_kept[:, None], stop_target, residual)
    # p_t == p_d exactly leaves no residual; that position cannot have been rejected, but guard anyway
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, stop_target, residual)
    last = sample(residual, generator)

    tokens = torch.cat((draft_tokens, torch.full((b, 1), PAD, dtype=torch.long, device=draft_tokens.device)), 1)
    tokens.scatter_(1, accepted[:, None], last[:, None])
    tokens.masked_fill_(torch.arange(k + 1, device=tokens.device) > accepted[:, None], PAD)
    return VerifyResult(accepted, tokens)


def verify_logits(target_logits: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                  generator: torch.Generator | None = None) -> VerifyResult:
    """The timed verify step: softmax of the target logits (in float32), then :func:`verify`."""
    return verify(torch.softmax(target_logits.float(), dim=-1), draft_probs, draft_tokens, generator)
